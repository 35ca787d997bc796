"""SGLang's FlashInfer (MHA) backend: unified (Pattern B) and legacy (Pattern C).

Upstream: ``python/sglang/srt/layers/attention/flashinfer_backend.py`` (``FlashInferAttnBackend``); Pattern B since
#26134 / #26665; facts in ``[facts#flashinfer]``.

A wrapper built with ``use_cuda_graph=True`` is *bound* to buffers given at construction; ``plan`` copies indptr /
indices / mask into them and writes a host-computed work partition into the workspace; ``run`` reads only those, so
every replay must **re-plan** the captured wrapper (real flashinfer on a GPU, else the stand-ins of
``refimpl.flashinfer_wrappers``). Hence Pattern B's *prepare* step: capture creates, binds and registers the wrapper per
batch size; replay finds and re-plans it.

Static buffers (int32; T = max_num_tokens, L = max_context_len), bound as: ``kv_indptr [pool+1]`` (decode
``paged_kv_indptr_buffer[:T+1]``, prefill ``[:bs+1]``), ``kv_last_page_len`` (all ones, one per row of ``kv_indptr``), ``cuda_graph_kv_indices
[T*L]`` (``paged_kv_indices_buffer``), ``cuda_graph_qo_indptr [pool+1]`` (prefill ``qo_indptr_buf[:bs+1]``); only if the
spec has a mask, prefill ``custom_mask_buf`` = ``cuda_graph_custom_mask [T*L]`` (uint8) and ``mask_indptr_buf`` =
``cuda_graph_qk_indptr[:bs+1]``.

Decode re-plans with the fast plan (``flashinfer_wrappers.fast_plan``: host indptr from ``seq_lens_cpu``, no
device-to-host copy); prefill wrappers (verify, draft extend) with ``fast_prefill_plan`` in the unified shape (refimpl's:
SGLang re-plans them fully, as the legacy shape does). Verify indexes prefix + N drafts under the
tree mask; draft extend indexes ``seq_lens`` causally, rows at the graph's uniform stride (S+1 for v1, N for v2).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .. import layout
from ..batch import ForwardBatch, World
from ..config import SpecConfig
from ..flashinfer_wrappers import is_standin, make_workspace, wrapper_classes
from ..flashinfer_wrappers.fast_plan import fast_prefill_plan, install_fast_decode_plan, is_fast_plan_installed
from ..flashinfer_wrappers.ops import fi_run
from ..kernels import build_kv_indices, csr_ref
from ..modes import GRAPH_MODES, ForwardMode
from ..spec import DraftExtendInput, VerifyInput, require_spec, verify_n
from .base import PLANS, AttentionBackend, GraphModeNotSupported
from .multistep import MultiStepDraftBackend


def init_wrappers(backend: AttentionBackend, prefer_real: bool, kv_indptr_buf) -> None:
    """FlashInfer's wrapper classes (the real library on a GPU if ``prefer_real``, else the stand-ins), their shared float
    workspace, the per-bs registries of graph-bound wrappers and the eager ``kv_indptr`` (``kv_indptr_buf``: a multi-step
    step's row of its wrapper's indptr; else zeros, ``[pool + 1]``) (FlashInfer and FlashInfer-MLA)."""
    backend.fi = wrapper_classes(prefer_real and backend.device.type == "cuda", backend.cfg.dtype)
    backend.workspace = make_workspace(backend.device, real=backend.fi.real)
    backend.decode_cuda_graph_metadata, backend.prefill_cuda_graph_metadata = {}, {}  # bs -> wrapper(s)
    if kv_indptr_buf is None:
        kv_indptr_buf = torch.zeros(backend.world.req_to_token_pool.size + 1, dtype=torch.int32, device=backend.device)
    backend.kv_indptr = kv_indptr_buf


def write_kv(req_to_token, rpi, kv_lens, kv_indptr, kv_indices) -> None:
    """``kv_indptr[1:] = cumsum(kv_lens)``, then the kv indices of ``rpi``'s first ``len(kv_lens)`` rows (device data)."""
    kv_indptr[1:] = kv_lens.cumsum(0)
    build_kv_indices(req_to_token, rpi[: len(kv_lens)], kv_lens, kv_indptr, kv_indices)


