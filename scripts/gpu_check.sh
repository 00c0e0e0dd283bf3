#!/usr/bin/env bash
# The GPU check of issue 16, prepared for the day a CUDA machine is lent: one script, < 10 min.
#
#   bash scripts/gpu_check.sh            # writes $OUT (default /tmp/gpu_check) and prints a summary
#
# 1. the CUDA tests: the parity tests in bfloat16 against the float32 CPU reference
#    (MINILLM_TEST_DEVICE=cuda), the host<->device synchronisation count of a decode step
#    (torch.cuda.set_sync_debug_mode), the sampler;
# 2. the GPU benchmark: HBM read bandwidth and GEMM FLOP/s, then batch-1 decode tokens/s of
#    the shipped model and of the SmolLM-135M-shaped one, as a fraction of the floor
#    (weight + KV bytes per token / measured bandwidth), minillm next to generate();
# 3. a short `minillm bench --quick` on CUDA (mixed workload vs generate()), eager and then with
#    CUDA graphs for decode-only steps (`--decode-graphs`, minillm.decode_graphs).
# Each part has its own time limit, so one hang cannot eat the others' time.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
status=0

echo "== device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$OUT/nvidia-smi.txt"
$PY -c "import torch; assert torch.cuda.is_available(), 'CUDA not available'; print(torch.__version__, torch.cuda.get_device_name(), 'bf16:', torch.cuda.is_bf16_supported())" \
  || { echo "no CUDA: nothing to check"; exit 2; }

echo "== 1. CUDA tests"
MINILLM_TEST_DEVICE=cuda OMP_NUM_THREADS=4 timeout 220 $PY -m pytest -q -x -p no:cacheprovider \
  tests/test_parity.py tests/test_host_sync.py tests/test_sampler.py \
  tests/test_decode_graphs.py::test_cuda_graphs_match_eager_on_cuda 2>&1 | tee "$OUT/tests.txt" | tail -15
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== 2. decode against the memory floor"
timeout 160 $PY benchmarks/limits.py --device cuda --model default --model 135m --generate \
  --prompt 128 --new-tokens 64 --out "$OUT/limits_cuda.json" 2>&1 | grep -v "Loading weights" | tee "$OUT/limits.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== 3. minillm bench --quick on CUDA, eager, then with CUDA graphs"
timeout 100 $PY -m minillm.bench --quick --device cuda --allow-mismatch --no-plots --no-readme \
  --out "$OUT/bench" 2>&1 | tail -25 | tee "$OUT/bench.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
timeout 100 $PY -m minillm.bench --quick --device cuda --decode-graphs --allow-mismatch --no-plots --no-readme \
  --out "$OUT/bench_graphs" 2>&1 | tail -25 | tee "$OUT/bench_graphs.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== results in $OUT (status $status)"
exit $status
