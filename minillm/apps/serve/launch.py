"""Start ``minillm serve`` as a background process and stop it for sure (tests, notebooks,
benchmarks): a free port, the server's own log kept in a file, SIGTERM at the end even if
the code using it failed.
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_READY = re.compile(r"ready at (http://\S+)")


def _die_with_parent() -> None:
    """Linux: SIGTERM the server if its parent dies without stopping it (a killed kernel).
    The kernel tracks the *thread* that started it: start servers from a long-lived thread."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except OSError:
            pass


class ServerProcess:
    """``with ServerProcess(["--max-num-seqs", "4"]) as srv: httpx.get(srv.url + "/health")``

    Args:
        args: command-line options for ``minillm serve`` (``--port 0`` is added: a free port).
        server_code: optional Python source defining a subclass of ``OpenAIServer``;
            ``server_class`` names it. Used to run a deliberately different server.
        env: extra environment variables.
        startup_timeout: seconds to wait for the "ready" line.
    """

    def __init__(self, args=(), *, server_code: str | None = None, server_class: str | None = None,
                 env: dict | None = None, startup_timeout: float = 120.0):
        self.args = list(args)
        if "--port" not in self.args:
            self.args += ["--port", "0"]
        self.server_code, self.server_class = server_code, server_class
        self.env = dict(os.environ, **(env or {}))
        self.env.setdefault("OMP_NUM_THREADS", "1")
        self.env["PYTHONUNBUFFERED"] = "1"
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen | None = None
        self.url: str | None = None
        self.startup_seconds: float | None = None
        self.returncode: int | None = None
        self.stdout_tail = ""  # what it printed after the ready line (its shutdown summary)
        self._dir = tempfile.TemporaryDirectory(prefix="minillm-serve-")
        self.log_path = Path(self._dir.name) / "server.log"

    def _command(self) -> list[str]:
        if self.server_code is None:
            return [sys.executable, "-m", "minillm.apps.serve", *self.args]
        script = Path(self._dir.name) / "custom_server.py"
        script.write_text("import sys\nfrom minillm.apps.serve import OpenAIServer, serve\n\n" + self.server_code
                          + f"\n\nsys.exit(serve(sys.argv[1:], server_class={self.server_class}))\n")
        return [sys.executable, str(script), *self.args]

    def start(self) -> "ServerProcess":
        t0 = time.monotonic()
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self._command(), stdout=subprocess.PIPE, stderr=self._log, text=True,
                                     env=self.env, preexec_fn=_die_with_parent)
        atexit.register(self.stop)
        deadline = t0 + self.startup_timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                if self.proc.poll() is not None:
                    break
                continue
            m = _READY.search(line)
            if m:
                self.url = m.group(1)
                self.startup_seconds = time.monotonic() - t0
                return self
        self.stop()
        raise RuntimeError(f"minillm serve did not start (exit code {self.returncode}); its log:\n{self.log()}")

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, wait for the graceful shutdown; returns the exit code (0 = clean)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.returncode = self.proc.returncode
        if self.proc.stdout is not None:
            self.stdout_tail = self.proc.stdout.read()
            self.proc.stdout.close()
        self._log.close()
        atexit.unregister(self.stop)
        self.proc = None
        return self.returncode

    def log(self) -> str:
        """The server's log so far (its stderr: uvicorn's lines and the engine loop's)."""
        return self.log_path.read_text() if self.log_path.exists() else ""

    def __enter__(self) -> "ServerProcess":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()
