"""``minillm lab``: open the course in JupyterLab, offline, on its start page.

JupyterLab runs as a child process bound to 127.0.0.1 with a fresh random token. This
process checks first that the port is free, waits until its own child listens on it (so the
token is never sent to another server that holds the port) and answers ``/api/status``, prints
the URL to open (token included) and where it is really bound (a warning naming the risk for
anything but loopback), opens a browser unless ``--no-browser``, and then stays in the foreground until
JupyterLab stops. Ctrl-C, SIGINT or SIGTERM stop JupyterLab (and its kernels) cleanly.
``--lang zh`` opens the Chinese edition's start page (``notebooks/zh/``) instead of the English
one, with JupyterLab's own menus in Chinese (see ``LAB_SETTINGS_DIRS``): both editions are built
from the same sources and served together, so a learner can switch by opening the other folder.

Everything that would reach the internet is switched off: the news feed (and its pop-up),
the update check and the extension manager's PyPI listing. ``tests/`` (where the solved
exercises live) is not served, and the terminal stays free of per-kernel and per-notebook
warnings (see ``COURSE_ARGS``). The browser tests (tests/browser) reuse
:func:`jupyter_command` and :func:`jupyter_env` so they run the same server a learner does.
"""

from __future__ import annotations

import argparse
import importlib.util
import ipaddress
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

#: Start pages of each edition of the course, first one that exists wins (paths relative to
#: the notebook dir): the course's start page, else the chapter's first notebook.
START_PAGES_BY_LANG = {
    "en": ("notebooks/README.ipynb", "notebooks/ch04/00_overview.ipynb"),
    "zh": ("notebooks/zh/README.ipynb", "notebooks/zh/ch04/00_overview.ipynb"),
}
#: The editions ``--lang`` accepts; English is the default.
LANGS = tuple(START_PAGES_BY_LANG)
DEFAULT_LANG = "en"
START_PAGES = START_PAGES_BY_LANG[DEFAULT_LANG]

#: Server options that keep JupyterLab from reaching the network.
OFFLINE_ARGS = (
    "--LabApp.news_url=None",
    "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    "--LabApp.extension_manager=readonly",
    "--ServerApp.open_browser=False",
)


#: Server options that make the course quiet and safe to hand to a learner:
#: * JupyterLab settings shipped with the package (``assets/lab/settings/overrides.json``): the
#:   "get notified about news?" pop-up is switched off;
#: * ``tests/`` (the solved exercises) is neither listed nor served (``minillm.apps.lab_contents``),
#:   which also logs "Notebook ... is not trusted" at debug level instead of once per notebook;
#: * kernels talk to the server over local IPC sockets instead of TCP (``kernel_transport_args``),
#:   so no kernel prints "Kernel is running over TCP without encryption".
#: The Chinese edition's settings (``assets/lab/settings-zh``) are the same plus JupyterLab's
#: interface language, 简体中文 (``zh_CN``), so menus and dialogs match the notebooks. The text
#: comes from the ``jupyterlab-language-pack-zh-CN`` package (course extra); without it JupyterLab
#: stays English. These are defaults: a language picked in Settings → Language still wins.
_ASSETS = Path(__file__).resolve().parent.parent / "assets" / "lab"
LAB_SETTINGS_DIRS = {"en": _ASSETS / "settings", "zh": _ASSETS / "settings-zh"}
LAB_SETTINGS_DIR = LAB_SETTINGS_DIRS[DEFAULT_LANG]
#: JupyterLab's locale for each edition (what ``settings-zh`` sets; None: the browser's default).
LAB_LOCALES = {"en": None, "zh": "zh_CN"}
#: Kernels of notebooks no longer open anywhere (no browser tab connected) are shut down after 10
#: idle minutes: each holds hundreds of MB, and a learner moving through the chapter leaves many.
#: A notebook that is open keeps its kernel however long it idles. Closing a notebook shuts its
#: kernel down at once (``kernelShutdown`` in the shipped settings, both editions).
KERNEL_CULL_ARGS = ("--MappingKernelManager.cull_idle_timeout=600", "--MappingKernelManager.cull_interval=60")
_CONTENTS_ARG = "--ServerApp.contents_manager_class=minillm.apps.lab_contents.CourseContentsManager"
COURSE_ARGS = (f"--LabApp.app_settings_dir={LAB_SETTINGS_DIR}", _CONTENTS_ARG)


