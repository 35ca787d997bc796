"""Tests for refimpl.kernels: index builders vs references, attention ops vs the fp64 oracle,
poisoning (unread cache slots / index tails), validation errors, and one-op-per-launch dispatch.

Shapes stay tiny: the Triton kernels run in the interpreter on CPU.
"""

import math

import pytest
import torch
import triton
from helpers import DEVICE, RecordOps, on_device, rng  # noqa: F401  (on_device: autouse)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from refs import block_table_to_kv_indices, relative_error

from refimpl.kernels import (
    KERNEL_OPS,
    build_block_table,
    build_block_table_ref,
    build_kv_indices,
    build_kv_indices_ref,
    dense_paged_attention,
    dense_paged_mla_attention,
    mha_oracle,
    mla_oracle,
)
from refimpl.kernels import attention as attention_mod

POISON = -7
# Bounds on relative_error(out, oracle) = ||out - ref|| / ||ref|| (float64), per output dtype:
# ~3x the worst error these tests measure (CPU, Triton interpreter): fp32 7.5e-8 dense,
# 7.3e-8 MLA (torch fp32 compute); fp16 1.2e-4..1.8e-4 dense, 1.5e-4..2.0e-4 MLA (the fp16
# output rounding, 2^-11 relative per element). Tight enough that a 1% sm_scale error fails
# (test_tolerance_catches_sm_scale_error: >= 8.7e-4 relative on these cases).
TOL = {torch.float32: 1e-6, torch.float16: 6e-4}
SM_SCALE = 0.3  # dense MHA/GQA tests
MLA_SM_SCALE = 0.05


# ----------------------------------------------------------------------------------------------
# helpers


def random_pool(gen, pool, L, num_slots):
    """req_to_token [pool, L] int32 of random token slots (values in [1, num_slots))."""
    return torch.randint(1, num_slots, (pool, L), generator=gen, dtype=torch.int32)


def paged_pool(gen, pool, L, page_size):
    """req_to_token whose rows are built from whole, aligned pages ([facts#memory-pools])."""
    pages_per_row = math.ceil(L / page_size)
    page_ids = torch.randperm(pool * pages_per_row, generator=gen) + 1  # page 0 reserved
    rows = page_ids.view(pool, pages_per_row, 1) * page_size + torch.arange(page_size)
    return rows.reshape(pool, -1)[:, :L].to(torch.int32).contiguous()


def csr_indptr(lens, dtype=torch.int32):
    indptr = torch.zeros(lens.numel() + 1, dtype=dtype)
    indptr[1:] = torch.cumsum(lens, 0)
    return indptr


# ----------------------------------------------------------------------------------------------
# CSR kv indices ([facts#csr-kv-index-builder])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dst_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("with_start", [False, True])
def test_build_kv_indices_matches_ref(seed, dst_dtype, with_start):
    gen = rng(seed)
    pool, L = 12, 80
    bs = int(torch.randint(1, 10, (1,), generator=gen))
    req_to_token = random_pool(gen, pool, L, 1000)
    rpi_dtype = torch.int64 if seed % 2 == 0 else torch.int32
    rpi = torch.randperm(pool, generator=gen)[:bs].to(rpi_dtype)
    start = torch.randint(0, 20, (bs,), generator=gen) if with_start else None
    room = L - (start if with_start else torch.zeros(bs, dtype=torch.int64))
    lens = (torch.rand(bs, generator=gen) * (room + 1)).long().clamp(max=room)  # [bs] <= room
    kv_indptr = csr_indptr(lens, torch.int64 if seed == 1 else torch.int32)
    total = int(lens.sum())
    kv_indices = torch.full((total + 9,), POISON, dtype=dst_dtype)

    build_kv_indices(req_to_token, rpi, lens, kv_indptr, kv_indices, kv_start_idx=start)

    expected = build_kv_indices_ref(req_to_token, rpi, lens, kv_start_idx=start)
    assert kv_indices.dtype == dst_dtype
    torch.testing.assert_close(kv_indices[:total].long(), expected, rtol=0, atol=0)
    assert (kv_indices[total:] == POISON).all(), "entries past kv_indptr[bs] were written"


