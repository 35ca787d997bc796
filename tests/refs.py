"""Host references that only the tests use: what a kernel must write, computed plainly in torch (pytest puts this folder
on sys.path). The package keeps the references its own code runs (``refimpl.kernels``: ``csr_ref``,
``build_block_table_ref``, ``get_num_kv_splits_ref``, the oracles); these check kernels against them."""

import torch
from torch import Tensor

from refimpl import layout
from refimpl.kernels import attention_from_dense, build_block_table_ref, csr_ref, get_num_kv_splits_ref


def relative_error(out: Tensor, ref: Tensor) -> float:
    """||out - ref|| / max(||ref||, tiny), in float64 (NaN if out holds NaN)."""
    out, ref = out.double(), ref.double()
    return float((out - ref).norm()) / max(float(ref.norm()), torch.finfo(torch.float64).tiny)


def block_table_to_kv_indices(block_table: Tensor, seq_lens: Tensor, page_size: int) -> tuple[Tensor, Tensor]:
    """Host-side token-level CSR view of a block table: position t of request i is slot ``block_table[i, t // P] * P + t %
    P``. Returns int64 ``(kv_indptr [bs+1], kv_indices [sum(seq_lens)])``, bs = seq_lens.numel()."""
    bs, dev = seq_lens.numel(), block_table.device
    assert block_table.dim() == 2 and block_table.shape[0] >= bs, "block_table must be [>=bs, *]"
    room = block_table.shape[1] * page_size  # W*P positions
    if bs and (longest := int(seq_lens.max())) > room:
        raise ValueError(f"seq_lens up to {longest} positions exceed the block table's {room} (pages x page_size)")
    t = torch.arange(room, device=dev)  # [W*P] positions
    slots = block_table[:bs, t // page_size].long() * page_size + t % page_size  # [bs, W*P]: each position's slot
    csr = csr_ref(slots, torch.arange(bs, device=dev), seq_lens)  # request i's first seq_lens[i] slots (host)
    return csr["kv_indptr"].to(dev), csr["kv_indices"].to(dev)


def draft_decode_used_len(seq_lens_sum: int, num_seqs: int, topk: int, step: int) -> int:
    """Entries of step ``step``'s kv_indices row in use: ``seq_lens_sum*topk + num_seqs*topk*(step+1)``."""
    return seq_lens_sum * topk + num_seqs * topk * (step + 1)


def fused_graph_metadata_ref(
    req_to_token: Tensor,
    req_pool_indices: Tensor,
    seq_lens: Tensor,
    *,
    num_heads: int = 1,
    num_kv_heads: int = 1,
    max_kv_splits: int = 1,
    core_count: int = 0,
    static: bool = False,
    num_draft_tokens: int | None = None,
    custom_mask_src: Tensor | None = None,
) -> dict[str, Tensor]:
    """What ``fused_graph_metadata`` writes for valid inputs, on the host, int64 (``custom_mask``: the source's first
    ``min(src numel, mask_indptr[bs])`` entries as uint8)."""
    lens = seq_lens.cpu().long()
    bs, n = lens.numel(), num_draft_tokens
    out = csr_ref(req_to_token, req_pool_indices[:bs], lens)  # kv_indptr, kv_indices
    if n is None:
        splits = get_num_kv_splits_ref(
            lens.tolist(),
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            max_kv_splits=max_kv_splits,
            core_count=core_count,
            static=static,
        )
        return out | {"num_kv_splits": torch.tensor(splits, device="cpu")}  # (int64)
    out["qo_indptr"] = torch.arange(0, (bs + 1) * n, n, device="cpu")
    out["mask_indptr"] = layout.mask_indptr(lens, n)
    if custom_mask_src is not None:  # (slicing stops at the source's end)
        out["custom_mask"] = custom_mask_src.cpu()[: int(out["mask_indptr"][-1])].to(torch.uint8)
    return out


def mla_paged_attention_ref(q, kv_cache, block_table, seq_lens, max_seq_len, sm_scale, kv_lora_rank, out_scale=1.0):
    """What ``mla_paged_attention`` must write, in float64 (``attention_from_dense`` per request): request i's keys are its
    first ``min(seq_lens[i], max_seq_len, width * P)`` positions (slots ``bt[i, t // P] * P + t % P``); row j's causal
    bound ``t < seq_lens[i] - N + j + 1`` uses the *untruncated* length. Host reads: never call inside a graph."""
    bs, q_len, num_heads, _ = q.shape
    page_size, device = kv_cache.shape[1], q.device
    cap = min(max_seq_len, block_table.shape[1] * page_size)
    out = q.new_zeros(bs, q_len, num_heads, kv_lora_rank, dtype=torch.float64)
    for i, n in enumerate(seq_lens[:bs].tolist()):
        t = torch.arange(max(min(n, cap), 0), device=device)  # the keys request i may read
        # [n_k, 1, R + Rr]: key = the whole cache row, value = its first R columns
        rows = kv_cache[block_table[i, t // page_size].long(), t % page_size, None]
        mask = q.new_ones(q_len, t.numel(), dtype=torch.bool).tril(n - q_len)  # t < n - N + j + 1
        out[i] = attention_from_dense(q[i], rows, rows[..., :kv_lora_rank], sm_scale, mask)
    return out * out_scale


def trtllm_mla_graph_metadata_ref(req_pool_indices, seq_lens, req_to_token, block_table, seq_lens_k, *, seqlen_offset, page_size):
    """Expected ``(block_table, seq_lens_k)`` after the fused rebuild (copies; inputs untouched)."""
    lens_k = (seq_lens[: seq_lens_k.numel()].to(torch.int64) + seqlen_offset).to(seq_lens_k.dtype)
    return build_block_table_ref(req_to_token, req_pool_indices, lens_k, block_table, page_size), lens_k
