"""Paged absorbed-MLA attention (Cutlass-MLA / TRTLLM-MLA stand-ins) and the fused TRTLLM-MLA metadata rebuild.

The real kernels (``sgl_kernel.cutlass_mla_decode``, FlashInfer's ``trtllm_batch_decode_with_kv_cache_mla``) need SM100;
the wrappers of those names keep the real argument lists, so on SM100 a backend calls the real one.
``mla_paged_attention``: q [bs, N, H, R + Rr], kv_cache [pages, P, R + Rr], block_table [>= bs, width] int32 (slot of t
= bt[i, t//P]*P + t%P), seq_lens [>= bs] (device data), out [bs, N, H, R]; key = the whole cache row (MQA), value = its
first R columns; row j of request i sees ``t < min(seq_lens[i], max_seq_len, width * P)`` with ``t < seq_lens[i] - N + j
+ 1``. ``max_seq_len`` is a Python int frozen at capture and keys past it are *not read*: the historical TRTLLM-MLA bug
(capturing with ``seq_lens.max()`` truncated longer sequences at replay; the fix captures with the context length L,
verify L + N). One table entry per key block of ``BLOCK_N``; float32 online softmax.

``trtllm_mla_graph_metadata``: the in-graph rebuild (https://github.com/sgl-project/sglang/pull/30807,
https://github.com/sgl-project/sglang/pull/31628): ``seq_lens_k = seq_lens + seqlen_offset``, ``block_table[i, p] =
req_to_token[rpi[i], p*P] // P`` for ``p < cdiv(seq_lens_k[i], P)`` within the width.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .. import _env
from ._checks import FLOAT_DTYPES, INDEX_DTYPES, check, check_float, check_int, check_tensor
from ._op import cdiv, kernel_op, next_power_of_2
from .bounds import guard_table
from .indices import pool_copy
from .triton_decode import outer_strides

BLOCK_N = 32  # keys per loop iteration; divides every supported page size (32, 64, 128)
MAX_HEADS_PER_PROGRAM = 16  # query heads sharing one key/value block load
DOT_MIN = 16  # tl.dot needs every dim >= 16: heads are padded to 16 rows, R and Rr >= 16
TRTLLM_PAGE_SIZES = (32, 64)  # what trtllm-gen MLA supports
TRTLLM_BLOCK_CONSTRAINT = 128  # trtllm-gen: width * P must be a multiple of 128
CUTLASS_PAGE_SIZE = 128  # what cutlass_mla_decode supports
CUTLASS_MAX_HEADS = 128


@triton.jit
def _mla_paged_kernel(
    q_ptr,  # [bs, N, H, R + RR]
    kv_ptr,  # [num_pages, PAGE_SIZE, R + RR]
    block_table_ptr,  # [>= bs, width] int32
    seq_lens_ptr,  # [>= bs] int32/int64
    out_ptr,  # [bs, N, H, R], written
    stride_qb,
    stride_qt,
    stride_qh,
    stride_kvp,
    stride_kvs,
    stride_bt,
    stride_ob,
    stride_ot,
    stride_oh,
    q_len,
    num_heads,
    width,
    max_seq_len,
    sm_scale,
    out_scale,
    R: tl.constexpr,  # kv_lora_rank (pow2 >= 16)
    RR: tl.constexpr,  # rope dim (pow2 >= 16)
    PAGE_SIZE: tl.constexpr,  # multiple of BLOCK_N
    HEADS: tl.constexpr,  # valid heads per program (<= 16)
    BLOCK_H: tl.constexpr,  # pow2 >= max(HEADS, 16)
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,  # "ieee": float32 inputs, cast to exact fp32 dots; "tf32": bf16/fp16 tensor-core dots
):
    row, hg = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)  # i * N + j, head group
    i, j = row // q_len, row % q_len  # request, query row within it
    seq_len = tl.load(seq_lens_ptr + i).to(tl.int64)
    # max_seq_len frozen at capture: keys past it unread; never a table entry past the width; causal, bottom-right
    # aligned (j < q_len: never past seq_len)
    end = tl.minimum(tl.minimum(max_seq_len, width * PAGE_SIZE), seq_len - q_len + j + 1)
    offs_hb = tl.arange(0, BLOCK_H)
    heads = hg * HEADS + offs_hb  # [BLOCK_H] int64 query heads
    mask_h = ((offs_hb < HEADS) & (heads < num_heads))[:, None]  # [BLOCK_H, 1]
    cols_r, cols_rr = tl.arange(0, R)[None, :], R + tl.arange(0, RR)[None, :]  # [1, R], [1, RR]: a cache row's parts
    q_rows = q_ptr + i * stride_qb + j * stride_qt + heads[:, None] * stride_qh  # [BLOCK_H, 1]
    q_nope = tl.load(q_rows + cols_r, mask=mask_h, other=0.0)  # [BLOCK_H, R]
    q_pe = tl.load(q_rows + cols_rr, mask=mask_h, other=0.0)  # [BLOCK_H, RR]
    bt_row = block_table_ptr + i * stride_bt
    e_max = tl.full([BLOCK_H], float("-inf"), tl.float32)  # running max of logits
    e_sum = tl.zeros([BLOCK_H], tl.float32)  # running sum of exp(logit - e_max)
    acc = tl.zeros([BLOCK_H, R], tl.float32)  # running sum of exp(...) * v
    arange_n = tl.arange(0, BLOCK_N)  # hoisted: a loop invariant
    if PRECISION == "ieee":  # cast once, not every block
        q_nope, q_pe = q_nope.to(tl.float32), q_pe.to(tl.float32)
    for start in range(0, end, BLOCK_N):  # end <= 0: no iteration, zeros
        # BLOCK_N divides PAGE_SIZE: the whole block lies in page start // P (start < end, so
        # the entry is below cdiv(end, P) <= width: never a stale or out-of-range entry)
        page = tl.load(bt_row + start // PAGE_SIZE).to(tl.int64)
        offs_n = start + arange_n  # [BLOCK_N] int64 positions
        mask_n = offs_n < end
        kv_rows = kv_ptr + page * stride_kvp + (offs_n % PAGE_SIZE)[:, None] * stride_kvs
        rows_ok = mask_n[:, None]
        kv = tl.load(kv_rows + cols_r, mask=rows_ok, other=0.0)  # [BLOCK_N, R]: key latent, value
        k_pe = tl.load(kv_rows + cols_rr, mask=rows_ok, other=0.0)
        if PRECISION == "ieee":
            kv, k_pe = kv.to(tl.float32), k_pe.to(tl.float32)
        qk = tl.dot(q_nope, tl.trans(kv), input_precision=PRECISION)  # [BLOCK_H, BLOCK_N], fp32 accumulation
        qk += tl.dot(q_pe, tl.trans(k_pe), input_precision=PRECISION)
        qk = tl.where(mask_n[None, :], qk * sm_scale, float("-inf"))
        new_max = tl.maximum(e_max, tl.max(qk, 1))  # [BLOCK_H], finite: every block has a live key
        rescale = tl.exp(e_max - new_max)  # 0 on the first block (exp(-inf))
        p = tl.exp(qk - new_max[:, None])  # [BLOCK_H, BLOCK_N], 0 at masked keys
        acc = acc * rescale[:, None] + tl.dot(p.to(kv.dtype), kv, input_precision=PRECISION)  # [BLOCK_H, R]
        e_sum = e_sum * rescale + tl.sum(p, 1)
        e_max = new_max
    out = acc / tl.where(e_sum > 0, e_sum, 1.0)[:, None] * out_scale  # no key: zeros
    out_ptrs = out_ptr + i * stride_ob + j * stride_ot + heads[:, None] * stride_oh
    tl.store(out_ptrs + cols_r, out, mask=mask_h)  # the store casts to out's dtype


@kernel_op("refimpl::mla_paged_attention", mutates_args=("out",))
def _mla_paged_attention_op(
    q: Tensor,
    kv_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    out: Tensor,
    max_seq_len: int,
    sm_scale: float,
    kv_lora_rank: int,
    out_scale: float = 1.0,
) -> None:
    bs, q_len, num_heads, head_dim = q.shape
    if bs * q_len * num_heads == 0:  # shape, not data: an empty batch launches nothing
        return
    heads = min(num_heads, MAX_HEADS_PER_PROGRAM)
    _mla_paged_kernel[(bs * q_len, cdiv(num_heads, heads))](
        q,
        kv_cache,
        block_table,
        seq_lens,
        out,
        *outer_strides(q, kv_cache, block_table, out),
        q_len,
        num_heads,
        block_table.shape[1],
        max_seq_len,
        sm_scale,
        out_scale,
        kv_lora_rank,  # R
        head_dim - kv_lora_rank,  # RR
        kv_cache.shape[1],  # PAGE_SIZE
        heads,
        max(next_power_of_2(heads), DOT_MIN),  # BLOCK_H
        BLOCK_N,
        "ieee" if torch.float32 in (q.dtype, kv_cache.dtype) else "tf32",  # PRECISION
        num_warps=4 if kv_lora_rank <= 128 else 8,
    )


def mla_paged_attention(q, kv_cache, block_table, seq_lens, out, max_seq_len, sm_scale, kv_lora_rank, out_scale=1.0):
    """Paged MLA attention into ``out`` (module docstring), returned. P a multiple of 32; R and Rr powers of two >= 16;
    ``width * P >= max_seq_len``. Table values are the caller's contract (graph-safe)."""
    check_tensor(q, "q", FLOAT_DTYPES, 4)
    (bs, q_len, num_heads, head_dim), device = q.shape, q.device
    for name, t, ndim in (("q", q, 4), ("kv_cache", kv_cache, 3), ("out", out, 4)):
        check_tensor(t, name, FLOAT_DTYPES, ndim, device)
        _env.check_cpu_dtype(t, name)
    check_tensor(block_table, "block_table", (torch.int32,), 2, device, min_len=bs)
    check_tensor(seq_lens, "seq_lens", INDEX_DTYPES, 1, device, min_len=bs)
    (_, page_size, kv_dim), width, rope = kv_cache.shape, block_table.shape[1], head_dim - kv_lora_rank
    check_int(kv_lora_rank, "kv_lora_rank", DOT_MIN)
    check(kv_lora_rank & (kv_lora_rank - 1) == 0, f"kv_lora_rank={kv_lora_rank}: must be a power of two")
    check(  # n & (n - 1) == 0: a power of two
        rope >= DOT_MIN and rope & (rope - 1) == 0,
        f"q.shape[-1]={head_dim}: the rope part q.shape[-1] - kv_lora_rank = {rope} must be a power of two >= {DOT_MIN}",
    )
    check(kv_dim == head_dim, f"kv_cache.shape[2]={kv_dim}: must equal q.shape[3]={head_dim}")
    check(
        page_size >= 1 and page_size % BLOCK_N == 0, f"kv_cache.shape[1]={page_size} (page size): must be a multiple of {BLOCK_N}"
    )
    want = (bs, q_len, num_heads, kv_lora_rank)
    check(out.shape == want, f"out.shape={tuple(out.shape)}: must be {want}")
    check_int(max_seq_len, "max_seq_len", 0)
    check(
        width * page_size >= max_seq_len,
        f"block_table.shape[1]={width} pages of {page_size} cover {width * page_size} positions < max_seq_len={max_seq_len}:"
        " the table is too narrow",
    )
    check_float(sm_scale, "sm_scale")
    check_float(out_scale, "out_scale")
    block_table = guard_table("mla_paged_attention", block_table, seq_lens, bs, max_seq_len, page_size, kv_cache.shape[0])
    _mla_paged_attention_op(q, kv_cache, block_table, seq_lens, out, max_seq_len, float(sm_scale), kv_lora_rank, float(out_scale))
    return out


