#!/usr/bin/env bash
# On the H200 (device tool): issue 32's default-path table, every glue-safe FlashInfer shape beside Triton's, in
# PROCS processes (two runs: odd and even), then the split hooks beside their plan SPLITS times, in one call after
# FlashInfer's JIT build; pinned to one core.
# Everything goes into ONE archive, ${OUT:-gpu_out}/default_path.tgz (the device tool returns at most eight files:
# session 47 lost a run's files to that limit), with device.txt (GPU, driver, library versions), load.txt (uptime
# before each process) and tree.txt (the carried working tree's hash, as scripts/gpu_ci.sh computes it).
#   carry [".whl", ".fi/0.7.2"]; 398-462 s on the H200 in four calls at 57f9278 and 4459c8a (a process of the seven
#   rows in ten interleaved rounds 43-54 s). No process starts after STOP_S (450 s), no split run after
#   SPLIT_STOP_S (520 s).
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
( time python3 benchmarks/split_hook.py --sizes 1 --repeats 5 --warmup 2 ${SPLIT_ARGS:-} ) > "$res/jit_warmup.txt" 2>&1
# the replay path's own Python on this host (kernels stubbed, meta tensors): beside this machine's CPU numbers in
# benchmarks/results/host_python/, it says how much of the validation and copies columns below is Python
timeout 90 taskset -c "${PIN:-3}" python3 benchmarks/host_python.py --pin "${PIN:-3}" --out "$res/host_python.json" \
  > "$res/host_python.txt" 2>&1
rows=(flashinfer/unified+glue/decode flashinfer/unified+glue/target_verify flashinfer_mla/unified+glue/decode
  flashinfer_mla/unified+glue/target_verify triton/in_graph/decode triton/unified+glue/decode triton/in_graph/target_verify)
# PROCS processes (default 6), one after the other, each measuring every row, its own row order rotated by one (a row
# is first after start-up in one process only): the host's speed changed by up to 1.7x from one process to the next
# on one pinned core (interleaved_31184d2/), so one process is one sample. Within a process, replay_table.py times
# its points in ROUNDS interleaved rounds (default 10: REPEATS / ROUNDS calls per phase and point each round), since
# the speed also moved within a process (h100_beee57b/). Run 1 is the odd processes, run 2 the even ones, each point
# its run's least disturbed process's; `--agree` compares them and pools all. Issue 32's two runs are two calls of
# this script (h200_57f9278/: odd / even within a call agreed less often than call / call; h200_4459c8a/: a call on a
# host 10 % slower throughout moved every point with it). Each process also times a fixed Python loop (its host
# probe) before and after its rows.
n=${#rows[@]} pin=${PIN:-3}  # TABLE_ARGS / SPLIT_ARGS: options appended (a CPU dry run: PIN=1 TABLE_ARGS="--sizes 1 --ctx 256")
for p in $(seq 1 "${PROCS:-6}"); do
  [ "$SECONDS" -lt "${STOP_S:-450}" ] || { echo "process $p and later not started: STOP_S" >> "$res/load.txt"; break; }
  order=$(for k in $(seq 0 $((n - 1))); do echo "${rows[$(((k + p - 1) % n))]}"; done | paste -sd,)
  echo "$(uptime) process $p: $order" >> "$res/load.txt"
  timeout "${PROC_S:-120}" taskset -c "$pin" python3 benchmarks/replay_table.py --rows "$order" --pin "$pin" \
    --repeats "${REPEATS:-300}" --rounds "${ROUNDS:-10}" --warmup 10 --out "$res/proc$p.json" ${TABLE_ARGS:-} > "$res/proc$p.txt" 2>&1
  echo "rc=$?" >> "$res/load.txt"
  tar -C "$res" -czf "$out/default_path.tgz" .  # after every process: a call cut short returns what it measured
done
runs() { ls "$res"/proc*.json | awk -v r="$1" '{ p = $0; sub(/.*proc/, "", p); if (p % 2 == r) print }' | paste -sd,; }
python3 benchmarks/replay_table.py --agree "$(runs 1)" "$(runs 0)" > "$res/agree.txt" 2>&1
tar -C "$res" -czf "$out/default_path.tgz" .
for i in $(seq 1 "${SPLITS:-2}"); do
  [ "$SECONDS" -lt "${SPLIT_STOP_S:-520}" ] || { echo "split $i and later not started: SPLIT_STOP_S" >> "$res/load.txt"; break; }
  uptime >> "$res/load.txt"
  timeout "${SPLIT_S:-90}" taskset -c "$pin" python3 benchmarks/split_hook.py --pin "$pin" --out "$res/split$i.json" ${SPLIT_ARGS:-} \
    > "$res/split$i.txt" 2>&1
  echo "split$i rc=$?" >> "$res/load.txt"
done
python3 benchmarks/issue32_goals.py "$res" "$(IFS=,; echo "${rows[*]}")" > "$res/goals.txt" 2>&1  # every number against issue 32's goals
tar -C "$res" -czf "$out/default_path.tgz" .
tail -3 "$res/load.txt"
cat "$res/agree.txt"
grep -E "points met" "$res/goals.txt" || tail -5 "$res/goals.txt"
