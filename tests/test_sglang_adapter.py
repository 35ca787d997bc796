"""``python -m refimpl check --sglang triton`` / ``wave`` / ``trtllm_mla``: the checker on SGLang 0.5.23's own backends
(``refimpl/adapters/sglang.py``), from the wheel ``scripts/fetch_sglang.sh`` unpacks. Run in a child process
(``tests/sglang_checks.py``, one per test file, each check a command line it runs): the stand-ins SGLang's import needs
(transformers, PIL, ...) must not reach this one. Skips without the wheel, unless ``REFIMPL_REQUIRE_SGLANG=1`` (CI sets
it)."""

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading

import pytest
import torch
from helpers import gate
from sglang_checks import REPLY

from refimpl.adapters import sglang_stubs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SGL = os.environ.get("REFIMPL_SGLANG", os.path.join(ROOT, ".sgl", "0.5.23"))


def need_sglang():
    """Skip without the wheel, unless ``REFIMPL_REQUIRE_SGLANG=1`` (CI, and the GPU gate when it carries SGLang)."""
    if not os.path.isdir(os.path.join(SGL, "site", "sglang")):
        if os.environ.get("REFIMPL_REQUIRE_SGLANG") == "1":
            pytest.fail(f"no SGLang 0.5.23 at {SGL}: bash scripts/fetch_sglang.sh")
        pytest.skip(f"no SGLang 0.5.23 at {SGL} (bash scripts/fetch_sglang.sh)")


_CHILD = {}  # this test file's check process: "proc", its replies ("lines"), its stderr ("log")


@pytest.fixture(autouse=True, scope="module")
def check_process():
    """The check process ends with the test file that started it (its SGLang import holds about 1 GB)."""
    yield
    if (proc := _CHILD.pop("proc", None)) is not None:
        proc.stdin.close()
        proc.wait(timeout=60)


def run_check(*argv, env=None, timeout=600):
    """``python -m refimpl check ARGV`` in this test file's check process (started by the first; ``env``: variables set
    for this command only): (exit code, stdout, stderr)."""
    need_sglang()
    if (proc := _CHILD.get("proc")) is None:
        path = os.pathsep.join([os.path.join(ROOT, "tests"), os.environ.get("PYTHONPATH", "")])
        log, lines = tempfile.TemporaryFile("w+"), queue.Queue()
        cmd = [sys.executable, os.path.join(ROOT, "tests", "sglang_checks.py")]
        env_ = dict(os.environ, PYTHONPATH=path)
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env_, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
        threading.Thread(target=lambda: [*map(lines.put, proc.stdout), lines.put("")], daemon=True).start()
        _CHILD.update(proc=proc, lines=lines, log=log)
    proc.stdin.write(json.dumps({"argv": ["check", *argv], "env": env or {}}) + "\n")
    proc.stdin.flush()
    while True:
        try:
            line = _CHILD["lines"].get(timeout=timeout)
        except queue.Empty:
            _CHILD.pop("proc").kill()
            pytest.fail(f"check {' '.join(argv)}: no answer in {timeout} s")
        if not line:  # the process died: its last words
            _CHILD.pop("proc")
            _CHILD["log"].seek(0)
            pytest.fail(f"the check process died during check {' '.join(argv)}:\n{_CHILD['log'].read()[-3000:]}")
        if line.startswith(REPLY):
            reply = json.loads(line[len(REPLY) :])
            return reply["code"], reply["stdout"], reply["stderr"]


def check(name, *args, env=None):
    """``python -m refimpl check --sglang NAME --json`` (or ``ARGS`` instead of ``--sglang NAME``) in the check process:
    (exit code, rows by mode)."""
    code, out, err = run_check(*(args or ("--sglang", name)), "--json", env=env)
    assert out.startswith("["), err[-3000:]
    rows = {r["mode"]: r for r in json.loads(out)}
    assert {r["variant"] for r in rows.values()} == {"sglang-0.5.23"}
    return code, rows


def passes(row):
    verdicts = [row[k] for k in ("capture_equals_replay", "graph_equals_eager", "matches_oracle", "replay_matches_reference")]
    return verdicts == [True] * 4 and not row["findings"]


