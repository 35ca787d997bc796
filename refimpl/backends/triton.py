"""SGLang's Triton attention backend, unified (Pattern A) and legacy (Pattern C); refimpl's own ``fused`` and ``in_graph``
shapes are in ``triton_fused.py``.

Upstream: ``python/sglang/srt/layers/attention/triton_backend.py`` (``TritonAttnBackend``); unified by #26134 / #26665
(https://github.com/sgl-project/sglang/pull/26665); facts in ``[facts#triton]``, the static buffers
(``init_cuda_graph_state``, shapes and dtypes on ``TritonMetadata``'s fields) in ``[facts#triton-buffers]``. Kernels
(refimpl's Triton custom ops): the CSR kv-index builder, split-KV decode + its split-count heuristic, extend for verify
/ draft extend (prefix KV via ``kv_indices``). Frozen in a graph: the buffer addresses, ``max_kv_splits`` (grid dim 3 of
decode stage 1), ``max_extend_len`` (the extend q-block grid), head counts and dims. Row layout per mode:
``refimpl.layout`` (draft extend v2 strides N since #27545 and freezes ``max_extend_len = N``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .. import layout
from ..batch import ForwardBatch, World
from ..config import SpecConfig
from ..kernels import build_kv_indices, csr_ref, decode_attention, extend_attention, get_num_kv_splits, get_num_kv_splits_ref
from ..modes import GRAPH_MODES, ForwardMode
from ..spec import DraftExtendInput, VerifyInput, require_spec, verify_n
from .base import COPIES_MASK, AttentionBackend, GraphModeNotSupported, live_csr_state
from .multistep import MultiStepDraftBackend


@dataclass
class TritonMetadata:  # decode: the split-KV fields (logits, lse, splits); other modes: the extend fields
    kv_indptr: torch.Tensor  # [bs+1] int32 (rows+1 in draft decode)
    kv_indices: torch.Tensor  # [>= kv_indptr[-1]] int64 (int32 for Wave)
    attn_logits: torch.Tensor | None = None  # decode: [T, H, max_kv_splits, Dv] float32
    attn_lse: torch.Tensor | None = None  # decode: [T, H, max_kv_splits] float32
    num_kv_splits: torch.Tensor | None = None  # decode: [T] int32, data read by the kernel
    max_extend_len: int | None = None  # extend: q rows per request bound (frozen)
    qo_indptr: torch.Tensor | None = None  # extend: [bs+1]
    custom_mask: torch.Tensor | None = None  # verify: [>= mask_indptr[bs]] uint8/bool
    mask_indptr: torch.Tensor | None = None  # verify: [bs+1] int64 (with custom_mask, or neither)


class TritonAttnBackend(AttentionBackend):
    """Unified shape (POST-#26665): capture = replay body + ``_build_cuda_graph_forward_metadata``."""

    name = "triton"
    variant = "unified"
    pattern = "A"
    # the eager kv_indptr / qo_indptr / mask_indptr too: some graphs read them (as SGLang's do)
    graph_buffer_names = (
        "kv_indptr",
        "qo_indptr",
        "mask_indptr",
        "cuda_graph_attn_logits",
        "cuda_graph_attn_lse",
        "cuda_graph_num_kv_splits",
        "cuda_graph_kv_indices",
        "cuda_graph_custom_mask",
    )
    graph_modes = frozenset(GRAPH_MODES)  # every one: decode, idle, target verify, draft extend v1 / v2
    page_sizes = (1,)  # it indexes tokens
    kv_indices_dtype = torch.int64
    qo_indptr_dtype = torch.int64
    decode_rows_by_bs = False  # Wave: split-KV buffers and kv_indices sized by max_bs, not max_num_tokens

    def glue_refusal(self, mode: ForwardMode) -> str | None:
        return COPIES_MASK if mode.is_target_verify() else None

    def __init__(self, world: World, spec: SpecConfig | None = None, *, max_kv_splits=8, kv_indptr_buf=None, skip_prefill=False):
        super().__init__(world, spec)
        if not 1 <= max_kv_splits <= 256:
            raise ValueError(f"max_kv_splits={max_kv_splits} outside [1, 256]")
        indptr = lambda dtype: torch.zeros(world.req_to_token_pool.size + 1, dtype=dtype, device=self.device)  # noqa: E731
        self.kv_indptr = indptr(torch.int32) if kv_indptr_buf is None else kv_indptr_buf
        self.qo_indptr, self.mask_indptr = indptr(self.qo_indptr_dtype), indptr(torch.int64)
        self.max_kv_splits, self.skip_prefill = max_kv_splits, skip_prefill
        # get_num_kv_splits' core count: the SM count on a GPU, a fixed 8 on CPU (reproducible)
        self.core_count = torch.cuda.get_device_properties(self.device).multi_processor_count if self.device.type == "cuda" else 8

    def _split_kw(self) -> dict:  # the split-count heuristic's constants
        return dict(
            num_heads=self.cfg.num_heads,
            num_kv_heads=self.cfg.num_kv_heads,
            max_kv_splits=self.max_kv_splits,
            core_count=self.core_count,
        )

    def get_num_kv_splits(self, num_kv_splits: torch.Tensor, seq_lens: torch.Tensor) -> None:
        num_group = num_kv_splits.numel() // max(seq_lens.numel(), 1)  # rows per request: 1, or topk in draft decode
        get_num_kv_splits(num_kv_splits, seq_lens, num_group=num_group, **self._split_kw())

    def _verify_mask(self, spec_info: Any) -> tuple[int, torch.Tensor | None]:
        """(N, the spec's mask or None) after the host checks (batch N, buffer size)."""
        spec = require_spec(ForwardMode.TARGET_VERIFY, spec_info, VerifyInput)
        n, mask = verify_n(spec, self.spec), spec.custom_mask
        if mask is not None:
            layout.check_mask_fits(mask, self.cuda_graph_custom_mask)
        return n, mask

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        mode, bs, dev, seq, spec = fb.forward_mode, fb.batch_size, self.device, fb.seq_lens, fb.spec_info
        kv_total, mask = fb.seq_lens_sum, {}  # host values: eager may use them
        if mode.is_decode_or_idle():
            rows = 1
        elif mode.is_target_verify():  # N rows each over the prefix only: the drafts come as k/v
            spec = require_spec(mode, spec, VerifyInput)
            max_len = spec.draft_token_num
            rows = torch.full_like(seq, max_len)
            if spec.custom_mask is not None:
                mask = dict(custom_mask=spec.custom_mask, mask_indptr=layout.mask_indptr(seq, max_len))
        elif mode.is_extend() or mode.is_any_draft_extend():  # causal over the new rows, paged prefix before them
            rows = fb.extend_seq_lens if mode.is_extend() else require_spec(mode, spec, DraftExtendInput).extend_seq_lens
            kv_total -= fb.num_tokens
            max_len = int(rows.max()) if bs else 1  # eager: a host read is allowed (SGLang: .item())
        else:
            raise ValueError(f"{self.name}: unknown mode {mode}")
        if fb.kind.multi_step and spec.kv_indptr is not None:  # draft decode: the multi-step wrapper's rows
            kv_indptr, kv_indices = spec.kv_indptr, spec.kv_indices
        else:
            kv_lens = layout.prefix_kv_lens(mode, seq, rows)
            kv_indptr = F.pad(torch.cumsum(kv_lens, 0, dtype=torch.int32), (1, 0))  # [0, cumsum(kv_lens)]
            kv_indices = torch.zeros(max(kv_total, 1), dtype=self.kv_indices_dtype, device=dev)
            build_kv_indices(self.world.req_to_token, fb.req_pool_indices, kv_lens, kv_indptr, kv_indices)
        if mode.is_decode_or_idle():  # the decode fields: kv, logits, lse, split counts (one per row)
            splits = torch.empty(max(fb.num_tokens, 1), dtype=torch.int32, device=dev)
            if bs:
                self.get_num_kv_splits(splits[: fb.num_tokens], seq)
            self.forward_metadata = TritonMetadata(
                kv_indptr, kv_indices, *self._split_kv_scratch(splits.numel(), torch.empty), splits
            )
            return
        qo = F.pad(torch.cumsum(rows, 0, dtype=self.qo_indptr_dtype), (1, 0))
        self.forward_metadata = TritonMetadata(kv_indptr, kv_indices, max_extend_len=max_len, qo_indptr=qo, **mask)

    def _split_kv_scratch(self, rows: int, alloc=torch.zeros) -> tuple[torch.Tensor, torch.Tensor]:
        """Split-KV decode's float32 scratch: logits [rows, H, max_kv_splits, Dv], lse [rows, H, max_kv_splits] (eager:
        ``torch.empty``, stage 1 writes what stage 2 reads; graphs: zeros)."""
        shape, f32 = (rows, self.cfg.num_heads, self.max_kv_splits), dict(dtype=torch.float32, device=self.device)
        return alloc(*shape, self.cfg.v_head_dim, **f32), alloc(shape, **f32)

    def init_cuda_graph_state(self, max_bs, max_num_tokens, kv_indices_buf=None, num_kv_splits_buf=None) -> None:
        self.max_bs, self.max_num_tokens = max_bs, max_num_tokens
        T, L, S, dev = max_num_tokens, self.world.max_context_len, self.max_kv_splits, self.device
        R = max_bs if self.decode_rows_by_bs else T  # rows of the split-KV buffers
        self.cuda_graph_attn_logits, self.cuda_graph_attn_lse = self._split_kv_scratch(R)
        if num_kv_splits_buf is None or self.decode_rows_by_bs:  # Wave: its own [B] buffer, always
            num_kv_splits_buf = torch.full((R,), S, dtype=torch.int32, device=dev)
        elif int(num_kv_splits_buf.max()) > S:  # outside any graph: a host read is fine here
            raise ValueError(
                f"shared num_kv_splits buffer holds a split count of {int(num_kv_splits_buf.max())}, "
                f"above this backend's max_kv_splits={S} (the decode grid's third dimension)"
            )
        self.cuda_graph_num_kv_splits = num_kv_splits_buf
        if kv_indices_buf is None:
            kv_indices_buf = torch.zeros(R * L, dtype=self.kv_indices_dtype, device=dev)
        self.cuda_graph_kv_indices = kv_indices_buf
        if not self.skip_prefill:
            self.cuda_graph_custom_mask = torch.zeros(T * L, dtype=torch.uint8, device=dev)

    # --- the shared fill helpers (post-#26665) --------------------------------------------------
    def _fill_kv_indptr_and_indices(self, bs, lens, rpi, kv_indices) -> torch.Tensor:
        kv_indptr = self.kv_indptr[: bs + 1]
        kv_indptr[1:] = torch.cumsum(lens, 0)  # in place: the graph reads this buffer
        build_kv_indices(self.world.req_to_token, rpi, lens, kv_indptr, kv_indices)
        return kv_indptr

    def _update_decode_kv_buffers(self, bs, seq_lens, rpi) -> None:
        self._fill_kv_indptr_and_indices(bs, seq_lens[:bs], rpi[:bs], self.cuda_graph_kv_indices)

    def _update_target_verify_buffers(self, bs, seq_lens, rpi, spec_info) -> None:
        n, mask = self._verify_mask(spec_info)
        seq_lens = seq_lens[:bs]
        self.qo_indptr[: bs + 1].copy_(torch.arange(0, (bs + 1) * n, n, device=self.device))
        self._fill_kv_indptr_and_indices(bs, seq_lens, rpi[:bs], self.cuda_graph_kv_indices)
        if mask is not None:
            self.cuda_graph_custom_mask[: mask.numel()].copy_(mask)
        layout.mask_indptr(seq_lens, n, out=self.mask_indptr)

    def _update_draft_extend_buffers(self, bs, seq_lens, rpi, mode, spec_info) -> None:
        tpr = layout.rows_per_request(mode, self.spec)
        self.qo_indptr[: bs + 1].copy_(torch.arange(0, bs * tpr + 1, tpr, device=self.device))
        kv_lens = layout.prefix_kv_lens(mode, seq_lens[:bs], tpr)  # padded rows: empty prefix
        self._fill_kv_indptr_and_indices(bs, kv_lens, rpi[:bs], self.cuda_graph_kv_indices)

    def _decode_views(self, kv_indptr: torch.Tensor, kv_indices: torch.Tensor) -> TritonMetadata:
        """Decode metadata over the static split-KV buffers (logits, lse, split counts)."""
        return TritonMetadata(
            kv_indptr, kv_indices, self.cuda_graph_attn_logits, self.cuda_graph_attn_lse, self.cuda_graph_num_kv_splits
        )

    def _build_cuda_graph_forward_metadata(self, bs: int, mode: ForwardMode, spec_info: Any):
        """Metadata whose tensors are views of the static buffers (nothing is computed)."""
        kv = dict(kv_indptr=self.kv_indptr[: bs + 1], kv_indices=self.cuda_graph_kv_indices)
        if mode.is_decode_or_idle():
            return self._decode_views(**kv)
        if mode.is_target_verify() and getattr(spec_info, "custom_mask", None) is not None:
            kv.update(custom_mask=self.cuda_graph_custom_mask, mask_indptr=self.mask_indptr[: bs + 1])
        # the rows' stride, raising for a mode not captured (verify, draft extend v2: N; upstream froze S+1 for draft
        # extend v2 after #26665, still at 0085842: rows missed once N > S+1)
        return TritonMetadata(**kv, max_extend_len=layout.rows_per_request(mode, self.spec), qo_indptr=self.qo_indptr[: bs + 1])

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
    ) -> None:
        self.check_graph_mode(forward_mode)
        if forward_mode.is_decode_or_idle() and spec_info is not None:  # a draft step (SGLang's test)
            # multi-step draft decode: the multi-step wrapper owns and fills the kv buffers
            self.forward_metadata = self._decode_views(spec_info.kv_indptr, spec_info.kv_indices)
            return
        self.init_forward_metadata_replay_cuda_graph(
            bs, req_pool_indices, seq_lens, None, encoder_lens, forward_mode, spec_info, None
        )
        self.forward_metadata = self._build_cuda_graph_forward_metadata(bs, forward_mode, spec_info)

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
    ) -> None:
        self._apply_cuda_graph_metadata(bs, req_pool_indices, seq_lens, forward_mode, spec_info)

    def _apply_cuda_graph_metadata(self, bs, req_pool_indices, seq_lens, forward_mode, spec_info) -> None:
        """The one body: the batch's metadata into the static buffers, in place (SGLang 0.5.23's name for it)."""
        if forward_mode.is_decode_or_idle():
            if spec_info is not None:  # a draft step
                raise ValueError("multi-step draft decode replays through its multi-step wrapper")
            self._update_decode_kv_buffers(bs, seq_lens, req_pool_indices)
            self.get_num_kv_splits(self.cuda_graph_num_kv_splits[:bs], seq_lens[:bs])
        elif forward_mode.is_target_verify():
            self._update_target_verify_buffers(bs, seq_lens, req_pool_indices, spec_info)
        elif forward_mode.is_any_draft_extend():
            self._update_draft_extend_buffers(bs, seq_lens, req_pool_indices, forward_mode, spec_info)
        else:
            raise GraphModeNotSupported(f"{self.name}: {forward_mode.label} is not captured")

    def graph_state(self, bs: int, mode: ForwardMode) -> dict[str, Any]:
        md: TritonMetadata = self.forward_metadata
        if md.num_kv_splits is not None:  # decode: one split count per row
            splits = md.num_kv_splits[: md.kv_indptr.numel() - 1]
            return live_csr_state(md, num_kv_splits=splits, max_kv_splits=md.attn_logits.shape[2])
        return live_csr_state(md, qo_indptr=md.qo_indptr, max_extend_len=md.max_extend_len)

    def reference_graph_state(self, fb: ForwardBatch) -> dict[str, Any] | None:
        """From the batch alone: host lengths, ``build_kv_indices_ref``, ``get_num_kv_splits_ref``, the mode's row stride;
        live regions only."""
        mode = fb.forward_mode
        if fb.kind.multi_step:
            return None  # the multi-step wrapper gives the per-step reference
        seq = fb.seq_lens_cpu.to(torch.int64)
        rows = layout.rows_per_request(mode, self.spec)  # verify / draft extend v2: N; v1: S+1; decode: 1
        ref = csr_ref(self.world.req_to_token, fb.req_pool_indices, layout.prefix_kv_lens(mode, seq, rows))
        if mode.is_decode_or_idle():
            return self.draft_step_reference(ref["kv_indptr"], ref["kv_indices"], fb)
        ref.update(qo_indptr=torch.arange(0, fb.batch_size * rows + 1, rows, device="cpu"), max_extend_len=rows)
        if mode.is_target_verify() and (mask := fb.spec_info.custom_mask) is not None:  # the live requests' blocks
            ref.update(mask_indptr=layout.mask_indptr(seq, rows), custom_mask=mask.to(torch.uint8))
        return ref

    def draft_step_reference(self, indptr: torch.Tensor, indices: torch.Tensor, fb) -> dict:
        group = fb.spec_info.topk if fb.kind.multi_step else 1  # rows per request
        splits = get_num_kv_splits_ref(fb.seq_lens_cpu.tolist(), num_group=group, **self._split_kw())
        return dict(
            kv_indptr=indptr,
            kv_indices=indices,
            max_kv_splits=self.max_kv_splits,
            num_kv_splits=torch.tensor(splits, device="cpu"),
        )

    def forward(self, q, k, v, layer: int, fb: ForwardBatch) -> torch.Tensor:
        md: TritonMetadata = self.forward_metadata
        cache, cfg = self.world.kv_cache, self.cfg
        cache.set_kv(layer, fb.out_cache_loc[: q.shape[0]], k, v)
        out = q.new_empty(q.shape[0], cfg.num_heads, cfg.v_head_dim)
        if q.shape[0] == 0:  # an idle batch
            return out
        kc, vc, csr = cache.k[layer], cache.v[layer], (md.kv_indptr, md.kv_indices)
        if md.num_kv_splits is not None:  # decode / idle / draft decode; the split-KV buffers, max_kv_splits
            decode_attention(
                q, kc, vc, out, *csr, md.attn_logits, md.attn_lse, md.num_kv_splits, md.attn_logits.shape[2], cfg.sm_scale
            )
        else:  # target verify / draft extend / extend: new tokens' k, v passed directly; the mask, its indptr, causal
            mask = md.custom_mask, md.mask_indptr, md.custom_mask is None
            extend_attention(q, k, v, out, kc, vc, md.qo_indptr, *csr, *mask, md.max_extend_len, cfg.sm_scale)
        return out


