"""Paged absorbed-MLA decode / verify attention (Cutlass-MLA and TRTLLM-MLA stand-ins) and the
fused TRTLLM-MLA graph-metadata rebuild, in Triton.

SGLang's Cutlass-MLA and TRTLLM-MLA backends attend over the absorbed-MLA latent cache through a
paged block table. The real kernels (``sgl_kernel.cutlass_mla_decode``, FlashInfer's
``trtllm_batch_decode_with_kv_cache_mla``) need SM100; this module runs one Triton kernel with
the same arguments on CPU (interpreter) and on Hopper. **Where the real kernel plugs in:** the
two wrappers ``cutlass_mla_decode`` and ``trtllm_batch_decode_with_kv_cache_mla`` below keep the
real argument lists (FlashInfer 0.6.0's for TRTLLM, sgl-kernel's plus ``out`` for Cutlass); on an
SM100 machine a backend calls the real function under the same name instead.

Shapes (bs = requests, N = query rows per request (1 decode, > 1 target verify / draft extend),
H = query heads, R = kv_lora_rank (512), Rr = rope dim (64), P = page size)::

    q            [bs, N, H, R + Rr]          float16 / bfloat16 / float32 (latent | rope)
    kv_cache     [num_pages, P, R + Rr]      a view of the [slots, 1, R + Rr] latent cache
    block_table  [>= bs, width] int32        page ids; slot of position t = bt[i, t//P]*P + t%P
    seq_lens     [>= bs] int32 / int64       kv length per request (device data, read at run time)
    out          [bs, N, H, R]               written, cast to out.dtype

    key of position t   = kv_cache row (all R + Rr columns), shared by all H heads (MQA)
    value of position t = its first R columns
    query row j of request i sees key t iff
        t < min(seq_lens[i], max_seq_len, width * P)        (max_seq_len: frozen Python int)
        and t < seq_lens[i] - N + j + 1                      (causal, bottom-right aligned)
    out[i, j, h] = out_scale * softmax_t(q[i, j, h] . k_t * sm_scale) v_t   (zeros: no key)

Graph safety. ``seq_lens`` is data: a replay sees new lengths. ``max_seq_len`` is a Python int:
a CUDA graph freezes it at capture, and keys at or past it are *not read*. That is the historical
TRTLLM-MLA bug: capturing with ``max_seq_len = seq_lens.max()`` silently truncated any longer
sequence at replay; the fix captures with the context length L (verify: L + N). The kernel
stops its key loop at the visible end, reads exactly one block-table entry per key block (so
never an entry at or past ``cdiv(min(seq_len, max_seq_len), P)``, nor past ``width``), and the
wrappers validate shapes / dtypes / devices / Python ints only (never tensor values).

Kernel: grid ``(bs * N, cdiv(H, 16))``; a program owns one query row and up to 16 heads (padded
to ``BLOCK_H >= 16`` rows for ``tl.dot``, masked) and walks the row's keys in blocks of
``BLOCK_N = 32`` (divides every supported P, so a block lies in one page: one table load per
block) with an online softmax, float32 accumulation, ``input_precision="ieee"``. Integer
addressing is int64.

Fused graph metadata (``trtllm_mla_graph_metadata``): SGLang records the TRTLLM-MLA replay
metadata rebuild *inside* the graph as one Triton launch
(https://github.com/sgl-project/sglang/pull/30807, https://github.com/sgl-project/sglang/pull/31628)::

    seq_lens_k[i]     = seq_lens[i] + seqlen_offset                         i < bs
    block_table[i, p] = req_to_token[req_pool_indices[i], p * P] // P       p < cdiv(seq_lens_k[i], P)

with stores masked by the table width; entries past a request's pages keep their values.

Every launch is one ``torch.library.custom_op`` (``refimpl::mla_paged_attention``,
``refimpl::trtllm_mla_graph_metadata``); ``*_ref`` functions are the pure-torch references.
"""

from __future__ import annotations

import torch

from .. import _env  # noqa: F401  (sets TRITON_INTERPRET before any @triton.jit)

# isort: split
import triton
import triton.language as tl

