"""Fused graph metadata for the Triton backend: one launch instead of four to seven.

[facts#fused-and-in-graph-metadata]

The unified Triton backend's replay hook builds its decode metadata with a cumsum, the CSR
kernel ([facts#csr-kv-index-builder]) and the split-count kernel
([facts#split-count-heuristic]); target verify adds an ``arange`` copy, the mask copy and the
``mask_indptr`` cumsum. Each is a launch, and on the host each launch costs more than the GPU
work it does (about 10-15 µs per Triton launch on an H200, ~180 µs for the whole decode hook).
``fused_graph_metadata`` does all of it in **one** Triton launch, grid ``(bs,)``, one program
per request::

    lens      = seq_lens[0:bs]                        (every program loads all bs of them)
    off_i     = sum_{j < i} lens[j]                   (exclusive prefix, int64)
    kv_indptr[0] = 0, kv_indptr[i+1] = off_i + lens[i]
    kv_indices[off_i + j] = req_to_token[rpi[i], j]   j < lens[i]   (bounded, see below)
  decode:
    num_kv_splits[i] = split_counts(lens, ...)[i]     (the same jit helper as get_num_kv_splits)
  target verify (N drafts, kv lengths = prefix lengths = seq_lens):
    qo_indptr[i+1]   = (i+1) * N,            qo_indptr[0] = 0
    mask_indptr[i+1] = sum_{j <= i} N * (lens[j] + N),   mask_indptr[0] = 0
    custom_mask[mask_indptr[i] + q] = mask_src[mask_indptr[i] + q]   q < N * (lens[i] + N)
                                                      (optional: the out-of-graph variant)

The indptrs are the plain cumulative sums of the raw lengths, exactly what the unified hook's
``torch.cumsum`` writes, so the two backends read identical state. The copies follow
``build_kv_indices``' bounds rules: a request index outside ``[0, pool)`` reads and writes
nothing; columns past ``L`` are not read; stores outside ``kv_indices`` are not made; a length
``<= 0`` writes nothing; dropped entries keep their previous value. The mask copy is bounded by
both the source and the destination sizes. Every loop is bounded by a shape (``L`` and the mask
source's size), whatever the device data holds.

Graph-safe: every size the launch depends on is a shape or a Python int (``bs``, ``N``, the
heuristic's ``token_grid`` from ``(bs, heads)``), so the same call can also be *recorded* inside
a captured graph, reading the runner's static ``seq_lens`` / ``req_pool_indices`` (the Triton
``in_graph`` variant, like TRTLLM-MLA's in-graph rebuild [facts#trtllm-mla-after-26665-and-after-29077]).

One ``torch.library`` custom op (``refimpl::fused_graph_metadata``) per launch; the wrapper
checks shapes / dtypes / devices and Python ints only. ``fused_graph_metadata_ref`` is the
pure-torch reference built from ``build_kv_indices_ref``, ``get_num_kv_splits_ref`` and the
``refimpl.layout`` rules.
"""

from __future__ import annotations

import torch

from .. import _env  # noqa: F401  (sets TRITON_INTERPRET before any @triton.jit)

# isort: split
import triton
import triton.language as tl

from .. import layout
from ._checks import INDEX_DTYPES, MASK_DTYPES, check, check_int, check_tensor
from ._op import kernel_op
from .indices import CSR_BLOCK, build_kv_indices_ref
from .triton_decode import _token_grid, get_num_kv_splits_ref, split_counts

MASK_BLOCK = 1024  # mask entries copied per loop iteration


