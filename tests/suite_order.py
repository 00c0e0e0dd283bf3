"""The order in which pytest-xdist hands out the test files: heaviest first.

scripts/test.sh runs two workers with ``--dist loadfile`` (a file stays on one worker). xdist
then queues the files by their number of tests, most first, which puts the few-test, many-minute
files (the notebook re-runs, the browser, the GPU-check dry run) at the END: one worker is left
running a 3-minute notebook file while the other has nothing to do. Handing out the longest
files first (longest-processing-time scheduling) lets the many small files fill in at the end,
so the two workers finish together.

The costs are CPU seconds per file from a record of ``-p tests.suite_cpu`` (tests/suite_cpu.py),
kept in tests/suite_costs.json: ``python tests/suite_cpu.py DIR --save-costs`` rewrites it from a
whole-suite record. Only their order matters. A file that is not listed counts 0.1 s per test.
``tests/browser/`` is one unit: its three files share one JupyterLab and one Chromium per
worker, so splitting them would start both twice.
"""

from __future__ import annotations

import json
from pathlib import Path

from xdist.scheduler import LoadFileScheduling

REPO = Path(__file__).resolve().parent.parent
COSTS_FILE = REPO / "tests" / "suite_costs.json"
#: CPU seconds per file (or tests/browser), heaviest first
COST: dict[str, float] = json.loads(COSTS_FILE.read_text())["cpu_s"] if COSTS_FILE.is_file() else {}
PER_TEST = 0.1


def scope_of(nodeid: str) -> str:
    """The unit a worker takes whole: the file, or tests/browser for any browser test."""
    path = nodeid.split("::", 1)[0]
    return "tests/browser" if path.startswith("tests/browser/") else path


def cost(scope: str, num_tests: int) -> float:
    return COST.get(scope, PER_TEST * num_tests)


class HeaviestFileFirst(LoadFileScheduling):
    """``--dist loadfile``, with the work queue sorted by :func:`cost`, largest first."""

    _sorted = False

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)

    def _assign_work_unit(self, node) -> None:
        if not self._sorted:  # the queue is complete before the first unit goes out
            units = sorted(self.workqueue.items(), key=lambda kv: -cost(kv[0], len(kv[1])))
            self.workqueue.clear()
            self.workqueue.update(units)
            self._sorted = True
        super()._assign_work_unit(node)
