"""``minillm grade``: the instructor's grader, which a submission cannot talk into a better grade.

    minillm grade NOTEBOOK [--json REPORT]         one submission, a table and a JSON report
    minillm grade FOLDER/ [--out DIR]             every notebook in it: gradebook.csv + gradebook.json
    minillm grade --review REPORT_OR_GRADEBOOK    accept or override the flagged answers (review.py)

How a submission is graded (the threat model is in the README):

1. the answers are read from the cells as data (:mod:`extract`) — text, letters, pairs and
   diagrams never need the student's code to run;
2. only when an answer is code (a function) or computed, the submission's code cells run in a
   sandboxed kernel (:mod:`sandbox`: own process group, resource limits, per-cell and overall
   deadlines, SIGKILL) inside a jail (:mod:`jail`: own user, mount, PID and network namespaces;
   no ``tests/``, no model answers, no network, the grader invisible); the functions are then
   called there with the grader's test inputs, and only the returned *values* come back (:mod:`wire`);
3. every grader runs here, in this process, with code imported before the kernel started;
   nothing the kernel prints is read;
4. the kernel and everything it spawned are killed, any change it made to the installed
   package is undone and reported (:mod:`integrity`), and the report is written atomically
   (:mod:`report`).

A folder is graded one notebook per child process; each row is written to the gradebook as soon
as its notebook is done, so a notebook that ends or stops its grader costs only its own row,
which then says what happened.

Exit status: 0 when grading ran, whatever the score; 2 when a notebook or report path is
unusable; 3 when grading itself failed (no report is left behind), e.g. when no jail can be
built here and ``--unjailed`` was not given.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import stat
import sys
import time
from pathlib import Path

from . import extract, safecall
from . import jail as jails
from .peeking import UNKNOWN, solution_lookups
from .report import as_json, gradebook_csv, remove_stale, safe_text, write_atomic

MAX_NOTEBOOK_BYTES = 50 * 2**20
DEFAULT_CELL_TIMEOUT = 60
DEFAULT_DEADLINE = 600
DEFAULT_JOBS = max(1, min(4, (os.cpu_count() or 2) // 2))
CHILD_GRACE = 120  # a folder run's grader process gets its notebook's deadline plus this, then is killed
_CONTROL_CALLS = {"check", "summary", "check_all", "show_solution", "show_scenarios"}


def read_notebook(path: str | os.PathLike):
    """The notebook at ``path``; ``ValueError`` with a readable reason when it cannot be read.
    Only a regular file is opened (a FIFO or a device would block or never end)."""
    import nbformat

    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ValueError(f"no such file: {path}") from None
    except OSError as exc:
        raise ValueError(f"{path} cannot be read ({exc})") from exc
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path} is not a regular file")
    if st.st_size > MAX_NOTEBOOK_BYTES:
        raise ValueError(f"{path} is larger than {MAX_NOTEBOOK_BYTES // 2**20} MiB")
    try:
        nb = nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)
        if not isinstance(nb.get("cells"), list):
            raise ValueError("no list of cells")
        return nb
    except Exception as exc:  # not JSON, not a notebook, unreadable
        raise ValueError(f"{path} is not a readable notebook ({type(exc).__name__}: {exc})".strip()) from exc


def notebook_language(nb) -> str:
    """The notebook's language for feedback that has none of its own: ``metadata.minillm.lang``
    ("en" or "zh", as the exercises builder writes it), else English. A submission can change it;
    that changes only the language of its feedback, never a score."""
    from ..i18n import LANGS

    meta = nb.get("metadata", {}) if isinstance(nb, dict) else {}
    lang = meta.get("minillm", {}).get("lang") if isinstance(meta.get("minillm"), dict) else None
    return lang if lang in LANGS else "en"


def _is_control_cell(source: str) -> bool:
    """``check("…")`` / ``summary()`` cells: the sandbox need not run the in-notebook grader."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    return bool(tree.body) and all(
        isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Name)
        and n.value.func.id in _CONTROL_CALLS for n in tree.body)


