"""Multi-step draft-decode kv indices, one launch for all steps ([facts#multi-step-draft-decode-indices]).

Step i of row ``r*topk + k`` attends ``req_to_token[rpi[r], :seq_lens[r]]`` then branch k's ``i + 1`` draft slots at
columns ``seq_lens[r] + k*S + j`` (branch-major, as ``refimpl.batchgen``); step i uses
``sum(seq_lens)*topk + num_seqs*topk*(i+1)`` entries (SGLang's ``draft_kv_indices_used_len``). Grid
``(num_steps, num_seqs, topk)`` like SGLang's ``generate_draft_decode_kv_indices``, offsets from a masked prefix sum (no host reads).
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._checks import INDEX_DTYPES, check, check_int, check_pool_inputs, check_tensor
from ._op import kernel_op, next_power_of_2
from .indices import copy_row, pool_row
from .triton_decode import outer_strides

COPY_BLOCK = 128  # prefix slots copied per loop iteration


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
    COPY_BLOCK: tl.constexpr,
):
    i, r, k = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64), tl.program_id(2)  # step, sequence, branch
    row = r * TOPK + k
    # offset of row (r, k) = topk * sum_{r' < r} seq_lens[r'] + (r*topk + k) * (i+1) + k*seq_lens[r]
    # (negative lengths count as 0: rows never overlap)
    s = tl.arange(0, SEQ_BLOCK)
    lens = tl.maximum(tl.load(seq_lens_ptr + s, mask=s < num_seqs, other=0).to(tl.int64), 0)  # [SEQ_BLOCK]
    before = tl.sum(tl.where(s < r, lens, 0), 0)
    seq_len = tl.maximum(tl.load(seq_lens_ptr + r).to(tl.int64), 0)
    drafts = i + 1  # draft slots per row at step i
    offset = TOPK * before + row * drafts + k * seq_len
    indptr_row = kv_indptr_ptr + i * kv_indptr_stride
    # row (r, k) holds seq_len + drafts entries at step i (stores cast to the dtype)
    tl.store(indptr_row + row + 1, offset + seq_len + drafts, mask=row + 1 < indptr_width)
    if (r == 0) & (k == 0):  # row 0 starts the CSR: its offset is 0
        tl.store(indptr_row, offset)
    row_ok, src = pool_row(req_to_token_ptr, req_pool_indices_ptr, r, pool, req_to_token_stride)
    step_row = kv_indices_ptr + i * kv_indices_stride
    # prefix: positions t < seq_len read column t; only t < L exist (at most L of them)
    copy_row(src, step_row, offset, 0, tl.where(row_ok, tl.minimum(seq_len, context_len), 0), width, COPY_BLOCK)
    # then branch k's draft slots j = 0..i: columns col + j (only those < L), after the prefix
    col = seq_len + k * NUM_STEPS
    copy_row(
        src + col, step_row, offset + seq_len, 0, tl.where(row_ok, tl.minimum(drafts, context_len - col), 0), width, COPY_BLOCK
    )


@kernel_op("refimpl::draft_decode_kv_indices", mutates_args=("kv_indices", "kv_indptr"))
def _draft_decode_kv_indices_op(
    req_pool_indices: Tensor,
    req_to_token: Tensor,
    seq_lens: Tensor,
    kv_indices: Tensor,
    kv_indptr: Tensor,
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
        *outer_strides(req_to_token, kv_indices, kv_indptr),
        num_seqs,
        kv_indices.shape[1],  # width
        kv_indptr.shape[1],  # indptr_width
        *req_to_token.shape,  # pool, context_len
        topk,
        num_steps,
        next_power_of_2(num_seqs),  # SEQ_BLOCK
        COPY_BLOCK,
    )


def draft_decode_kv_indices(req_pool_indices, req_to_token, seq_lens, kv_indices, kv_indptr, *, topk, num_steps):
    """Fill every step's ``kv_indptr`` / ``kv_indices`` row in place (module docstring): req_pool_indices [>= num_seqs],
    req_to_token [pool, L], seq_lens [num_seqs], kv_indices [>= num_steps, W], kv_indptr [>= num_steps, >= num_seqs*topk
    + 1], int32 / int64. Out-of-range values are dropped, never clamped (``seq_lens[r] < 0`` counts as 0)."""
    check_int(topk, "topk", 1)
    check_int(num_steps, "num_steps", 1)
    num_seqs, dev = check_pool_inputs(req_to_token, req_pool_indices, seq_lens, "seq_lens")
    check_tensor(kv_indices, "kv_indices", INDEX_DTYPES, 2, dev, min_len=num_steps)
    check_tensor(kv_indptr, "kv_indptr", INDEX_DTYPES, 2, dev)
    check(
        kv_indptr.shape[0] >= num_steps and kv_indptr.shape[1] > num_seqs * topk,
        f"kv_indptr.shape={tuple(kv_indptr.shape)}: must be at least [num_steps={num_steps}, num_seqs*topk + 1 = {num_seqs * topk + 1}]",
    )
    _draft_decode_kv_indices_op(req_pool_indices, req_to_token, seq_lens, kv_indices, kv_indptr, topk, num_steps)


def draft_decode_kv_indices_ref(
    req_pool_indices: Tensor, req_to_token: Tensor, seq_lens: Tensor, *, topk: int, num_steps: int
) -> tuple[list[Tensor], list[Tensor]]:
    """Expected ``(kv_indptr, kv_indices)``, one int64 tensor per step (python loops): ``[num_seqs*topk + 1]`` and
    ``[sum(seq_lens)*topk + num_seqs*topk*(i+1)]``."""
    rows = [req_to_token[r].tolist() for r in req_pool_indices[: seq_lens.numel()].tolist()]  # the batch's rows
    indptrs, indices, as_tensor = [], [], lambda xs: torch.tensor(xs, dtype=torch.int64, device=req_to_token.device)
    for i in range(num_steps):
        indptr, flat = [0], []
        for row, n in zip(rows, seq_lens.tolist()):
            for k in range(topk):  # the prefix, then branch k's first i + 1 draft slots
                flat += [row[c] for c in [*range(n), *range(n + k * num_steps, n + k * num_steps + i + 1)]]
                indptr.append(len(flat))
        indptrs.append(as_tensor(indptr))
        indices.append(as_tensor(flat))
    return indptrs, indices
