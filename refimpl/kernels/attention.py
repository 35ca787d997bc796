"""Graph-safe dense paged attention in plain torch (MHA/GQA and MLA), as registered custom ops.

The "hello world" backend's kernel. It reads the KV cache through CSR indices and supports the
target-verify custom mask layout ([facts#target-verify-custom-mask]); MLA reads the one-buffer
latent|rope cache
of [facts#memory-pools]. Everything has a *fixed shape* so it can live inside a CUDA graph:

- every request gets a ``[max_kv_len]`` window of key positions ``kv_indptr[i] + t``; positions
  ``t >= kv_len_i`` are clamped to a safe index, their values zeroed and their scores set to
  -inf, so garbage (even NaN) in unread cache slots or in ``kv_indices`` past ``kv_indptr[bs]``
  cannot leak into the result;
- queries use the uniform layout of ``refimpl.layout``: request i owns rows
  ``i*q_per_req : (i+1)*q_per_req``;
- ``max_kv_len`` and ``q_per_req`` are Python ints, frozen when a graph captures the op. The
  caller guarantees ``kv_len_i <= max_kv_len`` (keys beyond the window are silently ignored).

Masks: ``custom_mask`` (bool/uint8, flattened) holds request i's row-major ``[q_per_req,
kv_len_i]`` block at ``mask_indptr[i]``; ``causal`` lets query row j see keys
``t < kv_len_i - q_per_req + j + 1`` (bottom-right aligned). Both given: both apply (AND).
Compute is float32; a row with no visible key writes zeros.
"""

import torch

from ._checks import FLOAT_DTYPES as _FLOAT_DTYPES
from ._checks import INDEX_DTYPES as _INDEX_DTYPES
from ._checks import check as _check
from ._checks import check_float, check_int, check_mask, check_paged_qkvo, check_tensor
from ._op import kernel_op

# ----------------------------------------------------------------------------------------------
# shared gather / mask / softmax (used by both ops)