@triton.jit
def _fused_graph_metadata_kernel(
    req_to_token_ptr,  # [pool, L] int32/int64, row stride = req_to_token_stride
    req_pool_indices_ptr,  # [>= bs] int32/int64
    seq_lens_ptr,  # [>= bs] int32/int64 (kv lengths: decode / prefix of verify)
    kv_indptr_ptr,  # [>= bs+1] int32/int64, written [0, bs]
    kv_indices_ptr,  # [out_len] int32/int64, written
    num_kv_splits_ptr,  # decode: [>= bs] int32, written (else a dummy)
    qo_indptr_ptr,  # verify: [>= bs+1], written (else a dummy)
    mask_indptr_ptr,  # verify: [>= bs+1], written (else a dummy)
    mask_src_ptr,  # verify + COPY_MASK: [any] uint8 (a bool mask viewed as uint8)
    mask_dst_ptr,  # verify + COPY_MASK: [any] uint8, written
    req_to_token_stride,
    pool,  # req_to_token.shape[0]: request rows outside [0, pool) are never read
    row_len,  # req_to_token.shape[1] = L: columns outside [0, L) are never read
    out_len,  # kv_indices.numel(): stores outside [0, out_len) are dropped
    bs,
    token_grid,  # decode: stage-1 programs per split (host, from shapes)
    max_kv_splits,
    core_count,
    num_draft_tokens,  # verify: N
    mask_len,  # min(mask source numel, mask buffer numel): copies stay inside both
    BLOCK_BS: tl.constexpr,  # next_power_of_2(bs)
    BLOCK: tl.constexpr,  # kv positions per loop iteration
    MASK_BLOCK: tl.constexpr,  # mask entries per loop iteration
    DECODE: tl.constexpr,
    STATIC: tl.constexpr,  # decode: every count = max_kv_splits
    VERIFY: tl.constexpr,
    COPY_MASK: tl.constexpr,
):
    i = tl.program_id(0)  # one program per request
    offs = tl.arange(0, BLOCK_BS)  # [BLOCK_BS] request index
    live = offs < bs
    lens = tl.load(seq_lens_ptr + offs, mask=live, other=0).to(tl.int64)  # [BLOCK_BS]
    n = tl.load(seq_lens_ptr + i).to(tl.int64)
    before = live & (offs < i)
    out_start = tl.sum(tl.where(before, lens, 0), axis=0)  # exclusive prefix: kv_indptr[i]
    zero = n * 0  # int64 scalar
    if i == 0:
        tl.store(kv_indptr_ptr, zero.to(kv_indptr_ptr.dtype.element_ty))
    tl.store(kv_indptr_ptr + i + 1, (out_start + n).to(kv_indptr_ptr.dtype.element_ty))

    if DECODE:  # constexpr: resolved at compile time
        if STATIC:
            mine = zero.to(tl.int32) + max_kv_splits
        else:
            splits = split_counts(lens.to(tl.int32), live, token_grid, max_kv_splits, core_count)
            mine = tl.sum(tl.where(offs == i, splits, 0), axis=0)  # this request's count
        tl.store(num_kv_splits_ptr + i, mine.to(tl.int32))

    if VERIFY:
        nd = zero + num_draft_tokens  # int64 (an int arg of 1 arrives as a constexpr)
        if i == 0:
            tl.store(qo_indptr_ptr, zero.to(qo_indptr_ptr.dtype.element_ty))
            tl.store(mask_indptr_ptr, zero.to(mask_indptr_ptr.dtype.element_ty))
        tl.store(qo_indptr_ptr + i + 1, ((i + 1) * nd).to(qo_indptr_ptr.dtype.element_ty))
        blocks = nd * (lens + nd)  # [BLOCK_BS] mask entries per request
        mask_start = tl.sum(tl.where(before, blocks, 0), axis=0)  # mask_indptr[i]
        my_block = nd * (n + nd)
        mask_end = mask_start + my_block
        tl.store(mask_indptr_ptr + i + 1, mask_end.to(mask_indptr_ptr.dtype.element_ty))
        if COPY_MASK:  # entries [mask_start, mask_end) inside both the source and the buffer
            q_hi = tl.minimum(my_block, mask_len - mask_start)
            q_lo = tl.maximum(-mask_start, 0)
            for b in range(tl.cdiv(q_hi - q_lo, MASK_BLOCK)):  # <= cdiv(mask_len, MASK_BLOCK)
                q = q_lo + b * MASK_BLOCK + tl.arange(0, MASK_BLOCK).to(tl.int64)
                keep = q < q_hi
                bits = tl.load(mask_src_ptr + mask_start + q, mask=keep)
                tl.store(mask_dst_ptr + mask_start + q, bits.to(tl.uint8), mask=keep)

    # the CSR copy, with build_kv_indices' bounds ([facts#csr-kv-index-builder])
    req_slot = tl.load(req_pool_indices_ptr + i).to(tl.int64)
    row_ok = (req_slot >= 0) & (req_slot < pool)  # an out-of-pool request reads nothing
    j_hi = tl.where(row_ok, tl.minimum(n, row_len), 0)  # at most L positions
    req_slot = tl.where(row_ok, req_slot, 0)
    src_row = req_to_token_ptr + req_slot * req_to_token_stride  # int64 arithmetic
    for b in range(tl.cdiv(j_hi, BLOCK)):  # empty when j_hi <= 0
        j = b * BLOCK + tl.arange(0, BLOCK).to(tl.int64)  # [BLOCK] positions
        dst = out_start + j
        keep = (j < j_hi) & (dst >= 0) & (dst < out_len)
        slots = tl.load(src_row + j, mask=keep)
        tl.store(kv_indices_ptr + dst, slots.to(kv_indices_ptr.dtype.element_ty), mask=keep)


