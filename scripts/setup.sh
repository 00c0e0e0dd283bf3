#!/usr/bin/env bash
# Set up (or refresh) everything the minillm course and its tests need. Safe to run again:
# a run with nothing to do takes about a second and prints one line per part.
#
#   bash scripts/setup.sh                 # .venv with minillm[course,test] + graphviz's `dot`
#   bash scripts/setup.sh --with-browser  # ... + Debian's chromium and fonts-noto-cjk, for tests/browser
#
# Options:  --with-browser   also make sure /usr/bin/chromium and a CJK font exist (browser tests)
#           --no-apt         never call apt-get (only say what is missing)
#           --force          reinstall the Python packages even if the stamp is current
#           -v, --verbose    show pip's and apt-get's output
# Environment: PYTHON (default python3), MINILLM_VENV (default <repo>/.venv), MINILLM_CHROMIUM
#              (default /usr/bin/chromium, where Debian's package puts it),
#              MINILLM_ALLOW_ANY_TORCH=1 lets pip choose torch itself (it may pick a CUDA build).
#
# torch is pinned in pyproject.toml (torch==2.13.0). It is installed first and on its own, from
# a local wheel (pip's find-links) or the CPU-only index, never as a side effect of resolving the
# project: on Linux, PyPI's default torch is a multi-GB CUDA build.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

WITH_BROWSER=0 NO_APT=0 FORCE=0 VERBOSE=0
for arg in "$@"; do
    case "$arg" in
        --with-browser) WITH_BROWSER=1 ;;
        --no-apt) NO_APT=1 ;;
        --force) FORCE=1 ;;
        -v|--verbose) VERBOSE=1 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "setup: unknown option: $arg (try --help)" >&2; exit 2 ;;
    esac
done

PY="${PYTHON:-python3}"
VENV="${MINILLM_VENV:-$ROOT/.venv}"
STAMP="$VENV/.minillm-stamp"
# the torch pin, read from pyproject.toml ("torch==X.Y.Z")
TORCH_VERSION="$(sed -n 's/^[[:space:]]*"torch==\([0-9][0-9.]*\)".*/\1/p' pyproject.toml | head -n 1)"
TORCH_CPU_INDEX="https://download.pytorch.org/whl/cpu"
LOG="$(mktemp "${TMPDIR:-/tmp}/minillm-setup.XXXXXX.log")"
trap 'rm -f "$LOG"' EXIT

say()  { echo "setup: $*"; }
warn() { echo "setup: WARNING: $*" >&2; }
die()  {
    echo "setup: ERROR: $*" >&2
    if [ -s "$LOG" ]; then echo "---- last lines of the log ----" >&2; tail -n 40 "$LOG" >&2; fi
    exit 1
}
# run CMD...: quiet unless --verbose; output kept in $LOG for error reports
run() {
    if [ "$VERBOSE" = 1 ]; then "$@" 2>&1 | tee -a "$LOG"; return "${PIPESTATUS[0]}"; fi
    "$@" >>"$LOG" 2>&1
}

is_root() { [ "$(id -u)" = 0 ]; }
have_apt() { command -v apt-get >/dev/null 2>&1; }
APT_UPDATED=0
apt_install() {  # apt_install PKG...: as root on Debian/Ubuntu; `apt-get update` once per run
    [ "$NO_APT" = 0 ] && is_root && have_apt || return 1
    if [ "$APT_UPDATED" = 0 ]; then
        run apt-get update -qq || warn "apt-get update failed; trying the package lists already here"
        APT_UPDATED=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    run apt-get install -y -qq --no-install-recommends "$@"
}
manual_hint() {  # manual_hint PKG...
    if is_root; then echo "apt-get install $*"; else echo "sudo apt-get install $*"; fi
}

# ---------------------------------------------------------------- system packages
if command -v dot >/dev/null 2>&1; then
    say "graphviz: ok ($(command -v dot))"
elif apt_install graphviz; then
    say "graphviz: installed ($(command -v dot))"
else
    warn "graphviz's \`dot\` is missing: diagrams fall back to DOT text. For pictures: $(manual_hint graphviz)"
fi

# bubblewrap: the jail `minillm grade` runs a submission's code in (own user, mount, PID and network
# namespaces). Without it the grader falls back to util-linux `unshare`, then refuses unless --unjailed.
if command -v bwrap >/dev/null 2>&1; then
    say "bubblewrap: ok ($(command -v bwrap))"
elif apt_install bubblewrap; then
    say "bubblewrap: installed ($(command -v bwrap))"
else
    warn "bubblewrap's \`bwrap\` is missing: \`minillm grade\` jails code with \`unshare\` where user namespaces allow it, else refuses unless --unjailed. To install: $(manual_hint bubblewrap)"
fi

CHROMIUM="${MINILLM_CHROMIUM:-/usr/bin/chromium}"
if [ "$WITH_BROWSER" = 1 ]; then
    if [ -x "$CHROMIUM" ]; then
        say "chromium: ok ($CHROMIUM)"
    elif apt_install chromium; then
        [ -x "$CHROMIUM" ] || die "apt-get installed chromium but $CHROMIUM is missing"
        say "chromium: installed ($CHROMIUM)"
    elif is_root && [ "$NO_APT" = 0 ]; then
        die "could not install chromium with apt-get (needed for tests/browser)"
    else
        warn "$CHROMIUM is missing: the browser tests will be skipped. To run them: $(manual_hint chromium)"
    fi
fi

