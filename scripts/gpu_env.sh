# Sourced by the scripts/gpu_*.sh run on the H200 (device tool; no network there): installs the
# flashinfer wheels carried in .whl/ (scripts/fetch_flashinfer_wheels.sh makes them) under
# /tmp/site and sets the environment every GPU run uses. Defines $out (results folder).
out=${OUT:-gpu_out}; mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
fi
# MAX_JOBS=16: a cold FlashInfer JIT build takes up to ~70 s per module
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg FLASHINFER_WORKSPACE_BASE=/tmp/fiws MAX_JOBS=16
export PYTHONPATH=$PWD:/tmp/site
