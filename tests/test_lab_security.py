"""``minillm lab`` against what issue 26 tried: the solved exercises reached through an encoded
``..`` (or a symlink, or a write), the fresh token sent to another server that held ``--port``,
and a bind message that said "127.0.0.1 only" while bound to every interface. These run the
contents manager in-process and the lab's checks without JupyterLab; the server test in
``test_lab.py`` sends the same traversal URLs to a real JupyterLab."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from minillm.apps import lab
from conftest import run_in_thread

pytest.importorskip("jupyter_server")
from tornado import web  # noqa: E402

from minillm.apps.lab_contents import CourseContentsManager, is_course_hidden  # noqa: E402

SOLVED = "tests/solved/answers.ipynb"
TRAVERSALS = [
    "notebooks/../" + SOLVED, "notebooks/%2e%2e/" + SOLVED, "notebooks/..%2f" + SOLVED, "exercises/%2E%2E/tests",
    "notebooks/%252e%252e/" + SOLVED, "notebooks/..\\tests\\solved", "exercises/../tests/solved",
    "notebooks/ch04/../../tests", "../outside.txt", "notebooks/../../outside.txt", "%2e%2e/outside.txt",
]


def test_every_spelling_of_a_way_into_tests_or_out_of_the_root_is_hidden():
    for path in TRAVERSALS:
        assert is_course_hidden(path), path
    for path in ("notebooks/ch04/a.ipynb", "exercises/ch04_exercises.ipynb", "notebooks/tests", "notebooks/..a",
                 "notebooks/ch04/../README.ipynb", ""):
        assert not is_course_hidden(path), path


@pytest.fixture
def course(tmp_path):
    """A served root like the repository's: notebooks/, exercises/, tests/solved/, a file beside the root."""
    root = tmp_path / "root"
    for rel, text in (("notebooks/README.md", "start"), ("notebooks/ch04/a.md", "a"), ("exercises/ex.md", "ex"),
                      (SOLVED, "the answers")):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (tmp_path / "outside.txt").write_text("outside")
    os.symlink(root / "tests", root / "notebooks" / "shortcut")  # a link into tests/ from a course folder
    return root, CourseContentsManager(root_dir=str(root))


def _status(coro) -> int:
    try:
        run_in_thread(coro)
    except web.HTTPError as exc:
        return exc.status_code
    return 200


def test_the_contents_manager_refuses_reads_and_writes_through_any_traversal(course):
    root, cm = course
    assert run_in_thread(cm.get("notebooks/README.md"))["content"] == "start"
    assert run_in_thread(cm.get("notebooks/ch04/../README.md"))["content"] == "start"  # inside: fine
    for path in [*TRAVERSALS, "notebooks/shortcut/solved/answers.ipynb", "notebooks/shortcut"]:
        assert _status(cm.get(path)) == 404, path
        assert _status(cm.get(path, content=False)) == 404, path
        assert not run_in_thread(cm.file_exists(path)) and not run_in_thread(cm.dir_exists(path)), path
    model = {"type": "file", "format": "text", "content": "overwritten"}
    for target in ("notebooks/%2e%2e/" + SOLVED, "exercises/../tests/new.md", "notebooks/shortcut/new.md"):
        assert _status(cm.save(model, target)) == 404, target
    assert _status(cm.rename_file("exercises/ex.md", "exercises/../tests/ex.md")) == 404
    assert _status(cm.delete_file("notebooks/../" + SOLVED)) == 404
    assert (root / SOLVED).read_text() == "the answers"
    assert sorted(p.name for p in (root / "tests").rglob("*")) == ["answers.ipynb", "solved"]
    listing = {m["name"] for m in run_in_thread(cm.get(""))["content"]}
    assert listing == {"notebooks", "exercises"}, listing


