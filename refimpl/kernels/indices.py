"""KV-index builders: token-level CSR indices and paged block tables.

[facts#csr-kv-index-builder], [facts#block-table-builder]

Both read the request pool ``req_to_token[pool, L]`` (row = request slot, column j = position j,
value = token slot) and write into a *preallocated* destination, so they are safe
inside a CUDA graph: no allocation, no host sync, every bound comes from shapes or Python ints.

- ``build_kv_indices``:  ``kv_indices[kv_indptr[i] + j] = req_to_token[rpi[i], start_i + j]``
  for ``j < lens[i]`` (what the Triton / FlashInfer backends feed their kernels).
- ``build_block_table``: ``block_table[i, p] = req_to_token[rpi[i], start_i + p*P] // P`` for
  ``p < cdiv(lens[i], P)`` (FlashMLA / Cutlass / TRTLLM MLA page tables).
- ``block_table_to_kv_indices``: host-side inverse view of a block table, for oracles and tests.

Bounded by construction: the lengths, starts and request indices are device data that a replay
may fill with anything (e.g. ``seq_lens`` past the context length), so every load of
``req_to_token`` is masked to its ``[pool, L]`` shape, every store to the destination's shape,
and loops are bounded by shapes too. Whatever falls outside is dropped (the destination keeps
its previous value), never clamped onto another entry; the wrappers' docstrings list the rules.

Each builder is a Triton kernel wrapped in a ``torch.library.custom_op`` (one recorded op per
launch), a validating Python wrapper, and a pure-torch ``*_ref`` for tests.
"""

import torch

from .. import _env  # noqa: F401  (sets TRITON_INTERPRET before any @triton.jit)

# isort: split
import triton
import triton.language as tl

from ._checks import INDEX_DTYPES, check_same_device, check_tensor
from ._op import kernel_op

CSR_BLOCK = 512  # positions copied per loop iteration ([facts#csr-kv-index-builder])
BLOCK_TABLE_CHUNK = 4096  # positions covered per loop iteration: 4096 // P pages


def _check_index_tensor(t: torch.Tensor, name: str, ndim: int = 1, min_len: int = 0) -> None:
    check_tensor(t, name, INDEX_DTYPES, ndim, min_len=min_len)


def _check_pool_inputs(req_to_token, req_pool_indices, lens, kv_start_idx) -> int:
    """Validate the inputs both builders share; return bs = lens.numel()."""
    _check_index_tensor(lens, "lens")
    bs = lens.shape[0]
    _check_index_tensor(req_to_token, "req_to_token", ndim=2)
    _check_index_tensor(req_pool_indices, "req_pool_indices", min_len=bs)
    if kv_start_idx is not None:
        _check_index_tensor(kv_start_idx, "kv_start_idx", min_len=bs)
    return bs


# ----------------------------------------------------------------------------------------------
# CSR kv indices ([facts#csr-kv-index-builder])


@triton.jit
def _build_kv_indices_kernel(
    req_to_token_ptr,  # [pool, L] int32, row stride = req_to_token_stride
    req_pool_indices_ptr,  # [bs] int32/int64
    lens_ptr,  # [bs] int32/int64
    kv_indptr_ptr,  # [bs+1] int32/int64, already [0, cumsum(lens)]
    kv_start_idx_ptr,  # [bs] (ignored unless HAS_START)
    kv_indices_ptr,  # [out_len] int32/int64, written
    req_to_token_stride,
    pool,  # req_to_token.shape[0]: request rows outside [0, pool) are never read
    row_len,  # req_to_token.shape[1] = L: columns outside [0, L) are never read
    out_len,  # kv_indices.numel(): stores outside [0, out_len) are dropped
    HAS_START: tl.constexpr,
    BLOCK: tl.constexpr,
):
    i = tl.program_id(0)  # one program per request
    req_slot = tl.load(req_pool_indices_ptr + i).to(tl.int64)
    n = tl.load(lens_ptr + i).to(tl.int64)
    out_start = tl.load(kv_indptr_ptr + i).to(tl.int64)
    # positions j whose source column start + j lies in [0, L): [j_lo, j_hi) (at most L of them)
    start = 0
    j_lo = 0
    j_hi = tl.minimum(n, row_len)
    if HAS_START:  # constexpr: resolved at compile time
        start = tl.load(kv_start_idx_ptr + i).to(tl.int64)
        j_lo = tl.maximum(-start, 0)
        j_hi = tl.minimum(n, row_len - start)
    row_ok = (req_slot >= 0) & (req_slot < pool)  # an out-of-pool request reads nothing
    j_hi = tl.where(row_ok, j_hi, j_lo)
    req_slot = tl.where(row_ok, req_slot, 0)
    src_row = req_to_token_ptr + req_slot * req_to_token_stride + start  # int64 arithmetic
    for b in range(tl.cdiv(j_hi - j_lo, BLOCK)):  # empty when j_hi <= j_lo
        j = j_lo + b * BLOCK + tl.arange(0, BLOCK).to(tl.int64)  # [BLOCK] positions
        dst = out_start + j
        keep = (j < j_hi) & (dst >= 0) & (dst < out_len)
        slots = tl.load(src_row + j, mask=keep)
        tl.store(kv_indices_ptr + dst, slots.to(kv_indices_ptr.dtype.element_ty), mask=keep)