class TritonAttnBackendLegacy(TritonAttnBackend):
    """Legacy shape (Pattern C, before #26134): two inline bodies, none of the refactor's helpers:

    1. capture never calls ``get_num_kv_splits``: the split buffer keeps ``max_kv_splits`` from
       ``torch.full`` through warm-up and capture (benign: replay computes it, the kernel reads it);
    2. draft-extend replay lays ``qo_indptr`` out by cumulative accept lengths (ragged), capture by
       the uniform stride the rows really have: requests after the first read the wrong rows;
    3. draft extend v2 strides ``S + 1`` like v1 (before #27545): wrong rows once ``N > S + 1``."""

    variant = "legacy"
    pattern = "C"

    def glue_refusal(self, mode: ForwardMode) -> str | None:
        if mode.is_any_draft_extend():  # (2)
            return "the draft-extend hook lays qo_indptr out by spec_info.accept_length: a glue graph keeps the first's"
        return super().glue_refusal(mode)

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
    ) -> None:
        self.check_graph_mode(forward_mode)
        r2t, dev = self.world.req_to_token, self.device
        if forward_mode.is_decode_or_idle():
            if spec_info is not None:  # multi-step: the wrapper's rows
                kv_indptr, kv_indices = spec_info.kv_indptr, spec_info.kv_indices
            else:
                kv_indptr, kv_indices = self.kv_indptr, self.cuda_graph_kv_indices
                kv_indptr[1 : bs + 1] = torch.cumsum(seq_lens[:bs], 0)
                kv_indptr = kv_indptr[: bs + 1]
                build_kv_indices(r2t, req_pool_indices[:bs], seq_lens[:bs], kv_indptr, kv_indices)
            # (1) no get_num_kv_splits here
            self.forward_metadata = TritonMetadata(
                kv_indptr,
                kv_indices,
                attn_logits=self.cuda_graph_attn_logits,
                attn_lse=self.cuda_graph_attn_lse,
                num_kv_splits=self.cuda_graph_num_kv_splits,
            )
        elif forward_mode.is_target_verify():
            spec = require_spec(forward_mode, spec_info, VerifyInput)
            n = verify_n(spec, self.spec)
            self.qo_indptr[: bs + 1] = torch.arange(0, (bs + 1) * n, n, device=dev)
            self.kv_indptr[1 : bs + 1] = torch.cumsum(seq_lens[:bs], 0)
            kv_indptr = self.kv_indptr[: bs + 1]
            build_kv_indices(r2t, req_pool_indices[:bs], seq_lens[:bs], kv_indptr, self.cuda_graph_kv_indices)
            custom_mask = mask_indptr = None
            if spec.custom_mask is not None:
                self.cuda_graph_custom_mask[: spec.custom_mask.numel()].copy_(spec.custom_mask)
                seq_mask_len = n * (seq_lens[:bs].to(torch.int64) + n)
                self.mask_indptr[1 : bs + 1] = torch.cumsum(seq_mask_len, 0)
                custom_mask, mask_indptr = self.cuda_graph_custom_mask, self.mask_indptr[: bs + 1]
            self.forward_metadata = TritonMetadata(
                kv_indptr,
                self.cuda_graph_kv_indices,
                max_extend_len=n,
                qo_indptr=self.qo_indptr[: bs + 1],
                custom_mask=custom_mask,
                mask_indptr=mask_indptr,
            )
        elif forward_mode.is_any_draft_extend():
            stride = self.spec.num_steps + 1  # (2) uniform at capture; (3) S+1 for v2 too
            self.qo_indptr[: bs + 1] = torch.arange(0, bs * stride + 1, stride, device=dev)
            kv_lens = torch.clamp(seq_lens[:bs] - stride, min=0)  # prefix before the new rows
            self.kv_indptr[1 : bs + 1] = torch.cumsum(kv_lens, 0)
            kv_indptr = self.kv_indptr[: bs + 1]
            build_kv_indices(r2t, req_pool_indices[:bs], kv_lens, kv_indptr, self.cuda_graph_kv_indices)
            self.forward_metadata = TritonMetadata(
                kv_indptr, self.cuda_graph_kv_indices, max_extend_len=stride, qo_indptr=self.qo_indptr[: bs + 1]
            )

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
    ) -> None:
        r2t, dev = self.world.req_to_token, self.device
        rpi, seq = req_pool_indices[:bs], seq_lens[:bs]
        if forward_mode.is_decode_or_idle():
            if spec_info is not None:
                raise AssertionError("Multi-step cuda graph init is not done here.")
            self.kv_indptr[1 : bs + 1] = torch.cumsum(seq, 0)
            build_kv_indices(r2t, rpi, seq, self.kv_indptr[: bs + 1], self.cuda_graph_kv_indices)
            self.get_num_kv_splits(self.cuda_graph_num_kv_splits[:bs], seq)
        elif forward_mode.is_target_verify():
            spec = require_spec(forward_mode, spec_info, VerifyInput)
            n = verify_n(spec, self.spec)
            bs = len(req_pool_indices)  # upstream recomputes bs here
            self.qo_indptr[: bs + 1] = torch.arange(0, (bs + 1) * n, n, device=dev)
            self.kv_indptr[1 : bs + 1] = torch.cumsum(seq_lens[:bs], 0)
            build_kv_indices(r2t, req_pool_indices[:bs], seq_lens[:bs], self.kv_indptr[: bs + 1], self.cuda_graph_kv_indices)
            if spec.custom_mask is not None:
                self.cuda_graph_custom_mask[: spec.custom_mask.numel()].copy_(spec.custom_mask)
                seq_mask_len = n * (seq_lens[:bs].to(torch.int64) + n)
                self.mask_indptr[1 : bs + 1] = torch.cumsum(seq_mask_len, 0)
        elif forward_mode.is_any_draft_extend():
            spec = require_spec(forward_mode, spec_info, DraftExtendInput)
            stride = self.spec.num_steps + 1  # (3)
            real = torch.ones(bs, dtype=torch.int64, device=dev)  # padded rows: 1
            real[: spec.accept_length.numel()] = spec.accept_length.to(torch.int64) + 1
            self.qo_indptr[1 : bs + 1] = torch.cumsum(real, 0)  # (2) replay: ragged stride
            kv_lens = torch.clamp(seq - stride, min=0)
            self.kv_indptr[1 : bs + 1] = torch.cumsum(kv_lens, 0)
            build_kv_indices(r2t, rpi, kv_lens, self.kv_indptr[: bs + 1], self.cuda_graph_kv_indices)
        else:
            raise GraphModeNotSupported(f"{self.name}: {forward_mode.label} is not captured")


