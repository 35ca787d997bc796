#!/usr/bin/env bash
# Fetch, on a machine with network access, the wheels a GPU machine WITHOUT network needs for
# refimpl's FlashInfer backends and the gate's notebook runs, for CPython 3.12 on x86-64 Linux:
#   .whl/          flashinfer's tvm-ffi runtime, nbval, jupytext, ipykernel and what they need (~8 MB)
#   .fi/<version>/ flashinfer-python itself, one folder per version (default 0.7.2, which SGLang 0.5.23
#                  pins, and 0.6.0), trimmed by scripts/trim_flashinfer_wheel.py to the sources refimpl's
#                  JIT modules compile (0.7.2: 65 MB -> 31 MB)
#
#   bash scripts/fetch_flashinfer_wheels.sh                     # FLASHINFER_VERSIONS="0.7.2 0.6.0"
#
# Both folders are git-ignored. The device tool carries 64 MiB (the working tree included): carry
# [".whl", ".fi/0.7.2"] (or ".fi/0.6.0"), one flashinfer version per call; scripts/gpu_env.sh, which
# every scripts/gpu_*.sh sources, installs what it finds (FLASHINFER_VERSION picks one when several are there).
# flashinfer compiles its kernels with that machine's nvcc on first use: on an H200 (torch 2.11, CUDA 13)
# about 12 s for the first decode module, 17 s for the first MLA module, once per cache directory.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.whl
mkdir -p "$dest"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d "$dest" "apache-tvm-ffi==0.1.15.post2"
for v in ${FLASHINFER_VERSIONS:-0.7.2 0.6.0}; do
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "flashinfer-python==$v"
  rm -rf ".fi/$v" && python3 scripts/trim_flashinfer_wheel.py "$tmp"/flashinfer_python-*.whl ".fi/$v"
  rm -rf "$tmp"
done
# the notebook runner for scripts/gpu_ci.sh (nbval, jupytext, ipykernel and what they need),
# less the packages the H200 image already has (KINDS.md's list): one version of each
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
  -d "$dest" nbval jupytext ipykernel
# optional for a kernel that nbval drives (no debugger, no completion): debugpy, jedi and parso (10 MB)
for skip in debugpy jedi parso; do rm -f "$dest/$skip"-[0-9]*.whl; done
for have in attrs coverage iniconfig packaging pluggy psutil pygments pytest python_dateutil \
            typing_extensions pyyaml markdown_it_py mdurl tzdata; do
  rm -f "$dest/$have"-[0-9]*.whl
done
ls -l "$dest" .fi/*
