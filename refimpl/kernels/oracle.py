"""The dense attention oracle every kernel is checked against (float64, loops, host syncs: never in a graph).

Request i's queries are rows ``qo_indptr[i]:qo_indptr[i+1]``, its keys the cache rows
``kv_indices[kv_indptr[i]:kv_indptr[i+1]]``. Masks ([facts#target-verify-custom-mask]): ``custom_mask`` block ``[n_q_i,
kv_len_i]`` at ``mask_indptr[i]``; ``causal`` bottom-right aligned; both: both apply. MLA ([facts#memory-pools]): key =
the full latent|rope row, value = its first ``kv_lora_rank`` columns.
"""

from __future__ import annotations

import torch


def attention_from_dense(q, keys, values, sm_scale: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T * sm_scale) v for one request, per head, in float64: q [n_q, H, D], keys [n_k, Hkv, D], values [n_k,
    Hkv, Dv], mask [n_q, n_k] bool (True = may attend) -> [n_q, H, Dv]. GQA: head h reads kv head h // (H // Hkv). A
    query row with no visible key gets zeros."""
    (n_q, num_heads, _), (n_k, num_kv_heads, dv) = q.shape, values.shape
    assert num_heads % num_kv_heads == 0, "H must be a multiple of Hkv"
    out = q.new_zeros(n_q, num_heads, dv, dtype=torch.float64)
    mask = q.new_ones(n_q, n_k, dtype=torch.bool) if mask is None else mask
    assert mask.shape == (n_q, n_k), f"mask {tuple(mask.shape)} != {(n_q, n_k)}"
    for h in range(num_heads):
        k, v = (t[:, h // (num_heads // num_kv_heads)].double() for t in (keys, values))  # [n_k, D], [n_k, Dv]
        for r, visible in enumerate(mask):  # visible: [n_k] bool; an empty row stays zeros
            if visible.any():
                p = torch.softmax((k[visible] @ q[r, h].double()) * sm_scale, dim=0)  # [n_visible]
                out[r, h] = p @ v[visible]  # [Dv]
    return out


def mha_oracle(
    q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, sm_scale, custom_mask=None, mask_indptr=None, causal=False
) -> torch.Tensor:
    """Paged MHA/GQA over a ragged batch, float64: q [T, H, D], k_cache [slots, Hkv, D], v_cache [slots, Hkv, Dv],
    qo_indptr / kv_indptr [bs+1], kv_indices [>= kv_indptr[bs]] -> [T, H, Dv]."""
    out = q.new_zeros(*q.shape[:2], v_cache.shape[-1], dtype=torch.float64)  # [T, H, Dv]
    qo, kv = qo_indptr.tolist(), kv_indptr.tolist()
    assert len(kv) >= len(qo), "kv_indptr shorter than qo_indptr"
    for i, (q_lo, q_hi) in enumerate(zip(qo, qo[1:])):
        rows, cache_rows = slice(q_lo, q_hi), kv_indices[kv[i] : kv[i + 1]].long()  # [n_k] int64
        n_q, n_k = q_hi - q_lo, cache_rows.numel()
        mask = q.new_ones(n_q, n_k, dtype=torch.bool)  # request i's [n_q, n_k]
        if custom_mask is not None:
            assert mask_indptr is not None, "custom_mask needs mask_indptr"
            start = int(mask_indptr[i])
            mask &= custom_mask[start : start + n_q * n_k].view(n_q, n_k).bool()
        if causal:
            mask = mask.tril(n_k - n_q)  # row j sees keys t < n_k - n_q + j + 1
        out[rows] = attention_from_dense(q[rows], k_cache[cache_rows], v_cache[cache_rows], sm_scale, mask)
    return out


def mla_oracle(
    q_nope, q_rope, kv_cache, qo_indptr, kv_indptr, kv_indices, sm_scale, custom_mask=None, mask_indptr=None, causal=False
) -> torch.Tensor:
    """MLA as MQA over the latent cache, float64: q_nope [T, H, R], q_rope [T, H, Rr], kv_cache [slots, 1, R + Rr] -> [T,
    H, R]; key = the full row, value = its first R = kv_lora_rank columns."""
    rank = q_nope.shape[-1]
    assert kv_cache.shape[1:] == (1, rank + q_rope.shape[-1]), "kv_cache must be [slots, 1, R+Rr]"
    q = torch.cat([q_nope, q_rope], dim=-1)  # [T, H, R + Rr]; values: [slots, 1, R]
    return mha_oracle(
        q, kv_cache, kv_cache[..., :rank], qo_indptr, kv_indptr, kv_indices, sm_scale, custom_mask, mask_indptr, causal
    )


def csr_ref(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, lens) -> dict:
    """``{"kv_indptr": [0, cumsum(lens)], "kv_indices": the rows' first lens slots}`` on the host (int64): what a CSR
    builder must leave, from the request table alone."""
    lens = torch.as_tensor(lens, dtype=torch.int64, device="cpu")
    rows = req_to_token[req_pool_indices.to(req_to_token.device)].cpu().to(torch.int64)
    kv_indices = torch.cat([lens.new_zeros(0), *(rows[i, :n] for i, n in enumerate(lens.tolist()))])
    return {"kv_indptr": torch.cat([lens.new_zeros(1), lens.cumsum(0)]), "kv_indices": kv_indices}
