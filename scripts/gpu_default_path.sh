#!/usr/bin/env bash
# On the H200 (device tool): issue 32's default-path table, every glue-safe FlashInfer shape beside Triton's, twice,
# and the split hooks beside their plan, twice, in one call after FlashInfer's JIT build; pinned to one core.
# Everything goes into ONE archive, ${OUT:-gpu_out}/default_path.tgz (the device tool returns at most eight files:
# session 47 lost a run's files to that limit), with device.txt (GPU, driver, library versions), load.txt (uptime
# before each run) and tree.txt (the carried working tree's hash, as scripts/gpu_ci.sh computes it).
#   carry [".whl", ".fi/0.7.2"]; about 4-5 minutes on a fresh machine.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu_env.sh
res=$(mktemp -d)
idx=$(mktemp)
rm -f "$idx"
echo "tree $(GIT_INDEX_FILE="$idx" git add -A . 2>/dev/null && GIT_INDEX_FILE="$idx" git write-tree 2>/dev/null || echo unknown)" \
  > "$res/tree.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$res/device.txt" 2>&1
python3 -c "import torch, triton, flashinfer; print('torch', torch.__version__, 'triton', triton.__version__, 'flashinfer', flashinfer.__version__)" \
  >> "$res/device.txt" 2>&1
# the JIT modules first (every FlashInfer row below would otherwise build them inside its timeout)
( time python3 benchmarks/split_hook.py --sizes 1 --repeats 5 --warmup 2 ) > "$res/jit_warmup.txt" 2>&1
rows=flashinfer/unified+glue/decode,flashinfer/unified+glue/target_verify
rows=$rows,flashinfer_mla/unified+glue/decode,flashinfer_mla/unified+glue/target_verify
rows=$rows,triton/in_graph/decode,triton/unified+glue/decode,triton/in_graph/target_verify
# run 1 and run 2 interleaved row by row, each row in its own process: a host that slows inside the call (sessions
# 49-50: the Triton rows doubled between two whole-table runs) moves both runs of a row alike, or shows as one row's
# disagreement instead of every later row's
for row in ${rows//,/ }; do
  for i in 1 2; do
    echo "$(uptime) $row run $i" >> "$res/load.txt"
    timeout "${ROW_S:-60}" taskset -c 3 python3 benchmarks/replay_table.py --rows "$row" --pin 3 --repeats 300 \
      --warmup 30 --out "$res/table${i}_${row//\//_}.json" >> "$res/table$i.txt" 2>&1
    echo "rc=$?" >> "$res/load.txt"
  done
  tar -C "$res" -czf "$out/default_path.tgz" .  # after every row: a call cut short still returns the rows it measured
done
python3 benchmarks/replay_table.py --agree "$(ls "$res"/table1_*.json | paste -sd,)" \
  "$(ls "$res"/table2_*.json | paste -sd,)" > "$res/agree.txt" 2>&1
for i in 1 2; do
  uptime >> "$res/load.txt"
  timeout "${SPLIT_S:-90}" taskset -c 3 python3 benchmarks/split_hook.py --pin 3 --out "$res/split$i.json" \
    > "$res/split$i.txt" 2>&1
  echo "split$i rc=$?" >> "$res/load.txt"
done
tar -C "$res" -czf "$out/default_path.tgz" .
tail -3 "$res/load.txt"
cat "$res/agree.txt"
