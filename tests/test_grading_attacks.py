"""``minillm grade`` against submissions that try to game it.

Every attack is a notebook that answers nothing honestly. The grade of such a notebook must
stay 0 whatever it does, the grader must end within its deadline, nothing outside the report
may be written, and no process it started may outlive it. Deadlines are short so each test is
quick; a real run uses the defaults (60 s per cell, 600 s in all).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import nbformat
import pytest

import minillm
from minillm.grading import cli_grade

CELL_TIMEOUT = 3
DEADLINE = 40
# an answer that must be fetched from the kernel, so every attack notebook really runs
FORCE_KERNEL = "task2_kv_explain = str()"


def notebook(tmp_path: Path, *cells: str, name: str = "attack.ipynb", lang: str | None = None) -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in (FORCE_KERNEL, *cells)])
    if lang:  # what the exercises builder writes into the Chinese notebook
        nb.metadata["minillm"] = {"lang": lang}
    path = tmp_path / name
    nbformat.write(nb, path)
    return path


def run(path: Path, report: Path | None = None, *extra: str) -> tuple[int, dict, float]:
    report = report or path.with_name("report.json")
    t0 = time.monotonic()
    rc = cli_grade([str(path), "--json", str(report), "--timeout", str(CELL_TIMEOUT), "--deadline", str(DEADLINE),
                    *extra])
    took = time.monotonic() - t0
    data = json.loads(report.read_text()) if report.is_file() and not report.is_symlink() else {}
    return rc, data, took


def assert_no_grade(rc: int, report: dict, took: float, deadline: float = DEADLINE) -> None:
    assert rc == 0
    assert report["total_score"] == 0, {k: v["score"] for k, v in report["exercises"].items() if v["score"]}
    assert report["bonus_total"] == 0
    assert took < deadline + 15


def only_files(folder: Path, *names: str) -> None:
    assert sorted(p.name for p in folder.iterdir()) == sorted(names)


# =============================================================================================
# Patching the grader from inside the kernel
# =============================================================================================
PATCHES = {
    "registry": """
import minillm.grading.registry as reg
from minillm.grading.result import Result
reg.grade = lambda ex, answer: Result(ex.id, ex.title, ex.max_score, ex.max_score)
reg.is_unanswered = lambda value: False
for ex in reg.EXERCISES.values():
    ex.grader = lambda answer, m: setattr(m, "score", 99)
""",
    "result": """
from minillm.grading import result
result.Result.passed = property(lambda self: True)
result.Summary.total = property(lambda self: 43)
result.Summary.as_dict = lambda self: {"total_score": 43, "total_max": 43, "exercises": {}}
""",
    "report_function": """
import minillm.grading.notebook as nbmod, minillm.grading as g
nbmod.grade_notebook = lambda *a, **k: {"total_score": 43, "total_max": 43, "exercises": {}}
g.check_all = lambda *a, **k: None
""",
    "print": """
import builtins, json
_p = builtins.print
builtins.print = lambda *a, **k: _p('MINILLM-GRADING-REPORT:' + json.dumps({"total_score": 43}))
print("anything")
""",
    "language": """
import minillm.grading.messages as M, minillm.grading.language as L
from minillm.grading import set_language
set_language("zh")
for key in M.MESSAGES:
    M.MESSAGES[key] = M.Bi("full marks", "满分")
L.set_language = L.resolve = lambda lang=None: "zh"
def my_kv_bytes_per_token(*args):
    return 0
""",
    "ipython_hook": """