def test_build_kv_indices_bs1_and_gaps_untouched():
    gen = rng(3)
    req_to_token = random_pool(gen, 4, 30, 500)
    # bs = 1
    lens = torch.tensor([17])
    out = torch.full((20,), POISON, dtype=torch.int64)
    build_kv_indices(req_to_token, torch.tensor([2]), lens, csr_indptr(lens), out)
    assert out[:17].tolist() == req_to_token[2, :17].tolist()
    assert (out[17:] == POISON).all()
    # a strided indptr (row i starts at i * 30, like the draft-decode layout): gaps stay POISON
    lens = torch.tensor([3, 0, 5], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 30, 60, 90], dtype=torch.int32)
    out = torch.full((90,), POISON, dtype=torch.int32)
    build_kv_indices(req_to_token, torch.tensor([1, 3, 0]), lens, kv_indptr, out)
    assert out[0:3].tolist() == req_to_token[1, :3].tolist()
    assert out[60:65].tolist() == req_to_token[0, :5].tolist()
    written = torch.zeros(90, dtype=torch.bool)
    written[0:3] = written[60:65] = True
    assert (out[~written] == POISON).all()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lens=st.lists(st.integers(0, 40), min_size=1, max_size=6), data=st.data())
def test_build_kv_indices_property(lens, data):
    pool, L = 8, 40
    req_to_token = torch.arange(pool * L, dtype=torch.int32).view(pool, L) + 1
    rpi = torch.tensor(data.draw(st.lists(st.integers(0, pool - 1), min_size=len(lens), max_size=len(lens))))
    lens_t = torch.tensor(lens)
    out = torch.full((sum(lens) + 3,), POISON, dtype=torch.int64)
    build_kv_indices(req_to_token, rpi, lens_t, csr_indptr(lens_t), out)
    assert out[: sum(lens)].tolist() == build_kv_indices_ref(req_to_token, rpi, lens_t).tolist()
    assert out[sum(lens) :].tolist() == [POISON] * 3


# ----------------------------------------------------------------------------------------------
# paged block table ([facts#block-table-builder])


@pytest.mark.parametrize("page_size", [1, 16, 32, 64, 128])
@pytest.mark.parametrize("fill", [-1, 1])
def test_build_block_table_matches_ref(page_size, fill):
    gen = rng(page_size)
    P = page_size
    lens = torch.tensor([P - 1, P, P + 1, 1, 2 * P + 1]).clamp(min=1)  # around page boundaries
    bs, pool = lens.numel(), 8
    L = 2 * P + 8
    req_to_token = paged_pool(gen, pool, L, P)
    rpi = torch.randperm(pool, generator=gen)[:bs]
    max_blocks = math.ceil(int(lens.max()) / P) + 2  # spare columns must stay untouched
    table = torch.full((bs + 2, max_blocks), fill, dtype=torch.int32)  # spare rows too
    before = table.clone()

    build_block_table(req_to_token, rpi, lens, table, P)

    expected = build_block_table_ref(req_to_token, rpi, lens, before, P)
    torch.testing.assert_close(table, expected, rtol=0, atol=0)
    for i, n in enumerate(lens.tolist()):
        assert (table[i, math.ceil(n / P) :] == fill).all(), f"row {i}: unwritten pages changed"
    assert (table[bs:] == fill).all(), "rows >= bs were written"
    assert table[2, 1] == req_to_token[rpi[2], P] // P  # len P+1: second page starts at P


