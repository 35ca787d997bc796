"""Tests for the Triton extend-attention kernel ([facts#triton-kernels-and-frozen-values],
[facts#target-verify-custom-mask]) and the multi-step draft-decode kv index generator
([facts#multi-step-draft-decode-indices]).

extend_attention is checked against the fp64 ``mha_oracle`` on an equivalent paged view: the
extend keys are written into spare cache slots and appended to each request's kv range, so the
oracle sees ``prefix + extend`` keys and the mask block ([facts#target-verify-custom-mask]) ``[q_i, p_i + q_i]`` unchanged.
Shapes stay tiny: the kernels run in the Triton interpreter on CPU.
"""

import math

import pytest
import torch
from helpers import DEVICE, RecordOps, gate, on_device, rng  # noqa: F401  (on_device: autouse)
from refs import draft_decode_used_len, relative_error

from refimpl.batch import World
from refimpl.batchgen import BatchGenerator
from refimpl.config import ModelConfig, SpecConfig
from refimpl.kernels.draft_indices import draft_decode_kv_indices, draft_decode_kv_indices_ref
from refimpl.kernels.oracle import mha_oracle
from refimpl.kernels.triton_extend import BLOCK_M, extend_attention

POISON = -7
# Bounds on relative_error(out, oracle) = ||out - ref|| / ||ref|| (float64), per output dtype:
# ~3x the worst error these tests measure (CPU, Triton interpreter): fp32 2.0e-7 (float32
# online softmax, ieee dots; 1.2e-7 on whole outputs), fp16 1.5e-4..2.1e-4 (the fp16 output
# rounding). A 1% sm_scale error gives >= 4.5e-3 here, so it fails
# (test_tolerance_catches_sm_scale_error).
TOL = {torch.float32: 1e-6, torch.float16: 6e-4}
TOL32 = TOL[torch.float32]  # the fp32 tests below
NAN_SLOT = 1  # a cache slot full of NaN: kv_indices tails point here


def indptr_of(lens, dtype=torch.int64):
    out = torch.zeros(len(lens) + 1, dtype=dtype)
    out[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.int64), 0)
    return out


# ----------------------------------------------------------------------------------------------
# extend attention: case builder + oracle view


def make_masks(gen, mode, prefix_lens, q_lens):
    """Flattened custom mask (bool) and mask_indptr (int64) for ``mode``, or (None, None).

    tree:   all prefix visible; extend part = own key + random ancestors (lower triangular).
    prefix: like tree but a random pattern over the prefix columns too.
    random: arbitrary bits (extend keys after the row visible too); one row fully masked.
    """
    if mode not in ("tree", "prefix", "random"):
        return None, None
    blocks = []
    for i, (p, q) in enumerate(zip(prefix_lens, q_lens)):
        bits = torch.rand(q, p + q, generator=gen) < 0.5  # [q, p+q]
        if mode in ("tree", "prefix"):
            ext = torch.tril(bits[:, p:], diagonal=-1) | torch.eye(q, dtype=torch.bool)
            bits[:, p:] = ext
            if mode == "tree":
                bits[:, :p] = True
        elif i == 0:
            bits[-1] = False  # a row that sees nothing -> zeros
        blocks.append(bits.reshape(-1))
    mask_indptr = indptr_of([b.numel() for b in blocks])
    return torch.cat(blocks), mask_indptr


def make_case(
    seed,
    prefix_lens,
    q_lens,
    *,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    v_head_dim=16,
    dtype=torch.float32,
    idx_dtype=torch.int64,
    mode="none",
    num_slots=160,
):
    gen = rng(seed)
    tokens = sum(q_lens)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    # cache: random everywhere, then NaN in every slot no request reads
    k_buf = randn(num_slots, num_kv_heads, head_dim)
    v_buf = randn(num_slots, num_kv_heads, v_head_dim)
    used = (torch.randperm(num_slots - 2, generator=gen) + 2)[: sum(prefix_lens)]
    unused = torch.ones(num_slots, dtype=torch.bool)
    unused[used] = False
    k_buf[unused] = float("nan")
    v_buf[unused] = float("nan")
    tail = 5  # kv_indices past kv_indptr[bs] point at a NaN slot
    kv_indices = torch.cat([used, torch.full((tail,), NAN_SLOT)]).to(idx_dtype)
    custom_mask, mask_indptr = make_masks(gen, mode, prefix_lens, q_lens)
    return dict(
        q_extend=randn(tokens, num_heads, head_dim),
        k_extend=randn(tokens, num_kv_heads, head_dim),
        v_extend=randn(tokens, num_kv_heads, v_head_dim),
        o_extend=torch.full((tokens, num_heads, v_head_dim), float("nan"), dtype=dtype),
        k_buffer=k_buf,
        v_buffer=v_buf,
        qo_indptr=indptr_of(q_lens, idx_dtype),
        kv_indptr=indptr_of(prefix_lens, idx_dtype),
        kv_indices=kv_indices,
        custom_mask=custom_mask,
        mask_indptr=mask_indptr,
        is_causal=mode == "causal",
        max_len_extend=max(q_lens),
        sm_scale=1.0 / math.sqrt(head_dim),
    )