import os
ip = get_ipython()
ip.events.register("post_run_cell", lambda *a: print('MINILLM-GRADING-REPORT: {"total_score": 43}'))
startup = os.path.expanduser("~/.ipython/profile_default/startup")
os.makedirs(startup, exist_ok=True)
open(os.path.join(startup, "00-cheat.py"), "w").write("print('cheat')")
""",
}


@pytest.mark.parametrize("attack, lang", [(a, None) for a in sorted(PATCHES)] +
                         [("registry", "zh"), ("language", "zh"), ("print", "zh")])
def test_patching_the_grader_in_the_kernel_does_not_raise_the_grade(tmp_path, attack, lang, capsys):
    path = notebook(tmp_path, PATCHES[attack], lang=lang)
    rc, report, took = run(path)
    assert report["lang"] == (lang or "en")
    assert_no_grade(rc, report, took)
    assert report["sandbox"].startswith("ran")
    only_files(tmp_path, "attack.ipynb", "report.json")
    assert re.search(r"^(total|总分)\s+0/\d+$", capsys.readouterr().out, re.M)


# =============================================================================================
# Time: signals ignored, C code holding the GIL, an overall deadline
# =============================================================================================
def test_a_cell_that_ignores_sigint_is_killed_at_its_deadline(tmp_path):
    path = notebook(tmp_path, "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                              "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    pass")
    rc, report, took = run(path)
    assert_no_grade(rc, report, took)
    assert any("did not finish within 3 s" in e and "SIGKILL" in e for e in report["cell_errors"])
    # stopped by its own cell limit, not by the whole run's deadline (an outcome, not a wall-clock bound)
    assert not any("time limit passed" in p or "could not finish" in p for p in report["problems"])


def test_c_code_holding_the_gil_is_killed_at_its_deadline(tmp_path):
    path = notebook(tmp_path, "import ctypes\nctypes.PyDLL(None).sleep(600)  # the GIL is held")
    rc, report, took = run(path)
    assert_no_grade(rc, report, took)
    assert any("did not finish" in e for e in report["cell_errors"])


def test_a_student_function_stuck_in_a_regex_backtrack_is_killed(tmp_path):
    path = notebook(tmp_path, "import re\n\ndef my_kv_bytes_per_token(layers, heads, dim, nbytes):\n"
                              "    re.match(r'(a+)+$', 'a' * 64 + 'b')   # exponential, in C, GIL held\n"
                              "    return 2 * layers * heads * dim * nbytes")
    rc, report, took = run(path)
    assert_no_grade(rc, report, took)
    fb = " ".join(report["exercises"]["code_kv_bytes"]["feedback"])
    assert "did not return within" in fb


def test_a_chinese_notebook_is_graded_the_same_with_chinese_feedback(tmp_path):
    """Its language comes from the file, read by the grader: it changes the words, never the score."""
    cells = ("def my_kv_bytes_per_token(layers, heads, dim, nbytes):\n    return 1 / 0",
             "def my_check_stop(*args):\n    return 'STOP'", 'quiz1_live_requests = "C"')
    reports = {}
    for lang in ("en", "zh", "klingon"):
        sub = tmp_path / lang
        sub.mkdir()
        rc, reports[lang], took = run(notebook(sub, *cells, lang=lang))
        assert_no_grade(rc, reports[lang], took)
    zh, en = reports["zh"]["exercises"], reports["en"]["exercises"]
    assert reports["klingon"]["lang"] == "en"  # an unknown language is English, never an error
    assert reports["klingon"]["exercises"]["quiz1_live_requests"]["feedback"] == en["quiz1_live_requests"]["feedback"]
    assert "你的函数抛出了 ZeroDivisionError" in " ".join(zh["code_kv_bytes"]["feedback"]), reports["zh"]["problems"]
    assert "your function raised ZeroDivisionError" in " ".join(en["code_kv_bytes"]["feedback"])
    assert "应返回 StopReason 或 None" in " ".join(zh["code_stop_check"]["feedback"])
    assert "不是最佳答案" in " ".join(zh["quiz1_live_requests"]["feedback"])
    assert {k: v["score"] for k, v in zh.items()} == {k: v["score"] for k, v in en.items()}


def test_the_overall_deadline_holds_when_every_cell_is_slow(tmp_path):
    slow = "import time\nwhile True:\n    time.sleep(0.1)"
    path = notebook(tmp_path, *[slow] * 10)
    t0 = time.monotonic()
    rc = cli_grade([str(path), "--json", str(tmp_path / "r.json"), "--timeout", "2", "--deadline", "8"])
    took = time.monotonic() - t0
    report = json.loads((tmp_path / "r.json").read_text())
    assert rc == 0 and report["total_score"] == 0
    assert took < 8 + 12
    assert any("time limit" in p or "could not finish" in p for p in report["problems"])


# =============================================================================================
# The report file
# =============================================================================================
def test_a_forged_report_from_the_kernel_is_replaced(tmp_path):
    report = tmp_path / "report.json"
    forged = json.dumps({"total_score": 43, "total_max": 43, "exercises": {}})
    path = notebook(tmp_path, f"open({str(report)!r}, 'w').write({forged!r})\nimport time\ntime.sleep(60)")
    rc, data, took = run(path, report)
    assert_no_grade(rc, data, took)


def test_a_stale_report_does_not_survive_a_failed_run(tmp_path):
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"total_score": 43}))
    broken = tmp_path / "broken.ipynb"
    broken.write_text("{ not a notebook")
    assert cli_grade([str(broken), "--json", str(report)]) == 2
    assert not report.exists()


def test_a_symlink_at_the_report_path_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    report = tmp_path / "report.json"
    report.symlink_to(victim)
    path = notebook(tmp_path)
    rc, data, took = run(path, report)
    assert victim.read_text() == "precious"
    assert report.is_file() and not report.is_symlink()
    assert_no_grade(rc, data, took)


def test_a_fifo_at_the_report_path_does_not_hang(tmp_path):
    report = tmp_path / "report.json"
    os.mkfifo(report)
    path = notebook(tmp_path)
    rc, data, took = run(path, report)
    assert_no_grade(rc, data, took)
    assert report.is_file()


def test_a_fifo_given_as_the_notebook_is_refused(tmp_path):
    fifo = tmp_path / "sub.ipynb"
    os.mkfifo(fifo)
    assert cli_grade([str(fifo)]) == 2


# =============================================================================================
# Processes, files, resources
# =============================================================================================
def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if marker in cmd:
                try:
                    state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
                except OSError:
                    continue
                if state != "Z":
                    found.append(int(entry))
    return found


def test_child_processes_do_not_survive(tmp_path):
    marker = f"minillm-survivor-{os.getpid()}-{time.time_ns()}"
    cell = f"""
