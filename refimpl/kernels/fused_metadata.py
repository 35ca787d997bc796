"""Fused Triton-backend graph metadata: one launch instead of four to seven ([facts#fused-and-in-graph-metadata]).

The unified replay hook's cumsum, CSR kernel ([facts#csr-kv-index-builder]) and split-count kernel
([facts#split-count-heuristic]), plus target verify's ``arange``, mask copy and ``mask_indptr`` cumsum, each cost more
host time than GPU work (~10-15 µs per Triton launch on an H200). Here one program per request writes ``kv_indptr = [0,
cumsum(lens)]``, the CSR ``kv_indices`` (``build_kv_indices``' bounds) and, decode: ``num_kv_splits`` (``split_counts``,
the same jit helper); verify: ``qo_indptr = [0, N, ..., bs*N]``, ``mask_indptr = [0, cumsum(N * (lens + N))]`` and the
optional mask copy. Every size is a shape or a Python int, so the call can also be *recorded* in a graph (the
``in_graph`` variant, like [facts#trtllm-mla-after-26665-and-after-29077]).
"""

from __future__ import annotations

import inspect

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._checks import INDEX_DTYPES, MASK_DTYPES, check, check_int, check_pool_inputs, check_tensor
from ._op import kernel_op, next_power_of_2
from .indices import CSR_BLOCK, copy_row, pool_row
from .triton_decode import split_counts, split_grid

MASK_BLOCK = 1024  # mask entries copied per loop iteration
_MASK_SRC = 8  # position of custom_mask_src in the op's arguments


@triton.jit
def _fused_graph_metadata_kernel(
    req_to_token_ptr,  # [pool, L] int32/int64, row stride = req_to_token_stride
    req_pool_indices_ptr,  # [>= bs] int32/int64
    seq_lens_ptr,  # [>= bs] int32/int64 (kv lengths: decode / prefix of verify)
    kv_indptr_ptr,  # [>= bs+1] int32/int64, written [0, bs]
    kv_indices_ptr,  # [out_len] int32/int64, written
    num_kv_splits_ptr,  # decode: [>= bs] int32, written (else None)
    qo_indptr_ptr,  # verify: [>= bs+1], written (else None)
    mask_indptr_ptr,  # verify: [>= bs+1], written (else None)
    mask_src_ptr,  # verify with a mask copy: [any] uint8 (a bool mask viewed as uint8; else None)
    mask_dst_ptr,  # verify with a mask copy: [any] uint8, written (else None)
    mask_len,  # min(mask source numel, mask buffer numel): copies stay inside both
    req_to_token_stride,
    pool,  # req_to_token.shape[0]: request rows outside [0, pool) are never read
    row_len,  # req_to_token.shape[1] = L: columns outside [0, L) are never read
    out_len,  # kv_indices.numel(): stores outside [0, out_len) are dropped
    bs,
    token_grid,  # decode: stage-1 programs per split (host, from shapes)
    max_kv_splits,
    core_count,
    num_draft_tokens,  # verify: N
    BLOCK_BS: tl.constexpr,  # next_power_of_2(bs)
    BLOCK: tl.constexpr,  # kv positions per loop iteration
    MASK_BLOCK: tl.constexpr,  # mask entries per loop iteration
    STATIC: tl.constexpr,  # decode: every count = max_kv_splits
):
    i = tl.program_id(0)  # one program per request
    offs = tl.arange(0, BLOCK_BS)  # [BLOCK_BS] request index
    live = offs < bs
    lens = tl.load(seq_lens_ptr + offs, mask=live, other=0).to(tl.int64)  # [BLOCK_BS]
    n = tl.load(seq_lens_ptr + i).to(tl.int64)
    before = offs < i  # (i < bs: only live requests)
    out_start = tl.sum(tl.where(before, lens, 0), 0)  # exclusive prefix: kv_indptr[i]
    zero = n * 0  # int64 scalar
    # (every store casts its value to the destination's dtype)
    if i == 0:
        tl.store(kv_indptr_ptr, zero)
    tl.store(kv_indptr_ptr + i + 1, out_start + n)
    if num_kv_splits_ptr is not None:  # decode (None pointers: resolved at compile time)
        if STATIC:
            mine = max_kv_splits
        else:
            splits = split_counts(lens.to(tl.int32), live, token_grid, max_kv_splits, core_count)
            mine = tl.sum(tl.where(offs == i, splits, 0), 0)  # this request's count
        tl.store(num_kv_splits_ptr + i, mine)
    if qo_indptr_ptr is not None:  # verify
        nd = zero + num_draft_tokens  # int64 (an int arg of 1 arrives as a constexpr)
        if i == 0:
            tl.store(qo_indptr_ptr, zero)
            tl.store(mask_indptr_ptr, zero)
        tl.store(qo_indptr_ptr + i + 1, (i + 1) * nd)
        mask_start = tl.sum(tl.where(before, nd * (lens + nd), 0), 0)  # mask_indptr[i]: blocks of N * (len + N)
        my_block = nd * (n + nd)
        tl.store(mask_indptr_ptr + i + 1, mask_start + my_block)
        if mask_src_ptr is not None:  # entries [mask_start, mask_start + my_block) inside both the source and the buffer
            q_lo, q_hi = tl.maximum(-mask_start, 0), tl.minimum(my_block, mask_len - mask_start)
            copy_row(mask_src_ptr + mask_start, mask_dst_ptr, mask_start, q_lo, q_hi, mask_len, MASK_BLOCK)
    # the CSR copy, with build_kv_indices' bounds ([facts#csr-kv-index-builder])
    row_ok, src_row = pool_row(req_to_token_ptr, req_pool_indices_ptr, i, pool, req_to_token_stride)
    copy_row(src_row, kv_indices_ptr, out_start, 0, tl.where(row_ok, tl.minimum(n, row_len), 0), out_len, BLOCK)  # <= L


