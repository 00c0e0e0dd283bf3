"""Every course notebook prints what it saved, survives being run again, and every cell survives
being run twice in a row, in one kernel.

The course tells learners to change something and run it again, and a learner's most common move
is Shift+Enter on the same cell twice. So each experiment makes what it needs (fresh request ids,
or its own small engine), and a walkthrough cell that steps one request checks that its step still
applies, instead of assuming it runs once in a fresh kernel. This test runs every notebook under
``notebooks/`` in one kernel: Run All, then each cell twice in a row (``run_notebooks.py
--all-then-each``). The second pass sees everything the first left behind, its request ids, its
finished and cancelled requests, its engines; and each cell sees itself just run.

The first Run All is also nbval's check: its outputs are compared with the ones saved in the
file (``tests/notebook_outputs.py``, nbval's rules and sanitize patterns), so nbval needs no run
of its own (scripts/test.sh runs nbval on ``exercises/`` only). Each cell runs three times in all.

One kernel per notebook; the notebooks run one after the other in this process.
"""

from __future__ import annotations

from conftest import load_script
from pathlib import Path

import nbformat
import pytest
from notebook_outputs import differences, saved_outputs

ROOT = Path(__file__).resolve().parent.parent
ALL_NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
# the Chinese edition runs from tests/test_notebooks_rerun_zh.py: another file, so that
# pytest-xdist (--dist loadfile in scripts/test.sh) runs the two editions on two workers
NOTEBOOKS = [p for p in ALL_NOTEBOOKS if p.relative_to(ROOT / "notebooks").parts[0] != "zh"]

pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]


def _run_notebooks_module():
    return load_script("run_notebooks")


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks under notebooks/"


def run_all_then_each_twice(path, monkeypatch, again=None):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    run = _run_notebooks_module()
    saved = saved_outputs(nbformat.read(str(path), as_version=4))
    first_round = []

    def compare_first_round(round_index, nb):
        if round_index == 0:
            first_round.extend(differences(saved, nb))

    # raises CellExecutionError naming the cell
    nb = run.execute(path, rerun="all-then-each", timeout=600, after_round=compare_first_round, again=again)
    assert not first_round, (f"{path.name}: outputs differ from the saved ones (rebuild with "
                             f"scripts/run_notebooks.py):\n" + "\n".join(first_round))
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{path.name}: a cell printed an error: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    assert all(c.get("execution_count") for c in code if c.source.strip()), f"{path.name}: a code cell did not run"
    return nb


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[str(p.relative_to(ROOT / "notebooks")) for p in NOTEBOOKS])
def test_run_all_then_each_cell_twice_in_one_kernel(path, monkeypatch):
    run_all_then_each_twice(path, monkeypatch)
