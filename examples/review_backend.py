"""A pull request under review: a paged attention backend for decode *and* target verify.

Notebook 07 reviews it. ``ReviewBackendBuggy`` is the PR as submitted; ``ReviewBackend`` is the
same class after review, one line of the replay hook changed::

    python -m refimpl check --backend-class examples.review_backend:ReviewBackendBuggy  # exit 1
    python -m refimpl check --backend-class examples.review_backend:ReviewBackend       # exit 0

The PR's description: page size 1, CSR metadata (``kv_indptr`` / ``kv_indices``) read by
``dense_paged_attention``; decode and idle as in ``examples/paged_decode_backend.py``, plus
target verify (EAGLE): each request has N query rows (its draft tokens), attends its prefix and
its N drafts (``kv_len = seq_len + N``) through the spec's tree mask, a row-major ``[N, kv_len]``
block per request at ``mask_indptr[i]`` ([facts#target-verify-custom-mask]). Pattern C: the
capture hook sets the graph's metadata up, the replay hook refreshes the buffers in place.

Static buffers (``init_cuda_graph_state``; B = max_bs, T = max_num_tokens, L = context length):

| buffer        | shape  | dtype | holds                                          |
|---------------|--------|-------|------------------------------------------------|
| kv_indptr     | [B+1]  | int32 | ``[0, cumsum(kv_lens)]``                        |
| kv_indices    | [B*L]  | int64 | every request's kv slots, packed               |
| custom_mask   | [T*L]  | uint8 | verify: the spec's tree mask, packed           |
| mask_indptr   | [B+1]  | int64 | verify: ``[0, cumsum(N * kv_lens)]``            |
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from refimpl import layout
from refimpl.backends.base import AttentionBackend
from refimpl.kernels import build_kv_indices, build_kv_indices_ref, dense_paged_attention
from refimpl.modes import ForwardMode


@dataclass
class ReviewMetadata:
    kv_indptr: torch.Tensor  # [bs+1] int32
    kv_indices: torch.Tensor  # [>= kv_indptr[bs]] int64
    q_per_req: int  # 1 (decode) or N (verify); frozen in a graph
    max_kv_len: int  # a bound valid for every future batch; frozen in a graph
    custom_mask: torch.Tensor | None = None  # verify: [>= mask_indptr[bs]] bool / uint8
    mask_indptr: torch.Tensor | None = None  # verify: [bs+1] int64


class ReviewBackend(AttentionBackend):
    """Decode, idle and target verify under graphs; the reviewed version (passes the checker)."""

    name = "review_backend"
    variant = "reviewed"
    pattern = "C"
    graph_modes = frozenset({ForwardMode.DECODE, ForwardMode.IDLE, ForwardMode.TARGET_VERIFY})
    model_kind = "mha"
    graph_buffer_names = ("cuda_graph_kv_indptr", "cuda_graph_kv_indices", "cuda_graph_custom_mask", "cuda_graph_mask_indptr")

    def _rows(self, mode: ForwardMode) -> int:
        """Query rows per request: N in target verify, else 1."""
        return self.spec.num_draft_tokens if mode.is_target_verify() else 1

    def _copy_mask(self, spec_info) -> None:
        mask = spec_info.custom_mask
        if mask is None or mask.numel() > self.cuda_graph_custom_mask.numel():
            raise ValueError(f"{self.name}: verify needs a tree mask that fits the graph buffer")
        self.cuda_graph_custom_mask[: mask.numel()].copy_(mask)

    # --- eager: fresh tensors are fine ----------------------------------------------------------
    def init_forward_metadata(self, fb):
        mode, bs = fb.forward_mode, fb.batch_size
        if not (mode.is_decode_or_idle() or mode.is_target_verify()):
            raise ValueError(f"{self.name} runs decode, idle and target_verify, not {mode.label}")
        n = self._rows(mode)
        kv_lens = layout.attended_kv_lens(mode, fb.seq_lens, n)
        kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
        kv_indptr[1:] = torch.cumsum(kv_lens, 0)
        host_lens = layout.attended_kv_lens(mode, fb.seq_lens_cpu, n)  # eager may read the host
        kv_indices = torch.zeros(max(int(host_lens.sum()), 1), dtype=torch.int64, device=self.device)
        build_kv_indices(self.world.req_to_token, fb.req_pool_indices, kv_lens, kv_indptr, kv_indices)
        mask = mask_indptr = None
        if mode.is_target_verify():
            mask, mask_indptr = fb.spec_info.custom_mask, layout.mask_indptr(fb.seq_lens, n)
        longest = int(host_lens.max()) if bs else 1
        self.forward_metadata = ReviewMetadata(kv_indptr, kv_indices, n, longest, mask, mask_indptr)

    # --- graphs: static buffers, filled in place ------------------------------------------------
    def init_cuda_graph_state(self, max_bs, max_num_tokens):
        L, dev = self.world.max_context_len, self.device
        self.cuda_graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.cuda_graph_kv_indices = torch.zeros(max_bs * L, dtype=torch.int64, device=dev)
        self.cuda_graph_custom_mask = torch.zeros(max_num_tokens * L, dtype=torch.uint8, device=dev)
        self.cuda_graph_mask_indptr = torch.zeros(max_bs + 1, dtype=torch.int64, device=dev)

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
    ):
        self.check_graph_mode(forward_mode)
        n, verify = self._rows(forward_mode), forward_mode.is_target_verify()
        kv_lens = layout.attended_kv_lens(forward_mode, seq_lens[:bs], n)  # verify: prefix + N
        kv_indptr = self.cuda_graph_kv_indptr[: bs + 1]
        kv_indptr[1:] = torch.cumsum(kv_lens, 0)
        build_kv_indices(self.world.req_to_token, req_pool_indices[:bs], kv_lens, kv_indptr, self.cuda_graph_kv_indices)
        mask_indptr = None
        if verify:
            self._copy_mask(spec_info)
            mask_indptr = layout.mask_indptr(seq_lens[:bs], n, out=self.cuda_graph_mask_indptr)
        self.forward_metadata = ReviewMetadata(
            kv_indptr,
            self.cuda_graph_kv_indices,
            n,
            self.world.max_context_len,
            self.cuda_graph_custom_mask if verify else None,
            mask_indptr,
        )

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
    ):
        n = self._rows(forward_mode)
        kv_lens = layout.attended_kv_lens(forward_mode, seq_lens[:bs], n)  # verify: prefix + N
        kv_indptr = self.cuda_graph_kv_indptr[: bs + 1]
        kv_indptr[1:] = torch.cumsum(kv_lens, 0)  # in place: the graph reads this buffer
        build_kv_indices(self.world.req_to_token, req_pool_indices[:bs], kv_lens, kv_indptr, self.cuda_graph_kv_indices)
        if forward_mode.is_target_verify():
            self._copy_mask(spec_info)
            # request i's mask block is [N, kv_lens[i]]; mask_indptr adds the N drafts itself
            layout.mask_indptr(seq_lens[:bs], n, out=self.cuda_graph_mask_indptr)

    def graph_state(self, bs, mode):
        md = self.forward_metadata
        state = {
            "kv_indptr": md.kv_indptr[: bs + 1],
            "kv_indices": md.kv_indices[: int(md.kv_indptr[bs])],  # the live part only
            "q_per_req": md.q_per_req,
            "max_kv_len": md.max_kv_len,
        }
        if md.mask_indptr is not None:
            state["mask_indptr"] = md.mask_indptr[: bs + 1]
            state["custom_mask"] = md.custom_mask[: int(md.mask_indptr[bs])]
        return state

    def reference_graph_state(self, fb):
        """From the batch alone: host lengths, ``build_kv_indices_ref``, the tree-mask layout."""
        n = self._rows(fb.forward_mode)
        seq = fb.seq_lens_cpu.to(torch.int64)
        kv_lens = seq + n if fb.forward_mode.is_target_verify() else seq
        ref = {
            "kv_indptr": torch.cat([kv_lens.new_zeros(1), torch.cumsum(kv_lens, 0)]),
            "kv_indices": build_kv_indices_ref(self.world.req_to_token, fb.req_pool_indices, kv_lens),
            "q_per_req": n,
            "max_kv_len": self.world.max_context_len,
        }
        if fb.forward_mode.is_target_verify():  # block i: [N, seq_i + N], blocks back to back
            ref["mask_indptr"] = torch.cat([seq.new_zeros(1), torch.cumsum(n * kv_lens, 0)])
            ref["custom_mask"] = fb.spec_info.custom_mask.to(torch.uint8)  # the live blocks
        return ref

    # --- inside the graph -----------------------------------------------------------------------
    def forward(self, q, k, v, layer, fb):
        md, cache, cfg = self.forward_metadata, self.world.kv_cache, self.cfg
        cache.set_kv(layer, fb.out_cache_loc, k, v)
        out = torch.empty(q.shape[0], cfg.num_heads, cfg.v_head_dim, dtype=q.dtype, device=q.device)
        if q.shape[0] == 0:  # an idle batch
            return out
        kv = (cache.k[layer], cache.v[layer], md.kv_indptr, md.kv_indices)  # the window through the CSR
        mask = dict(custom_mask=md.custom_mask, mask_indptr=md.mask_indptr)  # verify only (None otherwise)
        dense_paged_attention(q, *kv, out, sm_scale=cfg.sm_scale, max_kv_len=md.max_kv_len, q_per_req=md.q_per_req, **mask)
        return out


class ReviewBackendBuggy(ReviewBackend):
    """The PR as submitted: its replay hook differs from ``ReviewBackend``'s in one line."""

    variant = "submitted"

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
    ):
        n = self._rows(forward_mode)
        kv_lens = layout.attended_kv_lens(forward_mode, seq_lens[:bs], n)  # verify: prefix + N
        kv_indptr = self.cuda_graph_kv_indptr[: bs + 1]
        kv_indptr[1:] = torch.cumsum(kv_lens, 0)  # in place: the graph reads this buffer
        build_kv_indices(self.world.req_to_token, req_pool_indices[:bs], kv_lens, kv_indptr, self.cuda_graph_kv_indices)
        if forward_mode.is_target_verify():
            self._copy_mask(spec_info)
            # request i's mask block is [N, kv_lens[i]]
            layout.mask_indptr(kv_lens, n, out=self.cuda_graph_mask_indptr)