def course_args(lang: str = DEFAULT_LANG) -> tuple[str, ...]:
    """:data:`COURSE_ARGS` for the ``lang`` edition (its own JupyterLab settings folder)."""
    return (f"--LabApp.app_settings_dir={LAB_SETTINGS_DIRS[check_lang(lang)]}", _CONTENTS_ARG)
#: A Unix socket path may be at most ~107 bytes; kernel IPC sockets live in the runtime dir.
IPC_PATH_LIMIT = 100


def kernel_transport_args(runtime_dir: str | None = None) -> list[str]:
    """``--KernelManager.transport=ipc`` where local sockets work: a POSIX system whose Jupyter
    runtime folder is short enough for the socket names put in it (``kernel-<uuid>-ipc-<n>``);
    otherwise nothing (TCP on 127.0.0.1, and the kernel's warning about it)."""
    if os.name != "posix":
        return []
    if runtime_dir is None:
        runtime_dir = os.environ.get("JUPYTER_RUNTIME_DIR")
        if not runtime_dir:
            try:
                from jupyter_core.paths import jupyter_runtime_dir
            except ImportError:
                return []
            runtime_dir = jupyter_runtime_dir()
    longest = os.path.join(runtime_dir, "kernel-" + "0" * 36 + "-ipc-99")
    return ["--KernelManager.transport=ipc"] if len(longest.encode()) <= IPC_PATH_LIMIT else []


def repo_root() -> Path:
    """The folder that holds ``notebooks/`` (the repository when installed with ``pip -e``)."""
    here = Path(__file__).resolve().parents[2]
    if (here / "notebooks").is_dir():
        return here
    cwd = Path.cwd()
    if (cwd / "notebooks").is_dir():
        return cwd
    return here


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def is_loopback(ip: str) -> bool:
    """Whether binding ``ip`` keeps the server reachable from this computer only."""
    if ip == "localhost":
        return True
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