def _gather_window(
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    max_kv_len: int,
    q_per_req: int,
    custom_mask: torch.Tensor | None,
    mask_indptr: torch.Tensor | None,
    causal: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fixed-shape key window per request.

    Returns ``slots [bs, M]`` int64 (cache rows, 0 where invalid), ``key_ok [bs, M]`` bool (inside
    the request's kv range) and ``allowed [bs, Q, M]`` bool (key_ok AND masks), M = max_kv_len.
    """
    bs = kv_indptr.shape[0] - 1
    device = kv_indptr.device
    indptr = kv_indptr.to(torch.int64)  # [bs+1]
    kv_start = indptr[:-1]  # [bs]
    kv_len = indptr[1:] - kv_start  # [bs]
    t = torch.arange(max_kv_len, device=device)  # [M] key position in the request
    j = torch.arange(q_per_req, device=device)  # [Q] query row in the request

    key_ok = t[None, :] < kv_len[:, None]  # [bs, M]
    pos = (kv_start[:, None] + t[None, :]).clamp(0, kv_indices.shape[0] - 1)  # [bs, M]
    slots = torch.where(key_ok, kv_indices[pos].to(torch.int64), 0)  # [bs, M] int64

    allowed = key_ok[:, None, :].expand(bs, q_per_req, max_kv_len)  # [bs, Q, M]
    if causal:
        limit = kv_len[:, None] - q_per_req + j[None, :] + 1  # [bs, Q] keys visible to row j
        allowed = allowed & (t[None, None, :] < limit[:, :, None])
    if custom_mask is not None:
        assert mask_indptr is not None
        m_start = mask_indptr[:bs].to(torch.int64)  # [bs]
        flat = m_start[:, None, None] + j[None, :, None] * kv_len[:, None, None] + t  # [bs, Q, M]
        flat = flat.clamp(0, custom_mask.shape[0] - 1)  # out-of-block entries are masked anyway
        allowed = allowed & custom_mask[flat].to(torch.bool)
    return slots, key_ok, allowed


def _masked_attention(
    q: torch.Tensor,  # [bs, Q, Hkv, G, Dk] float32, G = query heads per kv head
    k: torch.Tensor,  # [bs, M, Hkv, Dk] float32
    v: torch.Tensor,  # [bs, M, Hkv, Dv] float32
    key_ok: torch.Tensor,  # [bs, M] bool
    allowed: torch.Tensor,  # [bs, Q, M] bool
    sm_scale: float,
) -> torch.Tensor:  # [bs, Q, Hkv, G, Dv] float32
    # Slots outside the window may hold NaN/inf: a NaN key only spoils its own score, which the
    # where() below replaces; a NaN value would spoil the whole row (0 * NaN), so zero it.
    v = torch.where(key_ok[:, :, None, None], v, 0.0)
    scores = torch.einsum("bqhgd,bmhd->bhgqm", q, k) * sm_scale  # [bs, Hkv, G, Q, M]
    allow = allowed[:, None, None, :, :]  # [bs, 1, 1, Q, M]
    scores = torch.where(allow, scores, float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True)  # [bs, Hkv, G, Q, 1]
    row_max = torch.where(torch.isfinite(row_max), row_max, 0.0)  # empty rows: -inf -> 0
    p = torch.where(allow, torch.exp(scores - row_max), 0.0)  # [bs, Hkv, G, Q, M]
    denom = p.sum(dim=-1, keepdim=True)
    p = p / torch.where(denom > 0, denom, 1.0)  # empty rows stay all-zero
    return torch.einsum("bhgqm,bmhd->bqhgd", p, v)  # [bs, Q, Hkv, G, Dv]


# ----------------------------------------------------------------------------------------------
# shared validation (shapes / dtypes / devices only: graph-safe)


def _check_dtype(t: torch.Tensor, name: str, allowed: tuple) -> None:
    check_tensor(t, name, allowed)


def _check_window_args(
    q_rows: int,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    sm_scale: float,
    max_kv_len: int,
    q_per_req: int,
    custom_mask: torch.Tensor | None,
    mask_indptr: torch.Tensor | None,
    device: torch.device,
) -> None:
    """Checks shared by both ops: CSR tensors, window sizes, mask tensors, devices."""
    check_int(max_kv_len, "max_kv_len", 1)
    check_int(q_per_req, "q_per_req", 1)
    check_float(sm_scale, "sm_scale")
    for name, t in (("kv_indptr", kv_indptr), ("kv_indices", kv_indices)):
        check_tensor(t, name, _INDEX_DTYPES, 1, device, min_len=1)
    bs = kv_indptr.shape[0] - 1
    _check(
        q_rows == bs * q_per_req,
        f"q.shape[0]={q_rows}: must equal bs * q_per_req = {bs} * {q_per_req} (bs = kv_indptr.numel() - 1)",
    )
    check_mask(custom_mask, mask_indptr, bs, device)


def _check_float3d(t: torch.Tensor, name: str, device: torch.device) -> None:
    _check_dtype(t, name, _FLOAT_DTYPES)
    _check(t.dim() == 3, f"{name}.shape={tuple(t.shape)}: must be 3-D")
    _check(t.device == device, f"{name}.device={t.device}: must match q.device={device}")


# ----------------------------------------------------------------------------------------------
# MHA / GQA


@kernel_op("refimpl::dense_paged_attention", mutates_args=("out",))
def _dense_paged_attention_op(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    out: torch.Tensor,
    sm_scale: float,
    max_kv_len: int,
    q_per_req: int,
    custom_mask: torch.Tensor | None,
    mask_indptr: torch.Tensor | None,
    causal: bool,
) -> None:
    bs = kv_indptr.shape[0] - 1
    _, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    group = num_heads // num_kv_heads
    slots, key_ok, allowed = _gather_window(
        kv_indptr, kv_indices, max_kv_len, q_per_req, custom_mask, mask_indptr, causal
    )
    q5 = q.float().reshape(bs, q_per_req, num_kv_heads, group, head_dim)  # [bs, Q, Hkv, G, D]
    k = k_cache[slots].float()  # [bs, M, Hkv, D]
    v = v_cache[slots].float()  # [bs, M, Hkv, Dv]
    o = _masked_attention(q5, k, v, key_ok, allowed, sm_scale)  # [bs, Q, Hkv, G, Dv]
    out.copy_(o.reshape(out.shape))  # [T, H, Dv], cast to out.dtype


def dense_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    out: torch.Tensor,
    *,
    sm_scale: float,
    max_kv_len: int,
    q_per_req: int,
    custom_mask: torch.Tensor | None = None,
    mask_indptr: torch.Tensor | None = None,
    causal: bool = False,
) -> None:
    """Write softmax(q k^T * sm_scale) v into ``out`` for a uniform batch (see module docstring).

    Shapes: q [bs*q_per_req, H, D], k_cache [slots, Hkv, D], v_cache [slots, Hkv, Dv],
    kv_indptr [bs+1] (pass the ``[:bs+1]`` view), kv_indices [>= kv_indptr[bs]],
    out [bs*q_per_req, H, Dv]. GQA: query head h reads kv head h // (H // Hkv).
    """
    rows = check_paged_qkvo(q, k_cache, v_cache, out, ("q", "k_cache", "v_cache", "out"))[0]
    device = q.device
    _check(k_cache.shape[0] >= 1, f"k_cache.shape[0]={k_cache.shape[0]}: must be >= 1")
    _check_window_args(rows, kv_indptr, kv_indices, sm_scale, max_kv_len, q_per_req, custom_mask, mask_indptr, device)
    _dense_paged_attention_op(
        q, k_cache, v_cache, kv_indptr, kv_indices, out, float(sm_scale), max_kv_len, q_per_req,
        custom_mask, mask_indptr, bool(causal),
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# MLA: key = full latent|rope row, value = latent part ([facts#memory-pools])


@kernel_op("refimpl::dense_paged_mla_attention", mutates_args=("out",))
def _dense_paged_mla_attention_op(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    kv_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    out: torch.Tensor,
    sm_scale: float,
    max_kv_len: int,
    q_per_req: int,
    custom_mask: torch.Tensor | None,
    mask_indptr: torch.Tensor | None,
    causal: bool,
) -> None:
    bs = kv_indptr.shape[0] - 1
    _, num_heads, kv_lora_rank = q_nope.shape
    slots, key_ok, allowed = _gather_window(
        kv_indptr, kv_indices, max_kv_len, q_per_req, custom_mask, mask_indptr, causal
    )
    q = torch.cat([q_nope, q_rope], dim=-1).float()  # [T, H, R + rope]
    q5 = q.reshape(bs, q_per_req, 1, num_heads, q.shape[-1])  # [bs, Q, 1, H, R + rope]
    kv = kv_cache[slots].float()  # [bs, M, 1, R + rope]
    o = _masked_attention(q5, kv, kv[..., :kv_lora_rank], key_ok, allowed, sm_scale)
    out.copy_(o.reshape(out.shape))  # [T, H, R]


def dense_paged_mla_attention(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    kv_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    out: torch.Tensor,
    *,
    sm_scale: float,
    max_kv_len: int,
    q_per_req: int,
    custom_mask: torch.Tensor | None = None,
    mask_indptr: torch.Tensor | None = None,
    causal: bool = False,
) -> None:
    """MLA flavour: q_nope [T, H, R], q_rope [T, H, Rr], kv_cache [slots, 1, R + Rr], out [T, H, R].

    R = kv_lora_rank = q_nope.shape[-1] (512 for DeepSeek), Rr = q_rope.shape[-1] (64). Scores use
    the full cache row; values are its first R columns (the latent).
    """
    _check_dtype(q_nope, "q_nope", _FLOAT_DTYPES)
    device = q_nope.device
    for name, t in (("q_nope", q_nope), ("q_rope", q_rope), ("kv_cache", kv_cache), ("out", out)):
        _check_float3d(t, name, device)
    rows, num_heads, rank = q_nope.shape
    rope = q_rope.shape[2]
    _check(
        tuple(q_rope.shape[:2]) == (rows, num_heads),
        f"q_rope.shape={tuple(q_rope.shape)}: must start with {(rows, num_heads)} like q_nope",
    )
    want_kv = (1, rank + rope)
    _check(
        kv_cache.shape[0] >= 1 and tuple(kv_cache.shape[1:]) == want_kv,
        f"kv_cache.shape={tuple(kv_cache.shape)}: must be [slots >= 1, 1, {rank} + {rope}]",
    )
    want = (rows, num_heads, rank)
    _check(tuple(out.shape) == want, f"out.shape={tuple(out.shape)}: must be {want}")
    _check_window_args(rows, kv_indptr, kv_indices, sm_scale, max_kv_len, q_per_req, custom_mask, mask_indptr, device)
    _dense_paged_mla_attention_op(
        q_nope, q_rope, kv_cache, kv_indptr, kv_indices, out, float(sm_scale), max_kv_len,
        q_per_req, custom_mask, mask_indptr, bool(causal),
    )  # fmt: skip