def test_build_block_table_with_start_and_row_stride():
    gen = rng(7)
    P, pool, L = 16, 5, 96
    req_to_token = paged_pool(gen, pool, L, P)
    rpi, lens = torch.tensor([4, 1, 2]), torch.tensor([33, 16, 70], dtype=torch.int32)
    start = torch.tensor([16, 0, 32])
    wide = torch.full((3, 12), -1, dtype=torch.int32)
    table = wide[:, :4]  # row stride 12 > max_blocks 4; request 2 needs 5 pages > max_blocks
    build_block_table(req_to_token, rpi, lens, table, P, kv_start_idx=start)
    expected = build_block_table_ref(req_to_token, rpi, lens, torch.full((3, 4), -1, dtype=torch.int32), P, kv_start_idx=start)
    torch.testing.assert_close(table, expected, rtol=0, atol=0)
    assert table[0, 0] == req_to_token[4, 16] // P
    assert (wide[:, 4:] == -1).all(), "kernel wrote past max_blocks"


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_block_table_round_trip_matches_csr(page_size):
    gen = rng(11)
    P, pool, L = page_size, 6, 80
    req_to_token = paged_pool(gen, pool, L, P)
    lens = torch.tensor([1, P, 79, P + 1, 40]).clamp(max=L)
    rpi = torch.tensor([5, 0, 3, 1, 2])
    table = torch.full((5, math.ceil(L / P)), -1, dtype=torch.int32)
    build_block_table(req_to_token, rpi, lens, table, P)
    kv_indptr, kv_indices = block_table_to_kv_indices(table, lens, P)

    csr = torch.full((int(lens.sum()),), POISON, dtype=torch.int64)
    build_kv_indices(req_to_token, rpi, lens, csr_indptr(lens), csr)
    assert kv_indptr.tolist() == csr_indptr(lens).tolist()
    torch.testing.assert_close(kv_indices, csr, rtol=0, atol=0)


# ----------------------------------------------------------------------------------------------
# dense paged attention vs the fp64 oracle


def make_attention_case(seed, bs, q_per_req, H, Hkv, D, Dv, dtype, kv_lens, tree_mask=False):
    """Random q / caches / CSR over distinct cache slots (slot 0 and spares never read)."""
    gen = rng(seed)
    lens = torch.tensor(kv_lens, dtype=torch.int32)
    assert lens.numel() == bs
    total = int(lens.sum())
    num_slots = total + 10  # 10 slots nobody reads
    kv_indptr = csr_indptr(lens)
    kv_indices = torch.full((total + 6,), 0, dtype=torch.int64)  # tail past kv_indptr[bs]
    kv_indices[:total] = torch.randperm(num_slots - 1, generator=gen)[:total] + 1
    case = dict(
        q=torch.randn(bs * q_per_req, H, D, generator=gen).to(dtype),
        k_cache=torch.randn(num_slots, Hkv, D, generator=gen).to(dtype),
        v_cache=torch.randn(num_slots, Hkv, Dv, generator=gen).to(dtype),
        kv_indptr=kv_indptr,
        kv_indices=kv_indices,
        qo_indptr=torch.arange(bs + 1) * q_per_req,
    )
    if tree_mask:
        case["custom_mask"], case["mask_indptr"] = tree_mask_for(gen, lens.tolist(), q_per_req)
    return case


def tree_mask_for(gen, kv_lens, n):
    """Target-verify mask ([facts#target-verify-custom-mask]) per request: prefix all visible, the last n columns a random
    tree ancestry where every draft row sees itself (diagonal) and a subset of earlier drafts."""
    blocks = []
    for kv_len in kv_lens:
        assert kv_len >= n
        block = torch.ones(n, kv_len, dtype=torch.bool)
        tree = torch.rand(n, n, generator=gen) < 0.5
        tree = torch.tril(tree, diagonal=-1) | torch.eye(n, dtype=torch.bool)
        block[:, kv_len - n :] = tree
        blocks.append(block.flatten())
    mask = torch.cat(blocks)
    mask_indptr = torch.zeros(len(kv_lens) + 1, dtype=torch.int64)
    mask_indptr[1:] = torch.cumsum(torch.tensor([b.numel() for b in blocks]), 0)
    return mask, mask_indptr