from ._checks import FLOAT_DTYPES as _FLOAT_DTYPES
from ._checks import INDEX_DTYPES as _INDEX_DTYPES
from ._checks import check as _check
from ._checks import check_float as _check_float
from ._checks import check_int as _check_int
from ._checks import check_tensor as _check_tensor
from ._op import kernel_op
from .indices import block_table_to_kv_indices, build_block_table_ref
from .oracle import mla_oracle

BLOCK_N = 32  # keys per loop iteration; divides every supported page size (32, 64, 128)
MAX_HEADS_PER_PROGRAM = 16  # query heads sharing one key/value block load
DOT_MIN = 16  # tl.dot needs every dim >= 16: heads are padded to 16 rows, R and Rr >= 16
METADATA_CHUNK = 4096  # positions covered per loop iteration of the metadata kernel
TRTLLM_PAGE_SIZES = (32, 64)  # what trtllm-gen MLA supports
TRTLLM_BLOCK_CONSTRAINT = 128  # trtllm-gen: width * P must be a multiple of 128
CUTLASS_PAGE_SIZE = 128  # what cutlass_mla_decode supports
CUTLASS_MAX_HEADS = 128


# ----------------------------------------------------------------------------------------------
# validation helpers (shapes / dtypes / devices / Python ints only: never tensor values)


def _is_pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


# ----------------------------------------------------------------------------------------------
# paged MLA attention


