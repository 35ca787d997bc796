#!/usr/bin/env bash
# Run on a CUDA machine (the device tool's H200): versions, the GPU-marked tests, the whole suite
# on the GPU, the checker with the CUDA engine, and the notebooks as plain scripts (gpu cells
# included). Everything lands in ${OUT:-gpu_out}/.
#   usage: OUT=/some/dir bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu_out}; mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then  # flashinfer wheels: scripts/fetch_flashinfer_wheels.sh
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export FLASHINFER_WORKSPACE_BASE=/tmp/fiws MAX_JOBS=16
python3 - <<'PY' | tee "$out/versions.json"
import json, subprocess, torch, triton
smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip()
try:
    import flashinfer; fi = flashinfer.__version__
except Exception:
    fi = None
print(json.dumps({"gpu": torch.cuda.get_device_name(), "nvidia_smi": smi, "torch": torch.__version__,
                  "cuda": torch.version.cuda, "triton": triton.__version__, "flashinfer": fi}))
PY
# the whole suite on the GPU; -rA lists every test, so the gpu-marked ones can be read off too
python3 -m pytest -q -rA -p no:cacheprovider tests 2>&1 | tee "$out/pytest_all_on_gpu.log" | tail -3
python3 -m refimpl check --json > "$out/check_cuda.json" 2> "$out/check_cuda.err"; echo "check rc=$?"
python3 - "$out/check_cuda.json" <<'PY'
import collections, json, sys
rows = json.load(open(sys.argv[1]))
c = collections.Counter((r["backend"], r["variant"], r["mode"],
                         all(v is not False for v in (r["capture_equals_replay"],
                             r["graph_equals_eager"], r["matches_oracle"]))) for r in rows)
for (b, v, m, ok), n in sorted(c.items()):
    print(f"{b:<18} {v:<12} {m:<16} {'pass' if ok else 'FAIL'} x{n}")
PY
for nb in notebooks/*.py; do
  [ -f "$nb" ] || continue
  (cd notebooks && timeout 300 python3 "$(basename "$nb")") > "$out/$(basename "$nb" .py).log" 2>&1
  echo "$nb rc=$?"
done