class Session:
    """The submission's code cells in a sandboxed kernel, restarted when a deadline killed it."""

    def __init__(self, nb, cell_timeout: float, ends_at: float, files: dict | None = None, jail=None):
        self.cells = []
        for i, cell in enumerate(nb.cells, start=1):
            if cell.get("cell_type") == "code":
                src = cell.get("source", "")
                src = src if isinstance(src, str) else "".join(src)
                if src.strip() and not _is_control_cell(src):
                    self.cells.append((i, src))
        self.cell_timeout = cell_timeout
        self.ends_at = ends_at
        self.files = files or {}
        self.jail = jail
        self.kernel = None
        self.skipped: set[int] = set()
        self.cell_errors: list[str] = []
        self.problems: list[str] = []
        self._first_run = True
        self.isolated: bool | None = None

    def _start(self) -> bool:
        from .sandbox import Deadline, Kernel, KernelDied

        while time.monotonic() < self.ends_at - 1:
            k = Kernel(self.ends_at - time.monotonic(), self.cell_timeout, self.files, jail=self.jail)
            k.sources = [src for _, src in self.cells]
            try:
                k.start()
            except KernelDied as exc:
                k.close()
                self.problems.append(f"the sandboxed kernel did not start ({exc})")
                return False
            current = None
            try:
                for i, src in self.cells:
                    if i in self.skipped:
                        continue
                    current = i
                    err = k.run_cell(src)
                    if err and self._first_run:
                        self.cell_errors.append(f"cell {i}: {err}")
                self.kernel, self._first_run = k, False
                self.isolated = k.isolated if self.isolated is None else (self.isolated and k.isolated)
                return True
            except KernelDied as exc:
                k.close()
                if current is None or time.monotonic() >= self.ends_at - 1:
                    self.problems.append(f"the submission's cells could not finish ({exc})")
                    return False
                self.skipped.add(current)
                why = (f"did not finish within {self.cell_timeout:g} s" if isinstance(exc, Deadline)
                       else f"ended the kernel ({exc})")
                self.cell_errors.append(f"cell {current}: {why}; it was stopped (SIGKILL) and skipped")
        self.problems.append("the whole run's time limit passed")
        return False

    def ensure(self) -> bool:
        if self.kernel is not None and self.kernel.alive:
            return True
        self.kernel = None
        return self._start()

    def get(self, name: str):
        from .sandbox import KernelDied

        if not self.ensure():
            return False, None, False
        try:
            return self.kernel.get(name)
        except KernelDied:
            return False, None, False
        except ValueError:  # malformed data
            return True, None, False

    def call(self, name: str, args: tuple, kwargs: dict, timeout: float, forbid: tuple = ()) -> safecall.Outcome:
        from .sandbox import Deadline, KernelDied

        if not self.ensure():
            return safecall.Outcome.failed("call.no_kernel", timed_out=True)
        try:
            kind, payload = self.kernel.call(name, args, kwargs, timeout, forbid)
        except Deadline:
            return safecall.Outcome.failed("call.timeout", t=timeout, timed_out=True)
        except KernelDied as exc:
            return safecall.Outcome.failed("call.ended_kernel", error=exc, timed_out=True)
        except ValueError:
            return safecall.Outcome.failed("call.unreadable", exc_type=TypeError)
        return safecall.remote_outcome(kind, payload)

    def close(self) -> None:
        if self.kernel is not None:
            self.kernel.close()
            self.kernel = None


def _prepare(need_engine: bool) -> None:
    """Import (and load) everything grading uses, before any student code runs."""
    from . import wire  # noqa: F401
    from .chapter import current

    current().prepare(need_engine)


