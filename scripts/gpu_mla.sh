#!/usr/bin/env bash
# On the H200 (device tool): the MLA family on the GPU — its kernel and backend tests, the checker
# with the CUDA engine (bf16), and the SGLang #29077 before/after benchmark twice (two pinned
# runs: a difference is believed only where they agree). Results under ${OUT:-gpu_out}/.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu_out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MPLBACKEND=Agg
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -m pytest -q -p no:cacheprovider tests/test_mla_paged.py tests/test_mla_backends.py 2>&1 | tail -4
  python3 -m refimpl check --backend cutlass_mla --backend trtllm_mla --json > "$out/check_mla_cuda.json"
  echo "check rc=$?"
  for run in 1 2; do
    taskset -c $((run + 1)) python3 benchmarks/trtllm_mla_draft_extend.py --pin $((run + 1)) \
      --out "$out/run$run" --fig "$out/run$run.png" 2>&1 | grep -v "it/s"
  done
} 2>&1 | tee "$out/log.txt"
