#!/usr/bin/env bash
# Unpack SGLang 0.5.23 (no dependencies) and the two small real packages its import needs into $1 (default .sgl/0.5.23):
# site/ (the wheel) and deps/ (msgspec, dill). Needs network (PyPI); 39 MB download, 131 MB unpacked.
set -euo pipefail
dest=${1:-.sgl/0.5.23}
mkdir -p "$dest/site" "$dest/deps" "$dest/wheels"
python -m pip download -q --no-deps -d "$dest/wheels" "sglang==0.5.23"
python -m pip install -q --no-deps --target "$dest/deps" msgspec dill
(cd "$dest/site" && python -m zipfile -e ../wheels/sglang-0.5.23-*.whl .)
echo "$dest"
