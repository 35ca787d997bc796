#!/usr/bin/env bash
# On the H200 (device tool): the rest of the fuzz profile (FlashInfer and the MLA family), the
# issue-9 table after the change, then the default `python -m refimpl bench` sweep pinned to one
# core (results written after every runner; figures are drawn from results.json afterwards).
# Results under ${OUT:-gpu_out}/.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu_env.sh
timeout ${FUZZ_S:-190} python3 -m refimpl check --fuzz ${FUZZ_N:-33} --seed 7 \
  --backend flashinfer --backend flashinfer_mla --backend cutlass_mla --backend trtllm_mla \
  2>&1 | grep -v "it/s" > "$out/fuzz_h200_part2.log"; tail -3 "$out/fuzz_h200_part2.log"
taskset -c 2 python3 benchmarks/replay_table.py --pin 2 --out "$out/table_after.json" 2>&1 \
  | tail -7 | tee "$out/table_after.md"
start=$(date +%s)
timeout ${BENCH_S:-290} taskset -c 4 python3 -m refimpl bench --pin 4 --out "$out/bench" "$@" \
  2>&1 | grep -v "it/s\|bench:" > "$out/bench.log"; tail -3 "$out/bench.log"
echo "bench wall seconds: $(( $(date +%s) - start ))"
