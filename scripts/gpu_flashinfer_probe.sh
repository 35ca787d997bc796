#!/usr/bin/env bash
# On the device machine: the FlashInfer-specific GPU checks for the carried flashinfer version
# (FLASHINFER_VERSION, or the one .fi/ holds): signature parity, the real wrappers against the
# stand-ins and flashinfer's own plans, the checker's FlashInfer rows, then the plan-cost benchmark.
# Results under ${OUT:-gpu_out}/.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu_env.sh  # wheels, PYTHONPATH, MAX_JOBS=16, $out
python3 -c "import flashinfer, torch; print('flashinfer', flashinfer.__version__, torch.cuda.get_device_name())" | tee "$out/versions.txt"
python3 -m pytest -q -p no:cacheprovider tests/test_flashinfer_wrappers.py tests/test_gpu_flashinfer.py 2>&1 | tee "$out/pytest_flashinfer.log" | tail -5
python3 -m refimpl check --backend flashinfer --backend flashinfer_mla --json > "$out/check_flashinfer.json" 2> "$out/check_flashinfer.log"; tail -3 "$out/check_flashinfer.log"
[ "${PLAN_COST:-1}" = 0 ] || python3 benchmarks/plan_cost.py --out "$out/plan_cost" 2>&1 | tail -3
