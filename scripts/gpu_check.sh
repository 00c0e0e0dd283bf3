#!/usr/bin/env bash
# The GPU check: what a lent CUDA machine (an H200, 15 minutes in all, 10 a command) should
# run first, in under 250 s of parts so a second try fits the same lease.
#
#   bash scripts/gpu_check.sh            # CUDA: parts below, JSON under $OUT (default /tmp/gpu_check)
#   bash scripts/gpu_check.sh --dry-run  # the same plan on the CPU, float32, tiny sizes (the suite runs it)
#
# The machine it is written for: a copy of the working tree (no .venv: it is git-ignored, and
# a torch venv is far over what can travel), its own python3 with a CUDA torch, transformers,
# safetensors, tokenizers, jinja2, numpy, pytest, hypothesis; no package index. So nothing is
# installed: the script looks for a python with torch (and, unless --dry-run, CUDA) as $PY,
# then python3, then .venv/bin/python, and runs minillm from the tree (PYTHONPATH). Without
# one it writes a report saying so and exits 2 (never the CPU wheel of setup.sh).
#
# Parts (scripts/gpu_check.py PART), each its own process with its own time limit, so a hang
# or a crash costs one part; each writes $OUT/PART.json as it goes, then gpu_check.json sums up:
#   env           15 s  versions, GPU, packages present/missing, flex available, "auto"'s choice
#   parity        45 s  tests/test_parity.py on CUDA (bf16 vs the fp32 CPU reference), gather + paged
#   flex          60 s  the paged GPU backend: tokens vs gather (eager, CUDA graphs), compile time
#                       (inductor's disk cache then serves the later parts),
#                       KV bytes per step (benchmarks/paged_kv_bytes.py), its parity tests
#   sync_sampler  30 s  host syncs per decode step (gather, flex; greedy, sampled+logprobs),
#                       the sampler's host time at 64 x 151,936 (benchmarks/sampler_host.py), tests
#   graphs        50 s  CUDA graphs: warmup() (graphs, seconds), tokens vs eager, none captured serving
#   bench         50 s  tokens/s against transformers' generate() on the shipped model, batch 1 and 32
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PARTS=(env parity flex sync_sampler graphs bench)
LIMITS=(15 45 60 30 50 50)  # 250 s: a rerun fits a 15-minute lease with the machine start

TORCH=""
usable() {  # $1: a python with torch (and CUDA unless --dry-run); its torch's versions go to $TORCH
  [ -n "$1" ] && { command -v "$1" >/dev/null 2>&1 || [ -x "$1" ]; } || return 1
  # one import of torch (1.5 CPU-s) both checks and names it
  TORCH=$("$1" -c "import sys, torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)
sys.exit(0 if $DRY or torch.cuda.is_available() else 1)" 2>/dev/null)
}
PYBIN=""
for cand in "${PY:-}" python3 .venv/bin/python; do
  if usable "$cand"; then PYBIN=$cand; break; fi
done
if [ -z "$PYBIN" ]; then
  msg="no python with a CUDA torch found (tried \$PY, python3, .venv/bin/python); nothing installed"
  echo "$msg"
  printf '{"status": "no python", "error": "%s"}\n' "$msg" > "$OUT/gpu_check.json"
  exit 2
fi
echo "== python: $PYBIN ($TORCH)"
[ "$DRY" = 1 ] && echo "== dry run: CPU, float32, scale ${MINILLM_GPU_CHECK_SCALE:-0.1}"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv \
  > "$OUT/nvidia-smi.txt" 2>&1

flag=(); [ "$DRY" = 1 ] && flag=(--dry-run)
for i in "${!PARTS[@]}"; do
  part=${PARTS[$i]} limit=${LIMITS[$i]}
  [ "$DRY" = 1 ] && limit=$((limit * ${MINILLM_DRY_RUN_SLACK:-3}))  # a loaded CPU is slower than the GPU
  start=$(date +%s)
  timeout -k 5 "$limit" "$PYBIN" scripts/gpu_check.py "$part" --out "$OUT/$part.json" "${flag[@]}" \
    > "$OUT/$part.log" 2>&1
  rc=$?
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then  # cut off: keep what it wrote, say so
    "$PYBIN" - "$OUT/$part.json" "$limit" <<'EOF'
import json, sys
from pathlib import Path
p = Path(sys.argv[1])
d = json.loads(p.read_text()) if p.is_file() else {"part": p.stem}
d.update(status="timeout", error=f"cut off after {sys.argv[2]} s")
p.write_text(json.dumps(d, indent=1))
EOF
  fi
  echo "== $part: rc $rc, $(( $(date +%s) - start )) s (limit $limit s)"
done
echo "== results in $OUT/gpu_check.json"
"$PYBIN" scripts/gpu_check.py summary --out "$OUT" --parts "$(IFS=,; echo "${PARTS[*]}")"
