"""SGLang's FlashInfer-MLA backend: unified, as-upstream and legacy shapes.

Upstream: ``python/sglang/srt/layers/attention/flashinfer_mla_backend.py`` (``FlashInferMLAAttnBackend``); facts in
``[facts#flashinfer-mla]``. One wrapper kind, ``BatchMLAPagedAttentionWrapper``, serves every mode: absorbed MLA over
the latent cache ``[slots, 1, 512 + 64]`` (``ckv = [..., :512]``, ``kpe = [..., 512:]``), page size 1. Graph-bound int32
buffers: ``cuda_graph_qo_indptr`` / ``cuda_graph_kv_indptr [pool+1]``, ``cuda_graph_kv_indices
[max_bs*max_context_len]``, ``cuda_graph_kv_lens [max_bs]`` (``kv_len_arr``); host ``cuda_graph_*_cpu``: the fast plan's
indptrs.

Decode replays with the fast MLA plan (host indptrs from ``seq_lens_cpu``, nothing copied into the bound buffers: #3987,
https://github.com/sgl-project/sglang/pull/3987). Target verify and draft extend plan ``causal=True`` (upstream: "TODO:
support custom mask when topk > 1": trees refused), re-planning fully in the upstream shapes and, in the unified one,
with the fast plan too (refimpl's: the bound buffers written in place).

- **legacy** (C): capture and replay each have identical target-verify and draft-extend branches;
  decode replay rebuilds ``kv_indptr`` in the backend's *eager* buffer.
- **as-upstream** (C, merged branches, #26665): capture never runs the replay body, and decode replay
  still writes the eager ``kv_indptr`` (#37975, open): the bound ``kv_indptr`` / ``kv_len_arr`` keep the
  capture-time batch, hidden (the kernel reads the partition) but checker-visible.
- **unified** (B, refimpl's): prepare the wrapper, run the replay body, install the fast plan; decode
  replay writes the bound buffers, a fix upstream has not made (#37975). Its multi-step draft wrapper
  (``FlashInferMLAMultiStepDraftBackend``, chains only, as upstream's) plans each step over the step's own lengths,
  prefix + i + 1.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import layout
from ..batch import ForwardBatch, World
from ..config import SpecConfig
from ..flashinfer_wrappers.fast_plan import install_fast_mla_decode_plan, is_fast_plan_installed
from ..flashinfer_wrappers.ops import fi_mla_run
from ..modes import GRAPH_MODES, ForwardMode
from ..spec import DraftExtendInput, VerifyInput, require_spec
from .base import PLANS, AttentionBackend, GraphModeNotSupported
from .flashinfer import csr_reference, init_wrappers, write_kv
from .multistep import MultiStepDraftBackend


def new_block_table(backend: AttentionBackend, rows: int, width: int, fill: int, given=None) -> torch.Tensor:
    """A paged subclass's (TRTLLM-MLA, Cutlass-MLA) block table: a fresh int32 ``[rows, width]`` filled with ``fill`` on
    the backend's device, or a graph's ``given`` one if its pages cover ``max_context_len``."""
    if given is None:
        return torch.full((rows, width), fill, dtype=torch.int32, device=backend.device)
    if (covers := given.shape[1] * backend.page_size) < (L := backend.world.max_context_len):
        raise ValueError(
            f"block table of width {given.shape[1]} pages of {backend.page_size} covers {covers} positions < max_context_len={L}"
        )
    return given


class FlashInferMLAAttnBackend(AttentionBackend):
    """refimpl's unified shape: Pattern B, and the bound kv_indptr kept current (#37975)."""

    name = "flashinfer_mla"
    variant = "unified"
    pattern = "B"
    model_kind = "mla"
    graph_buffer_names = (
        "kv_indptr",
        "cuda_graph_kv_indices",
        "cuda_graph_qo_indptr",
        "cuda_graph_kv_indptr",
        "cuda_graph_kv_lens",
    )
    writes_bound_kv_indptr = True  # False: the #37975 behaviour
    graph_modes = frozenset(GRAPH_MODES)  # every one: decode, idle, target verify, draft extend v1 / v2
    page_sizes = (1,)
    kv_indices_dtype = torch.int32
    tree_refusal = "verify plans causal=True without a tree mask (upstream TODO: custom mask when topk > 1)"

    def __init__(self, world: World, spec: SpecConfig | None = None, *, kv_indptr_buf=None, skip_prefill=False, prefer_real=True):
        """``kv_indptr_buf``: a multi-step step's row of its wrapper's indptr (``skip_prefill``: its steps decode only)."""
        super().__init__(world, spec)
        if not self.cfg.is_mla:
            raise ValueError(f"{self.name} needs an MLA model, got kind={self.cfg.kind!r}")
        init_wrappers(self, prefer_real, kv_indptr_buf)  # self.kv_indptr: the eager buffer
        self.q_indptr_decode = torch.arange(world.req_to_token_pool.size + 1, dtype=torch.int32, device=self.device)
        self._eager = self.fi.BatchMLAPagedAttentionWrapper(self.workspace, backend="auto")

    def glue_refusal(self, mode: ForwardMode) -> str | None:
        return PLANS  # Cutlass-MLA and TRTLLM-MLA, built on this class, plan nothing

    def check_graph_mode(self, mode: ForwardMode) -> None:
        super().check_graph_mode(mode)
        if mode.is_target_verify() and self.spec is not None and self.spec.topk > 1:
            raise GraphModeNotSupported(f"{self.name}: {self.tree_refusal}; topk={self.spec.topk}")

    # --- plans --------------------------------------------------------------------------------
    def _plan(self, wrapper, qo_indptr, kv_indptr, kv_indices, kv_len_arr, causal: bool) -> None:
        """``plan``, every argument by keyword (flashinfer 0.7.2 deprecates positional MLA plan arguments)."""
        c = self.cfg
        wrapper.plan(
            qo_indptr=qo_indptr,
            kv_indptr=kv_indptr,
            kv_indices=kv_indices,
            kv_len_arr=kv_len_arr,
            num_heads=c.num_heads,
            head_dim_ckv=c.kv_lora_rank,
            head_dim_kpe=c.qk_rope_head_dim,
            page_size=1,
            causal=causal,
            sm_scale=c.sm_scale,
            q_data_type=c.dtype,
            kv_data_type=c.dtype,
        )

    @staticmethod
    def _step_kv(spec_info) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A multi-step step's own device ``(kv_indptr, kv_indices)`` (its wrapper's one launch wrote them), else None."""
        return None if getattr(spec_info, "kv_indptr", None) is None else (spec_info.kv_indptr, spec_info.kv_indices)

    def _full_decode_plan(self, bs, rpi, seq_lens, seq_lens_cpu, wrapper, spec_info=None) -> None:
        """indices_updater_decode.update(init_metadata_replay=False): fresh indices (a step: its own), full plan (device
        indptrs; a step's lengths from its indptr: prefix + its drafts)."""
        if (step := self._step_kv(spec_info)) is not None:
            kv_indptr, kv_indices = step
            kv_len = kv_indptr.diff()
        else:
            kv_indptr, kv_len = self.kv_indptr[: bs + 1], seq_lens[:bs].to(torch.int32)
            kv_indices = torch.empty(max(int(seq_lens_cpu[:bs].sum()), 1), dtype=torch.int32, device=self.device)
            write_kv(self.world.req_to_token, rpi, kv_len, kv_indptr, kv_indices)
        self._plan(wrapper, self.q_indptr_decode[: bs + 1], kv_indptr, kv_indices, kv_len, False)

    # decode replays and unified verify / draft extend replays split in two ([facts#host-device-split]): a host phase
    # (host indptrs, the plan) and a device phase (the indices and lengths into the bound buffers, from device tensors)
    def _decode_host(self, bs, seq_lens_cpu, spec_info=None) -> None:
        """Decode replay's plan: host indptrs into the fast plan (a multi-step step: prefix + its i+1 drafts)."""
        kv_len_cpu = seq_lens_cpu[:bs].to(torch.int32)
        if self._step_kv(spec_info) is not None:
            kv_len_cpu = layout.draft_step_kv_lens(kv_len_cpu, spec_info.extra["step"])
        kv_indptr_cpu = self.cuda_graph_kv_indptr_cpu[: bs + 1]
        kv_indptr_cpu[1:] = kv_len_cpu.cumsum(0)  # host
        qo_indptr_cpu = self.cuda_graph_qo_indptr_cpu[: bs + 1]  # arange: one query per request
        wrapper = self.decode_cuda_graph_metadata[bs]
        self._plan(wrapper, qo_indptr_cpu, kv_indptr_cpu, self.cuda_graph_kv_indices, kv_len_cpu, False)

    def _decode_device(self, bs, rpi, seq_lens, spec_info=None) -> None:
        """Decode replay's indices into the bound buffer, its indptr into the eager buffer (#37975) or the bound one,
        kept current with the bound kv_len_arr. A multi-step step's indices are its wrapper's (its bound buffer is the
        wrapper's row): only its indptr and lengths are copied."""
        if (step := self._step_kv(spec_info)) is not None:
            if self.writes_bound_kv_indptr:
                self.cuda_graph_kv_indptr[: bs + 1].copy_(step[0])
                self.cuda_graph_kv_lens[:bs].copy_(step[0].diff())
            return
        seq, kv_indptr = seq_lens[:bs], self.kv_indptr
        if self.writes_bound_kv_indptr:
            kv_indptr = self.cuda_graph_kv_indptr
            self.cuda_graph_kv_lens[:bs].copy_(seq)
        write_kv(self.world.req_to_token, rpi, seq, kv_indptr[: bs + 1], self.cuda_graph_kv_indices)

    def _fast_decode_replay(self, bs, rpi, seq_lens, seq_lens_cpu) -> None:
        """Decode replay in one body (the legacy hooks): the indices, then the plan."""
        self._decode_device(bs, rpi, seq_lens)
        self._decode_host(bs, seq_lens_cpu)

    def _prefill_args(self, bs, seq_lens_cpu, mode, spec_info):
        """Verify's / draft extend's rows per request and host ``(kv_lens, qo_indptr, kv_indptr)``, int32 (verify: prefix
        + N drafts)."""
        require_spec(mode, spec_info, VerifyInput if mode.is_target_verify() else DraftExtendInput)
        n = layout.rows_per_request(mode, self.spec)
        kv_lens_cpu = layout.attended_kv_lens(mode, seq_lens_cpu[:bs], n).to(torch.int32)
        qo_indptr_cpu = torch.arange(0, (bs + 1) * n, n, dtype=torch.int32, device="cpu")
        kv_indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32, device="cpu")
        kv_indptr_cpu[1:] = kv_lens_cpu.cumsum(0)
        return n, kv_lens_cpu, qo_indptr_cpu, kv_indptr_cpu

    def _prefill_device(self, bs, rpi, seq_lens, wrapper, mode, n, total: int = 1) -> torch.Tensor:
        """The indices from device data: a graph wrapper's into its bound buffer (and, once it plans fast, the bound
        indptr and kv_len_arr, which the fast plan does not copy), else into fresh ones of ``total``; returns them."""
        fast, kv_lens = is_fast_plan_installed(wrapper), layout.attended_kv_lens(mode, seq_lens[:bs], n)
        kv_indptr = (self.cuda_graph_kv_indptr if fast else self.kv_indptr)[: bs + 1]  # else scratch for the kernel
        graph = wrapper is not self._eager
        kv_indices = self.cuda_graph_kv_indices if graph else torch.empty(total, dtype=torch.int32, device=self.device)
        write_kv(self.world.req_to_token, rpi, kv_lens, kv_indptr, kv_indices)
        if fast:
            self.cuda_graph_kv_lens[:bs].copy_(kv_lens)
        return kv_indices

    def _prefill_host(self, wrapper, args, kv_indices) -> None:
        """The plan from host indptrs / lengths (SGLang: device ones, a sync per replay:
        [facts#where-refimpl-deliberately-differs-from-upstream]); a fast plan's qo_indptr copied first (it copies
        nothing itself)."""
        _, kv_lens_cpu, qo_indptr_cpu, kv_indptr_cpu = args
        if is_fast_plan_installed(wrapper):
            self.cuda_graph_qo_indptr[: len(qo_indptr_cpu)].copy_(qo_indptr_cpu, non_blocking=True)
        total = max(int(kv_indptr_cpu[-1]), 1)
        self._plan(wrapper, qo_indptr_cpu, kv_indptr_cpu, kv_indices[:total], kv_lens_cpu, True)

    def _prefill_plan(self, bs, rpi, seq_lens, seq_lens_cpu, wrapper, mode, spec_info) -> None:
        """Verify and draft extend (generate_attn_arg_prefill): the indices, then the plan."""
        args = self._prefill_args(bs, seq_lens_cpu, mode, spec_info)
        kv_indices = self._prefill_device(bs, rpi, seq_lens, wrapper, mode, args[0], max(int(args[3][-1]), 1))
        self._prefill_host(wrapper, args, kv_indices)

    # --- eager --------------------------------------------------------------------------------
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        mode, bs = fb.forward_mode, fb.batch_size
        args = (bs, fb.req_pool_indices, fb.seq_lens, fb.seq_lens_cpu, self._eager)
        if mode.is_decode_or_idle():
            if bs:  # an empty (idle) batch plans nothing: flashinfer 0.7.2 refuses it, forward runs no kernel
                self._full_decode_plan(*args, fb.spec_info)
        elif mode.is_target_verify() or mode.is_any_draft_extend():
            self._prefill_plan(*args, mode, fb.spec_info)
        else:
            raise ValueError(f"{self.name}: eager {mode.label} is not modelled here")
        self.forward_metadata = self._eager  # the metadata: the planned wrapper

    # --- graphs -------------------------------------------------------------------------------
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, kv_indices_buf=None, num_kv_splits_buf=None) -> None:
        """``kv_indices_buf``: a multi-step step's row of its wrapper's indices (no split buffer here)."""
        self.max_bs, self.max_num_tokens = max_bs, max_num_tokens
        n = max_bs * self.world.max_context_len
        self.cuda_graph_kv_indices = (
            torch.zeros(n, dtype=torch.int32, device=self.device) if kv_indices_buf is None else kv_indices_buf
        )
        self.cuda_graph_qo_indptr = self.q_indptr_decode.clone()
        self.cuda_graph_kv_indptr = self.kv_indptr.clone()
        self.cuda_graph_kv_lens = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        # copy=True: on a CPU run .cpu() would alias the device buffer instead of mirroring it
        self.cuda_graph_qo_indptr_cpu = self.cuda_graph_qo_indptr.to("cpu", copy=True)
        self.cuda_graph_kv_indptr_cpu = self.cuda_graph_kv_indptr.to("cpu", copy=True)

    def _create_wrapper(self, n: int):
        """A wrapper bound to the ``[:n+1]`` / ``[:n]`` slices of the graph buffers."""
        return self.fi.BatchMLAPagedAttentionWrapper(
            self.workspace,
            use_cuda_graph=True,
            qo_indptr=self.cuda_graph_qo_indptr[: n + 1],
            kv_indptr=self.cuda_graph_kv_indptr[: n + 1],
            kv_indices=self.cuda_graph_kv_indices,
            kv_len_arr=self.cuda_graph_kv_lens[:n],
            backend="auto",
        )

    def _prepare_cuda_graph_metadata(self, bs: int, num_tokens: int, mode: ForwardMode):
        """Create, bind and register the wrapper this graph captures (the 'B' of Pattern B)."""
        decode = mode.is_decode_or_idle()
        wrapper = self._create_wrapper(num_tokens if decode else bs)
        (self.decode_cuda_graph_metadata if decode else self.prefill_cuda_graph_metadata)[bs] = wrapper
        self.forward_metadata = wrapper
        return wrapper

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
    ) -> None:
        self.check_graph_mode(forward_mode)
        seq_cpu = seq_lens[:bs].cpu()  # capture may sync; steady state may not
        wrapper = self._prepare_cuda_graph_metadata(bs, num_tokens, forward_mode)
        self.init_forward_metadata_replay_cuda_graph(
            bs, req_pool_indices, seq_lens, None, encoder_lens, forward_mode, spec_info, seq_cpu
        )
        install_fast_mla_decode_plan(wrapper)  # the first (full) plan set _cached_module; every mode, refimpl's

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
    ) -> None:
        if seq_lens_cpu is None:
            raise ValueError(f"{self.name}: a replay plans from seq_lens_cpu (host)")
        self._host_phase(bs, seq_lens_cpu, forward_mode, spec_info)
        self._device_phase(bs, req_pool_indices, seq_lens, forward_mode, spec_info)

    def _host_phase(self, bs, seq_lens_cpu, mode, spec_info) -> None:
        if mode.is_decode_or_idle():
            self._decode_host(bs, seq_lens_cpu, spec_info)
        elif mode.is_target_verify() or mode.is_any_draft_extend():
            self._prefill_host(
                self.prefill_cuda_graph_metadata[bs],
                self._prefill_args(bs, seq_lens_cpu, mode, spec_info),
                self.cuda_graph_kv_indices,
            )
        else:
            raise GraphModeNotSupported(f"{self.name}: {mode.label} is not captured")

    def _device_phase(self, bs, rpi, seq_lens, mode, spec_info) -> None:
        if mode.is_decode_or_idle():
            self._decode_device(bs, rpi, seq_lens, spec_info)
        else:  # (n: the graph's rows per request, a Python int fixed by the spec config)
            self._prefill_device(
                bs, rpi, seq_lens, self.prefill_cuda_graph_metadata[bs], mode, layout.rows_per_request(mode, self.spec)
            )

    def splits_hook(self, mode: ForwardMode) -> bool:
        return (
            type(self).init_forward_metadata_replay_cuda_graph is FlashInferMLAAttnBackend.init_forward_metadata_replay_cuda_graph
        )

    def prepare_host_metadata(self, fb: ForwardBatch) -> None:
        self._host_phase(fb.batch_size, fb.seq_lens_cpu, fb.forward_mode, fb.spec_info)

    def apply_device_metadata(self, fb: ForwardBatch) -> None:
        self._device_phase(fb.batch_size, fb.req_pool_indices, fb.seq_lens, fb.forward_mode, fb.spec_info)

    # --- checker support ----------------------------------------------------------------------
    def graph_state(self, bs: int, mode: ForwardMode) -> dict[str, Any]:
        """The wrapper's bound buffers, live parts: what any consumer of them would read."""
        kv_indptr = self.cuda_graph_kv_indptr[: bs + 1]  # decode: one query per request; prefill: bound at [:bs+1]
        return {
            "qo_indptr": self.cuda_graph_qo_indptr[: bs + 1],
            "kv_indptr": kv_indptr,
            "kv_len_arr": self.cuda_graph_kv_lens[:bs],
            "kv_indices": self.cuda_graph_kv_indices[: int(kv_indptr[-1])],
        }

    def reference_graph_state(self, fb: ForwardBatch) -> dict[str, Any] | None:
        """What the wrapper's bound buffers must hold, from the batch alone (a multi-step step's: its wrapper's)."""
        return None if fb.kind.multi_step else csr_reference(self, fb)  # kv_len_arr: verify's prefix + the N drafts

    def draft_step_reference(self, indptr: torch.Tensor, indices: torch.Tensor, fb) -> dict:
        """A multi-step step's bound buffers, given its rows' reference indptr and indices."""
        return {"qo_indptr": torch.arange(len(indptr)), "kv_indptr": indptr, "kv_len_arr": indptr.diff(), "kv_indices": indices}

    # --- the captured step --------------------------------------------------------------------
    def forward(self, q, k, v, layer: int, fb: ForwardBatch) -> torch.Tensor:
        cache = self.world.kv_cache
        cache.set_kv(layer, fb.out_cache_loc[: q.shape[0]], k)
        if q.shape[0] == 0:
            return q.new_empty(0, self.cfg.num_heads, self.cfg.kv_lora_rank)
        return self._attend(q, cache.kv[layer], fb)

    def _attend(self, q: torch.Tensor, kv: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """Absorbed MLA of ``q`` over this layer's latent cache ``kv`` ``[slots, 1, 576]``, the cache written."""
        r = self.cfg.kv_lora_rank
        return fi_mla_run(self.forward_metadata, q[..., :r], q[..., r:], kv[..., :r], kv[..., r:])


class FlashInferMLAMultiStepDraftBackend(MultiStepDraftBackend):
    """Multi-step draft decode (upstream's ``FlashInferMLAMultiStepDraftBackend``): chains only, as upstream's (it
    raises for topk > 1); each step re-plans its bound decode wrapper with the fast MLA plan over the step's own
    lengths, prefix + i + 1, from the host, and keeps its bound indptr current."""

    step_cls = FlashInferMLAAttnBackend
    share_splits, chains_only = False, True


class FlashInferMLAAttnBackendAsUpstream(FlashInferMLAAttnBackend):
    """As #26665 left it: two bodies with the verify / draft-extend branches merged, and decode replay writing the eager
    kv_indptr (#37975, open)."""

    variant = "as-upstream"
    pattern = "C, merged branches"
    writes_bound_kv_indptr = False

    def splits_hook(self, mode: ForwardMode) -> bool:
        return False  # the split is refimpl's (#39825 is open): upstream glues the hook whole or not at all

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
    ) -> None:
        self.check_graph_mode(forward_mode)
        seq_cpu = seq_lens[:bs].cpu()  # capture may sync
        if forward_mode.is_decode_or_idle():
            wrapper = self._create_wrapper(num_tokens)
            self._full_decode_plan(bs, req_pool_indices, seq_lens, seq_cpu, wrapper)
            self.decode_cuda_graph_metadata[bs] = wrapper
            install_fast_mla_decode_plan(wrapper)
        else:  # target verify and draft extend: one merged branch
            wrapper = self._create_wrapper(bs)
            self.prefill_cuda_graph_metadata[bs] = wrapper
            self._prefill_plan(bs, req_pool_indices, seq_lens, seq_cpu, wrapper, forward_mode, spec_info)
        self.forward_metadata = wrapper