def _regular_file(path: Path, limit: int = 2**20) -> bytes | None:
    """The bytes of ``path`` when it is a regular file of at most ``limit`` bytes and not a symbolic
    link (a link beside a submission could point at the grader's files), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        return f.read(limit + 1) if stat.S_ISREG(st.st_mode) and st.st_size <= limit else None


def _answer_text(value) -> str:
    if isinstance(value, str):
        return value[:4000]
    if isinstance(value, safecall.RemoteFunction):
        return f"function {value.name} (run in the sandbox)"
    return repr(value)[:4000]


def grade_notebook(path: str | os.PathLike, cell_timeout: float = DEFAULT_CELL_TIMEOUT,
                   deadline: float = DEFAULT_DEADLINE, nb=None, unjailed: bool = False) -> dict:
    """Grade one submission; returns the report (a dict). Raises ``ValueError`` for an unreadable
    notebook, and :class:`jail.NoJail` when its code must run but no jail can be built here
    (unless ``unjailed``: then the code runs in the weaker mode, and the report says so)."""
    from .chapter import current
    from .integrity import Snapshot
    from .messages import msg
    from .registry import EXERCISES, grade
    from .result import NOT_ATTEMPTED, Feedback, Result, Summary

    started = time.monotonic()
    ends_at = started + deadline
    path = Path(path)
    nb = read_notebook(path) if nb is None else nb
    lang = notebook_language(nb)
    names = {ex.answer_name: ex for ex in EXERCISES.values()}
    found = extract.static_answers(nb, names)
    editor_file = path.resolve().parent / current().diagram_file
    answers: dict = {}
    dynamic = []
    for name in names:
        kind, value = found.answers.get(name, (None, None))
        if kind == extract.LITERAL:
            answers[name] = value
        elif kind == "editor":
            if found.editor_diagram is not None:
                answers[name] = found.editor_diagram
            elif _regular_file(editor_file) is not None:
                dynamic.append(name)
            else:
                answers[name] = None
        elif kind == extract.STUB:
            answers[name] = extract.STUB
        elif kind == extract.DYNAMIC:
            dynamic.append(name)
    jail = jails.choose(allow_unjailed=unjailed) if dynamic else None
    _prepare(need_engine=any(names[n].kind == "engine" for n in dynamic))
    snapshot = Snapshot()
    session = None
    try:
        if dynamic:
            files = {}
            data = _regular_file(editor_file)
            if data is not None:
                files[editor_file.name] = data
            session = Session(nb, cell_timeout, ends_at, files, jail=jail)
            for name in dynamic:
                ok, value, is_callable = session.get(name)
                if ok:
                    answers[name] = safecall.RemoteFunction(session, name) if is_callable else value
        results = []
        for ex in EXERCISES.values():
            title = ex.title_in(lang)
            if ex.answer_name not in answers:
                results.append(Result(ex.id, title, 0, ex.max_score, NOT_ATTEMPTED, [Feedback(
                    "info", msg("na.not_in_notebook", lang, name=ex.answer_name))], bonus_max=ex.bonus_max, lang=lang))
            elif answers[ex.answer_name] is extract.STUB:
                results.append(Result(ex.id, title, 0, ex.max_score, NOT_ATTEMPTED, [Feedback(
                    "info", msg("na.stub", lang, name=ex.answer_name))], bonus_max=ex.bonus_max, lang=lang))
            elif time.monotonic() > ends_at:
                results.append(Result(ex.id, title, 0, ex.max_score, "error", [Feedback(
                    "wrong", msg("grade.deadline", lang))], True, bonus_max=ex.bonus_max, lang=lang))
            else:
                results.append(grade(ex, answers[ex.answer_name], lang))
    finally:
        if session is not None:
            session.close()  # the kernel and every process it started: dead
        # only a kernel without the read-only view could have written here; otherwise a change is
        # someone else's (an editor, a package upgrade) and is not the submission's to undo
        tampered = (snapshot.restore(kernel_ended_ns=time.time_ns())
                    if session is not None and not session.isolated else [])
    viewed = sorted(v for v in found.solutions_viewed | solution_lookups(nb) if v)
    for r in results:  # "?": a model answer was asked for and we cannot tell which: a person reads them all
        if r.exercise_id in viewed or any(v == UNKNOWN or r.exercise_id.startswith(v) for v in viewed):
            r.needs_human_review = True
            r.feedback.append(Feedback("warn", msg("grade.solution_viewed", lang)))
    _flag_engine_references(nb, results, lang)
    if tampered:
        for r in results:
            r.needs_human_review = True
    report = Summary(results, lang=lang).as_dict()
    for r in results:
        report["exercises"][r.exercise_id]["answer"] = (
            _answer_text(answers[EXERCISES[r.exercise_id].answer_name])
            if EXERCISES[r.exercise_id].answer_name in answers
            and answers[EXERCISES[r.exercise_id].answer_name] is not extract.STUB else None)
    report.update({
        "notebook": str(path),
        "lang": lang,
        "status": "graded",
        "grader_version": grader_version(snapshot),
        "graded_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - started, 2),
        "bonus_total": sum(r.bonus for r in results),
        "needs_review": [r.exercise_id for r in results if r.needs_human_review],
        "solutions_viewed": viewed,
        "sandbox": _sandbox_line(session, jail),
        "jail": jail.mode if jail is not None else None,
        "jail_why": jail.why if jail is not None else "",
        "seed": coding_seed(),
        "cell_errors": session.cell_errors if session else [],
        "problems": (session.problems if session else []) + [
            f"the grader's files changed while the submission's code ran (restored; what was there is kept in "
            f"{snapshot.kept_copies}): {c}" for c in tampered[:20]],
    })
    return report


def _flag_engine_references(nb, results, lang: str) -> None:
    """A person reads a code answer whose notebook names the engine's own implementation of it."""
    from .chapter import current
    from .messages import msg
    from .peeking import engine_references, tampers_with_the_guard
    from .registry import EXERCISES
    from .result import Feedback

    named = engine_references(nb, current().forbidden)
    tampered = tampers_with_the_guard(nb)
    for r in results:
        if EXERCISES[r.exercise_id].answer_name in named:
            r.needs_human_review = True
            r.feedback.append(Feedback("warn", msg("grade.engine_named", lang)))
            if tampered and r.score:  # the guard's own result cannot be trusted: a person decides
                r.score = 0
                r.feedback.append(Feedback("wrong", msg("grade.guard_tampered", lang)))


