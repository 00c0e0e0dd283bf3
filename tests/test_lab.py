"""``minillm lab``: starts JupyterLab on 127.0.0.1 with a token, prints the URL, stops cleanly."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from minillm.apps import lab

pytest.importorskip("jupyterlab")
pytestmark = pytest.mark.timeout(300)

URL_RE = re.compile(r"(http://127\.0\.0\.1:(\d+)(/lab\S*)\?token=([0-9A-Za-z_-]+))")


def _minillm_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("minillm")
    if exe.is_file():
        return [str(exe)]
    return [sys.executable, "-c", "import sys; from minillm.apps.cli import main; sys.exit(main())"]


def _get(url: str, token: str | None = None, timeout: float = 10):
    headers = {"Authorization": f"token {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as resp:
        return resp.status, resp.read().decode()


@pytest.fixture
def isolated_env(tmp_path):
    env = dict(os.environ)
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTER_DATA_DIR", "JUPYTERLAB_SETTINGS_DIR",
                 "JUPYTERLAB_WORKSPACES_DIR", "IPYTHONDIR"):
        d = tmp_path / name.lower()
        d.mkdir()
        env[name] = str(d)
    env.pop("JUPYTER_TOKEN", None)
    # kernel IPC sockets live in the runtime dir: a Unix socket path must stay short
    env["JUPYTER_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="mlrt", dir="/tmp" if os.path.isdir("/tmp") else None)
    env["BROWSER"] = "true"  # in case a browser were opened anyway: a no-op command
    return env


def _start(args, env):
    proc = subprocess.Popen(_minillm_cmd() + ["lab", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, bufsize=1)
    lines: queue.Queue = queue.Queue()

    def pump():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return proc, lines


def _wait_for_url(proc, lines, timeout: float = 150):
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        if line is None:
            break
        seen.append(line)
        m = URL_RE.search(line)
        if m:
            return m, seen
    proc.kill()
    pytest.fail("minillm lab printed no URL with a token:\n" + "".join(seen))


def _listen_addresses(port: int) -> set[str] | None:
    """Local addresses with a listening TCP socket on ``port`` (Linux /proc), None elsewhere."""
    found: set[str] = set()
    tables = [Path("/proc/net/tcp"), Path("/proc/net/tcp6")]
    if not tables[0].exists():
        return None
    for table in tables:
        if not table.exists():
            continue
        for row in table.read_text().splitlines()[1:]:
            cols = row.split()
            addr, p = cols[1].split(":")
            if int(p, 16) != port or cols[3] != "0A":  # 0A = LISTEN
                continue
            if len(addr) == 8:
                found.add(socket.inet_ntop(socket.AF_INET, bytes.fromhex(addr)[::-1]))
            else:
                found.add("ipv6:" + addr)
    return found


def _drain(lines, timeout: float) -> str:
    out, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            continue
        if line is None:
            break
        out.append(line)
    return "".join(out)


def _expected_start(lang: str) -> str | None:
    """The page a learner should land on, read off the repository (not from ``lab``)."""
    root = lab.repo_root() / "notebooks"
    wanted = {"en": ["README.ipynb", "ch04/00_overview.ipynb"],
              "zh": ["zh/README.ipynb", "zh/ch04/00_overview.ipynb", "README.ipynb", "ch04/00_overview.ipynb"]}
    for rel in wanted[lang]:
        if (root / rel).is_file():
            return "/lab/tree/notebooks/" + rel
    return None


# One server per signal; the SIGTERM one is the Chinese edition (`minillm lab --lang zh`).
@pytest.mark.parametrize("sig,lang", [(signal.SIGINT, "en"), (signal.SIGTERM, "zh")], ids=["SIGINT", "SIGTERM-zh"])
def test_minillm_lab_starts_answers_and_stops(sig, lang, isolated_env):
    port = lab.free_port()
    t0 = time.monotonic()
    proc, lines = _start(["--no-browser", "--port", str(port)] + (["--lang", lang] if lang != "en" else []),
                         isolated_env)
    try:
        m, seen = _wait_for_url(proc, lines)
        url, printed_port, path, token = m.group(1), int(m.group(2)), m.group(3), m.group(4)
        assert printed_port == port
        assert len(token) >= 32, "the token must be long and random"
        expected = _expected_start(lang)
        if expected is not None:
            assert path == expected, (lang, path)
        base = f"http://127.0.0.1:{port}"

        status, body = _get(f"{base}/api/status", token)
        assert status == 200 and '"started"' in body
        with pytest.raises(urllib.error.HTTPError) as denied:  # no token, no entry
            _get(f"{base}/api/contents")
        assert denied.value.code in (401, 403)
        status, _ = _get(url)  # the printed URL itself opens JupyterLab
        assert status == 200
        # offline: no news feed, and the extension manager does not list PyPI
        status, page = _get(f"{base}/lab?token={token}")
        cfg = json.loads(re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>',
                                   page, re.S).group(1))
        assert cfg["news"] == {"disabled": True}
        assert cfg["extensionManager"]["name"] == "read-only"
        # the news pop-up is switched off by the settings shipped with the package
        status, body = _get(f"{base}/lab/api/settings/@jupyterlab/apputils-extension:notification", token)
        props = json.loads(body)["schema"]["properties"]  # overrides.json becomes the schema's defaults
        assert props["fetchNews"]["default"] == "false" and props["checkForUpdates"]["default"] is False
        # the Chinese edition's JupyterLab speaks Chinese (its menus), from the installed language pack
        status, body = _get(f"{base}/lab/api/settings/@jupyterlab/translation-extension:plugin", token)
        locale = json.loads(body)["schema"]["properties"]["locale"]["default"]
        assert locale == ("zh_CN" if lang == "zh" else "default"), (lang, locale)
        if lang == "zh":
            status, body = _get(f"{base}/lab/api/translations/zh_CN", token)
            pack = json.loads(body)
            assert not pack.get("message"), pack.get("message")  # e.g. "Language pack 'zh_CN' not installed!"
            assert pack["data"]["jupyterlab"]["Run All Cells"] == ["运行所有单元格"]
        # tests/ (the solved exercises) is neither listed nor served, whatever the URL
        status, body = _get(f"{base}/api/contents?content=1", token)
        names = {m["name"] for m in json.loads(body)["content"]}
        assert "notebooks" in names and "tests" not in names, names
        solved = "tests/solved/ch04_exercises_solved.ipynb"
        assert (lab.repo_root() / solved).is_file()
        for hidden in (f"/api/contents/{solved}", "/api/contents/tests", f"/files/{solved}",
                       "/api/contents/tests/solved/answers.py", f"/nbconvert/html/{solved}",
                       "/api/contents/./tests/solved",
                       # issue 26: encoded or plain `..` from a course folder, once or twice encoded, or out of the root
                       f"/files/notebooks/%2e%2e/{solved}", f"/files/notebooks/..%2f{solved}",
                       f"/files/exercises/%2E%2E/{solved}", "/api/contents/notebooks/../tests",
                       "/api/contents/exercises/%2e%2e/tests/solved", f"/api/contents/notebooks/%252e%252e/{solved}",
                       f"/nbconvert/html/notebooks/%2e%2e/{solved}", "/api/contents/notebooks/%2e%2e/%2e%2e/etc",
                       "/files/exercises/%2e%2e/%2e%2e/etc/hostname"):
            try:
                status, _ = _get(base + hidden, token)
            except urllib.error.HTTPError as missing:
                status = missing.code
            assert status == 404, (hidden, status)
        status, body = _get(f"{base}/api/contents/notebooks/README.ipynb", token)
        assert status == 200 and json.loads(body)["type"] == "notebook"
        # a kernel starts (over IPC: no "running over TCP without encryption" warning) and answers
        req = urllib.request.Request(f"{base}/api/kernels", data=b'{"name": "python3"}', method="POST",
                                     headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            kernel = json.loads(resp.read())
        from jupyter_client import BlockingKernelClient

        conn = Path(isolated_env["JUPYTER_RUNTIME_DIR"]) / f"kernel-{kernel['id']}.json"
        kc = BlockingKernelClient(connection_file=str(conn))
        kc.load_connection_file()
        kc.start_channels(hb=False)  # no heartbeat: on a loaded machine it misses beats and cries "died"
        try:
            msg_id = kc.kernel_info()
            reply = kc.get_shell_msg(timeout=90)  # the kernel answered over its sockets
            assert reply["parent_header"]["msg_id"] == msg_id and reply["content"]["status"] == "ok"
            assert kc.transport == ("ipc" if lab.kernel_transport_args(isolated_env["JUPYTER_RUNTIME_DIR"]) else "tcp")
        finally:
            kc.stop_channels()
        # bound to the loopback address only
        listening = _listen_addresses(port)
        if listening is not None:
            assert listening and listening <= {"127.0.0.1"}, listening
        started = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.send_signal(sig)
    try:
        rc = proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"minillm lab did not stop within 60 s of {sig.name}")
    tail = _drain(lines, 5)
    assert rc == 0, f"exit code {rc} after {sig.name}:\n{tail}"
    assert "stopped" in tail
    terminal = "".join(seen) + tail
    assert "without encryption" not in terminal and "is not trusted" not in terminal, terminal
    assert f"on 127.0.0.1:{port}, reachable from this computer only" in terminal and "WARNING" not in terminal
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        _get(f"{base}/api/status", token, timeout=3)
    assert started < 150


def test_lab_command_line_is_offline_and_local(tmp_path):
    cmd = lab.jupyter_command(port=12345, notebook_dir=tmp_path, default_url="/lab/tree/x.ipynb")
    joined = " ".join(cmd)
    assert "--ip=127.0.0.1" in joined and "--port=12345" in joined
    assert f"--ServerApp.root_dir={tmp_path}" in joined
    assert "--LabApp.news_url=None" in joined
    assert "--LabApp.extension_manager=readonly" in joined
    assert "NeverCheckForUpdate" in joined
    assert "--ServerApp.open_browser=False" in joined
    assert "--ServerApp.contents_manager_class=minillm.apps.lab_contents.CourseContentsManager" in joined
    assert lab.kernel_transport_args("/tmp/rt") == (["--KernelManager.transport=ipc"] if os.name == "posix" else [])
    assert lab.kernel_transport_args("/" + "x" * 90) == []  # a socket path that long cannot be bound
    assert (lab.LAB_SETTINGS_DIR / "overrides.json").is_file() and f"--LabApp.app_settings_dir={lab.LAB_SETTINGS_DIR}" in cmd
    assert ("--allow-root" in cmd) == (os.geteuid() == 0)
    assert not any("token" in c.lower() for c in cmd), "the token must not be on the command line (ps shows it)"
    env = lab.jupyter_env("abc", base={})
    assert env["JUPYTER_TOKEN"] == "abc"
    # the Chinese edition: its own settings folder, the English one's settings plus JupyterLab's locale
    zh = lab.jupyter_command(port=12345, notebook_dir=tmp_path, lang="zh")
    assert f"--LabApp.app_settings_dir={lab.LAB_SETTINGS_DIRS['zh']}" in zh
    assert not any(a.startswith("--LabApp.app_settings_dir=") and a.endswith("settings") for a in zh)
    en_over = json.loads((lab.LAB_SETTINGS_DIRS["en"] / "overrides.json").read_text())
    zh_over = json.loads((lab.LAB_SETTINGS_DIRS["zh"] / "overrides.json").read_text())
    locale_key = "@jupyterlab/translation-extension:plugin"
    assert {k: v for k, v in zh_over.items() if k != locale_key} == en_over, "the editions' settings drifted apart"
    assert zh_over[locale_key] == {"locale": lab.LAB_LOCALES["zh"]} and locale_key not in en_over
    with pytest.raises(ValueError, match="lang must be one of"):
        lab.jupyter_command(port=1, notebook_dir=tmp_path, lang="fr")


def test_course_hides_the_tests_folder():
    pytest.importorskip("jupyter_server")
    from minillm.apps.lab_contents import is_course_hidden

    for path in ("tests", "/tests/", "tests/solved/ch04_exercises_solved.ipynb", "./tests/solved", "tests\\solved"):
        assert is_course_hidden(path), path
    for path in ("", "notebooks", "notebooks/tests", "exercises/ch04_exercises.ipynb", "tests_notes.md"):
        assert not is_course_hidden(path), path


def test_start_page_and_missing_notebooks(tmp_path, capsys):
    assert lab.start_page(tmp_path) is None
    assert lab.lab_path(None) == "/lab"
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "README.ipynb").write_text("{}")
    assert lab.start_page(tmp_path) == "notebooks/README.ipynb"
    assert lab.lab_path("notebooks/README.ipynb") == "/lab/tree/notebooks/README.ipynb"
    assert lab.main(["--notebook-dir", str(tmp_path / "nope"), "--no-browser"]) == 2
    assert "no such folder" in capsys.readouterr().err


class _ExitedServer:
    """Stands in for the JupyterLab process: records its command line and exits at once."""

    commands: list = []

    def __init__(self, cmd, **kwargs):
        self.commands.append(cmd)
        self.returncode = 1

    def poll(self):
        return 1

    def wait(self, timeout=None):
        return 1

    def send_signal(self, sig):
        pass

    kill = terminate = lambda self: None


def _default_url_chosen(monkeypatch, capsys, notebook_dir, *args) -> tuple[str, str]:
    """Run ``minillm lab`` up to the point where it starts JupyterLab; the URL it asked for."""
    _ExitedServer.commands = []
    monkeypatch.setattr(lab.subprocess, "Popen", _ExitedServer)
    rc = lab.main(["--notebook-dir", str(notebook_dir), "--no-browser", "--port", "1", "--timeout", "5", *args])
    assert rc == 1 and len(_ExitedServer.commands) == 1  # the stand-in server "died" before answering
    urls = [a.split("=", 1)[1] for a in _ExitedServer.commands[0] if a.startswith("--LabApp.default_url=")]
    assert len(urls) == 1
    return urls[0], capsys.readouterr().err


def _page(root: Path, rel: str) -> None:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text("{}")


def test_lab_lang_chooses_the_editions_start_page(tmp_path, monkeypatch, capsys):
    for rel in ("notebooks/README.ipynb", "notebooks/ch04/00_overview.ipynb",
                "notebooks/zh/README.ipynb", "notebooks/zh/ch04/00_overview.ipynb"):
        _page(tmp_path, rel)
    assert lab.start_page(tmp_path) == "notebooks/README.ipynb"
    assert lab.start_page(tmp_path, "en") == "notebooks/README.ipynb"
    assert lab.start_page(tmp_path, "zh") == "notebooks/zh/README.ipynb"

    url, err = _default_url_chosen(monkeypatch, capsys, tmp_path)  # no --lang: English
    assert url == "/lab/tree/notebooks/README.ipynb", url
    url, err = _default_url_chosen(monkeypatch, capsys, tmp_path, "--lang", "zh")
    assert url == "/lab/tree/notebooks/zh/README.ipynb", url
    assert "warning" not in err
    url, _ = _default_url_chosen(monkeypatch, capsys, tmp_path, "--lang", "en")
    assert url == "/lab/tree/notebooks/README.ipynb", url

    # no Chinese start page: the chapter's first Chinese notebook ...
    (tmp_path / "notebooks/zh/README.ipynb").unlink()
    assert lab.start_page(tmp_path, "zh") == "notebooks/zh/ch04/00_overview.ipynb"
    url, _ = _default_url_chosen(monkeypatch, capsys, tmp_path, "--lang", "zh")
    assert url == "/lab/tree/notebooks/zh/ch04/00_overview.ipynb", url
    # ... and with no Chinese notebook at all, the English start page, saying so
    (tmp_path / "notebooks/zh/ch04/00_overview.ipynb").unlink()
    assert lab.start_page(tmp_path, "zh") is None
    url, err = _default_url_chosen(monkeypatch, capsys, tmp_path, "--lang", "zh")
    assert url == "/lab/tree/notebooks/README.ipynb", url
    assert "no 'zh' start page" in err and "notebooks/zh/README.ipynb" in err, err


def test_lab_lang_rejects_other_values(tmp_path, capsys):
    for bad in ("fr", "ZH", "zh-CN", "", "english"):
        with pytest.raises(SystemExit) as exit_:
            lab.main(["--notebook-dir", str(tmp_path), "--no-browser", "--lang", bad])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert "--lang" in err and "lang must be one of 'en', 'zh'" in err and repr(bad) in err, err
    for bad in ("fr", None, 1):
        with pytest.raises(ValueError, match=r"lang must be one of 'en', 'zh'"):
            lab.start_page(tmp_path, bad)
    assert lab.check_lang("zh") == "zh" and lab.LANGS == ("en", "zh")