@kernel_op(
    "refimpl::fused_graph_metadata",
    mutates_args=("kv_indptr", "kv_indices", "num_kv_splits", "qo_indptr", "mask_indptr", "custom_mask"),
)
def _fused_graph_metadata_op(
    req_to_token: Tensor,
    req_pool_indices: Tensor,
    seq_lens: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    num_kv_splits: Tensor | None,
    qo_indptr: Tensor | None,
    mask_indptr: Tensor | None,
    custom_mask_src: Tensor | None,
    custom_mask: Tensor | None,
    token_grid: int,
    max_kv_splits: int,
    core_count: int,
    static: bool,
    num_draft_tokens: int,
) -> None:
    bs = seq_lens.shape[0]
    if bs == 0:  # shape, not data: an empty batch launches nothing
        return
    mask_copy = (None, None, 0)  # (verify only: fused_graph_metadata_args drops the masks for decode)
    if custom_mask_src is not None:  # bool: viewed as uint8
        mask_copy = (
            custom_mask_src.view(torch.uint8),
            custom_mask.view(torch.uint8),
            min(custom_mask_src.numel(), custom_mask.numel()),
        )
    _fused_graph_metadata_kernel[(bs,)](
        req_to_token,
        req_pool_indices,
        seq_lens,
        kv_indptr,
        kv_indices,
        num_kv_splits,
        qo_indptr,
        mask_indptr,
        *mask_copy,
        req_to_token.stride(0),
        *req_to_token.shape,
        kv_indices.numel(),
        bs,
        token_grid,
        max_kv_splits,
        core_count,
        num_draft_tokens,
        next_power_of_2(bs),
        CSR_BLOCK,
        MASK_BLOCK,
        static or core_count <= 0,
    )