def _check_standin(bs, device, table_name, table, seq_lens, workspace_name, workspace) -> None:
    """What both stand-ins check alike: an int32 page table ``[bs, width]`` and ``seq_lens [bs]``, and a workspace that
    is any tensor on ``device`` (its contents are the real kernel's business)."""
    for name, t, ndim in ((table_name, table, 2), ("seq_lens", seq_lens, 1)):
        check_tensor(t, name, (torch.int32,), ndim, device)
        check(t.shape[0] == bs, f"{name}.shape[0]={t.shape[0]}: must equal bs={bs}")
    if not isinstance(workspace, torch.Tensor):
        raise TypeError(f"{workspace_name} must be a torch.Tensor, got {type(workspace).__name__}")
    check(workspace.device == device, f"{workspace_name}.device={workspace.device}: must match {device}")


# the real kernels' interfaces (where the real kernel plugs in)
def trtllm_batch_decode_with_kv_cache_mla(
    query,
    kv_cache,
    workspace_buffer,
    qk_nope_head_dim,
    kv_lora_rank,
    qk_rope_head_dim,
    block_tables,
    seq_lens,
    max_seq_len,
    sparse_mla_top_k=0,
    out=None,
    bmm1_scale=1.0,
    bmm2_scale=1.0,
    sinks=None,
    skip_softmax_threshold_scale_factor=None,
    enable_pdl=None,
    backend="auto",
    is_var_seq=True,
    uses_shared_paged_kv_idx=True,
    lse=None,
    return_lse=False,
    cute_dsl_impl="auto",
    kv_scale_format="auto",
    cum_seq_lens_q=None,
    max_q_len=None,
    multi_ctas_kv_counter_buffer=None,
    sparse_mla_top_k_lens=None,
    enable_dcp=False,
    cp_world=1,
    cp_rank=0,
    causal_seqlens_kv_global=None,
    use_fp16_softmax=None,
    return_lse_base=None,
) -> torch.Tensor:  # [bs, N, H, kv_lora_rank]
    """Stand-in for FlashInfer's TRTLLM-gen MLA decode (FlashInfer 0.7.2's argument list): ``query [bs, N, H, R + Rr]``,
    ``kv_cache [pages, 1, P, R + Rr]`` (SGLang: ``k_buffer.view(-1, P, 576).unsqueeze(1)``), P in {32, 64},
    ``block_tables [bs, width] int32`` (``width * P`` % 128 == 0), ``seq_lens [bs] int32``; ``bmm1_scale`` = softmax
    scale, ``bmm2_scale`` scales the output. Unlike the real kernel: Python-float scales, no sparse MLA / ``sinks`` /
    log-sum-exp / ragged queries / context parallelism (0.7.2's new arguments must keep their defaults), ``enable_pdl``
    / ``backend`` / ``cute_dsl_impl`` / ``kv_scale_format`` / ``multi_ctas_kv_counter_buffer`` ignored, an omitted
    ``out`` in ``query.dtype``."""
    args = locals()  # the arguments by name
    for name in (
        "sinks skip_softmax_threshold_scale_factor lse cum_seq_lens_q max_q_len sparse_mla_top_k_lens"
        " causal_seqlens_kv_global use_fp16_softmax return_lse_base"
    ).split():
        check(args[name] is None, f"{name}={args[name]!r}: not implemented here (pass None)")
    flags = (is_var_seq, uses_shared_paged_kv_idx, return_lse, enable_dcp, cp_world, cp_rank)
    check(
        flags == (True, True, False, False, 1, 0),
        f"is_var_seq / uses_shared_paged_kv_idx / return_lse / enable_dcp / cp_world / cp_rank = {flags}: only the defaults"
        " (True, True, False, False, 1, 0) are implemented here",
    )
    check(sparse_mla_top_k == 0, f"sparse_mla_top_k={sparse_mla_top_k!r}: only dense MLA (0) is implemented here")
    check(isinstance(backend, str), f"backend={backend!r}: must be a str")
    check_tensor(query, "query", FLOAT_DTYPES, 4)
    (bs, q_len, num_heads, _), device = query.shape, query.device
    check_tensor(kv_cache, "kv_cache", FLOAT_DTYPES, None, device)
    check(
        kv_cache.dim() == 4 and kv_cache.shape[1] == 1,
        f"kv_cache.shape={tuple(kv_cache.shape)}: must be [num_pages, 1, page_size, R + Rr]",
    )
    page_size = kv_cache.shape[2]
    check(page_size in TRTLLM_PAGE_SIZES, f"page_size={page_size} (kv_cache.shape[2]): TRTLLM-MLA supports {TRTLLM_PAGE_SIZES}")
    for name in ("qk_nope_head_dim", "kv_lora_rank", "qk_rope_head_dim"):
        check_int(args[name], name, 1)
    want = kv_lora_rank + qk_rope_head_dim
    check(query.shape[3] == want, f"query.shape[3]={query.shape[3]}: must be kv_lora_rank + qk_rope_head_dim = {want}")
    check_float(bmm1_scale, "bmm1_scale")
    check_float(bmm2_scale, "bmm2_scale")
    _check_standin(bs, device, "block_tables", block_tables, seq_lens, "workspace_buffer", workspace_buffer)
    width = block_tables.shape[1]
    check(
        width * page_size % TRTLLM_BLOCK_CONSTRAINT == 0,
        f"block_tables.shape[1]={width} with page_size={page_size}: width * page_size must be a multiple of {TRTLLM_BLOCK_CONSTRAINT}",
    )
    check_int(max_seq_len, "max_seq_len", 0)
    if out is None:
        out = query.new_empty(bs, q_len, num_heads, kv_lora_rank)
    bound = min(max_seq_len, width * page_size)  # SGLang's verify passes L + N over a table of L
    return mla_paged_attention(query, kv_cache[:, 0], block_tables, seq_lens, out, bound, bmm1_scale, kv_lora_rank, bmm2_scale)


