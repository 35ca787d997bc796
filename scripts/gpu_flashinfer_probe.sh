#!/usr/bin/env bash
# On the device machine: install the carried flashinfer wheels, then the FlashInfer-specific
# GPU checks (signature parity, stand-in vs real in every mode, checker rows) and the plan-cost
# benchmark. Results under ${OUT:-gpu_out}/.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu_out}; mkdir -p "$out" benchmarks/results
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MPLBACKEND=Agg FLASHINFER_WORKSPACE_BASE=/tmp/fiws MAX_JOBS=16
python3 -c "import flashinfer, torch; print('flashinfer', flashinfer.__version__, torch.cuda.get_device_name())"
python3 -m pytest -q -p no:cacheprovider -x tests/test_fi_standins.py tests/test_gpu_flashinfer.py 2>&1 | tee "$out/pytest_flashinfer.log" | tail -5
python3 benchmarks/plan_cost.py --out "$out/plan_cost" 2>&1 | tail -3
