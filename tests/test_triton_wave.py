"""Triton and Wave backends through the checker: unified rows pass, legacy rows show history.

CPU cost: every kernel runs in the Triton interpreter, so the batches are tiny.
"""

import pytest
from helpers import RAW_BS, gate, per_size_settings

from refimpl.backends import find
from refimpl.check import CheckSettings, check_entry_mode
from refimpl.config import CHAIN, TREE, SpecConfig
from refimpl.graphs import CPUEmulatorEngine


def settings(spec=CHAIN, raw_bs=RAW_BS):
    return per_size_settings(spec, raw_bs)


def run(name, variant, case, spec=CHAIN, raw_bs=RAW_BS):
    (entry,) = find(name, variant)
    return check_entry_mode(entry, case, CPUEmulatorEngine(), settings(spec, raw_bs))


def assert_all_pass(rows, raw_bs=RAW_BS):
    assert sorted(r.bs for r in rows) == sorted(raw_bs)  # one row per raw batch size it ran
    bad = [(r.mode, r.bs, r.findings) for r in rows if not r.passed or r.findings]
    assert not bad, bad


@pytest.mark.parametrize(
    "case,spec",
    [
        ("decode", CHAIN),
        ("idle", CHAIN),
        gate("target_verify", CHAIN, id="verify-chain"),  # CPU CI: the tree (a chain is its topk-1 case)
        ("target_verify", TREE),
        ("draft_extend", CHAIN),
        ("draft_extend_v2", TREE),  # N=6 > S+1=4: the v2 stride must be N (#27545)
        ("draft_decode", CHAIN),
        gate("draft_decode", TREE, id="dd-tree"),
    ],
    ids=["decode", "idle", "verify-chain", "verify-tree", "de-v1", "de-v2-tree", "dd-chain", "dd-tree"],
)
def test_triton_unified_passes_every_mode(case, spec):
    assert_all_pass(run("triton", "unified", case, spec), (0,) if case == "idle" else RAW_BS)


@pytest.mark.parametrize("case", ["decode", "target_verify", gate("draft_decode")])
def test_wave_unified_passes(case):
    assert_all_pass(run("wave", "unified", case))


def test_wave_draft_extend_is_refused_with_a_reason():
    rows = run("wave", "unified", "draft_extend")
    assert len(rows) == 1 and "does not support draft_extend" in rows[0].findings[0]
    rows = run("wave", "unified", "draft_decode", TREE)
    assert "topk=2" in rows[0].findings[0], rows[0].findings


@pytest.mark.parametrize("name", ["triton", "wave"])
def test_legacy_capture_skips_split_counts(name):
    rows = run(name, "legacy", "decode", raw_bs=(3,))
    (r,) = rows
    assert r.capture_equals_replay is False
    assert any(f.startswith("num_kv_splits:") for f in r.findings), r.findings
    # benign: replay computes the splits before the graph runs, so outputs still agree
    assert r.graph_equals_eager and r.matches_oracle


def test_a_lone_request_is_drawn_short_so_the_legacy_split_bug_shows():
    """A raw-bs-1 row draws a short request: one near the context (640) saturates the split heuristic at max_kv_splits,
    the value the legacy capture leaves, and hid this row's bug in the default world."""
    (entry,) = find("triton", "legacy")
    settings = CheckSettings(raw_bs=(1,), glue_replays=0, history=False)
    (r,) = check_entry_mode(entry, "decode", CPUEmulatorEngine(), settings)
    assert r.status == "expected" and any(f.startswith("num_kv_splits:") for f in r.findings), r.findings


def test_triton_legacy_draft_extend_layout_mismatch():
    (r,) = run("triton", "legacy", "draft_extend", raw_bs=(3,))
    assert r.capture_equals_replay is False
    assert any(f.startswith("qo_indptr:") for f in r.findings), r.findings
    # the graph's rows are laid out with stride S+1; the ragged qo_indptr reads the wrong rows
    assert r.graph_equals_eager is False and r.matches_oracle


# --- bad input and static-buffer tails ---------------------------------------------------------
import torch  # noqa: E402

from refimpl.backends.triton import TritonAttnBackend, TritonMultiStepDraftBackend  # noqa: E402
from refimpl.batch import World  # noqa: E402
from refimpl.batchgen import BatchGenerator  # noqa: E402
from refimpl.config import GraphConfig, ModelConfig  # noqa: E402
from refimpl.graphs.runner import GraphRunner  # noqa: E402
from refimpl.layout import GraphKind  # noqa: E402
from refimpl.model import MultiStepDraftProgram, TinyDecoder  # noqa: E402
from refimpl.modes import ForwardMode  # noqa: E402
from refimpl.spec import DraftDecodeInput, VerifyInput  # noqa: E402

