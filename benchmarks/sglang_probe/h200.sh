#!/usr/bin/env bash
# Issue 32 part 3 on the H200 (device tool, no network): SGLang 0.5.23's Triton hook and glue graph beside refimpl's,
# two passes (separate processes) per mode, pinned to one core, context 4096, bs 1 / 8 / 64. Carry [".whl",
# ".fi/0.7.2", ".sgl/full"] (.sgl/full: site.tgz, SGLang 0.5.23's wheel without its .so files and multimodal_gen,
# 12 MiB; wheels/: msgspec and dill for Python 3.12; README); results under $OUT (default gpu_out/).
#   bash benchmarks/sglang_probe/h200.sh [ROOT]    # ROOT: the refimpl tree to time (default: this one)
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/gpu_env.sh  # wheels, PYTHONPATH, $out
root=${1:-$PWD}
export PYTHONPATH=$root:/tmp/site
sgl=$PWD/.sgl/full
mkdir -p "$sgl/site" && tar -xzf "$sgl/site.tgz" -C "$sgl/site"
export SGLANG_PROBE_FALLBACK=1  # the CPU probe's stand-ins miss GPU-only imports: stand in for them too, listed
python3 -m pip install -q --no-index --no-deps --upgrade --target "$sgl/deps" "$sgl"/wheels/*.whl
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  echo "refimpl tree $(cat "$root/TREE" 2>/dev/null || echo "$root")"
} > "$out/versions.txt"
for pass in 1 2; do
  for mode in decode target_verify; do
    python3 "$root/benchmarks/sglang_probe/hook_timing.py" "$sgl" $mode --pin 3 > "$out/pass${pass}_$mode.md" 2>&1 \
      || echo "pass $pass $mode: rc $?" >> "$out/versions.txt"
  done
done
tail -n 12 "$out"/pass*.md