def _sandbox_line(session, jail) -> str:
    if session is None:
        return "not needed (every answer was read as data)"
    where = "" if jail is None else f", {jail.describe()}"
    if session.isolated:
        return "ran, with a read-only view of the file system" + where
    return "ran (no read-only view on this platform: the grader's files were checked and restored)" + where


def coding_seed() -> int:
    """The seed of this run's fresh code cases (``MINILLM_GRADE_SEED=…`` repeats them)."""
    from .cases import run_seed

    return run_seed()


def grader_version(snapshot=None) -> str:
    import minillm

    return f"minillm {minillm.__version__}, grader {snapshot.digest() if snapshot else '?'}"


# =============================================================================================
# Command line
# =============================================================================================
def format_table(report: dict) -> str:
    from .result import _width

    zh = report.get("lang") == "zh"
    rows = [("练习", "得分", "状态", "复核", "第一个问题") if zh else ("exercise", "score", "status", "review", "first problem")]
    for ex_id, r in report["exercises"].items():
        first = next((f for f in r["feedback"] if f[:1] in ("✗", "!")), "")
        rows.append((safe_text(ex_id), f"{r['score']}/{r['max']}" + (f" +{r['bonus']}" if r.get("bonus") else ""),
                     safe_text(r["status"]), ("是" if zh else "yes") if r["needs_human_review"] else "",
                     safe_text(first)[:80]))
    rows.append(("总分" if zh else "total", f"{report['total_score']}/{report['total_max']}", "", "", ""))
    widths = [max(_width(r[i]) for r in rows) for i in range(4)]
    lines = []
    for i, row in enumerate(rows):
        lines.append(("  ".join(c + " " * (w - _width(c)) for c, w in zip(row, widths)) + "  " + row[4]).rstrip())
        if i in (0, len(rows) - 2):
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 8)
    return "\n".join(lines)


