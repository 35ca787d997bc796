"""Draft trees, verify masks and the per-mode batch generators (refimpl/spec.py, batchgen.py)."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from refimpl import layout
from refimpl.batch import ForwardBatch, World
from refimpl.batchgen import BatchGenerator
from refimpl.config import CHAIN, TREE, ModelConfig, SpecConfig
from refimpl.modes import ForwardMode
from refimpl.spec import (
    DraftDecodeInput,
    DraftExtendInput,
    DraftTree,
    VerifyInput,
    build_custom_mask,
    eagle_max_tree_nodes,
    make_verify_input,
    require_spec,
    tree_positions,
)
from refimpl.validate import validate_batch

L = 64


def make_world(page_size: int = 1, pool_size: int = 16, max_context_len: int = L) -> World:
    return World.create(ModelConfig(), max_context_len=max_context_len, pool_size=pool_size, page_size=page_size)


# ------------------------------------------------------------------------------------------------
# draft trees
# ------------------------------------------------------------------------------------------------


def test_chain_mask_is_lower_triangular():
    for n in (1, 2, 5):
        anc = DraftTree.chain(n).ancestry_mask()
        assert anc.dtype == torch.bool and anc.shape == (n, n)
        assert torch.equal(anc, torch.tril(torch.ones(n, n, dtype=torch.bool)))
        assert DraftTree.chain(n).depths() == list(range(n))


def test_ancestry_of_a_small_tree():
    #     0
    #    / \
    #   1   2
    #   |
    #   3
    tree = DraftTree([-1, 0, 0, 1])
    expected = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    assert torch.equal(tree.ancestry_mask(), expected)
    assert [tree.depth(q) for q in range(4)] == [0, 1, 1, 2]
    assert tree_positions(tree).tolist() == [0, 1, 1, 2]
    assert tree_positions(tree).dtype == torch.int64


@pytest.mark.parametrize(
    "parents, bad",
    [
        ([], "parents=[]"),
        ([0, 0], "parents[0]=0"),
        ([-1, 1], "parents[1]=1"),
        ([-1, 0, 3, 0], "parents[2]=3"),
        ([-1, -1], "parents[1]=-1"),
    ],
)
def test_invalid_parents_raise(parents, bad):
    with pytest.raises(ValueError, match=bad.replace("[", r"\[").replace("]", r"\]")):
        DraftTree(parents)


@settings(max_examples=150, deadline=None)
@given(topk=st.integers(1, 4), steps=st.integers(1, 5), frac=st.floats(0, 1), seed=st.integers(0, 2**16))
def test_random_tree_respects_topk_depth_and_size(topk, steps, frac, seed):
    limit = eagle_max_tree_nodes(topk, steps)
    n = 1 + round(frac * (limit - 1))
    tree = DraftTree.random(n, topk, steps, random.Random(seed))
    depths, kids = tree.depths(), tree.num_children()
    assert tree.num_nodes == n
    assert max(depths) <= steps
    assert max(kids) <= topk
    assert all(0 <= p < q for q, p in enumerate(tree.parents[1:], start=1))
    # EAGLE beams: below depth 1, every level hangs off at most topk distinct parents
    for d in range(2, max(depths) + 1):
        parents_at_d = {tree.parents[q] for q in range(n) if depths[q] == d}
        assert len(parents_at_d) <= topk
    # ancestry rows count the node and all its ancestors
    assert tree.ancestry_mask().sum(1).tolist() == [d + 1 for d in depths]


def test_random_tree_reaches_the_eagle_maximum_and_is_seeded():
    full = DraftTree.random(eagle_max_tree_nodes(2, 3), 2, 3, 0)
    assert full.num_nodes == 1 + 2 + 2 * 4
    assert DraftTree.random(6, 2, 3, 7).parents == DraftTree.random(6, 2, 3, 7).parents
    # topk=1 can only draw a chain
    assert DraftTree.random(4, 1, 3, 0).parents == DraftTree.chain(4).parents


def test_random_tree_rejects_infeasible_sizes():
    with pytest.raises(ValueError, match=r"num_draft_tokens=12 .* at most 11"):
        DraftTree.random(12, 2, 3, 0)
    with pytest.raises(ValueError, match="num_draft_tokens=5"):
        DraftTree.random(5, 1, 3, 0)  # a chain of 3 steps has 4 nodes
    with pytest.raises(ValueError, match="num_draft_tokens=0"):
        DraftTree.random(0, 2, 3, 0)


# ------------------------------------------------------------------------------------------------
# custom mask
# ------------------------------------------------------------------------------------------------


def test_custom_mask_worked_example():
    tree = DraftTree([-1, 0, 0])
    mask = build_custom_mask([2, 1], [tree, tree], "cpu")
    block0 = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 0, 1]], dtype=torch.bool).flatten()
    block1 = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 0, 1]], dtype=torch.bool).flatten()
    assert torch.equal(mask, torch.cat([block0, block1]))
    assert layout.mask_indptr(torch.tensor([2, 1]), 3).tolist() == [0, 15, 27]


@pytest.mark.parametrize("spec", [CHAIN, TREE], ids=["chain", "tree"])
def test_custom_mask_blocks(spec):
    rng = random.Random(3)
    n = spec.num_draft_tokens
    seq = [1, 7, 16, 33]
    trees = [DraftTree.random(n, spec.topk, spec.num_steps, rng) for _ in seq]
    mask = build_custom_mask(torch.tensor(seq, dtype=torch.int32), trees, "cpu")
    indptr = layout.mask_indptr(torch.tensor(seq), n)
    assert mask.dtype == torch.bool and indptr.dtype == torch.int64
    assert indptr.shape == (len(seq) + 1,) and indptr[0] == 0
    assert indptr[-1] == mask.numel()
    for i, (s, t) in enumerate(zip(seq, trees)):
        lo, hi = int(indptr[i]), int(indptr[i + 1])
        assert hi - lo == n * (s + n)
        block = mask[lo:hi].view(n, s + n)
        assert block[:, :s].all()
        assert torch.equal(block[:, s:], t.ancestry_mask())

    vi = make_verify_input(seq, trees, "cpu", topk=spec.topk)
    assert isinstance(vi, VerifyInput) and vi.draft_token_num == n and vi.topk == spec.topk
    assert torch.equal(vi.custom_mask, mask) and torch.equal(vi.mask_indptr, indptr)
    assert vi.parents == [t.parents for t in trees]


def test_custom_mask_rejects_mismatched_trees():
    with pytest.raises(ValueError, match="2 trees for 3 requests"):
        build_custom_mask([1, 2, 3], [DraftTree.chain(3)] * 2)
    with pytest.raises(ValueError, match="tree 1 has 4 nodes"):
        build_custom_mask([1, 2], [DraftTree.chain(3), DraftTree.chain(4)])


def test_require_spec():
    vi = make_verify_input([3], [DraftTree.chain(2)])
    assert require_spec(ForwardMode.TARGET_VERIFY, vi, VerifyInput) is vi
    with pytest.raises(ValueError, match="TARGET_VERIFY needs a VerifyInput spec input, got None"):
        require_spec(ForwardMode.TARGET_VERIFY, None, VerifyInput)
    with pytest.raises(ValueError, match="DRAFT_EXTEND needs a DraftExtendInput .* VerifyInput"):
        require_spec(ForwardMode.DRAFT_EXTEND, vi, DraftExtendInput)


# ------------------------------------------------------------------------------------------------
# batches: one checker for every mode
# ------------------------------------------------------------------------------------------------


def check_batch(b: ForwardBatch, spec: SpecConfig | None) -> None:
    """Every invariant a generated batch must satisfy, per mode."""
    w, bs = b.world, b.batch_size
    r2t = w.req_to_token
    validate_batch(b)  # draft decode: out_cache_loc holds all S steps, validation knows
    if isinstance(b.spec_info, DraftDecodeInput):
        with pytest.raises(ValueError, match="out_cache_loc"):
            validate_batch(b.replace(out_cache_loc=b.out_cache_loc[: b.num_tokens]))
    assert b.seq_lens_cpu.device.type == "cpu" and b.seq_lens_cpu.dtype == torch.int32
    assert torch.equal(b.seq_lens.cpu(), b.seq_lens_cpu)
    assert isinstance(b.seq_lens_sum, int) and b.seq_lens_sum == int(b.seq_lens_cpu.sum())
    assert ((b.input_ids >= 0) & (b.input_ids < w.cfg.vocab_size)).all()
    loc = b.out_cache_loc
    assert not (loc == 0).any(), "a live row writes the reserved slot 0"
    assert loc.unique().numel() == loc.numel(), "two rows write the same KV slot"
    rpi, seq = b.req_pool_indices.tolist(), b.seq_lens_cpu.tolist()
    assert len(set(rpi)) == bs and 0 not in rpi
    mode = b.forward_mode

    def rows_of(counts):  # request index per row
        return [i for i, c in enumerate(counts) for _ in range(c)]

    if mode.is_idle():
        assert bs == 0 and b.num_tokens == 0 and loc.numel() == 0
        return
    if isinstance(b.spec_info, DraftDecodeInput):
        S, k = spec.num_steps, spec.topk
        assert (b.spec_info.topk, b.spec_info.num_steps) == (k, S)
        assert b.num_tokens == bs * k and loc.numel() == bs * k * S
        assert b.positions.tolist() == [s for s in seq for _ in range(k)]
        steps = b.cache_loc_steps()  # [S, bs*topk]
        for j in range(S):
            for r in range(bs):
                for br in range(k):
                    col = seq[r] + br * S + j
                    assert col < L
                    assert int(steps[j, r * k + br]) == int(r2t[rpi[r], col])
        return

    if mode.is_extend():
        ext, pre = b.extend_seq_lens.tolist(), b.extend_prefix_lens.tolist()
        assert b.extend_seq_lens.dtype == torch.int32 and b.extend_prefix_lens.dtype == torch.int32
        assert [p + e for p, e in zip(pre, ext)] == seq
        counts = ext
        cols = [c for p, e in zip(pre, ext) for c in range(p, p + e)]
        pos = cols
    elif mode.is_decode():
        assert b.spec_info is None
        counts = [1] * bs
        cols = pos = [s - 1 for s in seq]
    elif mode.is_target_verify():
        n = spec.num_draft_tokens
        vi = b.spec_info
        assert isinstance(vi, VerifyInput) and vi.draft_token_num == n
        assert vi.custom_mask.numel() == sum(n * (s + n) for s in seq)
        counts = [n] * bs
        cols = [s + q for s in seq for q in range(n)]
        depths = [DraftTree(p).depths() for p in vi.parents]
        pos = [s + d for s, ds in zip(seq, depths) for d in ds]
        if spec.topk == 1:
            assert all(p == DraftTree.chain(n).parents for p in vi.parents)
    else:
        assert mode.is_any_draft_extend()
        de = b.spec_info
        assert isinstance(de, DraftExtendInput)
        S, n = spec.num_steps, spec.num_draft_tokens
        acc = de.accept_length_cpu
        assert de.accept_length.tolist() == acc and de.accept_length.dtype == torch.int32
        assert all(0 <= a <= S for a in acc)
        if mode.is_draft_extend_v1():
            assert de.version == 1 and de.num_tokens_per_req == S + 1
            # the verified chain, uniform (graph layout); ragged: only the real rows
            counts = [a + 1 for a in acc] if b.meta["ragged"] else [S + 1] * bs
        else:
            assert de.version == 2 and de.num_tokens_per_req == n
            counts = [n] * bs
        assert de.extend_seq_lens.tolist() == counts and de.extend_seq_lens.dtype == torch.int32
        assert all(s > c for s, c in zip(seq, counts))
        cols = pos = [c for s, r in zip(seq, counts) for c in range(s - r, s)]

    owner = rows_of(counts)
    assert b.num_tokens == len(owner) == sum(counts)
    assert b.positions.tolist() == pos
    assert loc.tolist() == [int(r2t[rpi[i], c]) for i, c in zip(owner, cols)]


ALL_MODES = [
    (ForwardMode.EXTEND, {}),
    (ForwardMode.DECODE, {}),
    (ForwardMode.IDLE, {}),
    (ForwardMode.TARGET_VERIFY, {}),
    (ForwardMode.DRAFT_EXTEND, {}),
    (ForwardMode.DRAFT_EXTEND_V2, {}),
    ("draft_decode", {}),
]


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("spec", [CHAIN, TREE], ids=["chain", "tree"])
@pytest.mark.parametrize("mode, kw", ALL_MODES, ids=lambda x: getattr(x, "label", str(x)))
def test_every_mode_generates_valid_batches(page_size, spec, mode, kw):
    world = make_world(page_size)
    gen = BatchGenerator(world, spec, seed=page_size)
    for bs in (1, 3, 8):
        b = gen.for_mode(mode, bs, **kw)
        assert b.kind.label == getattr(mode, "label", mode) and b.device == world.device
        assert b.batch_size == (0 if b.forward_mode.is_idle() else bs)
        check_batch(b, spec)
        gen.release(b)
    assert gen.live_requests == {}


def test_explicit_lengths_and_layouts():
    world = make_world(page_size=16)
    gen = BatchGenerator(world, TREE, seed=0)
    d = gen.decode(3, seq_lens=[1, 16, 17])
    assert d.positions.tolist() == [0, 15, 16] and d.seq_lens_sum == 34
    e = gen.extend(2, prefix_lens=[0, 15], extend_lens=[3, 2])
    assert e.positions.tolist() == [0, 1, 2, 15, 16] and e.seq_lens_cpu.tolist() == [3, 17]
    t = gen.target_verify(1, seq_lens=[5], trees=[DraftTree([-1, 0, 0, 1, 1, 2])])
    assert t.positions.tolist() == [5, 6, 6, 7, 7, 7]
    rpi = int(t.req_pool_indices[0])
    assert t.out_cache_loc.tolist() == world.req_to_token[rpi, 5:11].tolist()
    v1 = gen.draft_extend(2, 1, seq_lens=[10, 5], accept_length=[3, 0])  # S = 3: 4 rows each
    assert v1.positions.tolist() == [6, 7, 8, 9, 1, 2, 3, 4] and v1.num_tokens == 8
    v1r = gen.draft_extend(2, 1, seq_lens=[10, 4], accept_length=[3, 0], ragged=True)
    assert v1r.positions.tolist() == [6, 7, 8, 9, 3] and v1r.num_tokens == 5
    v2 = gen.draft_extend(2, 2, seq_lens=[10, 7], accept_length=[3, 0])
    assert v2.positions.tolist() == list(range(4, 10)) + list(range(1, 7))
    dd = gen.draft_decode(2, seq_lens=[5, 3])
    r0, r1 = dd.req_pool_indices.tolist()
    row0, row1 = world.req_to_token[r0], world.req_to_token[r1]
    step0 = [row0[5], row0[8], row1[3], row1[6]]  # [seq][branch], branch k at col s + k*S
    step2 = [row0[7], row0[10], row1[5], row1[8]]
    assert dd.cache_loc_steps()[0].tolist() == [int(x) for x in step0]
    assert dd.cache_loc_steps()[2].tolist() == [int(x) for x in step2]
    assert dd.positions.tolist() == [5, 5, 3, 3]
    for b in (d, e, t, v1, v1r, v2, dd):
        check_batch(b, TREE)


def test_checker_catches_corrupted_batches():
    world = make_world()
    gen = BatchGenerator(world, TREE, seed=0)
    b = gen.target_verify(2)
    check_batch(b, TREE)
    swapped = b.out_cache_loc.clone()
    swapped[[0, 1]] = swapped[[1, 0]]
    with pytest.raises(ValueError, match=r"row 0 must write request 0's new position"):  # refused by validate()
        check_batch(b.replace(out_cache_loc=swapped), TREE)
    with pytest.raises(AssertionError):
        check_batch(b.replace(positions=b.positions + 1), TREE)
    with pytest.raises(ValueError, match="slot 0 is reserved"):  # refused by validate()
        check_batch(b.replace(out_cache_loc=torch.zeros_like(b.out_cache_loc)), TREE)


def test_lengths_look_realistic():
    world = make_world(page_size=16, pool_size=64, max_context_len=256)
    gen = BatchGenerator(world, None, seed=0)
    lens = []
    for _ in range(8):
        b = gen.decode(32)
        lens += b.seq_lens_cpu.tolist()
        gen.release(b)
    assert min(lens) >= 1 and max(lens) <= 256
    assert any(s <= 8 for s in lens), "no short sequences"
    assert any(s >= 192 for s in lens), "no long sequences"
    assert sum(s % 16 in (15, 0, 1) for s in lens) > len(lens) // 8, "few page-boundary lengths"
    assert len(set(lens)) > 40


def test_same_seed_same_batches():
    a = BatchGenerator(make_world(), TREE, seed=5).target_verify(4)
    b = BatchGenerator(make_world(), TREE, seed=5).target_verify(4)
    for name in ("input_ids", "positions", "seq_lens", "out_cache_loc", "req_pool_indices"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert torch.equal(a.spec_info.custom_mask, b.spec_info.custom_mask)


@pytest.mark.parametrize("page_size", [1, 16])
def test_release_returns_capacity(page_size):
    world = make_world(page_size, pool_size=6)
    pool, alloc = world.req_to_token_pool, world.allocator
    free_reqs, free_pages = pool.available, alloc.free_pages
    gen = BatchGenerator(world, TREE, seed=1)
    modes = [m for m in ALL_MODES if m[0] is not ForwardMode.IDLE]
    for it in range(60):  # 60 * up to 5 requests would exhaust a 5-slot pool without release
        mode, kw = modes[it % len(modes)]
        b = gen.for_mode(mode, 5, **kw)
        assert pool.available == free_reqs - 5 and alloc.free_pages < free_pages
        gen.release(b)
        assert pool.available == free_reqs and alloc.free_pages == free_pages
    assert (world.req_to_token[1:] == 0).all(), "released rows must be cleared"
    b = gen.decode(2)
    gen.release(b)
    with pytest.raises(ValueError, match="not allocated by this generator"):
        gen.release(b)
    b = gen.decode(3)
    gen.release_all()
    assert pool.available == free_reqs and alloc.free_pages == free_pages


# ------------------------------------------------------------------------------------------------
# bad requests
# ------------------------------------------------------------------------------------------------


def test_bad_requests_raise_value_errors():
    world = make_world(pool_size=8)  # 7 usable request slots
    gen = BatchGenerator(world, TREE, seed=0)
    n, S, k = TREE.num_draft_tokens, TREE.num_steps, TREE.topk
    with pytest.raises(ValueError, match=r"seq_lens\[1\]=65 exceeds the limit 64"):
        gen.decode(2, seq_lens=[3, 65])
    with pytest.raises(ValueError, match=rf"seq_lens\[0\]={L - n + 1} exceeds the limit {L - n}"):
        gen.target_verify(1, seq_lens=[L - n + 1])
    with pytest.raises(ValueError, match=rf"={L - k * S + 1} exceeds the limit {L - k * S}"):
        gen.draft_decode(1, seq_lens=[L - k * S + 1])
    with pytest.raises(ValueError, match="prefix_len 60 \\+ extend_len 10 = 70 exceeds .*=64"):
        gen.extend(1, prefix_lens=[60], extend_lens=[10])
    with pytest.raises(ValueError, match="bs=8 exceeds the 7 free request slots"):
        gen.decode(8)
    with pytest.raises(ValueError, match=rf"accept_length\[0\]={S + 1} exceeds the limit {S}"):
        gen.draft_extend(2, 1, accept_length=[S + 1, 0])
    with pytest.raises(ValueError, match="accept_length\\[1\\]=-1 is below"):
        gen.draft_extend(2, 2, accept_length=[0, -1])
    with pytest.raises(ValueError, match="version must be 1 or 2, got 3"):
        gen.draft_extend(2, 3)
    with pytest.raises(ValueError, match="version must be 1 or 2, got 0"):
        DraftExtendInput(0, torch.zeros(1), [0], torch.ones(1), 4)
    with pytest.raises(ValueError, match="seq_lens has 1 entries, expected bs=2"):
        gen.decode(2, seq_lens=[4])
    with pytest.raises(ValueError, match="trees\\[0\\] has 4 nodes, expected N=6"):
        gen.target_verify(1, trees=[DraftTree.chain(4)])
    with pytest.raises(ValueError, match="TARGET_VERIFY batches need a SpecConfig"):
        BatchGenerator(world, None).target_verify(1)
    with pytest.raises(ValueError, match="unknown graph mode 'verify'"):
        gen.for_mode("verify", 1)
    # nothing leaked from the failed calls
    assert world.req_to_token_pool.available == 7 and gen.live_requests == {}


def test_out_of_pages_is_a_value_error_and_allocates_nothing():
    world = World.create(ModelConfig(), max_context_len=L, pool_size=8, num_slots=5 * L)
    gen = BatchGenerator(world, None, seed=0)
    free = world.allocator.free_pages
    with pytest.raises(ValueError, match=rf"needs {6 * L} pages of 1 slots, only {free} free"):
        gen.decode(6, seq_lens=[L] * 6)
    assert world.allocator.free_pages == free and world.req_to_token_pool.available == 7