# Chinese text in the browser tests' screenshots (the course quotes the chapter in Chinese).
if [ "$WITH_BROWSER" = 1 ]; then
    if { command -v fc-list >/dev/null 2>&1 && fc-list 2>/dev/null | grep -qi "Noto Sans CJK"; } \
            || { command -v dpkg >/dev/null 2>&1 && dpkg -s fonts-noto-cjk >/dev/null 2>&1; }; then
        say "fonts-noto-cjk: ok"
    elif apt_install fonts-noto-cjk; then
        say "fonts-noto-cjk: installed"
    else
        warn "no CJK font (fonts-noto-cjk): Chinese shows as boxes in the browser tests' screenshots. $(manual_hint fonts-noto-cjk)"
    fi
fi

# ---------------------------------------------------------------- virtual environment
command -v "$PY" >/dev/null 2>&1 || die "$PY not found: install Python 3.10 or newer ($(manual_hint python3 python3-venv))"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
    || die "$("$PY" -V 2>&1) is too old: minillm needs Python 3.10 or newer"

VPY="$VENV/bin/python"
if [ ! -x "$VPY" ] || ! "$VPY" -c 'import sys' >/dev/null 2>&1; then
    [ -e "$VENV" ] && { say "venv: $VENV is broken, recreating it"; rm -rf "$VENV"; }
    if ! run "$PY" -m venv "$VENV"; then
        rm -rf "$VENV"
        # Debian's own python3 needs python3-venv for ensurepip
        apt_install python3-venv || die "\`$PY -m venv\` failed; install venv support: $(manual_hint python3-venv)"
        run "$PY" -m venv "$VENV" || die "\`$PY -m venv $VENV\` failed"
    fi
    say "venv: created $VENV ($("$VPY" -V 2>&1))"
fi

want_stamp="$( { cat pyproject.toml; "$VPY" -c 'import sys; print(sys.version)'; echo "setup-v1"; } \
    | sha256sum | cut -d' ' -f1)"
stamp_current() {
    [ "$FORCE" = 0 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want_stamp" ] || return 1
    # the editable install must point at this checkout, and the main pieces must be there
    "$VPY" - "$ROOT" <<'EOF' >/dev/null 2>&1
import importlib.util, os, sys
root = os.path.realpath(sys.argv[1])
spec = importlib.util.find_spec("minillm")
assert spec and spec.origin and os.path.realpath(spec.origin).startswith(root + os.sep)
for name in ("torch", "transformers", "jupyterlab", "ipywidgets", "pytest", "nbval", "playwright"):
    assert importlib.util.find_spec(name), name
EOF
}

if stamp_current; then
    say "python packages: up to date ($VENV)"
else
    pip=("$VPY" -m pip --disable-pip-version-check --no-input)
    [ "$VERBOSE" = 1 ] || pip+=(-q)
    installed_torch="$("$VPY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)"
    [ -n "$TORCH_VERSION" ] || warn "pyproject.toml does not pin torch (\"torch==X.Y.Z\"): pip chooses the build"
    if [ -n "$TORCH_VERSION" ] && [ "${installed_torch%%+*}" != "$TORCH_VERSION" ]; then
        if [ "${MINILLM_ALLOW_ANY_TORCH:-0}" = 1 ]; then
            run "${pip[@]}" install "torch==$TORCH_VERSION" || die "pip could not install torch==$TORCH_VERSION"
        elif run "${pip[@]}" install --no-index --no-deps "torch==$TORCH_VERSION"; then
            :  # a wheel on this disk (pip's find-links): no download at all
        elif [ "$(uname -s)" != Linux ]; then
            run "${pip[@]}" install --no-deps "torch==$TORCH_VERSION" || die "pip could not install torch==$TORCH_VERSION"
        else
            run "${pip[@]}" install --no-deps --index-url "$TORCH_CPU_INDEX" "torch==$TORCH_VERSION" \
                || die "no CPU build of torch==$TORCH_VERSION could be found (no local wheel, and $TORCH_CPU_INDEX" \
                       "did not answer). Install one yourself into $VENV, or set MINILLM_ALLOW_ANY_TORCH=1 to let pip" \
                       "pick one (on Linux that is a multi-GB CUDA build)."
        fi
        say "torch: installed $("$VPY" -c 'import importlib.metadata as m; print(m.version("torch"))')"
    fi
    run "${pip[@]}" install -e ".[course,test]" || die "pip install -e \".[course,test]\" failed"
    "$VPY" -c 'import minillm, jupyterlab, ipywidgets, nbval, playwright' >>"$LOG" 2>&1 \
        || die "the installed environment does not import (minillm, jupyterlab, ipywidgets, nbval, playwright)"
    echo "$want_stamp" >"$STAMP"
    say "python packages: installed minillm[course,test] into $VENV"
fi

if [ "$(uname -s)" = Linux ] && [ "${MINILLM_ALLOW_ANY_TORCH:-0}" != 1 ]; then
    cuda="$("$VPY" -c 'import importlib.metadata as m; print(any(d.metadata["Name"].startswith("nvidia-") for d in m.distributions()))' 2>/dev/null || echo False)"
    [ "$cuda" = False ] || warn "CUDA libraries (nvidia-* packages) are in $VENV: was a CUDA build of torch installed by hand?"
fi
MINILLM_PYTHON="$VPY" bash "$ROOT/scripts/fetch_test_models.sh" || warn "scripts/fetch_test_models.sh failed: the GGUF tests will be skipped"
say "done. Start the course: bash scripts/lab.sh   |   run all tests: bash scripts/test.sh"
