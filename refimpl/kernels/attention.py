"""Graph-safe dense paged attention in plain torch (MHA/GQA and MLA), as registered custom ops.

The "hello world" backend's kernel: CSR indices, the target-verify custom mask ([facts#target-verify-custom-mask]), the
MLA latent|rope cache ([facts#memory-pools]), fixed shapes. Request i owns query rows ``i*q_per_req : (i+1)*q_per_req``
and a ``[max_kv_len]`` key window ``kv_indptr[i] + t``; positions ``t >= kv_len_i`` are clamped, their values zeroed and
scores -inf, so garbage (even NaN) cannot leak in. ``max_kv_len`` / ``q_per_req`` are Python ints frozen at capture (the
caller guarantees ``kv_len_i <= max_kv_len``). ``custom_mask`` holds request i's row-major ``[q_per_req, kv_len_i]``
block at ``mask_indptr[i]``; ``causal`` shows row j the keys ``t < kv_len_i - q_per_req + j + 1``; both: both apply.
float32 compute; a row with no visible key writes zeros.
"""

import torch
from torch import Tensor

from ._checks import FLOAT_DTYPES, INDEX_DTYPES, check, check_float, check_int, check_mask, check_paged_qkvo, check_tensor
from ._op import kernel_op
from .bounds import guard_csr


def _gather_window(kv_indptr, kv_indices, max_kv_len: int, q_per_req: int, custom_mask, mask_indptr, causal: bool):
    """Fixed-shape key window per request, M = max_kv_len: ``slots [bs, M]`` int64 (cache rows, 0 where invalid), ``key_ok
    [bs, M]`` bool (inside the kv range) and ``allowed [bs, Q, M]`` (key_ok AND masks; ``[bs, 1, M]`` without any)."""
    bs, device, indptr = kv_indptr.shape[0] - 1, kv_indptr.device, kv_indptr.long()  # [bs+1]
    kv_start, kv_len = indptr[:-1], indptr.diff()  # [bs], [bs]
    t, j = torch.arange(max_kv_len, device=device), torch.arange(q_per_req, device=device)  # [M] key, [Q] query row
    key_ok = t < kv_len[:, None]  # [bs, M]
    pos = (kv_start[:, None] + t).clamp(0, kv_indices.shape[0] - 1)  # [bs, M]
    slots = torch.where(key_ok, kv_indices[pos].long(), 0)  # [bs, M] int64
    allowed = key_ok[:, None]  # [bs, 1, M]: broadcasts over Q
    if causal:
        limit = kv_len[:, None] - q_per_req + j[None, :] + 1  # [bs, Q] keys visible to row j
        allowed = allowed & (t < limit[..., None])
    if custom_mask is not None:  # (with mask_indptr: the wrappers check both or neither)
        flat = mask_indptr[:bs, None, None].long() + j[:, None] * kv_len[:, None, None] + t  # [bs, Q, M]
        allowed = allowed & custom_mask[flat.clamp(0, custom_mask.shape[0] - 1)].bool()  # out-of-block entries: masked anyway
    return slots, key_ok, allowed


def _masked_attention(q, k, v, key_ok, allowed, sm_scale: float) -> Tensor:
    """float32 ``q [bs, Q, Hkv, G, Dk]`` (G = query heads per kv head), ``k [bs, M, Hkv, Dk]``, ``v [bs, M, Hkv, Dv]``,
    bool ``key_ok [bs, M]``, ``allowed [bs, Q or 1, M]`` -> ``[bs, Q, Hkv, G, Dv]``."""
    # Slots outside the window may hold NaN/inf: a NaN key only spoils its own score, which the
    # where() below replaces; a NaN value would spoil the whole row (0 * NaN), so zero it.
    v = torch.where(key_ok[:, :, None, None], v, 0.0)
    scores = torch.einsum("bqhgd,bmhd->bhgqm", q, k) * sm_scale  # [bs, Hkv, G, Q, M]
    allow = allowed[:, None, None]  # [bs, 1, 1, Q or 1, M]
    scores = torch.where(allow, scores, float("-inf"))
    row_max = scores.amax(-1, keepdim=True)  # [bs, Hkv, G, Q, 1]
    row_max = torch.where(torch.isfinite(row_max), row_max, 0.0)  # empty rows: -inf -> 0
    p = torch.where(allow, torch.exp(scores - row_max), 0.0)  # [bs, Hkv, G, Q, M]
    denom = p.sum(-1, keepdim=True)
    p = p / torch.where(denom > 0, denom, 1.0)  # empty rows stay all-zero
    return torch.einsum("bhgqm,bmhd->bqhgd", p, v)  # [bs, Q, Hkv, G, Dv]


def _launch(what, op, inputs, kv_indptr, kv_indices, out, sm_scale, max_kv_len, q_per_req, mask, mask_indptr, causal):
    """The checks both wrappers share (shapes / dtypes / devices only: graph-safe), the bounds guard, the launch;
    ``inputs`` end with the cache (slots first), ``out`` is checked already."""
    check_int(max_kv_len, "max_kv_len", 1)
    check_int(q_per_req, "q_per_req", 1)
    check_float(sm_scale, "sm_scale")
    check_tensor(kv_indptr, "kv_indptr", INDEX_DTYPES, 1, out.device, min_len=1)
    check_tensor(kv_indices, "kv_indices", INDEX_DTYPES, 1, out.device, min_len=1)
    bs, rows = kv_indptr.shape[0] - 1, out.shape[0]
    check(
        rows == bs * q_per_req, f"q.shape[0]={rows}: must equal bs * q_per_req = {bs} * {q_per_req} (bs = kv_indptr.numel() - 1)"
    )
    check_mask(mask, mask_indptr, bs, out.device)
    kv_indptr, kv_indices = guard_csr(what, kv_indptr, kv_indices, bs, inputs[-1].shape[0])
    op(*inputs, kv_indptr, kv_indices, out, float(sm_scale), max_kv_len, q_per_req, mask, mask_indptr, bool(causal))


