"""The dense attention oracle every kernel is checked against (float64, loops, no tricks).

Ragged layout: request i's queries are rows ``qo_indptr[i]:qo_indptr[i+1]``; its keys are the
cache rows ``kv_indices[kv_indptr[i]:kv_indptr[i+1]]`` (CSR). Masks follow the target-verify
layout ([facts#target-verify-custom-mask]):
request i's ``custom_mask`` block is row-major ``[n_q_i, kv_len_i]`` starting at
``mask_indptr[i]``; ``causal`` is bottom-right aligned (query row j of n_q sees keys
``t < kv_len - n_q + j + 1``); both given: both apply. MLA ([facts#memory-pools]): the key is the full
latent|rope cache row, the value its first ``kv_lora_rank`` columns. Written for clarity, not
speed; host syncs (``.tolist()``) are fine here because the oracle never runs inside a graph.
"""

from __future__ import annotations

import torch


def attention_from_dense(
    q: torch.Tensor,  # [n_q, H, D]
    keys: torch.Tensor,  # [n_k, Hkv, D]
    values: torch.Tensor,  # [n_k, Hkv, Dv]
    sm_scale: float,
    mask: torch.Tensor | None = None,  # [n_q, n_k] bool, True = may attend
) -> torch.Tensor:  # [n_q, H, Dv] float64
    """softmax(q k^T * sm_scale) v for one request, per head, in float64. GQA: head h reads kv
    head h // (H // Hkv). A query row with no visible key gets zeros."""
    n_q, num_heads, _ = q.shape
    n_k, num_kv_heads, dv = values.shape
    assert num_heads % num_kv_heads == 0, "H must be a multiple of Hkv"
    group = num_heads // num_kv_heads
    out = torch.zeros(n_q, num_heads, dv, dtype=torch.float64, device=q.device)
    if mask is None:
        mask = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device)
    assert mask.shape == (n_q, n_k), f"mask {tuple(mask.shape)} != {(n_q, n_k)}"
    for h in range(num_heads):
        k = keys[:, h // group].double()  # [n_k, D]
        v = values[:, h // group].double()  # [n_k, Dv]
        for r in range(n_q):
            visible = mask[r]  # [n_k] bool
            if not bool(visible.any()):
                continue  # empty row -> zeros
            s = (k[visible] @ q[r, h].double()) * sm_scale  # [n_visible]
            p = torch.softmax(s, dim=0)
            out[r, h] = p @ v[visible]  # [Dv]
    return out


def _request_mask(
    i: int,
    n_q: int,
    n_k: int,
    custom_mask: torch.Tensor | None,
    mask_indptr: torch.Tensor | None,
    causal: bool,
    device: torch.device,
) -> torch.Tensor:  # [n_q, n_k] bool
    mask = torch.ones(n_q, n_k, dtype=torch.bool, device=device)
    if custom_mask is not None:
        assert mask_indptr is not None, "custom_mask needs mask_indptr"
        start = int(mask_indptr[i])
        mask &= custom_mask[start : start + n_q * n_k].view(n_q, n_k).bool()
    if causal:
        j = torch.arange(n_q, device=device)[:, None]  # [n_q, 1]
        t = torch.arange(n_k, device=device)[None, :]  # [1, n_k]
        mask &= t < n_k - n_q + j + 1
    return mask


def _per_request(qo_indptr, kv_indptr, kv_indices):
    """Yield (i, query rows slice, cache rows [n_k] int64) per request."""
    bs = qo_indptr.numel() - 1
    assert kv_indptr.numel() >= bs + 1, "kv_indptr shorter than qo_indptr"
    qo, kv = qo_indptr.tolist(), kv_indptr.tolist()
    for i in range(bs):
        yield i, slice(qo[i], qo[i + 1]), kv_indices[kv[i] : kv[i + 1]].long()


def mha_oracle(
    q: torch.Tensor,  # [T, H, D]
    k_cache: torch.Tensor,  # [slots, Hkv, D]
    v_cache: torch.Tensor,  # [slots, Hkv, Dv]
    qo_indptr: torch.Tensor,  # [bs+1]
    kv_indptr: torch.Tensor,  # [bs+1]
    kv_indices: torch.Tensor,  # [>= kv_indptr[bs]]
    sm_scale: float,
    custom_mask: torch.Tensor | None = None,
    mask_indptr: torch.Tensor | None = None,
    causal: bool = False,
) -> torch.Tensor:  # [T, H, Dv] float64
    """Paged MHA/GQA over a ragged batch, float64."""
    shape = (q.shape[0], q.shape[1], v_cache.shape[-1])
    out = torch.zeros(shape, dtype=torch.float64, device=q.device)  # [T, H, Dv]
    for i, rows, cache_rows in _per_request(qo_indptr, kv_indptr, kv_indices):
        n_q, n_k = rows.stop - rows.start, cache_rows.numel()
        mask = _request_mask(i, n_q, n_k, custom_mask, mask_indptr, causal, q.device)
        out[rows] = attention_from_dense(q[rows], k_cache[cache_rows], v_cache[cache_rows], sm_scale, mask)
    return out


def mla_oracle(
    q_nope: torch.Tensor,  # [T, H, R]
    q_rope: torch.Tensor,  # [T, H, Rr]
    kv_cache: torch.Tensor,  # [slots, 1, R + Rr]
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    sm_scale: float,
    custom_mask: torch.Tensor | None = None,
    mask_indptr: torch.Tensor | None = None,
    causal: bool = False,
) -> torch.Tensor:  # [T, H, R] float64
    """MLA as MQA over the latent cache: key = full row, value = first R = kv_lora_rank columns."""
    rank = q_nope.shape[-1]
    assert kv_cache.shape[1:] == (1, rank + q_rope.shape[-1]), "kv_cache must be [slots, 1, R+Rr]"
    q = torch.cat([q_nope, q_rope], dim=-1)  # [T, H, R + Rr]
    values = kv_cache[..., :rank]  # [slots, 1, R]
    return mha_oracle(q, kv_cache, values, qo_indptr, kv_indptr, kv_indices, sm_scale, custom_mask, mask_indptr, causal)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / max(||ref||, tiny), in float64 (NaN if out holds NaN)."""
    out, ref = out.double(), ref.double()
    denom = max(float(torch.linalg.vector_norm(ref)), torch.finfo(torch.float64).tiny)
    return float(torch.linalg.vector_norm(out - ref)) / denom


def csr_ref(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, lens) -> dict:
    """``{"kv_indptr": [0, cumsum(lens)], "kv_indices": the rows' first lens slots}`` on the host
    (int64): what a CSR builder must leave, from the request table alone."""
    lens = torch.as_tensor(lens, dtype=torch.int64, device="cpu")
    rows = req_to_token[req_pool_indices.to(req_to_token.device)].cpu().to(torch.int64)
    indices = [rows[i, : int(n)] for i, n in enumerate(lens)]
    return {
        "kv_indptr": torch.cat([lens.new_zeros(1), lens.cumsum(0)]),
        "kv_indices": torch.cat(indices) if indices else lens.new_zeros(0),
    }