@triton.jit
def _mla_paged_kernel(
    q_ptr,  # [bs, N, H, R + RR]
    kv_ptr,  # [num_pages, PAGE_SIZE, R + RR]
    block_table_ptr,  # [>= bs, width] int32
    seq_lens_ptr,  # [>= bs] int32/int64
    out_ptr,  # [bs, N, H, R], written
    stride_qb, stride_qt, stride_qh,
    stride_kvp, stride_kvs,
    stride_bt,
    stride_ob, stride_ot, stride_oh,
    q_len, num_heads, width, max_seq_len,
    sm_scale, out_scale,
    R: tl.constexpr,  # kv_lora_rank (pow2 >= 16)
    RR: tl.constexpr,  # rope dim (pow2 >= 16)
    PAGE_SIZE: tl.constexpr,  # multiple of BLOCK_N
    HEADS: tl.constexpr,  # valid heads per program (<= 16)
    BLOCK_H: tl.constexpr,  # pow2 >= max(HEADS, 16)
    BLOCK_N: tl.constexpr,
    FP32_DOTS: tl.constexpr,  # float32 inputs: exact fp32 dots; bf16/fp16: tensor-core dots
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)  # = i * N + j
    hg = tl.program_id(1).to(tl.int64)  # head group
    i = row // q_len  # request
    j = row % q_len  # query row within the request
    seq_len = tl.load(seq_lens_ptr + i).to(tl.int64)
    end = tl.minimum(seq_len, max_seq_len)  # max_seq_len frozen at capture: keys past it unread
    end = tl.minimum(end, seq_len - q_len + j + 1)  # causal, bottom-right aligned
    end = tl.minimum(end, width * PAGE_SIZE)  # never a table entry past the width

    offs_hb = tl.arange(0, BLOCK_H)
    heads = hg * HEADS + offs_hb  # [BLOCK_H] int64 query heads
    mask_h = (offs_hb < HEADS) & (heads < num_heads)
    offs_r = tl.arange(0, R)
    offs_rr = tl.arange(0, RR)
    q_rows = q_ptr + i * stride_qb + j * stride_qt + heads[:, None] * stride_qh  # [BLOCK_H, 1]
    q_nope = tl.load(q_rows + offs_r[None, :], mask=mask_h[:, None], other=0.0)  # [BLOCK_H, R]
    q_pe = tl.load(q_rows + R + offs_rr[None, :], mask=mask_h[:, None], other=0.0)  # [BLOCK_H, RR]

    bt_row = block_table_ptr + i * stride_bt
    e_max = tl.full([BLOCK_H], float("-inf"), tl.float32)  # running max of logits
    e_sum = tl.zeros([BLOCK_H], tl.float32)  # running sum of exp(logit - e_max)
    acc = tl.zeros([BLOCK_H, R], tl.float32)  # running sum of exp(...) * v
    for start in range(0, end, BLOCK_N):  # end <= 0: no iteration, zeros
        # BLOCK_N divides PAGE_SIZE: the whole block lies in page start // P (start < end, so
        # the entry is below cdiv(end, P) <= width: never a stale or out-of-range entry)
        page = tl.load(bt_row + start // PAGE_SIZE).to(tl.int64)
        offs_n = start + tl.arange(0, BLOCK_N)  # [BLOCK_N] int64 positions
        mask_n = offs_n < end
        kv_rows = kv_ptr + page * stride_kvp + (offs_n % PAGE_SIZE)[:, None] * stride_kvs
        kv = tl.load(kv_rows + offs_r[None, :], mask=mask_n[:, None], other=0.0)
        # [BLOCK_N, R]: key latent part and value
        k_pe = tl.load(kv_rows + R + offs_rr[None, :], mask=mask_n[:, None], other=0.0)
        if FP32_DOTS:  # [BLOCK_H, BLOCK_N], fp32 accumulation either way
            kv = kv.to(tl.float32)
            qk = tl.dot(q_nope.to(tl.float32), tl.trans(kv), input_precision="ieee")
            qk += tl.dot(q_pe.to(tl.float32), tl.trans(k_pe.to(tl.float32)), input_precision="ieee")
        else:
            qk = tl.dot(q_nope, tl.trans(kv))
            qk += tl.dot(q_pe, tl.trans(k_pe))
        qk = tl.where(mask_n[None, :], qk * sm_scale, float("-inf"))
        # every block holds >= 1 live key, so new_max is finite
        new_max = tl.maximum(e_max, tl.max(qk, axis=1))  # [BLOCK_H]
        rescale = tl.exp(e_max - new_max)  # 0 on the first block (exp(-inf))
        p = tl.exp(qk - new_max[:, None])  # [BLOCK_H, BLOCK_N], 0 at masked keys
        if FP32_DOTS:
            pv = tl.dot(p, kv, input_precision="ieee")
        else:
            pv = tl.dot(p.to(kv.dtype), kv)  # [BLOCK_H, R], fp32 accumulation
        acc = acc * rescale[:, None] + pv
        e_sum = e_sum * rescale + tl.sum(p, axis=1)
        e_max = new_max

    out = acc / tl.where(e_sum > 0, e_sum, 1.0)[:, None] * out_scale  # no key: zeros
    out_ptrs = out_ptr + i * stride_ob + j * stride_ot + heads[:, None] * stride_oh
    tl.store(out_ptrs + offs_r[None, :], out.to(out_ptr.dtype.element_ty), mask=mask_h[:, None])


@kernel_op("refimpl::mla_paged_attention", mutates_args=("out",))
def _mla_paged_attention_op(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    max_seq_len: int,
    sm_scale: float,
    kv_lora_rank: int,
    out_scale: float = 1.0,
) -> None:
    bs, q_len, num_heads, head_dim = q.shape
    if bs * q_len * num_heads == 0:  # shape, not data: an empty batch launches nothing
        return
    page_size = kv_cache.shape[1]
    heads = min(num_heads, MAX_HEADS_PER_PROGRAM)
    block_h = max(triton.next_power_of_2(heads), DOT_MIN)
    grid = (bs * q_len, triton.cdiv(num_heads, heads))
    _mla_paged_kernel[grid](
        q, kv_cache, block_table, seq_lens, out,
        q.stride(0), q.stride(1), q.stride(2),
        kv_cache.stride(0), kv_cache.stride(1),
        block_table.stride(0),
        out.stride(0), out.stride(1), out.stride(2),
        q_len, num_heads, block_table.shape[1], max_seq_len,
        sm_scale, out_scale,
        R=kv_lora_rank,
        RR=head_dim - kv_lora_rank,
        PAGE_SIZE=page_size,
        HEADS=heads,
        BLOCK_H=block_h,
        BLOCK_N=BLOCK_N,
        FP32_DOTS=q.dtype == torch.float32 or kv_cache.dtype == torch.float32,
        num_warps=4 if kv_lora_rank <= 128 else 8,
    )  # fmt: skip


def mla_paged_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    max_seq_len: int,
    sm_scale: float,
    kv_lora_rank: int,
    out_scale: float = 1.0,
) -> torch.Tensor:
    """Paged MLA attention into ``out`` (shapes and mask rule in the module docstring); returns out.

    ``kv_cache`` is ``[num_pages, P, R + Rr]`` with P a multiple of 32; R = ``kv_lora_rank`` and
    Rr = ``q.shape[-1] - R`` powers of two >= 16. ``block_table`` must cover ``max_seq_len``
    (``width * P >= max_seq_len``). Values are the caller's contract (entries below
    ``cdiv(min(seq_lens[i], max_seq_len), P)`` are valid page ids); they are never checked, so
    the call is graph-safe. One ``refimpl::mla_paged_attention`` launch.
    """
    _check_tensor(q, "q", _FLOAT_DTYPES, 4, None)
    device = q.device
    _check_tensor(kv_cache, "kv_cache", _FLOAT_DTYPES, 3, device)
    _check_tensor(out, "out", _FLOAT_DTYPES, 4, device)
    _check_tensor(block_table, "block_table", (torch.int32,), 2, device)
    _check_tensor(seq_lens, "seq_lens", _INDEX_DTYPES, 1, device)
    for name, t in (("q", q), ("kv_cache", kv_cache), ("out", out)):
        _env.check_cpu_dtype(t, name)
    bs, q_len, num_heads, head_dim = q.shape
    num_pages, page_size, kv_dim = kv_cache.shape
    _check_int(kv_lora_rank, "kv_lora_rank", DOT_MIN)
    _check(_is_pow2(kv_lora_rank), f"kv_lora_rank={kv_lora_rank}: must be a power of two")
    rope = head_dim - kv_lora_rank
    _check(
        rope >= DOT_MIN and _is_pow2(rope),
        f"q.shape[-1]={head_dim}: the rope part q.shape[-1] - kv_lora_rank = {rope} must be a "
        f"power of two >= {DOT_MIN}",
    )
    _check(kv_dim == head_dim, f"kv_cache.shape[2]={kv_dim}: must equal q.shape[3]={head_dim}")
    _check(
        page_size >= 1 and page_size % BLOCK_N == 0,
        f"kv_cache.shape[1]={page_size} (page size): must be a multiple of {BLOCK_N}",
    )
    _check(block_table.shape[0] >= bs, f"block_table.shape[0]={block_table.shape[0]}: must be >= bs={bs}")
    _check(seq_lens.shape[0] >= bs, f"seq_lens.shape[0]={seq_lens.shape[0]}: must be >= bs={bs}")
    want = (bs, q_len, num_heads, kv_lora_rank)
    _check(tuple(out.shape) == want, f"out.shape={tuple(out.shape)}: must be {want}")
    _check_int(max_seq_len, "max_seq_len", 0)
    width = block_table.shape[1]
    _check(
        width * page_size >= max_seq_len,
        f"block_table.shape[1]={width} pages of {page_size} cover {width * page_size} positions "
        f"< max_seq_len={max_seq_len}: the table is too narrow",
    )
    _check_float(sm_scale, "sm_scale")
    _check_float(out_scale, "out_scale")
    _mla_paged_attention_op(
        q, kv_cache, block_table, seq_lens, out, max_seq_len, float(sm_scale), kv_lora_rank, float(out_scale)
    )
    return out


