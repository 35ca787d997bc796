#!/usr/bin/env bash
# The GPU gate: on a CUDA machine (the device tool's H200), after the last change, in one call of
# 9 minutes or less (GATE_S, 570 s: each phase's timeout is cut to what is left of it):
#   - FlashInfer's JIT modules built first, once (the checker's FlashInfer rows), while the test
#     files that never touch flashinfer run;
#   - the whole test suite (gpu-marked tests included), one pytest process per test file, six
#     files side by side (a process that dies takes only its file with it);
#   - every notebook under nbval with its `gpu` cells executed, as JupyterLab's Run All would;
#   - the checker on the CUDA engine (`python -m refimpl check --json`), and on SGLang's own backends when SGLang is
#     carried (`--sglang` for all five: sglang.json, a row per mode, upstream findings counted apart);
# and ends with one line:
#   gpu-ci: N passed, N failed, N skipped; notebooks N/N cells ok; checker N rows, N must-pass failed
#
#   REFIMPL_COMMIT=<short sha> bash scripts/gpu_ci.sh          # record: benchmarks/results/gpu_ci/<sha>/
#
# The record (at most 8 files, what the device tool returns): versions.txt (device, driver,
# torch / CUDA / triton / flashinfer versions, the commit and the gated tree), suite.log, notebooks.log, check.json,
# sglang.json, check.log (both checkers' stderr), gpu_ci.txt (the line, then every failing test id). With $OUT set (the device tool)
# the record goes there; copy it to benchmarks/results/gpu_ci/<sha>/ and commit it.
# FlashInfer's JIT modules are built once per call: every process shares one workspace, and
# flashinfer's own file lock makes a second process wait for a module another one is building.
set -uo pipefail
cd "$(dirname "$0")/.."
commit=${REFIMPL_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export OUT=${OUT:-benchmarks/results/gpu_ci/$commit}
# One deadline for the whole gate, GATE_S (570 s) after its start (the wheels' install included), inside the device call's
# 600 s: every phase's timeout is cut to what is left of it (`capped`), and a test file, notebook or checker that could
# not start before it fails as "not started", so the record and the line always come back (31184d2's gate took 582 s).
export GATE_END=$(($(date +%s) + ${GATE_S:-570}))
capped() {  # capped SECONDS CMD...: CMD under timeout min(SECONDS, what is left - 20 s), or "not started" if nothing is left
  local t=$((GATE_END - $(date +%s) - 20))
  [ "$t" -gt "$1" ] && t=$1
  shift
  if [ "$t" -le 1 ]; then echo "[not started: the gate deadline GATE_S] $*" >&2; return 124; fi
  timeout -k 10 "$t" "$@"
}
export -f capped  # run_files' bash -c per test file uses it too
. scripts/gpu_env.sh  # wheels from .whl/, PYTHONPATH, MAX_JOBS=16, $out
export REFIMPL_FUZZ_EXAMPLES=${REFIMPL_FUZZ_EXAMPLES:-1}
tmp=$(mktemp -d)
t0=$SECONDS

{
  echo "commit $commit"
  # the content gated, whatever HEAD says: equals `git rev-parse <commit>^{tree}` when the tree was that commit's
  cp .git/index "$tmp/index" 2>/dev/null
  echo "tree $(GIT_INDEX_FILE="$tmp/index" git add -A . 2>/dev/null && GIT_INDEX_FILE="$tmp/index" git write-tree 2>/dev/null || echo unknown)"
  echo "date $(date -u +%Y-%m-%dT%H:%MZ)"
  python3 - <<'PY'
import importlib, torch, triton
print("device", torch.cuda.get_device_name() if torch.cuda.is_available() else "none (no CUDA)")
print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)
for name in ("flashinfer", "nbval", "jupytext"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as e:  # noqa: BLE001 - recorded, not fatal
        print(name, "missing", type(e).__name__)
PY
  nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | sed 's/^/driver /'
} > "$out/versions.txt" 2>&1
cat "$out/versions.txt"

# SGLang 0.5.23 for tests/test_sglang_*adapter.py, when carried (benchmarks/sglang_probe/pack_h200.sh: .sgl/full, 10 MiB;
# the device has no network): its wheel without compiled extensions, msgspec and dill for this Python
if [ -f .sgl/full/site.tgz ] && [ ! -d .sgl/0.5.23/site/sglang ]; then
  mkdir -p .sgl/0.5.23/site && tar -xzf .sgl/full/site.tgz -C .sgl/0.5.23/site
  python3 -m pip install -q --no-index --no-deps --target .sgl/0.5.23/deps .sgl/full/wheels/*.whl
fi
# carried: the adapter test must run (a failed unpack fails it, as in CPU CI), not skip
[ -f .sgl/full/site.tgz ] && export REFIMPL_REQUIRE_SGLANG=1
{ [ -d .sgl/0.5.23/site/sglang ] && echo "sglang 0.5.23 (carried)" || echo "sglang not carried: the adapter test skips"; } \
  >> "$out/versions.txt"

run_files() {  # one pytest process per file, $1 at a time, a junit report each, each under `capped`
  local jobs=$1; shift
  [ $# -gt 0 ] || return 0
  printf '%s\n' "$@" | xargs -P "$jobs" -I{} bash -c '
    f={}; b=$(basename "$f" .py)
    capped "${SUITE_S:-330}" python3 -m pytest -q -p no:cacheprovider -rfEs "$f" \
      --junitxml="'"$tmp"'/junit_$b.xml" > "'"$tmp"'/log_$b.txt" 2>&1
    echo "[$f rc=$?]" >> "'"$tmp"'/log_$b.txt"'
}
longest_first() {  # the files by their time in the newest committed gate record, longest first (a new file first):
  # started alphabetically, the two SGLang adapter files (171 s and 126 s at 31184d2) began last and set the wall
  python3 - "$@" <<'PY'
import glob, os, re, sys

def newest(v):
    m = re.search(r"^date (\S+)", open(v).read(), re.M)
    return m.group(1) if m else ""

records = sorted((v for v in glob.glob("benchmarks/results/gpu_ci/*/versions.txt")
           if os.path.exists(os.path.join(os.path.dirname(v), "suite.log"))), key=newest)
