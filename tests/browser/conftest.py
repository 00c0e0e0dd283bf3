"""Browser tests: the course as a learner sees it, in JupyterLab, in a real Chromium.

* ``lab``: one JupyterLab for the session (the same command line as ``minillm lab``, from
  :mod:`minillm.apps.lab`), bound to 127.0.0.1 on a free port with a random token, serving a
  temporary COPY of ``notebooks/`` and ``exercises/`` (running them never touches the
  committed files), with its own settings, workspaces, config and runtime folders.
  It is always shut down (``/api/shutdown``, then SIGTERM, then SIGKILL).
* ``browser``: Debian's ``/usr/bin/chromium`` driven by Python Playwright (``playwright
  install`` is never used: it downloads a browser of its own, which fails offline).
* ``page``: a fresh browser context per test that records the console; ``jlab`` wraps it
  with helpers that talk to JupyterLab's application object (``window.jupyterapp``).

Without Chromium (or the ``playwright`` package) the tests are skipped when not root, with
the command that installs it. As root, or with CI=true, they fail instead: ``bash scripts/setup.sh
--with-browser`` installs Chromium, so a missing one is a setup bug, not a reason to skip.
``MINILLM_SKIP_BROWSER=1`` skips them on purpose.

Screenshots and console logs go to ``$MINILLM_ARTIFACTS`` (default /tmp/minillm-artifacts).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("MINILLM_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
                 "--disable-dev-shm-usage"]
ARTIFACTS = Path(os.environ.get("MINILLM_ARTIFACTS") or Path(tempfile.gettempdir()) / "minillm-artifacts")
# console errors that come from widgets (ipywidgets, our minillm widgets, their comms)
WIDGET_ERROR = re.compile(r"widget|ipywidgets|minillm|comm_open|comm |model id|view for model|could not create",
                          re.I)

# JupyterLab user settings for the tests: every cell in the DOM (no virtual scrolling), no
# autosave (the copy is thrown away anyway), no news or update pop-ups.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"checkForUpdates": False,
                                                                          "fetchNews": "false"},
}


def pytest_configure(config):
    config.addinivalue_line("markers", "browser: drives JupyterLab in Chromium (tests/browser)")


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def browser_unavailable(reason: str) -> None:
    """Skip (not root, or MINILLM_SKIP_BROWSER=1) or fail (root: setup should have fixed it)."""
    if os.environ.get("MINILLM_SKIP_BROWSER") == "1":
        pytest.skip(f"browser tests skipped (MINILLM_SKIP_BROWSER=1): {reason}")
    if not _is_root() and os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        pytest.skip(f"browser tests need Debian's Chromium: {reason}. Install it with "
                    f"`sudo apt-get install chromium` (or run `sudo bash scripts/setup.sh --with-browser`).")
    pytest.fail(f"browser tests cannot run: {reason}. As root, `bash scripts/setup.sh --with-browser` installs "
                f"it (set MINILLM_SKIP_BROWSER=1 to skip these tests on purpose).", pytrace=False)


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


# --------------------------------------------------------------------------------------------
# JupyterLab
# --------------------------------------------------------------------------------------------

@dataclass
class Lab:
    base: str
    token: str
    root: Path
    proc: subprocess.Popen
    log: Path
    sessions_seen: set = field(default_factory=set)

    def url(self, path: str, workspace: str | None = None) -> str:
        """URL that opens ``path`` (relative to the served folder) in a fresh, empty workspace."""
        quoted = urllib.parse.quote(path)
        ws = workspace or f"t{secrets.token_hex(4)}"
        return f"{self.base}/lab/workspaces/{ws}/tree/{quoted}?token={self.token}"

    def api(self, method: str, path: str, body: dict | None = None, timeout: float = 30):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.base}{path}", data=data, method=method,
                                     headers={"Authorization": f"token {self.token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read().decode()
            return json.loads(raw) if raw.strip() else None

    def shutdown_kernels(self) -> None:
        """Stop every kernel (between tests: two cores, and a fresh kernel per notebook)."""
        try:
            for s in self.api("GET", "/api/sessions") or []:
                self.api("DELETE", f"/api/sessions/{s['id']}")
        except (urllib.error.URLError, OSError, ValueError):
            pass

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"


def _copy_course(dest: Path) -> None:
    ignore = shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__", "*_diagram.json")
    for name in ("notebooks", "exercises"):
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, dest / name, ignore=ignore)


@pytest.fixture(scope="session")
def lab(tmp_path_factory, artifacts):
    from minillm.apps.lab import free_port, jupyter_command, jupyter_env, stop_server, wait_for_status

    tmp = tmp_path_factory.mktemp("jupyterlab")
    root = tmp / "course"
    root.mkdir()
    _copy_course(root)
    settings = tmp / "settings"
    for rel, value in LAB_SETTINGS.items():
        f = settings / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(value))
    # the kernels' IPC sockets live in the runtime folder, and a socket path may not exceed 107
    # bytes: under pytest-xdist the session's tmp path is too deep (".../popen-gw1/jupyterlab0/")
    runtime = Path(tempfile.mkdtemp(prefix="mlab-rt-"))
    dirs = {"JUPYTERLAB_SETTINGS_DIR": settings, "JUPYTERLAB_WORKSPACES_DIR": tmp / "workspaces",
            "JUPYTER_CONFIG_DIR": tmp / "config", "JUPYTER_RUNTIME_DIR": runtime,
            "JUPYTER_DATA_DIR": tmp / "data",  # no user-level kernelspec can replace this venv's python3
            "IPYTHONDIR": tmp / "ipython"}
    for d in dirs.values():
        Path(d).mkdir(parents=True, exist_ok=True)

    token = secrets.token_hex(24)
    env = jupyter_env(token)
    env.update({k: str(v) for k, v in dirs.items()})
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TQDM_DISABLE": "1",
                "PYTHONDONTWRITEBYTECODE": "1"})
    env.pop("MPLBACKEND", None)
    port = free_port()
    cmd = jupyter_command(port=port, notebook_dir=root, extra=["--LabApp.expose_app_in_browser=True",
                                                                 "--ServerApp.shutdown_no_activity_timeout=1800"])
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # one lab per xdist worker: one log each
    log = artifacts / (f"jupyterlab-{worker}.log" if worker else "jupyterlab.log")
    with open(log, "w") as logf:
        proc = subprocess.Popen(cmd, env=env, cwd=root, stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    server = Lab(base=f"http://127.0.0.1:{port}", token=token, root=root, proc=proc, log=log)
    try:
        try:
            wait_for_status(server.base, token, proc, timeout=180)
        except RuntimeError as exc:
            pytest.fail(f"JupyterLab did not start: {exc}\n{server.log_tail()}", pytrace=False)
        yield server
    finally:
        try:
            server.api("POST", "/api/shutdown", timeout=10)
            proc.wait(30)
        except (urllib.error.URLError, OSError, ValueError, subprocess.TimeoutExpired):
            pass
        stop_server(proc, grace=20)
        shutil.rmtree(runtime, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# Chromium through Playwright
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def browser(artifacts):
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        browser_unavailable(f"{CHROMIUM} is missing")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        browser_unavailable("the Python package `playwright` is not installed (pip install -e \".[test]\")")
    pw = sync_playwright().start()
    b = None
    try:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS, timeout=120_000)
        yield b
    finally:
        if b is not None:
            try:
                b.close()
            except Exception:  # noqa: BLE001 - closing must never hide the test's own error
                pass
        pw.stop()


@dataclass
class ConsoleLog:
    messages: list = field(default_factory=list)  # (type, text)

    def errors(self) -> list[str]:
        return [text for kind, text in self.messages if kind in ("error", "pageerror")]

    def widget_errors(self) -> list[str]:
        return [t for t in self.errors() if WIDGET_ERROR.search(t)]


@pytest.fixture
def page(browser, lab, artifacts, request):
    context = browser.new_context(viewport={"width": 1400, "height": 1300}, device_scale_factor=1)
    context.set_default_timeout(60_000)
    pg = context.new_page()
    console = ConsoleLog()
    pg.on("console", lambda m: console.messages.append((m.type, m.text)))
    pg.on("pageerror", lambda e: console.messages.append(("pageerror", str(e))))
    pg.console_log = console
    try:
        yield pg
    finally:
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
        try:
            pg.screenshot(path=str(artifacts / f"{name}-final.png"))
        except Exception:  # noqa: BLE001
            pass
        (artifacts / f"{name}-console.log").write_text(
            "\n".join(f"[{k}] {t}" for k, t in console.messages) + "\n", encoding="utf-8")
        context.close()
        lab.shutdown_kernels()


# --------------------------------------------------------------------------------------------
# Driving JupyterLab
# --------------------------------------------------------------------------------------------

# JS helpers, evaluated in the page; `app` is window.jupyterapp (exposed by the server flag).
_JS_NOTEBOOK_STATE = """(path) => {
  const app = window.jupyterapp;
  if (!app || !app.shell) return {phase: 'app'};
  const w = app.shell.currentWidget;
  if (!w || !w.context || !w.content || !w.sessionContext) return {phase: 'widget'};
  if (path && w.context.path !== path) return {phase: 'path', path: w.context.path};
  const sc = w.sessionContext;
  const kernel = sc.session && sc.session.kernel;
  const cells = w.content.model ? w.content.model.cells : null;
  const out = {phase: 'ok', ready: !!sc.isReady, status: kernel ? kernel.status : null,
               revealed: !!w.isRevealed, counts: [], errors: []};
  if (!cells) return out;
  for (let i = 0; i < cells.length; i++) {
    const c = cells.get(i);
    if (c.type !== 'code') continue;
    out.counts.push(c.executionCount);
    const outputs = c.outputs ? c.outputs.toJSON() : [];
    for (const o of outputs) {
      if (o.output_type === 'error') out.errors.push({cell: i, ename: o.ename, evalue: o.evalue,
        traceback: (o.traceback || []).join('\\n').replace(/\\u001b\\[[0-9;]*m/g, '')});
    }
  }
  return out;
}"""


class JupyterLabPage:
    """Small helpers over a Playwright page showing one notebook in JupyterLab."""

    def __init__(self, page, lab: Lab, artifacts: Path):
        self.page, self.lab, self.artifacts = page, lab, artifacts
        self.path: str | None = None

    def open(self, path: str, timeout: float = 180) -> None:
        self.path = path
        self.page.goto(self.lab.url(path), wait_until="domcontentloaded")
        self.wait_for(lambda s: s.get("phase") == "ok" and s["ready"] and s["status"] == "idle",
                      timeout, f"the notebook {path} to open with an idle kernel")

    def state(self) -> dict:
        return self.page.evaluate(_JS_NOTEBOOK_STATE, self.path)

    def wait_for(self, pred, timeout: float, what: str) -> dict:
        deadline = time.monotonic() + timeout
        s: dict = {}
        while time.monotonic() < deadline:
            s = self.state()
            if s.get("errors"):
                raise AssertionError(f"a cell raised while waiting for {what}: " + "\n\n".join(
                    f"cell {e['cell']}: {e['ename']}: {e['evalue']}\n{e['traceback'][-3000:]}" for e in s["errors"]))
            if pred(s):
                return s
            time.sleep(0.5)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last state: {s}\n"
                             f"JupyterLab log:\n{self.lab.log_tail(30)}")

    def command(self, *names: str, args: dict | None = None) -> str:
        """Run the first of ``names`` that JupyterLab knows; return its name."""
        return self.page.evaluate("""async ([names, args]) => {
            const app = window.jupyterapp;
            for (const n of names) {
              if (app.commands.hasCommand(n)) { await app.commands.execute(n, args || {}); return n; }
            }
            throw new Error('none of these commands exist: ' + names.join(', '));
        }""", [list(names), args])

    def run_all(self, timeout: float = 600) -> dict:
        """Clear every output, Run All (the Run menu's command), wait until every code cell ran."""
        self.command("notebook:clear-all-cell-outputs")
        self.wait_for(lambda s: all(c is None for c in s["counts"]), 30, "outputs to clear")
        used = self.command("runmenu:run-all", "notebook:run-all-cells")
        s = self.wait_for(lambda s: s["counts"] and all(c is not None for c in s["counts"])
                          and s["status"] == "idle", timeout, f"Run All ({used}) to finish")
        return s

    def cell_index(self, needle: str, cell_type: str = "code") -> int:
        """Index of the first cell whose source contains ``needle``."""
        i = self.page.evaluate("""([needle, type]) => {
            const cells = window.jupyterapp.shell.currentWidget.content.model.cells;
            for (let i = 0; i < cells.length; i++) {
              const c = cells.get(i);
              if (c.type === type && c.sharedModel.getSource().includes(needle)) return i;
            }
            return -1; }""", [needle, cell_type])
        assert i >= 0, f"no {cell_type} cell contains {needle!r} in {self.path}"
        return i

    def run_cell(self, index: int, timeout: float = 300) -> None:
        before = self.page.evaluate("""(i) => window.jupyterapp.shell.currentWidget.content.model
            .cells.get(i).executionCount""", index)
        self.page.evaluate("""async (i) => {
            const nb = window.jupyterapp.shell.currentWidget;
            nb.content.activeCellIndex = i;
            nb.content.deselectAll();
            await window.jupyterapp.commands.execute('notebook:run-cell');
        }""", index)
        self.wait_for(lambda s: s["status"] == "idle" and self._count(index) not in (None, before),
                      timeout, f"cell {index} to run")

    def _count(self, index: int):
        return self.page.evaluate("""(i) => window.jupyterapp.shell.currentWidget.content.model
            .cells.get(i).executionCount""", index)

    def cell(self, index: int):
        """Locator of the index-th cell (windowing is off, so every cell is in the DOM)."""
        return self.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell").nth(index)

    def assert_no_widget_errors(self) -> None:
        shown = self.page.get_by_text("Error displaying widget").count()
        assert shown == 0, f"the page shows 'Error displaying widget' {shown} time(s)"
        errs = self.page.console_log.widget_errors()
        assert not errs, "the browser console has errors from widgets:\n" + "\n".join(errs)

    def screenshot(self, name: str, locator=None) -> Path:
        path = self.artifacts / name
        if locator is not None:
            locator.scroll_into_view_if_needed()
            locator.screenshot(path=str(path))
        else:
            self.page.screenshot(path=str(path))
        return path


@pytest.fixture
def jlab(page, lab, artifacts):
    return JupyterLabPage(page, lab, artifacts)
