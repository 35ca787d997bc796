#!/usr/bin/env bash
# On the H200 (device tool), part 1 of the replay-cost run: the long fuzz profile over every
# backend x unified variant x mode (>= 2,000 batches), then the issue-9 table before / after
# (benchmarks/replay_table.py on this checkout and on the pre-change tree carried as .old/).
# Results under ${OUT:-gpu_out}/.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu_env.sh  # wheels, PYTHONPATH, MAX_JOBS=16, $out
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
# 1. fuzz: 36 batches per target, seed 7 (progress, mismatches with reproducers, summary)
timeout 270 python3 -m refimpl check --fuzz 36 --seed 7 2>&1 | grep -v "it/s" | tee "$out/fuzz_h200.log" | tail -4
# 2. the table: after (this tree), then before (.old = the tree at the robustness commit)
taskset -c 2 python3 benchmarks/replay_table.py --pin 2 --out "$out/table_after.json" 2>&1 | tail -7 | tee "$out/table_after.md"
if [ -d .old/refimpl ]; then
  PYTHONPATH=$PWD/.old:${SITE:-} taskset -c 3 python3 benchmarks/replay_table.py --pin 3 \
    --out "$out/table_before.json" 2>&1 | tail -7 | tee "$out/table_before.md"
fi