L = 40


def triton_runner(mode, spec=CHAIN, multi_step=False):
    world = World.create(ModelConfig(), max_context_len=L, pool_size=24)
    world.randomize_kv(0)
    model = TinyDecoder(world.cfg)
    if multi_step:
        backend, program = TritonMultiStepDraftBackend(world, spec), MultiStepDraftProgram(model, 3)
    else:
        backend, program = TritonAttnBackend(world, spec), model
    gcfg = GraphConfig(max_bs=4, capture_bs=(1, 2, 4), max_context_len=L)
    runner = GraphRunner(
        program, backend, CPUEmulatorEngine(), GraphKind.parse("draft_decode" if multi_step else mode), gcfg, spec
    )
    runner.capture()
    return runner, BatchGenerator(world, spec, seed=11)


def test_verify_with_another_draft_count_is_refused():
    runner, _ = triton_runner(ForwardMode.TARGET_VERIFY)
    other = SpecConfig(num_steps=4, topk=1, num_draft_tokens=5)
    fb = BatchGenerator(runner.world, other, seed=2).target_verify(2)
    res = runner.run(fb)  # 10 tokens for 2 requests: not the captured layout -> eager, with why
    assert not res.used_graph and "4 per request" in res.fallback_reason
    with pytest.raises(ValueError, match="draft_token_num=5.*num_draft_tokens=4"):
        runner.backend.init_forward_metadata_replay_cuda_graph(
            2, fb.req_pool_indices, fb.seq_lens, None, None, ForwardMode.TARGET_VERIFY, fb.spec_info, None
        )


def test_tree_mask_of_the_wrong_size_is_refused():
    runner, gen = triton_runner(ForwardMode.TARGET_VERIFY)
    fb = gen.target_verify(2)
    short = VerifyInput(4, fb.spec_info.custom_mask[:-3])
    with pytest.raises(ValueError, match=r"custom_mask entries=\d+: expected sum over requests of N\*\(seq_len\+N\) = \d+"):
        runner.replay(fb.replace(spec_info=short))


def test_split_counts_above_max_are_refused():
    world = World.create(ModelConfig(), max_context_len=L, pool_size=8)
    with pytest.raises(ValueError, match="max_kv_splits=0"):
        TritonAttnBackend(world, CHAIN, max_kv_splits=0)
    b = TritonAttnBackend(world, CHAIN, max_kv_splits=4)
    with pytest.raises(ValueError, match="split count of 9, above this backend's max_kv_splits=4"):
        b.init_cuda_graph_state(2, 2, num_kv_splits_buf=torch.full((2,), 9, dtype=torch.int32))


def test_multi_step_batch_with_wrong_topk_is_refused():
    runner, gen = triton_runner(ForwardMode.DECODE, CHAIN, multi_step=True)
    fb = gen.draft_decode(2)
    bad = fb.replace(spec_info=DraftDecodeInput(topk=2, num_steps=3))
    with pytest.raises(ValueError, match="topk=2.*built for topk=1"):
        runner.backend.init_forward_metadata(bad)
    tree = BatchGenerator(runner.world, TREE, seed=1).draft_decode(2)
    assert runner.can_run(tree) == (False, "4 tokens for 2 requests; the graph lays out 1 per request (2)")
    with pytest.raises(ValueError, match="topk=2"):  # and the eager fallback refuses it too
        runner.run(tree)


@pytest.mark.parametrize("mode", [ForwardMode.DECODE, gate(ForwardMode.TARGET_VERIFY)])  # verify: the GPU gate
def test_poisoned_buffer_tails_do_not_change_outputs(mode):
    """No kernel reads past the live part of a static buffer."""
    runner, gen = triton_runner(mode)
    fb = gen.for_mode(mode, 3)
    clean = runner.replay(fb).clone()
    b, world = runner.backend, runner.world
    nan_slot = world.kv_cache.k[0].shape[0] - 1  # a slot no request owns: make it NaN
    assert nan_slot not in world.live_slots().tolist()
    for buf in world.kv_cache.buffers():
        buf[nan_slot] = float("nan")
    live = int(b.kv_indptr[4])
    b.cuda_graph_kv_indices[live:] = nan_slot
    b.cuda_graph_attn_logits[4:] = float("nan")
    b.cuda_graph_attn_lse[4:] = float("nan")
    b.cuda_graph_num_kv_splits[4:] = b.max_kv_splits
    mask_live = int(b.mask_indptr[4]) if mode.is_target_verify() else 0
    b.cuda_graph_custom_mask[mask_live:] = 1
    b.kv_indptr[5:] = 10**6
    b.qo_indptr[5:] = 10**6
    again = runner.replay(fb)
    assert torch.equal(again, clean)
