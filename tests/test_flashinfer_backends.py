"""FlashInfer and FlashInfer-MLA backends on the CPU stand-ins, through the checker."""

import dataclasses

import pytest
from helpers import CAPTURE_BS, RAW_BS, gate, per_size_settings

from refimpl.backends import find
from refimpl.backends.flashinfer import FlashInferAttnBackend
from refimpl.batch import World
from refimpl.batchgen import BatchGenerator
from refimpl.check import check_entry_mode
from refimpl.config import CHAIN, TREE, ModelConfig, SpecConfig
from refimpl.graphs import CPUEmulatorEngine
from refimpl.spec import VerifyInput


def run(name, variant, case, spec=CHAIN, raw_bs=RAW_BS, capture_bs=CAPTURE_BS):
    (entry,) = find(name, variant)
    settings = dataclasses.replace(per_size_settings(spec, raw_bs), capture_bs=capture_bs)
    return check_entry_mode(entry, case, CPUEmulatorEngine(), settings)


def assert_all_pass(rows):
    bad = [(r.variant, r.mode, r.bs, r.findings) for r in rows if not r.passed or r.findings]
    assert rows and not bad, bad


CASES = [
    ("decode", CHAIN, "decode"),
    ("idle", CHAIN, "idle"),
    ("target_verify", TREE, "verify-tree"),
    ("draft_extend", CHAIN, "de-v1"),
    ("draft_extend_v2", TREE, "de-v2"),
    ("draft_decode", TREE, "dd-tree"),
]
ROWS = [pytest.param("unified", c, s, id=f"{i}-unified") for c, s, i in CASES]  # CPU CI: every unified row, legacy's
ROWS += [(pytest.param if c in ("decode", "target_verify") else gate)("legacy", c, s, id=f"{i}-legacy") for c, s, i in CASES]


@pytest.mark.parametrize("variant, case, spec", ROWS)  # decode and verify (its other rows: the GPU gate)
def test_flashinfer_rows_pass(variant, case, spec):
    # legacy FlashInfer duplicates the dispatch but does not diverge: no finding either way
    assert_all_pass(run("flashinfer", variant, case, spec))


@pytest.mark.gate  # topk 8, 32 rows per step: the GPU gate (CPU CI: the topk-2 tree rows above)
def test_multi_step_draft_decode_plans_bs_times_topk_rows_past_the_request_pool():
    """topk 8 (the CLI's largest): bs 4 x 8 = 32 rows per step against a request pool of 24. Each step's buffers were
    sized by the pool, so the bs-4 wrapper was bound to 24 last-page lengths and its plan refused 33 indptr entries."""
    spec = SpecConfig(num_steps=3, topk=8, num_draft_tokens=10)
    assert_all_pass(run("flashinfer", "unified", "draft_decode", spec, raw_bs=(3,), capture_bs=(4,)))


@pytest.mark.parametrize("case", ["decode", "target_verify", gate("draft_extend"), "draft_extend_v2"])  # v1: the gate
def test_flashinfer_mla_unified_passes(case):
    assert_all_pass(run("flashinfer_mla", "unified", case))


@pytest.mark.parametrize("variant", ["as-upstream", "legacy"])
def test_flashinfer_mla_stale_bound_kv_indptr_is_reported(variant):
    (r,) = run("flashinfer_mla", variant, "decode", raw_bs=(3,))
    assert r.capture_equals_replay is False
    assert any(f.startswith("kv_indptr:") for f in r.findings), r.findings
    assert r.graph_equals_eager and r.matches_oracle  # hidden: run reads the plan's partition


def test_flashinfer_mla_refuses_tree_verify():
    (r,) = run("flashinfer_mla", "unified", "target_verify", TREE)
    assert "custom mask when topk > 1" in r.findings[0]


def test_flashinfer_mask_of_wrong_length_is_refused():
    world = World.create(ModelConfig(), max_context_len=40, pool_size=8)
    b = FlashInferAttnBackend(world, CHAIN, prefer_real=False)
    fb = BatchGenerator(world, CHAIN, seed=0).target_verify(2)
    bad = fb.replace(spec_info=VerifyInput(4, fb.spec_info.custom_mask[:-5]))
    with pytest.raises(ValueError, match="mask"):
        b.init_forward_metadata(bad)


def test_flashinfer_batch_larger_than_bound_is_refused():
    # the stand-in's own error (the real library raises its own, surfaced unchanged; it also
    # has no float32 kernels, hence prefer_real=False on a GPU machine)
    world = World.create(ModelConfig(), max_context_len=40, pool_size=8)
    b = FlashInferAttnBackend(world, CHAIN, prefer_real=False)
    b.init_cuda_graph_state(2, 2)
    gen = BatchGenerator(world, CHAIN, seed=0)
    small = gen.decode(2)
    b.init_forward_metadata_capture_cuda_graph(2, 2, small.req_pool_indices, small.seq_lens, None, small.forward_mode, None)
    big = gen.decode(3)
    with pytest.raises(ValueError, match="3"):
        b._update_decode(3, big.req_pool_indices, big.seq_lens, big.seq_lens_cpu, b.decode_cuda_graph_metadata[2], None)


def test_decode_kernel_choice_follows_sglang():
    """SGLang's ``should_use_tensor_core``: fp8 KV, or fp16 / bf16 with >= 4 query heads per KV head, picks the
    tensor-core decode; every decode wrapper the backend builds (eager and graph-bound) gets that choice."""
    import torch

    from refimpl.backends.flashinfer import should_use_tensor_core

    assert should_use_tensor_core(torch.float8_e4m3fn, 4, 4) and should_use_tensor_core(torch.bfloat16, 8, 2)
    assert not should_use_tensor_core(torch.bfloat16, 4, 2) and not should_use_tensor_core(torch.float32, 8, 2)
    for heads, want in ((8, True), (4, False)):
        cfg = ModelConfig(num_heads=heads, num_kv_heads=2, dtype=torch.float16)
        backend = FlashInferAttnBackend(World.create(cfg, max_context_len=40, pool_size=8), CHAIN)
        backend.init_cuda_graph_state(2, 2)
        graph_wrapper = backend._create_decode_wrappers(2, 2)[0]
        assert backend.decode_use_tensor_cores is want
        assert backend._eager_decode.use_tensor_cores is want and graph_wrapper.use_tensor_cores is want


@pytest.mark.parametrize("name", ["flashinfer", "flashinfer_mla"])
def test_an_empty_idle_batch_plans_nothing(name):
    """flashinfer 0.7.2 refuses to plan an empty batch (tensor-core decode: ``max()`` of no lengths; MLA: "requires a
    nonempty batch"): an eager idle batch of no request plans nothing, and its forward runs no kernel."""
    from refimpl.flashinfer_wrappers import count_plans
    from refimpl.layout import KINDS
    from refimpl.rig import Rig

    rig = Rig.build(
        find(name, "unified")[0], KINDS["idle"], CHAIN, CPUEmulatorEngine(), capture_bs=(1,), max_context_len=40, capture=False
    )
    with count_plans(rig.runner.backend) as calls:
        out = rig.runner.eager(rig.gen.idle())
    assert calls[0] == 0 and out.shape[0] == 0
