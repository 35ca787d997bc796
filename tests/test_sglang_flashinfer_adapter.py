"""``python -m refimpl check --sglang flashinfer`` / ``flashinfer_mla``: SGLang 0.5.23's own FlashInfer backends under the
checker (``refimpl/adapters/sglang.py``). Apart from ``tests/test_sglang_adapter.py``: on a GPU these build FlashInfer
modules, so the GPU gate runs them after its FlashInfer warm-up, in a file of their own (one file with every adapter test
ran close to the gate's per-file limit when each ``--sglang`` check was a child process importing SGLang; now each
file's checks share one, ``tests/sglang_checks.py``)."""

import json
import os
import subprocess
import sys

import torch
from test_sglang_adapter import ROOT, check, check_process, passes  # noqa: F401 (check_process: this file's too)


def test_check_runs_sglang_s_own_flashinfer_backend():
    """0.5.23's FlashInferAttnBackend: decode, idle, target verify and draft extend v2 pass every verdict, chains and
    trees, its per-bs wrappers (created, bound and registered at capture, re-planned on replay: flashinfer's
    fast_decode_plan, a full plan packing verify's tree mask, SGLang's fast_prefill_plan for draft extend) run in the
    graph, verify's and draft extend's indices from SGLang's own spec inputs. Its multi-step draft wrapper: right
    outputs, (d) names its padded requests' indptr (from positions), as Triton's. A replay whose re-plan is skipped
    fails: verify and draft extend name the stale bound buffers; decode (on the stand-ins) gives wrong outputs."""
    code, rows = check("flashinfer")
    assert code == 1  # its multi-step draft wrapper: below
    for mode in ("decode", "idle", "target_verify", "draft_extend_v2"):
        assert passes(rows[mode]), (mode, rows[mode])
    ms = rows["draft_decode"]
    assert ms["capture_equals_replay"] and ms["graph_equals_eager"] and ms["matches_oracle"] and ms["history_ok"], ms
    assert ms["replay_matches_reference"] is False and all("padded requests only" in f for f in ms["findings"]), ms
    named = {f.split(":")[1].strip() for f in ms["findings"]}
    assert named == {f"step{i}.paged_kv_{x}" for i in (0, 1) for x in ("indptr", "indices")}, ms["findings"]
    code, trees = check("", "--sglang", "flashinfer", "--topk", "2", "--mode", "target_verify", "--mode", "draft_extend_v2")
    assert code == 0 and all(passes(r) for r in trees.values()), trees
    planted = ("--backend-class", "sglang_planted:FlashInferReplaySkipsThePlan")
    code, rows = check("", *planted, "--mode", "decode", "--mode", "target_verify", "--mode", "draft_extend_v2")
    assert code == 1
    stand_ins = rows["decode"]["engine"] == "cpu-emulator"  # real FlashInfer packs the mask into bits: not compared
    for mode in ("target_verify", "draft_extend_v2"):  # every bound buffer keeps the capture batch's: named
        bad = rows[mode]
        assert bad["capture_equals_replay"] is False and bad["replay_matches_reference"] is False, bad
        stale = {f.removeprefix("reference: ").split(":")[0] for f in bad["findings"]}
        assert {"paged_kv_indptr"} | ({"custom_mask"} if mode == "target_verify" and stand_ins else set()) <= stale, stale
    if stand_ins:  # real FlashInfer: whether a stale partition changes the output depends on its split decision
        bad = rows["decode"]  # the indices are this batch's, the partition the capture batch's
        assert bad["graph_equals_eager"] is False and bad["history_ok"] is False, bad
        assert bad["capture_equals_replay"] and bad["matches_oracle"], bad


def test_check_names_sglang_s_own_flashinfer_mla_stale_bound_buffers_and_draft_windows():
    """0.5.23's FlashInferMLAAttnBackend: idle and target verify pass; its decode replay re-plans from host arrays and
    refreshes the eager kv_indptr, leaving the wrapper's bound kv_indptr and kv_len_arr at the capture batch's values
    (open PR #37975): (a) and (d) name them, each finding with its upstream note; the output is right (the MLA kernel
    reads its plan's work list). Its FlashInferMLAMultiStepDraftBackend plans each step's graph from the committed
    seq_lens over indices laid out with the step's i+1 drafts: (a), (b), (d) and (f) fail, each finding noted; the
    windows its plan gives (tests/sglang_probes.py, the stand-in's MLAPlan) show why: request r reads r*(i+1) keys
    before its range (here all request r-1's, whose range is longer), its own leading prefix, and none of its drafts."""
    code, rows = check("flashinfer_mla")
    assert code == 1
    for mode in ("idle", "target_verify"):  # verify: chains (its plan is causal, no tree mask)
        assert passes(rows[mode]), (mode, rows[mode])
    bad = rows["decode"]
    assert bad["graph_equals_eager"] and bad["matches_oracle"] and bad["history_ok"], bad
    assert bad["capture_equals_replay"] is False and bad["replay_matches_reference"] is False, bad
    assert all("sgl-project/sglang#37975" in f for f in bad["findings"]), bad["findings"]
    assert {"kv_indptr", "kv_len_arr"} <= {f.removeprefix("reference: ").split(":")[0] for f in bad["findings"]}
    bad = rows["draft_decode"]
    assert bad["matches_oracle"] and all("[upstream: " in f for f in bad["findings"]), bad
    assert False in (bad["capture_equals_replay"], bad["replay_matches_reference"]) and bad["graph_equals_eager"] is False
    assert any(f.startswith("graph vs eager") and "in the requests before it" in f for f in bad["findings"])
    code, trees = check("", "--sglang", "flashinfer_mla", "--mode", "draft_decode", "--topk", "2")  # 0.5.23 raises on them
    assert "takes chains only (topk=1), got topk=2" in trees["draft_decode"]["findings"][0], trees  # skipped, by name
    if torch.cuda.is_available():
        return  # the windows are the CPU stand-in's (CPU CI lists them); the GPU gate's time goes to the check above
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "tests"), os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run(
        [sys.executable, "tests/sglang_probes.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    probe = json.loads(res.stdout.splitlines()[-1])
    for i, step in enumerate(probe["windows"]):
        for r, keys in enumerate(step):
            others, seq = [k for k in keys if k[0] != r], probe["seq"][r]
            assert len(keys) == seq and all(t < seq for q, t in keys if q == r), (i, r, keys)  # none of its drafts
            assert len(others) == r * (i + 1) and {q for q, _ in others} <= {r - 1}, (i, r, others)


def test_sglang_s_opt_in_flashinfer_host_plans_are_refused_by_name():
    """SGLang's opt-in host plans change the paths the adapter models (verify's packs the mask into bits, the multi-step
    one takes its indptr from seq_lens_cpu): set, every FlashInfer row names the switch instead of a wrong verdict."""
    env = {"SGLANG_OPT_FLASHINFER_DRAFT_HOST_INDPTR": "1"}
    code, rows = check("", "--sglang", "flashinfer", "--mode", "draft_decode", env=env)
    assert code == 1 and "SGLANG_OPT_FLASHINFER_DRAFT_HOST_INDPTR is set" in rows["draft_decode"]["findings"][0], rows
