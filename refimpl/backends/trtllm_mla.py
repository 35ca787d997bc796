"""SGLang's TRTLLM-MLA backend in four shapes: legacy (C, before #21987), unified (A, after #26665), simplified (#29077)
and in_graph (#30807 / #31628); each class says what it changes.

Upstream: ``python/sglang/srt/layers/attention/trtllm_mla_backend.py`` (``TRTLLMMLABackend``, a subclass of
FlashInfer-MLA); facts in ``[facts#trtllm-mla]``, buffers in ``[facts#trtllm-mla-buffers-and-helpers]``. FlashInfer's
real ``trtllm_batch_decode_with_kv_cache_mla`` needs Blackwell (SM100); refimpl's Triton kernel of the same name and
arguments (``refimpl.kernels``) stands in on CPU and Hopper. It reads the latent cache through a **block table** of 32-
or 64-token pages and takes ``seq_lens`` (device data) and ``max_seq_len`` (a Python int, frozen at capture; keys past
it are not read). Target verify and draft extend v2 run it with N query rows per request, causal among them. The
kernel's lengths (``_seqlen_offset``): decode ``seq_lens``; target verify ``seq_lens + N``; draft extend v2 ``seq_lens``
(it counts the N new rows); draft step i ``seq_lens + i + 1``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from .. import layout
from ..batch import ForwardBatch, World
from ..config import SpecConfig
from ..kernels import build_block_table, build_block_table_ref, trtllm_batch_decode_with_kv_cache_mla, trtllm_mla_graph_metadata
from ..kernels.mla_paged import TRTLLM_BLOCK_CONSTRAINT  # trtllm-gen: the table covers a multiple of 128 positions
from ..modes import GRAPH_MODES, ForwardMode
from ..spec import DraftExtendInput, VerifyInput, require_spec, verify_n
from .base import AttentionBackend, MultiStepBackend
from .flashinfer_mla import FlashInferMLAAttnBackend, new_block_table

FLASHMLA_BLOCK = 4096  # positions per block-table chunk (get_num_page_per_block_flashmla)
WORKSPACE_BYTES = 1 << 20  # upstream: a shared 150 MB int8 workspace; the stand-in ignores it


def calc_padded_blocks(max_seq_len: int, page_size: int) -> int:
    """Pages for ``max_seq_len`` rounded up to ``lcm(128 // P, 4096 // P)`` (upstream's ``_calc_padded_blocks``): 64 pages
    at P = 64, 128 at P = 32."""
    multiple = math.lcm(TRTLLM_BLOCK_CONSTRAINT // page_size, FLASHMLA_BLOCK // page_size)
    return -(-max(-(-max_seq_len // page_size), 1) // multiple) * multiple


@dataclass
class TRTLLMMLADecodeMetadata:
    block_kv_indices: torch.Tensor  # [bs, width] int32 page ids
    max_seq_len_k: int  # bound on seq_lens; frozen at capture (graph: L)
    seq_lens_k: torch.Tensor | None = None  # [bs] int32: the kernel's lengths (not decode)
    max_seq_len_q: int | None = None  # draft extend: query rows per request
    sum_seq_lens_q: int | None = None  # draft extend: query rows in all
    cu_seqlens_q: torch.Tensor | None = None  # draft extend: [bs+1] int32 row offsets
    seq_lens_q: torch.Tensor | None = None  # draft extend: [bs] int32 rows per request


class TRTLLMMLAAttnBackend(FlashInferMLAAttnBackend):
    """Unified shape (after #26665): capture = ``_init_cuda_graph_metadata`` + the replay body; draft extend still
    re-copies ``cu_seqlens_q`` / ``seq_lens_q`` and does identity arithmetic every replay."""

    name = "trtllm_mla"
    variant = "unified"
    pattern = "A"
    page_sizes = (32, 64)
    page_size = 64  # what the registry builds it with
    graph_buffer_names = (
        "kv_indptr",
        "decode_cuda_graph_kv_indices",
        "cuda_graph_kv_indices",
        "cuda_graph_qo_indptr",
        "cuda_graph_kv_indptr",
        "cuda_graph_kv_lens",
    )
    # decode, idle, target verify, draft extend v2 (v1 is not captured): also the modes the kernel runs eagerly
    graph_modes = frozenset(GRAPH_MODES) - {ForwardMode.DRAFT_EXTEND}
    tree_refusal = "the kernel is causal among the N drafts, so target verify takes chains only (topk=1)"
    in_graph = False  # True: the graph rebuilds seq_lens_k (decode's too) and the block table itself

    def glue_refusal(self, mode: ForwardMode) -> str | None:
        return None  # no plan(): every replay writes device buffers from static inputs

    def __init__(self, world: World, spec: SpecConfig | None = None, *, draft_step: int | None = None, **kw):
        super().__init__(world, spec, **kw)
        self.page_size = world.page_size
        self.draft_step = draft_step  # multi-step draft decode: this step backend's index
        self.max_blocks = calc_padded_blocks(world.max_context_len, self.page_size)
        self.workspace_buffer = torch.zeros(WORKSPACE_BYTES, dtype=torch.int8, device=self.device)
        self.captured_max_seq_len = {}  # bs -> the bound its graph baked in

    def _seqlen_offset(self, mode: ForwardMode, spec_info: Any) -> int:
        """What the kernel's lengths add to ``seq_lens``: N (verify), step + 1 (draft step)."""
        if mode.is_target_verify():
            return verify_n(require_spec(mode, spec_info, VerifyInput), self.spec)
        if mode.is_draft_extend_v2():
            rows = require_spec(mode, spec_info, DraftExtendInput).num_tokens_per_req
            if rows != (n := layout.rows_per_request(mode, self.spec)):
                raise ValueError(
                    f"draft-extend batch has {rows} tokens per request, the graph was captured for {n} (num_draft_tokens)"
                )
            return 0
        if mode.is_decode_or_idle() and spec_info is not None:  # a draft step
            if self.draft_step is None:
                raise ValueError(f"{self.name}: draft decode runs through its multi-step wrapper")
            return self.draft_step + 1
        return 0

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        mode, bs = fb.forward_mode, fb.batch_size
        if mode not in self.graph_modes:
            return super().init_forward_metadata(fb)  # FlashInfer-MLA, page size 1
        offset, v2 = self._seqlen_offset(mode, fb.spec_info), mode.is_draft_extend_v2()
        longest = int(fb.seq_lens_cpu.max()) if bs else 1  # eager: a host value is fine
        table = new_block_table(self, bs, calc_padded_blocks(longest + offset, self.page_size), -1)
        seq_k = (fb.seq_lens + offset).to(torch.int32)
        build_block_table(self.world.req_to_token, fb.req_pool_indices, seq_k, table, self.page_size)
        md = self.forward_metadata = TRTLLMMLADecodeMetadata(table, longest, seq_k if offset or v2 else None)
        if v2:
            md.max_seq_len_q = layout.rows_per_request(mode, self.spec)
            md.sum_seq_lens_q = md.max_seq_len_q * bs

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, block_kv_indices=None) -> None:
        self.decode_cuda_graph_kv_indices = new_block_table(self, max_bs, self.max_blocks, -1, block_kv_indices)
        super().init_cuda_graph_state(max_bs, max_num_tokens)

    def _init_cuda_graph_metadata(self, bs, num_tokens, mode, spec_info) -> TRTLLMMLADecodeMetadata:
        """Per-bs metadata whose tensors the graph will read; ``max_seq_len_k = L`` holds for every later batch ("capture
        with full width so future longer sequences are safe")."""
        md = TRTLLMMLADecodeMetadata(self.decode_cuda_graph_kv_indices[:bs, : self.max_blocks], self.world.max_context_len)
        if mode.is_draft_extend_v2() or self._seqlen_offset(mode, spec_info) or self.in_graph:  # not plain decode
            md.seq_lens_k = torch.zeros(bs, dtype=torch.int32, device=self.device)
        if mode.is_draft_extend_v2():
            self._init_draft_extend(md, bs, num_tokens)
        self.decode_cuda_graph_metadata[bs] = self.forward_metadata = md
        self.captured_max_seq_len[bs] = md.max_seq_len_k
        return md

    def _init_draft_extend(self, md, bs: int, num_tokens: int) -> None:
        npb = num_tokens // bs
        md.max_seq_len_q, md.sum_seq_lens_q = npb, npb * bs
        md.cu_seqlens_q = torch.arange(0, bs * npb + 1, npb, dtype=torch.int32, device=self.device)
        md.seq_lens_q = torch.full((bs,), npb, dtype=torch.int32, device=self.device)

    def _apply_cuda_graph_metadata(self, bs, req_pool_indices, seq_lens, mode, spec_info) -> None:
        """The body capture and replay share: the kernel's lengths, then the block table."""
        md, seq = self.decode_cuda_graph_metadata[bs], seq_lens[:bs]
        offset = self._seqlen_offset(mode, spec_info)  # (and the batch must fit the graph)
        if mode.is_draft_extend_v2():
            seq = self._apply_draft_extend(md, bs, seq)
        elif offset:  # verify, draft step
            seq = seq + offset
            md.seq_lens_k.copy_(seq)
        build_block_table(self.world.req_to_token, req_pool_indices[:bs], seq, md.block_kv_indices, self.page_size)

    def _apply_draft_extend(self, md, bs: int, seq: torch.Tensor) -> torch.Tensor:
        npb = self.spec.num_draft_tokens
        md.max_seq_len_q, md.sum_seq_lens_q = npb, npb * bs
        md.cu_seqlens_q[: bs + 1].copy_(torch.arange(0, bs * npb + 1, npb, device=self.device))
        md.seq_lens_q[:bs].fill_(npb)
        seq = seq - md.seq_lens_q[:bs] + md.max_seq_len_q  # an identity: every row count is npb
        md.seq_lens_k.copy_(seq)
        return seq

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
    ) -> None:
        self.check_graph_mode(forward_mode)
        self._init_cuda_graph_metadata(bs, num_tokens, forward_mode, spec_info)
        self.init_forward_metadata_replay_cuda_graph(
            bs, req_pool_indices, seq_lens, None, encoder_lens, forward_mode, spec_info, seq_lens[:bs].cpu()
        )

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
    ) -> None:
        self._apply_cuda_graph_metadata(bs, req_pool_indices, seq_lens, forward_mode, spec_info)
        self.forward_metadata = self.decode_cuda_graph_metadata[bs]

    def graph_state(self, bs: int, mode: ForwardMode) -> dict[str, Any]:
        state = AttentionBackend.graph_state(self, bs, mode)  # the metadata's fields that are set
        return state | {"block_kv_indices": state["block_kv_indices"][:bs], "max_seq_len_k": self.captured_max_seq_len[bs]}

    def reference_graph_state(self, fb: ForwardBatch) -> dict[str, Any]:
        """From the batch: host lengths + the mode's offset, ``build_block_table_ref``, L."""
        mode, bs = fb.forward_mode, fb.batch_size
        offset = self._seqlen_offset(mode, fb.spec_info)
        seq_k = (fb.seq_lens_cpu + offset).to(torch.int32)
        fresh = torch.full((bs, self.max_blocks), -1, dtype=torch.int32, device="cpu")
        table = build_block_table_ref(self.world.req_to_token.cpu(), fb.req_pool_indices.cpu(), seq_k, fresh, self.page_size)
        ref = {"block_kv_indices": table, "max_seq_len_k": self.world.max_context_len}
        if mode.is_draft_extend_v2():
            n = self.spec.num_draft_tokens
            ref.update(seq_lens_k=seq_k, max_seq_len_q=n, sum_seq_lens_q=n * bs, seq_lens_q=torch.full((bs,), n, device="cpu"))
            ref["cu_seqlens_q"] = torch.arange(0, bs * n + 1, n, device="cpu")
        elif offset:
            ref["seq_lens_k"] = seq_k
        return ref

    def _attend(self, q: torch.Tensor, kv: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        md, cfg = self.forward_metadata, self.cfg
        if not isinstance(md, TRTLLMMLADecodeMetadata):
            return super()._attend(q, kv, fb)  # eager extend: FlashInfer-MLA
        bs = md.block_kv_indices.shape[0]
        out = trtllm_batch_decode_with_kv_cache_mla(
            q.view(bs, -1, cfg.num_heads, cfg.kv_row_width),  # [bs, n, H, 576]
            kv.view(-1, self.page_size, cfg.kv_row_width).unsqueeze(1),  # [pages, 1, P, 576]
            self.workspace_buffer,
            cfg.qk_nope_head_dim,
            cfg.kv_lora_rank,
            cfg.qk_rope_head_dim,
            block_tables=md.block_kv_indices,
            seq_lens=fb.seq_lens if md.seq_lens_k is None else md.seq_lens_k,
            max_seq_len=md.max_seq_len_k + self._seqlen_offset(fb.forward_mode, fb.spec_info),  # an int: frozen
            bmm1_scale=cfg.sm_scale,
        )
        return out.view(-1, cfg.num_heads, cfg.kv_lora_rank)


class TRTLLMMLAAttnBackendLegacy(TRTLLMMLAAttnBackend):
    """Pattern C (before #21987): two inline bodies, the historical differences numbered.

    1. capture freezes ``max_seq_len_k = seq_lens.max()`` of the capture batch; replay sets the Python
       attribute to the new maximum, which the captured call never sees (longer sequences truncated);
    2. draft-extend replay lays ``cu_seqlens_q`` / ``seq_lens_q`` out by accepted lengths
       (``accept_length + 1`` real rows) while capture used the uniform stride."""

    variant = "legacy"
    pattern = "C"

    def glue_refusal(self, mode: ForwardMode) -> str | None:
        return "(1): the replay hook sets max_seq_len_k from a host value, and a glue graph runs no Python"

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
    ) -> None:
        self.check_graph_mode(forward_mode)
        dev, i32 = self.device, torch.int32
        seq = seq_lens[:bs] + self._seqlen_offset(forward_mode, spec_info)
        table = self.decode_cuda_graph_kv_indices[:bs, : self.max_blocks]
        build_block_table(self.world.req_to_token, req_pool_indices[:bs], seq, table, self.page_size)
        md = TRTLLMMLADecodeMetadata(table, int(seq_lens[:bs].max()))  # (1) capture's maximum
        if forward_mode.is_draft_extend_v2():
            npb = num_tokens // bs
            md.max_seq_len_q, md.sum_seq_lens_q = npb, npb * bs
            md.cu_seqlens_q = torch.arange(0, bs * npb + 1, npb, dtype=i32, device=dev)  # (2)
            md.seq_lens_q = torch.full((bs,), npb, dtype=i32, device=dev)
            md.seq_lens_k = seq.to(i32)
        elif not torch.equal(seq, seq_lens[:bs]):  # verify, draft step (capture may sync)
            md.seq_lens_k = seq.to(i32)
        self.decode_cuda_graph_metadata[bs] = self.forward_metadata = md
        self.captured_max_seq_len[bs] = md.max_seq_len_k

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
    ) -> None:
        md = self.decode_cuda_graph_metadata[bs]
        seq = seq_lens[:bs] + self._seqlen_offset(forward_mode, spec_info)
        if forward_mode.is_draft_extend_v2():
            spec = require_spec(forward_mode, spec_info, DraftExtendInput)
            real = torch.ones(bs, dtype=torch.int32, device=self.device)  # padded rows: 1
            real[: spec.accept_length.numel()] = spec.accept_length + 1
            md.max_seq_len_q = max(spec.accept_length_cpu, default=0) + 1  # host values
            md.sum_seq_lens_q = sum(spec.accept_length_cpu) + bs
            md.cu_seqlens_q[1 : bs + 1] = torch.cumsum(real, 0)  # (2) a ragged stride
            md.seq_lens_q.copy_(real)
        if md.seq_lens_k is not None:
            md.seq_lens_k.copy_(seq)
        build_block_table(self.world.req_to_token, req_pool_indices[:bs], seq, md.block_kv_indices, self.page_size)
        md.max_seq_len_k = int(seq_lens_cpu[:bs].max())  # (1) the graph does not see this


