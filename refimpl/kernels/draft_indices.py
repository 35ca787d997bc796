"""Multi-step draft-decode kv indices, one Triton launch for all steps.

[facts#multi-step-draft-decode-indices]

EAGLE's multi-step draft decode runs ``S = num_steps`` decode steps over ``num_seqs * topk`` rows
(row ``r*topk + k`` = sequence r, branch k). Step i (0-based) of row (r, k) attends

- the sequence's ``seq_lens[r]`` prefix slots ``req_to_token[rpi[r], 0:seq_lens[r]]``, then
- the ``i + 1`` draft slots of branch k, ``req_to_token[rpi[r], seq_lens[r] + k*S + j]`` for
  ``j = 0..i`` (the project's branch-major layout: ``refimpl.batchgen`` / ``DraftDecodeInput``).

``kv_indptr[i, :rows+1] = [0, cumsum_rows(seq_lens[r] + i + 1)]`` and
``kv_indices[i, kv_indptr[i, row] + t]`` = the t-th slot of that row. Step i therefore uses
``seq_lens_sum*topk + num_seqs*topk*(i+1)`` entries of its ``kv_indices`` row
(``draft_decode_used_len``; SGLang's ``draft_kv_indices_used_len``); later entries are untouched.

Grid ``(num_steps, num_seqs, topk)`` like SGLang's ``generate_draft_decode_kv_indices``: each
program finds its row's offset from a masked prefix sum over ``seq_lens`` (no host reads), writes
its own ``kv_indptr[i, row + 1]`` (program (i, 0, 0) also writes ``kv_indptr[i, 0] = 0``: every
entry ``0..rows`` is written by exactly one program) and its row's slots. Writes past a step's row
width ``W = kv_indices.shape[1]`` are dropped (the caller sizes W, e.g. ``num_seqs*topk*L``).

Bounded by construction (``seq_lens`` / ``req_pool_indices`` are device data a replay may fill
with anything): loads of ``req_to_token`` are masked to its ``[pool, L]`` shape, stores to
``kv_indices`` to ``[0, W)`` and to ``kv_indptr`` to its row length, and the copy loop runs at
most ``cdiv(L, COPY_BLOCK)`` times. What falls outside is dropped, never clamped onto another
entry (rules in ``draft_decode_kv_indices``'s docstring).
"""

import torch

from .. import _env  # noqa: F401  (sets TRITON_INTERPRET before any @triton.jit)

# isort: split
import triton
import triton.language as tl

from ._checks import INDEX_DTYPES, check_int, check_tensor
from ._op import kernel_op

COPY_BLOCK = 128  # prefix slots copied per loop iteration


def draft_decode_used_len(seq_lens_sum: int, num_seqs: int, topk: int, step: int) -> int:
    """Entries of step ``step``'s kv_indices row in use: ``seq_lens_sum*topk + num_seqs*topk*(step+1)``."""
    return seq_lens_sum * topk + num_seqs * topk * (step + 1)


