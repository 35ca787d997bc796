#!/usr/bin/env bash
# Short GPU re-check after routing wrapper.run through refimpl::fi_run: the FlashInfer backends
# under the emulator-on-CUDA and the CUDA engine with the real library, and notebook 02's gpu cell.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu_out}; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MPLBACKEND=Agg FLASHINFER_WORKSPACE_BASE=/tmp/fiws MAX_JOBS=16
python3 -m pytest -q -rA -p no:cacheprovider tests/test_flashinfer_backends.py \
  "tests/test_gpu_flashinfer.py::test_checker_with_real_flashinfer_on_cuda" 2>&1 | tee "$out/pytest_flashinfer_recheck.log" | tail -4
(cd notebooks && timeout 200 python3 02_two_patterns.py) > "$out/02_two_patterns.log" 2>&1; echo "nb02 rc=$?"