class TritonAttnBackendOutGraph(TritonAttnBackend):
    """Stage 3, SGLang 0.5.23's interface (``triton_backend.py``: ``init_forward_metadata_out_graph``): one entry point
    whose ``in_capture`` adds the frozen views to the one body; the classic pair is gone (from 0.5.23's base class too).
    Buffers, body, views and ``forward`` are the unified shape's. Open PR #28765
    (https://github.com/sgl-project/sglang/pull/28765) goes on to fold the eager body in too (``_compute_forward_metadata``).
    Modes as 0.5.23's: no draft extend v1 (its ``ForwardMode`` has none). Not modelled: upstream's multi-step wrapper (it calls each step's out-graph hook at
    capture, whose spec-input branch only takes views of the wrapper's buffers), sliding-window refills, dLLM modes."""

    variant = "out_graph"
    graph_modes = frozenset(GRAPH_MODES) - {ForwardMode.DRAFT_EXTEND}
    init_forward_metadata_capture_cuda_graph = AttentionBackend.init_forward_metadata_capture_cuda_graph  # gone in 0.5.23
    init_forward_metadata_replay_cuda_graph = AttentionBackend.init_forward_metadata_replay_cuda_graph

    def init_forward_metadata_out_graph(self, fb: ForwardBatch, in_capture: bool = False) -> None:
        mode, spec_info = fb.forward_mode, fb.spec_info
        if in_capture:
            self.check_graph_mode(mode)
        self._apply_cuda_graph_metadata(fb.batch_size, fb.req_pool_indices, fb.seq_lens, mode, spec_info)
        if in_capture:  # views of the buffers just written, kept by every replay of this size
            self.forward_metadata = self._build_cuda_graph_forward_metadata(fb.batch_size, mode, spec_info)


class TritonMultiStepDraftBackend(MultiStepDraftBackend):
    """Multi-step draft decode over unified Triton step backends: one split buffer, shared."""

    step_cls = TritonAttnBackend


class TritonMultiStepDraftBackendLegacy(MultiStepDraftBackend):
    """Over legacy step backends; capture skips the split counts, as upstream's does."""

    step_cls = TritonAttnBackendLegacy
    compute_splits_at_capture = False