def run_dense(case, q_per_req, max_kv_len, causal=False, mask_dtype=None, sm_scale=SM_SCALE):
    q = case["q"]
    out = torch.full((q.shape[0], q.shape[1], case["v_cache"].shape[-1]), 123.0, dtype=q.dtype)
    mask = case.get("custom_mask")
    if mask is not None and mask_dtype is not None:
        mask = mask.to(mask_dtype)
    dense_paged_attention(
        q,
        case["k_cache"],
        case["v_cache"],
        case["kv_indptr"],
        case["kv_indices"],
        out,
        sm_scale=sm_scale,
        max_kv_len=max_kv_len,
        q_per_req=q_per_req,
        custom_mask=mask,
        mask_indptr=case.get("mask_indptr"),
        causal=causal,
    )
    return out


def oracle_dense(case, causal=False):
    return mha_oracle(
        case["q"],
        case["k_cache"],
        case["v_cache"],
        case["qo_indptr"],
        case["kv_indptr"],
        case["kv_indices"],
        SM_SCALE,
        case.get("custom_mask"),
        case.get("mask_indptr"),
        causal,
    )


HEADS = [pytest.param(4, 2, id="gqa"), pytest.param(4, 4, id="mha")]
DTYPES = [torch.float32, torch.float16]


@pytest.mark.parametrize("H,Hkv", HEADS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_dense_decode_matches_oracle(H, Hkv, dtype):
    kv_lens = [5, 1, 0, 17, 9]  # includes an empty request -> zeros
    case = make_attention_case(0, 5, 1, H, Hkv, 16, 8, dtype, kv_lens)
    out = run_dense(case, q_per_req=1, max_kv_len=20)
    ref = oracle_dense(case)
    assert relative_error(out, ref) < TOL[dtype]
    assert (out[2] == 0).all(), "a request with no keys must write zeros"
    assert out.dtype == dtype


@pytest.mark.parametrize("H,Hkv", HEADS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.uint8])
def test_dense_tree_mask_matches_oracle(H, Hkv, dtype, mask_dtype):
    N = 4
    case = make_attention_case(1, 3, N, H, Hkv, 16, 16, dtype, [N + 3, N, N + 9], tree_mask=True)
    out = run_dense(case, q_per_req=N, max_kv_len=16, mask_dtype=mask_dtype)
    ref = oracle_dense(case)
    assert relative_error(out, ref) < TOL[dtype]
    unmasked = oracle_dense({k: v for k, v in case.items() if "mask" not in k})
    assert relative_error(unmasked, ref) > 1e-2, "mask had no effect: test cannot fail"


