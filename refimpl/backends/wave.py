"""SGLang's Wave attention backend (digest §3.3), unified (Pattern A) and legacy (Pattern C).

SGLang's Wave kernels (wave_lang) target AMD GPUs. refimpl runs Wave's *buffer layout and hook
logic* on refimpl's Triton kernels (the same split-KV decode and extend kernels as the Triton
backend), so what differs from ``triton.py`` is exactly what differs upstream:

| buffer                   | Wave                          | Triton                  |
|--------------------------|-------------------------------|-------------------------|
| cuda_graph_kv_indices    | [B*L] **int32**               | [T*L] int64             |
| qo_indptr                | [pool+1] int32                | [pool+1] int64          |
| attn_logits / lse        | sized by **B** (max_bs)       | sized by T (tokens)     |
| cuda_graph_num_kv_splits | [B], Wave's own copy          | [T] (shareable)         |
| cuda_graph_custom_mask   | [T*L] uint8 (see below)       | [T*L] uint8             |

Deviation, on purpose: the digest records Wave's mask buffer as ``[B*L]``; a verify batch of B
requests needs ``sum N*(seq+N)`` entries, up to ``B*N*L``, so refimpl sizes it by tokens.

Graph modes: decode / idle, target verify, multi-step draft decode (through the multi-step
wrapper, chains only: the decode buffers hold B rows). Draft extend is **not supported** under
graphs, as upstream: asking for it raises ``GraphModeNotSupported``.

The legacy shape's bug (the one the refactor fixed, #26134): capture skips
``get_num_kv_splits`` while replay computes it, so the two paths leave different split counts.
"""

from __future__ import annotations

import torch

from ..modes import ForwardMode
from ..spec import DraftDecodeInput, VerifyInput, require_spec
from .triton import TritonAttnBackend


class WaveAttnBackend(TritonAttnBackend):
    name = "wave"
    variant = "unified"
    pattern = "A"
    graph_modes = frozenset({ForwardMode.DECODE, ForwardMode.IDLE, ForwardMode.TARGET_VERIFY})
    kv_indices_dtype = torch.int32
    qo_indptr_dtype = torch.int32

    def init_cuda_graph_state(
        self, max_bs, max_num_tokens, kv_indices_buf=None, num_kv_splits_buf=None
    ):
        B, T, L, H, dev = (
            max_bs,
            max_num_tokens,
            self.world.max_context_len,
            self.cfg.num_heads,
            self.device,
        )
        self.max_bs, self.max_num_tokens = max_bs, max_num_tokens
        S, Dv = self.max_kv_splits, self.cfg.v_head_dim
        self.cuda_graph_attn_logits = torch.zeros(B, H, S, Dv, dtype=torch.float32, device=dev)
        self.cuda_graph_attn_lse = torch.zeros(B, H, S, dtype=torch.float32, device=dev)
        self.cuda_graph_num_kv_splits = torch.full((B,), S, dtype=torch.int32, device=dev)
        if kv_indices_buf is None:
            kv_indices_buf = torch.zeros(B * L, dtype=torch.int32, device=dev)
        self.cuda_graph_kv_indices = kv_indices_buf
        if not self.skip_prefill:
            self.cuda_graph_custom_mask = torch.zeros(T * L, dtype=torch.uint8, device=dev)

    def _update_target_verify_buffers(self, bs, seq_lens, rpi, spec_info) -> None:
        spec = require_spec(ForwardMode.TARGET_VERIFY, spec_info, VerifyInput)
        if spec.custom_mask is None:  # Wave's replay copies the mask unconditionally (§3.3)
            raise ValueError("wave: target verify under graphs needs a tree mask (custom_mask)")
        super()._update_target_verify_buffers(bs, seq_lens, rpi, spec)

    def _replay_draft_decode(self, spec: DraftDecodeInput, seq_lens: torch.Tensor) -> None:
        """Multi-step: copy the wrapper's indices into Wave's buffers, then compute splits."""
        n = spec.kv_indptr.numel()
        rows = n - 1
        if rows > self.cuda_graph_num_kv_splits.numel():
            raise ValueError(
                f"wave: {rows} draft rows exceed its decode buffers of max_bs="
                f"{self.cuda_graph_num_kv_splits.numel()} rows (Wave sizes them by batch size)"
            )
        self.kv_indptr[:n].copy_(spec.kv_indptr)  # self-copies when the wrapper lent the buffers
        m = spec.kv_indices.numel()
        self.cuda_graph_kv_indices[:m].copy_(spec.kv_indices)
        self._splits(self.cuda_graph_num_kv_splits[:rows], seq_lens)

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info,
        seq_lens_cpu,
    ) -> None:  # fmt: skip
        if forward_mode.is_decode_or_idle() and isinstance(spec_info, DraftDecodeInput):
            return self._replay_draft_decode(spec_info, seq_lens[:bs])
        return super().init_forward_metadata_replay_cuda_graph(
            bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info,
            seq_lens_cpu,
        )  # fmt: skip


class WaveAttnBackendLegacy(WaveAttnBackend):
    """Pattern C: capture fills the kv buffers but never computes the split counts (#26134)."""

    variant = "legacy"
    pattern = "C"

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
    ) -> None:
        self.check_graph_mode(forward_mode)
        if forward_mode.is_decode_or_idle() and not isinstance(spec_info, DraftDecodeInput):
            self._update_decode_kv_buffers(bs, seq_lens, req_pool_indices)
            # the bug: no get_num_kv_splits; the buffer keeps max_kv_splits from init
            self.forward_metadata = self._build_cuda_graph_forward_metadata(
                bs, forward_mode, spec_info
            )
            return
        super().init_forward_metadata_capture_cuda_graph(
            bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
        )
