#!/usr/bin/env bash
# Lint with ruff, then run the whole test suite: unit, parity, property, grading, widget and browser tests (tests/),
# plus every notebook under nbval (notebooks/, exercises/), in one pytest run.
#   bash scripts/test.sh                 # everything
#   bash scripts/test.sh -x -k stepper   # extra options go to pytest
#   bash scripts/test.sh -m "not slow"  # a developer's loop: no browser, notebook, compile or GGUF tests
#   MINILLM_TEST_WORKERS=0 bash scripts/test.sh   # one process (default: 2 pytest-xdist workers)
# Screenshots from the browser tests go to $MINILLM_ARTIFACTS (default /tmp/minillm-artifacts).
# Exits non-zero if anything fails, and also if pytest collected no test at all (exit code 5).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh --with-browser

VPY="${MINILLM_VENV:-$ROOT/.venv}/bin/python"
export MINILLM_ARTIFACTS="${MINILLM_ARTIFACTS:-${TMPDIR:-/tmp}/minillm-artifacts}"
export PYTHONDONTWRITEBYTECODE=1
mkdir -p "$MINILLM_ARTIFACTS"

paths=(tests)
[ -d exercises ] && paths+=(exercises)

# Lint first (pyproject.toml's [tool.ruff]: pyflakes, pycodestyle errors, bugbear, complexity <= 30);
# its findings are printed and fail the run, but the tests still run so one report shows both.
set +e
"$(dirname "$VPY")/ruff" check --quiet .
lint_rc=$?
[ "$lint_rc" != 0 ] && echo "test.sh: ruff check found problems (listed above)" >&2
# One pytest run, so the output ends with one summary line. --nbval collects the exercises
# notebook (exercises/); the course notebooks under notebooks/ are compared with their saved
# outputs by tests/test_notebooks_rerun*.py in the kernel that then runs each cell twice more
# (nbval's rules, tests/notebook_outputs.py): no separate nbval run of them. tests/solved/ holds a
# notebook that tests/test_grading_notebook.py runs itself, so nbval leaves it alone.
# Two workers by default (MINILLM_TEST_WORKERS=0 runs in this process): most tests use one torch
# thread and nbval waits on a kernel, so one process leaves a core idle. --dist loadfile keeps
# each file on one worker: a notebook's cells run in order in one kernel, module fixtures are
# built once. (--dist loadgroup would be finer; with pytest 9.2 and pytest-xdist 3.8 it did not
# keep xdist_group-marked tests together.) tests/conftest.py hands the files out heaviest first
# (tests/suite_order.py), so the two workers finish together; `-p tests.suite_cpu` records each
# test's CPU and idle seconds (`python tests/suite_cpu.py` prints them by file).
workers="${MINILLM_TEST_WORKERS:-2}"
xdist=()
[ "$workers" != 0 ] && xdist=(-n "$workers" --dist loadfile)
"$VPY" -m pytest "${paths[@]}" "${xdist[@]}" \
    --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg --ignore=tests/solved \
    -ra --durations=10 "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
    echo "test.sh: pytest collected no tests: treating that as a failure" >&2
    exit 1
fi
[ "$rc" = 0 ] && [ "$lint_rc" != 0 ] && exit 1
exit "$rc"