def mla_paged_attention_ref(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    sm_scale: float,
    kv_lora_rank: int,
    out_scale: float = 1.0,
) -> torch.Tensor:  # [bs, N, H, R] float64
    """What ``mla_paged_attention`` must write, in float64 (``mla_oracle`` over the table).

    Request i's keys are its first ``min(seq_lens[i], max_seq_len, width * P)`` positions
    (``block_table_to_kv_indices`` reads only the table entries those cover); query row j also
    needs ``t < seq_lens[i] - N + j + 1`` (causal, bottom-right aligned to the *untruncated*
    length, so it goes in as a custom mask). Host reads: never call inside a graph.
    """
    bs, q_len, num_heads, head_dim = q.shape
    page_size, rank = kv_cache.shape[1], kv_lora_rank
    device = q.device
    lens = seq_lens[:bs].to(torch.int64)  # [bs]
    cap = min(max_seq_len, block_table.shape[1] * page_size)
    visible = lens.clamp(max=cap).clamp(min=0)  # [bs] keys each request may read
    kv_indptr, kv_indices = block_table_to_kv_indices(block_table, visible, page_size)
    masks = []
    for n, n_k in zip(lens.tolist(), visible.tolist()):
        j = torch.arange(q_len, device=device)[:, None]  # [N, 1]
        t = torch.arange(n_k, device=device)[None, :]  # [1, n_k]
        masks.append((t < n - q_len + j + 1).flatten())  # [N * n_k]
    mask_indptr = torch.zeros(bs + 1, dtype=torch.int64, device=device)
    mask_indptr[1:] = torch.cumsum(visible * q_len, 0)
    custom_mask = torch.cat(masks) if masks else torch.zeros(0, dtype=torch.bool, device=device)
    qo_indptr = torch.arange(bs + 1, device=device) * q_len
    flat = q.reshape(bs * q_len, num_heads, head_dim)
    out = mla_oracle(
        flat[..., :rank], flat[..., rank:], kv_cache.reshape(-1, 1, head_dim),
        qo_indptr, kv_indptr, kv_indices, sm_scale, custom_mask, mask_indptr,
    )  # fmt: skip
    return out.view(bs, q_len, num_heads, rank) * out_scale