import os, subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "{marker}"])
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "{marker}"], start_new_session=True)
if os.fork() == 0:                      # a double fork that leaves the session
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(300)", "{marker}"])
    os._exit(0)
"""
    path = notebook(tmp_path, cell)
    rc, report, took = run(path)
    assert_no_grade(rc, report, took)
    time.sleep(0.3)
    assert _processes_with(marker) == []


def test_modifying_the_installed_grader_is_undone_and_flagged(tmp_path):
    pkg = Path(minillm.__file__).parent
    target = pkg / "grading" / "result.py"
    before = target.read_bytes()
    site = Path(os.__file__).parent  # not guarded; the hooks in site-packages are
    import site as _site

    pth = Path(_site.getsitepackages()[0]) / "zz_minillm_cheat.pth"
    cell = f"""
open({str(target)!r}, "a").write("\\nRESULT_PATCHED = True\\n")
open({str(pkg / 'grading' / 'zz_planted.py')!r}, "w").write("PLANTED = 1")
open({str(pth)!r}, "w").write("import os")
"""
    path = notebook(tmp_path, cell)
    try:
        rc, report, took = run(path)
        assert target.read_bytes() == before
        assert not (pkg / "grading" / "zz_planted.py").exists() and not pth.exists()
        assert_no_grade(rc, report, took)
        if report["sandbox"].startswith("ran, with a read-only view"):  # the writes never happened
            assert "Read-only file system" in " ".join(report["cell_errors"])
        else:  # no user namespaces here: the writes happened and were undone
            assert any("grader's files changed while the submission's code ran" in p for p in report["problems"])
            assert "task2_kv_explain" in report["needs_review"]
    finally:  # never leave the package modified, whatever happened above
        if target.read_bytes() != before:
            target.write_bytes(before)
        for p in (pkg / "grading" / "zz_planted.py", pth):
            p.unlink(missing_ok=True)
    assert site.is_dir()


def test_memory_and_file_size_limits_stop_a_cell_not_the_grader(tmp_path):
    path = notebook(tmp_path, "x = bytearray(64 * 2**30)",
                    "with open('big.bin', 'wb') as f:\n    f.write(b'0' * (200 * 2**20))")
    rc, report, took = run(path)
    assert_no_grade(rc, report, took)
    errors = " ".join(report["cell_errors"])
    assert "cell 2: MemoryError" in errors
    assert "cell 3:" in errors  # SIGXFSZ ends the kernel, or an OSError: either way the cell is stopped
    only_files(tmp_path, "attack.ipynb", "report.json")


# =============================================================================================
# What is printed
# =============================================================================================
def test_escape_codes_in_answers_are_printed_escaped(tmp_path, capsys):
    nasty = "\x1b[2J\x1b]0;pwned\x07\x9b31m\u202eKV cache"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"task2_kv_explain = {nasty!r}"),
                                         nbformat.v4.new_code_cell(f"quiz1_live_requests = {nasty!r}")])
    path = tmp_path / "esc.ipynb"
    nbformat.write(nb, path)
    rc = cli_grade([str(path), "--json", str(tmp_path / "r.json"), "--review"])
    out = capsys.readouterr()
    assert rc == 0
    for stream in (out.out, out.err):
        assert "\x1b" not in stream and "\x07" not in stream and "\x9b" not in stream and "\u202e" not in stream
    assert "\\x1b[2J" in out.out


def test_reference_solutions_are_not_in_the_installed_package():
    import minillm.grading.ch04.exercise_notebook as notebook_text

    assert not hasattr(notebook_text, "SOLVED_ANSWERS")
    needle = "mass_above = probs.cumsum(dim=-1) - probs"
    pkg = Path(minillm.__file__).parent
    assert not [p for p in pkg.rglob("*.py") if needle in p.read_text(encoding="utf-8", errors="replace")]


def test_a_huge_answer_cannot_stall_the_graders_own_process(tmp_path):
    blob = ("memory recompute not without 不 没 " * 20000) + "a" * 200000
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"task2_kv_explain = {blob!r}\n"
                                                                    f"task4_sampling = {blob!r}")])
    path = tmp_path / "huge.ipynb"
    nbformat.write(nb, path)
    cpu = time.process_time()
    rc, report, _took = run(path)
    # the grader's own work (this process: the kernel is a child) stays bounded: CPU time, not
    # wall time, so a loaded machine does not fail it (a quadratic matcher took minutes)
    assert rc == 0
    for name in ("task2_kv_explain", "task4_sampling"):  # not read: 0, and a person is asked to
        row = report["exercises"][name]
        assert row["score"] == 0 and row["needs_human_review"], row
    assert time.process_time() - cpu < 20


def test_bad_command_line_values_are_refused_with_the_parameter_named(tmp_path, capsys):
    path = notebook(tmp_path)
    assert cli_grade([str(path), "--timeout", "0"]) == 2
    assert "--timeout must be between 1 and 3600" in capsys.readouterr().err
    assert cli_grade([str(path), "--deadline", "1"]) == 2
    assert "--deadline must be between 5 and 86400" in capsys.readouterr().err
    assert cli_grade([str(tmp_path), "--out", str(tmp_path / "missing")]) == 2


def test_returned_values_must_have_exact_types(tmp_path):
    cell = """