def cutlass_mla_decode(
    q_nope, q_pe, kv_c_and_k_pe_cache, seq_lens, page_table, workspace, sm_scale, num_kv_splits=1, out=None
) -> torch.Tensor:  # [bs, H, R]
    """Stand-in for ``sgl_kernel.cutlass_mla_decode`` (its argument list, plus ``out``), decode only: ``q_nope [bs, H,
    R]``, ``q_pe [bs, H, Rr]``, ``kv_c_and_k_pe_cache [pages, 128, R + Rr]``, ``seq_lens`` / ``page_table [bs, width]``
    int32; the bound is the table (``width * 128``); ``num_kv_splits`` does not change the result. One ``aten.cat`` of
    q_nope | q_pe, as the real wrapper copies into its padded query."""
    check_tensor(q_nope, "q_nope", FLOAT_DTYPES, 3)
    (bs, num_heads, rank), device = q_nope.shape, q_nope.device
    check_tensor(q_pe, "q_pe", FLOAT_DTYPES, 3, device)
    check(q_pe.dtype == q_nope.dtype, f"q_pe.dtype={q_pe.dtype}: must equal {q_nope.dtype}")
    check(q_pe.shape[:2] == (bs, num_heads), f"q_pe.shape={tuple(q_pe.shape)}: must start with {(bs, num_heads)} like q_nope")
    check(num_heads <= CUTLASS_MAX_HEADS, f"q_nope.shape[1]={num_heads} heads: Cutlass-MLA supports <= {CUTLASS_MAX_HEADS}")
    check_tensor(kv_c_and_k_pe_cache, "kv_c_and_k_pe_cache", FLOAT_DTYPES, 3, device)
    page_size = kv_c_and_k_pe_cache.shape[1]
    check(
        page_size == CUTLASS_PAGE_SIZE,
        f"page_size={page_size} (kv_c_and_k_pe_cache.shape[1]): Cutlass-MLA supports only {CUTLASS_PAGE_SIZE}",
    )
    _check_standin(bs, device, "page_table", page_table, seq_lens, "workspace", workspace)
    check(page_table.shape[1] >= 1, f"page_table.shape[1]={page_table.shape[1]}: must be >= 1")
    check(
        type(num_kv_splits) is int and (num_kv_splits >= 1 or num_kv_splits == -1),
        f"num_kv_splits={num_kv_splits!r}: must be an int >= 1 (or -1: automatic)",
    )
    if out is None:
        out = q_nope.new_empty(bs, num_heads, rank)
    check_tensor(out, "out", FLOAT_DTYPES, 3, device)  # its shape: mla_paged_attention's check, on out.unsqueeze(1)
    q = torch.cat([q_nope, q_pe], dim=-1).unsqueeze(1)  # [bs, 1, H, R + Rr]
    max_seq_len = page_table.shape[1] * CUTLASS_PAGE_SIZE  # the table is the bound
    mla_paged_attention(q, kv_c_and_k_pe_cache, page_table, seq_lens, out.unsqueeze(1), max_seq_len, sm_scale, rank)
    return out