# ----------------------------------------------------------------------------------------------
# the real kernels' interfaces (where the real kernel plugs in)


def trtllm_batch_decode_with_kv_cache_mla(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    workspace_buffer: torch.Tensor,
    qk_nope_head_dim: int,
    kv_lora_rank: int,
    qk_rope_head_dim: int,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    sparse_mla_top_k: int = 0,
    out: torch.Tensor | None = None,
    bmm1_scale: float = 1.0,
    bmm2_scale: float = 1.0,
    sinks: list[torch.Tensor] | None = None,
    enable_pdl: bool | None = None,
    backend: str = "auto",
) -> torch.Tensor:  # [bs, N, H, kv_lora_rank]
    """Stand-in for FlashInfer's TRTLLM-gen MLA decode (same argument list as FlashInfer 0.6.0).

    ``query [bs, N, H, R + Rr]`` (N = 1 decode, N > 1 target verify / draft extend, causal among
    the N rows), ``kv_cache [pages, 1, P, R + Rr]`` (SGLang passes
    ``k_buffer.view(-1, P, 576).unsqueeze(1)``), P = ``kv_cache.shape[2]`` in {32, 64},
    ``block_tables [bs, width] int32`` with ``width * P`` a multiple of 128, ``seq_lens [bs]
    int32`` (device data, read at run time). ``max_seq_len`` is frozen by a graph capture: keys
    at or past it (or past the table) are not read. ``bmm1_scale`` is the softmax
    scale (SGLang: ``q_scale * k_scale * layer.scaling``), ``bmm2_scale`` multiplies the output.
    ``qk_nope_head_dim`` (128 for DeepSeek) only names the model; the real kernel insists on
    128 / 512 / 64, this one takes any R, Rr allowed by ``mla_paged_attention``. Differences
    from the real kernel: scales must be Python floats (no device scale tensors), no sparse MLA
    (``sparse_mla_top_k`` must be 0), no ``sinks``; ``enable_pdl`` / ``backend`` are ignored; an
    omitted ``out`` is allocated in ``query.dtype`` (the real one allocates bfloat16).
    """
    _check_tensor(query, "query", _FLOAT_DTYPES, 4, None)
    device = query.device
    if not isinstance(kv_cache, torch.Tensor):
        raise TypeError(f"kv_cache must be a torch.Tensor, got {type(kv_cache).__name__}")
    _check(
        kv_cache.dim() == 4 and kv_cache.shape[1] == 1,
        f"kv_cache.shape={tuple(kv_cache.shape)}: must be [num_pages, 1, page_size, R + Rr]",
    )
    page_size = kv_cache.shape[2]
    _check(
        page_size in TRTLLM_PAGE_SIZES,
        f"page_size={page_size} (kv_cache.shape[2]): TRTLLM-MLA supports {TRTLLM_PAGE_SIZES}",
    )
    if not isinstance(workspace_buffer, torch.Tensor):
        raise TypeError(f"workspace_buffer must be a torch.Tensor, got {type(workspace_buffer)}")
    _check(workspace_buffer.device == device, f"workspace_buffer.device={workspace_buffer.device}: must match {device}")
    _check_int(qk_nope_head_dim, "qk_nope_head_dim", 1)
    _check_int(kv_lora_rank, "kv_lora_rank", 1)
    _check_int(qk_rope_head_dim, "qk_rope_head_dim", 1)
    width_d = kv_lora_rank + qk_rope_head_dim
    _check(
        query.shape[3] == width_d,
        f"query.shape[3]={query.shape[3]}: must be kv_lora_rank + qk_rope_head_dim = {width_d}",
    )
    _check(sparse_mla_top_k == 0, f"sparse_mla_top_k={sparse_mla_top_k!r}: only dense MLA (0) is implemented here")
    _check(sinks is None, "sinks: attention sinks are not implemented here (pass None)")
    _check(isinstance(backend, str), f"backend={backend!r}: must be a str")
    for name, scale in (("bmm1_scale", bmm1_scale), ("bmm2_scale", bmm2_scale)):
        _check_float(scale, name)
    bs, q_len, num_heads, _ = query.shape
    _check_tensor(block_tables, "block_tables", (torch.int32,), 2, device)
    _check(
        block_tables.shape[0] == bs,
        f"block_tables.shape[0]={block_tables.shape[0]}: must equal bs={bs} (query.shape[0])",
    )
    width = block_tables.shape[1]
    _check(
        (width * page_size) % TRTLLM_BLOCK_CONSTRAINT == 0,
        f"block_tables.shape[1]={width} with page_size={page_size}: width * page_size must be a "
        f"multiple of {TRTLLM_BLOCK_CONSTRAINT}",
    )
    _check_int(max_seq_len, "max_seq_len", 0)
    _check_tensor(seq_lens, "seq_lens", (torch.int32,), 1, device)
    _check(seq_lens.shape[0] == bs, f"seq_lens.shape[0]={seq_lens.shape[0]}: must equal bs={bs}")
    if out is None:
        out = torch.empty(bs, q_len, num_heads, kv_lora_rank, dtype=query.dtype, device=device)
    # max_seq_len only bounds the lengths (SGLang's verify passes L + N over a table of L): no
    # key past the table is read either way
    bound = min(max_seq_len, width * page_size)
    return mla_paged_attention(
        query, kv_cache[:, 0], block_tables, seq_lens, out, bound, bmm1_scale, kv_lora_rank, bmm2_scale
    )