@pytest.mark.parametrize("H,Hkv", HEADS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_dense_causal_matches_oracle(H, Hkv, dtype):
    q_per_req = 3
    case = make_attention_case(2, 4, q_per_req, H, Hkv, 8, 8, dtype, [6, 3, 1, 11])
    out = run_dense(case, q_per_req=q_per_req, max_kv_len=12, causal=True)
    ref = oracle_dense(case, causal=True)
    assert relative_error(out, ref) < TOL[dtype]
    # kv_len 1 < q_per_req 3: the first two rows of request 2 see no key -> zeros
    assert (out[2 * q_per_req : 2 * q_per_req + 2] == 0).all()
    assert relative_error(out, oracle_dense(case)) > 1e-2, "causal had no effect"


@pytest.mark.parametrize("causal", [False, True])
def test_dense_ignores_poisoned_slots_and_index_tail(causal):
    N = 3
    case = make_attention_case(4, 3, N, 4, 2, 8, 8, torch.float32, [5, 3, 8], tree_mask=True)
    clean = run_dense(case, q_per_req=N, max_kv_len=10, causal=causal)
    total = int(case["kv_indptr"][-1])
    used = torch.zeros(case["k_cache"].shape[0], dtype=torch.bool)
    used[case["kv_indices"][:total]] = True
    case["k_cache"][~used] = float("nan")  # includes slot 0, the clamp target
    case["v_cache"][~used] = float("inf")
    case["kv_indices"][total:] = 10**6  # garbage past kv_indptr[bs]
    case["custom_mask"] = torch.cat([case["custom_mask"], torch.zeros(7, dtype=torch.bool)])
    poisoned = run_dense(case, q_per_req=N, max_kv_len=10, causal=causal)
    assert torch.isfinite(poisoned).all()
    torch.testing.assert_close(poisoned, clean, rtol=0, atol=0)
    assert relative_error(poisoned, oracle_dense(case, causal=causal)) < TOL[torch.float32]


# ----------------------------------------------------------------------------------------------
# MLA flavour


def make_mla_case(seed, kv_lens, q_per_req, H=4, rank=512, rope=64, dtype=torch.float32):
    gen = rng(seed)
    bs = len(kv_lens)
    base = make_attention_case(seed, bs, q_per_req, 1, 1, 1, 1, dtype, kv_lens)
    T, slots = bs * q_per_req, base["k_cache"].shape[0]
    return dict(
        q_nope=torch.randn(T, H, rank, generator=gen).to(dtype),
        q_rope=torch.randn(T, H, rope, generator=gen).to(dtype),
        kv_cache=(0.1 * torch.randn(slots, 1, rank + rope, generator=gen)).to(dtype),
        kv_indptr=base["kv_indptr"],
        kv_indices=base["kv_indices"],
        qo_indptr=base["qo_indptr"],
    )


def run_mla(case, q_per_req, mode, sm_scale=MLA_SM_SCALE):
    """dense_paged_mla_attention on ``case`` (mode: decode / causal / tree) and the fp64 oracle
    (always at MLA_SM_SCALE); returns (out, ref)."""
    dtype = case["q_nope"].dtype
    kv_lens = (case["kv_indptr"][1:] - case["kv_indptr"][:-1]).tolist()
    mask = mask_indptr = None
    if mode == "tree":
        mask, mask_indptr = tree_mask_for(rng(0), kv_lens, q_per_req)
    causal = mode == "causal"
    out = torch.zeros(case["q_nope"].shape, dtype=dtype)
    dense_paged_mla_attention(
        case["q_nope"],
        case["q_rope"],
        case["kv_cache"],
        case["kv_indptr"],
        case["kv_indices"],
        out,
        sm_scale=sm_scale,
        max_kv_len=12,
        q_per_req=q_per_req,
        custom_mask=mask,
        mask_indptr=mask_indptr,
        causal=causal,
    )
    ref = mla_oracle(
        case["q_nope"],
        case["q_rope"],
        case["kv_cache"],
        case["qo_indptr"],
        case["kv_indptr"],
        case["kv_indices"],
        MLA_SM_SCALE,
        mask,
        mask_indptr,
        causal,
    )
    return out, ref


@pytest.mark.parametrize("mode", ["decode", "causal", "tree"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_mla_matches_oracle(mode, dtype):
    q_per_req = 1 if mode == "decode" else 2
    case = make_mla_case(5, [4, 9, 2], q_per_req, dtype=dtype)
    out, ref = run_mla(case, q_per_req, mode)
    assert ref.shape == (3 * q_per_req, 4, 512)
    assert relative_error(out, ref) < TOL[dtype]


# ----------------------------------------------------------------------------------------------
# the tolerance is tight: a 1% error in sm_scale fails the same check (a 5e-3 bound let it pass)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("factor", [1.01, 0.99])
def test_tolerance_catches_sm_scale_error(dtype, factor):
    """The cases of test_dense_decode_matches_oracle (GQA) and test_mla_matches_oracle (decode):
    exact scale passes, a 1% scale error fails (measured: dense 4.0e-3, MLA 8.7e-4..8.9e-4)."""
    case = make_attention_case(0, 5, 1, 4, 2, 16, 8, dtype, [5, 1, 0, 17, 9])
    ref = oracle_dense(case)
    assert relative_error(run_dense(case, q_per_req=1, max_kv_len=20), ref) < TOL[dtype]
    wrong = run_dense(case, q_per_req=1, max_kv_len=20, sm_scale=SM_SCALE * factor)
    assert relative_error(wrong, ref) > TOL[dtype], "dense: a 1% sm_scale error passes"

    mla = make_mla_case(5, [4, 9, 2], 1, dtype=dtype)
    out, ref = run_mla(mla, 1, "decode")
    assert relative_error(out, ref) < TOL[dtype]
    wrong, _ = run_mla(mla, 1, "decode", sm_scale=MLA_SM_SCALE * factor)
    assert relative_error(wrong, ref) > TOL[dtype], "MLA: a 1% sm_scale error passes"


# ----------------------------------------------------------------------------------------------
# validation: ValueError naming the offending value


def test_index_builders_reject_bad_inputs():
    r2t = torch.zeros(4, 16, dtype=torch.int32)
    rpi, lens = torch.tensor([0, 1]), torch.tensor([3, 4])
    indptr, out = csr_indptr(lens), torch.zeros(7, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"kv_indices\.dtype=torch\.float32"):
        build_kv_indices(r2t, rpi, lens, indptr, out.float())
    with pytest.raises(ValueError, match=r"kv_indptr\.shape\[0\]=2: must be >= 3"):
        build_kv_indices(r2t, rpi, lens, indptr[:2], out)
    with pytest.raises(ValueError, match=r"req_pool_indices\.shape\[0\]=1"):
        build_kv_indices(r2t, rpi[:1], lens, indptr, out)
    with pytest.raises(ValueError, match=r"lens\.dtype=torch\.float32"):
        build_kv_indices(r2t, rpi, lens.float(), indptr, out)
    with pytest.raises(ValueError, match=r"req_to_token\.shape=\(64,\)"):
        build_kv_indices(r2t.flatten(), rpi, lens, indptr, out)
    table = torch.zeros(2, 4, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"block_table\.dtype=torch\.int64"):
        build_block_table(r2t, rpi, lens, table.long(), 4)
    with pytest.raises(ValueError, match=r"block_table\.shape\[0\]=1: must be >= bs=2"):
        build_block_table(r2t, rpi, lens, table[:1], 4)
    with pytest.raises(ValueError, match=r"page_size=0"):
        build_block_table(r2t, rpi, lens, table, 0)


def test_attention_rejects_bad_inputs():
    case = make_attention_case(0, 2, 2, 4, 2, 8, 8, torch.float32, [3, 4], tree_mask=True)
    q, k, v = case["q"], case["k_cache"], case["v_cache"]
    out = torch.zeros(4, 4, 8)
    ok = dict(sm_scale=1.0, max_kv_len=4, q_per_req=2)
    args = (case["kv_indptr"], case["kv_indices"])
    dense_paged_attention(q, k, v, *args, out, **ok)  # the baseline call is valid
    with pytest.raises(ValueError, match=r"q\.shape\[0\]=4: must equal bs \* q_per_req = 2 \* 3"):
        dense_paged_attention(q, k, v, *args, out, **{**ok, "q_per_req": 3})
    with pytest.raises(ValueError, match=r"k_cache\.shape\[1\]=3: must divide q\.shape\[1\]=4"):
        dense_paged_attention(q, k[:, :1].expand(-1, 3, -1), v, *args, out, **ok)
    with pytest.raises(ValueError, match=r"out\.shape=\(4, 4, 5\)"):
        dense_paged_attention(q, k, v, *args, out[..., :5], **ok)
    with pytest.raises(ValueError, match=r"kv_indices\.dtype=torch\.float32"):
        dense_paged_attention(q, k, v, args[0], args[1].float(), out, **ok)
    with pytest.raises(ValueError, match=r"q\.dtype=torch\.int64"):
        dense_paged_attention(q.long(), k, v, *args, out, **ok)
    with pytest.raises(ValueError, match=r"custom_mask\.dtype=torch\.float32"):
        dense_paged_attention(q, k, v, *args, out, **ok, custom_mask=case["custom_mask"].float(), mask_indptr=case["mask_indptr"])
    with pytest.raises(ValueError, match=r"mask_indptr is None"):
        dense_paged_attention(q, k, v, *args, out, **ok, custom_mask=case["custom_mask"])
    with pytest.raises(ValueError, match=r"max_kv_len=0"):
        dense_paged_attention(q, k, v, *args, out, **{**ok, "max_kv_len": 0})
    mla = make_mla_case(0, [3, 4], 2, rank=16, rope=4)
    mla_out = torch.zeros(4, 4, 16)
    with pytest.raises(ValueError, match=r"kv_cache\.shape=\(\d+, 1, 19\): must be"):
        dense_paged_mla_attention(mla["q_nope"], mla["q_rope"], mla["kv_cache"][..., :19], *args, mla_out, **ok)
    with pytest.raises(ValueError, match=r"out\.shape=\(4, 4, 20\)"):
        dense_paged_mla_attention(mla["q_nope"], mla["q_rope"], mla["kv_cache"], *args, torch.zeros(4, 4, 20), **ok)


# ----------------------------------------------------------------------------------------------
# dispatch: one op per launch, nothing leaks from inside


def test_each_kernel_is_one_dispatched_op():
    r2t = torch.arange(64, dtype=torch.int32).view(4, 16)
    rpi, lens = torch.tensor([2, 1]), torch.tensor([5, 9])
    indptr, kv_indices = csr_indptr(lens), torch.zeros(14, dtype=torch.int64)
    table = torch.full((2, 3), -1, dtype=torch.int32)
    case = make_attention_case(0, 2, 1, 4, 2, 8, 8, torch.float32, [3, 4])
    out = torch.zeros(2, 4, 8)
    mla = make_mla_case(0, [3, 4], 1, rank=16, rope=4)
    mla_out = torch.zeros(2, 4, 16)
    with RecordOps() as rec:
        build_kv_indices(r2t, rpi, lens, indptr, kv_indices)
        build_block_table(r2t, rpi, lens, table, 8)
        dense_paged_attention(
            case["q"],
            case["k_cache"],
            case["v_cache"],
            case["kv_indptr"],
            case["kv_indices"],
            out,
            sm_scale=1.0,
            max_kv_len=4,
            q_per_req=1,
        )
        dense_paged_mla_attention(
            mla["q_nope"],
            mla["q_rope"],
            mla["kv_cache"],
            mla["kv_indptr"],
            mla["kv_indices"],
            mla_out,
            sm_scale=1.0,
            max_kv_len=4,
            q_per_req=1,
        )
    expected = [name.replace("::", ".") + ".default" for name in KERNEL_OPS[:4]]  # the 4 above
    assert rec.names == expected, rec.names
    assert kv_indices.tolist() == build_kv_indices_ref(r2t, rpi, lens).tolist()  # it really ran
    assert (out != 0).any() and (mla_out != 0).any()


SYNC_OPS = ("aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.item")


@pytest.mark.parametrize("causal", [False, True])
def test_attention_body_has_no_host_sync(causal):
    """Run the op body's helpers under a recorder: no op that needs a device->host sync."""
    case = make_attention_case(0, 2, 2, 4, 2, 8, 8, torch.float32, [3, 4], tree_mask=True)
    with RecordOps() as rec:
        slots, key_ok, allowed = attention_mod._gather_window(
            case["kv_indptr"], case["kv_indices"], 6, 2, case["custom_mask"], case["mask_indptr"], causal
        )
        q5 = case["q"].view(2, 2, 2, 2, 8)
        attention_mod._masked_attention(q5, case["k_cache"][slots], case["v_cache"][slots], key_ok, allowed, 1.0)
    assert rec.names, "recorder saw nothing: test cannot fail"
    leaked = [n for n in rec.names if n.startswith(SYNC_OPS)]
    assert not leaked, leaked
    assert slots.shape == (2, 6) and allowed.shape == (2, 2, 6)  # fixed, data-independent


def test_kernel_ops_are_registered():
    for name in KERNEL_OPS:
        ns, op = name.split("::")
        assert hasattr(getattr(torch.ops, ns), op), name


# --- the static inputs' writer ---------------------------------------------------------------------
@pytest.mark.parametrize("label", ["decode", "idle", "target_verify", "draft_extend_v2", "draft_decode"])
def test_load_inputs_kernel_writes_what_its_reference_writes(label):
    """``launch_load_inputs`` (the Triton kernel: interpreted here, launched directly on CUDA from its second call on)
    against ``load_inputs_ref`` (what a CPU runs), every static tensor whole, for a full batch, padded ones and an idle
    one. The first call's sizes are 1, so a kernel compiled for them and reused later (a size specialised to 1) fails."""
    from refimpl.config import TREE
    from refimpl.graphs.inputs import StaticInputs
    from refimpl.kernels.inputs import launch_load_inputs, load_inputs_ref
    from refimpl.layout import KINDS

    kind, g = KINDS[label], torch.Generator().manual_seed(0)
    statics = [StaticInputs(kind, TREE, 8, 1, DEVICE) for _ in range(2)]
    rows, steps = statics[0].rows, statics[0].steps
    cases = [(0, 1), (0, 8), (0, 4)] if kind.mode.is_idle() else [(1, 1), (1, 8), (5, 8), (8, 8), (3, 4)]
    for raw_bs, bs in cases:
        n = raw_bs * rows
        src = [
            torch.randint(1, 1000, (size,), generator=g, device="cpu").to(DEVICE) for size in (n, n, raw_bs, raw_bs, steps * n)
        ]
        src[3] = src[3].int()
        for writer, inputs in zip((launch_load_inputs, load_inputs_ref), statics):
            writer(tuple(src), inputs._whole, bs, rows, steps, 7, 0, 0)
        names = ("input_ids", "positions", "req_pool_indices", "seq_lens", "out_cache_loc")
        for name, a, b in zip(names, *(inputs._whole for inputs in statics)):
            assert torch.equal(a, b), (label, raw_bs, bs, name, a.tolist(), b.tolist())
    # under a device-check verdict (per-program minima; NONE: no bad entry): a clean one loads the batch, a refused one
    # loads padded rows only and sets the record; a verdict longer than the kernel's step (VERDICT_BLOCK) is read whole
    from refimpl.kernels.inputs import VERDICT_BLOCK
    from refimpl.kernels.validation import NONE

    raw_bs, bs = (0, 4) if kind.mode.is_idle() else (3, 4)
    n = raw_bs * rows
    src = tuple(torch.randint(1, 1000, (k,), generator=g, device="cpu").to(DEVICE) for k in (n, n, raw_bs, raw_bs, steps * n))
    src = (*src[:3], src[3].int(), src[4])
    nv = VERDICT_BLOCK + 200
    for bad_at in (None, 0, nv - 1):
        verdict = torch.full((nv,), NONE, dtype=torch.int64, device=DEVICE)
        if bad_at is not None:
            verdict[bad_at] = 5
        records = [torch.full((1,), -1, dtype=torch.int32, device=DEVICE) for _ in statics]
        host = torch.arange(20, 20 + raw_bs, dtype=torch.int32, device=DEVICE)  # the batch's host lengths
        for writer, inputs, record in zip((launch_load_inputs, load_inputs_ref), statics, records):
            writer(src, inputs._whole, bs, rows, steps, 7, 0, 0, verdict, record, host)
        assert [int(r) for r in records] == [int(bad_at is not None)] * 2, (label, bad_at)
        for name, a, b in zip(names, *(inputs._whole for inputs in statics)):
            assert torch.equal(a, b), (label, bad_at, name, a.tolist(), b.tolist())
        if bad_at is not None:  # padded rows: the reserved request row, slot 0; each request at its host length
            assert statics[0].seq_lens[:bs].tolist() == host.tolist() + [7] * (bs - raw_bs)
            assert (statics[0].req_pool_indices[:bs] == 0).all() and (statics[0].out_cache_loc[: steps * bs * rows] == 0).all()


@pytest.mark.parametrize("n", [*range(-3, 70), 127, 128, 129, 1023, 1024, 1025, (1 << 40) - 1, 1 << 40, (1 << 40) + 1])
def test_host_cdiv_and_next_power_of_2_equal_tritons(n):
    """The launch wrappers' host helpers (kernels/_op.py) size blocks and grids exactly as Triton's own would."""
    from refimpl.kernels._op import cdiv, next_power_of_2

    assert next_power_of_2(n) == triton.next_power_of_2(n)
    assert all(cdiv(n, b) == triton.cdiv(n, b) for b in (1, 2, 3, 16, 64, 1000))