def port_in_use(ip: str, port: int) -> bool:
    """Whether something already listens on ``ip``:``port`` (checked before any token exists)."""
    host = "127.0.0.1" if ip == "localhost" else (ip or "0.0.0.0")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will: TIME_WAIT is free
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def listens_on(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` holds a listening TCP socket on ``port`` (Linux ``/proc``); None
    where that cannot be told."""
    tables = [t for t in (Path("/proc/net/tcp"), Path("/proc/net/tcp6")) if t.exists()]
    fds = Path(f"/proc/{pid}/fd")
    if not tables or not fds.is_dir():
        return None
    inodes = set()
    for table in tables:
        for row in table.read_text().splitlines()[1:]:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{cols[9]}]")
    for fd in fds.iterdir():
        try:
            if os.readlink(fd) in inodes:
                return True
        except OSError:
            continue
    return False


def wait_until_listening(proc: subprocess.Popen, port: int, timeout: float) -> None:
    """Wait until ``proc`` itself listens on ``port``: only then does the token go there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with code {proc.returncode} before it listened on port {port}")
        if listens_on(proc.pid, port) is not False:
            return
        time.sleep(0.2)
    raise RuntimeError(f"JupyterLab did not listen on port {port} within {timeout:.0f} s")


def url_host(ip: str) -> str:
    """The host to put in the printed URL: this computer's loopback when bound to every interface."""
    if ip in ("", "0.0.0.0", "localhost"):
        return "127.0.0.1"
    if ip == "::":
        return "[::1]"
    return f"[{ip}]" if ":" in ip else ip


def bind_notice(notebook_dir: Path, ip: str, port: int) -> tuple[str, str | None]:
    """What to print about the bind: a line that says where it really is, and a warning (or None)."""
    if is_loopback(ip):
        return (f"minillm lab: serving {notebook_dir} on {ip}:{port}, reachable from this computer only; "
                f"press Ctrl-C to stop."), None
    where = f"{ip or '0.0.0.0'}:{port}" + (" (every network interface)" if ip in ("", "0.0.0.0", "::") else "")
    return (f"minillm lab: serving {notebook_dir} on {where}; press Ctrl-C to stop.",
            f"minillm lab: WARNING: bound to {where}, not to 127.0.0.1: anyone who can reach this machine "
            f"and learns the token can run any code as you (each notebook kernel is a Python shell), and the "
            f"traffic, token included, is unencrypted HTTP. Leave --ip out (127.0.0.1) unless you mean this.")


def check_lang(lang: str) -> str:
    """``lang`` as one of :data:`LANGS`; ``ValueError`` naming the allowed values otherwise."""
    if not isinstance(lang, str) or lang not in LANGS:
        allowed = ", ".join(repr(x) for x in LANGS)
        raise ValueError(f"lang must be one of {allowed} (English or Chinese edition of the course), got {lang!r}")
    return lang


def start_page(notebook_dir: Path, lang: str = DEFAULT_LANG) -> str | None:
    """The first of the ``lang`` edition's start pages that exists under ``notebook_dir``."""
    for rel in START_PAGES_BY_LANG[check_lang(lang)]:
        if (notebook_dir / rel).is_file():
            return rel
    return None


def lab_path(rel: str | None) -> str:
    """The JupyterLab URL path that opens ``rel`` (``/lab`` when there is none)."""
    if not rel:
        return "/lab"
    return "/lab/tree/" + urllib.parse.quote(rel)


def jupyter_command(*, port: int, notebook_dir: Path, ip: str = "127.0.0.1", default_url: str = "/lab",
                    extra: list[str] | tuple[str, ...] = (), log_level: str | None = None,
                    lang: str = DEFAULT_LANG) -> list[str]:
    """The ``jupyter lab`` command line (the token travels in the environment, see :func:`jupyter_env`)."""
    cmd = [sys.executable, "-m", "jupyterlab",
           f"--ip={ip}", f"--port={port}", "--ServerApp.port_retries=0",
           f"--ServerApp.root_dir={notebook_dir}",
           f"--LabApp.default_url={default_url}",
           *OFFLINE_ARGS, *course_args(lang), *KERNEL_CULL_ARGS, *kernel_transport_args()]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    if log_level:
        cmd += [f"--ServerApp.log_level={log_level}", f"--LabApp.log_level={log_level}"]
    cmd.extend(extra)
    return cmd


def jupyter_env(token: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for the server: the token (kept off the command line, which ``ps`` shows)."""
    env = dict(os.environ if base is None else base)
    env["JUPYTER_TOKEN"] = token
    env.setdefault("JUPYTER_PLATFORM_DIRS", "1")
    env.pop("JUPYTER_TOKEN_FILE", None)
    return env


def wait_for_status(base_url: str, token: str, proc: subprocess.Popen | None = None,
                    timeout: float = 120.0) -> dict:
    """Poll ``/api/status`` until it answers 200; raise ``RuntimeError`` if it never does."""
    deadline = time.monotonic() + timeout
    req = urllib.request.Request(base_url.rstrip("/") + "/api/status",
                                 headers={"Authorization": f"token {token}"})
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with code {proc.returncode} before it answered")
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                if resp.status == 200:
                    return json.loads(resp.read().decode() or "{}")
        except (urllib.error.URLError, ConnectionError, OSError, ValueError) as exc:
            last = exc
        time.sleep(0.25)
    raise RuntimeError(f"JupyterLab did not answer {base_url}/api/status within {timeout:.0f} s ({last})")


def stop_server(proc: subprocess.Popen, grace: float = 20.0) -> int:
    """SIGTERM (JupyterLab then shuts its kernels down), SIGKILL after ``grace`` seconds."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode


def _lang_arg(value: str) -> str:
    try:
        return check_lang(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="minillm lab",
                                description="Open the minillm course in JupyterLab (offline, on 127.0.0.1).")
    p.add_argument("--port", type=int, default=None, help="port to listen on (default: a free one)")
    p.add_argument("--ip", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; anything else exposes the server to the network)")
    p.add_argument("--no-browser", action="store_true", help="print the URL but do not open a browser")
    p.add_argument("--lang", type=_lang_arg, default=DEFAULT_LANG, metavar="{" + ",".join(LANGS) + "}",
                   help="edition of the course to open: en (English, default) or zh (中文, notebooks/zh/)")
    p.add_argument("--notebook-dir", type=Path, default=None,
                   help="folder JupyterLab serves (default: the repository root)")
    p.add_argument("--token", default=None, help="access token (default: a fresh random one)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for JupyterLab to start")
    p.add_argument("--verbose", action="store_true", help="show JupyterLab's INFO log")
    p.add_argument("jupyter_args", nargs=argparse.REMAINDER,
                   help="after --: more options passed to jupyter lab as they are")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(list(sys.argv[1:] if argv is None else argv))
    extra = list(args.jupyter_args)
    if extra and extra[0] == "--":
        extra = extra[1:]

    if importlib.util.find_spec("jupyterlab") is None:  # looked up, not imported: that takes ~4 CPU s
        print("minillm lab: JupyterLab is not installed. Run `bash scripts/setup.sh` "
              "(or `pip install -e \".[course]\"`).", file=sys.stderr)
        return 2

    notebook_dir = (args.notebook_dir or repo_root()).resolve()
    if not notebook_dir.is_dir():
        print(f"minillm lab: no such folder: {notebook_dir}", file=sys.stderr)
        return 2
    page = start_page(notebook_dir, args.lang)
    if page is None and args.lang != DEFAULT_LANG:
        page = start_page(notebook_dir, DEFAULT_LANG)
        if page is not None:
            print(f"minillm lab: warning: no {args.lang!r} start page under {notebook_dir} (looked for "
                  f"{', '.join(START_PAGES_BY_LANG[args.lang])}); opening {page} instead.", file=sys.stderr)
    if page is None:
        looked = dict.fromkeys(START_PAGES_BY_LANG[args.lang] + START_PAGES)
        print(f"minillm lab: warning: no course start page under {notebook_dir} "
              f"(looked for {', '.join(looked)}); opening the file browser.", file=sys.stderr)
    default_url = lab_path(page)
    token = args.token or secrets.token_hex(24)
    env = jupyter_env(token)
    host = url_host(args.ip)
    if args.port and port_in_use(args.ip, args.port):
        print(f"minillm lab: port {args.port} on {args.ip or '0.0.0.0'} is already in use (another server "
              f"listens there); pick another --port, or leave --port out for a free one. No token was sent.",
              file=sys.stderr)
        return 1

    # A free port can be taken between our check and JupyterLab's bind; retry on a new one.
    attempts = 1 if args.port else 3
    proc: subprocess.Popen | None = None
    url = ""
    interrupted = {"sig": None}

    def _forward(signum, _frame):
        interrupted["sig"] = signum
        if proc is not None and proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)  # JupyterLab's clean stop, no y/n prompt
            except ProcessLookupError:
                pass

    # JupyterLab runs in its own session: Ctrl-C reaches only this process, which stops the
    # server with SIGTERM (no y/n prompt); a closed terminal (SIGHUP) stops it too.
    handled = [s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None]
    previous = {s: signal.signal(s, _forward) for s in handled}
    try:
        for attempt in range(attempts):
            port = args.port or free_port()
            cmd = jupyter_command(port=port, notebook_dir=notebook_dir, ip=args.ip, default_url=default_url,
                                  extra=extra, log_level=None if args.verbose else "WARN", lang=args.lang)
            proc = subprocess.Popen(cmd, env=env, cwd=str(notebook_dir), start_new_session=True)
            if interrupted["sig"] is not None:  # a signal came before the server existed
                _forward(interrupted["sig"], None)
            base = f"http://{host}:{port}"
            try:
                started = time.monotonic()
                wait_until_listening(proc, port, args.timeout)  # the token goes to our own server only
                wait_for_status(base, token, proc, timeout=max(1.0, args.timeout - (time.monotonic() - started)))
            except RuntimeError as exc:
                if interrupted["sig"] is not None:
                    stop_server(proc)
                    return 128 + int(interrupted["sig"])
                if proc.poll() is not None and attempt + 1 < attempts:
                    continue  # most likely the port was taken: try another one
                print(f"minillm lab: {exc}", file=sys.stderr)
                stop_server(proc)
                return 1
            url = f"{base}{default_url}?token={token}"
            break

        print("", flush=True)
        print("minillm lab: the course is running. Open this URL in your browser:", flush=True)
        print(f"    {url}", flush=True)
        serving, warning = bind_notice(notebook_dir, args.ip, port)
        print(serving, flush=True)
        if warning:
            print(warning, file=sys.stderr, flush=True)
        if not args.no_browser:
            try:
                import webbrowser
                if not webbrowser.open(url):
                    print("minillm lab: could not open a browser; copy the URL above into one.", flush=True)
            except Exception:  # noqa: BLE001 - a missing browser must not stop the server
                print("minillm lab: could not open a browser; copy the URL above into one.", flush=True)

        while True:
            try:
                rc = proc.wait()
                break
            except KeyboardInterrupt:  # pragma: no cover - handler above normally catches it
                _forward(signal.SIGINT, None)
        if interrupted["sig"] is not None:
            print("minillm lab: stopped.", flush=True)
            return 0
        return rc
    finally:
        if proc is not None and proc.poll() is None:
            stop_server(proc)
        for s, handler in previous.items():
            signal.signal(s, handler)


if __name__ == "__main__":
    sys.exit(main())
