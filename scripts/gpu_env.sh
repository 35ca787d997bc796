# Sourced by the scripts/gpu_*.sh run on the H200 (device tool; no network there): installs the wheels
# carried in .whl/ and one flashinfer from .fi/<version>/ (scripts/fetch_flashinfer_wheels.sh makes both)
# under /tmp/site and sets the environment every GPU run uses. FLASHINFER_VERSION picks the version when
# .fi/ holds several (default: the newest there). Defines $out (results folder).
out=${OUT:-gpu_out}; mkdir -p "$out"
fi_dir=""
if [ -n "${FLASHINFER_VERSION:-}" ]; then
  fi_dir=.fi/$FLASHINFER_VERSION
  [ -d "$fi_dir" ] || { echo "gpu_env: FLASHINFER_VERSION=$FLASHINFER_VERSION but no $fi_dir/ (carry it)" >&2; exit 2; }
elif ls -d .fi/*/ >/dev/null 2>&1; then
  fi_dir=$(ls -d .fi/*/ | sort -V | tail -1)
fi
if ls .whl/*.whl >/dev/null 2>&1 || [ -n "$fi_dir" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site $(ls .whl/*.whl 2>/dev/null) $(ls "${fi_dir:-/nonexistent}"/*.whl 2>/dev/null)
fi
# MAX_JOBS=16: a cold FlashInfer JIT build takes up to ~70 s per module
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg FLASHINFER_WORKSPACE_BASE=/tmp/fiws MAX_JOBS=16
export PYTHONPATH=$PWD:/tmp/site