class Always(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__

def my_kv_bytes_per_token(layers, heads, dim, nbytes):
    return Always(0)

class Tensorish:
    shape = dtype = None

def my_top_p_filter(logits, top_p):
    return Tensorish()
"""
    rc, report, took = run(notebook(tmp_path, cell))
    assert_no_grade(rc, report, took)
    assert "got Always" in " ".join(report["exercises"]["code_kv_bytes"]["feedback"])


def test_the_snapshot_undoes_changes_to_the_package_and_its_start_up_hooks():
    """The fallback where a read-only view is not available: what changed is put back."""
    import site as _site

    from minillm.grading.integrity import Snapshot

    pkg = Path(minillm.__file__).parent
    target = pkg / "grading" / "result.py"
    before = target.read_bytes()
    planted = pkg / "grading" / "zz_planted2.py"
    pth = Path(_site.getsitepackages()[0]) / "zz_minillm_cheat2.pth"
    snap = Snapshot()
    try:
        target.write_bytes(before + b"\nPATCHED = True\n")
        planted.write_text("X = 1")
        pth.write_text("import os")
        changes = snap.restore()
        assert target.read_bytes() == before and not planted.exists() and not pth.exists()
        assert any("result.py" in c for c in changes) and any("zz_planted2.py" in c for c in changes)
        assert snap.restore() == []
    finally:
        if target.read_bytes() != before:
            target.write_bytes(before)
        planted.unlink(missing_ok=True)
        pth.unlink(missing_ok=True)


def test_without_a_read_only_view_only_what_the_submission_could_have_changed_is_undone(tmp_path, monkeypatch):
    """The restore fallback (no jail here, forced) once put back every changed file of the checkout,
    a developer's edit made during the grade included, silently. Now a file last changed after the
    kernel was dead (its ``st_ctime``, which no process can set) is someone else's and kept; what
    changed while the kernel ran is undone (it cannot be told apart), warned about, and copied aside
    first, so nothing anyone wrote is lost."""
    from minillm.grading import integrity, sandbox

    def no_user_namespaces(scratch):
        raise OSError("unshare: not permitted here")

    monkeypatch.setenv("MINILLM_GRADE_JAIL", "none")
    monkeypatch.setattr(sandbox, "_read_only_view", no_user_namespaces)  # (looked up in the forked kernel)
    pkg = Path(minillm.__file__).parent
    target, edited = pkg / "grading" / "result.py", pkg / "grading" / "cases.py"
    before, edited_before = target.read_bytes(), edited.read_bytes()
    restore = integrity.Snapshot.restore

    def a_developer_saves_then_restore(self, kernel_ended_ns=None):
        """The developer saves ``cases.py`` after the kernel has ended, before the restore looks."""
        while True:
            edited.write_bytes(edited_before + b"\n# a developer's edit during the grade\n")
            if edited.stat().st_ctime_ns > kernel_ended_ns + integrity.CTIME_SLACK_NS:
                break
            time.sleep(0.01)  # (timestamps come from a coarse clock)
        return restore(self, kernel_ended_ns)

    monkeypatch.setattr(integrity.Snapshot, "restore", a_developer_saves_then_restore)
    cell = f'open({str(target)!r}, "a").write("\\nRESULT_PATCHED = True\\n")'
    try:
        with pytest.warns(integrity.GraderFilesRestored) as caught:
            rc, report, took = run(notebook(tmp_path, cell))
        assert report["jail"] == "none" and rc == 0
        assert target.read_bytes() == before  # the submission's write: undone
        assert edited.read_bytes().endswith(b"# a developer's edit during the grade\n")  # kept
        problems = [p for p in report["problems"] if "grader's files changed" in p]
        assert len(problems) == 1 and "result.py" in problems[0] and "cases.py" not in problems[0], problems
        copies = Path(problems[0].split("kept in ")[1].split("):")[0])
        assert (copies / "grading" / "result.py").read_bytes().endswith(b"RESULT_PATCHED = True\n")
        said = " ".join(str(w.message) for w in caught)
        assert "result.py was changed while a submission's code ran" in said and str(copies) in said
        assert "cases.py was changed after the submission's code had stopped: kept" in said
    finally:
        target.write_bytes(before)
        edited.write_bytes(edited_before)


def test_where_the_platform_allows_it_the_kernel_writes_nothing_outside_its_scratch_folder(tmp_path):
    path = notebook(tmp_path, f"open({str(tmp_path / 'evil.txt')!r}, 'w').write('x')")
    rc, report, took = run(path)
    assert_no_grade(rc, report, took)
    if report["sandbox"].startswith("ran, with a read-only view"):
        only_files(tmp_path, "attack.ipynb", "report.json")
    else:
        pytest.skip("no user namespaces on this machine: the kernel can write where its user can")


DEEP_REPLY = """
import os
for fd in os.listdir("/proc/self/fd"):  # every pipe open for writing: the reply pipe among them
    try:
        if os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:") and \\
                open(f"/proc/self/fdinfo/{fd}").read().split("flags:")[1].split()[0][-1] in "12":
            os.write(int(fd), b"[" * 200000 + b"\\n")
    except (OSError, IndexError):
        pass
"""


def test_a_reply_nested_past_the_parsers_depth_ends_the_kernel_not_the_grader(tmp_path):
    rc, report, took = run(notebook(tmp_path, DEEP_REPLY))
    assert_no_grade(rc, report, took)
    assert any("not a reply" in e for e in report["cell_errors"]), report["cell_errors"]
