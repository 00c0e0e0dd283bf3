"""The exercises notebook and ``minillm grade`` (``minillm.grading.cli_grade``), end to end.

Each run starts a real Jupyter kernel with nbclient, as a learner's ``minillm grade`` does.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat
import pytest

from minillm.grading import EXERCISES, cli_grade
from exercise_builder import SOLVED, SOLVED_ZH, STUDENT, STUDENT_ZH, build

EDITIONS = pytest.mark.parametrize("student, solved, lang", [(STUDENT, SOLVED, "en"), (STUDENT_ZH, SOLVED_ZH, "zh")],
                                   ids=["en", "zh"])



def grade(tmp_path, notebook: Path, *extra) -> tuple[int, dict]:
    copy = tmp_path / notebook.name
    if copy != notebook:
        shutil.copy(notebook, copy)
    out = tmp_path / "report.json"
    rc = cli_grade([str(copy), "--json", str(out), *extra])
    return rc, (json.loads(out.read_text()) if out.exists() else {})


# =============================================================================================
# The command's contract
# =============================================================================================
def test_unreadable_notebooks_exit_non_zero_with_a_message(tmp_path, capsys):
    assert cli_grade([str(tmp_path / "missing.ipynb")]) == 2
    assert "cannot read the notebook: no such file" in capsys.readouterr().err
    garbage = tmp_path / "garbage.ipynb"
    garbage.write_text("{ this is not json")
    assert cli_grade([str(garbage)]) == 2
    assert "is not a readable notebook" in capsys.readouterr().err
    not_nb = tmp_path / "list.ipynb"
    not_nb.write_text("[1, 2, 3]")
    assert cli_grade([str(not_nb)]) == 2
    assert cli_grade([]) == 2  # argparse: the notebook argument is required


def test_broken_cells_endless_loops_and_noise_still_get_graded(tmp_path, capsys):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in [
        'task2_kv_explain = "KV cache keeps past K/V so decode skips recomputing them, but its memory grows."',
        "1 / 0",
        "while True:\n    pass",
        "import sys, warnings\nwarnings.warn('harmless')\nprint('noise', file=sys.stderr)",
        "task4_sampling = 42",
        "quiz1_live_requests = 'A'",
        "def my_kv_bytes_per_token(layers, heads, dim, nbytes):\n    return 2 * layers * heads * dim * nbytes",
    ]])
    path = tmp_path / "broken.ipynb"
    nbformat.write(nb, path)
    rc, report = grade(tmp_path, path, "--timeout", "4")
    assert rc == 0
    ex = report["exercises"]
    assert list(ex) == list(EXERCISES)
    assert ex["task2_kv_explain"]["score"] == ex["task2_kv_explain"]["max"] == 2
    assert ex["task4_sampling"]["status"] == "graded" and ex["task4_sampling"]["score"] == 0
    assert any("should be a string" in f for f in ex["task4_sampling"]["feedback"])
    assert ex["quiz1_live_requests"]["score"] == 0 and ex["task1_diagram"]["status"] == "not attempted"
    errors = " ".join(report["cell_errors"])
    assert "cell 2: ZeroDivisionError" in errors and "cell 3: did not finish within 4 s" in errors
    assert report["total_score"] == 4 and ex["code_kv_bytes"]["score"] == 2
    printed = capsys.readouterr().out
    assert "task2_kv_explain" in printed and "Cells that raised an error" in printed
    for entry in ex.values():
        assert set(entry) >= {"id", "score", "max", "status", "feedback", "needs_human_review"}


# =============================================================================================
# The committed notebooks
# =============================================================================================
@EDITIONS
def test_committed_notebooks_are_what_the_builder_writes(student, solved, lang):
    """Edit minillm/grading/ch04/exercise_notebook.py and run scripts/build_exercises.py; do not edit one notebook by hand."""
    for path, is_solved in ((student, False), (solved, True)):
        committed = nbformat.read(path, as_version=4)
        built = build(is_solved, lang)
        assert [c.source for c in committed.cells] == [c.source for c in built.cells], path
        assert [c.cell_type for c in committed.cells] == [c.cell_type for c in built.cells]


@EDITIONS
def test_student_and_solved_share_everything_but_the_answers(student, solved, lang):
    student = nbformat.read(student, as_version=4).cells
    solved = nbformat.read(solved, as_version=4).cells
    assert len(student) == len(solved)
    differ = [i for i, (a, b) in enumerate(zip(student, solved)) if a.source != b.source]
    assert len(differ) == len(EXERCISES) + 1  # one answer cell per exercise, and the title
    for ex_id in EXERCISES:  # every exercise is checked in the notebook, by its id
        assert any(c.source.endswith(f'check("{ex_id}")') for c in student), ex_id


@EDITIONS
def test_stored_student_outputs_show_every_exercise_not_attempted(student, solved, lang):
    cells = nbformat.read(student, as_version=4).cells
    checks = [c for c in cells if c.cell_type == "code" and c.source.strip().endswith('")') and "check(" in c.source]
    assert len(checks) == len(EXERCISES)
    for c in checks:
        text = "".join(o.get("data", {}).get("text/plain", "") for o in c.outputs)
        assert "not attempted" in text, c.source
    assert not any(o.output_type == "error" for c in cells if c.cell_type == "code" for o in c.outputs)


# =============================================================================================
# Running them (the notebook loads the shipped model for task 3)
# =============================================================================================
@EDITIONS
def test_unanswered_notebook_runs_clean_and_reports_not_attempted(tmp_path, capsys, student, solved, lang):
    rc, report = grade(tmp_path, student)
    assert rc == 0 and report["lang"] == lang
    assert report["cell_errors"] == []
    assert {e["status"] for e in report["exercises"].values()} == {"not attempted"}
    assert report["total_score"] == 0 and report["total_max"] == sum(e.max_score for e in EXERCISES.values())
    assert "not attempted" in capsys.readouterr().out
    if lang == "zh":  # the feedback of an unanswered Chinese notebook is Chinese
        assert all("尚未作答" in e["feedback"][0] or "仍然抛出" in e["feedback"][0]
                   for e in report["exercises"].values()), report["exercises"]


@EDITIONS
def test_solved_notebook_grades_to_full_marks(tmp_path, student, solved, lang):
    import re

    rc, report = grade(tmp_path, solved)
    assert rc == 0 and report["cell_errors"] == [] and report["lang"] == lang
    for ex_id, entry in report["exercises"].items():
        assert entry["status"] == "graded" and entry["score"] == entry["max"], (ex_id, entry["feedback"])
        assert not entry["needs_human_review"], (ex_id, entry["feedback"])
        cjk = [bool(re.search(r"[\u4e00-\u9fff]", f)) for f in entry["feedback"]]
        assert all(cjk) if lang == "zh" else not any(cjk) or ex_id == "task1_diagram", (ex_id, entry["feedback"])
    assert report["exercises"]["task1_diagram"]["bonus"] == 2
    assert report["total_score"] == report["total_max"]


# =============================================================================================
# The instructor's workflow: a folder, a gradebook, the review list, viewed solutions
# =============================================================================================
def test_a_folder_of_submissions_becomes_a_gradebook_and_flags_go_to_review(tmp_path, capsys):
    import csv

    subs = tmp_path / "subs"
    subs.mkdir()
    cells = {
        "alice": ['task2_kv_explain = "缓存历史K/V，无需重算；但显存占用随序列变长而增加。"',
                  'quiz2_kv_tradeoff = ("D", "it avoids recomputing past tokens, but its memory grows")'],
        "bob": ['task2_kv_explain = "It makes decoding faster."', "from minillm.grading import show_solution",
                'show_solution("task4")', 'task4_sampling = "The sampled token is appended to the history and the '
                'next step is computed from it."'],
    }
    for name, srcs in cells.items():
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in srcs]),
                       subs / f"{name}.ipynb")
    (subs / "broken.ipynb").write_text("{ nope")
    assert cli_grade([str(subs)]) == 0
    out = capsys.readouterr()
    assert "alice.ipynb: 4/" in out.out and "unreadable" in out.out
    book = json.loads((subs / "gradebook.json").read_text())
    by_name = {Path(r["notebook"]).name: r for r in book["reports"]}
    alice, bob = by_name["alice.ipynb"], by_name["bob.ipynb"]
    assert alice["exercises"]["task2_kv_explain"]["score"] == 2
    assert alice["exercises"]["task2_kv_explain"]["answer"].startswith("缓存历史")
    assert "显存" in " ".join(alice["exercises"]["task2_kv_explain"]["feedback"]) or \
        "说到了" in " ".join(alice["exercises"]["task2_kv_explain"]["feedback"])
    assert alice["sandbox"].startswith("not needed") and alice["grader_version"] and alice["graded_at"]
    assert bob["solutions_viewed"] == ["task4"] and "task4_sampling" in bob["needs_review"]
    rows = list(csv.DictReader((subs / "gradebook.csv").open()))
    assert {Path(r["notebook"]).name for r in rows} == {"alice.ipynb", "bob.ipynb", "broken.ipynb"}
    assert "task4_sampling" in next(r for r in rows if r["notebook"].endswith("bob.ipynb"))["needs_review"]
    assert cli_grade(["--review", str(subs / "gradebook.json")]) == 0
    review = capsys.readouterr().out
    assert "bob.ipynb · task4_sampling" in review and "answer: The sampled token" in review


def test_an_editor_diagram_stored_in_the_notebook_is_graded_without_running_anything(tmp_path):
    from minillm.grading.extract import DIAGRAM_MIME

    data = {"states": {"WAITING": "prompt ids; no KV block yet", "PREFILL": "KV blocks for the prompt",
                       "DECODE": "its KV blocks, one more per step", "FINISHED": "stop reason; blocks held",
                       "RELEASED": "nothing: blocks back in the pool"},
            "transitions": [["WAITING", "PREFILL", ""], ["PREFILL", "DECODE", ""], ["DECODE", "DECODE", ""],
                            ["DECODE", "FINISHED", "EOS"], ["FINISHED", "RELEASED", ""]]}
    editor_cell = nbformat.v4.new_code_cell("editor = DiagramEditor()\neditor")
    editor_cell.outputs = [nbformat.v4.new_output("display_data", data={"text/plain": "(diagram)", DIAGRAM_MIME: data})]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("from minillm.grading import DiagramEditor"),
                                         editor_cell, nbformat.v4.new_code_cell("task1_diagram = editor")])
    path = tmp_path / "lone.ipynb"
    nbformat.write(nb, path)
    rc, report = grade(tmp_path, path)
    assert rc == 0 and report["exercises"]["task1_diagram"]["score"] == 12
    assert report["sandbox"].startswith("not needed")