class TRTLLMMLAAttnBackendSimplified(TRTLLMMLAAttnBackend):
    """#29077: draft extend's per-replay ``cu_seqlens_q`` copy, ``seq_lens_q`` fill and identity arithmetic gone; rows per
    request fixed to ``num_draft_tokens`` at init."""

    variant = "simplified"

    def _init_draft_extend(self, md, bs: int, num_tokens: int) -> None:
        super()._init_draft_extend(md, bs, self.spec.num_draft_tokens * bs)  # not num_tokens

    def _apply_draft_extend(self, md, bs: int, seq: torch.Tensor) -> torch.Tensor:
        npb = self.spec.num_draft_tokens
        md.max_seq_len_q, md.sum_seq_lens_q = npb, npb * bs  # Python ints, no launch
        md.seq_lens_k.copy_(seq)
        return seq


class TRTLLMMLAAttnBackendInGraph(TRTLLMMLAAttnBackendSimplified):
    """The metadata rebuild recorded inside the graph (#30807 / #31628): one fused Triton kernel rebuilds the block table
    and ``seq_lens_k`` in the graph; the replay hook only re-points."""

    variant = "in_graph"
    pattern = "in-graph"
    in_graph = True  # decode too: the fused kernel writes seq_lens_k

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
    ) -> None:
        self.check_graph_mode(forward_mode)
        self._init_cuda_graph_metadata(bs, num_tokens, forward_mode, spec_info)  # nothing else

    def init_forward_metadata_in_graph(self, fb: ForwardBatch) -> None:
        """Runs inside the captured region: recorded, so every replay rebuilds in the graph."""
        md, offset = self.forward_metadata, self._seqlen_offset(fb.forward_mode, fb.spec_info)
        trtllm_mla_graph_metadata(
            fb.req_pool_indices,
            fb.seq_lens,
            self.world.req_to_token,
            md.block_kv_indices,
            md.seq_lens_k,
            seqlen_offset=offset,
            page_size=self.page_size,
        )

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
    ) -> None:
        self._seqlen_offset(forward_mode, spec_info)  # the batch must fit the graph: host check
        self.forward_metadata = self.decode_cuda_graph_metadata[bs]  # re-point only