def _print_report(report: dict) -> None:
    line = jails.notice(report.get("jail"), report.get("jail_why", ""))
    if line:
        print(safe_text(line), file=sys.stderr)
    print(format_table(report))
    for title, key in (("Cells that raised an error or were stopped (execution went on)", "cell_errors"),
                       ("Problems", "problems")):
        if report.get(key):
            print(f"\n{title}:")
            for e in report[key]:
                print("  " + safe_text(e))
    if report.get("needs_review"):
        print(f"\nFlagged for a human to read: {safe_text(', '.join(report['needs_review']))}")


def review_lines(report: dict) -> list[str]:
    """The flagged answers of one report, for a person to read."""
    out = []
    for ex_id, r in report.get("exercises", {}).items():
        if r.get("needs_human_review"):
            out.append(f"{safe_text(report.get('notebook', '?'))} · {safe_text(ex_id)} · {r.get('score')}/{r.get('max')}")
            if r.get("answer") is not None:
                out.append("    answer: " + safe_text(r["answer"])[:600])
            for f in r.get("feedback", [])[:6]:
                out.append("    " + safe_text(f)[:200])
    return out


def _progress(i: int, n: int, name: str) -> None:
    width = 24
    done = int(width * i / max(n, 1))
    sys.stderr.write(f"\r[{'#' * done}{'.' * (width - done)}] {i}/{n} {safe_text(name)[:40]:<40}")
    sys.stderr.flush()


def _child_command(nb_path: Path, report_path: Path, args) -> list[str]:
    argv = [sys.executable, "-m", "minillm.grading.notebook", str(nb_path), "--json", str(report_path),
            "--timeout", f"{args.timeout:g}", "--deadline", f"{args.deadline:g}"]
    return argv + (["--unjailed"] if args.unjailed else [])


def _child_limit(nb_path: Path, args) -> float:
    """How long one notebook's grader process may take before it is killed (stopped or hung)."""
    return args.deadline + CHILD_GRACE


def _failed_row(nb_path: Path, status: str, problem: str) -> dict:
    return {"notebook": str(nb_path), "status": status, "problems": [problem], "exercises": {}}


def _last_line(path: Path) -> str:
    try:
        lines = [x for x in path.read_text(encoding="utf-8", errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return lines[-1][:500] if lines else ""


def _kill_strays(known: set[int]) -> None:
    """SIGKILL every child of this process that it did not have before (orphans reparented here).
    Only called while no grader process of this folder run is at work."""
    import signal

    from .sandbox import _children_of

    for pid in _children_of(os.getpid()):
        if pid not in known:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


def grade_in_child(nb_path: Path, args, work: Path) -> dict:
    """One notebook graded by a separate grader process (its own session); always returns a row,
    which says so when that process was killed, stopped, or failed."""
    import signal
    import subprocess

    from .jail import package_dir

    report_path, err_path = work / "report.json", work / "stderr.txt"
    for p in (report_path, err_path):
        p.unlink(missing_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(package_dir().parent), env.get("PYTHONPATH")]))
    limit = _child_limit(nb_path, args)
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(_child_command(nb_path, report_path, args), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True, env=env)
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
    if rc is None:
        return _failed_row(nb_path, "grader stopped", f"its grader did not finish within {limit:g} s "
                           f"(stopped or hung) and was killed; no score")
    if rc < 0:
        return _failed_row(nb_path, "grader killed", f"its grader was ended by signal "
                           f"{signal.Signals(-rc).name if -rc in signal.valid_signals() else -rc}; no score")
    if rc == 2:
        return _failed_row(nb_path, "unreadable", _last_line(err_path) or "the notebook cannot be read")
    try:
        report = json.loads(report_path.read_text(encoding="utf-8")) if rc == 0 else None
    except (OSError, ValueError):
        report = None
    if not isinstance(report, dict) or "exercises" not in report:
        return _failed_row(nb_path, "grader failed", _last_line(err_path) or f"its grader exited with status {rc}")
    return report


def _write_gradebook(csv_path: Path, json_path: Path, reports: list[dict], done: bool) -> None:
    from .chapter import current

    from .copies import mark_shared_answers
    from .review import apply, load

    # answers two students share go to a person; an instructor's overrides are kept across regrades
    reports = apply(mark_shared_answers(reports), load(json_path.parent))
    write_atomic(csv_path, gradebook_csv(reports, list(current().order)))
    write_atomic(json_path, as_json({"grader_version": grader_version(), "complete": done, "reports": reports}))