@kernel_op(
    "refimpl::fused_graph_metadata",
    mutates_args=("kv_indptr", "kv_indices", "num_kv_splits", "qo_indptr", "mask_indptr", "custom_mask"),
)
def _fused_graph_metadata_op(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    num_kv_splits: torch.Tensor | None,
    qo_indptr: torch.Tensor | None,
    mask_indptr: torch.Tensor | None,
    custom_mask_src: torch.Tensor | None,
    custom_mask: torch.Tensor | None,
    token_grid: int,
    max_kv_splits: int,
    core_count: int,
    static: bool,
    num_draft_tokens: int,
) -> None:
    bs = seq_lens.shape[0]
    if bs == 0:  # shape, not data: an empty batch launches nothing
        return
    decode, verify = num_kv_splits is not None, qo_indptr is not None
    copy_mask = verify and custom_mask_src is not None
    src = dst = kv_indices  # dummy pointers, never read
    if copy_mask:
        src = custom_mask_src.view(torch.uint8) if custom_mask_src.dtype == torch.bool else (custom_mask_src)
        dst = custom_mask.view(torch.uint8) if custom_mask.dtype == torch.bool else custom_mask
    _fused_graph_metadata_kernel[(bs,)](
        req_to_token, req_pool_indices, seq_lens, kv_indptr, kv_indices,
        num_kv_splits if decode else kv_indptr,
        qo_indptr if verify else kv_indptr,
        mask_indptr if verify else kv_indptr,
        src, dst,
        req_to_token.stride(0), req_to_token.shape[0], req_to_token.shape[1], kv_indices.numel(),
        bs, token_grid, max_kv_splits, core_count, num_draft_tokens,
        min(src.numel(), dst.numel()) if copy_mask else 0,
        BLOCK_BS=triton.next_power_of_2(bs),
        BLOCK=CSR_BLOCK,
        MASK_BLOCK=MASK_BLOCK,
        DECODE=decode,
        STATIC=static or core_count <= 0,
        VERIFY=verify,
        COPY_MASK=copy_mask,
    )  # fmt: skip


def _check_index(t, name: str, device, min_len: int = 0, ndim: int = 1) -> None:
    check_tensor(t, name, INDEX_DTYPES, ndim, device, min_len=min_len)


