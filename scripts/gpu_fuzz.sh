#!/usr/bin/env bash
# On the H200 (device tool): the long fuzz profile (refimpl/fuzz.py) over every backend and shape, MLA family
# included, as seven processes side by side (one per backend group: a fuzz process is host-bound, the GPU idles), each
# stopped after ${FUZZ_S:-300} s, ${FUZZ_N:-31} batches per target. Part 4 (bd5cf46, six groups, 25 per target) ran all
# 65 targets in 254 s at most after the gate had built FlashInfer's JIT modules; part 5 (nine groups, first on a cold
# machine) finished 53. Run it after the gate: 65 x 31 = 2,015 batches. Every batch: graph == eager == the float64
# oracle, no foreign KV slot written, the bounds guard quiet, bit-equal after the static buffers' tails are poisoned; a
# mismatch prints its reproducer.
#   FUZZ_S=300 FUZZ_SEED=13 bash scripts/gpu_fuzz.sh     # after scripts/gpu_ci.sh, on the same lease
# Writes $out/fuzz.log: each group's command, its per-target batch counts and mismatches, then the total.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu_env.sh  # wheels, PYTHONPATH, MAX_JOBS=16, $out
seed=${FUZZ_SEED:-11}
tmp=$(mktemp -d)
n=${FUZZ_N:-31}
groups=("--backend cutlass_mla --backend flashinfer_mla" "--backend trtllm_mla" "--backend triton --variant unified"
        "--backend triton --variant fused --variant in_graph" "--backend wave" "--backend flashinfer"
        "--backend torch_native --backend torch_native_mla")
for i in "${!groups[@]}"; do
  args=" ${groups[$i]}"
  ( echo "\$ python -m refimpl check --fuzz $n --seed $seed$args   (stopped after ${FUZZ_S:-300} s)"
    timeout "${FUZZ_S:-300}" python3 -m refimpl check --fuzz "$n" --seed "$seed" $args 2>&1 | grep -v "it/s"
    echo "[rc=${PIPESTATUS[0]}]" ) > "$tmp/group$i.log" 2>&1 &
done
wait
cat "$tmp"/*.log > "$out/fuzz.log"
batches=$(grep -o "^fuzz .*: [0-9]* batches" "$out/fuzz.log" | awk '{s += $(NF-1)} END {print s + 0}')
mism=$(grep -c "^MISMATCH" "$out/fuzz.log")
echo "gpu-fuzz: $batches batches (seed $seed, every group stopped after ${FUZZ_S:-300} s at the latest), $mism mismatches" | tee -a "$out/fuzz.log"