def test_check_runs_sglang_s_own_triton_backend():
    code, rows = check("triton")
    assert code == 1  # its multi-step draft wrapper: below
    for mode in ("decode", "idle", "target_verify", "draft_extend_v2"):  # what 0.5.23's Triton captures
        assert passes(rows[mode]), (mode, rows[mode])
    assert "does not support draft_extend" in rows["draft_extend"]["findings"][0]  # 0.5.23 has no draft extend v1
    # TritonMultiStepDraftBackend: right outputs; its capture path leaves the split counts (a), and its padded request's
    # kv_indptr comes from positions padded with 0 (d); every finding names what upstream does
    ms = rows["draft_decode"]
    assert ms["graph_equals_eager"] and ms["matches_oracle"], ms
    assert ms["capture_equals_replay"] is False and ms["replay_matches_reference"] is False, ms
    assert all("[upstream: " in f for f in ms["findings"]), ms["findings"]
    assert {f.split(":")[0] for f in ms["findings"]} == {"step0.num_kv_splits", "step1.num_kv_splits", "reference"}
    assert any(f.startswith("reference: step0.kv_indptr") and "padded requests only" in f for f in ms["findings"])
    if "cpu" in {r["engine"] for r in rows.values()}:  # SGLang's index kernel is a raw Triton launch: no emulated glue
        raw = "a Triton kernel launched outside any torch op during capture (sglang.kernels.ops.attention.kv_indices."
        for mode in ("decode", "target_verify", "draft_extend_v2"):
            assert rows[mode]["glue_equals_eager"] is None and raw in rows[mode]["glue_findings"][0], rows[mode]


# CPU CI: draft extend v2 (chains and trees, accept lengths); the gate: decode and target verify too (19 s more here)
@pytest.mark.parametrize("mode", [gate("decode"), gate("target_verify"), "draft_extend_v2"])
def test_the_fuzzer_drives_sglang_s_own_backend(mode):
    """``check --sglang triton --fuzz``: random batches (chains and topk-2 trees, padded sizes) through SGLang's own hooks
    under refimpl's runner, each replay held to eager, the oracle, the KV guard and the padded-row invariants."""
    code, out, err = run_check("--sglang", "triton", "--fuzz", "1", "--json", "--mode", mode)
    assert code == 0, err[-3000:]
    out = json.loads(out)
    assert out["mismatches"] == [] and out["skipped"] == [], out
    want = {f"triton/sglang-0.5.23/{mode}/{s}" for s in (("chain",) if mode == "decode" else ("chain", "tree"))}
    assert set(out["batches"]) == want, out  # decode: no spec input, no trees
    assert all(n == 1 for n in out["batches"].values()), out


def test_check_names_the_upstream_bug_in_sglang_s_wave_verify_mask():
    """0.5.23's Wave sizes its verify mask buffer max_bs * max_context_len; the checker's verify batch needs more (open
    PR sgl-project/sglang#29581): a failing row naming the upstream file, lines and PR, and exit 1."""
    code, rows = check("wave")
    assert code == 1
    assert passes(rows["decode"]) and passes(rows["idle"])
    (finding,) = rows["target_verify"]["findings"]
    assert "upstream bug: SGLang 0.5.23 wave_backend.py _apply_cuda_graph_metadata (line 471)" in finding
    assert "sized max_bs * max_context_len" in finding and "sgl-project/sglang#29581" in finding


def test_check_runs_sglang_s_own_trtllm_mla_backend():
    """0.5.23's TRTLLMMLABackend (page 64): decode, idle, target verify (a chain) and draft extend v2 pass every verdict
    (its extra lengths, plain decode's static seq_lens_k and verify's global_seq_lens_k, among the state compared: the
    planted bugs below). Its multi-step wrapper's steps fill seq_lens_k with the batch's lengths, without the step's
    drafts: capture and replay agree (a), eager matches the oracle (c), and (d) names seq_lens_k, with upstream's lines."""
    code, rows = check("trtllm_mla")
    assert code == 1  # the multi-step draft wrapper: below
    for mode in ("decode", "idle", "target_verify", "draft_extend_v2"):
        assert passes(rows[mode]), (mode, rows[mode])
    assert "does not support draft_extend" in rows["draft_extend"]["findings"][0]
    ms = rows["draft_decode"]
    assert ms["capture_equals_replay"] and ms["matches_oracle"], ms
    assert ms["replay_matches_reference"] is False and ms["graph_equals_eager"] is False, ms
    assert all("[upstream: " in f for f in ms["findings"]), ms["findings"]
    lens = [f for f in ms["findings"] if f.startswith("reference: step0.seq_lens_k: ")]
    assert lens and "trtllm_mla_backend.py lines 639-642" in lens[0], ms["findings"]