@triton.jit
def _draft_decode_kv_indices_kernel(
    req_pool_indices_ptr,  # [>= num_seqs]
    req_to_token_ptr,  # [pool, L], row stride req_to_token_stride
    seq_lens_ptr,  # [num_seqs]
    kv_indices_ptr,  # [>= num_steps, W], row stride kv_indices_stride, written
    kv_indptr_ptr,  # [>= num_steps, >= rows+1], row stride kv_indptr_stride, written
    req_to_token_stride,
    kv_indices_stride,
    kv_indptr_stride,
    num_seqs,
    width,  # W: entries per kv_indices row; writes outside [0, W) are dropped
    indptr_width,  # kv_indptr.shape[1]: writes outside [0, it) are dropped
    pool,  # req_to_token.shape[0]: request rows outside [0, pool) are never read
    context_len,  # req_to_token.shape[1] = L: columns outside [0, L) are never read
    TOPK: tl.constexpr,
    NUM_STEPS: tl.constexpr,
    SEQ_BLOCK: tl.constexpr,  # next_pow2(num_seqs)
    STEP_BLOCK: tl.constexpr,  # next_pow2(num_steps)
    COPY_BLOCK: tl.constexpr,
):
    i = tl.program_id(0)  # step
    r = tl.program_id(1)  # sequence
    k = tl.program_id(2)  # branch
    row = r * TOPK + k

    # offset of row (r, k) = topk * sum_{r' < r} seq_lens[r'] + (r*topk + k) * (i+1) + k*seq_lens[r]
    # (negative lengths count as 0: rows never overlap)
    s = tl.arange(0, SEQ_BLOCK)
    lens = tl.load(seq_lens_ptr + s, mask=s < num_seqs, other=0).to(tl.int64)  # [SEQ_BLOCK]
    lens = tl.maximum(lens, 0)
    before = tl.sum(tl.where(s < r, lens, 0), 0)
    seq_len = tl.maximum(tl.load(seq_lens_ptr + r).to(tl.int64), 0)
    drafts = (i + 1).to(tl.int64)  # draft slots per row at step i
    offset = TOPK * before + row.to(tl.int64) * drafts + k * seq_len
    row_len = seq_len + drafts  # entries of row (r, k) at step i

    indptr_row = kv_indptr_ptr + i.to(tl.int64) * kv_indptr_stride
    indptr_ty = kv_indptr_ptr.dtype.element_ty
    tl.store(indptr_row + row + 1, (offset + row_len).to(indptr_ty), mask=row + 1 < indptr_width)
    if (r == 0) & (k == 0):  # row 0 starts the CSR: its offset is 0
        tl.store(indptr_row, offset.to(indptr_ty))

    req_slot = tl.load(req_pool_indices_ptr + r).to(tl.int64)
    row_ok = (req_slot >= 0) & (req_slot < pool)  # an out-of-pool request reads nothing
    req_slot = tl.where(row_ok, req_slot, 0)
    src = req_to_token_ptr + req_slot * req_to_token_stride
    dst = kv_indices_ptr + i.to(tl.int64) * kv_indices_stride + offset
    out_ty = kv_indices_ptr.dtype.element_ty
    # prefix: positions t < seq_len read column t; only t < L exist (at most L of them)
    prefix = tl.where(row_ok, tl.minimum(seq_len, context_len), 0)
    for b in range(tl.cdiv(prefix, COPY_BLOCK)):
        t = b * COPY_BLOCK + tl.arange(0, COPY_BLOCK).to(tl.int64)
        keep = (t < prefix) & (offset + t >= 0) & (offset + t < width)
        tl.store(dst + t, tl.load(src + t, mask=keep).to(out_ty), mask=keep)
    j = tl.arange(0, STEP_BLOCK).to(tl.int64)  # draft slots j = 0..i of branch k
    col = seq_len + k * NUM_STEPS + j  # their columns in the request's row
    pos = offset + seq_len + j  # their positions in kv_indices[i]
    # row_ok goes into the bound, not the mask: the interpreter rejects `block & scalar` masks
    num_drafts = tl.where(row_ok, drafts, 0)
    keep = (j < num_drafts) & (col < context_len) & (pos >= 0) & (pos < width)
    slots = tl.load(src + col, mask=keep)
    tl.store(dst + seq_len + j, slots.to(out_ty), mask=keep)


@kernel_op("refimpl::draft_decode_kv_indices", mutates_args=("kv_indices", "kv_indptr"))
def _draft_decode_kv_indices_op(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    topk: int,
    num_steps: int,
) -> None:
    num_seqs = seq_lens.shape[0]
    if num_seqs == 0:  # shape, not data: an empty batch launches nothing
        return
    _draft_decode_kv_indices_kernel[(num_steps, num_seqs, topk)](
        req_pool_indices,
        req_to_token,
        seq_lens,
        kv_indices,
        kv_indptr,
        req_to_token.stride(0),
        kv_indices.stride(0),
        kv_indptr.stride(0),
        num_seqs,
        kv_indices.shape[1],
        kv_indptr.shape[1],
        req_to_token.shape[0],
        req_to_token.shape[1],
        TOPK=topk,
        NUM_STEPS=num_steps,
        SEQ_BLOCK=triton.next_power_of_2(num_seqs),
        STEP_BLOCK=triton.next_power_of_2(num_steps),
        COPY_BLOCK=COPY_BLOCK,
    )


def _check_index_tensor(t, name: str, ndim: int) -> None:
    check_tensor(t, name, INDEX_DTYPES, ndim)


