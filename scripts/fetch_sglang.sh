#!/usr/bin/env bash
# SGLang 0.5.23 for `python -m refimpl check --sglang triton` (refimpl/adapters/sglang.py) and the probes in
# benchmarks/sglang_probe/: unpack its wheel (no dependencies) and the two small real packages its import needs into $1
# (default .sgl/0.5.23, where the adapter looks; REFIMPL_SGLANG names another): site/ (the wheel), deps/ (msgspec, dill,
# for this machine's Python) and wheels/ (the wheels; for the H200's Python 3.12 too: benchmarks/sglang_probe/pack_h200.sh
# packs what the GPU gate carries). Needs network (PyPI): a 39 MB download, 131 MB unpacked; about 20 s. Does nothing
# when $1 already holds it.
set -euo pipefail
dest=${1:-.sgl/0.5.23}
[ -d "$dest/site/sglang" ] && [ -d "$dest/deps/msgspec" ] && exit 0
mkdir -p "$dest/site" "$dest/deps" "$dest/wheels"
python -m pip download -q --no-deps -d "$dest/wheels" "sglang==0.5.23"
python -m pip install -q --no-deps --target "$dest/deps" msgspec dill
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 -d "$dest/wheels" msgspec dill
(cd "$dest/site" && python -m zipfile -e ../wheels/sglang-0.5.23-*.whl .)
echo "$dest"
