"""What a request must pass before any of its content is believed: the Host it names, its
content type, its size, its arrival time, and the shape of its JSON.

Each check answers with a 4xx naming the limit (never a 500, never a hang), and each runs
before the next, costlier step: the Host and the content type before a byte of the body is
read, the size while it is read (from ``Content-Length`` and again as the bytes come), the
JSON's depth and text after one bounded parse. A browser page can otherwise reach a server
on 127.0.0.1 two ways: a ``text/plain`` POST, which needs no CORS preflight (hence 415 for
anything but ``application/json``), and DNS rebinding, where the attacker's own domain
resolves to 127.0.0.1 (hence the Host allow-list).
"""

from __future__ import annotations

import ipaddress
import json
import re

import anyio
from starlette.requests import ClientDisconnect

from minillm.request import check_text

from .protocol import BadRequest, error_body

#: Deepest JSON a body may nest (an OpenAI request nests 4 levels; Python's own parser gives
#: up near 1000 with a RecursionError, and the error messages that echo a value recurse too).
MAX_JSON_DEPTH = 32
#: Host names every loopback server answers to.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")

_HOST = re.compile(r"(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<name>[^:\[\]/@\s]+))(?::(?P<port>[0-9]{1,5}))?")


class HTTPError(Exception):
    """An error response with its own status (401, 404, 408, 413, 415, ...)."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.param, self.kind, self.headers = status, param, kind, headers


# --- the Host header ---------------------------------------------------------------------
def is_loopback(host: str) -> bool:
    """True for the names and addresses that only reach this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def default_allowed_hosts(bind_host: str) -> list[str]:
    """Bound to loopback: the loopback names (plus the bind address). Bound anywhere else the
    names clients use are unknown here: any Host is taken (``--allowed-hosts`` narrows it)."""
    if is_loopback(bind_host):
        return sorted({*LOOPBACK_HOSTS, bind_host.strip("[]").lower()})
    return ["*"]


def host_name(header: str | None) -> str | None:
    """The name in a Host header, without port or IPv6 brackets, lower case; None when the
    header is missing or malformed."""
    if not header:
        return None
    m = _HOST.fullmatch(header.strip())
    if m is None:
        return None
    name = (m["ipv6"] or m["name"]).lower()
    return name.removesuffix(".")


class HostAllowList:
    """ASGI middleware: refuse (400) a request whose Host is not allowed. Patterns: exact
    names or addresses, ``*.example.com`` (any subdomain), ``*`` (anything)."""

    def __init__(self, app, allowed_hosts):
        self.app = app
        self.allowed = [h.strip().lower().strip("[]") for h in allowed_hosts if h.strip()]
        self.allow_any = "*" in self.allowed

    def allows(self, host: str | None) -> bool:
        if self.allow_any:
            return True
        if host is None:
            return False
        return any(host == p or (p.startswith("*.") and host.endswith(p[1:])) for p in self.allowed)

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or self.allow_any:
            return await self.app(scope, receive, send)
        raw = dict(scope.get("headers") or ()).get(b"host", b"").decode("latin-1")
        if self.allows(host_name(raw)):
            return await self.app(scope, receive, send)
        from starlette.responses import JSONResponse

        msg = (f"the Host header {raw[:100]!r} is not one this server answers to (allowed: "
               f"{', '.join(self.allowed)}; set --allowed-hosts to change it)")
        await JSONResponse(error_body(msg, None, code=400), status_code=400)(scope, receive, send)


# --- the body ----------------------------------------------------------------------------
def require_json(request) -> None:
    """415 unless the body is declared ``application/json`` (parameters such as a charset may
    follow): a form or ``text/plain`` body is what a cross-site page can send unasked."""
    declared = request.headers.get("content-type", "")
    if declared.split(";", 1)[0].strip().lower() != "application/json":
        raise HTTPError(415, f"the request body must be sent as Content-Type: application/json, "
                             f"got {declared[:100] or 'no Content-Type'!r}", "content-type")


def _too_large(limit: int, seen: str) -> HTTPError:
    return HTTPError(413, f"the request body is larger than this server takes ({seen}; "
                          f"--max-body-bytes is {limit})", headers={"Connection": "close"})


async def read_body(request, limit: int, timeout: float | None) -> bytes:
    """The whole body, refused with 413 beyond ``limit`` bytes (by its ``Content-Length``
    before reading, by the bytes received while reading a chunked one) and with 408 when it
    has not arrived within ``timeout`` seconds."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit, f"Content-Length: {declared}")
    chunks, size = [], 0
    try:
        with anyio.fail_after(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise _too_large(limit, f"more than {limit} bytes sent")
                chunks.append(chunk)
    except TimeoutError:
        raise HTTPError(408, f"the request body did not arrive within {timeout:g} s "
                             f"(--request-timeout)", headers={"Connection": "close"}) from None
    except ClientDisconnect:
        raise HTTPError(400, "the client disconnected while sending the body") from None
    return b"".join(chunks)


def parse_json_object(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> dict:
    """The body as a JSON object whose nesting is at most ``max_depth`` and whose every string
    (keys too) is valid Unicode; 400 naming the problem otherwise."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise BadRequest(f"the request body nests JSON deeper than {max_depth} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(f"the request body must be a JSON object, got a JSON {type(body).__name__}")
    check_tree(body, max_depth)
    return body


def check_tree(body: dict, max_depth: int) -> None:
    """Walk the parsed body without recursion: its depth, and lone surrogates in any string."""
    stack = [(body, "", 1)]
    while stack:
        node, path, depth = stack.pop()
        if depth > max_depth:
            raise BadRequest(f"the request body nests JSON deeper than {max_depth} levels (at {path})",
                             _field(path))
        if isinstance(node, dict):
            items = ((f"{path}.{k}" if path else k, k, v) for k, v in node.items())
        else:
            items = ((f"{path}[{i}]", None, v) for i, v in enumerate(node))
        for where, key, value in items:
            if key is not None:
                _check_string(where, key)
            if isinstance(value, str):
                _check_string(where, value)
            elif isinstance(value, (dict, list)):
                stack.append((value, where, depth + 1))


def _check_string(where: str, text: str) -> None:
    try:
        check_text(where, text)
    except ValueError as exc:
        raise BadRequest(str(exc), _field(where)) from None


def _field(path: str) -> str:
    """The top-level field a path is in ("messages[0].content" -> "messages")."""
    return re.split(r"[.\[]", path, maxsplit=1)[0]