def draft_decode_kv_indices(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    *,
    topk: int,
    num_steps: int,
) -> None:
    """Fill every step's ``kv_indptr`` / ``kv_indices`` row in place (layout: module docstring).

    Shapes: req_pool_indices [>= num_seqs], req_to_token [pool, L], seq_lens [num_seqs]
    (num_seqs = seq_lens.numel()), kv_indices [>= num_steps, W], kv_indptr
    [>= num_steps, >= num_seqs*topk + 1]; all int32 or int64, same device. Only rows
    ``0..num_steps-1`` are written. Entries of ``kv_indices[i]`` past
    ``kv_indptr[i, num_seqs*topk]`` (and past W) are left untouched.

    Out-of-range values (not checked: that needs a host sync) are *dropped*, never clamped into
    another request's slots:

    - ``seq_lens[r] < 0`` counts as 0 (in the offsets and in ``kv_indptr`` too, so rows never
      overlap); larger lengths keep the layout above unchanged, whatever they are.
    - An entry whose source is outside ``req_to_token`` is not written (keeps its previous value):
      every entry of a sequence with ``rpi[r]`` outside ``[0, pool)``, and each prefix / draft
      entry whose column (``t`` resp. ``seq_lens[r] + k*num_steps + j``) is ``>= L``.
    - Stores outside ``[0, W)`` of a ``kv_indices`` row, or past ``kv_indptr.shape[1]``, are
      not made.

    Valid inputs (``0 <= seq_lens[r]``, ``seq_lens[r] + topk*num_steps <= L``,
    ``0 <= rpi[r] < pool``, W >= the used length) drop nothing.
    """
    check_int(topk, "topk", 1)
    check_int(num_steps, "num_steps", 1)
    _check_index_tensor(seq_lens, "seq_lens", 1)
    num_seqs = seq_lens.shape[0]
    _check_index_tensor(req_pool_indices, "req_pool_indices", 1)
    if req_pool_indices.shape[0] < num_seqs:
        raise ValueError(
            f"req_pool_indices.shape[0]={req_pool_indices.shape[0]}: must be >= "
            f"num_seqs = seq_lens.numel() = {num_seqs}"
        )
    _check_index_tensor(req_to_token, "req_to_token", 2)
    _check_index_tensor(kv_indices, "kv_indices", 2)
    if kv_indices.shape[0] < num_steps:
        raise ValueError(f"kv_indices.shape[0]={kv_indices.shape[0]}: must be >= num_steps={num_steps}")
    _check_index_tensor(kv_indptr, "kv_indptr", 2)
    rows = num_seqs * topk
    if kv_indptr.shape[0] < num_steps or kv_indptr.shape[1] < rows + 1:
        raise ValueError(
            f"kv_indptr.shape={tuple(kv_indptr.shape)}: must be at least "
            f"[num_steps={num_steps}, num_seqs*topk + 1 = {rows + 1}]"
        )
    for name, t in (
        ("req_to_token", req_to_token),
        ("seq_lens", seq_lens),
        ("kv_indices", kv_indices),
        ("kv_indptr", kv_indptr),
    ):
        if t.device != req_pool_indices.device:
            raise ValueError(f"{name}.device={t.device}: must match req_pool_indices.device={req_pool_indices.device}")
    _draft_decode_kv_indices_op(req_pool_indices, req_to_token, seq_lens, kv_indices, kv_indptr, topk, num_steps)


def draft_decode_kv_indices_ref(
    req_pool_indices: torch.Tensor, req_to_token: torch.Tensor, seq_lens: torch.Tensor, *, topk: int, num_steps: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Expected ``(kv_indptr, kv_indices)``: one int64 tensor per step, python loops.

    ``kv_indptr[i]`` is ``[num_seqs*topk + 1]``; ``kv_indices[i]`` is
    ``[draft_decode_used_len(sum(seq_lens), num_seqs, topk, i)]``.
    """
    lens = [int(x) for x in seq_lens.tolist()]
    rpi = [int(x) for x in req_pool_indices[: len(lens)].tolist()]
    table = req_to_token.cpu()
    indptrs, indices = [], []
    for i in range(num_steps):
        indptr, flat = [0], []
        for slot, n in zip(rpi, lens):
            for k in range(topk):
                cols = list(range(n)) + [n + k * num_steps + j for j in range(i + 1)]
                flat.extend(int(table[slot, c]) for c in cols)
                indptr.append(indptr[-1] + len(cols))
        dev = req_to_token.device
        indptrs.append(torch.tensor(indptr, dtype=torch.int64, device=dev))
        indices.append(torch.tensor(flat, dtype=torch.int64, device=dev))
    return indptrs, indices