def cutlass_mla_decode(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    kv_c_and_k_pe_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    workspace: torch.Tensor,
    sm_scale: float,
    num_kv_splits: int = 1,
    out: torch.Tensor | None = None,
) -> torch.Tensor:  # [bs, H, R]
    """Stand-in for ``sgl_kernel.cutlass_mla_decode`` (its argument list, plus ``out``).

    ``q_nope [bs, H, R]``, ``q_pe [bs, H, Rr]``, ``kv_c_and_k_pe_cache [pages, 128, R + Rr]``
    (page size must be 128), ``seq_lens [bs] int32``, ``page_table [bs, width] int32``. The
    kernel has no ``max_seq_len``: its bound is the table, ``max_seq_len = width * 128``.
    Decode only (one query row per request). ``num_kv_splits`` (the real kernel's split-KV knob;
    SGLang passes 1 for graphs) does not change the result here. The real kernel wants fp16 /
    bf16, H <= 128 and R, Rr = 512, 64; this one also takes float32 (CPU) and smaller powers of
    two. It concatenates q_nope | q_pe (one ``aten.cat``), as the real wrapper copies into its
    128-head padded query.
    """
    _check_tensor(q_nope, "q_nope", _FLOAT_DTYPES, 3, None)
    device = q_nope.device
    _check_tensor(q_pe, "q_pe", _FLOAT_DTYPES, 3, device)
    _check(q_pe.dtype == q_nope.dtype, f"q_pe.dtype={q_pe.dtype}: must equal {q_nope.dtype}")
    _check_tensor(kv_c_and_k_pe_cache, "kv_c_and_k_pe_cache", _FLOAT_DTYPES, 3, device)
    bs, num_heads, rank = q_nope.shape
    _check(
        tuple(q_pe.shape[:2]) == (bs, num_heads),
        f"q_pe.shape={tuple(q_pe.shape)}: must start with {(bs, num_heads)} like q_nope",
    )
    _check(
        num_heads <= CUTLASS_MAX_HEADS,
        f"q_nope.shape[1]={num_heads} heads: Cutlass-MLA supports <= {CUTLASS_MAX_HEADS}",
    )
    page_size = kv_c_and_k_pe_cache.shape[1]
    _check(
        page_size == CUTLASS_PAGE_SIZE,
        f"page_size={page_size} (kv_c_and_k_pe_cache.shape[1]): Cutlass-MLA supports only {CUTLASS_PAGE_SIZE}",
    )
    _check_tensor(page_table, "page_table", (torch.int32,), 2, device)
    _check(
        page_table.shape[0] == bs, f"page_table.shape[0]={page_table.shape[0]}: must equal bs={bs} (q_nope.shape[0])"
    )
    _check(page_table.shape[1] >= 1, f"page_table.shape[1]={page_table.shape[1]}: must be >= 1")
    _check_tensor(seq_lens, "seq_lens", (torch.int32,), 1, device)
    _check(seq_lens.shape[0] == bs, f"seq_lens.shape[0]={seq_lens.shape[0]}: must equal bs={bs}")
    if not isinstance(workspace, torch.Tensor):
        raise TypeError(f"workspace must be a torch.Tensor, got {type(workspace).__name__}")
    _check(workspace.device == device, f"workspace.device={workspace.device}: must match {device}")
    ok = isinstance(num_kv_splits, int) and not isinstance(num_kv_splits, bool)
    _check(ok and (num_kv_splits >= 1 or num_kv_splits == -1),
           f"num_kv_splits={num_kv_splits!r}: must be an int >= 1 (or -1: automatic)")  # fmt: skip
    if out is None:
        out = torch.empty(bs, num_heads, rank, dtype=q_nope.dtype, device=device)
    _check_tensor(out, "out", _FLOAT_DTYPES, 3, device)
    want = (bs, num_heads, rank)
    _check(tuple(out.shape) == want, f"out.shape={tuple(out.shape)}: must be {want}")
    q = torch.cat([q_nope, q_pe], dim=-1).unsqueeze(1)  # [bs, 1, H, R + Rr]
    max_seq_len = page_table.shape[1] * CUTLASS_PAGE_SIZE  # the table is the bound
    mla_paged_attention(q, kv_c_and_k_pe_cache, page_table, seq_lens, out.unsqueeze(1), max_seq_len, sm_scale, rank)
    return out