@kernel_op("refimpl::build_kv_indices", mutates_args=("kv_indices",))
def _build_kv_indices_op(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    lens: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_start_idx: torch.Tensor | None,
) -> None:
    bs = lens.shape[0]
    if bs == 0:  # shape, not data: an empty batch launches nothing
        return
    has_start = kv_start_idx is not None
    _build_kv_indices_kernel[(bs,)](
        req_to_token,
        req_pool_indices,
        lens,
        kv_indptr,
        kv_start_idx if has_start else lens,  # dummy pointer, never read
        kv_indices,
        req_to_token.stride(0),
        req_to_token.shape[0],
        req_to_token.shape[1],
        kv_indices.numel(),
        HAS_START=has_start,
        BLOCK=CSR_BLOCK,
    )


def build_kv_indices(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    lens: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_start_idx: torch.Tensor | None = None,
) -> None:
    """Fill ``kv_indices`` in place with the token slots of each request (CSR).

    bs = lens.numel(). ``kv_indptr[:bs+1]`` must already hold ``[0, cumsum(lens)]``; only the
    ranges ``kv_indptr[i] : kv_indptr[i] + lens[i]`` of ``kv_indices`` are written. The output
    dtype follows ``kv_indices``.

    Out-of-range values (they cannot be checked here without a host sync) are *dropped*, never
    clamped into another request's slots or another position: element j (``0 <= j < lens[i]``)
    of request i, ``kv_indices[kv_indptr[i] + j] = req_to_token[rpi[i], start_i + j]``, is
    written iff

    - ``0 <= rpi[i] < pool`` (``req_to_token.shape[0]``): an out-of-pool request reads and writes
      nothing (its length counts as 0);
    - ``0 <= start_i + j < L`` (``req_to_token.shape[1]``): columns past the row are not read;
    - ``0 <= kv_indptr[i] + j < kv_indices.numel()``: stores past either end are not made.

    A dropped entry keeps its previous value (so a request whose ``start_i + lens[i] > L`` gets
    its first ``L - start_i`` entries; the rest of its range stays stale). ``lens[i] <= 0`` writes
    nothing. Reads of ``req_to_token`` therefore stay inside it, stores inside ``kv_indices``,
    and each program loops over at most L positions whatever ``lens`` holds. For valid inputs
    (``kv_indptr[bs] <= kv_indices.numel()``, ``0 <= start_i``, ``start_i + lens[i] <= L``,
    ``0 <= rpi[i] < pool``) nothing is dropped.
    """
    bs = _check_pool_inputs(req_to_token, req_pool_indices, lens, kv_start_idx)
    _check_index_tensor(kv_indptr, "kv_indptr", min_len=bs + 1)
    _check_index_tensor(kv_indices, "kv_indices")
    check_same_device(
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices,
        lens=lens,
        kv_indptr=kv_indptr,
        kv_indices=kv_indices,
        kv_start_idx=kv_start_idx,
    )
    _build_kv_indices_op(req_to_token, req_pool_indices, lens, kv_indptr, kv_indices, kv_start_idx)


