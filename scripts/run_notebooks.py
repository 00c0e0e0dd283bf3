#!/usr/bin/env python
"""Execute course notebooks in place and save their outputs.

Engine changes alter what the notebooks print, so the committed outputs are regenerated
with this script rather than by hand:

    .venv/bin/python scripts/run_notebooks.py                      # every notebook under notebooks/
    .venv/bin/python scripts/run_notebooks.py notebooks/ch04/03_kv_cache.ipynb
    .venv/bin/python scripts/run_notebooks.py --twice --no-save    # check that Run All works twice
    .venv/bin/python scripts/run_notebooks.py --each-twice --no-save   # ... and that each cell can be re-run
    .venv/bin/python scripts/run_notebooks.py --all-then-each --no-save   # both, in one kernel (what the tests do)

Each notebook runs in a fresh ``python3`` kernel whose working directory is the notebook's
folder, with OMP_NUM_THREADS=1 (the shipped model gains nothing from more threads, and the
numbers are steadier). Widget state is saved with the notebook, so widgets render from the
file before any kernel runs. ``--twice`` runs the whole notebook a second time in the same
kernel (Run All again); ``--each-twice`` runs each cell twice in a row (Shift+Enter again after
changing something); ``--all-then-each`` runs the whole notebook once, then each cell twice in a
row: every cell runs again after the whole notebook and right after itself, in one kernel
(tests/test_notebooks_rerun*.py). Saved outputs are those of the last run of each cell.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def default_paths() -> list[Path]:
    return sorted(p for p in (ROOT / "notebooks").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def execute(path: Path, *, rerun: str | None = None, timeout: int = 600, kernel: str = "python3",
            after_round=None, again=None):
    """Run every cell of ``path`` in one kernel; return the executed notebook.

    ``rerun``: None (once), "all" (Run All twice), "each" (every cell twice in a row) or
    "all-then-each" (Run All, then every cell twice in a row: three runs of each cell).
    ``after_round(round_index, nb)`` is called after each Run All, before the next one clears the
    outputs: tests/test_notebooks_rerun.py compares the first round's outputs with the saved ones
    there, so one kernel does both nbval's comparison and the re-run check.
    ``again``: the indices of the cells the rounds after the first run (None: every cell); the
    Chinese edition's test re-runs only the code cells that differ from the English edition's
    (tests/test_notebooks_rerun_zh.py).
    Raises ``nbclient.exceptions.CellExecutionError`` naming the cell that failed."""
    rounds = {None: (1,), "all": (1, 1), "each": (2,), "all-then-each": (1, 2)}
    if rerun not in rounds:
        raise ValueError(f"rerun must be None, 'all', 'each' or 'all-then-each', got {rerun!r}")
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(str(path), as_version=4)
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel, allow_errors=False,
                            store_widget_state=True, record_timing=False,
                            resources={"metadata": {"path": str(path.parent)}})
    with client.setup_kernel(env={**os.environ, "OMP_NUM_THREADS": "1"}):
        for _round, times in enumerate(rounds[rerun]):
            for index, cell in enumerate(nb.cells):
                if _round and again is not None and index not in again:
                    continue
                for _again in range(times):
                    client.execute_cell(cell, index)
            if after_round is not None:
                after_round(_round, nb)
        client.set_widgets_metadata()
    return nb


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="*", type=Path, help="notebooks to run (default: all under notebooks/)")
    again = p.add_mutually_exclusive_group()
    again.add_argument("--twice", action="store_true", help="Run All twice in the same kernel")
    again.add_argument("--each-twice", action="store_true", help="run each cell twice in a row")
    again.add_argument("--all-then-each", action="store_true",
                       help="Run All, then each cell twice in a row, in one kernel")
    p.add_argument("--no-save", action="store_true", help="only check that the notebooks run")
    p.add_argument("--timeout", type=int, default=600, help="seconds per cell (default 600)")
    args = p.parse_args(argv)

    import nbformat

    paths = [q.resolve() for q in args.paths] or default_paths()
    failed = 0
    for path in paths:
        if not path.is_file():
            print(f"run_notebooks: no such notebook: {path}", file=sys.stderr)
            failed += 1
            continue
        t0 = time.monotonic()
        try:
            mode = "all" if args.twice else "each" if args.each_twice else "all-then-each" if args.all_then_each else None
            nb = execute(path, rerun=mode, timeout=args.timeout)
        except Exception as exc:  # noqa: BLE001 - report and go on with the next notebook
            print(f"FAILED {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {exc}", file=sys.stderr)
            failed += 1
            continue
        if not args.no_save:
            nbformat.write(nb, str(path))
        name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        print(f"ok {name} ({time.monotonic() - t0:.1f} s{'' if args.no_save else ', saved'})", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
