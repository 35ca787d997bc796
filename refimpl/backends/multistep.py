"""Multi-step draft decode: one wrapper, S-1 step backends, per-step kv buffers.

[facts#triton-multi-step-draft-decode], [facts#multi-step-draft-decode-indices]. EAGLE drafts S tokens per branch: the
first from draft extend, the next S-1 from S-1 decode steps over ``bs * topk`` rows. SGLang's ``*MultiStepDraftBackend``
owns a ``kv_indptr`` ``[S, pool*topk + 1]`` and a ``cuda_graph_kv_indices`` ``[S, B*topk*L]`` row per step i, all filled
by one Triton launch (``draft_decode_kv_indices``, grid ``(S, num_seqs, topk)``): row (r, k) of step i = the
``seq_lens[r]`` prefix slots + the ``i+1`` draft slots of branch k; each step backend points its metadata at its row
(``common_template``). Replay regenerates the indices in place, then computes the split counts once into a shared
``[B*topk]`` buffer (Triton) or runs each step's replay (Wave: copies the lent rows, computes its splits). The unified
wrapper computes them at capture too; upstream's (legacy) skips them.
"""

from __future__ import annotations

from typing import Any

import torch

from ..batch import ForwardBatch, World
from ..config import SpecConfig
from ..kernels import draft_decode_kv_indices, draft_decode_kv_indices_ref
from ..modes import ForwardMode
from ..spec import DraftDecodeInput
from .base import MultiStepBackend


class MultiStepDraftBackend(MultiStepBackend):
    """SGLang's wrapper: every step's indices from one launch, into rows of shared buffers."""

    share_splits = True  # Triton: one split buffer for every step, computed once per replay
    compute_splits_at_capture = True  # unified; the legacy wrapper sets False (upstream)
    graph_buffer_names = ("kv_indptr", "cuda_graph_kv_indices", "cuda_graph_num_kv_splits")

    def __init__(self, world: World, spec: SpecConfig | None = None, **step_kw):
        super().__init__(world, spec)
        self.S, self.topk = spec.num_steps, spec.topk
        self.kv_indptr = torch.zeros(self.S, world.req_to_token_pool.size * self.topk + 1, dtype=torch.int32, device=self.device)
        self.step_backends = [
            self.step_cls(world, spec, kv_indptr_buf=self.kv_indptr[i], skip_prefill=True, **step_kw) for i in range(self.S - 1)
        ]

    # --- index generation (common_template) -----------------------------------------------------
    def _common_template(self, bs, rpi, seq_lens, spec_info, kv_indices=None, kv_indptr=None) -> list[DraftDecodeInput]:
        """After checking the batch's spec input: every step's rows in one launch (default: into the graph buffers); the
        steps' spec inputs, each pointing at its step's row."""
        if not hasattr(spec_info, "num_steps"):
            raise ValueError(f"multi-step draft decode needs a DraftDecodeInput, got {spec_info!r}")
        if (spec_info.topk, spec_info.num_steps) != (self.topk, self.S):
            raise ValueError(
                f"draft batch has topk={spec_info.topk}, num_steps={spec_info.num_steps}; the "
                f"backend was built for topk={self.topk}, num_steps={self.S}"
            )
        if kv_indices is None:
            kv_indices, kv_indptr = self.cuda_graph_kv_indices, self.kv_indptr
        r2t = self.world.req_to_token
        draft_decode_kv_indices(rpi[:bs], r2t, seq_lens[:bs], kv_indices, kv_indptr, topk=self.topk, num_steps=self.S)
        # the full row, not SGLang's [:used_len] slice: no host value decides a view's size
        return [
            DraftDecodeInput(self.topk, self.S, kv_indptr[i, : bs * self.topk + 1], kv_indices[i], extra={"step": i})
            for i in range(self.S - 1)
        ]

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        rows, dtype = fb.batch_size * self.topk, self.step_backends[0].kv_indices_dtype
        kv_indices = torch.zeros(self.S, max(rows * self.world.max_context_len, 1), dtype=dtype, device=self.device)
        kv_indptr = torch.zeros(self.S, rows + 1, dtype=torch.int32, device=self.device)
        specs = self._common_template(fb.batch_size, fb.req_pool_indices, fb.seq_lens, fb.spec_info, kv_indices, kv_indptr)
        for b, spec_i in zip(self.step_backends, specs):
            b.init_forward_metadata(fb.replace(spec_info=spec_i))

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.max_bs, self.max_num_tokens, first = max_bs, max_num_tokens, self.step_backends[0]
        width = max_bs * self.topk * self.world.max_context_len
        self.cuda_graph_kv_indices = torch.zeros(self.S, width, dtype=first.kv_indices_dtype, device=self.device)
        self.cuda_graph_num_kv_splits = None  # Wave, FlashInfer: none shared (Wave: each step's own)
        if self.share_splits:  # Triton: one split buffer every step reads, computed once per replay
            self.cuda_graph_num_kv_splits = torch.full(
                (max_num_tokens,), first.max_kv_splits, dtype=torch.int32, device=self.device
            )
        for b, kv_indices in zip(self.step_backends, self.cuda_graph_kv_indices):
            b.init_cuda_graph_state(max_bs, max_num_tokens, kv_indices, self.cuda_graph_num_kv_splits)

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
    ) -> None:
        self.check_graph_mode(forward_mode)
        for b, spec_i in zip(self.step_backends, self._common_template(bs, req_pool_indices, seq_lens, spec_info)):
            b.init_forward_metadata_capture_cuda_graph(
                bs, bs * self.topk, req_pool_indices, seq_lens, None, ForwardMode.DECODE, spec_i
            )
        if self.compute_splits_at_capture:
            self.init_forward_metadata_replay_cuda_graph(
                bs, req_pool_indices, seq_lens, None, encoder_lens, forward_mode, spec_info, seq_lens[:bs].cpu()
            )

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
    ) -> None:
        specs = self._common_template(bs, req_pool_indices, seq_lens, spec_info)
        if self.share_splits:
            self.step_backends[0].get_num_kv_splits(self.cuda_graph_num_kv_splits[: bs * self.topk], seq_lens[:bs])
            return
        for b, spec_i in zip(self.step_backends, specs):
            b.init_forward_metadata_replay_cuda_graph(
                bs, req_pool_indices, seq_lens, None, None, ForwardMode.DECODE, spec_i, seq_lens_cpu
            )

    def reference_graph_state(self, fb: ForwardBatch) -> dict[str, Any]:
        """Per step: prefix + that step's drafts (``draft_decode_kv_indices_ref``), from the batch."""
        args = (fb.req_pool_indices, self.world.req_to_token, fb.seq_lens_cpu)
        steps = zip(self.step_backends, *draft_decode_kv_indices_ref(*args, topk=self.topk, num_steps=self.S))
        return self.per_step(b.draft_step_reference(indptr.cpu(), indices.cpu(), fb) for b, indptr, indices in steps)