def fused_graph_metadata(
    req_to_token: torch.Tensor,  # [pool, L] int32/int64
    req_pool_indices: torch.Tensor,  # [>= bs] int32/int64
    seq_lens: torch.Tensor,  # [bs] int32/int64: kv lengths (decode; verify: the prefix)
    kv_indptr: torch.Tensor,  # [>= bs+1] int32/int64, written [0 : bs+1]
    kv_indices: torch.Tensor,  # [any] int32/int64, written (bounded by its numel)
    *,
    # decode: the split counts
    num_kv_splits: torch.Tensor | None = None,  # [>= bs] int32, written [0 : bs]
    num_heads: int = 1,
    num_kv_heads: int = 1,
    max_kv_splits: int = 1,
    core_count: int = 0,
    static: bool = False,
    # target verify: qo / mask offsets (+ the optional mask copy)
    num_draft_tokens: int | None = None,  # N
    qo_indptr: torch.Tensor | None = None,  # [>= bs+1] int32/int64, written [0 : bs+1]
    mask_indptr: torch.Tensor | None = None,  # [>= bs+1] int32/int64, written [0 : bs+1]
    custom_mask_src: torch.Tensor | None = None,  # [any] bool/uint8: the spec's flattened mask
    custom_mask: torch.Tensor | None = None,  # [any] bool/uint8 graph buffer, written
) -> None:
    """One launch that writes a Triton graph's decode or target-verify metadata in place.

    bs = ``seq_lens.numel()``. Always: ``kv_indptr[:bs+1] = [0, cumsum(seq_lens)]`` and the CSR
    ``kv_indices`` (``build_kv_indices``' semantics and bounds: out-of-pool requests, columns
    past L and stores past ``kv_indices`` are dropped, the entry keeps its previous value).

    - **decode** (``num_kv_splits`` with ``num_heads``, ``num_kv_heads``, ``max_kv_splits``,
      ``core_count``, ``static``): ``num_kv_splits[:bs]`` =
      ``get_num_kv_splits`` of ``seq_lens`` with ``num_group = 1`` (same jit helper, so the same
      counts); ``static=True`` or ``core_count <= 0`` fills ``max_kv_splits``.
    - **target verify** (``num_draft_tokens = N``, ``qo_indptr`` and ``mask_indptr``):
      ``qo_indptr[:bs+1] = [0, N, ..., bs*N]``,
      ``mask_indptr[:bs+1] = [0, cumsum(N * (seq_lens + N))]`` (``refimpl.layout.mask_indptr``).
      With ``custom_mask_src`` (the spec's flattened bool / uint8 mask) and ``custom_mask`` (the
      bool / uint8 graph buffer), request i's block ``[mask_indptr[i], mask_indptr[i+1])`` is
      copied from the source into the buffer within both sizes (a source holding only the live
      requests' blocks leaves the padded rows' blocks as they were, like the unified hook's
      ``copy_`` of the mask's prefix).

    Exactly one of the two modes. Checks shapes, dtypes, devices and Python ints only (no
    tensor value: this runs inside captured graphs too). ``fused_graph_metadata_args`` +
    ``launch_fused_graph_metadata`` split the checks from the launch for callers that launch
    on the same tensors again and again (a replay hook).
    """
    args = fused_graph_metadata_args(
        req_to_token, req_pool_indices, seq_lens, kv_indptr, kv_indices,
        num_kv_splits=num_kv_splits, num_heads=num_heads, num_kv_heads=num_kv_heads,
        max_kv_splits=max_kv_splits, core_count=core_count, static=static,
        num_draft_tokens=num_draft_tokens, qo_indptr=qo_indptr, mask_indptr=mask_indptr,
        custom_mask_src=custom_mask_src, custom_mask=custom_mask,
    )  # fmt: skip
    _fused_graph_metadata_op(*args)


_MASK_SRC = 8  # position of custom_mask_src in the op's arguments


def fused_graph_metadata_args(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    *,
    num_kv_splits: torch.Tensor | None = None,
    num_heads: int = 1,
    num_kv_heads: int = 1,
    max_kv_splits: int = 1,
    core_count: int = 0,
    static: bool = False,
    num_draft_tokens: int | None = None,
    qo_indptr: torch.Tensor | None = None,
    mask_indptr: torch.Tensor | None = None,
    custom_mask_src: torch.Tensor | None = None,
    custom_mask: torch.Tensor | None = None,
) -> tuple:
    """Check ``fused_graph_metadata``'s arguments (same signature) and return the launch's
    argument tuple, for ``launch_fused_graph_metadata``."""
    _check_index(seq_lens, "seq_lens", None)
    bs, dev = seq_lens.shape[0], seq_lens.device  # every other tensor must be on it
    _check_index(req_to_token, "req_to_token", dev, ndim=2)
    _check_index(req_pool_indices, "req_pool_indices", dev, min_len=bs)
    _check_index(kv_indptr, "kv_indptr", dev, min_len=bs + 1)
    _check_index(kv_indices, "kv_indices", dev)
    decode, verify = num_kv_splits is not None, num_draft_tokens is not None
    check(decode != verify, "pass num_kv_splits (decode) or num_draft_tokens (verify), not both")
    token_grid = 1
    if decode:
        check_tensor(num_kv_splits, "num_kv_splits", (torch.int32,), 1, dev, min_len=bs)
        check_int(num_heads, "num_heads", 1)
        check_int(num_kv_heads, "num_kv_heads", 1)
        check(num_heads % num_kv_heads == 0, f"num_kv_heads={num_kv_heads}: must divide num_heads={num_heads}")
        check_int(max_kv_splits, "max_kv_splits", 1)
        check(type(core_count) is int, f"core_count={core_count!r}: must be an int (<= 0: static)")
        token_grid = _token_grid(bs, 1, num_heads, num_kv_heads)
        n = 0
        qo_indptr = mask_indptr = custom_mask_src = custom_mask = None
    else:
        check_int(num_draft_tokens, "num_draft_tokens", 1)
        n = num_draft_tokens
        check(qo_indptr is not None and mask_indptr is not None, "target verify needs qo_indptr and mask_indptr")
        _check_index(qo_indptr, "qo_indptr", dev, min_len=bs + 1)
        _check_index(mask_indptr, "mask_indptr", dev, min_len=bs + 1)
        check((custom_mask_src is None) == (custom_mask is None),
              "pass custom_mask_src and custom_mask together, or neither")  # fmt: skip
        if custom_mask is not None:
            check_tensor(custom_mask_src, "custom_mask_src", MASK_DTYPES, 1, dev)
            check_tensor(custom_mask, "custom_mask", MASK_DTYPES, 1, dev)
    return (
        req_to_token, req_pool_indices, seq_lens, kv_indptr, kv_indices, num_kv_splits,
        qo_indptr, mask_indptr, custom_mask_src, custom_mask,
        token_grid, max_kv_splits, core_count, bool(static), n,
    )  # fmt: skip