def oracle_view(case, prefix_lens, q_lens):
    """fp64 oracle over prefix + extend keys: extend rows live in slots appended to the cache."""
    k_buf, v_buf = case["k_buffer"], case["v_buffer"]
    base = k_buf.shape[0]
    k_cache = torch.cat([k_buf, case["k_extend"]])  # extend row t -> slot base + t
    v_cache = torch.cat([v_buf, case["v_extend"]])
    kv_indptr, qo = case["kv_indptr"].tolist(), case["qo_indptr"].tolist()
    rows = []
    for i in range(len(q_lens)):
        rows.append(case["kv_indices"][kv_indptr[i] : kv_indptr[i + 1]].long())
        rows.append(torch.arange(base + qo[i], base + qo[i + 1]))
    lens = [p + q for p, q in zip(prefix_lens, q_lens)]
    return mha_oracle(
        case["q_extend"],
        k_cache,
        v_cache,
        case["qo_indptr"],
        indptr_of(lens),
        torch.cat(rows),
        case["sm_scale"],
        case["custom_mask"],
        case["mask_indptr"],
        causal=case["is_causal"],
    )


RAGGED = ([0, 17, 40, 3], [3, 6, 1, 5])
UNIFORM = ([12, 0, 33], [4, 4, 4])  # target-verify style: N rows per request


