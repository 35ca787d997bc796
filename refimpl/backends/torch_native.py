"""The "hello world" backend: page-1 CSR metadata + a pure-torch attention op, Pattern A.

Not one of SGLang's six; it shows the whole contract on one screen so the notebooks can start here.
Graph modes: decode / idle and target verify (FlashInfer-style: a verify request's kv range covers its
prefix *and* its N draft tokens, whose KV the step wrote first, and a custom mask says which of them
each draft row sees; ``refimpl.layout``). Static buffers (B = max_bs, T = tokens, L = max_context_len):
| buffer        | shape      | dtype | holds                                           |
|---------------|------------|-------|-------------------------------------------------|
| kv_indptr     | [B+1]      | int32 | ``[0, cumsum(kv_lens)]``                         |
| kv_indices    | [B*L]      | int64 | token slots of every request's kv range, packed |
| custom_mask   | [T*L]      | uint8 | verify only: the spec mask, packed               |
| mask_indptr   | [B+1]      | int64 | verify only: ``[0, cumsum(N * (seq + N))]``      |

Pattern A: ``capture`` = ``replay`` (fill the buffers) + freeze views of them and bounds valid for any batch of that
size (``max_kv_len = L``, ``q_per_req``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .. import layout
from ..batch import ForwardBatch
from ..kernels import build_kv_indices, csr_ref, dense_paged_attention, dense_paged_mla_attention
from ..modes import ForwardMode
from ..spec import DraftTree, VerifyInput, build_custom_mask, require_spec, verify_n
from .base import COPIES_MASK, AttentionBackend, dense_forward, live_csr_state


@dataclass
class TorchNativeMetadata:
    kv_indptr: torch.Tensor  # [bs+1] int32, device
    kv_indices: torch.Tensor  # [>= kv_indptr[bs]] int64, device
    q_per_req: int  # 1 (decode) or N (verify); frozen in a graph
    max_kv_len: int  # bound on any kv range; frozen in a graph
    custom_mask: torch.Tensor | None = None  # [>= mask_indptr[bs]] uint8/bool, device
    mask_indptr: torch.Tensor | None = None  # [bs+1] int64, device (with custom_mask, or neither)


class TorchNativeBackend(AttentionBackend):
    name = "torch_native"
    variant = "unified"
    pattern = "A"
    graph_modes = frozenset({ForwardMode.DECODE, ForwardMode.IDLE, ForwardMode.TARGET_VERIFY})
    graph_buffer_names = tuple(f"cuda_graph_{b}" for b in ("kv_indptr", "kv_indices", "custom_mask", "mask_indptr"))

    def glue_refusal(self, mode: ForwardMode) -> str | None:
        return COPIES_MASK if mode.is_target_verify() else None

    def _rows_and_mask(self, mode: ForwardMode, spec_info: Any, eager: bool = False) -> tuple[int, torch.Tensor | None]:
        """(query rows per request, the spec's mask or None): (1, None) outside target verify; under graphs (not
        ``eager``) N must be the one captured."""
        if not mode.is_target_verify():
            return 1, None
        spec = require_spec(mode, spec_info, VerifyInput)
        return spec.draft_token_num if eager else verify_n(spec, self.spec), spec.custom_mask

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        mode, bs = fb.forward_mode, fb.batch_size
        if not (mode.is_decode_or_idle() or mode.is_target_verify()):
            raise ValueError(f"{self.name} runs decode, idle and target_verify, not {mode.label}")
        n, mask = self._rows_and_mask(mode, fb.spec_info, eager=True)
        lens = layout.attended_kv_lens(mode, fb.seq_lens, n)  # verify: prefix + the N drafts
        kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
        kv_indptr[1:] = torch.cumsum(lens, 0)
        host_lens = layout.attended_kv_lens(mode, fb.seq_lens_cpu, n)  # host values: eager may use them
        kv_indices = torch.zeros(max(int(host_lens.sum()), 1), dtype=torch.int64, device=self.device)
        build_kv_indices(self.world.req_to_token, fb.req_pool_indices, lens, kv_indptr, kv_indices)
        if mode.is_target_verify() and mask is None:  # verify without a mask means chains, as on every backend (Triton: causal)
            mask = build_custom_mask(fb.seq_lens_cpu.tolist(), [DraftTree.chain(n)] * bs, self.device)
        mask_indptr = None if mask is None else layout.mask_indptr(fb.seq_lens, n)
        max_len = int(host_lens.max()) if bs else 1
        self.forward_metadata = TorchNativeMetadata(kv_indptr, kv_indices, n, max_len, mask, mask_indptr)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        L, dev = self.world.max_context_len, self.device
        self.max_bs, self.max_num_tokens = max_bs, max_num_tokens
        self.cuda_graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.cuda_graph_kv_indices = torch.zeros(max_bs * L, dtype=torch.int64, device=dev)
        self.cuda_graph_custom_mask = torch.zeros(max_num_tokens * L, dtype=torch.uint8, device=dev)
        self.cuda_graph_mask_indptr = torch.zeros(max_bs + 1, dtype=torch.int64, device=dev)

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
    ) -> None:
        self.check_graph_mode(forward_mode)
        # Pattern A: capture runs exactly the replay body, then freezes views.
        self.init_forward_metadata_replay_cuda_graph(
            bs, req_pool_indices, seq_lens, None, encoder_lens, forward_mode, spec_info, None
        )
        n, mask = self._rows_and_mask(forward_mode, spec_info)
        masks = (None, None) if mask is None else (self.cuda_graph_custom_mask, self.cuda_graph_mask_indptr[: bs + 1])
        # the views; q_per_req = n; max_kv_len = L: valid for any future batch
        self.forward_metadata = TorchNativeMetadata(
            self.cuda_graph_kv_indptr[: bs + 1], self.cuda_graph_kv_indices, n, self.world.max_context_len, *masks
        )

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
    ) -> None:
        seq_lens, (n, mask) = seq_lens[:bs], self._rows_and_mask(forward_mode, spec_info)
        lens = layout.attended_kv_lens(forward_mode, seq_lens, n)
        kv_indptr = self.cuda_graph_kv_indptr[: bs + 1]
        kv_indptr[1:] = torch.cumsum(lens, 0)  # in place: the graph reads this buffer
        build_kv_indices(self.world.req_to_token, req_pool_indices[:bs], lens, kv_indptr, self.cuda_graph_kv_indices)
        if mask is not None:
            layout.check_mask_fits(mask, self.cuda_graph_custom_mask)
            self.cuda_graph_custom_mask[: mask.numel()].copy_(mask)
            layout.mask_indptr(seq_lens, n, out=self.cuda_graph_mask_indptr)

    def graph_state(self, bs: int, mode: ForwardMode) -> dict[str, Any]:
        md = self.forward_metadata  # its indptrs: [bs+1] views
        return live_csr_state(md, q_per_req=md.q_per_req, max_kv_len=md.max_kv_len)

    def reference_graph_state(self, fb: ForwardBatch) -> dict[str, Any]:
        """From the batch alone: host lengths, ``csr_ref``, the spec's own mask."""
        n, mask = self._rows_and_mask(fb.forward_mode, fb.spec_info)
        seq = fb.seq_lens_cpu.to(torch.int64)
        lens = layout.attended_kv_lens(fb.forward_mode, seq, n)  # verify: prefix + N drafts
        ref = csr_ref(self.world.req_to_token, fb.req_pool_indices, lens)
        ref.update(q_per_req=n, max_kv_len=self.world.max_context_len)
        if mask is not None:  # request i's block: [N, seq_i + N]; the live requests' blocks
            ref.update(mask_indptr=layout.mask_indptr(seq, n), custom_mask=mask.to(torch.uint8))
        return ref

    def forward(self, q, k, v, layer: int, fb: ForwardBatch) -> torch.Tensor:
        out = q.new_empty(q.shape[0], self.cfg.num_heads, self.cfg.out_head_dim)
        kw = dict(vars(self.forward_metadata), out=out, sm_scale=self.cfg.sm_scale)  # the metadata's fields: the op's arguments
        dense_forward(self, q, k, v, layer, fb, dense_paged_attention, dense_paged_mla_attention, **kw)
        return out


class TorchNativeMLABackend(TorchNativeBackend):
    """The same backend serving an MLA model (the latent cache, ``dense_paged_mla_attention``)."""

    name = "torch_native_mla"
    model_kind = "mla"