secs, name = {}, None
for line in open(os.path.join(os.path.dirname(records[-1]), "suite.log")) if records else []:
    if line.startswith("=== log_"):
        name = line.split()[1][len("log_"):-len(".txt")]
    elif name and (m := re.search(r" in ([0-9.]+)s", line)):
        secs[name] = float(m.group(1))
files = sys.argv[1:]
print(" ".join(sorted(files, key=lambda f: -secs.get(os.path.basename(f)[:-3], 1e9))))
PY
}
files=$(ls ${GPU_CI_TESTS:-tests/test_*.py})
# files that never build a FlashInfer module (no flashinfer, no registry-wide checker or fuzzer)
early=$(grep -L -i -E "flashinfer|run_checks|fuzz|REGISTRY|capabilities|check_entry_mode|main\(\[" $files)
late=$(printf '%s\n' $files | grep -v -x -F "$(printf '%s\n' $early)")
early=$(longest_first $early || echo $early) late=$(longest_first $late || echo $late)

# 0. FlashInfer's JIT modules, built once, before anything else asks for them: the checker's
#    FlashInfer rows plan and run every wrapper kind the suite and the notebooks use (bf16, the
#    same head sizes). Without this phase several processes built different modules at once, 16
#    nvcc jobs each, and the FlashInfer tests and the checker ran past their limits (H200, f63a9c8).
#    Meanwhile the files that never touch flashinfer run.
( capped "${WARM_S:-240}" python3 -m refimpl check --backend flashinfer --backend flashinfer_mla \
    --variant unified --bs 1 > "$tmp/warm.log" 2>&1; echo "warm-up rc=$?" >> "$tmp/warm.log" ) &
warm=$!
run_files 4 $early &
early_pid=$!
wait $warm
echo "flashinfer warm-up done at ${SECONDS}s ($(tail -1 "$tmp/warm.log"))" >> "$out/versions.txt"

# 1. the checker, CUDA engine
( capped "${CHECK_S:-330}" python3 -m refimpl check --json > "$out/check.json" 2> "$tmp/check.err"
  echo "check rc=$?" >> "$tmp/check.err" ) &

#    and SGLang's own backends, every mode (a row that fails only on upstream findings is counted apart)
if [ -d .sgl/0.5.23/site/sglang ] && [ "${GPU_CI_SGLANG:-1}" = 1 ]; then  # about 30 s beside the rest (961b157)
  ( sgl=$(printf -- '--sglang %s ' triton wave trtllm_mla flashinfer flashinfer_mla)
    capped "${CHECK_S:-330}" python3 -m refimpl check $sgl --jobs 2 --json > "$out/sglang.json" 2> "$tmp/sglang.err"
    echo "check --sglang rc=$?" >> "$tmp/sglang.err" ) &
fi

# 2. the rest of the suite
wait $early_pid
run_files "${SUITE_JOBS:-6}" $late &

