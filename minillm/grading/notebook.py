"""``minillm grade NOTEBOOK [--json PATH]``: run a notebook from the top, then grade it.

The notebook is executed with nbclient in a fresh kernel (cells that raise are recorded and
execution goes on; a cell that runs too long is interrupted). One more cell is appended that
grades every registered exercise from that kernel's namespace and prints a JSON report on a
marked line; the report is read back, printed as a table and optionally written to a file.

Exit status: 0 when grading ran, whatever the score; 2 when the notebook cannot be read or
the report cannot be written; 3 when the kernel could not run the grading cell.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from pathlib import Path

MARKER = "MINILLM-GRADING-REPORT:"
GRADING_CELL = (
    "import json as _minillm_json\n"
    "from minillm.grading.notebook import notebook_report as _minillm_report\n"
    f"print({MARKER!r} + _minillm_json.dumps(_minillm_report(), ensure_ascii=False))\n"
)
GRADING_CELL_TIMEOUT = 600


def notebook_report(namespace: dict | None = None) -> dict:
    """Grade every exercise from the notebook's namespace (runs inside the kernel)."""
    from .registry import _user_namespace, check_all

    ns = namespace if namespace is not None else _user_namespace()
    return check_all(ns).as_dict()


def _repo_root() -> str:
    return str(Path(__file__).resolve().parents[2])


def read_notebook(path: str | os.PathLike):
    """The notebook at ``path``; ``ValueError`` with a readable reason when it cannot be read."""
    import nbformat

    path = Path(path)
    try:
        return nbformat.read(path, as_version=4)
    except FileNotFoundError:
        raise ValueError(f"no such file: {path}")
    except Exception as exc:  # not JSON, not a notebook, unreadable
        raise ValueError(f"{path} is not a readable notebook ({type(exc).__name__}: {exc})".strip())


def execute_and_grade(path: str | os.PathLike, cell_timeout: int = 120, kernel_name: str = "python3",
                      nb=None) -> dict:
    """Execute the notebook at ``path`` (or ``nb``, already read from it) and return the grading
    report (a dict). Raises ``ValueError`` (unreadable notebook) or ``RuntimeError`` (grading
    did not run)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    path = Path(path)
    nb = copy.deepcopy(read_notebook(path) if nb is None else nb)
    grading = nbformat.v4.new_code_cell(GRADING_CELL)
    nb.cells.append(grading)

    def timeout_for(cell) -> int:
        return GRADING_CELL_TIMEOUT if cell.source == GRADING_CELL else cell_timeout

    client = NotebookClient(nb, timeout=cell_timeout, timeout_func=timeout_for, kernel_name=kernel_name,
                            allow_errors=True, interrupt_on_timeout=True, record_timing=False,
                            resources={"metadata": {"path": str(path.resolve().parent)}})
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_repo_root(), env.get("PYTHONPATH", "")) if p)
    env.setdefault("TQDM_DISABLE", "1")
    try:
        client.execute(env=env)
    except DeadKernelError as exc:
        raise RuntimeError(f"the notebook's kernel died before grading finished ({exc})")
    except Exception as exc:
        raise RuntimeError(f"the notebook could not be executed ({type(exc).__name__}: {exc})")

    cell_errors = []
    for i, cell in enumerate(nb.cells[:-1], start=1):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                cell_errors.append(f"cell {i}: {out.get('ename')}: {str(out.get('evalue', ''))[:200]}")
    text = "".join(o.get("text", "") for o in nb.cells[-1].get("outputs", []) if o.get("output_type") == "stream")
    line = next((ln for ln in text.splitlines() if ln.startswith(MARKER)), None)
    if line is None:
        errs = [f"{o.get('ename')}: {o.get('evalue')}" for o in nb.cells[-1].get("outputs", [])
                if o.get("output_type") == "error"]
        raise RuntimeError("the grading cell produced no report" + (f" ({errs[0]})" if errs else ""))
    report = json.loads(line[len(MARKER):])
    report["notebook"] = str(path)
    report["cell_errors"] = cell_errors
    return report


def format_table(report: dict) -> str:
    rows = [("exercise", "score", "status", "review", "first problem")]
    for ex_id, r in report["exercises"].items():
        first = next((f for f in r["feedback"] if f[:1] in ("✗", "!")), "")
        rows.append((ex_id, f"{r['score']}/{r['max']}" + (f" +{r['bonus']}" if r.get("bonus") else ""),
                     r["status"], "yes" if r["needs_human_review"] else "", first[:80]))
    rows.append(("total", f"{report['total_score']}/{report['total_max']}", "", "", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for i, row in enumerate(rows):
        lines.append(("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[4]).rstrip())
        if i in (0, len(rows) - 2):
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 8)
    return "\n".join(lines)


def cli_grade(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="minillm grade",
        description="Run an exercises notebook from the top in a fresh kernel, then grade every exercise.")
    parser.add_argument("notebook", help="path to the .ipynb file (e.g. exercises/ch04_exercises.ipynb)")
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON to PATH")
    parser.add_argument("--timeout", type=int, default=120, metavar="SECONDS",
                        help="time limit per cell (default 120); a cell over it is interrupted")
    parser.add_argument("--kernel", default="python3", help="Jupyter kernel name (default python3)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or bad arguments: argparse has printed why
        return int(exc.code or 0)

    try:
        nb = read_notebook(args.notebook)
    except ValueError as exc:
        print(f"minillm grade: cannot read the notebook: {exc}", file=sys.stderr)
        return 2
    print(f"Running {args.notebook} (a fresh kernel, {args.timeout} s per cell)…", file=sys.stderr)
    try:
        report = execute_and_grade(args.notebook, args.timeout, args.kernel, nb=nb)
    except RuntimeError as exc:
        print(f"minillm grade: {exc}", file=sys.stderr)
        return 3
    print(format_table(report))
    if report["cell_errors"]:
        print("\nCells that raised an error while running (execution went on):")
        for e in report["cell_errors"]:
            print("  " + e)
    flagged = [k for k, r in report["exercises"].items() if r["needs_human_review"]]
    if flagged:
        print(f"\nFlagged for a human to read (the text graders are heuristics): {', '.join(flagged)}")
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        except OSError as exc:
            print(f"minillm grade: cannot write the report to {args.json}: {exc}", file=sys.stderr)
            return 2
        print(f"\nReport written to {args.json}")
    return 0


def main() -> None:  # python -m minillm.grading.notebook NOTEBOOK
    sys.exit(cli_grade(sys.argv[1:]))


if __name__ == "__main__":
    main()