def launch_fused_graph_metadata(args: tuple, custom_mask_src: torch.Tensor | None = None) -> None:
    """Launch with ``fused_graph_metadata_args``' tuple. ``custom_mask_src``, when given,
    replaces the source mask the tuple was checked with (a fresh spec mask every replay; it is
    checked here: 1-D bool / uint8 on the same device; the tuple must have been made with a
    mask copy)."""
    if custom_mask_src is not None:
        check(args[_MASK_SRC] is not None, "these arguments were prepared without a mask copy")
        check_tensor(custom_mask_src, "custom_mask_src", MASK_DTYPES, 1, args[2].device)
        args = (*args[:_MASK_SRC], custom_mask_src, *args[_MASK_SRC + 1 :])
    _fused_graph_metadata_op(*args)


def fused_graph_metadata_ref(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    num_heads: int = 1,
    num_kv_heads: int = 1,
    max_kv_splits: int = 1,
    core_count: int = 0,
    static: bool = False,
    num_draft_tokens: int | None = None,
    custom_mask_src: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """What ``fused_graph_metadata`` writes for *valid* inputs (``0 <= seq_lens[i] <= L``,
    ``0 <= rpi[i] < pool``), from first principles, on the host:

    ``kv_indptr`` [bs+1] and ``kv_indices`` [sum] (``build_kv_indices_ref``), and decode:
    ``num_kv_splits`` [bs] (``get_num_kv_splits_ref``); verify: ``qo_indptr`` [bs+1],
    ``mask_indptr`` [bs+1] (``refimpl.layout.mask_indptr``) and, with a source mask,
    ``custom_mask`` (its first ``min(src numel, mask_indptr[bs])`` entries as uint8). int64.
    """
    lens = seq_lens.detach().cpu().to(torch.int64)
    bs = lens.numel()
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int64, device="cpu")
    kv_indptr[1:] = torch.cumsum(lens, 0)
    out = {
        "kv_indptr": kv_indptr,
        "kv_indices": build_kv_indices_ref(req_to_token.cpu(), req_pool_indices[:bs].cpu(), lens).cpu(),
    }
    if num_draft_tokens is None:
        splits = get_num_kv_splits_ref(
            lens.tolist(), num_heads=num_heads, num_kv_heads=num_kv_heads,
            max_kv_splits=max_kv_splits, core_count=core_count, static=static,
        )  # fmt: skip
        out["num_kv_splits"] = torch.tensor(splits, dtype=torch.int64, device="cpu")
        return out
    n = num_draft_tokens
    out["qo_indptr"] = torch.arange(0, (bs + 1) * n, n, dtype=torch.int64, device="cpu")
    out["mask_indptr"] = layout.mask_indptr(lens, n)
    if custom_mask_src is not None:
        end = min(custom_mask_src.numel(), int(out["mask_indptr"][-1]))
        out["custom_mask"] = custom_mask_src.detach().cpu()[:end].to(torch.uint8)
    return out
