"""Split-KV decode attention and its split-count heuristic, in Triton ([facts#split-kv-decode]).

Each row's keys are cut into ``splits`` chunks: stage 1 (grid ``(T, head programs, max_kv_splits)``) writes a partial
attention and its log-sum-exp per chunk, stage 2 (grid ``(T, H)``) merges them. ``max_kv_splits`` (grid, loop, scratch)
is a Python int frozen at capture; ``num_kv_splits[b]`` is data that ``get_num_kv_splits`` rewrites before each replay.
Split s of a row: ``[s * per_split, ...)``, ``per_split = cdiv(cdiv(seq_len, clamp(num_kv_splits[b], 1, max_kv_splits)),
32) * 32``. Shapes: q [T, H, D], k_buffer / v_buffer [slots, Hkv, D / Dv], o [T, H, Dv], CSR kv_indptr / kv_indices,
float32 scratch attn_logits [>= T, H, max_kv_splits, Dv] / attn_lse [>= T, H, max_kv_splits], num_kv_splits [>= T]
int32. GQA: a stage-1 program serves ``G`` heads of one kv head (``H // Hkv`` if <= 16, else its largest divisor <= 16),
with ``tl.dot`` (IEEE fp32) when ``G > 1`` and ``D, Dv >= 16``.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import triton
import triton.language as tl
from torch import Tensor

from .. import _env
from ._checks import INDEX_DTYPES, check, check_float, check_int, check_paged_qkvo, check_tensor
from ._op import direct_launch, kernel_op, next_power_of_2, no_specialisation
from .bounds import guard_csr

MIN_BLOCK_KV = 32  # split ranges are multiples of this many keys ([facts#split-kv-decode])
BLOCK_N = 32  # keys per inner-loop iteration of stage 1 (divides MIN_BLOCK_KV)
MAX_HEADS_PER_PROGRAM = 16  # grouped stage 1: query heads sharing one kv load (BLOCK_H)
DOT_MIN = 16  # tl.dot needs every dim >= 16
_MIN_BLOCK_KV_C = tl.constexpr(MIN_BLOCK_KV)  # globals read inside @triton.jit must be constexpr


@triton.jit
def csr_range(indptr_ptr, i):
    """``(start, length)`` of entry i of a CSR ``indptr``, int64."""
    start = tl.load(indptr_ptr + i).to(tl.int64)
    return start, tl.load(indptr_ptr + i + 1).to(tl.int64) - start


@triton.jit
def _split_range(kv_indptr_ptr, num_kv_splits_ptr, b, MAX_KV_SPLITS: tl.constexpr):
    """Row b's ``(kv_start, seq_len, per_split)``, int64, as both stages see them."""
    kv_start, seq_len = csr_range(kv_indptr_ptr, b)
    # data, not shape: a count outside [1, MAX_KV_SPLITS] is clamped (more would leave keys no program covers)
    splits = tl.minimum(tl.maximum(tl.load(num_kv_splits_ptr + b).to(tl.int64), 1), MAX_KV_SPLITS)
    return kv_start, seq_len, tl.cdiv(tl.cdiv(seq_len, splits), _MIN_BLOCK_KV_C) * _MIN_BLOCK_KV_C


def outer_strides(*tensors: Tensor) -> list[int]:
    """Each tensor's strides but the last (1: ``check_tensor`` refuses another), in order: a kernel's stride arguments."""
    return [stride for t in tensors for stride in t.stride()[:-1]]