# CPU CI: the stale buffer (decode and verify findings); the gate: the rebound one too (about 25 s more here)
@pytest.mark.parametrize("planted", ["TRTLLMReplayKeepsDecodeLens", gate("TRTLLMReplayRebindsDecodeLens")])
def test_a_bug_planted_in_sglang_s_own_hook_is_named_by_its_buffer(planted):
    """The rows read the metadata SGLang froze at capture, every field of it: its replay leaving decode's seq_lens_k
    stale, or rebinding it, fails (a), (b) and (d) naming seq_lens_k; leaving verify's global_seq_lens_k stale (which no
    kernel reads) fails (a) and (d) naming it, with the right outputs."""
    args = "--backend-class", f"sglang_planted:{planted}", "--mode", "decode", "--mode", "target_verify"
    code, rows = check("", *args)
    assert code == 1
    bad = rows["decode"]
    assert bad["capture_equals_replay"] is False and bad["replay_matches_reference"] is False, bad
    assert bad["graph_equals_eager"] is False, bad
    assert any(f.startswith("seq_lens_k: ") for f in bad["findings"]), bad["findings"]
    verify = rows["target_verify"]
    if planted == "TRTLLMReplayRebindsDecodeLens":
        assert passes(verify), verify
        return
    assert verify["graph_equals_eager"] and verify["matches_oracle"], verify
    assert verify["capture_equals_replay"] is False and verify["replay_matches_reference"] is False, verify
    assert {f.split(":")[0] for f in verify["findings"]} == {"global_seq_lens_k", "reference"}, verify["findings"]


def test_missing_sglang_is_one_clear_line(tmp_path):
    env = dict(os.environ, REFIMPL_SGLANG=str(tmp_path))
    res = subprocess.run(
        [sys.executable, "-m", "refimpl", "check", "--sglang", "triton"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    err = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(err) == 1, res.stderr
    assert f"SGLang 0.5.23 not found at {tmp_path}: run `bash scripts/fetch_sglang.sh`" in err[0]


def test_sglang_is_not_mixed_with_backend_classes(capsys):
    """Refused before anything is imported: the stand-ins for SGLang's imports would reach the other classes."""
    from refimpl.__main__ import main as cli

    with pytest.raises(SystemExit) as e:
        cli(["check", "--sglang", "triton", "--backend-class", "broken_backends:FrozenScalar"])
    assert e.value.code == 2
    assert "--sglang: not with --backend-class: its stand-ins for SGLang's imports are process-wide" in capsys.readouterr().err
    assert "sglang" not in sys.modules


STAND_INS = """
import sys
from refimpl.adapters import sglang as adapter, sglang_stubs as st
from refimpl.batch import World
from refimpl.config import CHAIN, tiny_model_config
import torch
for cls, kind, page in ((adapter.SGLangTritonAttnBackend, "mha", 1), (adapter.SGLangWaveAttnBackend, "mha", 1),
                        (adapter.SGLangTRTLLMMLABackend, "mla", 64)):
    cls(World.create(tiny_model_config(kind, torch.float32), max_context_len=256, pool_size=8, page_size=page), CHAIN)
stood = sorted(n for n, m in sys.modules.items() if isinstance(m, st._StubModule))
print(repr((stood, st.FALLBACK)))
"""


def test_the_stand_ins_are_only_what_sglang_s_backends_import_and_never_a_real_dependency():
    """After the three adapters are built (a child process): every module stood in is under a root the adapter names
    (``ROOTS``, Wave's ``wave_lang`` / ``iree``) or, on CUDA, one the last-resort finder names (a GPU-only package
    missing there); none is a package refimpl or SGLang's backends really use; on a CPU that finder stood in for
    nothing (every SGLang module the backends reach is real)."""
    need_sglang()
    res = subprocess.run([sys.executable, "-c", STAND_INS], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    stood, fallback = eval(res.stdout.strip().splitlines()[-1])  # noqa: S307 - our own child's repr of two lists
    under = lambda n, roots: any(n == r or n.startswith(r + ".") for r in roots)  # noqa: E731
    roots = (*sglang_stubs.ROOTS, "wave_lang", "iree")
    assert stood and all(under(n, roots) or n in fallback for n in stood), stood  # on CUDA: GPU-only packages too
    assert not [n for n in stood if under(n, ("torch", "triton", "numpy", "msgspec", "dill"))], stood
    if not torch.cuda.is_available():
        assert fallback == []
