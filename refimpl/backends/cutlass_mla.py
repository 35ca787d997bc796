"""SGLang's Cutlass-MLA backend: unified (Pattern A) and legacy (Pattern C).

Upstream: ``python/sglang/srt/layers/attention/cutlass_mla_backend.py`` (``CutlassMLABackend``, a subclass of
FlashInfer-MLA); facts in ``[facts#cutlass-mla]``. The real ``sgl_kernel.cutlass_mla_decode`` needs Blackwell (SM100);
refimpl's Triton kernel of the same name and arguments (``refimpl.kernels.cutlass_mla_decode``) stands in on CPU and
Hopper. It reads the latent cache through a **block table** of 128-token pages (``[facts#block-table-builder]``): the
graph's ``cuda_graph_kv_indices`` is int32 ``[B, L // 128 + 1]`` filled with **1** (eager tables: -1), beside a
``cuda_graph_mla_workspace``. Graphs serve **plain decode** only: ``init_cuda_graph_state`` skips its parent's, so any
other mode is refused up front. Eager verify / draft extend go to FlashInfer-MLA (page size 1). Frozen in a graph: the
table's width (the kernel's only length bound), the workspace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..batch import ForwardBatch
from ..kernels import build_block_table, build_block_table_ref, cutlass_mla_decode
from ..modes import ForwardMode
from .base import GraphModeNotSupported
from .flashinfer_mla import FlashInferMLAAttnBackend, new_block_table

PAGE_SIZE = 128  # cutlass_mla_decode's only page size
WORKSPACE_BYTES = 1 << 20  # upstream: cutlass_mla_get_workspace_size(width * 128, B, splits=1)


@dataclass
class CutlassMLADecodeMetadata:
    workspace: torch.Tensor  # [bytes] uint8
    block_kv_indices: torch.Tensor  # [bs, width] int32 page ids (a view in a graph)


class CutlassMLAAttnBackend(FlashInferMLAAttnBackend):
    """Unified shape (#26134 / #26665): capture runs the replay body, then freezes the view."""

    name = "cutlass_mla"
    variant = "unified"
    pattern = "A"
    page_sizes = (PAGE_SIZE,)
    page_size = PAGE_SIZE
    graph_buffer_names = ("kv_indptr", "cuda_graph_kv_indices", "cuda_graph_mla_workspace")
    graph_modes = frozenset({ForwardMode.DECODE, ForwardMode.IDLE})

    def glue_refusal(self, mode: ForwardMode) -> str | None:
        return None  # no plan(): the workspace and block table are device buffers

    def check_graph_mode(self, mode: ForwardMode) -> None:
        if mode not in self.graph_modes:
            raise GraphModeNotSupported(
                f"{self.name}/{self.variant} captures decode only, not {mode.label}: its init_cuda_graph_state skips "
                "FlashInfer-MLA's graph buffers (cuda_graph_qo_indptr, cuda_graph_kv_indptr, ...) that the parent's "
                f"{mode.label} capture would bind"
            )

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        if not fb.forward_mode.is_decode_or_idle() or fb.spec_info is not None:
            return super().init_forward_metadata(fb)  # FlashInfer-MLA, page size 1
        width = -(-int(fb.seq_lens_cpu.max()) // PAGE_SIZE) if fb.batch_size else 1  # eager: host max
        table = new_block_table(self, fb.batch_size, width, -1)
        build_block_table(self.world.req_to_token, fb.req_pool_indices, fb.seq_lens, table, PAGE_SIZE)
        self.forward_metadata = CutlassMLADecodeMetadata(
            torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device), table
        )

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, block_kv_indices=None) -> None:
        # no super().init_cuda_graph_state(): FlashInfer-MLA's graph buffers are not made
        self.max_bs, self.max_num_tokens = max_bs, max_num_tokens
        width = (self.world.max_context_len + PAGE_SIZE) // PAGE_SIZE  # floor(L / 128) + 1, as upstream
        self.cuda_graph_kv_indices = new_block_table(self, max_bs, width, 1, block_kv_indices)
        self.cuda_graph_mla_workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
    ) -> None:
        self.check_graph_mode(forward_mode)
        if forward_mode.is_decode_or_idle() and spec_info is None:
            self.init_forward_metadata_replay_cuda_graph(
                bs, req_pool_indices, seq_lens, None, encoder_lens, forward_mode, spec_info, None
            )
            self.forward_metadata = CutlassMLADecodeMetadata(self.cuda_graph_mla_workspace, self.cuda_graph_kv_indices[:bs])
        else:
            super().init_forward_metadata_capture_cuda_graph(
                bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
            )

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
    ) -> None:
        if forward_mode.is_decode_or_idle():
            build_block_table(
                self.world.req_to_token, req_pool_indices[:bs], seq_lens[:bs], self.cuda_graph_kv_indices, PAGE_SIZE
            )
        else:
            super().init_forward_metadata_replay_cuda_graph(
                bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
            )

    def graph_state(self, bs: int, mode: ForwardMode) -> dict[str, Any]:
        md = self.forward_metadata
        if not isinstance(md, CutlassMLADecodeMetadata):
            return {}  # nothing captured for this mode (see the legacy shape)
        table = md.block_kv_indices[:bs]
        return {"block_kv_indices": table, "max_seq_len": table.shape[1] * PAGE_SIZE}

    def reference_graph_state(self, fb: ForwardBatch) -> dict[str, Any] | None:
        if not fb.forward_mode.is_decode_or_idle():
            return None
        bs, width = fb.batch_size, (self.world.max_context_len + PAGE_SIZE) // PAGE_SIZE
        fresh = torch.full((bs, width), 1, dtype=torch.int32, device="cpu")  # the graph table's init value
        table = build_block_table_ref(self.world.req_to_token.cpu(), fb.req_pool_indices.cpu(), fb.seq_lens_cpu, fresh, PAGE_SIZE)
        return {"block_kv_indices": table, "max_seq_len": width * PAGE_SIZE}

    def _attend(self, q: torch.Tensor, kv: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        md, r = self.forward_metadata, self.cfg.kv_lora_rank
        if not isinstance(md, CutlassMLADecodeMetadata):
            return super()._attend(q, kv, fb)  # eager verify / draft extend: FlashInfer-MLA
        paged = kv.view(-1, PAGE_SIZE, self.cfg.kv_row_width)  # [pages, 128, 576]
        return cutlass_mla_decode(
            q[..., :r], q[..., r:], paged, fb.seq_lens, md.block_kv_indices, md.workspace, self.cfg.sm_scale, num_kv_splits=1
        )


class CutlassMLAAttnBackendLegacy(CutlassMLAAttnBackend):
    """Pattern C (before #26134): separate capture and replay bodies; two details the refactor removed:

    1. replay asserts ``seq_lens_cpu is not None``, a parameter it never reads: a capture that
       delegates to this replay as Pattern A does (passing ``seq_lens_cpu=None``) trips it;
    2. capture handles decode only when ``spec_info is None`` (no ``else``), replay any decode:
       a decode capture *with* a spec input leaves the metadata unset."""

    variant = "legacy"
    pattern = "C"

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
    ) -> None:
        self.check_graph_mode(forward_mode)
        if forward_mode.is_decode_or_idle():
            if spec_info is None:  # (2) and nothing otherwise
                build_block_table(
                    self.world.req_to_token, req_pool_indices[:bs], seq_lens[:bs], self.cuda_graph_kv_indices, PAGE_SIZE
                )
                self.forward_metadata = CutlassMLADecodeMetadata(self.cuda_graph_mla_workspace, self.cuda_graph_kv_indices[:bs])
        else:
            super(CutlassMLAAttnBackend, self).init_forward_metadata_capture_cuda_graph(
                bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
            )

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
    ) -> None:
        if forward_mode.is_decode_or_idle():
            assert seq_lens_cpu is not None  # (1) never read below
            build_block_table(
                self.world.req_to_token, req_pool_indices[:bs], seq_lens[:bs], self.cuda_graph_kv_indices, PAGE_SIZE
            )
        else:
            super(CutlassMLAAttnBackend, self).init_forward_metadata_replay_cuda_graph(
                bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
            )