# 3. every notebook under nbval, gpu cells executed (conftest skips them only without CUDA)
for nb in ${GPU_CI_NOTEBOOKS:-notebooks/*.ipynb}; do
  b=$(basename "$nb" .ipynb)
  # A kernel that dies before its first reply has run no cell: started once more. Eight kernels started at
  # the same instant can race for a port (jupyter/jupyter_client#154); a108937's gate lost notebook 07 so.
  ( for try in 1 2; do
      capped "${NB_S:-330}" python3 -m pytest -q -p no:cacheprovider --nbval-lax --nbval-current-env \
        -rfE "$nb" --junitxml="$tmp/nbjunit_$b.xml" > "$tmp/nblog_$b.txt" 2>&1
      rc=$?
      [ "$try" = 1 ] && grep -q "Kernel died before replying to kernel_info" "$tmp/nblog_$b.txt" || break
      { echo "[try 1: the kernel died before replying to kernel_info, no cell ran]"; tail -3 "$tmp/nblog_$b.txt"; } \
        > "$tmp/nbfirst_$b.txt"
    done
    cat "$tmp/nbfirst_$b.txt" 2>/dev/null >> "$tmp/nblog_$b.txt"
    echo "[$nb rc=$rc]" >> "$tmp/nblog_$b.txt" ) &
done
wait

echo "wall ${SECONDS}s" >> "$out/versions.txt"

for f in "$tmp"/log_*.txt; do echo "=== $(basename "$f")"; cat "$f"; done > "$out/suite.log"
for f in "$tmp"/nblog_*.txt; do echo "=== $(basename "$f")"; cat "$f"; done > "$out/notebooks.log"
cat "$tmp/check.err" $(ls "$tmp/sglang.err" 2>/dev/null) > "$out/check.log"

python3 - "$tmp" "$out" <<'PY' | tee "$out/gpu_ci.txt"
import glob, json, os, sys
import xml.etree.ElementTree as ET

tmp, out = sys.argv[1:]


def tally(pattern, logs):
    passed, failed, skipped, bad = 0, 0, 0, []
    for log in sorted(glob.glob(os.path.join(tmp, logs))):
        name = os.path.basename(log)[len(logs.split("*")[0]) : -4]
        xml = os.path.join(tmp, pattern.replace("*", name))
        if not os.path.exists(xml):  # killed, timed out, or never started: the whole file fails
            failed += 1
            bad.append(f"{name}: no report ({open(log).read().strip().splitlines()[-1:]})")
            continue
        if open(log).read().rstrip().endswith(("rc=124]", "rc=137]")):  # its report written, then killed by the timeout
            failed += 1
            bad.append(f"{name}: timed out after its report")
        for case in ET.parse(xml).getroot().iter("testcase"):
            tags = {c.tag for c in case}
            cid = f"{case.get('classname')}::{case.get('name')}"
            if tags & {"failure", "error"}:
                failed += 1
                bad.append(cid)
            elif "skipped" in tags:
                skipped += 1
            else:
                passed += 1
    return passed, failed, skipped, bad


sp, sf, ss, sbad = tally("junit_*.xml", "log_*.txt")
np_, nf, ns, nbad = tally("nbjunit_*.xml", "nblog_*.txt")
try:
    rows = json.load(open(os.path.join(out, "check.json")))
except Exception as e:  # noqa: BLE001
    rows, cbad = [], [f"no checker JSON: {e}"]
else:
    must = [r for r in rows if r["variant"] not in ("legacy", "as-upstream")]
    ran = [r for r in must if not any(f.startswith("skipped") for f in r["findings"])]
    cbad = [f"{r['backend']}/{r['variant']} {r['mode']} bs {r['bs']}: {r['findings'][:2]}"
            for r in ran if False in (r["capture_equals_replay"], r["graph_equals_eager"],
                                      r["matches_oracle"], r["replay_matches_reference"])]
sgl = ""
if os.path.exists(os.path.join(tmp, "sglang.err")):  # SGLang carried: ok / skipped / upstream findings only / other
    try:
        srows = json.load(open(os.path.join(out, "sglang.json")))
    except Exception as e:  # noqa: BLE001
        srows, sbad = [], sbad + [f"no --sglang JSON: {e}"]
    kinds = {"ok": 0, "skipped": 0, "upstream": 0, "other": 0}
    for r in srows:
        f = r["findings"]
        kind = "skipped" if f and f[0].startswith("skipped") else "ok" if not f else \
            "upstream" if all("upstream" in x for x in f) else "other"
        kinds[kind] += 1
        if kind == "other":  # a finding with no upstream note: printed, counted in the sglang part
            sbad.append(f"--sglang {r['backend']} {r['mode']}: {f[:2]}")
    sgl = f"; sglang {len(srows)} rows: " + ", ".join(f"{v} {k}" for k, v in kinds.items())
for b in sbad + nbad + cbad:
    print("FAIL", b)
ncheck_fail = len(cbad) if rows else 1
print(f"gpu-ci: {sp} passed, {sf} failed, {ss} skipped; notebooks {np_}/{np_ + nf} cells ok"
      f"{f' ({ns} skipped)' if ns else ''}; checker {len(rows)} rows, {ncheck_fail} must-pass failed{sgl}")
PY