class TRTLLMMLAMultiStepDraftBackend(MultiStepBackend):
    """Multi-step draft decode (topk 1): S-1 independent step backends; step i's kernel lengths are ``seq_lens + i + 1``
    (the prefix and the i+1 drafts of the chain), its own block table."""

    step_cls: type = TRTLLMMLAAttnBackend
    chains_only = True

    def __init__(self, world: World, spec: SpecConfig | None = None, **kw):
        super().__init__(world, spec)
        self.step_backends = [self.step_cls(world, spec, draft_step=i, **kw) for i in range(spec.num_steps - 1)]

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        for b in self.step_backends:
            b.init_forward_metadata(fb)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.max_bs, self.max_num_tokens = max_bs, max_num_tokens
        for b in self.step_backends:
            b.init_cuda_graph_state(max_bs, max_num_tokens)

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
    ) -> None:
        self.check_graph_mode(forward_mode)
        for b in self.step_backends:
            b.init_forward_metadata_capture_cuda_graph(
                bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
            )

    def init_forward_metadata_replay_cuda_graph(self, *args) -> None:
        for b in self.step_backends:
            b.init_forward_metadata_replay_cuda_graph(*args)

    def reference_graph_state(self, fb: ForwardBatch) -> dict[str, Any]:
        return self.per_step(b.reference_graph_state(fb) for b in self.step_backends)


class TRTLLMMLAMultiStepDraftBackendLegacy(TRTLLMMLAMultiStepDraftBackend):
    step_cls = TRTLLMMLAAttnBackendLegacy


class TRTLLMMLAMultiStepDraftBackendSimplified(TRTLLMMLAMultiStepDraftBackend):
    step_cls = TRTLLMMLAAttnBackendSimplified


class TRTLLMMLAMultiStepDraftBackendInGraph(TRTLLMMLAMultiStepDraftBackend):
    step_cls = TRTLLMMLAAttnBackendInGraph
