#!/usr/bin/env bash
# Run the whole test suite: unit, parity, property, grading, widget and browser tests (tests/),
# plus every notebook under nbval (notebooks/, exercises/), in one pytest run.
#   bash scripts/test.sh                 # everything
#   bash scripts/test.sh -x -k stepper   # extra options go to pytest
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
for d in notebooks exercises; do [ -d "$d" ] && paths+=("$d"); done

set +e
# One pytest run, so the output ends with one summary line. --nbval collects the notebooks
# (.ipynb) under notebooks/ and exercises/; tests/solved/ holds a notebook that
# tests/test_grading_notebook.py runs itself, so nbval leaves it alone.
"$VPY" -m pytest "${paths[@]}" \
    --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg --ignore=tests/solved \
    -ra --durations=10 "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
    echo "test.sh: pytest collected no tests: treating that as a failure" >&2
    exit 1
fi
exit "$rc"
