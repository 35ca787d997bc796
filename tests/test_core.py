"""Modes, configs and pools: the data model everything else indexes into."""

import pytest
import torch

from refimpl import layout
from refimpl.batch import World
from refimpl.config import TREE, GraphConfig, ModelConfig, SpecConfig, sglang_default_capture_bs
from refimpl.memory import ReqToTokenPool, TokenSlotAllocator
from refimpl.modes import GRAPH_MODES, ForwardMode
from refimpl.validate import validate_batch


def test_each_mode_has_exactly_one_own_predicate():
    own = {
        ForwardMode.EXTEND: "is_extend",
        ForwardMode.DECODE: "is_decode",
        ForwardMode.IDLE: "is_idle",
        ForwardMode.TARGET_VERIFY: "is_target_verify",
        ForwardMode.DRAFT_EXTEND: "is_draft_extend_v1",
        ForwardMode.DRAFT_EXTEND_V2: "is_draft_extend_v2",
    }
    for mode in ForwardMode:
        truths = [name for name in own.values() if getattr(mode, name)()]
        assert truths == [own[mode]], (mode, truths)
    # the SGLang pitfall ([facts#forward-modes]): v2 must not hide behind a v1 predicate
    assert not ForwardMode.DRAFT_EXTEND_V2.is_draft_extend_v1()
    assert ForwardMode.DRAFT_EXTEND_V2.is_any_draft_extend()
    assert ForwardMode.EXTEND not in GRAPH_MODES


def test_mode_parse_errors_name_the_value():
    assert ForwardMode.parse("target-verify") is ForwardMode.TARGET_VERIFY
    with pytest.raises(ValueError, match="'verify'"):
        ForwardMode.parse("verify")


def test_tokens_per_request_per_mode():
    spec = TREE
    rows = layout.rows_per_request
    assert rows(ForwardMode.DECODE, spec) == 1
    assert layout.KINDS["draft_decode"].rows(spec) == 2
    assert rows(ForwardMode.TARGET_VERIFY, spec) == 6
    assert rows(ForwardMode.DRAFT_EXTEND, spec) == 4  # S + 1
    assert rows(ForwardMode.DRAFT_EXTEND_V2, spec) == 6  # N
    with pytest.raises(ValueError):
        SpecConfig(num_steps=3, topk=1, num_draft_tokens=6)  # a chain verifies S+1


def test_tree_mask_layout_and_its_buffer_limit():
    # request i's block is [N, seq_i + N]; blocks back to back
    seq = torch.tensor([3, 7])
    assert layout.mask_indptr(seq, 2).tolist() == [0, 2 * 5, 2 * 5 + 2 * 9]
    assert layout.tree_mask_sizes([3, 7], 2) == [10, 18]
    assert layout.tree_mask_total([3, 7], 2) == 28 == sum(layout.tree_mask_sizes([3, 7], 2))
    buf = torch.zeros(28, dtype=torch.uint8)
    layout.check_mask_fits(torch.ones(28, dtype=torch.bool), buf)  # exactly full: fine
    with pytest.raises(ValueError, match="tree mask of 29 entries exceeds the graph buffer of 28"):
        layout.check_mask_fits(torch.ones(29, dtype=torch.bool), buf)


def test_default_ladder_matches_sglang_and_caps():
    assert sglang_default_capture_bs(160, speculative=False)[:6] == [1, 2, 4, 8, 16, 24]
    spec = sglang_default_capture_bs(160, speculative=True)
    assert spec[:10] == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12] and spec[-1] == 152 + 8 == 160
    assert sglang_default_capture_bs(6, speculative=False) == [1, 2, 4, 6]
    with pytest.raises(ValueError, match="outside"):
        GraphConfig(max_bs=4, capture_bs=(1, 8)).batch_sizes()


def test_reserved_request_slot_and_page():
    pool = ReqToTokenPool(4, 16)
    assert pool.alloc(3) == [1, 2, 3]
    with pytest.raises(RuntimeError, match="only 0 free"):
        pool.alloc(1)
    alloc = TokenSlotAllocator(num_slots=64, page_size=16)
    pages = alloc.alloc_pages(3)
    assert 0 not in pages and alloc.free_pages == 0
    slots = alloc.slots_for(pages, 40)
    assert (slots // 16).unique().numel() == 3 and (slots > 15).all()
    with pytest.raises(ValueError):
        alloc.free_page_ids([0])


def test_world_request_rows_are_paged_and_aligned():
    w = World.create(ModelConfig(), max_context_len=64, pool_size=8, page_size=8)
    r = w.new_request(20)
    row = w.req_to_token[r, :20].to(torch.int64).cpu()
    assert (row[::8] % 8 == 0).all(), "each page starts at an aligned slot"
    assert torch.equal(row[1:8] - row[:7], torch.ones(7, dtype=torch.int64))
    with pytest.raises(ValueError, match="max_context_len=64"):
        w.new_request(65)


def test_mla_cache_row_is_576_wide():
    w = World.create(ModelConfig(kind="mla"), max_context_len=16, pool_size=4)
    assert w.kv_cache.kv[0].shape[1:] == (1, 576)


def test_world_twin_and_batch_move_keep_everything():
    from refimpl.batchgen import BatchGenerator
    from refimpl.config import SpecConfig

    w = World.create(ModelConfig(), max_context_len=32, pool_size=8)
    w.randomize_kv(1)
    fb = BatchGenerator(w, SpecConfig(), seed=0).target_verify(2)
    twin = w.clone_to("cpu")
    assert twin.req_to_token is not w.req_to_token
    assert torch.equal(twin.req_to_token, w.req_to_token.cpu())
    assert all(torch.equal(a, b.cpu()) for a, b in zip(twin.kv_cache.buffers(), w.kv_cache.buffers()))
    moved = fb.to_world(twin)
    assert moved.world is twin
    assert torch.equal(moved.spec_info.custom_mask, fb.spec_info.custom_mask.cpu())
    validate_batch(moved)