def csr_reference(backend, fb: ForwardBatch) -> dict[str, torch.Tensor]:
    """The checker's view of a single-step batch, from the batch alone, in FlashInfer-MLA's names: the uniform
    ``qo_indptr``, the attended kv lengths ``kv_len_arr`` (host; verify: prefix + the N drafts) and their ``csr_ref``
    (``kv_indptr``, ``kv_indices``)."""
    rows = layout.rows_per_request(fb.forward_mode, backend.spec)  # verify: N
    kv = layout.attended_kv_lens(fb.forward_mode, fb.seq_lens_cpu, rows)
    qo_indptr = torch.arange(0, fb.batch_size * rows + 1, rows, device="cpu")
    return {"qo_indptr": qo_indptr, "kv_len_arr": kv, **csr_ref(backend.world.req_to_token, fb.req_pool_indices, kv)}


@dataclass
class DecodeMetadata:
    wrappers: list  # upstream's decode_wrappers: [BatchDecodeWithPagedKVCacheWrapper], bound per bs in a graph


@dataclass
class PrefillMetadata:
    wrappers: list  # upstream's prefill_wrappers: [BatchPrefillWithPagedKVCacheWrapper]
    causal: bool  # draft extend / extend: causal; target verify: the tree mask governs


def should_use_tensor_core(kv_dtype: torch.dtype, num_heads: int, num_kv_heads: int) -> bool:
    """SGLang's choice of decode kernel (``flashinfer_backend.py:should_use_tensor_core``, without its environment
    override): the tensor-core decode (flashinfer plans it with the prefill module) for an fp8 KV cache, or for fp16 /
    bf16 with 4 or more query heads per KV head; else the CUDA-core decode kernel."""
    fp8 = kv_dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    return fp8 or kv_dtype in (torch.float16, torch.bfloat16) and num_heads // num_kv_heads >= 4


