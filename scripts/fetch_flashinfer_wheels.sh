#!/usr/bin/env bash
# Fetch, on a machine with network access, the wheels a GPU machine WITHOUT network needs for
# refimpl's FlashInfer backends: flashinfer-python (its kernels JIT-compile with that machine's
# nvcc on first use) and its tvm-ffi runtime, and for the gate's notebook runs nbval, jupytext
# and ipykernel with their dependencies (about 25 MB in all), for CPython 3.12 on x86-64 Linux.
#
#   bash scripts/fetch_flashinfer_wheels.sh [DEST]          # default DEST: .whl
#
# Keep DEST out of git (echo /.whl/ >> .git/info/exclude) and, on the GPU machine, install with
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site FLASHINFER_WORKSPACE_BASE=/tmp/fiws MAX_JOBS=16
# (scripts/gpu_env.sh, which every scripts/gpu_*.sh sources, does this when it finds .whl/).
# Measured with flashinfer-python 0.6.0 on an H200 (torch 2.11, CUDA 13): the first decode
# wrapper compiles in ~12 s, the first MLA wrapper in ~17 s, once per cache directory.
set -euo pipefail
dest=${1:-.whl}
mkdir -p "$dest"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d "$dest" "flashinfer-python==${FLASHINFER_VERSION:-0.6.0}" \
  "apache-tvm-ffi==0.1.15.post2"
# the notebook runner for scripts/gpu_ci.sh (nbval, jupytext, ipykernel and what they need),
# less the packages the H200 image already has (KINDS.md's list): one version of each
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
  -d "$dest" nbval jupytext ipykernel
for have in attrs coverage iniconfig packaging pluggy psutil pygments pytest python_dateutil \
            typing_extensions pyyaml markdown_it_py mdurl tzdata; do
  rm -f "$dest/$have"-[0-9]*.whl
done
ls -l "$dest"
