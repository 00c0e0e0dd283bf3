"""The order in which pytest-xdist hands out the test files: heaviest first.

scripts/test.sh runs two workers with ``--dist loadfile`` (a file stays on one worker). xdist
then queues the files by their number of tests, most first, which puts the few-test, many-minute
files (the notebook re-runs, the browser, the GPU-check dry run) at the END: one worker is left
running a 3-minute notebook file while the other has nothing to do. Handing out the longest
files first (longest-processing-time scheduling) lets the many small files fill in at the end,
so the two workers finish together.

The costs below are CPU seconds per file, measured on 2026-12-03 with ``-p tests.suite_cpu``
(tests/suite_cpu.py) on a loaded 2-core machine; only their order matters. A file that is not
listed counts 0.1 s per test. ``tests/browser/`` is one unit: its three files share one
JupyterLab and one Chromium per worker, so splitting them would start both twice.
"""

from __future__ import annotations

from xdist.scheduler import LoadFileScheduling

#: CPU seconds per file (loaded machine), the files above ~5 s; tests/browser/ is one unit
COST = {
    "tests/test_notebooks_rerun_zh.py": 282,
    "tests/test_notebooks_rerun.py": 261,
    "tests/browser": 130,
    "tests/test_build_it.py": 75,
    "tests/test_gpu_check.py": 52,
    "tests/test_gguf.py": 39,
    "tests/test_decode_graphs.py": 38,
    "tests/test_serve.py": 37,
    "tests/test_grading_isolation.py": 34,
    "tests/test_default_model.py": 31,
    "tests/test_lab.py": 26,
    "tests/test_parity.py": 25,
    "tests/test_bench.py": 23,
    "tests/test_grading_notebook.py": 22,  # + the grader's kernels, which the measurement misses
    "tests/test_interrupt.py": 19,
    "tests/test_story_corpus_zh.py": 14,
    "tests/test_grading_attacks.py": 12,  # mostly waiting for its deadlines to pass
    "tests/test_viz_plots.py": 12,
    "tests/test_chat.py": 12,
    "tests/test_grading_i18n.py": 10,
    "tests/test_serve_hardening.py": 10,
    "tests/test_linear_paths.py": 9,
    "tests/test_cpu_kernel.py": 8,
    "tests/test_viz_widgets.py": 6,
    "exercises/ch04_exercises.ipynb": 6,
    "tests/test_loader.py": 5.5,
}
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