def fused_graph_metadata_args(
    req_to_token: Tensor,  # [pool, L] int32/int64
    req_pool_indices: Tensor,  # [>= bs] int32/int64
    seq_lens: Tensor,  # [bs] int32/int64: kv lengths (decode; verify: the prefix)
    kv_indptr: Tensor,  # [>= bs+1] int32/int64, written [0 : bs+1]
    kv_indices: Tensor,  # [any] int32/int64, written (bounded by its numel)
    *,
    num_kv_splits: Tensor | None = None,  # decode: [>= bs] int32, written [0 : bs]
    num_heads: int = 1,
    num_kv_heads: int = 1,
    max_kv_splits: int = 1,
    core_count: int = 0,
    static: bool = False,
    num_draft_tokens: int | None = None,  # target verify: N (+ qo / mask offsets, the optional mask copy)
    qo_indptr: Tensor | None = None,  # [>= bs+1] int32/int64, written [0 : bs+1]
    mask_indptr: Tensor | None = None,  # [>= bs+1] int32/int64, written [0 : bs+1]
    custom_mask_src: Tensor | None = None,  # [any] bool/uint8: the spec's flattened mask
    custom_mask: Tensor | None = None,  # [any] bool/uint8 graph buffer, written
) -> tuple:
    """Check ``fused_graph_metadata``'s arguments (this signature) and return the launch's argument tuple, for
    ``launch_fused_graph_metadata``."""
    bs, dev = check_pool_inputs(req_to_token, req_pool_indices, seq_lens, "seq_lens")
    check_tensor(kv_indptr, "kv_indptr", INDEX_DTYPES, 1, dev, min_len=bs + 1)
    check_tensor(kv_indices, "kv_indices", INDEX_DTYPES, 1, dev)
    decode = num_kv_splits is not None
    check(decode != (num_draft_tokens is not None), "pass num_kv_splits (decode) or num_draft_tokens (verify), not both")
    if decode:
        check_tensor(num_kv_splits, "num_kv_splits", (torch.int32,), 1, dev, min_len=bs)
        token_grid, n = split_grid(bs, 1, num_heads, num_kv_heads, max_kv_splits, core_count), 0
        qo_indptr = mask_indptr = custom_mask_src = custom_mask = None
    else:
        check_int(num_draft_tokens, "num_draft_tokens", 1)
        token_grid, n = 1, num_draft_tokens
        check(qo_indptr is not None and mask_indptr is not None, "target verify needs qo_indptr and mask_indptr")
        check_tensor(qo_indptr, "qo_indptr", INDEX_DTYPES, 1, dev, min_len=bs + 1)
        check_tensor(mask_indptr, "mask_indptr", INDEX_DTYPES, 1, dev, min_len=bs + 1)
        check((custom_mask_src is None) == (custom_mask is None), "pass custom_mask_src and custom_mask together, or neither")
        if custom_mask is not None:
            check_tensor(custom_mask_src, "custom_mask_src", MASK_DTYPES, 1, dev)
            check_tensor(custom_mask, "custom_mask", MASK_DTYPES, 1, dev)
    tensors = (req_to_token, req_pool_indices, seq_lens, kv_indptr, kv_indices, num_kv_splits, qo_indptr, mask_indptr)
    return tensors + (custom_mask_src, custom_mask, token_grid, max_kv_splits, core_count, bool(static), n)


def fused_graph_metadata(*args, **kwargs) -> None:
    """Write a Triton graph's decode or target-verify metadata in place, one launch (module docstring): always
    ``kv_indptr[:bs+1]`` and ``kv_indices`` (bs = ``seq_lens.numel()``), then exactly one mode: **decode**
    (``num_kv_splits`` + the split-count arguments of ``get_num_kv_splits``, ``num_group = 1``) or **target verify**
    (``num_draft_tokens = N``, ``qo_indptr``, ``mask_indptr``, optionally ``custom_mask_src`` into the ``custom_mask``
    buffer, within both sizes). Checks shapes, dtypes, devices and Python ints only; ``fused_graph_metadata_args`` +
    ``launch_fused_graph_metadata`` split the checks from the launch for a replay hook."""
    _fused_graph_metadata_op(*fused_graph_metadata_args(*args, **kwargs))


fused_graph_metadata.__signature__ = inspect.signature(fused_graph_metadata_args).replace(return_annotation=None)


def launch_fused_graph_metadata(args: tuple, custom_mask_src: Tensor | None = None) -> None:
    """Launch with ``fused_graph_metadata_args``' tuple; ``custom_mask_src`` (checked: 1-D bool / uint8, same device)
    replaces the source mask the tuple was made with (which must include a mask copy)."""
    if custom_mask_src is not None:
        check(args[_MASK_SRC] is not None, "these arguments were prepared without a mask copy")
        check_tensor(custom_mask_src, "custom_mask_src", MASK_DTYPES, 1, args[2].device)
        args = list(args)
        args[_MASK_SRC] = custom_mask_src
    _fused_graph_metadata_op(*args)
