#!/usr/bin/env bash
# one-off probe (not committed): hook_parts on the H200; the timing test old vs new, alone and under load
set -uo pipefail
. scripts/gpu_env.sh
sgl=$PWD/.sgl/full
mkdir -p "$sgl/site" && tar -xzf "$sgl/site.tgz" -C "$sgl/site"
python3 -m pip install -q --no-index --no-deps --upgrade --target "$sgl/deps" "$sgl"/wheels/*.whl
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  git rev-parse HEAD 2>/dev/null; } > "$out/versions.txt"
for pass in 1 2; do
  SGLANG_PROBE_FALLBACK=1 timeout 150 python3 benchmarks/sglang_probe/hook_parts.py "$sgl" --pin 3 > "$out/hook_parts_pass$pass.md" 2>&1 || echo "rc $?" >> "$out/hook_parts_pass$pass.md"
done
T='tests/test_gpu.py::test_bench_hook_agrees_with_a_plain_loop'
cp tests/test_gpu.py /tmp/new.py; cp old_test_gpu.py tests/test_gpu_old.py
for i in 1 2 3; do timeout 90 python3 -m pytest -q -p no:cacheprovider -s "$T" 2>&1 | grep -E "bench / plain|passed|failed" >> "$out/timing_alone_new.txt"; done
for i in 1 2; do
  ( timeout 80 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -m "not timing" -x > /dev/null 2>&1 & timeout 80 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_flashinfer.py > /dev/null 2>&1 & wait ) &
  sleep 8
  timeout 90 python3 -m pytest -q -p no:cacheprovider -s "$T" 2>&1 | grep -E "bench / plain|passed|failed" >> "$out/timing_load_new.txt"
  timeout 90 python3 -m pytest -q -p no:cacheprovider -s "tests/test_gpu_old.py::test_bench_hook_agrees_with_a_plain_loop" 2>&1 | grep -E "bench / plain|passed|failed" >> "$out/timing_load_old.txt"
  wait
done
rm -f tests/test_gpu_old.py
tail -n 40 "$out"/*.md "$out"/timing_*.txt