def test_copies_checkpoints_links_and_other_spellings_never_reach_tests(course):
    root, cm = course
    os.symlink(root / SOLVED, root / "exercises" / "link.ipynb")  # a file link into tests/
    for path in ("TESTS/solved", "Tests", "tests\x00/solved", "notebooks/..%00/tests", "exercises/link.ipynb"):
        assert _status(cm.get(path)) == 404, path
    # copying the root (or a folder holding links into tests/) with shutil.copytree put the
    # answers in a visible folder and copied the copy into itself until the path was too long
    assert _status(cm.copy("/", "exercises")) == 400 and _status(cm.copy("/", "")) == 400
    copied = run_in_thread(cm.copy("notebooks", "exercises"))["path"]
    assert sorted(p.name for p in (root / copied).rglob("*")) == ["README.md", "a.md", "ch04"]
    # a folder holding such a link is still listed, without the link
    assert {m["name"] for m in run_in_thread(cm.get("exercises"))["content"]} == {"ex.md", "notebooks"}
    for call in (cm.list_checkpoints(SOLVED), cm.create_checkpoint("notebooks/../" + SOLVED),
                 cm.delete_checkpoint("checkpoint", SOLVED), cm.restore_checkpoint("checkpoint", SOLVED)):
        assert _status(call) == 404
    assert sorted(p.name for p in (root / "tests").rglob("*")) == ["answers.ipynb", "solved"]
    hits = [p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and p.read_text() == "the answers"]
    assert hits == [root / SOLVED], hits


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list = []

    def do_GET(self):  # noqa: N802 - http.server's name
        _Recorder.seen.append((self.path, dict(self.headers)))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"started": "now"}')

    def log_message(self, *args):
        pass


def test_a_port_held_by_another_server_gets_no_token(capsys):
    """Issue 26: with --port held by another HTTP server, the lab sent it the fresh token and
    printed the URL. Now it says the port is taken and starts nothing."""
    pytest.importorskip("jupyterlab")
    server = http.server.HTTPServer(("127.0.0.1", 0), _Recorder)
    port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert lab.port_in_use("127.0.0.1", port)
        rc = lab.main(["--no-browser", "--port", str(port), "--token", "secret-token-xyz"])
    finally:
        server.shutdown()
        server.server_close()
    out = capsys.readouterr()
    assert rc == 1
    assert f"port {port} on 127.0.0.1 is already in use" in out.err
    assert "secret-token-xyz" not in out.out + out.err
    assert _Recorder.seen == []
    assert not lab.port_in_use("127.0.0.1", port)


def test_the_token_waits_until_the_lab_itself_listens():
    """The token goes only to a port the lab's own child holds (Linux /proc), never to whoever
    answers there first."""
    with socket.socket() as mine, socket.socket() as other:
        mine.bind(("127.0.0.1", 0))
        mine.listen()
        other.bind(("127.0.0.1", 0))
        owned = lab.listens_on(os.getpid(), mine.getsockname()[1])
        if owned is None:
            pytest.skip("no /proc to tell which process listens")
        assert owned is True
        assert lab.listens_on(os.getpid(), other.getsockname()[1]) is False  # bound, not listening
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    with pytest.raises(RuntimeError, match="exited with code 0 before it listened"):
        lab.wait_until_listening(child, 1, timeout=30)


def test_the_bind_message_says_where_the_lab_really_listens():
    line, warning = lab.bind_notice(Path("/course"), "127.0.0.1", 8888)
    assert "127.0.0.1:8888, reachable from this computer only" in line and warning is None
    assert lab.bind_notice(Path("/c"), "localhost", 1)[1] is None and lab.bind_notice(Path("/c"), "::1", 1)[1] is None
    for ip in ("0.0.0.0", "", "::"):
        line, warning = lab.bind_notice(Path("/course"), ip, 8888)
        assert "127.0.0.1" not in line and "every network interface" in line, line
        assert "WARNING" in warning and "run any code as you" in warning and "unencrypted" in warning
    line, warning = lab.bind_notice(Path("/course"), "192.168.1.5", 8888)
    assert "192.168.1.5:8888" in line and "run any code as you" in warning
    assert [lab.url_host(ip) for ip in ("0.0.0.0", "", "::", "127.0.0.1", "::1", "10.0.0.2")] == \
        ["127.0.0.1", "127.0.0.1", "[::1]", "127.0.0.1", "[::1]", "10.0.0.2"]


def test_idle_kernels_of_closed_notebooks_are_culled(tmp_path):
    cmd = lab.jupyter_command(port=1, notebook_dir=tmp_path)
    assert "--MappingKernelManager.cull_idle_timeout=600" in cmd
    assert not any("cull_connected" in c for c in cmd)  # an open notebook keeps its kernel