# fused TRTLLM-MLA graph metadata (https://github.com/sgl-project/sglang/pull/30807): build_block_table's kernel, also
# writing seq_lens_k
@kernel_op("refimpl::trtllm_mla_graph_metadata", mutates_args=("block_table", "seq_lens_k"))
def _trtllm_mla_graph_metadata_op(
    req_pool_indices: Tensor,
    seq_lens: Tensor,
    req_to_token: Tensor,
    block_table: Tensor,
    seq_lens_k: Tensor,
    seqlen_offset: int,
    page_size: int,
) -> None:
    lens = seq_lens[: seq_lens_k.shape[0]]  # [bs]: bs = seq_lens_k.numel()
    pool_copy(req_to_token, req_pool_indices, lens, None, block_table, None, page_size, seq_lens_k, seqlen_offset)


def trtllm_mla_graph_metadata(req_pool_indices, seq_lens, req_to_token, block_table, seq_lens_k, *, seqlen_offset, page_size):
    """Rebuild TRTLLM-MLA graph metadata in one launch (module docstring), bs = ``seq_lens_k.numel()``; ``seqlen_offset``
    (0 decode / draft extend, N verify) is frozen at capture. Reads stay below L and writes inside the width whatever
    the values."""
    check_tensor(seq_lens_k, "seq_lens_k", INDEX_DTYPES, 1)
    device, bs = seq_lens_k.device, seq_lens_k.shape[0]
    check_tensor(req_pool_indices, "req_pool_indices", INDEX_DTYPES, 1, device)
    check_tensor(seq_lens, "seq_lens", INDEX_DTYPES, 1, device)
    check_tensor(req_to_token, "req_to_token", INDEX_DTYPES, 2, device)
    check_tensor(block_table, "block_table", (torch.int32,), 2, device)
    for name, t in (("req_pool_indices", req_pool_indices), ("seq_lens", seq_lens), ("block_table", block_table)):
        check(t.shape[0] >= bs, f"{name}.shape[0]={t.shape[0]}: must be >= bs={bs}")
    check_int(page_size, "page_size", 1)
    check(type(seqlen_offset) is int, f"seqlen_offset={seqlen_offset!r}: must be a Python int")
    _trtllm_mla_graph_metadata_op(req_pool_indices, seq_lens, req_to_token, block_table, seq_lens_k, seqlen_offset, page_size)