class FlashInferAttnBackend(AttentionBackend):
    """Unified shape (POST-#26665): capture = ``_prepare_cuda_graph_metadata`` + replay body."""

    name = "flashinfer"
    variant = "unified"
    pattern = "B"
    graph_buffer_names = (
        "kv_indptr",
        "cuda_graph_kv_indices",
        "cuda_graph_custom_mask",
        "cuda_graph_qk_indptr",
        "cuda_graph_qo_indptr",
    )
    graph_modes = frozenset(GRAPH_MODES)  # every one: decode, idle, target verify, draft extend v1 / v2
    page_sizes = (1,)
    kv_indices_dtype = torch.int32
    fast_prefill_replan = True  # graph prefill wrappers re-plan from host indptrs after their first plan (SGLang: fully)

    def glue_refusal(self, mode: ForwardMode) -> str | None:
        return PLANS

    def __init__(self, world: World, spec: SpecConfig | None = None, *, kv_indptr_buf=None, skip_prefill=False, prefer_real=True):
        super().__init__(world, spec)
        init_wrappers(self, prefer_real, kv_indptr_buf)
        dev, cfg = self.device, self.cfg
        self.skip_prefill = skip_prefill
        # rows the wrappers may plan: requests, or a multi-step step's bs * topk (its kv_indptr_buf: pool * topk + 1, as
        # upstream's multi-step wrapper sizes its kv_last_page_len [facts#flashinfer-buffers])
        self.kv_last_page_len = torch.ones(self.kv_indptr.numel() - 1, dtype=torch.int32, device=dev)
        self.kv_last_page_len_cpu = self.kv_last_page_len.to("cpu", copy=True)
        self._host_indptr = torch.zeros_like(self.kv_indptr, device="cpu")  # [0] stays 0: cumsums land in [1:]
        self._heads = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, 1)  # plan's heads, head dim, page size
        self.decode_use_tensor_cores = tc = should_use_tensor_core(cfg.dtype, cfg.num_heads, cfg.num_kv_heads)
        self._eager_decode = self.fi.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD", use_tensor_cores=tc)
        self._eager_prefill = self.fi.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")

    # --- the update paths (eager, capture and replay all use them) -----------------------------
    def _host_indptr_of(self, lens: torch.Tensor, reuse: bool = True) -> torch.Tensor:
        """``[0, cumsum(lens)]`` int32 on the host. ``reuse``: in one buffer shared by every fast plan (each reads it
        before returning; sized like ``kv_indptr``, so it holds any batch's rows, a multi-step row's bs * topk too); a
        full plan may keep what it is given (``x.to(device)`` on a CPU run), so it gets its own."""
        n = len(lens)
        out = self._host_indptr[: n + 1] if reuse else lens.new_zeros(n + 1, dtype=torch.int32)
        torch.cumsum(lens, 0, dtype=torch.int32, out=out[1:])
        return out

    # each update has a device part (the kv indices, from device tensors: ``write_kv``) and a host part (the plan, from
    # host lengths), sharing ``kv``, the device tensors: eager and the legacy hooks run device, then host
    # (``_update_*``); the unified hooks host, then device (``init_forward_metadata_replay_cuda_graph``)
    def _decode_kv(self, bs, wrapper, spec_info, host_lens=None) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """Decode's device ``(kv_indptr, kv_indices, ours)``: a multi-step step's own (written by its step kernel: not
        ours), else ``kv_indptr[:bs+1]`` and the bound indices (a graph wrapper) or fresh ones of ``sum(host_lens)``."""
        if spec_info is not None and spec_info.kv_indptr is not None:
            return spec_info.kv_indptr, spec_info.kv_indices, False
        if wrapper.is_cuda_graph_enabled:  # the Triton kernel writes the bound buffer itself
            kv_indices = wrapper._paged_kv_indices_buf
        else:
            kv_indices = torch.empty(max(int(host_lens.sum()), 1), dtype=torch.int32, device=self.device)
        return self.kv_indptr[: bs + 1], kv_indices, True

    def _write_decode(self, bs, rpi, seq_lens, wrapper, mode, spec_info, kv=None) -> None:
        kv_indptr, kv_indices, ours = kv or self._decode_kv(bs, wrapper, spec_info)
        if ours:
            write_kv(self.world.req_to_token, rpi, seq_lens[:bs], kv_indptr, kv_indices)

    def _plan_decode(self, bs, seq_lens_cpu, wrapper, mode, spec_info, kv=None) -> None:
        kv_indptr, kv_indices, ours = kv or self._decode_kv(bs, wrapper, spec_info)
        host_lens = seq_lens_cpu[:bs]
        if not ours:  # a multi-step step's rows (its own indptr): bs * topk
            host_lens = layout.draft_step_kv_lens(host_lens, spec_info.extra["step"], spec_info.topk)
        kw = dict(data_type=self.cfg.dtype, q_data_type=self.cfg.dtype, sm_scale=self.cfg.sm_scale, non_blocking=True)
        if is_fast_plan_installed(wrapper):  # the fast plan takes the host indptr (no device-to-host copy); a full plan
            kw["global_override_indptr_cpu"] = self._host_indptr_of(host_lens)  # reads the device one
        wrapper.plan(kv_indptr, kv_indices, self.kv_last_page_len[: len(host_lens)], *self._heads, **kw)

    def _update_decode(self, bs, rpi, seq_lens, seq_lens_cpu, wrappers, spec_info) -> None:
        kv = self._decode_kv(bs, wrappers[0], spec_info, seq_lens_cpu[:bs])
        self._write_decode(bs, rpi, seq_lens, wrappers[0], None, spec_info, kv)
        self._plan_decode(bs, seq_lens_cpu, wrappers[0], None, spec_info, kv)

    def _prefill_rows(self, mode, spec_info) -> tuple[Any, int]:
        """Verify's / draft extend's spec input and rows per request (verify: N drafts over prefix + N keys)."""
        verify = mode.is_target_verify()
        spec = require_spec(mode, spec_info, VerifyInput if verify else DraftExtendInput)
        return spec, verify_n(spec, self.spec) if verify else layout.rows_per_request(mode, self.spec)

    def _prefill_kv(self, bs, wrapper, total: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """The device ``(kv_indptr, kv_indices)``: a graph wrapper's bound buffers, else fresh ones (``total`` indices)."""
        if wrapper.is_cuda_graph_enabled:  # the Triton kernel writes the bound buffers itself
            return wrapper._paged_kv_indptr_buf[: bs + 1], wrapper._paged_kv_indices_buf
        return torch.zeros(bs + 1, dtype=torch.int32, device=self.device), torch.empty(
            total, dtype=torch.int32, device=self.device
        )

    def _write_prefill(self, bs, rpi, seq_lens, wrapper, mode, spec_info, kv=None) -> None:
        kv_lens = layout.attended_kv_lens(mode, seq_lens[:bs], self._prefill_rows(mode, spec_info)[1])
        write_kv(self.world.req_to_token, rpi, kv_lens, *(kv or self._prefill_kv(bs, wrapper)))

    def _plan_prefill(self, bs, seq_lens_cpu, wrapper, mode, spec_info, kv=None) -> None:
        """Verify and draft extend. A graph wrapper planned once re-plans with ``fast_prefill_plan`` (unified): host
        indptrs, the mask packed on the device, nothing read back. Otherwise a full ``plan``: without a mask it gets host
        indptrs (SGLang passes device ones, a sync each: [facts#where-refimpl-deliberately-differs-from-upstream]); with
        one they stay on the device, where it packs the mask (the spec mask covers the live requests; padded ones get
        allow-all blocks)."""
        (spec, n), (kv_indptr, kv_indices) = self._prefill_rows(mode, spec_info), kv or self._prefill_kv(bs, wrapper)
        kv_lens_cpu = layout.attended_kv_lens(mode, seq_lens_cpu[:bs], n)  # host
        fast = self.fast_prefill_replan and wrapper.is_cuda_graph_enabled and wrapper._cached_module is not None
        kv_indptr_cpu = self._host_indptr_of(kv_lens_cpu, reuse=fast)
        mask = spec.custom_mask if mode.is_target_verify() else None
        if mask is not None:
            ends = layout.mask_indptr(seq_lens_cpu[:bs], n).tolist()  # host values: [0, cumsum(N * (seq + N))]
            if mask.numel() not in ends:
                raise ValueError(
                    f"tree mask has {mask.numel()} entries; N*(seq_len+N) summed over the first k requests gives one of {ends}"
                )
            if missing := ends[-1] - mask.numel():
                mask = torch.cat([mask, mask.new_ones(missing)])
        host = mask is None or fast  # host indptrs: plan reads nothing back from the device
        qo_indptr = torch.arange(0, (bs + 1) * n, n, dtype=torch.int32, device="cpu" if host else self.device)
        kw = dict(custom_mask=mask, causal=mask is None, q_data_type=self.cfg.dtype)
        if fast:  # the kv buffers are written
            fast_prefill_plan(wrapper, qo_indptr, kv_indptr_cpu, kv_lens_cpu, *self._heads, **kw)
        else:  # plan copies only the live part of kv_indices
            last_page_len = (self.kv_last_page_len_cpu if host else self.kv_last_page_len)[:bs]
            kw.update(sm_scale=self.cfg.sm_scale, kv_data_type=self.cfg.dtype, non_blocking=True)
            total = max(int(kv_indptr_cpu[-1]), 1)
            wrapper.plan(qo_indptr, kv_indptr_cpu if host else kv_indptr, kv_indices[:total], last_page_len, *self._heads, **kw)

    def _update_prefill(self, bs, rpi, seq_lens, seq_lens_cpu, wrappers, mode, spec_info) -> None:
        wrapper, n = wrappers[0], self._prefill_rows(mode, spec_info)[1]
        kv = self._prefill_kv(bs, wrapper, max(int(layout.attended_kv_lens(mode, seq_lens_cpu[:bs], n).sum()), 1))
        self._write_prefill(bs, rpi, seq_lens, wrapper, mode, spec_info, kv)
        self._plan_prefill(bs, seq_lens_cpu, wrapper, mode, spec_info, kv)

    # --- eager --------------------------------------------------------------------------------
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        mode, args = fb.forward_mode, (fb.batch_size, fb.req_pool_indices, fb.seq_lens, fb.seq_lens_cpu)
        if mode.is_decode_or_idle():
            if fb.batch_size:  # an empty (idle) batch plans nothing: flashinfer 0.7.2 refuses it, forward runs no kernel
                self._update_decode(*args, [self._eager_decode], fb.spec_info)
            self.forward_metadata = DecodeMetadata([self._eager_decode])
        elif mode.is_target_verify() or mode.is_any_draft_extend():
            self._update_prefill(*args, [self._eager_prefill], mode, fb.spec_info)
            self.forward_metadata = PrefillMetadata([self._eager_prefill], not mode.is_target_verify())
        else:
            raise ValueError(f"{self.name}: eager {mode.label} is not modelled here")

    # --- graphs -------------------------------------------------------------------------------
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, kv_indices_buf=None, num_kv_splits_buf=None):
        n, dev = max_num_tokens * self.world.max_context_len, self.device  # T * L
        self.max_bs, self.max_num_tokens = max_bs, max_num_tokens
        self.cuda_graph_kv_indices = torch.zeros(n, dtype=torch.int32, device=dev) if kv_indices_buf is None else kv_indices_buf
        if not self.skip_prefill:
            self.cuda_graph_custom_mask = torch.zeros(n, dtype=torch.uint8, device=dev)
            self.cuda_graph_qk_indptr = torch.zeros_like(self.kv_indptr)
            self.cuda_graph_qo_indptr = torch.zeros_like(self.kv_indptr)

    def _create_decode_wrappers(self, bs: int, num_tokens: int) -> list:
        return [
            self.fi.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace,
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=self.decode_use_tensor_cores,
                paged_kv_indptr_buffer=self.kv_indptr[: num_tokens + 1],
                paged_kv_indices_buffer=self.cuda_graph_kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:num_tokens],
            )
        ]

    def _create_prefill_wrappers(self, bs: int, use_custom_mask: bool) -> list:
        return [
            self.fi.BatchPrefillWithPagedKVCacheWrapper(
                self.workspace,
                "NHD",
                use_cuda_graph=True,
                qo_indptr_buf=self.cuda_graph_qo_indptr[: bs + 1],
                paged_kv_indptr_buf=self.kv_indptr[: bs + 1],
                paged_kv_indices_buf=self.cuda_graph_kv_indices,
                paged_kv_last_page_len_buf=self.kv_last_page_len[:bs],
                # a zero mask buffer would block all attention: bind it only for a mask
                custom_mask_buf=self.cuda_graph_custom_mask if use_custom_mask else None,
                mask_indptr_buf=self.cuda_graph_qk_indptr[: bs + 1] if use_custom_mask else None,
            )
        ]

    def _prepare_cuda_graph_metadata(self, bs, num_tokens, mode, spec_info) -> None:
        """Create, bind and register the wrappers this graph will capture (the 'B' in Pattern B)."""
        if mode.is_decode_or_idle():
            wrappers = self._create_decode_wrappers(bs, num_tokens)
            self.decode_cuda_graph_metadata[bs] = wrappers
            self.forward_metadata = DecodeMetadata(wrappers)
        else:  # target verify, draft extend (check_graph_mode let nothing else in)
            use_mask = mode.is_target_verify() and getattr(spec_info, "custom_mask", None) is not None
            wrappers = self._create_prefill_wrappers(bs, use_mask)
            self.prefill_cuda_graph_metadata[bs] = wrappers
            self.forward_metadata = PrefillMetadata(wrappers, not mode.is_target_verify())

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
    ) -> None:
        self.check_graph_mode(forward_mode)
        seq_lens_cpu = seq_lens[:bs].cpu()  # capture may sync; steady state may not
        self._prepare_cuda_graph_metadata(bs, num_tokens, forward_mode, spec_info)
        wrapper, _, write = self._phases(bs, forward_mode)
        write(bs, req_pool_indices, seq_lens, wrapper, forward_mode, spec_info)  # the first plan, a full one, reads them
        self.init_forward_metadata_replay_cuda_graph(
            bs, req_pool_indices, seq_lens, None, encoder_lens, forward_mode, spec_info, seq_lens_cpu
        )
        if forward_mode.is_decode_or_idle():  # the first full plan set _cached_module: go fast now
            for w in self.decode_cuda_graph_metadata[bs]:
                install_fast_decode_plan(w)

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
    ) -> None:
        wrapper, plan, write = self._phases(bs, forward_mode)
        plan(bs, seq_lens_cpu, wrapper, forward_mode, spec_info)  # the host phase: re-plan the registered wrapper
        write(bs, req_pool_indices, seq_lens, wrapper, forward_mode, spec_info)  # the device phase: its bound buffers

    def _phases(self, bs: int, mode: ForwardMode) -> tuple[Any, Callable, Callable]:
        """``(wrapper, plan, write)`` of a ``bs`` graph in ``mode``: its registered wrapper, the host phase and the device
        phase (SGLang PR #39825's split, [facts#host-device-split]); verify and draft extend share one."""
        if mode.is_decode_or_idle():
            return self.decode_cuda_graph_metadata[bs][0], self._plan_decode, self._write_decode
        if mode.is_target_verify() or mode.is_any_draft_extend():
            return self.prefill_cuda_graph_metadata[bs][0], self._plan_prefill, self._write_prefill
        raise GraphModeNotSupported(f"{self.name}: {mode.label} is not captured")

    def splits_hook(self, mode: ForwardMode) -> bool:
        return type(self).init_forward_metadata_replay_cuda_graph is FlashInferAttnBackend.init_forward_metadata_replay_cuda_graph

    def prepare_host_metadata(self, fb: ForwardBatch) -> None:
        """The plan (a fast one: host lengths in, the bound buffers only named) and verify's tree mask packed."""
        wrapper, plan, _ = self._phases(fb.batch_size, fb.forward_mode)
        plan(fb.batch_size, fb.seq_lens_cpu, wrapper, fb.forward_mode, fb.spec_info)

    def apply_device_metadata(self, fb: ForwardBatch) -> None:
        """The kv indptr and indices into the bound buffers, from ``req_pool_indices`` and ``seq_lens``."""
        wrapper, _, write = self._phases(fb.batch_size, fb.forward_mode)
        write(fb.batch_size, fb.req_pool_indices, fb.seq_lens, wrapper, fb.forward_mode, fb.spec_info)

    # --- checker support ----------------------------------------------------------------------
    def graph_state(self, bs: int, mode: ForwardMode) -> dict[str, Any]:
        """The bound buffers' live parts (what ``run`` reads), per wrapper kind."""
        md = self.forward_metadata
        w = md.wrappers[0]
        indptr = w._paged_kv_indptr_buf
        state = {"paged_kv_indptr": indptr, "paged_kv_indices": w._paged_kv_indices_buf[: int(indptr[-1])]}
        if isinstance(md, PrefillMetadata):
            state.update(qo_indptr=w._qo_indptr_buf, causal=md.causal)
            if (mask := w._custom_mask_buf) is not None:
                state.update(mask_indptr=w._mask_indptr_buf, custom_mask=mask[: int(w._mask_indptr_buf[-1])])
        return state

    def reference_graph_state(self, fb: ForwardBatch) -> dict[str, Any] | None:
        """What the bound buffers must hold, from the batch alone (host lengths, ``csr_ref``); the mask only for the
        stand-ins (the real library packs it into bits)."""
        if fb.kind.multi_step:
            return None  # the multi-step wrapper gives the per-step reference
        mode, csr = fb.forward_mode, csr_reference(self, fb)
        ref = self.draft_step_reference(csr["kv_indptr"], csr["kv_indices"], fb)
        if mode.is_decode_or_idle():
            return ref
        ref.update(qo_indptr=csr["qo_indptr"], causal=not mode.is_target_verify())
        w, spec = self.forward_metadata.wrappers[0], fb.spec_info
        if w._custom_mask_buf is not None and is_standin(w):  # the live requests' blocks
            ref.update(
                mask_indptr=layout.mask_indptr(fb.seq_lens_cpu, spec.draft_token_num),
                custom_mask=spec.custom_mask.to(torch.uint8),
            )
        return ref

    def draft_step_reference(self, indptr: torch.Tensor, indices: torch.Tensor, fb) -> dict:
        return {"paged_kv_indptr": indptr, "paged_kv_indices": indices}

    # --- the captured step --------------------------------------------------------------------
    def forward(self, q, k, v, layer: int, fb: ForwardBatch) -> torch.Tensor:
        cache = self.world.kv_cache
        cache.set_kv(layer, fb.out_cache_loc[: q.shape[0]], k, v)
        if q.shape[0] == 0:
            return q.new_empty(0, self.cfg.num_heads, self.cfg.v_head_dim)
        return fi_run(self.forward_metadata.wrappers[0], q, cache.k[layer], cache.v[layer])  # one refimpl op per run


