"""``python -m refimpl check --sglang flashinfer`` / ``flashinfer_mla``: SGLang 0.5.23's own FlashInfer backends under the
checker (``refimpl/adapters/sglang.py``). Apart from ``tests/test_sglang_adapter.py``: on a GPU these build FlashInfer
modules, so the GPU gate runs them after its FlashInfer warm-up, in a file of their own (each ``--sglang`` check is a
child process importing SGLang: one file with every adapter test ran close to the gate's per-file limit)."""

from test_sglang_adapter import check, passes


def test_check_runs_sglang_s_own_flashinfer_backend():
    """0.5.23's FlashInferAttnBackend: decode and idle pass every verdict, its per-bs wrappers (created, bound and
    registered at capture, re-planned by flashinfer's fast_decode_plan on replay) run in the graph; on the stand-ins, a
    replay whose re-plan is skipped (its wrappers keep the capture batch's partition) fails (b) and (f) on the long
    request."""
    code, rows = check("flashinfer")
    assert code == 0
    for mode in ("decode", "idle"):
        assert passes(rows[mode]), (mode, rows[mode])
    for mode in ("target_verify", "draft_extend_v2"):
        assert "does not support" in rows[mode]["findings"][0], rows[mode]
    if rows["decode"]["engine"] != "cpu-emulator":
        return  # real FlashInfer: whether a stale partition changes the output depends on its split decision
    code, rows = check("", "--backend-class", "sglang_planted:FlashInferReplaySkipsThePlan", "--mode", "decode")
    bad = rows["decode"]
    assert code == 1 and bad["graph_equals_eager"] is False and bad["history_ok"] is False, bad
    assert bad["capture_equals_replay"] and bad["matches_oracle"], bad


def test_check_names_sglang_s_own_flashinfer_mla_stale_bound_buffers():
    """0.5.23's FlashInferMLAAttnBackend: its decode replay re-plans from host arrays and refreshes the eager kv_indptr,
    leaving the wrapper's bound kv_indptr and kv_len_arr at the capture batch's values (open PR #37975): (a) and (d)
    name them, each finding with its upstream note; the output is right (the MLA kernel reads its plan's work list)."""
    code, rows = check("flashinfer_mla")
    assert code == 1
    assert passes(rows["idle"]), rows["idle"]
    bad = rows["decode"]
    assert bad["graph_equals_eager"] and bad["matches_oracle"] and bad["history_ok"], bad
    assert bad["capture_equals_replay"] is False and bad["replay_matches_reference"] is False, bad
    assert all("sgl-project/sglang#37975" in f for f in bad["findings"]), bad["findings"]
    assert {"kv_indptr", "kv_len_arr"} <= {f.removeprefix("reference: ").split(":")[0] for f in bad["findings"]}
