"""Split-KV decode attention and its split-count heuristic, in Triton ([facts#split-kv-decode]).

Decode has one query row per request (or per draft branch), so a plain "one program per (row,
head)" kernel launches only ``T * H`` programs. At small batch with long contexts that leaves
most of the GPU idle while each program walks thousands of keys. Split-KV cuts each row's key
range into ``splits`` chunks, computes a partial softmax-attention per chunk in parallel
(stage 1), then merges the partials with log-sum-exp weights (stage 2)::

    stage 1, grid (T, head programs, max_kv_splits):
        partial[b, h, s, :] = softmax(q[b, h] . K[chunk s]^T * sm_scale) V[chunk s]   # [Dv]
        lse[b, h, s]        = log sum_{n in chunk s} exp(q[b, h] . k_n * sm_scale)    # scalar
    stage 2, grid (T, H):
        o[b, h, :] = sum_s exp(lse[b, h, s] - LSE) * partial[b, h, s, :],
                     LSE = log sum_s exp(lse[b, h, s])

Why this is graph-safe: ``max_kv_splits`` is a Python int that sizes grid dim 3 of stage 1, the
split loop of stage 2 and the scratch buffers, so it is frozen when a CUDA graph captures the
launch. The per-row count ``num_kv_splits[b]`` is *data*, read by the kernels at run time, so
``get_num_kv_splits`` can rewrite it before every replay (outside the graph, on the device, no
host sync) and the same captured graph adapts to each batch's lengths. Programs whose split is
beyond the row's count, or whose key range is empty, return without touching memory.

Split boundaries (both stages use the same formula, ``MIN_BLOCK_KV = 32``)::

    seq_len   = kv_indptr[b+1] - kv_indptr[b]
    splits    = clamp(num_kv_splits[b], 1, max_kv_splits)
    per_split = cdiv(cdiv(seq_len, splits), 32) * 32
    split s   = [s * per_split, min((s+1) * per_split, seq_len))      # empty -> skipped

Shapes (T = query rows, H = query heads, Hkv = kv heads, D / Dv = key / value head dims)::

    q            [T, H, D]                       float16 / bfloat16 / float32
    k_buffer     [slots, Hkv, D]                 same family (cache, page size 1)
    v_buffer     [slots, Hkv, Dv]
    o            [T, H, Dv]                      written, cast to o.dtype
    kv_indptr    [>= T+1]  int32 / int64         row b's keys: kv_indices[indptr[b]:indptr[b+1]]
    kv_indices   [>= kv_indptr[T]] int32 / int64 cache slots (cast to int64 before addressing)
    attn_logits  [>= T, H, max_kv_splits, Dv]    float32 scratch (graph buffer, [facts#triton])
    attn_lse     [>= T, H, max_kv_splits]        float32 scratch
    num_kv_splits[>= T] int32                    per-row split count (data)

GQA: query head h reads kv head ``h // (H // Hkv)``. Stage 1 is the *grouped* variant: one
program handles ``G`` query heads of the same kv head and loads each key/value block once for
all of them. ``G = H // Hkv`` when that is <= 16, else the largest divisor of ``H // Hkv`` that is
<= 16 (so a program never straddles two kv heads). MHA (``H == Hkv``) has ``G = 1``. With ``G > 1``
and ``D, Dv >= 16`` the products use ``tl.dot`` (heads padded to 16 rows, fp32 inputs,
``input_precision="ieee"``); otherwise broadcast-multiply-and-sum. All arithmetic is float32.

Each kernel launch is one ``torch.library.custom_op`` (``refimpl::decode_attention_stage1``,
``refimpl::decode_attention_stage2``, ``refimpl::num_kv_splits``); the Python wrappers validate
shapes / dtypes / devices only (never tensor values), so they are safe to call inside a graph.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import _env  # noqa: F401  (sets TRITON_INTERPRET before any @triton.jit)

# isort: split
import triton
import triton.language as tl

from ._checks import INDEX_DTYPES as _INDEX_DTYPES
from ._checks import check as _check
from ._checks import check_int as _check_int
from ._checks import check_paged_qkvo
from ._checks import check_tensor as _check_tensor
from ._op import kernel_op

MIN_BLOCK_KV = 32  # split ranges are multiples of this many keys ([facts#split-kv-decode])
BLOCK_N = 32  # keys per inner-loop iteration of stage 1 (divides MIN_BLOCK_KV)
MAX_HEADS_PER_PROGRAM = 16  # grouped stage 1: query heads sharing one kv load (BLOCK_H)
DOT_MIN = 16  # tl.dot needs every dim >= 16
_MIN_BLOCK_KV_C = tl.constexpr(MIN_BLOCK_KV)  # globals read inside @triton.jit must be constexpr


def _heads_per_program(group: int) -> int:
    """Query heads one stage-1 program handles: a divisor of ``group`` that is <= 16."""
    if group <= MAX_HEADS_PER_PROGRAM:
        return group
    return max(d for d in range(1, MAX_HEADS_PER_PROGRAM + 1) if group % d == 0)


# ----------------------------------------------------------------------------------------------
# shared jit helpers


@triton.jit
def _split_range(kv_indptr_ptr, num_kv_splits_ptr, b, s, MAX_KV_SPLITS: tl.constexpr):
    """(kv_start, split_start, split_end) of split s of row b; empty when start >= end."""
    kv_start = tl.load(kv_indptr_ptr + b).to(tl.int64)
    seq_len = tl.load(kv_indptr_ptr + b + 1).to(tl.int64) - kv_start
    # Data, not shape: clamp a bad value instead of reading unwritten splits (stage 1 has only
    # MAX_KV_SPLITS programs per row, so a larger count would leave keys uncovered).
    splits = tl.load(num_kv_splits_ptr + b).to(tl.int64)
    splits = tl.minimum(tl.maximum(splits, 1), MAX_KV_SPLITS)
    per_split = tl.cdiv(tl.cdiv(seq_len, splits), _MIN_BLOCK_KV_C) * _MIN_BLOCK_KV_C
    split_start = s * per_split
    split_end = tl.minimum(split_start + per_split, seq_len)
    return kv_start, split_start, split_end


# ----------------------------------------------------------------------------------------------
# stage 1: partial attention per (row, head group, split)


@triton.jit
def _decode_stage1_kernel(
    q_ptr,  # [T, H, D]
    k_ptr,  # [slots, Hkv, D]
    v_ptr,  # [slots, Hkv, Dv]
    kv_indptr_ptr,  # [>= T+1] int32/int64
    kv_indices_ptr,  # [>= kv_indptr[T]] int32/int64
    num_kv_splits_ptr,  # [>= T] int32
    logits_ptr,  # [>= T, H, MAX_KV_SPLITS, Dv] float32, written
    lse_ptr,  # [>= T, H, MAX_KV_SPLITS] float32, written
    stride_qt, stride_qh,
    stride_ks, stride_kh,
    stride_vs, stride_vh,
    stride_lt, stride_lh, stride_ls,
    stride_et, stride_eh,
    sm_scale, logit_cap,
    num_heads, head_dim, v_head_dim,
    GROUP: tl.constexpr,  # H // Hkv
    HEADS: tl.constexpr,  # G: valid query heads per program (divides GROUP)
    BLOCK_H: tl.constexpr,  # pow2 >= HEADS (>= 16 when USE_DOT)
    BLOCK_D: tl.constexpr,  # pow2 >= D
    BLOCK_DV: tl.constexpr,  # pow2 >= Dv
    BLOCK_N: tl.constexpr,
    MAX_KV_SPLITS: tl.constexpr,
    USE_CAP: tl.constexpr,
    USE_DOT: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)  # query row
    hg = tl.program_id(1)  # head group
    s = tl.program_id(2)  # split
    kv_start, split_start, split_end = _split_range(kv_indptr_ptr, num_kv_splits_ptr, b, s, MAX_KV_SPLITS)
    if split_end > split_start:  # empty split (incl. s >= splits): touch nothing
        heads = hg * HEADS + tl.arange(0, BLOCK_H)  # [BLOCK_H] query heads
        mask_h = (tl.arange(0, BLOCK_H) < HEADS) & (heads < num_heads)
        kv_head = ((hg * HEADS) // GROUP).to(tl.int64)  # shared by all heads of the program
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        mask_d = offs_d < head_dim
        mask_dv = offs_dv < v_head_dim

        q_ptrs = q_ptr + b * stride_qt + heads[:, None] * stride_qh + offs_d[None, :]
        q = tl.load(q_ptrs, mask=mask_h[:, None] & mask_d[None, :], other=0.0).to(tl.float32)

        e_max = tl.full([BLOCK_H], float("-inf"), tl.float32)  # running max of logits
        e_sum = tl.zeros([BLOCK_H], tl.float32)  # running sum of exp(logit - e_max)
        acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)  # running sum of exp(...) * v
        for start in range(split_start, split_end, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)  # [BLOCK_N] key positions in the row
            mask_n = offs_n < split_end
            slot = tl.load(kv_indices_ptr + kv_start + offs_n, mask=mask_n, other=0)
            slot = slot.to(tl.int64)  # [BLOCK_N] cache rows
            k_ptrs = k_ptr + slot[None, :] * stride_ks + kv_head * stride_kh + offs_d[:, None]
            k_t = tl.load(k_ptrs, mask=mask_d[:, None] & mask_n[None, :], other=0.0)
            k_t = k_t.to(tl.float32)  # [BLOCK_D, BLOCK_N]
            if USE_DOT:
                qk = tl.dot(q, k_t, input_precision="ieee")  # [BLOCK_H, BLOCK_N]
            else:
                qk = tl.sum(q[:, :, None] * k_t[None, :, :], axis=1)  # [BLOCK_H, BLOCK_N]
            qk = qk * sm_scale
            if USE_CAP:  # logit_cap * tanh(qk / logit_cap), tanh(x) = 2*sigmoid(2x) - 1
                qk = logit_cap * (2.0 * tl.sigmoid(2.0 * qk / logit_cap) - 1.0)
            qk = tl.where(mask_n[None, :], qk, float("-inf"))

            v_ptrs = v_ptr + slot[:, None] * stride_vs + kv_head * stride_vh + offs_dv[None, :]
            v = tl.load(v_ptrs, mask=mask_n[:, None] & mask_dv[None, :], other=0.0)
            v = v.to(tl.float32)  # [BLOCK_N, BLOCK_DV]

            # every block holds >= 1 live key, so new_max is finite
            new_max = tl.maximum(e_max, tl.max(qk, axis=1))  # [BLOCK_H]
            rescale = tl.exp(e_max - new_max)  # 0 on the first block (exp(-inf))
            p = tl.exp(qk - new_max[:, None])  # [BLOCK_H, BLOCK_N], 0 at masked keys
            if USE_DOT:
                pv = tl.dot(p, v, input_precision="ieee")  # [BLOCK_H, BLOCK_DV]
            else:
                pv = tl.sum(p[:, :, None] * v[None, :, :], axis=1)  # [BLOCK_H, BLOCK_DV]
            acc = acc * rescale[:, None] + pv
            e_sum = e_sum * rescale + tl.sum(p, axis=1)
            e_max = new_max

        heads64 = heads.to(tl.int64)
        out_ptrs = logits_ptr + b * stride_lt + heads64[:, None] * stride_lh + s * stride_ls + offs_dv[None, :]
        tl.store(out_ptrs, acc / e_sum[:, None], mask=mask_h[:, None] & mask_dv[None, :])
        lse_ptrs = lse_ptr + b * stride_et + heads64 * stride_eh + s
        tl.store(lse_ptrs, e_max + tl.log(e_sum), mask=mask_h)


@kernel_op("refimpl::decode_attention_stage1", mutates_args=("attn_logits", "attn_lse"))
def _decode_stage1_op(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    num_kv_splits: torch.Tensor,
    attn_logits: torch.Tensor,
    attn_lse: torch.Tensor,
    max_kv_splits: int,
    sm_scale: float,
    logit_cap: float,
) -> None:
    num_rows, num_heads, head_dim = q.shape
    if num_rows == 0:  # shape, not data: an empty batch launches nothing
        return
    num_kv_heads, v_head_dim = k_buffer.shape[1], v_buffer.shape[2]
    group = num_heads // num_kv_heads
    heads = _heads_per_program(group)
    use_dot = group > 1 and head_dim >= DOT_MIN and v_head_dim >= DOT_MIN
    block_h = triton.next_power_of_2(heads)
    if use_dot:
        block_h = max(block_h, DOT_MIN)
    grid = (num_rows, num_heads // heads, max_kv_splits)
    _decode_stage1_kernel[grid](
        q, k_buffer, v_buffer, kv_indptr, kv_indices, num_kv_splits, attn_logits, attn_lse,
        q.stride(0), q.stride(1),
        k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1),
        attn_logits.stride(0), attn_logits.stride(1), attn_logits.stride(2),
        attn_lse.stride(0), attn_lse.stride(1),
        sm_scale, logit_cap if logit_cap > 0 else 1.0,
        num_heads, head_dim, v_head_dim,
        GROUP=group,
        HEADS=heads,
        BLOCK_H=block_h,
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_DV=triton.next_power_of_2(v_head_dim),
        BLOCK_N=BLOCK_N,
        MAX_KV_SPLITS=max_kv_splits,
        USE_CAP=logit_cap > 0,
        USE_DOT=use_dot,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# stage 2: log-sum-exp merge of the splits


@triton.jit
def _decode_stage2_kernel(
    logits_ptr,  # [>= T, H, MAX_KV_SPLITS, Dv] float32
    lse_ptr,  # [>= T, H, MAX_KV_SPLITS] float32
    kv_indptr_ptr,  # [>= T+1]
    num_kv_splits_ptr,  # [>= T] int32
    o_ptr,  # [T, H, Dv], written
    stride_lt, stride_lh, stride_ls,
    stride_et, stride_eh,
    stride_ot, stride_oh,
    v_head_dim,
    BLOCK_DV: tl.constexpr,
    MAX_KV_SPLITS: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask_dv = offs_dv < v_head_dim

    m = float("-inf")  # running max of the split LSEs
    total = 0.0  # sum_s exp(lse_s - m)
    acc = tl.zeros([BLOCK_DV], tl.float32)  # sum_s exp(lse_s - m) * partial_s
    for s in range(0, MAX_KV_SPLITS):
        _, split_start, split_end = _split_range(kv_indptr_ptr, num_kv_splits_ptr, b, s, MAX_KV_SPLITS)
        if split_end > split_start:  # exactly the splits stage 1 wrote
            lse = tl.load(lse_ptr + b * stride_et + h * stride_eh + s)
            part_ptrs = logits_ptr + b * stride_lt + h * stride_lh + s * stride_ls + offs_dv
            part = tl.load(part_ptrs, mask=mask_dv, other=0.0)
            new_m = tl.maximum(m, lse)
            old_scale = tl.exp(m - new_m)  # 0 on the first live split
            weight = tl.exp(lse - new_m)
            acc = acc * old_scale + weight * part
            total = total * old_scale + weight
            m = new_m
    # seq_len 0: no live split, acc == 0 and total == 0 -> zeros (divide by 1, not 0)
    out = acc / tl.where(total > 0, total, 1.0)
    o_ptrs = o_ptr + b * stride_ot + h * stride_oh + offs_dv
    tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=mask_dv)


@kernel_op("refimpl::decode_attention_stage2", mutates_args=("o",))
def _decode_stage2_op(
    attn_logits: torch.Tensor,
    attn_lse: torch.Tensor,
    kv_indptr: torch.Tensor,
    num_kv_splits: torch.Tensor,
    o: torch.Tensor,
    max_kv_splits: int,
) -> None:
    num_rows, num_heads, v_head_dim = o.shape
    if num_rows == 0:
        return
    _decode_stage2_kernel[(num_rows, num_heads)](
        attn_logits, attn_lse, kv_indptr, num_kv_splits, o,
        attn_logits.stride(0), attn_logits.stride(1), attn_logits.stride(2),
        attn_lse.stride(0), attn_lse.stride(1),
        o.stride(0), o.stride(1),
        v_head_dim,
        BLOCK_DV=triton.next_power_of_2(v_head_dim),
        MAX_KV_SPLITS=max_kv_splits,
    )  # fmt: skip


def decode_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    o: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    attn_logits: torch.Tensor,
    attn_lse: torch.Tensor,
    num_kv_splits: torch.Tensor,
    max_kv_splits: int,
    sm_scale: float,
    logit_cap: float = 0.0,
) -> None:
    """Split-KV decode attention: ``o[b, h] = softmax(q[b, h] . K_b^T * sm_scale) V_b``.

    Shapes in the module docstring. Launches stage 1 (``refimpl::decode_attention_stage1``,
    writes ``attn_logits`` / ``attn_lse`` rows ``< T`` of non-empty splits only) and stage 2
    (``refimpl::decode_attention_stage2``, writes ``o``). ``logit_cap > 0`` applies
    ``logit_cap * tanh(logit / logit_cap)`` after scaling. A row with no keys gets zeros.
    ``num_kv_splits[b]`` outside ``[1, max_kv_splits]`` is clamped into it (data: not checked).
    The caller guarantees ``kv_indptr`` is non-decreasing and ``kv_indices`` are valid slots.
    """
    num_rows, num_heads, _, _, v_head_dim = check_paged_qkvo(q, k_buffer, v_buffer, o)
    device = q.device
    for name, t in (("q", q), ("k_buffer", k_buffer), ("v_buffer", v_buffer), ("o", o)):
        _env.check_cpu_dtype(t, name)
    _check_int(max_kv_splits, "max_kv_splits", 1)
    _check(
        isinstance(sm_scale, (int, float)) and math.isfinite(sm_scale), f"sm_scale={sm_scale!r}: must be a finite float"
    )
    _check(
        isinstance(logit_cap, (int, float)) and math.isfinite(logit_cap) and logit_cap >= 0,
        f"logit_cap={logit_cap!r}: must be a finite float >= 0 (0 = off)",
    )

    _check_tensor(kv_indptr, "kv_indptr", _INDEX_DTYPES, 1, device)
    _check(
        kv_indptr.shape[0] >= num_rows + 1,
        f"kv_indptr.shape[0]={kv_indptr.shape[0]}: must be >= T + 1 = {num_rows + 1}",
    )
    _check_tensor(kv_indices, "kv_indices", _INDEX_DTYPES, 1, device)
    _check_tensor(num_kv_splits, "num_kv_splits", (torch.int32,), 1, device)
    _check(
        num_kv_splits.shape[0] >= num_rows,
        f"num_kv_splits.shape[0]={num_kv_splits.shape[0]}: must be >= T = {num_rows}",
    )

    _check_tensor(attn_logits, "attn_logits", (torch.float32,), 4, device)
    want = f"[>= {num_rows}, {num_heads}, max_kv_splits={max_kv_splits}, Dv={v_head_dim}]"
    _check(
        attn_logits.shape[0] >= num_rows and tuple(attn_logits.shape[1:]) == (num_heads, max_kv_splits, v_head_dim),
        f"attn_logits.shape={tuple(attn_logits.shape)}: must be {want}",
    )
    _check_tensor(attn_lse, "attn_lse", (torch.float32,), 3, device)
    _check(
        attn_lse.shape[0] >= num_rows and tuple(attn_lse.shape[1:]) == (num_heads, max_kv_splits),
        f"attn_lse.shape={tuple(attn_lse.shape)}: must be [>= {num_rows}, {num_heads}, max_kv_splits={max_kv_splits}]",
    )

    _decode_stage1_op(
        q, k_buffer, v_buffer, kv_indptr, kv_indices, num_kv_splits, attn_logits, attn_lse,
        max_kv_splits, float(sm_scale), float(logit_cap),
    )  # fmt: skip
    _decode_stage2_op(attn_logits, attn_lse, kv_indptr, num_kv_splits, o, max_kv_splits)


# ----------------------------------------------------------------------------------------------
# split-count heuristic ([facts#split-count-heuristic])


@triton.jit
def split_counts(lens, live, token_grid, max_kv_splits, core_count):
    """The split-count heuristic on a vector of lengths ([facts#split-count-heuristic]).

    ``lens`` int32 lengths, ``live`` which entries are real sequences (the max / min run over
    them only). Returns the per-entry split counts (int32, in ``[1, max_kv_splits]``; dead
    entries get a value too, which callers mask out). The one source of the heuristic's math:
    ``_num_kv_splits_kernel`` and the fused graph-metadata kernel
    (``refimpl.kernels.fused_metadata``) both call it.
    """
    max_len = tl.maximum(tl.max(tl.where(live, lens, 0), axis=0), 1)  # clamp: len 0 rows
    min_len = tl.maximum(tl.min(tl.where(live, lens, max_len), axis=0), 1)
    min_len = tl.where(max_len * 8 < min_len * 10, max_len, min_len)  # within 25%
    # 1. enough splits that the longest row is cut to about the shortest one's length
    splits_1 = tl.minimum(tl.cdiv(max_len, min_len), max_kv_splits)
    chunk_1 = tl.cdiv(max_len, splits_1)
    # 2. enough programs to fill the device, growing with log2 of the longest length
    ext = tl.maximum(tl.log2(max_len.to(tl.float32) / 64.0), 1.0)
    ext_cores = (core_count * ext).to(tl.int32)  # truncation toward zero
    splits_2 = tl.maximum(tl.minimum(tl.cdiv(ext_cores, token_grid), max_kv_splits), 1)
    chunk_2 = tl.cdiv(max_len, splits_2)
    splits = tl.maximum(tl.cdiv(lens, chunk_1), tl.cdiv(lens, chunk_2))
    return tl.minimum(tl.maximum(splits, 1), max_kv_splits).to(tl.int32)


@triton.jit
def _num_kv_splits_kernel(
    num_kv_splits_ptr,  # [>= num_seq * num_group] int32, written
    seq_lens_ptr,  # [num_seq] int32/int64
    num_seq,
    num_group,
    token_grid,  # programs per split of stage 1 (heuristic's view), computed on the host
    max_kv_splits,
    core_count,
    MAX_NUM_SEQ: tl.constexpr,
    STATIC: tl.constexpr,
):
    offs = tl.arange(0, MAX_NUM_SEQ)  # [MAX_NUM_SEQ] sequence index
    live = offs < num_seq
    if STATIC:
        splits = tl.full([MAX_NUM_SEQ], 0, tl.int32) + max_kv_splits
    else:
        lens = tl.load(seq_lens_ptr + offs, mask=live, other=0).to(tl.int32)
        splits = split_counts(lens, live, token_grid, max_kv_splits, core_count)
    for g in range(0, num_group):  # token index = seq * num_group + g
        tl.store(num_kv_splits_ptr + offs * num_group + g, splits.to(tl.int32), mask=live)


def _token_grid(num_seq: int, num_group: int, num_heads: int, num_kv_heads: int) -> int:
    """Stage-1 programs per split, as the heuristic counts them ([facts#split-count-heuristic])."""
    if num_heads == num_kv_heads:  # MHA
        return num_seq * num_group * num_heads
    heads_per_program = min(MAX_HEADS_PER_PROGRAM, num_heads // num_kv_heads)
    return num_seq * num_group * -(-num_heads // heads_per_program)


@kernel_op("refimpl::num_kv_splits", mutates_args=("num_kv_splits",))
def _num_kv_splits_op(
    num_kv_splits: torch.Tensor,
    seq_lens: torch.Tensor,
    num_group: int,
    num_heads: int,
    num_kv_heads: int,
    max_kv_splits: int,
    core_count: int,
    static: bool,
) -> None:
    num_seq = seq_lens.shape[0]
    if num_seq == 0:
        return
    _num_kv_splits_kernel[(1,)](
        num_kv_splits,
        seq_lens,
        num_seq,
        num_group,
        _token_grid(num_seq, num_group, num_heads, num_kv_heads),
        max_kv_splits,
        core_count,
        MAX_NUM_SEQ=triton.next_power_of_2(num_seq),
        STATIC=static or core_count <= 0,
    )


def get_num_kv_splits(
    num_kv_splits: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    num_group: int = 1,
    num_heads: int,
    num_kv_heads: int,
    max_kv_splits: int,
    core_count: int,
    static: bool = False,
) -> None:
    """Write per-token split counts into ``num_kv_splits[:num_seq * num_group]``.

    [facts#split-count-heuristic]

    ``num_seq = seq_lens.numel()``; token ``seq * num_group + g`` (g < num_group, e.g. topk
    draft branches) gets its sequence's count. ``static=True`` or ``core_count <= 0`` fills
    ``max_kv_splits`` (the ``SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS`` mode; reading the env
    flag is the caller's job). Every value lies in ``[1, max_kv_splits]``. One Triton program,
    no host sync: safe at replay time. Entries past ``num_seq * num_group`` are untouched.
    """
    _check_tensor(seq_lens, "seq_lens", _INDEX_DTYPES, 1, None)
    _check_tensor(num_kv_splits, "num_kv_splits", (torch.int32,), 1, None)
    _check(
        num_kv_splits.device == seq_lens.device,
        f"num_kv_splits.device={num_kv_splits.device}: must match seq_lens.device={seq_lens.device}",
    )
    _check_int(num_group, "num_group", 1)
    _check_int(num_heads, "num_heads", 1)
    _check_int(num_kv_heads, "num_kv_heads", 1)
    _check(num_heads % num_kv_heads == 0, f"num_kv_heads={num_kv_heads}: must divide num_heads={num_heads}")
    _check_int(max_kv_splits, "max_kv_splits", 1)
    _check(
        isinstance(core_count, int) and not isinstance(core_count, bool),
        f"core_count={core_count!r}: must be an int (<= 0 means static mode)",
    )
    num_tokens = seq_lens.shape[0] * num_group
    _check(
        num_kv_splits.shape[0] >= num_tokens,
        f"num_kv_splits.shape[0]={num_kv_splits.shape[0]}: must be >= num_seq * num_group = {num_tokens}",
    )
    _num_kv_splits_op(
        num_kv_splits, seq_lens, num_group, num_heads, num_kv_heads, max_kv_splits, core_count, bool(static)
    )


def get_num_kv_splits_ref(
    seq_lens_list: list[int],
    *,
    num_group: int = 1,
    num_heads: int,
    num_kv_heads: int,
    max_kv_splits: int,
    core_count: int,
    static: bool = False,
) -> list[int]:
    """Pure-Python mirror of ``get_num_kv_splits``: one count per token (num_seq * num_group).

    The log2 step is evaluated in float32 (numpy), like the kernel, so the truncated
    ``ext_cores`` agrees with it bit for bit on the interpreter.
    """
    num_seq = len(seq_lens_list)
    if static or core_count <= 0:
        return [max_kv_splits] * (num_seq * num_group)
    if num_seq == 0:
        return []
    cdiv = lambda a, b: -(-a // b)
    max_len = max(max(seq_lens_list), 1)
    min_len = max(min(seq_lens_list), 1)
    if max_len * 8 < min_len * 10:
        min_len = max_len
    splits_1 = min(cdiv(max_len, min_len), max_kv_splits)
    chunk_1 = cdiv(max_len, splits_1)
    ext = np.maximum(np.log2(np.float32(max_len) / np.float32(64.0)), np.float32(1.0))
    ext_cores = int(np.float32(core_count) * ext)
    token_grid = _token_grid(num_seq, num_group, num_heads, num_kv_heads)
    splits_2 = max(min(cdiv(ext_cores, token_grid), max_kv_splits), 1)
    chunk_2 = cdiv(max_len, splits_2)
    out = []
    for n in seq_lens_list:
        splits = max(cdiv(n, chunk_1), cdiv(n, chunk_2))
        out.extend([min(max(splits, 1), max_kv_splits)] * num_group)
    return out
