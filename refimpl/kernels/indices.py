"""KV-index builders ([facts#csr-kv-index-builder], [facts#block-table-builder]) reading the request pool
``req_to_token[pool, L]`` (row = request slot, column = position, value = token slot) into a preallocated destination,
graph-safe (no allocation, no host sync, bounds from shapes or Python ints):

- ``build_kv_indices``:  ``kv_indices[kv_indptr[i] + j] = req_to_token[rpi[i], start_i + j]``, ``j < lens[i]``;
- ``build_block_table``: ``block_table[i, p] = req_to_token[rpi[i], start_i + p*P] // P``, ``p < cdiv(lens[i], P)``.

Lengths, starts and request indices are device data a replay may fill with anything, so every load and store is masked
to its tensor and every loop bounded by a shape: what falls outside is dropped, never clamped onto another entry.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._checks import INDEX_DTYPES, check, check_int, check_pool_inputs, check_tensor
from ._op import direct_launch, kernel_op, no_specialisation

CSR_BLOCK = 512  # positions copied per loop iteration ([facts#csr-kv-index-builder])
BLOCK_TABLE_CHUNK = 4096  # positions covered per loop iteration: 4096 // P pages


# CSR kv indices ([facts#csr-kv-index-builder])
@triton.jit
def pool_row(req_to_token_ptr, req_pool_indices_ptr, i, pool, stride):
    """``(row_ok, row pointer)`` of request i's ``req_to_token`` row; an out-of-pool request (``rpi[i]`` outside ``[0,
    pool)``) gets ``row_ok`` False and row 0, which it must not read."""
    req_slot = tl.load(req_pool_indices_ptr + i).to(tl.int64)
    row_ok = (req_slot >= 0) & (req_slot < pool)
    return row_ok, req_to_token_ptr + tl.where(row_ok, req_slot, 0) * stride  # int64 arithmetic


@triton.jit
def copy_row(src_row, dst_ptr, dst_start, j_lo, j_hi, out_len, BLOCK: tl.constexpr):
    """``dst[dst_start + j] = src_row[j]`` for j in ``[j_lo, j_hi)``; stores outside ``[0, out_len)`` are dropped. The
    per-request row copy of every CSR builder (loops ``cdiv(j_hi - j_lo, BLOCK)``)."""
    for b in range(tl.cdiv(j_hi - j_lo, BLOCK)):  # empty when j_hi <= j_lo
        j = j_lo + b * BLOCK + tl.arange(0, BLOCK).to(tl.int64)  # [BLOCK] positions
        dst = dst_start + j
        keep = (j < j_hi) & (dst >= 0) & (dst < out_len)
        tl.store(dst_ptr + dst, tl.load(src_row + j, mask=keep), mask=keep)  # cast to dst's dtype


@triton.jit(**no_specialisation(13, 7))  # direct_launch: one compiled kernel per (dtypes, PAGE_SIZE, BLOCK)
def _pool_copy_kernel(
    req_to_token_ptr,  # [pool, L] int32/int64, row stride = req_to_token_stride
    req_pool_indices_ptr,  # [>= bs] int32/int64
    lens_ptr,  # [>= bs] int32/int64
    kv_start_idx_ptr,  # [>= bs], or None (start 0)
    dst_ptr,  # CSR: kv_indices [dst_len] int32/int64; table: block_table [>= bs, dst_len] int32; written
    kv_indptr_ptr,  # CSR: [bs+1] int32/int64, already [0, cumsum(lens)] (table: None)
    lens_out_ptr,  # table only: [bs] int32/int64, written lens + lens_offset (TRTLLM-MLA's seq_lens_k), or None
    req_to_token_stride,
    dst_stride,  # table: block_table.stride(0) (CSR: ignored)
    dst_len,  # CSR: kv_indices.numel(), stores outside [0, it) are dropped; table: max_blocks, pages past it are not written
    pool,  # req_to_token.shape[0]: request rows outside [0, pool) are never read
    row_len,  # req_to_token.shape[1] = L: columns outside [0, L) are never read
    lens_offset,  # added to every length
    PAGE_SIZE: tl.constexpr,  # 0: CSR kv indices; else a block table of pages of PAGE_SIZE positions
    BLOCK: tl.constexpr,  # positions (CSR) or pages (table) per loop iteration
):
    i = tl.program_id(0).to(tl.int64)  # one program per request
    n = tl.load(lens_ptr + i).to(tl.int64) + lens_offset
    if lens_out_ptr is not None:  # None pointers: resolved at compile time
        tl.store(lens_out_ptr + i, n.to(lens_out_ptr.dtype.element_ty))
    start = n * 0  # int64 0
    if kv_start_idx_ptr is not None:
        start = tl.load(kv_start_idx_ptr + i).to(tl.int64)
    row_ok, src_row = pool_row(req_to_token_ptr, req_pool_indices_ptr, i, pool, req_to_token_stride)
    if PAGE_SIZE == 0:  # CSR ([facts#csr-kv-index-builder])
        # positions j whose source column start + j lies in [0, L): [j_lo, j_hi) (at most L of them)
        j_lo = tl.maximum(-start, 0)
        j_hi = tl.where(row_ok, tl.minimum(n, row_len - start), j_lo)
        copy_row(src_row + start, dst_ptr, tl.load(kv_indptr_ptr + i).to(tl.int64), j_lo, j_hi, dst_len, BLOCK)
    else:  # block table ([facts#block-table-builder]): dst[i, p] = src_row[start + p*P] // P, p < num_pages, column in [0, L)
        num_pages = tl.where(row_ok, tl.minimum(tl.cdiv(n, PAGE_SIZE), dst_len), 0)  # never past the row
        for c in range(tl.cdiv(num_pages, BLOCK)):
            p = c * BLOCK + tl.arange(0, BLOCK).to(tl.int64)  # [BLOCK] pages
            col = start + p * PAGE_SIZE  # first position of page p in the request's row
            keep = (p < num_pages) & (col >= 0) & (col < row_len)
            first_slot = tl.load(src_row + col, mask=keep, other=0).to(tl.int64)
            tl.store(dst_ptr + i * dst_stride + p, (first_slot // PAGE_SIZE).to(tl.int32), mask=keep)


def pool_copy(req_to_token, req_pool_indices, lens, kv_start_idx, dst, kv_indptr, page_size=0, lens_out=None, lens_offset=0):
    """Launch ``_pool_copy_kernel``, one program per request (bs = lens.numel()): a CSR ``kv_indices`` (page_size 0,
    ``kv_indptr`` its offsets) or a block table (``kv_indptr`` None; ``lens_out``: also write ``lens + lens_offset``)."""
    if lens.shape[0] == 0:  # shape, not data: an empty batch launches nothing
        return
    # table: about BLOCK_TABLE_CHUNK // page_size pages per iteration, a power of 2 (tl.arange)
    block = 1 << (max(1, BLOCK_TABLE_CHUNK // page_size).bit_length() - 1) if page_size else CSR_BLOCK
    ptrs = (req_to_token, req_pool_indices, lens, kv_start_idx, dst, kv_indptr, lens_out)
    sizes = (
        req_to_token.stride(0),
        dst.stride(0),
        dst.shape[-1],
        *req_to_token.shape,
        lens_offset,
    )  # ..., dst_len, pool, row_len
    key = (_pool_copy_kernel, lens.device, page_size, block, *(None if t is None else t.dtype for t in ptrs))
    direct_launch(_pool_copy_kernel, (lens.shape[0],), (*ptrs, *sizes, page_size, block), key, lens.device)


@kernel_op("refimpl::build_kv_indices", mutates_args=("kv_indices",))
def _build_kv_indices_op(
    req_to_token: Tensor,
    req_pool_indices: Tensor,
    lens: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    kv_start_idx: Tensor | None,
) -> None:
    pool_copy(req_to_token, req_pool_indices, lens, kv_start_idx, kv_indices, kv_indptr)


def build_kv_indices(req_to_token, req_pool_indices, lens, kv_indptr, kv_indices, kv_start_idx=None) -> None:
    """Fill ``kv_indices`` with each request's token slots (CSR), bs = lens.numel(); ``kv_indptr[:bs+1]`` must hold ``[0,
    cumsum(lens)]``. Element j of request i is written iff ``0 <= rpi[i] < pool``, ``0 <= start_i + j < L`` and ``0 <=
    kv_indptr[i] + j < kv_indices.numel()``; else it keeps its value."""
    bs, dev = check_pool_inputs(req_to_token, req_pool_indices, lens, "lens", kv_start_idx)
    check_tensor(kv_indptr, "kv_indptr", INDEX_DTYPES, 1, dev, min_len=bs + 1)
    check_tensor(kv_indices, "kv_indices", INDEX_DTYPES, 1, dev)
    _build_kv_indices_op(req_to_token, req_pool_indices, lens, kv_indptr, kv_indices, kv_start_idx)


def _requests(req_pool_indices, lens, kv_start_idx):
    """``(rpi[i], start_i, lens[i])`` per request, read on the host (the references' loop)."""
    bs = lens.numel()
    starts = [0] * bs if kv_start_idx is None else kv_start_idx[:bs].tolist()
    return zip(req_pool_indices[:bs].tolist(), starts, lens.tolist())


def build_kv_indices_ref(req_to_token, req_pool_indices, lens, kv_start_idx=None) -> Tensor:
    """Expected CSR indices: concat_i req_to_token[rpi[i], start_i : start_i + lens[i]] (int64)."""
    rows = [req_to_token[r, s : s + n].long() for r, s, n in _requests(req_pool_indices, lens, kv_start_idx)]
    return torch.cat([req_to_token.new_zeros(0, dtype=torch.int64), *rows])  # [sum(lens)]


# paged block table ([facts#block-table-builder])
@kernel_op("refimpl::build_block_table", mutates_args=("block_table",))
def _build_block_table_op(
    req_to_token: Tensor, req_pool_indices: Tensor, lens: Tensor, block_table: Tensor, page_size: int, kv_start_idx: Tensor | None
) -> None:
    pool_copy(req_to_token, req_pool_indices, lens, kv_start_idx, block_table, None, page_size)


def build_block_table(req_to_token, req_pool_indices, lens, block_table, page_size, kv_start_idx=None) -> None:
    """Fill rows ``[:bs]`` of ``block_table`` (module docstring), bs = lens.numel(): entry ``(i, p)``, ``p < cdiv(lens[i],
    P)``, is written iff ``p < block_table.shape[1]``, ``0 <= rpi[i] < pool`` and ``0 <= start_i + p*P < L``; every
    other entry keeps its value (−1 or 1 by convention)."""
    check_int(page_size, "page_size", 1)
    bs, dev = check_pool_inputs(req_to_token, req_pool_indices, lens, "lens", kv_start_idx)
    check_tensor(block_table, "block_table", (torch.int32,), 2, dev)
    check(block_table.shape[0] >= bs, f"block_table.shape[0]={block_table.shape[0]}: must be >= bs={bs}")
    _build_block_table_op(req_to_token, req_pool_indices, lens, block_table, page_size, kv_start_idx)


def build_block_table_ref(req_to_token, req_pool_indices, lens, block_table, page_size: int, kv_start_idx=None):
    """Expected table: a copy of ``block_table`` with the written entries replaced."""
    out = block_table.clone()  # [bs_max, max_blocks] int32
    for i, (r, s, n) in enumerate(_requests(req_pool_indices, lens, kv_start_idx)):
        for p in range(min(-(-n // page_size), out.shape[1])):  # its pages, within the width
            out[i, p] = int(req_to_token[r, s + p * page_size]) // page_size
    return out