@pytest.mark.parametrize("mode", ["tree", "prefix", "random", "causal", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize(
    "layout,idx_dtype,num_kv_heads",
    [(RAGGED, torch.int32, 2), (UNIFORM, torch.int64, 4), gate(RAGGED, torch.int64, 4), gate(UNIFORM, torch.int32, 2)],
    ids=["ragged-i32-gqa", "uniform-i64-mha", "ragged-i64-mha", "uniform-i32-gqa"],
)
def test_extend_attention_matches_oracle(mode, dtype, layout, idx_dtype, num_kv_heads):
    prefix_lens, q_lens = layout
    case = make_case(7, prefix_lens, q_lens, num_kv_heads=num_kv_heads, dtype=dtype, idx_dtype=idx_dtype, mode=mode)
    ref = oracle_view(case, prefix_lens, q_lens)
    extend_attention(**case)
    out = case["o_extend"]
    assert torch.isfinite(out).all(), "some row was not written (or NaN leaked in)"
    err = relative_error(out, ref)
    assert err < TOL[dtype], f"{mode} {dtype}: rel err {err:.2e}"


@pytest.mark.parametrize("mode", ["prefix", "causal"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("factor", [1.01, 0.99])
def test_tolerance_catches_sm_scale_error(mode, dtype, factor):
    """The check of test_extend_attention_matches_oracle FAILS for a 1% sm_scale error (the old
    5e-3 bound passed "prefix": 4.5e-3): exact scale passes, scale * factor does not."""
    prefix_lens, q_lens = RAGGED
    case = make_case(7, prefix_lens, q_lens, dtype=dtype, idx_dtype=torch.int32, mode=mode)
    ref = oracle_view(case, prefix_lens, q_lens)
    extend_attention(**case)
    assert relative_error(case["o_extend"], ref) < TOL[dtype]
    wrong = dict(case, sm_scale=case["sm_scale"] * factor)
    wrong["o_extend"] = torch.full_like(case["o_extend"], float("nan"))
    extend_attention(**wrong)
    assert relative_error(wrong["o_extend"], ref) > TOL[dtype], "a 1% sm_scale error passes"


def test_custom_mask_supersedes_causal_and_uint8_mask():
    """With a mask, is_causal is ignored (SGLang); a uint8 mask equals its bool twin."""
    prefix_lens, q_lens = RAGGED
    case = make_case(3, prefix_lens, q_lens, mode="random")
    ref = oracle_view(case, prefix_lens, q_lens)  # mask only (is_causal False here)
    case["custom_mask"] = case["custom_mask"].to(torch.uint8)
    case["is_causal"] = True
    extend_attention(**case)
    assert relative_error(case["o_extend"], ref) < TOL32
    # the random mask shows extend keys after the row: a causal result would differ
    causal_case = dict(case, custom_mask=None, mask_indptr=None)
    assert relative_error(oracle_view(causal_case, prefix_lens, q_lens), ref) > 1e-2


def test_empty_rows_and_zero_prefix_write_zeros():
    """Request 0's last row is fully masked (make_masks 'random'): its output is exactly 0."""
    prefix_lens, q_lens = [0, 4], [3, 2]
    case = make_case(11, prefix_lens, q_lens, mode="random")
    extend_attention(**case)
    assert torch.equal(case["o_extend"][2], torch.zeros_like(case["o_extend"][2]))
    assert relative_error(case["o_extend"], oracle_view(case, prefix_lens, q_lens)) < TOL32


def test_head_dims_not_power_of_two():
    prefix_lens, q_lens = [9, 2], [3, 5]
    case = make_case(5, prefix_lens, q_lens, head_dim=12, v_head_dim=20, mode="tree")
    extend_attention(**case)
    assert relative_error(case["o_extend"], oracle_view(case, prefix_lens, q_lens)) < TOL32


@pytest.mark.parametrize("mode", ["causal", "tree"])
def test_long_extend_and_strided_views(mode):
    """q_i > BLOCK_N and > BLOCK_M (several key and row blocks); q/k/o as strided views."""
    prefix_lens, q_lens = [5, 0], [35, 2]
    case = make_case(19, prefix_lens, q_lens, mode=mode)
    for name in ("q_extend", "k_extend", "o_extend"):  # same values, row stride != contiguous
        t = case[name]
        wide = torch.full((t.shape[0], t.shape[1] + 1, t.shape[2]), 99.0, dtype=t.dtype)
        wide[:, 1:] = t
        case[name] = wide[:, 1:]
        assert not case[name].is_contiguous()
    ref = oracle_view(case, prefix_lens, q_lens)
    extend_attention(**case)
    assert relative_error(case["o_extend"], ref) < TOL32


def test_logit_cap():
    prefix_lens, q_lens = [10, 3], [4, 2]
    case = make_case(2, prefix_lens, q_lens, num_kv_heads=4, mode="causal")
    case["q_extend"] *= 4.0  # big scores so the cap matters
    cap = 0.7
    extend_attention(**case, logit_cap=cap)
    # fp64 reference with the cap, per request and head (MHA: head h reads kv head h)
    qo, kv = case["qo_indptr"].tolist(), case["kv_indptr"].tolist()
    ref = torch.zeros_like(case["o_extend"], dtype=torch.float64)
    for i, (p, n) in enumerate(zip(prefix_lens, q_lens)):
        idx = case["kv_indices"][kv[i] : kv[i + 1]].long()
        keys = torch.cat([case["k_buffer"][idx], case["k_extend"][qo[i] : qo[i + 1]]]).double()
        vals = torch.cat([case["v_buffer"][idx], case["v_extend"][qo[i] : qo[i + 1]]]).double()
        q = case["q_extend"][qo[i] : qo[i + 1]].double()  # [n, H, D]
        s = torch.einsum("jhd,thd->hjt", q, keys) * case["sm_scale"]
        s = cap * torch.tanh(s / cap)
        visible = torch.arange(p + n)[None, :] < p + torch.arange(n)[:, None] + 1  # [n, p+n]
        s = s.masked_fill(~visible, float("-inf"))
        ref[qo[i] : qo[i + 1]] = torch.einsum("hjt,thd->jhd", torch.softmax(s, -1), vals)
    assert relative_error(case["o_extend"], ref) < TOL32
    uncapped = oracle_view(case, prefix_lens, q_lens)
    assert relative_error(uncapped, ref) > 1e-2, "cap too weak for this test to mean anything"


@pytest.mark.parametrize("q_lens,max_len_extend", [([6, 2, 5], 1), ([6, 2, 5], 3), ([BLOCK_M + 4, 3], BLOCK_M + 1)])
def test_rows_past_max_len_extend_are_never_computed(q_lens, max_len_extend):
    """A frozen max_len_extend below a request's row count leaves that request's tail rows
    untouched (here: still poisoned); earlier rows still see every extend key. refimpl stops
    exactly at max_len_extend ([facts#where-refimpl-deliberately-differs-from-upstream], "Extend
    kernel cut-off"; SGLang drops whole BLOCK_M row blocks)."""
    prefix_lens = [4, 0, 9][: len(q_lens)]
    case = make_case(13, prefix_lens, q_lens, mode="none")
    sentinel = 1234.5
    case["o_extend"].fill_(sentinel)
    case["max_len_extend"] = max_len_extend
    extend_attention(**case)
    ref = oracle_view(case, prefix_lens, q_lens)
    qo = case["qo_indptr"].tolist()
    for i, n in enumerate(q_lens):
        done = slice(qo[i], qo[i] + min(n, max_len_extend))
        tail = slice(qo[i] + min(n, max_len_extend), qo[i + 1])
        assert relative_error(case["o_extend"][done], ref[done]) < TOL32, f"request {i}"
        assert (case["o_extend"][tail] == sentinel).all(), f"request {i}: tail rows written"
    assert any(n > max_len_extend for n in q_lens)


def test_poisoned_cache_and_index_tail_do_not_change_outputs():
    """Unused slots are NaN already (make_case); changing them / the index tail changes nothing."""
    prefix_lens, q_lens = RAGGED
    case = make_case(17, prefix_lens, q_lens, mode="tree", idx_dtype=torch.int32)
    extend_attention(**case)
    first = case["o_extend"].clone()
    assert torch.isfinite(first).all()
    used = case["kv_indices"][: sum(prefix_lens)].long()
    keep = torch.zeros(case["k_buffer"].shape[0], dtype=torch.bool)
    keep[used] = True
    case["k_buffer"][~keep] = float("inf")
    case["v_buffer"][~keep] = -float("inf")
    case["kv_indices"][sum(prefix_lens) :] = 0  # another unused slot
    case["o_extend"].fill_(float("nan"))
    extend_attention(**case)
    assert torch.equal(case["o_extend"], first)


def test_empty_batch_launches_nothing():
    case = make_case(0, [3], [2])
    case["qo_indptr"] = case["qo_indptr"][:1]  # bs = 0
    extend_attention(**case)
    assert torch.isnan(case["o_extend"]).all()


# ----------------------------------------------------------------------------------------------
# extend attention: validation


def test_extend_attention_errors_name_the_value():
    case = make_case(1, [3, 2], [2, 2], mode="tree")
    with pytest.raises(ValueError, match="mask_indptr"):
        extend_attention(**dict(case, mask_indptr=None))
    with pytest.raises(ValueError, match="custom_mask"):
        extend_attention(**dict(case, custom_mask=None))
    with pytest.raises(ValueError, match=r"custom_mask\.dtype"):
        extend_attention(**dict(case, custom_mask=case["custom_mask"].float()))
    with pytest.raises(ValueError, match=r"kv_indices\.dtype"):
        extend_attention(**dict(case, kv_indices=case["kv_indices"].float()))
    with pytest.raises(ValueError, match=r"q_extend\.dtype"):
        extend_attention(**dict(case, q_extend=case["q_extend"].double()))
    with pytest.raises(ValueError, match=r"k_extend\.shape"):
        extend_attention(**dict(case, k_extend=case["k_extend"][:3]))
    with pytest.raises(ValueError, match=r"o_extend\.shape"):
        extend_attention(**dict(case, o_extend=case["o_extend"][..., :8]))
    with pytest.raises(ValueError, match=r"k_buffer\.shape\[1\]"):
        extend_attention(**dict(case, k_buffer=torch.zeros(160, 3, 16)))
    with pytest.raises(ValueError, match=r"kv_indptr\.shape\[0\]"):
        extend_attention(**dict(case, kv_indptr=case["kv_indptr"][:2]))
    with pytest.raises(ValueError, match=r"mask_indptr\.shape\[0\]"):
        extend_attention(**dict(case, mask_indptr=case["mask_indptr"][:2]))
    with pytest.raises(ValueError, match="max_len_extend"):
        extend_attention(**dict(case, max_len_extend=0))
    with pytest.raises(ValueError, match="logit_cap"):
        extend_attention(**dict(case, logit_cap=-1.0))
    assert torch.isnan(case["o_extend"]).all()  # nothing ran


# ----------------------------------------------------------------------------------------------
# draft-decode kv indices ([facts#multi-step-draft-decode-indices])


def run_draft(rpi, r2t, seq_lens, topk, num_steps, width, idx_dtype=torch.int64, indptr_dtype=torch.int32, extra_steps=0):
    rows = seq_lens.numel() * topk
    kv_indices = torch.full((num_steps + extra_steps, width), POISON, dtype=idx_dtype)
    kv_indptr = torch.full((num_steps + extra_steps, rows + 3), POISON, dtype=indptr_dtype)
    draft_decode_kv_indices(rpi, r2t, seq_lens, kv_indices, kv_indptr, topk=topk, num_steps=num_steps)
    return kv_indptr, kv_indices


def check_draft(kv_indptr, kv_indices, rpi, r2t, seq_lens, topk, num_steps):
    ref_indptr, ref_indices = draft_decode_kv_indices_ref(rpi, r2t, seq_lens, topk=topk, num_steps=num_steps)
    rows = seq_lens.numel() * topk
    for i in range(num_steps):
        used = draft_decode_used_len(int(seq_lens.sum()), seq_lens.numel(), topk, i)
        assert ref_indices[i].numel() == used == int(ref_indptr[i][-1])
        assert torch.equal(kv_indptr[i, : rows + 1].long(), ref_indptr[i]), f"step {i} indptr"
        assert torch.equal(kv_indices[i, :used].long(), ref_indices[i]), f"step {i} indices"
        assert (kv_indptr[i, rows + 1 :] == POISON).all(), f"step {i}: indptr tail written"
        assert (kv_indices[i, used:] == POISON).all(), f"step {i}: indices tail written"
    assert (kv_indptr[num_steps:] == POISON).all() and (kv_indices[num_steps:] == POISON).all()


@pytest.mark.parametrize("topk", [1, 2, 3])
@pytest.mark.parametrize("num_steps", [1, 3])
def test_draft_decode_kv_indices_on_generated_batch(topk, num_steps):
    L = 48
    world = World.create(ModelConfig(), max_context_len=L, pool_size=8, device=DEVICE)
    n_draft = num_steps + 1 if topk == 1 else 2
    spec = SpecConfig(num_steps=num_steps, topk=topk, num_draft_tokens=n_draft)
    gen = BatchGenerator(world, spec, seed=topk * 10 + num_steps)
    batch = gen.draft_decode(3)
    rpi, seq_lens, r2t = batch.req_pool_indices, batch.seq_lens, world.req_to_token
    kv_indptr, kv_indices = run_draft(rpi, r2t, seq_lens, topk, num_steps, 3 * topk * L)
    check_draft(kv_indptr, kv_indices, rpi, r2t, seq_lens, topk, num_steps)
    # independent of the ref: the last slot of row (r, k) at step i is where that row's draft
    # token of step i is written (batchgen's out_cache_loc)
    loc = batch.cache_loc_steps()  # [S, rows]
    for i in range(num_steps):
        ends = kv_indptr[i, 1 : 3 * topk + 1].long() - 1
        assert torch.equal(kv_indices[i, ends].long(), loc[i].long()), f"step {i}"


@pytest.mark.parametrize(
    "idx_dtype,indptr_dtype,lens_dtype",
    [(torch.int64, torch.int32, torch.int32), (torch.int32, torch.int64, torch.int64)],
    ids=["idx64-ptr32", "idx32-ptr64"],
)
def test_draft_decode_kv_indices_hand_built(idx_dtype, indptr_dtype, lens_dtype):
    gen = rng(4)
    r2t = torch.randint(0, 10_000, (6, 40), generator=gen, dtype=torch.int32)
    rpi = torch.tensor([4, 0, 2, 5, 1], dtype=lens_dtype)
    seq_lens = torch.tensor([7, 1, 0, 30, 13], dtype=lens_dtype)  # a 0-length prefix too
    topk, num_steps = 2, 3
    kv_indptr, kv_indices = run_draft(
        rpi, r2t, seq_lens, topk, num_steps, width=5 * topk * 40, idx_dtype=idx_dtype, indptr_dtype=indptr_dtype, extra_steps=1
    )
    check_draft(kv_indptr, kv_indices, rpi, r2t, seq_lens, topk, num_steps)


def test_draft_decode_never_writes_past_width():
    r2t = torch.arange(4 * 32, dtype=torch.int32).view(4, 32)
    rpi, seq_lens = torch.tensor([3, 1]), torch.tensor([10, 12])
    topk, num_steps, width = 2, 2, 30  # step 1 needs 2*22 + 2*2*2 = 52 > 30
    big = torch.full((num_steps, width + 16), POISON, dtype=torch.int64)
    kv_indptr = torch.full((num_steps, 5), POISON, dtype=torch.int32)
    draft_decode_kv_indices(rpi, r2t, seq_lens, big[:, :width], kv_indptr, topk=topk, num_steps=num_steps)
    _, ref_indices = draft_decode_kv_indices_ref(rpi, r2t, seq_lens, topk=topk, num_steps=num_steps)
    assert (big[:, width:] == POISON).all()
    for i in range(num_steps):
        assert torch.equal(big[i, :width], ref_indices[i][:width])


def test_draft_decode_used_len():
    assert draft_decode_used_len(10, 2, 3, 0) == 30 + 6
    assert draft_decode_used_len(10, 2, 3, 2) == 30 + 18
    assert draft_decode_used_len(0, 4, 1, 1) == 8


def test_draft_decode_errors_name_the_value():
    r2t = torch.zeros(4, 16, dtype=torch.int32)
    rpi, seq_lens = torch.tensor([0, 1]), torch.tensor([3, 4])
    kv_indices = torch.zeros(2, 64, dtype=torch.int64)
    kv_indptr = torch.zeros(2, 5, dtype=torch.int32)
    args = (rpi, r2t, seq_lens, kv_indices, kv_indptr)
    with pytest.raises(ValueError, match=r"kv_indptr\.shape"):
        draft_decode_kv_indices(*args, topk=3, num_steps=2)  # needs 2*3+1 = 7 columns
    with pytest.raises(ValueError, match=r"kv_indices\.shape\[0\]"):
        draft_decode_kv_indices(*args, topk=2, num_steps=3)
    with pytest.raises(ValueError, match=r"kv_indices\.dtype"):
        draft_decode_kv_indices(rpi, r2t, seq_lens, kv_indices.float(), kv_indptr, topk=2, num_steps=2)
    with pytest.raises(ValueError, match=r"kv_indices\.shape"):
        draft_decode_kv_indices(rpi, r2t, seq_lens, kv_indices[0], kv_indptr, topk=2, num_steps=2)
    with pytest.raises(ValueError, match=r"req_pool_indices\.shape\[0\]"):
        draft_decode_kv_indices(rpi[:1], r2t, seq_lens, kv_indices, kv_indptr, topk=2, num_steps=2)
    with pytest.raises(ValueError, match="topk"):
        draft_decode_kv_indices(*args, topk=0, num_steps=2)
    with pytest.raises(ValueError, match="num_steps"):
        draft_decode_kv_indices(*args, topk=2, num_steps=True)
    assert (kv_indices == 0).all() and (kv_indptr == 0).all()


# ----------------------------------------------------------------------------------------------
# dispatch: one op per launch


def test_each_op_is_one_dispatched_op():
    case = make_case(0, [3, 5], [2, 4], mode="tree")
    r2t = torch.arange(64, dtype=torch.int32).view(4, 16)
    rpi, seq_lens = torch.tensor([2, 1]), torch.tensor([5, 3])
    kv_indices = torch.full((2, 64), POISON, dtype=torch.int64)
    kv_indptr = torch.full((2, 5), POISON, dtype=torch.int32)
    with RecordOps() as rec:
        extend_attention(**case)
    assert rec.names == ["refimpl.extend_attention.default"]
    with RecordOps() as rec:
        draft_decode_kv_indices(rpi, r2t, seq_lens, kv_indices, kv_indptr, topk=2, num_steps=2)
    assert rec.names == ["refimpl.draft_decode_kv_indices.default"]
    assert torch.isfinite(case["o_extend"]).all() and (kv_indptr != POISON).all()