@triton.jit
def _matmul(a, b, USE_DOT: tl.constexpr):
    """``a [M, K] @ b [K, N]`` in float32: ``tl.dot`` (IEEE) or, where a dim is below ``DOT_MIN``, a broadcast sum."""
    if USE_DOT:
        out = tl.dot(a, b, input_precision="ieee")
    else:
        out = tl.sum(a[:, :, None] * b[None, :, :], 1)
    return out


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
    stride_qt,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_lt,
    stride_lh,
    stride_ls,
    stride_et,
    stride_eh,
    sm_scale,
    logit_cap,
    head_dim,
    v_head_dim,
    GROUP: tl.constexpr,  # H // Hkv
    HEADS: tl.constexpr,  # G: valid query heads per program (divides GROUP)
    BLOCK_H: tl.constexpr,  # pow2 >= HEADS (>= 16 when USE_DOT)
    BLOCK_D: tl.constexpr,  # pow2 >= D
    BLOCK_DV: tl.constexpr,  # pow2 >= Dv
    BLOCK_N: tl.constexpr,
    MAX_KV_SPLITS: tl.constexpr,
    USE_CAP: tl.constexpr,
    USE_DOT: tl.constexpr,
):
    b, hg, s = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64), tl.program_id(2)  # row, head group, split
    kv_start, seq_len, per_split = _split_range(kv_indptr_ptr, num_kv_splits_ptr, b, MAX_KV_SPLITS)
    split_start = s * per_split
    split_end = tl.minimum(split_start + per_split, seq_len)
    if split_end > split_start:  # empty split (incl. s >= splits): touch nothing
        heads = hg * HEADS + tl.arange(0, BLOCK_H)  # [BLOCK_H] query heads (int64; HEADS divides H: all < H)
        mask_h = tl.arange(0, BLOCK_H) < HEADS
        kv_head = hg * HEADS // GROUP  # shared by all heads of the program
        offs_d, offs_dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
        mask_d, mask_dv = offs_d < head_dim, offs_dv < v_head_dim
        q_ptrs = q_ptr + b * stride_qt + heads[:, None] * stride_qh + offs_d[None, :]  # [BLOCK_H, BLOCK_D]
        q = tl.load(q_ptrs, mask=mask_h[:, None] & mask_d[None, :], other=0.0).to(tl.float32)
        e_max = tl.full([BLOCK_H], float("-inf"), tl.float32)  # running max of logits
        e_sum = tl.zeros([BLOCK_H], tl.float32)  # running sum of exp(logit - e_max)
        acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)  # running sum of exp(...) * v
        # loop invariants, hoisted (the interpreter pays for every operation, every iteration)
        arange_n, mask_d2, mask_dv2 = tl.arange(0, BLOCK_N), mask_d[:, None], mask_dv[None, :]
        k_cols, v_cols = kv_head * stride_kh + offs_d[:, None], kv_head * stride_vh + offs_dv[None, :]  # [D, 1], [1, DV]
        for start in range(split_start, split_end, BLOCK_N):
            offs_n = start + arange_n  # [BLOCK_N] key positions in the row
            mask_n = offs_n < split_end
            slot = tl.load(kv_indices_ptr + kv_start + offs_n, mask=mask_n, other=0).to(tl.int64)  # cache rows
            k_t = tl.load(k_ptr + slot[None, :] * stride_ks + k_cols, mask=mask_d2 & mask_n[None, :], other=0.0).to(tl.float32)
            qk = _matmul(q, k_t, USE_DOT) * sm_scale  # [BLOCK_H, BLOCK_N]
            if USE_CAP:  # logit_cap * tanh(qk / logit_cap), tanh(x) = 2*sigmoid(2x) - 1
                qk = logit_cap * (2.0 * tl.sigmoid(2.0 * qk / logit_cap) - 1.0)
            qk = tl.where(mask_n[None, :], qk, float("-inf"))
            v = tl.load(v_ptr + slot[:, None] * stride_vs + v_cols, mask=mask_n[:, None] & mask_dv2, other=0.0).to(tl.float32)
            new_max = tl.maximum(e_max, tl.max(qk, 1))  # [BLOCK_H], finite: every block has a live key
            rescale = tl.exp(e_max - new_max)  # 0 on the first block (exp(-inf))
            p = tl.exp(qk - new_max[:, None])  # [BLOCK_H, BLOCK_N], 0 at masked keys
            acc = acc * rescale[:, None] + _matmul(p, v, USE_DOT)  # [BLOCK_H, BLOCK_DV]
            e_sum = e_sum * rescale + tl.sum(p, 1)
            e_max = new_max
        out_ptrs = logits_ptr + b * stride_lt + heads[:, None] * stride_lh + s * stride_ls + offs_dv[None, :]
        tl.store(out_ptrs, acc / e_sum[:, None], mask=mask_h[:, None] & mask_dv2)
        tl.store(lse_ptr + b * stride_et + heads * stride_eh + s, e_max + tl.log(e_sum), mask=mask_h)


