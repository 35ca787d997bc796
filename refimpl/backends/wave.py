"""SGLang's Wave attention backend, unified (Pattern A) and legacy (Pattern C).

Upstream: ``python/sglang/srt/layers/attention/wave_backend.py`` (``WaveAttnBackend``), unified by #26134 / #26665;
facts in ``[facts#wave]``. Wave's kernels (wave_lang) target AMD GPUs; refimpl runs its *buffer layout and hook logic*
on Triton's kernels: it differs from ``triton.py`` as upstream does.

| buffer                   | Wave                          | Triton                  |
|--------------------------|-------------------------------|-------------------------|
| cuda_graph_kv_indices    | [B*L] **int32**               | [T*L] int64             |
| qo_indptr                | [pool+1] int32                | [pool+1] int64          |
| attn_logits / lse        | sized by **B** (max_bs)       | sized by T (tokens)     |
| cuda_graph_num_kv_splits | [B], Wave's own copy          | [T] (shareable)         |
| cuda_graph_custom_mask   | [T*L] uint8 (see below)       | [T*L] uint8             |

Deviation, on purpose: upstream sizes Wave's mask ``[B*L]``, but a verify batch needs ``sum N*(seq+N)`` entries, up to
``B*N*L`` ([facts#where-refimpl-deliberately-differs-from-upstream]). Graph modes: decode / idle, target verify,
multi-step draft decode (through the wrapper, chains only: the decode buffers hold B rows); draft extend raises
``GraphModeNotSupported``, as upstream.
"""

from __future__ import annotations

import torch

from ..modes import ForwardMode
from ..spec import VerifyInput, require_spec
from .base import GraphModeNotSupported
from .multistep import MultiStepDraftBackend
from .triton import TritonAttnBackend, TritonAttnBackendLegacy


class WaveAttnBackend(TritonAttnBackend):
    name = "wave"
    variant = "unified"
    pattern = "A"
    graph_modes = frozenset({ForwardMode.DECODE, ForwardMode.IDLE, ForwardMode.TARGET_VERIFY})
    kv_indices_dtype = torch.int32
    qo_indptr_dtype = torch.int32
    decode_rows_by_bs = True  # logits, lse, its own split counts [B...], kv_indices [B*L]; the mask stays [T*L]

    def _require_mask(self, mode: ForwardMode, spec_info) -> None:
        if mode.is_target_verify() and require_spec(mode, spec_info, VerifyInput).custom_mask is None:
            # Wave's verify hooks copy the spec's mask unconditionally ([facts#wave])
            raise ValueError("wave: target verify under graphs needs a tree mask (custom_mask)")

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
    ) -> None:
        if forward_mode.is_decode_or_idle() and spec_info is not None:
            # multi-step draft decode: copy the wrapper's rows into Wave's buffers, then compute the splits
            n = spec_info.kv_indptr.numel()
            if (rows := n - 1) > self.cuda_graph_num_kv_splits.numel():
                raise ValueError(
                    f"wave: {rows} draft rows exceed its decode buffers of max_bs="
                    f"{self.cuda_graph_num_kv_splits.numel()} rows (Wave sizes them by batch size)"
                )
            self.kv_indptr[:n].copy_(spec_info.kv_indptr)  # self-copies when the wrapper lent the buffers
            self.cuda_graph_kv_indices[: spec_info.kv_indices.numel()].copy_(spec_info.kv_indices)
            self.get_num_kv_splits(self.cuda_graph_num_kv_splits[:rows], seq_lens[:bs])
            return
        self._require_mask(forward_mode, spec_info)
        super().init_forward_metadata_replay_cuda_graph(
            bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
        )


class WaveAttnBackendLegacy(WaveAttnBackend, TritonAttnBackendLegacy):
    """Pattern C (before #26134): upstream's hooks were a copy of Triton's legacy ones on Wave's buffers, so these are
    ``TritonAttnBackendLegacy``'s (replay: through ``WaveAttnBackend``'s, which copies a draft step's rows):

    1. capture fills the kv buffers but never the split counts (they keep ``max_kv_splits`` from
       init) while replay computes them: the divergence #26134 names;
    2. verify copies the spec's mask unconditionally (no mask: it fails)."""

    variant = "legacy"
    pattern = "C"

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
    ) -> None:
        self._require_mask(forward_mode, spec_info)  # (2)
        super().init_forward_metadata_capture_cuda_graph(
            bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
        )


class WaveMultiStepDraftBackend(MultiStepDraftBackend):
    """Each step's replay copies the wrapper's rows into Wave's buffers and computes splits."""

    step_cls = WaveAttnBackend
    share_splits = False

    def check_graph_mode(self, mode: ForwardMode) -> None:
        super().check_graph_mode(mode)
        if self.topk > 1:
            raise GraphModeNotSupported(
                f"wave sizes its decode buffers by max_bs, so multi-step draft decode with "
                f"topk={self.topk} (bs*topk rows) does not fit; chains only"
            )


class WaveMultiStepDraftBackendLegacy(WaveMultiStepDraftBackend):
    step_cls = WaveAttnBackendLegacy
    compute_splits_at_capture = False