class FlashInferAttnBackendLegacy(FlashInferAttnBackend):
    """Pattern C (before #26134): capture builds and plans the wrappers inline, per mode; replay repeats the dispatch. The
    copies agree: #26134 removed duplication (~240 lines upstream), not a divergence."""

    variant = "legacy"
    pattern = "C"
    fast_prefill_replan = False  # every replay a full plan(), as upstream

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
    ) -> None:
        self.check_graph_mode(forward_mode)
        rpi, seq = req_pool_indices[:bs], seq_lens[:bs]
        seq_cpu = seq.cpu()  # "may add a little overhead in capture stage"
        Prefill = self.fi.BatchPrefillWithPagedKVCacheWrapper
        if forward_mode.is_decode_or_idle():
            wrappers = [
                self.fi.BatchDecodeWithPagedKVCacheWrapper(
                    self.workspace,
                    "NHD",
                    use_cuda_graph=True,
                    use_tensor_cores=self.decode_use_tensor_cores,
                    paged_kv_indptr_buffer=self.kv_indptr[: num_tokens + 1],
                    paged_kv_indices_buffer=self.cuda_graph_kv_indices,
                    paged_kv_last_page_len_buffer=self.kv_last_page_len[:num_tokens],
                )
            ]
            self._update_decode(bs, rpi, seq, seq_cpu, wrappers, spec_info)  # the real plan
            self.decode_cuda_graph_metadata[bs] = wrappers
            self.forward_metadata = DecodeMetadata(wrappers)
            for w in wrappers:
                install_fast_decode_plan(w)
        elif forward_mode.is_target_verify():
            use_mask = getattr(spec_info, "custom_mask", None) is not None
            wrappers = [
                Prefill(
                    self.workspace,
                    "NHD",
                    use_cuda_graph=True,
                    qo_indptr_buf=self.cuda_graph_qo_indptr[: bs + 1],
                    paged_kv_indptr_buf=self.kv_indptr[: bs + 1],
                    paged_kv_indices_buf=self.cuda_graph_kv_indices,
                    paged_kv_last_page_len_buf=self.kv_last_page_len[:bs],
                    custom_mask_buf=self.cuda_graph_custom_mask if use_mask else None,
                    mask_indptr_buf=self.cuda_graph_qk_indptr[: bs + 1] if use_mask else None,
                )
            ]
            self._update_prefill(bs, rpi, seq, seq_cpu, wrappers, forward_mode, spec_info)
            self.prefill_cuda_graph_metadata[bs] = wrappers
            self.forward_metadata = PrefillMetadata(wrappers, False)
        elif forward_mode.is_any_draft_extend():
            wrappers = [
                Prefill(
                    self.workspace,
                    "NHD",
                    use_cuda_graph=True,
                    qo_indptr_buf=self.cuda_graph_qo_indptr[: bs + 1],
                    paged_kv_indptr_buf=self.kv_indptr[: bs + 1],
                    paged_kv_indices_buf=self.cuda_graph_kv_indices,
                    paged_kv_last_page_len_buf=self.kv_last_page_len[:bs],
                )
            ]
            self._update_prefill(bs, rpi, seq, seq_cpu, wrappers, forward_mode, spec_info)
            self.prefill_cuda_graph_metadata[bs] = wrappers
            self.forward_metadata = PrefillMetadata(wrappers, True)
        else:
            raise GraphModeNotSupported(f"{self.name}: {forward_mode.label} is not captured")

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
    ) -> None:
        rpi, seq, seq_cpu = req_pool_indices[:bs], seq_lens[:bs], seq_lens_cpu[:bs]
        if forward_mode.is_decode_or_idle():
            self._update_decode(bs, rpi, seq, seq_cpu, self.decode_cuda_graph_metadata[bs], spec_info)
        elif forward_mode.is_target_verify():
            wrappers = self.prefill_cuda_graph_metadata[bs]
            self._update_prefill(bs, rpi, seq, seq_cpu, wrappers, forward_mode, spec_info)
        elif forward_mode.is_any_draft_extend():  # textually the same as the branch above
            wrappers = self.prefill_cuda_graph_metadata[bs]
            self._update_prefill(bs, rpi, seq, seq_cpu, wrappers, forward_mode, spec_info)
        else:
            raise GraphModeNotSupported(f"{self.name}: {forward_mode.label} is not captured")


class FlashInferMultiStepDraftBackend(MultiStepDraftBackend):
    """Each step backend re-plans its bound decode wrapper with the fast plan (host indptr)."""

    step_cls = FlashInferAttnBackend
    share_splits = False


class FlashInferMultiStepDraftBackendLegacy(FlashInferMultiStepDraftBackend):
    step_cls = FlashInferAttnBackendLegacy
