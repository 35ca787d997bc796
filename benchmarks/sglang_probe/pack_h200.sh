#!/usr/bin/env bash
# What h200.sh carries, from scripts/fetch_sglang.sh's tree $1 (default /tmp/sgl): .sgl/full/site.tgz (SGLang 0.5.23's wheel without
# its compiled extensions, which the attention backends do not import, and without sglang/multimodal_gen, test,
# benchmark, srt/models and srt/entrypoints: 10 MiB; with .whl and .fi/0.7.2 under the device tool's 64 MiB carry) and
# .sgl/full/wheels/ (msgspec and dill for the H200's Python 3.12). The whole tree, not trim.py's: trim.py keeps what
# the CPU probe imported, and on CUDA SGLang imports more (0.5.23's fp8_kernel.py imports per_tensor_quant_fp8 only there).
set -euo pipefail
src=${1:-/tmp/sgl}
mkdir -p .sgl/full/wheels
cp "$src"/wheels/msgspec-*cp312*.whl "$src"/wheels/dill-*.whl .sgl/full/wheels/
tar -czf .sgl/full/site.tgz --exclude='*.so' --exclude='__pycache__' --exclude='sglang/multimodal_gen' \
  --exclude='sglang/test' --exclude='sglang/benchmark' --exclude='sglang/srt/models' --exclude='sglang/srt/entrypoints' -C "$src/site" .
du -sh .sgl/full