def _graded_rows(notebooks: list[Path], args, work: Path, known: set[int]):
    """``(notebook, row)`` as each notebook's grader process ends, ``args.jobs`` at a time. One at a
    time, the processes that escaped a notebook's grader are killed before the next one starts;
    several at a time, at the end (the kernels die with their grader either way)."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    def one(i: int, nb_path: Path) -> dict:
        if nb_path.is_symlink():  # it could point at any file the grader can read (a solved notebook)
            return _failed_row(nb_path, "unreadable", "a symbolic link, not a submitted file: not graded")
        own = work / str(i)
        own.mkdir()
        return grade_in_child(nb_path, args, own)

    if args.jobs == 1:
        for i, nb_path in enumerate(notebooks):
            row = one(i, nb_path)
            _kill_strays(known)
            yield nb_path, row
        return
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(one, i, p): p for i, p in enumerate(notebooks)}
        for future in as_completed(futures):
            yield futures[future], future.result()


def _grade_folder(folder: Path, out: Path, args) -> int:
    import tempfile

    from .sandbox import _become_subreaper, _children_of

    notebooks = sorted(p for p in folder.iterdir() if p.suffix == ".ipynb" and not p.name.startswith("."))
    if not notebooks:
        print(f"minillm grade: no .ipynb files in {safe_text(folder)}", file=sys.stderr)
        return 2
    try:
        jail = jails.choose(allow_unjailed=args.unjailed)
    except jails.NoJail as exc:
        print(f"minillm grade: {safe_text(exc)}", file=sys.stderr)
        return 3
    line = jails.notice(jail.mode, jail.why)
    if line:
        print(safe_text(line), file=sys.stderr)
    csv_path, json_path = out / "gradebook.csv", out / "gradebook.json"
    for p in (csv_path, json_path):
        remove_stale(p)
    _become_subreaper()
    known = set(_children_of(os.getpid()))
    reports: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="minillm-gradebook-") as work:
        _progress(0, len(notebooks), notebooks[0].name)
        for nb_path, row in _graded_rows(notebooks, args, Path(work), known):
            reports.append(row)
            reports.sort(key=lambda r: str(r.get("notebook")))
            _write_gradebook(csv_path, json_path, reports, done=len(reports) == len(notebooks))
            _progress(len(reports), len(notebooks), nb_path.name)
        _kill_strays(known)
    _progress(len(notebooks), len(notebooks), "done")
    sys.stderr.write("\n")
    for r in reports:
        print(f"{safe_text(Path(r['notebook']).name)}: {r.get('total_score', '-')}/{r.get('total_max', '-')}"
              f"{'  (' + safe_text(r['status']) + ')' if r['status'] != 'graded' else ''}"
              f"{'  review: ' + safe_text(', '.join(r['needs_review'])) if r.get('needs_review') else ''}")
    print(f"\nGradebook written to {safe_text(csv_path)} and {safe_text(json_path)}")
    return 0


def cli_grade(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="minillm grade",
        description="Grade a submitted exercises notebook (or a folder of them) without trusting it: "
                    "answers are read as data, code runs in a sandboxed, killable kernel.")
    parser.add_argument("notebook", nargs="?", help="a .ipynb file, or a folder of them")
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON to PATH (one notebook)")
    parser.add_argument("--out", metavar="DIR", help="where a folder's gradebook goes (default: the folder)")
    parser.add_argument("--accept", metavar="NOTEBOOK:EXERCISE", action="append",
                        help="with --review: accept the automatic score of a flagged answer")
    parser.add_argument("--set", metavar="NOTEBOOK:EXERCISE=SCORE", action="append",
                        help="with --review: override a score (needs --reason); stored in overrides.json")
    parser.add_argument("--reason", metavar="TEXT", help="with --accept/--set: why")
    parser.add_argument("--review", metavar="REPORT", nargs="?", const="", default=None,
                        help="go through the answers flagged for a human (a report or gradebook JSON; "
                             "interactive on a terminal): accept or override each, with a reason (overrides.json)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_CELL_TIMEOUT, metavar="SECONDS",
                        help=f"time limit per cell (default {DEFAULT_CELL_TIMEOUT}); each call of a student "
                             f"function has {safecall.DEFAULT_TIMEOUT:g} s")
    parser.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE, metavar="SECONDS",
                        help=f"time limit for the whole submission (default {DEFAULT_DEADLINE})")
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS, metavar="N",
                        help=f"a folder: grade N notebooks at once, each in its own grader process "
                             f"(default {DEFAULT_JOBS}: half the CPU cores, at most 4)")
    parser.add_argument("--unjailed", action="store_true",
                        help="where no jail (bubblewrap or unshare) can be built, run the code anyway as a "
                             "limited process of your user, which can read your files (weaker; the report says so)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or bad arguments: argparse has printed why
        return int(exc.code or 0)
    if args.review:
        from .review import run

        return run(Path(args.review), args.accept, args.set, args.reason or "")
    if not args.notebook:
        print("minillm grade: give a notebook or a folder (or --review REPORT)", file=sys.stderr)
        return 2
    for name, value, low, high in (("--timeout", args.timeout, 1, 3600), ("--deadline", args.deadline, 5, 86400),
                                   ("--jobs", args.jobs, 1, 64)):
        if not low <= value <= high:
            unit = "" if name == "--jobs" else " seconds"
            print(f"minillm grade: {name} must be between {low} and {high}{unit}, got {value:g}", file=sys.stderr)
            return 2
    target = Path(args.notebook)
    if target.is_dir():
        out = Path(args.out) if args.out else target
        if not out.is_dir():
            print(f"minillm grade: --out {safe_text(out)} is not a folder", file=sys.stderr)
            return 2
        return _grade_folder(target, out, args)

    try:
        if args.json:
            remove_stale(args.json)
    except OSError as exc:
        print(f"minillm grade: cannot use {safe_text(args.json)} for the report: {safe_text(exc)}", file=sys.stderr)
        return 2
    try:
        nb = read_notebook(target)
    except ValueError as exc:
        print(f"minillm grade: cannot read the notebook: {safe_text(exc)}", file=sys.stderr)
        return 2
    print(f"Grading {safe_text(target)} (answers read as data; code in a sandbox, "
          f"{args.timeout:g} s per cell, {args.deadline:g} s in all)…", file=sys.stderr)
    try:
        report = grade_notebook(target, args.timeout, args.deadline, nb=nb, unjailed=args.unjailed)
    except jails.NoJail as exc:
        print(f"minillm grade: {safe_text(exc)}; no report was written", file=sys.stderr)
        return 3
    except Exception as exc:
        print(f"minillm grade: grading failed ({safe_text(type(exc).__name__)}: {safe_text(exc)}); "
              f"no report was written", file=sys.stderr)
        return 3
    _print_report(report)
    if args.review is not None:
        print("\n" + ("\n".join(review_lines(report)) or "nothing is flagged for review"))
    if args.json:
        try:
            from .review import apply, load

            report = apply([report], load(Path(args.json).resolve().parent))[0]
            write_atomic(args.json, as_json(report))
        except OSError as exc:
            print(f"minillm grade: cannot write the report to {safe_text(args.json)}: {safe_text(exc)}",
                  file=sys.stderr)
            return 2
        print(f"\nReport written to {safe_text(args.json)}")
    return 0


def _without_iri_grammar() -> None:
    """This process grades one notebook (a folder run's child): keep jsonschema, which nbformat
    imports, from building its IRI grammar (lark, ~2.8 CPU s per process), used only to check an
    "iri" format that neither nbformat nor the grader checks."""
    if "jsonschema" not in sys.modules:
        sys.modules.setdefault("rfc3987_syntax", None)  # its import fails: jsonschema goes without


def main() -> None:  # python -m minillm.grading.notebook NOTEBOOK
    _without_iri_grammar()
    sys.exit(cli_grade(sys.argv[1:]))


if __name__ == "__main__":
    main()