@kernel_op("refimpl::dense_paged_attention", mutates_args=("out",))
def _dense_paged_attention_op(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    out: Tensor,
    sm_scale: float,
    max_kv_len: int,
    q_per_req: int,
    custom_mask: Tensor | None,
    mask_indptr: Tensor | None,
    causal: bool,
) -> None:
    """The body of both ops: q [T, H, D], k_cache [slots, Hkv, D], v_cache [slots, Hkv, Dv] (MLA: the cache and its latent
    columns, Hkv = 1), out [T, H, Dv]."""
    bs, kv_heads = kv_indptr.shape[0] - 1, k_cache.shape[1]
    slots, key_ok, allowed = _gather_window(kv_indptr, kv_indices, max_kv_len, q_per_req, custom_mask, mask_indptr, causal)
    q5 = q.float().reshape(bs, q_per_req, kv_heads, q.shape[1] // kv_heads, q.shape[2])  # [bs, Q, Hkv, G, D]
    k, v = k_cache[slots].float(), v_cache[slots].float()  # [bs, M, Hkv, D], [bs, M, Hkv, Dv]
    o = _masked_attention(q5, k, v, key_ok, allowed, sm_scale)  # [bs, Q, Hkv, G, Dv]
    out.copy_(o.reshape(out.shape))  # [T, H, Dv], cast to out.dtype


def dense_paged_attention(
    q,
    k_cache,
    v_cache,
    kv_indptr,
    kv_indices,
    out,
    *,
    sm_scale,
    max_kv_len,
    q_per_req,
    custom_mask=None,
    mask_indptr=None,
    causal=False,
) -> None:
    """Write softmax(q k^T * sm_scale) v into ``out`` for a uniform batch (module docstring): q [bs*q_per_req, H, D],
    k_cache [slots, Hkv, D], v_cache [slots, Hkv, Dv], kv_indptr [bs+1] (the ``[:bs+1]`` view), kv_indices [>=
    kv_indptr[bs]], out [bs*q_per_req, H, Dv]; GQA; sm_scale / max_kv_len / q_per_req Python numbers, causal a bool."""
    check_paged_qkvo(q, k_cache, v_cache, out, ("q", "k_cache", "v_cache", "out"))
    check(k_cache.shape[0] >= 1, f"k_cache.shape[0]={k_cache.shape[0]}: must be >= 1")
    _launch(
        "dense_paged_attention",
        _dense_paged_attention_op,
        (q, k_cache, v_cache),
        kv_indptr,
        kv_indices,
        out,
        sm_scale,
        max_kv_len,
        q_per_req,
        custom_mask,
        mask_indptr,
        causal,
    )


# MLA: key = full latent|rope row, value = latent part ([facts#memory-pools])
@kernel_op("refimpl::dense_paged_mla_attention", mutates_args=("out",))
def _dense_paged_mla_attention_op(
    q_nope: Tensor,
    q_rope: Tensor,
    kv_cache: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    out: Tensor,
    sm_scale: float,
    max_kv_len: int,
    q_per_req: int,
    custom_mask: Tensor | None,
    mask_indptr: Tensor | None,
    causal: bool,
) -> None:
    q = torch.cat([q_nope, q_rope], dim=-1)  # the MHA op's body, on the cache (key) and its latent columns (value)
    _dense_paged_attention_op.fn(
        q,
        kv_cache,
        kv_cache[..., : q_nope.shape[-1]],
        kv_indptr,
        kv_indices,
        out,
        sm_scale,
        max_kv_len,
        q_per_req,
        custom_mask,
        mask_indptr,
        causal,
    )


def dense_paged_mla_attention(
    q_nope,
    q_rope,
    kv_cache,
    kv_indptr,
    kv_indices,
    out,
    *,
    sm_scale,
    max_kv_len,
    q_per_req,
    custom_mask=None,
    mask_indptr=None,
    causal=False,
) -> None:
    """MLA: q_nope [T, H, R], q_rope [T, H, Rr], kv_cache [slots, 1, R + Rr], out [T, H, R]; scores use the full cache row,
    values its first R = kv_lora_rank columns (the latent)."""
    check_tensor(q_nope, "q_nope", FLOAT_DTYPES, 3)
    for name, t in (("q_rope", q_rope), ("kv_cache", kv_cache), ("out", out)):
        check_tensor(t, name, FLOAT_DTYPES, 3, q_nope.device)
    (rows, num_heads, rank), rope = q_nope.shape, q_rope.shape[2]
    check(
        q_rope.shape[:2] == (rows, num_heads),
        f"q_rope.shape={tuple(q_rope.shape)}: must start with {(rows, num_heads)} like q_nope",
    )
    slots, *tail = kv_cache.shape
    check(
        slots >= 1 and tail == [1, rank + rope],
        f"kv_cache.shape={tuple(kv_cache.shape)}: must be [slots >= 1, 1, {rank} + {rope}]",
    )
    check(out.shape == (rows, num_heads, rank), f"out.shape={tuple(out.shape)}: must be {(rows, num_heads, rank)}")
    _launch(
        "dense_paged_mla_attention",
        _dense_paged_mla_attention_op,
        (q_nope, q_rope, kv_cache),
        kv_indptr,
        kv_indices,
        out,
        sm_scale,
        max_kv_len,
        q_per_req,
        custom_mask,
        mask_indptr,
        causal,
    )