def build_kv_indices_ref(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    lens: torch.Tensor,
    kv_start_idx: torch.Tensor | None = None,
) -> torch.Tensor:
    """Expected CSR indices: concat_i req_to_token[rpi[i], start_i : start_i + lens[i]] (int64)."""
    bs = lens.numel()
    starts = [0] * bs if kv_start_idx is None else kv_start_idx[:bs].tolist()
    rows = [req_to_token[r, s : s + n].long() for r, s, n in zip(req_pool_indices[:bs].tolist(), starts, lens.tolist())]
    empty = torch.zeros(0, dtype=torch.int64, device=req_to_token.device)
    return torch.cat(rows) if rows else empty  # [sum(lens)] int64


# ----------------------------------------------------------------------------------------------
# paged block table ([facts#block-table-builder])


@triton.jit
def _build_block_table_kernel(
    req_to_token_ptr,  # [pool, L] int32
    req_pool_indices_ptr,  # [bs]
    lens_ptr,  # [bs]
    kv_start_idx_ptr,  # [bs] (ignored unless HAS_START)
    block_table_ptr,  # [bs_max, max_blocks] int32, written
    req_to_token_stride,
    block_table_stride,
    max_blocks,
    pool,  # req_to_token.shape[0]: request rows outside [0, pool) are never read
    row_len,  # req_to_token.shape[1] = L: columns outside [0, L) are never read
    PAGE_SIZE: tl.constexpr,
    PAGES_PER_CHUNK: tl.constexpr,
    HAS_START: tl.constexpr,
):
    i = tl.program_id(0)  # one program per request
    req_slot = tl.load(req_pool_indices_ptr + i).to(tl.int64)
    n = tl.load(lens_ptr + i).to(tl.int64)
    start = 0
    if HAS_START:  # constexpr: resolved at compile time
        start = tl.load(kv_start_idx_ptr + i).to(tl.int64)
    num_pages = tl.minimum(tl.cdiv(n, PAGE_SIZE), max_blocks)  # never write past the row
    row_ok = (req_slot >= 0) & (req_slot < pool)  # an out-of-pool request reads nothing
    num_pages = tl.where(row_ok, num_pages, 0)
    req_slot = tl.where(row_ok, req_slot, 0)
    src_row = req_to_token_ptr + req_slot * req_to_token_stride
    dst_row = block_table_ptr + i.to(tl.int64) * block_table_stride
    for c in range(tl.cdiv(num_pages, PAGES_PER_CHUNK)):  # at most cdiv(max_blocks, chunk)
        p = c * PAGES_PER_CHUNK + tl.arange(0, PAGES_PER_CHUNK).to(tl.int64)  # [chunk] pages
        col = start + p * PAGE_SIZE  # first position of page p in the request's row
        keep = (p < num_pages) & (col >= 0) & (col < row_len)  # the row's columns only
        first_slot = tl.load(src_row + col, mask=keep, other=0)
        tl.store(dst_row + p, (first_slot // PAGE_SIZE).to(tl.int32), mask=keep)


@kernel_op("refimpl::build_block_table", mutates_args=("block_table",))
def _build_block_table_op(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    lens: torch.Tensor,
    block_table: torch.Tensor,
    page_size: int,
    kv_start_idx: torch.Tensor | None,
) -> None:
    bs = lens.shape[0]
    if bs == 0:
        return
    has_start = kv_start_idx is not None
    pages_per_chunk = max(1, BLOCK_TABLE_CHUNK // page_size)
    pages_per_chunk = 1 << (pages_per_chunk.bit_length() - 1)  # tl.arange needs a power of 2
    _build_block_table_kernel[(bs,)](
        req_to_token,
        req_pool_indices,
        lens,
        kv_start_idx if has_start else lens,  # dummy pointer, never read
        block_table,
        req_to_token.stride(0),
        block_table.stride(0),
        block_table.shape[1],
        req_to_token.shape[0],
        req_to_token.shape[1],
        PAGE_SIZE=page_size,
        PAGES_PER_CHUNK=pages_per_chunk,
        HAS_START=has_start,
    )


def build_block_table(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    lens: torch.Tensor,
    block_table: torch.Tensor,
    page_size: int,
    kv_start_idx: torch.Tensor | None = None,
) -> None:
    """Fill rows ``[:bs]`` of ``block_table`` with page ids, bs = lens.numel().

    ``block_table[i, p] = req_to_token[rpi[i], start_i + p*P] // P`` for ``p < cdiv(lens[i], P)``;
    entries at ``p >= cdiv(lens[i], P)`` keep their previous value (−1 or 1 by convention).

    Out-of-range values (not checkable without a host sync) are *dropped*, never clamped into
    another request's row or page: entry ``(i, p)`` is written iff

    - ``p < max_blocks`` (``block_table.shape[1]``): pages past the table width are dropped;
    - ``0 <= rpi[i] < pool`` (``req_to_token.shape[0]``): an out-of-pool request reads and writes
      nothing (its length counts as 0);
    - ``0 <= start_i + p*P < L`` (``req_to_token.shape[1]``): a page whose first position lies
      outside the row is not read (for ``start_i >= 0`` this is ``lens[i]`` clipped to
      ``L - start_i``).

    A dropped entry keeps its previous value; ``lens[i] <= 0`` writes nothing. Reads stay inside
    ``req_to_token``, stores inside row i's first ``max_blocks`` entries, and each program loops
    over at most ``max_blocks`` pages. Valid inputs (``cdiv(lens[i], P) <= max_blocks``,
    ``0 <= start_i``, ``start_i + lens[i] <= L``, ``0 <= rpi[i] < pool``) drop nothing.
    """
    if not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size={page_size!r}: must be an int >= 1")
    bs = _check_pool_inputs(req_to_token, req_pool_indices, lens, kv_start_idx)
    if not isinstance(block_table, torch.Tensor):
        raise TypeError(f"block_table must be a torch.Tensor, got {type(block_table).__name__}")
    if block_table.dtype != torch.int32:
        raise ValueError(f"block_table.dtype={block_table.dtype}: must be torch.int32")
    if block_table.dim() != 2:
        raise ValueError(f"block_table.shape={tuple(block_table.shape)}: must be 2-D")
    if block_table.shape[0] < bs:
        raise ValueError(f"block_table.shape[0]={block_table.shape[0]}: must be >= bs={bs}")
    if block_table.numel() > 0 and block_table.stride(1) != 1:
        raise ValueError(f"block_table.stride(1)={block_table.stride(1)}: must be 1")
    check_same_device(
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices,
        lens=lens,
        block_table=block_table,
        kv_start_idx=kv_start_idx,
    )
    _build_block_table_op(req_to_token, req_pool_indices, lens, block_table, page_size, kv_start_idx)


def build_block_table_ref(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    lens: torch.Tensor,
    block_table: torch.Tensor,
    page_size: int,
    kv_start_idx: torch.Tensor | None = None,
) -> torch.Tensor:
    """Expected table: a copy of ``block_table`` with the written entries replaced."""
    out = block_table.clone()  # [bs_max, max_blocks] int32
    bs = lens.numel()
    starts = [0] * bs if kv_start_idx is None else kv_start_idx[:bs].tolist()
    for i, (r, s, n) in enumerate(zip(req_pool_indices[:bs].tolist(), starts, lens.tolist())):
        num_pages = min(-(-n // page_size), out.shape[1])
        for p in range(num_pages):
            out[i, p] = int(req_to_token[r, s + p * page_size]) // page_size
    return out


def block_table_to_kv_indices(
    block_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level CSR view of a block table (host-side helper for oracles and tests).

    Slot of position t of request i = ``block_table[i, t // P] * P + t % P``; bs = seq_lens.numel().
    Returns ``(kv_indptr [bs+1] int64, kv_indices [sum(seq_lens)] int64)``.
    """
    bs = seq_lens.numel()
    assert block_table.dim() == 2 and block_table.shape[0] >= bs, "block_table must be [>=bs, *]"
    device = block_table.device
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int64, device=device)  # [bs+1] int64
    kv_indptr[1:] = torch.cumsum(seq_lens.to(torch.int64), 0)
    rows = []
    for i, n in enumerate(seq_lens.tolist()):
        t = torch.arange(n, device=device)  # [n] positions
        rows.append(block_table[i, t // page_size].long() * page_size + t % page_size)
    kv_indices = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.int64, device=device)
    return kv_indptr, kv_indices
