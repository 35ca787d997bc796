"""Start here: a template for a new attention backend. It passes refimpl's checker (decode and idle, page size 1,
Pattern A: capture runs the replay body, then freezes views of the static buffers) and imports refimpl absolutely, so
it works from any folder.

1. Copy this file anywhere, e.g. ``cp examples/paged_decode_backend.py ~/work/my_backend.py``, and rename the class
   (``MyBackend``) and its ``name`` (the label of the checker's rows).
2. Review it from the folder that holds the file (``python -m`` puts that folder on the import path)::

       python -m refimpl check --backend-class my_backend:MyBackend            # every verdict, every mode: exit 0
       python -m refimpl check --backend-class my_backend:MyBackend --fuzz 20  # 20 random batches per mode and spec

   ``--mode decode --bs 1,3`` narrows a run; ``python -m refimpl check --help`` says what each verdict asks.

What each method must do (the contract is ``refimpl/backends/base.py``, ``AttentionBackend``):

- ``init_forward_metadata(fb)``: eager; build this step's metadata (fresh tensors and host reads are fine).
- ``init_cuda_graph_state(max_bs, max_num_tokens)``: once; allocate every tensor a captured ``forward`` reads.
- ``init_forward_metadata_capture_cuda_graph(...)``: once per captured size, outside the graph; point
  ``forward_metadata`` at views of those buffers and at Python values valid for every later batch.
- ``init_forward_metadata_replay_cuda_graph(...)``: before every replay, outside the graph; refill those buffers in
  place for the new batch (never a fresh tensor, never skipped because "nothing changed").
- ``forward(q, k, v, layer, fb)``: recorded in the graph; write this layer's KV, read only ``forward_metadata``.
- ``graph_state(bs, mode)``: what ``forward`` reads (live views, frozen scalars); the checker compares it.
- ``reference_graph_state(fb)``: optional; the same from the batch alone, never through the hooks (verdict (d)).

Class attributes: ``graph_modes`` (the modes it captures; the others print ``skipped``), ``model_kind`` (``"mha"`` or
``"mla"``), ``page_size``, ``graph_buffer_names`` (the static buffers, which the fuzzer poisons where a batch leaves
them unread).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from refimpl.backends.base import AttentionBackend
from refimpl.kernels import build_kv_indices, build_kv_indices_ref, dense_paged_attention
from refimpl.modes import ForwardMode


@dataclass
class PagedDecodeMetadata:
    kv_indptr: torch.Tensor  # [bs+1] int32: request i's keys are kv_indices[indptr[i]:indptr[i+1]]
    kv_indices: torch.Tensor  # [>= kv_indptr[bs]] int64: token slots
    max_kv_len: int  # frozen in a graph: a bound valid for every future batch (the context)


class PagedDecodeBackend(AttentionBackend):
    name = "paged_decode_example"
    variant = "unified"
    pattern = "A"
    graph_modes = frozenset({ForwardMode.DECODE, ForwardMode.IDLE})
    model_kind = "mha"  # the checker builds an MHA model for it (page size 1 by default)
    graph_buffer_names = ("cuda_graph_kv_indptr", "cuda_graph_kv_indices")  # what forward reads in a graph

    # --- eager: fresh tensors are fine ----------------------------------------------------------
    def init_forward_metadata(self, fb):
        if not fb.forward_mode.is_decode_or_idle():
            raise ValueError(f"{self.name} runs decode and idle only, not {fb.forward_mode.label}")
        indptr = torch.zeros(fb.batch_size + 1, dtype=torch.int32, device=self.device)
        indptr[1:] = torch.cumsum(fb.seq_lens, 0)
        indices = torch.zeros(max(fb.seq_lens_sum, 1), dtype=torch.int64, device=self.device)
        build_kv_indices(self.world.req_to_token, fb.req_pool_indices, fb.seq_lens, indptr, indices)
        longest = int(fb.seq_lens_cpu.max()) if fb.batch_size else 1  # eager may read the host
        self.forward_metadata = PagedDecodeMetadata(indptr, indices, longest)

    # --- graphs: static buffers, filled in place ------------------------------------------------
    def init_cuda_graph_state(self, max_bs, max_num_tokens):
        L, dev = self.world.max_context_len, self.device
        self.cuda_graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.cuda_graph_kv_indices = torch.zeros(max_bs * L, dtype=torch.int64, device=dev)

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
    ):
        self.check_graph_mode(forward_mode)
        self.init_forward_metadata_replay_cuda_graph(  # Pattern A: the replay body ...
            bs, req_pool_indices, seq_lens, None, encoder_lens, forward_mode, spec_info, None
        )
        self.forward_metadata = PagedDecodeMetadata(  # ... then views + a safe frozen bound
            self.cuda_graph_kv_indptr[: bs + 1], self.cuda_graph_kv_indices, self.world.max_context_len
        )

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
    ):
        indptr = self.cuda_graph_kv_indptr[: bs + 1]
        indptr[1:] = torch.cumsum(seq_lens[:bs], 0)  # in place: the graph reads this buffer
        build_kv_indices(self.world.req_to_token, req_pool_indices[:bs], seq_lens[:bs], indptr, self.cuda_graph_kv_indices)

    def graph_state(self, bs, mode):
        md = self.forward_metadata
        return {
            "kv_indptr": md.kv_indptr[: bs + 1],
            "kv_indices": md.kv_indices[: int(md.kv_indptr[bs])],  # the live part only
            "max_kv_len": md.max_kv_len,
        }

    def reference_graph_state(self, fb):
        """Optional: what ``graph_state`` must hold after replaying ``fb``, from first principles
        (lets the checker name a buffer the shared capture/replay body gets wrong)."""
        lens = fb.seq_lens_cpu.to(torch.int64)
        return {
            "kv_indptr": torch.cat([lens.new_zeros(1), torch.cumsum(lens, 0)]),
            "kv_indices": build_kv_indices_ref(self.world.req_to_token, fb.req_pool_indices, lens),
            "max_kv_len": self.world.max_context_len,
        }

    # --- inside the graph -----------------------------------------------------------------------
    def forward(self, q, k, v, layer, fb):
        md, cache, cfg = self.forward_metadata, self.world.kv_cache, self.cfg
        cache.set_kv(layer, fb.out_cache_loc, k, v)
        out = torch.empty(q.shape[0], cfg.num_heads, cfg.v_head_dim, dtype=q.dtype, device=q.device)
        if q.shape[0] == 0:  # an idle batch
            return out
        kv = (cache.k[layer], cache.v[layer], md.kv_indptr, md.kv_indices)  # the window through the CSR
        dense_paged_attention(q, *kv, out, sm_scale=cfg.sm_scale, max_kv_len=md.max_kv_len, q_per_req=1)
        return out
