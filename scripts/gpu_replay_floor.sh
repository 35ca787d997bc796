#!/usr/bin/env bash
# On the H200 (device tool): issue 16's measurements, pinned to one core: input copies three ways
# (benchmarks/input_copies.py), the replay-path table with faithful / fused / in-graph / glued hooks
# (benchmarks/replay_table.py), graph.replay() against its floor (benchmarks/replay_floor.py), the
# bench's hook column against a plain loop (benchmarks/bench_vs_direct.py), then the glue GPU tests.
# Results under ${OUT:-gpu_out}/, one .json and one .txt per script.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu_env.sh
pin=${PIN:-3}
run() {
  local name=$1
  shift
  echo "== $name"
  timeout "${STEP_S:-240}" taskset -c "$pin" python3 "$@" --pin "$pin" --out "$out/$name.json" 2>&1 \
    | grep -v "it/s" > "$out/$name.txt"
  tail -n "${TAIL:-30}" "$out/$name.txt"
}
run input_copies benchmarks/input_copies.py
run replay_table benchmarks/replay_table.py
run replay_floor benchmarks/replay_floor.py --repeats 1000
run bench_vs_direct benchmarks/bench_vs_direct.py --ctx 4096 --sweep-setup
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k glue 2>&1 | tail -5
