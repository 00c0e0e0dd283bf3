"""Write the chapter 04 exercises notebooks — English and Chinese, student and solved — from one source.

    python scripts/build_exercises.py [--execute] [--lang en|zh]

Four notebooks come out of this file:

* ``exercises/ch04_exercises.ipynb`` and ``notebooks/zh/ch04/ch04_exercises.ipynb``: the student
  notebooks, English and Chinese;
* ``tests/solved/ch04_exercises_solved.ipynb`` and ``tests/solved/zh/ch04_exercises_solved.ipynb``:
  their solved twins (reference answers from ``tests/solved/answers.py``).

Why one source: every prose cell is one ``Bi(English, Chinese)`` written side by side, the quiz
questions, options, pitfalls and scenario come from the graders' own bilingual tables
(``texts.py``); the cells' text is in the package (``minillm/grading/ch04/exercise_notebook.py``,
where copy detection reads it), and the code cells (answer templates, ``check(...)`` calls) are
the same strings in both editions, so the editions cannot drift apart and the exercise ids and points are the
same. The one code difference is the set-up cell: the Chinese edition calls
``set_language("zh")`` so feedback that has no language of its own (code, letters) is Chinese;
its ``metadata.minillm.lang`` is "zh" for ``minillm grade``.

``--execute`` runs them and stores their outputs (a student notebook must show "not attempted"
everywhere; a solved one, full marks), which is what nbval compares against. Cells whose output
depends on the shipped model carry ``# NBVAL_IGNORE_OUTPUT``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import nbformat
from nbformat.v4 import new_notebook

from minillm.grading.ch04.exercise_notebook import STUDENT_PATH, STUDENT_ZH_PATH, cells
from minillm.i18n import LANGS

REPO = Path(__file__).resolve().parents[1]
STUDENT = REPO / STUDENT_PATH
SOLVED = REPO / "tests" / "solved" / "ch04_exercises_solved.ipynb"
STUDENT_ZH = REPO / STUDENT_ZH_PATH
SOLVED_ZH = REPO / "tests" / "solved" / "zh" / "ch04_exercises_solved.ipynb"
TARGETS = [(STUDENT, False, "en"), (SOLVED, True, "en"), (STUDENT_ZH, False, "zh"), (SOLVED_ZH, True, "zh")]

SOLVED_SOURCE = REPO / "tests" / "solved" / "answers.py"


def solved_answers(lang: str = "en") -> dict:
    """The reference answers, read from ``tests/solved/answers.py`` (a source checkout only)."""
    import runpy

    if not SOLVED_SOURCE.is_file():
        raise FileNotFoundError(f"the reference answers are in {SOLVED_SOURCE} (a source checkout), not installed")
    return runpy.run_path(str(SOLVED_SOURCE))["SOLVED_ANSWERS_ZH" if lang == "zh" else "SOLVED_ANSWERS"]


def build(solved: bool, lang: str = "en"):
    nb = new_notebook(cells=cells(solved, lang, solved_answers(lang) if solved else None))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nb.metadata["minillm"] = {"lang": lang, "generated": "edit minillm/grading/ch04/exercise_notebook.py and run scripts/build_exercises.py"}
    for i, cell in enumerate(nb.cells):  # stable cell ids: clean diffs when regenerated
        cell["id"] = f"ch04-ex-{i:02d}"
    return nb


def execute(nb, folder: Path):
    from nbclient import NotebookClient

    NotebookClient(nb, timeout=600, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(folder)}}).execute()
    return nb


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--execute", action="store_true", help="run the notebooks and store their outputs")
    parser.add_argument("--lang", choices=LANGS, action="append",
                        help="only this edition (repeatable; default: both)")
    args = parser.parse_args(argv)
    for path, solved, lang in TARGETS:
        if args.lang and lang not in args.lang:
            continue
        nb = build(solved, lang)
        path.parent.mkdir(parents=True, exist_ok=True)
        if args.execute:
            os.environ.setdefault("TQDM_DISABLE", "1")
            execute(nb, path.parent)
        nbformat.write(nb, path)
        print(f"wrote {path.relative_to(REPO)}")


if __name__ == "__main__":
    main()