class FlashInferMLAAttnBackendLegacy(FlashInferMLAAttnBackendAsUpstream):
    """Pattern C (before #26134): identical verify / draft-extend branches in capture and replay, wrappers built inline;
    decode replay asserts the host lengths, writes the eager kv_indptr (#37975)."""

    variant = "legacy"
    pattern = "C"

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
    ) -> None:
        self.check_graph_mode(forward_mode)
        seq_cpu = seq_lens[:bs].cpu()
        MLA = self.fi.BatchMLAPagedAttentionWrapper
        if forward_mode.is_decode_or_idle():
            wrapper = MLA(
                self.workspace,
                use_cuda_graph=True,
                qo_indptr=self.cuda_graph_qo_indptr[: num_tokens + 1],
                kv_indptr=self.cuda_graph_kv_indptr[: num_tokens + 1],
                kv_indices=self.cuda_graph_kv_indices,
                kv_len_arr=self.cuda_graph_kv_lens[:num_tokens],
                backend="auto",
            )
            self._full_decode_plan(bs, req_pool_indices, seq_lens, seq_cpu, wrapper)
            self.decode_cuda_graph_metadata[bs] = wrapper
            install_fast_mla_decode_plan(wrapper)
        elif forward_mode.is_target_verify():
            wrapper = MLA(
                self.workspace,
                use_cuda_graph=True,
                qo_indptr=self.cuda_graph_qo_indptr[: bs + 1],
                kv_indptr=self.cuda_graph_kv_indptr[: bs + 1],
                kv_indices=self.cuda_graph_kv_indices,
                kv_len_arr=self.cuda_graph_kv_lens[:bs],
                backend="auto",
            )
            self.prefill_cuda_graph_metadata[bs] = wrapper
            self._prefill_plan(bs, req_pool_indices, seq_lens, seq_cpu, wrapper, forward_mode, spec_info)
        elif forward_mode.is_any_draft_extend():
            wrapper = MLA(
                self.workspace,
                use_cuda_graph=True,
                qo_indptr=self.cuda_graph_qo_indptr[: bs + 1],
                kv_indptr=self.cuda_graph_kv_indptr[: bs + 1],
                kv_indices=self.cuda_graph_kv_indices,
                kv_len_arr=self.cuda_graph_kv_lens[:bs],
                backend="auto",
            )
            self.prefill_cuda_graph_metadata[bs] = wrapper
            self._prefill_plan(bs, req_pool_indices, seq_lens, seq_cpu, wrapper, forward_mode, spec_info)
        else:
            raise GraphModeNotSupported(f"{self.name}: {forward_mode.label} is not captured")
        self.forward_metadata = wrapper

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
    ) -> None:
        if forward_mode.is_decode_or_idle():
            assert seq_lens_cpu is not None
            self._fast_decode_replay(bs, req_pool_indices, seq_lens, seq_lens_cpu)
        elif forward_mode.is_target_verify():
            wrapper = self.prefill_cuda_graph_metadata[bs]
            self._prefill_plan(bs, req_pool_indices, seq_lens, seq_lens_cpu, wrapper, forward_mode, spec_info)
        elif forward_mode.is_any_draft_extend():
            wrapper = self.prefill_cuda_graph_metadata[bs]
            self._prefill_plan(bs, req_pool_indices, seq_lens, seq_lens_cpu, wrapper, forward_mode, spec_info)
        else:
            raise GraphModeNotSupported(f"{self.name}: {forward_mode.label} is not captured")