# ----------------------------------------------------------------------------------------------
# fused TRTLLM-MLA graph metadata (https://github.com/sgl-project/sglang/pull/30807)


@triton.jit
def _trtllm_mla_graph_metadata_kernel(
    req_pool_indices_ptr,  # [>= bs] int32/int64
    seq_lens_ptr,  # [>= bs] int32/int64
    req_to_token_ptr,  # [pool, L] int32/int64
    block_table_ptr,  # [>= bs, width] int32, written
    seq_lens_k_ptr,  # [bs] int32/int64, written
    req_to_token_stride,
    block_table_stride,
    context_len,  # L
    width,
    seqlen_offset,
    pool,  # rows of req_to_token
    PAGE_SIZE: tl.constexpr,
    PAGES_PER_CHUNK: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64)  # one program per request
    n = tl.load(seq_lens_ptr + i).to(tl.int64) + seqlen_offset
    tl.store(seq_lens_k_ptr + i, n.to(seq_lens_k_ptr.dtype.element_ty))
    req_slot = tl.load(req_pool_indices_ptr + i).to(tl.int64)
    num_pages = tl.cdiv(n, PAGE_SIZE)
    num_pages = tl.minimum(num_pages, width)  # never write past the row
    num_pages = tl.minimum(num_pages, tl.cdiv(context_len, PAGE_SIZE))  # never read past it
    row_ok = (req_slot >= 0) & (req_slot < pool)  # an out-of-pool request reads nothing
    num_pages = tl.where(row_ok, num_pages, 0)
    req_slot = tl.where(row_ok, req_slot, 0)
    src_row = req_to_token_ptr + req_slot * req_to_token_stride
    dst_row = block_table_ptr + i * block_table_stride
    for c in range(tl.cdiv(num_pages, PAGES_PER_CHUNK)):
        p = c * PAGES_PER_CHUNK + tl.arange(0, PAGES_PER_CHUNK).to(tl.int64)  # [chunk] pages
        keep = p < num_pages
        first_slot = tl.load(src_row + p * PAGE_SIZE, mask=keep, other=0).to(tl.int64)
        tl.store(dst_row + p, (first_slot // PAGE_SIZE).to(tl.int32), mask=keep)


@kernel_op("refimpl::trtllm_mla_graph_metadata", mutates_args=("block_table", "seq_lens_k"))
def _trtllm_mla_graph_metadata_op(
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    req_to_token: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens_k: torch.Tensor,
    seqlen_offset: int,
    page_size: int,
) -> None:
    bs = seq_lens_k.shape[0]
    if bs == 0:
        return
    pages_per_chunk = max(1, METADATA_CHUNK // page_size)
    pages_per_chunk = 1 << (pages_per_chunk.bit_length() - 1)  # tl.arange needs a power of 2
    _trtllm_mla_graph_metadata_kernel[(bs,)](
        req_pool_indices, seq_lens, req_to_token, block_table, seq_lens_k,
        req_to_token.stride(0), block_table.stride(0),
        req_to_token.shape[1], block_table.shape[1], seqlen_offset, req_to_token.shape[0],
        PAGE_SIZE=page_size,
        PAGES_PER_CHUNK=pages_per_chunk,
    )  # fmt: skip


def trtllm_mla_graph_metadata(
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    req_to_token: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens_k: torch.Tensor,
    *,
    seqlen_offset: int,
    page_size: int,
) -> None:
    """Rebuild TRTLLM-MLA graph metadata in one launch (formula in the module docstring).

    bs = ``seq_lens_k.numel()``; writes ``seq_lens_k[:bs]`` and the first
    ``min(cdiv(seq_lens_k[i], P), width)`` entries of row i of ``block_table``; other entries
    keep their values. ``seqlen_offset`` is a Python int (0 decode / draft extend, N target
    verify), frozen at capture. The caller guarantees ``seq_lens_k[i] <= L`` and valid pool
    rows; reads are still bounded by L and writes by the width. Graph-safe (no value checks).
    """
    _check_tensor(seq_lens_k, "seq_lens_k", _INDEX_DTYPES, 1, None)
    device = seq_lens_k.device
    bs = seq_lens_k.shape[0]
    _check_tensor(req_pool_indices, "req_pool_indices", _INDEX_DTYPES, 1, device)
    _check_tensor(seq_lens, "seq_lens", _INDEX_DTYPES, 1, device)
    _check_tensor(req_to_token, "req_to_token", _INDEX_DTYPES, 2, device)
    _check_tensor(block_table, "block_table", (torch.int32,), 2, device)
    for name, t in (("req_pool_indices", req_pool_indices), ("seq_lens", seq_lens)):
        _check(t.shape[0] >= bs, f"{name}.shape[0]={t.shape[0]}: must be >= bs={bs}")
    _check(block_table.shape[0] >= bs, f"block_table.shape[0]={block_table.shape[0]}: must be >= bs={bs}")
    _check_int(page_size, "page_size", 1)
    ok = isinstance(seqlen_offset, int) and not isinstance(seqlen_offset, bool)
    _check(ok, f"seqlen_offset={seqlen_offset!r}: must be a Python int")
    _trtllm_mla_graph_metadata_op(
        req_pool_indices, seq_lens, req_to_token, block_table, seq_lens_k, seqlen_offset, page_size
    )


def trtllm_mla_graph_metadata_ref(
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    req_to_token: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens_k: torch.Tensor,
    *,
    seqlen_offset: int,
    page_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Expected ``(block_table, seq_lens_k)`` after the fused rebuild (copies; inputs untouched)."""
    bs = seq_lens_k.numel()
    lens_k = seq_lens_k.clone()
    lens_k[:] = (seq_lens[:bs].to(torch.int64) + seqlen_offset).to(seq_lens_k.dtype)
    table = build_block_table_ref(req_to_token, req_pool_indices, lens_k, block_table, page_size)
    return table, lens_k
