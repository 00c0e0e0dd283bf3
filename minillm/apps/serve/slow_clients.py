"""A deadline for a request's headers: the one slow-client limit uvicorn does not have.

uvicorn closes an *idle* keep-alive connection after ``timeout_keep_alive`` seconds, but a
client that opens a connection and sends its headers a byte at a time (slowloris) is waited
for forever: a hundred such connections hold a hundred sockets. ``DeadlineH11Protocol`` is
uvicorn's own h11 protocol plus one timer per request: armed when the connection opens (or
when the next request's first byte arrives on a kept-alive one), disarmed once the headers
are in; if it fires first, the client gets ``408 Request Timeout`` and the connection is
closed. The body has the same limit, counted by the app while it reads it (``guards.read_body``).
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol


class DeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline (``request_timeout`` seconds) for each request's
    headers. Make one with ``with_deadline``."""

    request_timeout: float = 30.0
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and self._between_requests():
            self._arm()  # the first byte of a new request on a kept-alive connection
        super().data_received(data)
        if not self._between_requests():
            self._disarm()  # the headers are in: the app times the body

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _between_requests(self) -> bool:
        cycle = self.cycle
        return cycle is None or cycle.response_complete

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.request_timeout, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or not self._between_requests():
            return
        body = f"the request headers did not arrive within {self.request_timeout:g} s (--request-timeout)\n"
        head = ("HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
                f"content-length: {len(body.encode())}\r\nconnection: close\r\n\r\n")
        self.transport.write((head + body).encode())  # raw: h11 has seen no request to answer
        self.transport.close()


def with_deadline(request_timeout: float) -> type[DeadlineH11Protocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` with this deadline, in seconds."""
    if not request_timeout > 0:
        raise ValueError(f"request_timeout must be a number of seconds > 0, got {request_timeout!r}")
    return type("DeadlineH11Protocol", (DeadlineH11Protocol,), {"request_timeout": float(request_timeout)})
