#!/usr/bin/env bash
# On the H200 (device tool), after the last change: the whole test suite on the GPU and the
# checker with the CUDA engine, side by side (the fuzz test's CI profile at one batch per
# target to fit the call). Results under ${OUT:-gpu_out}/.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu_env.sh
export REFIMPL_FUZZ_EXAMPLES=${REFIMPL_FUZZ_EXAMPLES:-1}
python3 -c "import torch, triton, flashinfer; print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flashinfer.__version__)" | tee "$out/versions.txt"
nvidia-smi --query-gpu=driver_version --format=csv,noheader | sed 's/^/driver /' | tee -a "$out/versions.txt"
( timeout ${CHECK_S:-300} python3 -m refimpl check --json > "$out/check_cuda.json" 2> "$out/check_cuda.err"
  echo "check rc=$?" >> "$out/check_cuda.err" ) &
# the suite in three shards side by side (one GPU, 16 cores: kernel compiles dominate), the
# FlashInfer files in one shard so that each JIT module is built once
fi_files=$(ls tests/test_*.py | grep -i flashinfer | tr '\n' ' ')
mapfile -t rest < <(ls tests/test_*.py | grep -vi flashinfer)
shard1=""; shard2=""
for i in "${!rest[@]}"; do
  if (( i % 2 )); then shard1+="${rest[$i]} "; else shard2+="${rest[$i]} "; fi
done
for k in 0 1 2; do
  files=$fi_files; [ $k = 1 ] && files=$shard1; [ $k = 2 ] && files=$shard2
  ( timeout ${SUITE_S:-320} python3 -m pytest -q -p no:cacheprovider -rfE --continue-on-collection-errors $files \
      > "$out/pytest_gpu_shard$k.log" 2>&1; echo "shard $k rc=$?" >> "$out/pytest_gpu_shard$k.log" ) &
done
wait
for k in 0 1 2; do tail -3 "$out/pytest_gpu_shard$k.log"; done
tail -1 "$out/check_cuda.err"
python3 - "$out/check_cuda.json" <<'PY'
import collections, json, sys
try:
    rows = json.load(open(sys.argv[1]))
except Exception as e:
    sys.exit(f"no checker JSON: {e}")
must = [r for r in rows if r["variant"] not in ("legacy", "as-upstream")]
ran = [r for r in must if not any(f.startswith("skipped") for f in r["findings"])]
bad = [r for r in ran if not all(v is not False for v in (r["capture_equals_replay"],
       r["graph_equals_eager"], r["matches_oracle"], r["replay_matches_reference"]))]
print(f"checker: {len(rows)} rows, {len(ran)} must-pass rows ran, {len(bad)} failed")
for r in bad:
    print("FAIL", r["backend"], r["variant"], r["mode"], r["bs"], r["findings"][:2])
PY