@kernel_op("refimpl::decode_attention_stage1", mutates_args=("attn_logits", "attn_lse"))
def _decode_stage1_op(
    q: Tensor,
    k_buffer: Tensor,
    v_buffer: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    num_kv_splits: Tensor,
    attn_logits: Tensor,
    attn_lse: Tensor,
    max_kv_splits: int,
    sm_scale: float,
    logit_cap: float,
) -> None:
    (num_rows, num_heads, head_dim), v_head_dim = q.shape, v_buffer.shape[2]
    if num_rows == 0:  # shape, not data: an empty batch launches nothing
        return
    group = num_heads // k_buffer.shape[1]  # query heads per kv head
    # query heads per program: the group's largest divisor <= MAX_HEADS_PER_PROGRAM (the group itself if that small)
    heads = max(d for d in range(1, min(group, MAX_HEADS_PER_PROGRAM) + 1) if group % d == 0)
    use_dot = group > 1 and head_dim >= DOT_MIN and v_head_dim >= DOT_MIN
    strides = outer_strides(q, k_buffer, v_buffer, attn_logits, attn_lse)
    scalars = (sm_scale, logit_cap if logit_cap > 0 else 1.0, head_dim, v_head_dim)
    # GROUP, HEADS, BLOCK_H, BLOCK_D, BLOCK_DV, BLOCK_N, MAX_KV_SPLITS, USE_CAP, USE_DOT
    consts = (group, heads, max(next_power_of_2(heads), DOT_MIN if use_dot else 1), next_power_of_2(head_dim))
    consts += (next_power_of_2(v_head_dim), BLOCK_N, max_kv_splits, logit_cap > 0, use_dot)
    _decode_stage1_kernel[(num_rows, num_heads // heads, max_kv_splits)](
        q, k_buffer, v_buffer, kv_indptr, kv_indices, num_kv_splits, attn_logits, attn_lse, *strides, *scalars, *consts
    )


# stage 2: log-sum-exp merge of the splits
@triton.jit
def _decode_stage2_kernel(
    logits_ptr,  # [>= T, H, MAX_KV_SPLITS, Dv] float32
    lse_ptr,  # [>= T, H, MAX_KV_SPLITS] float32
    kv_indptr_ptr,  # [>= T+1]
    num_kv_splits_ptr,  # [>= T] int32
    o_ptr,  # [T, H, Dv], written
    stride_lt,
    stride_lh,
    stride_ls,
    stride_et,
    stride_eh,
    stride_ot,
    stride_oh,
    v_head_dim,
    BLOCK_DV: tl.constexpr,
    MAX_KV_SPLITS: tl.constexpr,
):
    b, h = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask_dv = offs_dv < v_head_dim
    m = float("-inf")  # running max of the split LSEs
    total = 0.0  # sum_s exp(lse_s - m)
    acc = tl.zeros([BLOCK_DV], tl.float32)  # sum_s exp(lse_s - m) * partial_s
    _, seq_len, per_split = _split_range(kv_indptr_ptr, num_kv_splits_ptr, b, MAX_KV_SPLITS)
    for s in range(MAX_KV_SPLITS):
        split_start = s * per_split
        if tl.minimum(split_start + per_split, seq_len) > split_start:  # exactly the splits stage 1 wrote
            lse = tl.load(lse_ptr + b * stride_et + h * stride_eh + s)
            part = tl.load(logits_ptr + b * stride_lt + h * stride_lh + s * stride_ls + offs_dv, mask=mask_dv, other=0.0)
            new_m = tl.maximum(m, lse)
            old_scale = tl.exp(m - new_m)  # 0 on the first live split
            weight = tl.exp(lse - new_m)
            acc = acc * old_scale + weight * part
            total = total * old_scale + weight
            m = new_m
    # seq_len 0: no live split, acc == 0 and total == 0 -> zeros (divide by 1, not 0); the store casts to o's dtype
    tl.store(o_ptr + b * stride_ot + h * stride_oh + offs_dv, acc / tl.where(total > 0, total, 1.0), mask=mask_dv)


@kernel_op("refimpl::decode_attention_stage2", mutates_args=("o",))
def _decode_stage2_op(
    attn_logits: Tensor, attn_lse: Tensor, kv_indptr: Tensor, num_kv_splits: Tensor, o: Tensor, max_kv_splits: int
) -> None:
    num_rows, num_heads, v_head_dim = o.shape
    if num_rows == 0:
        return
    _decode_stage2_kernel[(num_rows, num_heads)](  # ..., BLOCK_DV, MAX_KV_SPLITS
        attn_logits,
        attn_lse,
        kv_indptr,
        num_kv_splits,
        o,
        *outer_strides(attn_logits, attn_lse, o),
        v_head_dim,
        next_power_of_2(v_head_dim),
        max_kv_splits,
    )


def check_kernel_args(sm_scale, logit_cap, names: str, *tensors) -> None:
    """The decode and extend kernels' shared checks: each tensor (``names``: theirs, space-separated) in a dtype the
    interpreter computes right (CPU: no bf16), ``sm_scale`` a finite Python float, ``logit_cap`` (the tanh cap) one >= 0
    (0 = off)."""
    for name, t in zip(names.split(), tensors):
        _env.check_cpu_dtype(t, name)
    check_float(sm_scale, "sm_scale")
    check_float(logit_cap, "logit_cap")
    check(logit_cap >= 0, f"logit_cap={logit_cap!r}: must be >= 0 (0 = off)")


def decode_attention(
    q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse, num_kv_splits, max_kv_splits, sm_scale, logit_cap=0.0
) -> None:
    """Split-KV decode attention ``o[b, h] = softmax(q[b, h] . K_b^T * sm_scale) V_b`` (module docstring); ``logit_cap >
    0`` caps scaled logits with ``logit_cap * tanh(x / logit_cap)``; no keys: zeros. ``max_kv_splits`` a Python int,
    ``sm_scale`` / ``logit_cap`` Python floats."""
    num_rows, num_heads, _, _, v_head_dim = check_paged_qkvo(q, k_buffer, v_buffer, o)
    device = q.device
    check_kernel_args(sm_scale, logit_cap, "q k_buffer v_buffer o", q, k_buffer, v_buffer, o)
    check_int(max_kv_splits, "max_kv_splits", 1)
    check_tensor(kv_indptr, "kv_indptr", INDEX_DTYPES, 1, device)
    check(kv_indptr.shape[0] > num_rows, f"kv_indptr.shape[0]={kv_indptr.shape[0]}: must be >= T + 1 = {num_rows + 1}")
    check_tensor(kv_indices, "kv_indices", INDEX_DTYPES, 1, device)
    check_tensor(num_kv_splits, "num_kv_splits", (torch.int32,), 1, device)
    check(num_kv_splits.shape[0] >= num_rows, f"num_kv_splits.shape[0]={num_kv_splits.shape[0]}: must be >= T = {num_rows}")
    for name, t, tail in (("attn_logits", attn_logits, (v_head_dim,)), ("attn_lse", attn_lse, ())):  # [>= T, H, splits(, Dv)]
        check_tensor(t, name, (torch.float32,), 3 + len(tail), device)
        ok = t.shape[0] >= num_rows and t.shape[1:] == (num_heads, max_kv_splits, *tail)
        dims = f"{num_rows}, {num_heads}, max_kv_splits={max_kv_splits}{f', Dv={v_head_dim}' if tail else ''}"
        check(ok, f"{name}.shape={tuple(t.shape)}: must be [>= {dims}]")
    kv_indptr, kv_indices = guard_csr("decode_attention", kv_indptr, kv_indices, num_rows, k_buffer.shape[0])
    _decode_stage1_op(
        q,
        k_buffer,
        v_buffer,
        kv_indptr,
        kv_indices,
        num_kv_splits,
        attn_logits,
        attn_lse,
        max_kv_splits,
        float(sm_scale),
        float(logit_cap),
    )
    _decode_stage2_op(attn_logits, attn_lse, kv_indptr, num_kv_splits, o, max_kv_splits)


# split-count heuristic ([facts#split-count-heuristic])
@triton.jit
def split_counts(lens, live, token_grid, max_kv_splits, core_count):
    """The split-count heuristic ([facts#split-count-heuristic]) on int32 ``lens``, max / min over the ``live`` entries:
    int32 counts in ``[1, max_kv_splits]`` (dead entries too: callers mask them). The one source of its math, shared by
    ``_num_kv_splits_kernel`` and the fused graph-metadata kernel (``fused_metadata``)."""
    max_len = tl.maximum(tl.max(tl.where(live, lens, 0), 0), 1)  # clamp: len 0 rows
    min_len = tl.maximum(tl.min(tl.where(live, lens, max_len), 0), 1)
    min_len = tl.where(max_len * 8 < min_len * 10, max_len, min_len)  # within 25%
    # 1. enough splits that the longest row is cut to about the shortest one's length
    chunk_1 = tl.cdiv(max_len, tl.minimum(tl.cdiv(max_len, min_len), max_kv_splits))
    # 2. enough programs to fill the device, growing with log2 of the longest length (truncated toward zero)
    ext_cores = (core_count * tl.maximum(tl.log2(max_len.to(tl.float32) / 64.0), 1.0)).to(tl.int32)
    chunk_2 = tl.cdiv(max_len, tl.maximum(tl.minimum(tl.cdiv(ext_cores, token_grid), max_kv_splits), 1))
    splits = tl.maximum(tl.cdiv(lens, chunk_1), tl.cdiv(lens, chunk_2))
    return tl.minimum(tl.maximum(splits, 1), max_kv_splits).to(tl.int32)


@triton.jit(**no_specialisation(7, 2))  # direct_launch: one compiled kernel per (seq_lens dtype, MAX_NUM_SEQ, STATIC)
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
    splits = tl.full([MAX_NUM_SEQ], max_kv_splits, tl.int32)
    if not STATIC:
        splits = split_counts(
            tl.load(seq_lens_ptr + offs, mask=live, other=0).to(tl.int32), live, token_grid, max_kv_splits, core_count
        )
    for g in range(num_group):  # token index = seq * num_group + g
        tl.store(num_kv_splits_ptr + offs * num_group + g, splits, mask=live)


def split_grid(num_seq: int, num_group: int, num_heads, num_kv_heads, max_kv_splits, core_count) -> int:
    """Check the split-count heuristic's Python ints (``get_num_kv_splits``, ``fused_graph_metadata``) and return its
    ``token_grid``: stage-1 programs per split, as the heuristic counts them ([facts#split-count-heuristic]); MHA: one
    head each."""
    return num_seq * num_group * _programs_per_seq(num_heads, num_kv_heads, max_kv_splits, core_count)


@functools.lru_cache(maxsize=64, typed=True)  # a backend's constants: checked once (the replay hook calls this per replay)
def _programs_per_seq(num_heads, num_kv_heads, max_kv_splits, core_count) -> int:
    check_int(num_heads, "num_heads", 1)
    check_int(num_kv_heads, "num_kv_heads", 1)
    if num_heads % num_kv_heads:
        raise ValueError(f"num_kv_heads={num_kv_heads}: must divide num_heads={num_heads}")
    check_int(max_kv_splits, "max_kv_splits", 1)
    if type(core_count) is not int:
        raise ValueError(f"core_count={core_count!r}: must be an int (<= 0 means static mode)")
    return -(-num_heads // min(MAX_HEADS_PER_PROGRAM, num_heads // num_kv_heads))


@kernel_op("refimpl::num_kv_splits", mutates_args=("num_kv_splits",))
def _num_kv_splits_op(
    num_kv_splits: Tensor, seq_lens: Tensor, num_group: int, token_grid: int, max_kv_splits: int, core_count: int, static: bool
) -> None:
    num_seq = seq_lens.shape[0]
    if num_seq == 0:
        return
    consts = (next_power_of_2(num_seq), static or core_count <= 0)  # MAX_NUM_SEQ, STATIC
    args = (num_kv_splits, seq_lens, num_seq, num_group, token_grid, max_kv_splits, core_count, *consts)
    direct_launch(
        _num_kv_splits_kernel, (1,), args, (_num_kv_splits_kernel, seq_lens.device, seq_lens.dtype, *consts), seq_lens.device
    )


def get_num_kv_splits(num_kv_splits, seq_lens, *, num_group=1, num_heads, num_kv_heads, max_kv_splits, core_count, static=False):
    """Write per-token split counts into ``num_kv_splits[:num_seq * num_group]`` ([facts#split-count-heuristic]): token
    ``seq * num_group + g`` gets its sequence's count; ``static`` or ``core_count <= 0`` fills ``max_kv_splits``
    (``SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS``). One program, no host sync."""
    check_tensor(seq_lens, "seq_lens", INDEX_DTYPES, 1)
    check_tensor(num_kv_splits, "num_kv_splits", (torch.int32,), 1, seq_lens.device)
    check_int(num_group, "num_group", 1)
    grid = split_grid(seq_lens.shape[0], num_group, num_heads, num_kv_heads, max_kv_splits, core_count)
    if num_kv_splits.shape[0] < (want := seq_lens.shape[0] * num_group):
        raise ValueError(f"num_kv_splits.shape[0]={num_kv_splits.shape[0]}: must be >= num_seq * num_group = {want}")
    _num_kv_splits_op(num_kv_splits, seq_lens, num_group, grid, max_kv_splits, core_count, bool(static))


def get_num_kv_splits_ref(seq_lens_list, *, num_group=1, num_heads, num_kv_heads, max_kv_splits, core_count, static=False):
    """Pure-Python mirror of ``get_num_kv_splits``, one count per token (num_seq * num_group); the log2 step in float32
    (numpy) like the kernel, so the truncated ``ext_cores`` agrees bit for bit."""
    num_seq = len(seq_lens_list)
    if static or core_count <= 0 or num_seq == 0:
        return [max_kv_splits] * (num_seq * num_group)
    cdiv = lambda a, b: -(-a // b)
    max_len, min_len = max(max(seq_lens_list), 1), max(min(seq_lens_list), 1)
    if max_len * 8 < min_len * 10:
        min_len = max_len
    chunk_1 = cdiv(max_len, min(cdiv(max_len, min_len), max_kv_splits))  # step 1 (split_counts)
    ext_cores = int(np.float32(core_count) * max(np.log2(np.float32(max_len) / np.float32(64)), 1))
    token_grid = split_grid(num_seq, num_group, num_heads, num_kv_heads, max_kv_splits, core_count)
    chunk_2 = cdiv(max_len, max(min(cdiv(ext_cores, token_grid), max_kv_splits), 1))  # step 2
    return [min(max(cdiv(n, chunk_1), cdiv(n, chunk_2), 1), max_kv_splits) for n in seq_lens_list for _ in range(num_group)]
