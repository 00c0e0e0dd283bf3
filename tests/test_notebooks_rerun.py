"""Every course notebook survives "change something and run it again".

The course tells learners to edit a cell and run it again, so each cell must make what it
needs (fresh request ids, or its own small engine) instead of assuming it runs once. This
test executes every notebook under ``notebooks/`` in one kernel, each code cell **twice in a
row**: the second run of a cell sees everything the first one left behind (its request ids,
its requests finished or cancelled, its engine's step counter), which is exactly what a
learner's second Shift+Enter sees, and by the end every cell has run twice in one kernel.
(``scripts/run_notebooks.py --twice`` is the other order: Run All, then Run All again.)

One kernel per notebook; the notebooks run one after the other in this process.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)

pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytestmark = pytest.mark.timeout(900)


def _run_notebooks_module():
    spec = importlib.util.spec_from_file_location("run_notebooks", ROOT / "scripts" / "run_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks under notebooks/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[str(p.relative_to(ROOT / "notebooks")) for p in NOTEBOOKS])
def test_every_cell_runs_twice_in_one_kernel(path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    run = _run_notebooks_module()
    nb = run.execute(path, rerun="each", timeout=600)   # raises CellExecutionError naming the cell
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{path.name}: a cell printed an error: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    assert all(c.get("execution_count") for c in code if c.source.strip()), f"{path.name}: a code cell did not run"
