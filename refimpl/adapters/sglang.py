"""SGLang 0.5.23's own attention backends under refimpl's runner, checker, history and fuzz (issue 33's adapter).

``python -m refimpl check --sglang triton`` (``wave``, ``trtllm_mla``, ``flashinfer``, ``flashinfer_mla``) runs every
checker verdict on SGLang's ``TritonAttnBackend`` (``WaveAttnBackend``, ``TRTLLMMLABackend``, ``FlashInferAttnBackend``,
``FlashInferMLAAttnBackend``): its ``init_cuda_graph_state`` allocates the graph
buffers, its ``init_forward_metadata_out_graph(forward_batch, in_capture)`` fills them before capture and before every
replay, and the metadata it freezes at capture (views of those buffers) is what the captured step reads. What runs
inside the graph is refimpl's ``forward`` over that metadata (the same kernels' arguments: SGLang's attention kernels are
imported, never run), and the eager path, the graph state's shape and the reference are the refimpl shape's it is
mixed into. So a finding names SGLang's hook or buffer; a kernel difference could not show up.

SGLang is not a dependency: its 0.5.23 wheel (no dependencies) is unpacked under ``.sgl/0.5.23`` by
``scripts/fetch_sglang.sh`` (or ``REFIMPL_SGLANG`` names another root with ``site/`` and ``deps/``), and the packages
its import chain touches but its attention backends never use are stand-ins (``refimpl.adapters.sglang_stubs``). Its
model runner is a stand-in over a refimpl ``World`` (the pools as SGLang's model runner exposes them,
``model_runner``). Modes: what each 0.5.23 backend captures of decode, idle, target verify and draft extend v2 (0.5.23
has no draft extend v1; Wave and FlashInfer-MLA: no draft extend); the multi-step draft decode of every one but Wave
(0.5.23 has no Wave multi-step wrapper).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import os
import pkgutil
import sys
import types
from pathlib import Path

import torch

from ..backends.base import AttentionBackend
from ..backends.flashinfer import DecodeMetadata, FlashInferAttnBackend, FlashInferMultiStepDraftBackend, PrefillMetadata
from ..backends.flashinfer_mla import FlashInferMLAAttnBackend, FlashInferMLAMultiStepDraftBackend
from ..backends.multistep import MultiStepDraftBackend
from ..backends.triton import TritonAttnBackend, TritonMetadata, TritonMultiStepDraftBackend
from ..backends.trtllm_mla import (
    TRTLLMMLAAttnBackendSimplified,
    TRTLLMMLADecodeMetadata,
    TRTLLMMLAMultiStepDraftBackendSimplified,
)
from ..backends.wave import WaveAttnBackend
from ..modes import ForwardMode
from . import sglang_stubs

VERSION = "0.5.23"
ROOT = Path(os.environ.get("REFIMPL_SGLANG", Path(__file__).resolve().parents[2] / ".sgl" / VERSION))


# what 0.5.23's Triton and FlashInfer backends capture (0.5.23 has no draft extend v1)
_NO_DRAFT_EXTEND_V1 = frozenset({ForwardMode.DECODE, ForwardMode.IDLE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND_V2})


class SGLangNotFound(ImportError):
    """No unpacked SGLang 0.5.23 where ``REFIMPL_SGLANG`` (default ``.sgl/0.5.23``) points."""


def setup() -> None:
    """Put SGLang's unpacked wheel and its two real dependencies (msgspec, dill) on the path and install the stand-ins
    (on CUDA also the last-resort finder: SGLang imports GPU-only packages a CPU run never reaches)."""
    if "sglang" in sys.modules:
        return
    if not (ROOT / "site" / "sglang").is_dir():
        raise SGLangNotFound(
            f"SGLang {VERSION} not found at {ROOT}: run `bash scripts/fetch_sglang.sh` (network, a 39 MB wheel) or set "
            "REFIMPL_SGLANG to a folder holding site/sglang and deps/"
        )
    sys.path[:0] = [str(ROOT / "site"), str(ROOT / "deps")]
    real = {"tvm_ffi"} if importlib.util.find_spec("tvm_ffi") is not None else set()  # flashinfer's JIT loader's
    sglang_stubs.install(tuple(r for r in sglang_stubs.ROOTS if r not in real), fallback=torch.cuda.is_available())


setup()  # at import: a missing SGLang is one clear error where the class is loaded


@contextlib.contextmanager
def _on_cpu(device: torch.device):
    """On a CPU ``device`` (no pinned-memory allocator, no CUDA device), SGLang's device code runs as it would on a
    GPU: ``torch.zeros`` / ``torch.empty`` make a plain host tensor where it pins one (0.5.23's FlashInfer-MLA
    fast-plan host arrays) and a CPU one where it hardcodes ``device="cuda"`` (``flashinfer_mla_backend.py``:
    ``init_cuda_graph_state``, the decode plan's first ``kv_indices``; ``flashinfer_backend.py``:
    ``init_cuda_graph_state``); ``.to("cpu")`` / ``.cpu()`` copy, as from a GPU (on a CPU they return the tensor
    itself: FlashInfer-MLA's host mirror of its bound ``kv_indptr`` would be that buffer, and refreshing the mirror would
    refresh the buffer)."""
    made, moved = (torch.zeros, torch.empty), (torch.Tensor.to, torch.Tensor.cpu)

    def on_cpu(make):
        return lambda *a, pin_memory=False, device=None, **k: make(*a, device="cpu" if device == "cuda" else device, **k)

    def to(t, *a, **k):
        out = moved[0](t, *a, **k)
        return out.clone() if out is t and "cpu" in map(str, (*a, k.get("device"))) else out

    if device.type != "cpu":
        yield
        return
    torch.zeros, torch.empty = map(on_cpu, made)
    torch.Tensor.to, torch.Tensor.cpu = to, lambda t, *a, **k: moved[1](t, *a, **k).clone()
    try:
        yield
    finally:
        (torch.zeros, torch.empty), (torch.Tensor.to, torch.Tensor.cpu) = made, moved


class _Strict(types.SimpleNamespace):
    """Spec inputs holding only the fields given: reading another raises (SGLang's hook needs what the adapter does
    not pass), where ``getattr(x, name, None)`` still answers None, as on SGLang's own spec input classes."""

    def __getattr__(self, k):
        raise AttributeError(f"the SGLang adapter passes no spec_info.{k} (only {', '.join(vars(self))})")


class _Config(types.SimpleNamespace):
    """A config whose unknown fields read as None (what the tiny model does not set)."""

    def __getattr__(self, k):
        if k.startswith("__"):
            raise AttributeError(k)
        return None


def model_runner(world, spec, attention_backend: str = "triton"):
    """What SGLang's backend constructors read of their model runner, over ``world`` (MHA or MLA); publishes a
    dummy-model ``ServerArgs`` first (0.5.23 reads process-wide config through ``sglang.srt.runtime_context``)."""
    from sglang.srt import runtime_context
    from sglang.srt.configs.model_config import AttentionArch
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
    from sglang.srt.server_args import ServerArgs

    cfg, dev, P = world.cfg, world.device.type, world.page_size
    kw = {}
    if spec is not None:
        kw = dict(speculative_algorithm="EAGLE", speculative_num_steps=spec.num_steps, speculative_eagle_topk=spec.topk)
        kw["speculative_num_draft_tokens"] = spec.num_draft_tokens
    server_args = ServerArgs(model_path="dummy", device=dev, attention_backend=attention_backend, page_size=P, **kw)
    runtime_context.publish(server_args, role="test")
    runtime_context.get_parallel().override_permanently(tp_rank=0)  # one process, no groups
    model_config = _Config(
        attention_arch=AttentionArch.MLA if cfg.is_mla else AttentionArch.MHA,
        get_max_num_attention_heads=lambda: cfg.num_heads,
        get_num_kv_heads=lambda *a: 1 if cfg.is_mla else cfg.num_kv_heads,
        context_len=world.max_context_len,
        head_dim=cfg.kv_row_width if cfg.is_mla else cfg.head_dim,
        v_head_dim=cfg.v_head_dim,
        is_encoder_decoder=False,
        hf_config=_Config(get_text_config=lambda: _Config()),
        num_attention_heads=cfg.num_heads,
        scaling=cfg.sm_scale,
    )
    if cfg.is_mla:  # one latent row per token: 512 + 64
        for f in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim"):
            setattr(model_config, f, getattr(cfg, f))
        k = v = world.kv_cache.kv
    else:
        k, v = world.kv_cache.k, world.kv_cache.v
    kv = _Config(
        get_v_head_dim=lambda: cfg.v_head_dim, start_layer=0, get_key_buffer=lambda i: k[i], get_value_buffer=lambda i: v[i]
    )
    translator = KVIndexTranslator(
        req_to_token=world.req_to_token, token_to_kv_pool_allocator=None, token_to_kv_pool=kv, page_size=P, device=dev
    )
    algo = types.SimpleNamespace(is_dspark=lambda: False, is_none=lambda: spec is None, is_eagle=lambda: spec is not None)
    return types.SimpleNamespace(
        req_to_token_pool=types.SimpleNamespace(size=world.req_to_token_pool.size, req_to_token=world.req_to_token),
        token_to_kv_pool=kv,
        token_to_kv_pool_allocator=None,
        page_size=P,
        kv_index_translator=translator,
        decode_num_tokens_per_req=lambda: 1 if spec is None else spec.num_draft_tokens,
        model_config=model_config,
        device=dev,
        gpu_id=world.device.index or 0,
        sliding_window_size=None,
        is_draft_worker=False,
        spec_algorithm=algo,
        kv_cache_dtype=cfg.dtype,
        dtype=cfg.dtype,
        max_running_requests=world.req_to_token_pool.size,
        server_args=server_args,
    )


class _SGLang:
    """The adapter, mixed into the refimpl shape whose ``forward``, eager path and reference it keeps: SGLang's class
    ``upstream`` (in ``sglang.srt.layers.attention``) owns the graph buffers and the metadata hook."""

    upstream = ""  # "module:Class" under sglang.srt.layers.attention
    attention_backend = ""  # ServerArgs.attention_backend
    variant = f"sglang-{VERSION}"
    adopted: tuple[str, ...] = ()  # the graph buffers SGLang's init_cuda_graph_state allocates (refimpl's names)
    in_wrapper = False  # a multi-step wrapper's step: SGLang's wrapper allocates its buffers
    init_forward_metadata_capture_cuda_graph = AttentionBackend.init_forward_metadata_capture_cuda_graph  # not in 0.5.23
    init_forward_metadata_replay_cuda_graph = AttentionBackend.init_forward_metadata_replay_cuda_graph

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        cls.graph_buffer_names = cls.adopted  # what the checker poisons and snapshots: SGLang's, none of refimpl's

    def __init__(self, world, spec=None, sglang=None, **kw):
        """``sglang``: SGLang's backend object to drive (a multi-step wrapper's step); default a new ``upstream``."""
        super().__init__(world, spec, **kw)
        self._stand_ins()
        if sglang is None:
            theirs = pkgutil.resolve_name(f"sglang.srt.layers.attention.{self.upstream}")
            with _on_cpu(world.device):
                sglang = theirs(self._model_runner(world, spec))
        self.sglang = sglang

    def _model_runner(self, world, spec):
        """The model runner SGLang's constructor reads (``model_runner``)."""
        return model_runner(world, spec, self.attention_backend)

    def _stand_ins(self) -> None:
        """What this backend's module needs beyond ``sglang_stubs.ROOTS`` (none)."""

    def init_cuda_graph_state(self, max_bs, max_num_tokens, *args) -> None:
        super().init_cuda_graph_state(max_bs, max_num_tokens)  # the sizes; its buffers are replaced by SGLang's
        if not self.in_wrapper:
            with _on_cpu(self.device):
                self.sglang.init_cuda_graph_state(max_bs, max_num_tokens, *args)
        for name in self.adopted:
            setattr(self, name, getattr(self.sglang, name))

    def init_forward_metadata_out_graph(self, fb, in_capture: bool = False) -> None:
        self.check_graph_mode(fb.forward_mode)
        with _on_cpu(self.device):
            self.sglang.init_forward_metadata_out_graph(self._their_batch(fb), in_capture)
        if in_capture:
            self._take_frozen(fb.batch_size)

    def _take_frozen(self, bs: int) -> None:
        """The metadata SGLang froze at capture, as refimpl's ``forward`` reads it (the same tensors)."""
        raise NotImplementedError

    def _their_batch(self, fb):
        """``fb`` as SGLang's own ``ForwardBatch`` (a field it reads that is not passed has upstream's default; a name
        it does not have raises), with its ``ForwardMode`` and spec inputs holding only the fields passed."""
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch
        from sglang.srt.model_executor.forward_batch_info import ForwardMode as Theirs

        mode, spec_info = fb.forward_mode, fb.spec_info
        if mode.is_target_verify():
            spec_info = _Strict(custom_mask=spec_info.custom_mask, num_tokens_per_req=self.spec.num_draft_tokens)
        elif mode.is_any_draft_extend():  # padded rows extend by N, as 0.5.23's draft-extend runner fills them
            ext = torch.full((fb.batch_size,), self.spec.num_draft_tokens, dtype=torch.int32, device=self.device)
            ext[: spec_info.extend_seq_lens.numel()] = spec_info.extend_seq_lens[: fb.batch_size]
            spec_info = _Strict(extend_seq_lens_tensor=ext, accept_length=spec_info.accept_length)
        elif fb.kind.multi_step:  # the wrapper sets each step's kv_indptr / kv_indices on it; no sliding window, no
            # ragged verify (SpecInput's class defaults)
            none = dict.fromkeys(("window_kv_indptr", "window_kv_indices", "ragged_verify_layout"))
            spec_info = _Strict(topk=self.spec.topk, is_draft_input=lambda: True, **none)
        return ForwardBatch(
            forward_mode=getattr(Theirs, mode.name),
            batch_size=fb.batch_size,
            input_ids=fb.input_ids,
            req_pool_indices=fb.req_pool_indices,
            seq_lens=fb.seq_lens,
            out_cache_loc=fb.out_cache_loc,
            seq_lens_sum=fb.seq_lens_sum,
            seq_lens_cpu=fb.seq_lens_cpu,
            positions=fb.positions,
            spec_info=spec_info,
        )


class _SGLangMultiStep:
    """SGLang's multi-step draft wrapper ``upstream``, mixed into the refimpl wrapper whose steps run ``forward``: SGLang's
    wrapper allocates the buffers and its hook (``_SGLang``'s, on the wrapper) fills every step's; refimpl's steps run
    over what SGLang's steps froze at capture. A ``step_cls`` that is an ``_SGLang`` adapter drives SGLang's step i (its
    buffers the wrapper's); otherwise (Triton) the wrapper hands refimpl's own steps SGLang's metadata."""

    attention_backend = ""  # ServerArgs.attention_backend
    init_forward_metadata_capture_cuda_graph = AttentionBackend.init_forward_metadata_capture_cuda_graph
    init_forward_metadata_replay_cuda_graph = AttentionBackend.init_forward_metadata_replay_cuda_graph
    init_forward_metadata_out_graph = _SGLang.init_forward_metadata_out_graph
    _their_batch = _SGLang._their_batch

    def __init__(self, world, spec=None):
        self.require_steps(spec)  # before SGLang reads it (its MLA wrappers raise on trees: refused by name first)
        adapter, self.device = self.step_cls, world.device  # (the stand-ins read the device)
        drives = issubclass(adapter, _SGLang)
        if drives:
            adapter._stand_ins(self)
        theirs = pkgutil.resolve_name(f"sglang.srt.layers.attention.{self.upstream}")
        runner = (adapter if drives else _SGLang)._model_runner(self, world, spec)
        with _on_cpu(world.device):
            self.sglang = theirs(runner, spec.topk, spec.num_steps)
        if drives:
            steps = iter(self.sglang.attn_backends)

            def step(world, spec, **kw):  # refimpl's next step, driving SGLang's
                return adapter(world, spec, sglang=next(steps), **kw)

            self.step_cls = step
        super().__init__(world, spec)
        if isinstance(self, MultiStepDraftBackend):  # its launch fills SGLang's rows: refimpl's read them
            self.kv_indptr = self.sglang.kv_indptr

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        with _on_cpu(self.device):
            self.sglang.init_cuda_graph_state(max_bs, max_num_tokens)  # every step's; the steps' kv_indices rows its own
        super().init_cuda_graph_state(max_bs, max_num_tokens)  # refimpl's sizes; driving steps adopt SGLang's buffers
        if isinstance(self, MultiStepDraftBackend):
            self.cuda_graph_kv_indices = self.sglang.cuda_graph_kv_indices

    def _take_frozen(self, bs: int) -> None:
        for b in self.step_backends:
            b._take_frozen(bs)


class _SGLangTriton(_SGLang):
    """Triton's and Wave's: SGLang's ``kv_indptr`` / ``qo_indptr`` / ``mask_indptr`` (allocated in ``__init__``, the eager
    path's too) are the ones refimpl's kernels read; its tree-mask buffer joins the adopted ones."""

    attention_backend = "triton"
    adopted = ("cuda_graph_attn_logits", "cuda_graph_attn_lse", "cuda_graph_num_kv_splits", "cuda_graph_kv_indices")

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        # not the three indptrs: SGLang's hooks never write kv_indptr[0]; poisoned (the checker's probe of what a hook
        # writes), its index kernel stores out of bounds, which the Triton interpreter answers with a segfault, not an
        # error (a poisoned mask_indptr[0] breaks refimpl's extend kernel)
        cls.graph_buffer_names = (*cls.adopted, "cuda_graph_custom_mask")

    def __init__(self, world, spec=None, **kw):
        super().__init__(world, spec, **kw)
        theirs = self.sglang
        _sync_splits(self, theirs)
        self.kv_indptr, self.qo_indptr, self.mask_indptr = theirs.kv_indptr, theirs.qo_indptr, theirs.mask_indptr

    def init_cuda_graph_state(self, max_bs, max_num_tokens, *args) -> None:
        super().init_cuda_graph_state(max_bs, max_num_tokens)
        mask = getattr(self.sglang, "_verify_mask", None)  # Triton's tree-mask scratch; Wave's own buffer
        self.cuda_graph_custom_mask = mask.buffer if mask is not None else getattr(self.sglang, "cuda_graph_custom_mask", None)

    def _take_frozen(self, bs: int) -> None:
        self.forward_metadata = _triton_metadata(self.sglang.forward_metadata)


def _sync_splits(ours, theirs) -> None:
    """One split heuristic on both sides: refimpl's constants taken from SGLang's Triton / Wave backend (on a CPU, SGLang
    sees no cores and would fill ``max_kv_splits``: it gets refimpl's 8); its static or tiled settings refused."""
    tile = getattr(theirs, "split_tile_size", None)  # Triton's deterministic mode (Wave has none)
    if theirs.static_kv_splits or tile is not None:  # its environment or its deterministic mode
        raise ValueError(
            f"SGLang's split settings (static_kv_splits={theirs.static_kv_splits}, split_tile_size={tile}) are not "
            "the default heuristic refimpl's eager path and reference implement"
        )
    if ours.device.type == "cpu":
        theirs.device_core_count = ours.core_count
    ours.max_kv_splits, ours.core_count = theirs.max_kv_splits, theirs.device_core_count


def _triton_metadata(md, **given) -> TritonMetadata:
    """SGLang's Triton metadata (the tensors it froze) as refimpl's kernels take it; ``given`` replaces fields."""
    return TritonMetadata(**{f.name: getattr(md, f.name) for f in dataclasses.fields(TritonMetadata)} | given)


class SGLangTritonAttnBackend(_SGLangTriton, TritonAttnBackend):
    """SGLang 0.5.23's ``TritonAttnBackend`` (``triton_backend.py``): decode, idle, target verify, draft extend v2; its
    multi-step draft wrapper below."""

    upstream = "triton_backend:TritonAttnBackend"
    multi_step_class = "refimpl.adapters.sglang:SGLangTritonMultiStepDraftBackend"
    graph_modes = _NO_DRAFT_EXTEND_V1


_PADDED_DRAFT_ROWS = (  # the multi-step wrappers' shared index launch (Triton's, FlashInfer's)
    "padded requests only: 0.5.23 sums positions, which its draft runner pads with 0, for kv_indptr and seq_lens, padded "
    "with 1, for kv_indices (cache_locs.py line 310; eagle_draft_cuda_graph_runner.py lines 592-594)"
)


class SGLangTritonMultiStepDraftBackend(_SGLangMultiStep, TritonMultiStepDraftBackend):
    """SGLang 0.5.23's ``TritonMultiStepDraftBackend`` (``triton_backend.py``), multi-step draft decode: its wrapper
    allocates every step's ``kv_indptr`` / ``kv_indices`` rows and the shared split buffer, fills them in one launch of
    ``generate_draft_decode_kv_indices`` (the indptr from the batch's ``positions``, the indices from ``seq_lens``) and
    computes the split counts once per replay; at capture each of its step backends freezes its metadata. refimpl's
    unified Triton steps run ``forward`` over that metadata and give the eager path and the reference. A step's frozen
    ``kv_indices`` is a view sized by the capture batch's ``seq_lens_sum``; its kernel reads by pointer past that view,
    so refimpl's steps read (and the checker compares) the step's whole row, what the captured kernel reads."""

    upstream, attention_backend = "triton_backend:TritonMultiStepDraftBackend", "triton"
    graph_buffer_names = ("cuda_graph_kv_indices", "cuda_graph_num_kv_splits")  # not the indptr: as _SGLangTriton
    upstream_findings = {  # what 0.5.23's own wrapper does that these findings show (docs/reference.md has the why)
        r"^step\d+\.num_kv_splits: .*capture vs replay": "0.5.23 computes split counts on replay only, "
        "triton_backend.py lines 787 and 2827",
        r"^reference: step\d+\.kv_ind": _PADDED_DRAFT_ROWS,
    }

    def __init__(self, world, spec=None):
        super().__init__(world, spec)
        for ours, theirs in zip(self.step_backends, self.sglang.attn_backends):
            _sync_splits(ours, theirs)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        super().init_cuda_graph_state(max_bs, max_num_tokens)
        theirs = self.sglang
        self.cuda_graph_num_kv_splits = theirs.cuda_graph_num_kv_splits
        for ours, step in zip(self.step_backends, theirs.attn_backends):
            for name in _SGLangTriton.adopted:
                setattr(ours, name, getattr(step, name))

    def _take_frozen(self, bs: int) -> None:
        for i, (ours, step) in enumerate(zip(self.step_backends, self.sglang.attn_backends)):
            ours.forward_metadata = _triton_metadata(step.forward_metadata, kv_indices=self.cuda_graph_kv_indices[i])


class SGLangWaveAttnBackend(_SGLangTriton, WaveAttnBackend):
    """SGLang 0.5.23's ``WaveAttnBackend`` (``wave_backend.py``; AMD's wave_lang kernels, stand-ins here): decode, idle,
    target verify. Its verify mask buffer is ``max_bs * max_context_len`` (``init_cuda_graph_state``, line 375), while a
    verify batch's tree mask holds ``sum N * (seq_len + N)`` entries: ``_apply_cuda_graph_metadata`` (line 471) fails
    with a size mismatch once they exceed it. That is an upstream bug (open PR sgl-project/sglang#29581 sizes the buffer
    for the mask and notes that Wave is not yet wired into the speculative draft-backend factory; merged #32920 fixed
    Triton's), named here before the copy instead of a size-mismatch error from inside SGLang."""

    upstream = "wave_backend:WaveAttnBackend"

    def _stand_ins(self) -> None:
        sglang_stubs.install(("wave_lang", "iree"))
        from sglang.srt.layers.attention.wave_ops import decode_attention

        # its split-KV scratch shapes, asked of wave_lang in init_cuda_graph_state: the Triton decode's
        decode_attention.decode_attention_intermediate_arrays_shapes = lambda bs, dv, h, s: ((bs, h, s, dv), (bs, h, s))

    def init_forward_metadata_out_graph(self, fb, in_capture: bool = False) -> None:
        mask = getattr(fb.spec_info, "custom_mask", None) if fb.forward_mode.is_target_verify() else None
        if mask is not None and mask.numel() > (room := self.sglang.cuda_graph_custom_mask.numel()):
            raise ValueError(
                f"upstream bug: SGLang {VERSION} wave_backend.py _apply_cuda_graph_metadata (line 471) copies this batch's "
                f"tree mask ({mask.numel()} entries) into cuda_graph_custom_mask, sized max_bs * max_context_len = {room} "
                "(init_cuda_graph_state, line 375): it does not fit (open PR sgl-project/sglang#29581)"
            )
        super().init_forward_metadata_out_graph(fb, in_capture)


class SGLangTRTLLMMLABackend(_SGLang, TRTLLMMLAAttnBackendSimplified):
    """SGLang 0.5.23's ``TRTLLMMLABackend`` (``trtllm_mla_backend.py``): decode, idle, target verify (chains), draft
    extend v2. Page 64; refimpl's Triton stand-in for FlashInfer's ``trtllm_batch_decode_with_kv_cache_mla`` runs in the
    graph (the real one needs SM100), over the metadata SGLang froze at capture; refimpl's #29077 shape (``simplified``,
    what 0.5.23 runs) gives the eager path and the reference. Beyond it, 0.5.23 keeps a static int32 ``seq_lens_k`` for
    plain decode and a ``global_seq_lens_k`` (= ``seq_lens_k``, for DCP) for target verify: both in the state compared."""

    upstream = "trtllm_mla_backend:TRTLLMMLABackend"
    attention_backend = "trtllm_mla"
    multi_step_class = "refimpl.adapters.sglang:SGLangTRTLLMMLAMultiStepDraftBackend"
    # its block table; the FlashInfer-MLA parent's buffers (its graph modes never read them)
    adopted = ("decode_cuda_graph_kv_indices", "cuda_graph_kv_indices", "cuda_graph_qo_indptr", "cuda_graph_kv_indptr")

    def _stand_ins(self) -> None:
        from sglang.srt.layers.attention import flashinfer_mla_backend
        from sglang.srt.layers.attention import trtllm_mla_backend as trt

        # FlashInfer's wrappers (the parent builds them; these modes never plan them), the zero-KV fix-up module it JIT-
        # compiles at construction, the multi-CTA scratch sized by the GPU's SM count, the fused KV-write kernel check
        flashinfer_mla_backend.BatchMLAPagedAttentionWrapper = sglang_stubs._Stub
        flashinfer_mla_backend.BatchPrefillWithRaggedKVCacheWrapper = sglang_stubs._Stub
        trt._jit_fixup_module = lambda *a, **k: None
        trt.make_persistent_multi_ctas_kv_counter_buffer = lambda device, *a, **k: torch.zeros(
            1, dtype=torch.uint8, device=device
        )
        trt.can_use_set_mla_kv_concat_q = lambda *a, **k: False

    def __init__(self, world, spec=None, **kw):
        super().__init__(world, spec, **kw)
        self.frozen = {}  # bs -> SGLang's metadata fields at capture

    def _take_frozen(self, bs: int) -> None:
        frozen = dict(vars(self.sglang.decode_cuda_graph_metadata[bs]))  # its fields as captured: tensors, the ints
        md = TRTLLMMLADecodeMetadata(**{f.name: frozen[f.name] for f in dataclasses.fields(TRTLLMMLADecodeMetadata)})
        self.decode_cuda_graph_metadata[bs] = self.forward_metadata = md
        self.captured_max_seq_len[bs], self.frozen[bs] = md.max_seq_len_k, frozen

    def graph_state(self, bs: int, mode: ForwardMode) -> dict:
        """Every field SGLang's per-bs metadata held at capture (what the graph reads; a replay that rebinds a field
        instead of writing into it leaves the captured tensor stale, and this shows it)."""
        state = {k: v for k, v in self.frozen[bs].items() if v is not None}
        return state | {"block_kv_indices": state["block_kv_indices"][:bs]}

    def reference_graph_state(self, fb) -> dict:
        ref, mode = super().reference_graph_state(fb), fb.forward_mode
        if mode.is_decode_or_idle() and self.draft_step is None:  # plain decode (a draft step's is refimpl's)
            ref["seq_lens_k"] = fb.seq_lens_cpu.to(torch.int32)
        elif mode.is_target_verify():
            ref["global_seq_lens_k"] = ref["seq_lens_k"]
        return ref


class _SGLangTRTLLMStep(SGLangTRTLLMMLABackend):
    """A step of SGLang's TRTLLM-MLA multi-step wrapper (its buffers are the wrapper's to allocate)."""

    in_wrapper = True


class SGLangTRTLLMMLAMultiStepDraftBackend(_SGLangMultiStep, TRTLLMMLAMultiStepDraftBackendSimplified):
    """SGLang 0.5.23's ``TRTLLMMLAMultiStepDraftBackend`` (``trtllm_mla_backend.py``, over
    ``FlashInferMLAMultiStepDraftBackend``), multi-step draft decode of chains: its wrapper builds S-1 ``TRTLLMMLABackend``
    steps and allocates their buffers (``init_cuda_graph_state``); capture runs the parent's ``common_template`` (one
    ``generate_draft_decode_kv_indices`` launch into rows no TRTLLM step reads) and each step's capture; replay calls each
    step's ``init_forward_metadata_out_graph`` on a DECODE view of the batch (lines 1797-1814). refimpl's steps
    (``SGLangTRTLLMMLABackend`` over SGLang's) run ``forward`` over what each froze and give the eager path and the
    reference: step i reads the prefix and the chain's i+1 drafts, ``seq_lens + i + 1``."""

    upstream, attention_backend = "trtllm_mla_backend:TRTLLMMLAMultiStepDraftBackend", "trtllm_mla"
    step_cls = _SGLangTRTLLMStep
    upstream_findings = {  # what 0.5.23's own steps do that these findings show (docs/reference.md has the why)
        r"^reference: step\d+\.(seq_lens_k|block_kv_indices)": "0.5.23's draft steps take the batch's seq_lens without "
        "the step's i+1 drafts: trtllm_mla_backend.py lines 639-642 (seq_lens_k) and 651 (the block table), on the "
        "DECODE view its replay builds (line 1808); flashattention_backend.py line 913 adds speculative_step_id + 1",
        r"graph vs eager|^history long run: also wrong": "follows from seq_lens_k: 0.5.23's steps attend the committed prefix only",
    }


def _flashinfer_classes(module, device: torch.device) -> None:
    """The FlashInfer classes an SGLang 0.5.23 module (``flashinfer_backend``, ``flashinfer_mla_backend``) builds, set at
    every construction (a TRTLLM-MLA adapter built before leaves stand-ins in ``flashinfer_mla_backend``): on a GPU
    flashinfer's own; elsewhere refimpl's stand-ins (SGLang imported no FlashInfer: its ``is_flashinfer_available`` is
    CUDA only), ``_standin_classes``."""
    if device.type == "cuda":
        import flashinfer as source
    else:
        source = _standin_classes()
    for name in (*FLASHINFER_NAMES, "fast_decode_plan"):
        setattr(module, name, getattr(source, name))


FLASHINFER_NAMES = (
    "BatchDecodeWithPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "BatchMLAPagedAttentionWrapper",
)


@functools.cache
def _standin_classes() -> types.SimpleNamespace:
    """refimpl's stand-ins (``refimpl.flashinfer_wrappers.standin``) under flashinfer's names, taking the keywords SGLang
    passes that they do not model: ``backend=`` (one kernel family here) and the decode plan's split settings at their
    defaults (SGLang's deterministic mode sets them: refused); the ragged prefill wrapper, extend's only, a stand-in."""
    from ..flashinfer_wrappers import fast_plan, standin

    def takes_backend(cls):
        def __init__(self, *a, backend="auto", **k):
            cls.__init__(self, *a, **k)

        return type(cls.__name__, (cls,), {"__init__": __init__, "__module__": __name__})

    decode = takes_backend(standin.BatchDecodeWithPagedKVCacheWrapper)

    def plan(self, *a, fixed_split_size=None, disable_split_kv=False, **k):
        if fixed_split_size is not None or disable_split_kv:
            raise ValueError(
                f"SGLang's split settings (fixed_split_size={fixed_split_size}, disable_split_kv={disable_split_kv}) "
                "are not modelled by refimpl's FlashInfer stand-ins"
            )
        return standin.BatchDecodeWithPagedKVCacheWrapper.plan(self, *a, **k)

    decode.plan = decode.begin_forward = plan
    prefill = takes_backend(standin.BatchPrefillWithPagedKVCacheWrapper)

    def plan_prefill(self, *a, fixed_split_size=None, token_pos_in_items_len=0, window_left=-1, **k):
        # SGLang passes the multi-item-scoring pointers always (None unless scoring); a window or split setting: refused
        items = {n: k.pop(n) for n in ("prefix_len_ptr", "token_pos_in_items_ptr", "max_item_len_ptr") if n in k}
        if (
            fixed_split_size is not None
            or token_pos_in_items_len
            or window_left >= 0
            or any(map(torch.is_tensor, items.values()))
        ):
            raise ValueError(
                f"SGLang's prefill plan settings (fixed_split_size={fixed_split_size}, window_left={window_left}, "
                "multi-item scoring) are not modelled by refimpl's FlashInfer stand-ins"
            )
        return standin.BatchPrefillWithPagedKVCacheWrapper.plan(self, *a, **k)

    prefill.plan = prefill.begin_forward = plan_prefill
    return types.SimpleNamespace(
        BatchDecodeWithPagedKVCacheWrapper=decode,
        BatchPrefillWithPagedKVCacheWrapper=prefill,
        BatchPrefillWithRaggedKVCacheWrapper=sglang_stubs._Stub,
        BatchMLAPagedAttentionWrapper=standin.BatchMLAPagedAttentionWrapper,  # takes backend= already
        fast_decode_plan=fast_plan._fast_decode_plan_entry,  # flashinfer's arguments, the stand-ins' plan
    )


class _SGLangFlashInfer(_SGLang):
    """FlashInfer's and FlashInfer-MLA's: SGLang's batch with SGLang's own spec inputs for verify and draft extend (the
    FlashInfer hooks call their ``generate_attn_arg_prefill``, ``eagle_info.py``); the fields no hook reads are None."""

    attention_backend = "flashinfer"

    def _their_batch(self, fb):
        from sglang.srt.speculative import eagle_info

        batch, mode, spec = super()._their_batch(fb), fb.forward_mode, self.spec
        if mode.is_target_verify():
            unread = ("draft_token", "positions", "retrieve_index", "retrieve_next_token", "retrieve_next_sibling")
            batch.spec_info = eagle_info.EagleVerifyInput(
                custom_mask=fb.spec_info.custom_mask,
                retrieve_cum_len=None,
                spec_steps=spec.num_steps,
                topk=spec.topk,
                draft_token_num=spec.num_draft_tokens,
                capture_hidden_mode=None,
                seq_lens_sum=fb.seq_lens_sum,
                seq_lens_cpu=fb.seq_lens_cpu,
                **dict.fromkeys(unread),
            )
        elif mode.is_any_draft_extend():
            accepted = batch.spec_info.extend_seq_lens_tensor - 1  # per padded row, as _SGLang._their_batch fills them
            batch.spec_info = eagle_info.EagleDraftExtendInput(
                num_correct_drafts=accepted, num_accept_tokens=accepted + 1, num_tokens_per_req=spec.num_draft_tokens
            )
        return batch


class SGLangFlashInferAttnBackend(_SGLangFlashInfer, FlashInferAttnBackend):
    """SGLang 0.5.23's ``FlashInferAttnBackend`` (``flashinfer_backend.py``): decode, idle, target verify, draft extend
    v2. Its hook creates, binds and registers the per-bs wrappers at capture (Pattern B) and re-plans them on replay:
    decode through flashinfer's ``fast_decode_plan`` after the first plan, draft extend through SGLang's own
    ``fast_prefill_plan`` (host lengths, no read-back), verify through a full ``plan`` that packs the tree mask; verify
    and draft extend take their kv indices from SGLang's own spec inputs (``EagleVerifyInput`` /
    ``EagleDraftExtendInput.generate_attn_arg_prefill``). refimpl's ``forward`` runs those wrappers in the graph (real
    FlashInfer on a GPU; on a CPU refimpl's stand-ins, ``_flashinfer_classes``), and refimpl's unified FlashInfer shape
    gives the eager path and the reference. Its model runner needs, beyond the other backends': the KV pool's quant
    method (SGLang's own ``UnquantizedKVCacheMethod``), an allocator with no sliding-window pool, the model's
    architectures (none), and the attention backend names."""

    upstream = "flashinfer_backend:FlashInferAttnBackend"
    multi_step_class = "refimpl.adapters.sglang:SGLangFlashInferMultiStepDraftBackend"
    graph_modes = _NO_DRAFT_EXTEND_V1
    # SGLang's (a list, one per wrapper: one here) and its mask scratch, bound to its wrappers; not the indptrs (its
    # decode hook never writes kv_indptr[0], as Triton's)
    adopted = ("cuda_graph_kv_indices", "cuda_graph_custom_mask")

    def _stand_ins(self) -> None:
        from sglang.srt.environ import envs
        from sglang.srt.layers.attention import flashinfer_backend

        # opt-in host plans: verify's packs the tree mask into bits (the stand-ins keep a byte per entry), the multi-step
        # one builds the host indptr from seq_lens_cpu (the padded-request note assumes positions)
        for switch in ("SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN", "SGLANG_OPT_FLASHINFER_DRAFT_HOST_INDPTR"):
            if getattr(envs, switch).get():
                raise ValueError(f"{switch} is set: the adapter models SGLang's FlashInfer backend with it off (the default)")
        _flashinfer_classes(flashinfer_backend, self.device)

    def _model_runner(self, world, spec):
        from sglang.srt.layers.quantization.fp4_kv_cache_quant_method import UnquantizedKVCacheMethod

        runner = model_runner(world, spec, self.attention_backend)
        runner.token_to_kv_pool.get_kv_cache_quant_method = UnquantizedKVCacheMethod
        runner.token_to_kv_pool_allocator = _Config(get_kvcache=lambda: None)
        runner.model_config.hf_config.architectures = []
        runner.prefill_attention_backend_str = runner.decode_attention_backend_str = self.attention_backend
        return runner

    def init_cuda_graph_state(self, max_bs, max_num_tokens, *args) -> None:
        super().init_cuda_graph_state(max_bs, max_num_tokens, *args)
        theirs = self.sglang
        self.cuda_graph_kv_indices, self.kv_indptr = theirs.cuda_graph_kv_indices[0], theirs.kv_indptr[0]
        self.kv_last_page_len = theirs.kv_last_page_len

    def forward(self, q, k, v, layer: int, fb):
        md = self.forward_metadata
        if isinstance(md, PrefillMetadata):  # SGLang's forward_extend runs its wrapper causal (a bound mask wins)
            md.wrappers[0]._causal = True
        return super().forward(q, k, v, layer, fb)

    def _take_frozen(self, bs: int) -> None:
        md = self.sglang.forward_metadata
        if hasattr(md, "decode_wrappers"):
            self.forward_metadata = DecodeMetadata(md.decode_wrappers)
        else:  # what its kernel does: the mask when bound, else causal (forward above)
            w = md.prefill_wrappers[0]
            self.forward_metadata = PrefillMetadata(md.prefill_wrappers, w._custom_mask_buf is None)


class _SGLangFlashInferStep(SGLangFlashInferAttnBackend):
    """A step of SGLang's FlashInfer multi-step wrapper (its buffers are the wrapper's to allocate; decode only, so no
    mask buffer: SGLang builds its steps with ``skip_prefill=True``)."""

    in_wrapper, adopted = True, ("cuda_graph_kv_indices",)


class SGLangFlashInferMultiStepDraftBackend(_SGLangMultiStep, FlashInferMultiStepDraftBackend):
    """SGLang 0.5.23's ``FlashInferMultiStepDraftBackend`` (``flashinfer_backend.py``), multi-step draft decode: its
    wrapper builds S-1 ``FlashInferAttnBackend`` steps over its rows of ``kv_indptr`` and allocates ``cuda_graph_kv_indices``
    (S rows, one for each step's indices); its hook fills every row in one launch of ``generate_draft_decode_kv_indices`` (the indptr from the
    batch's ``positions``, the indices from ``seq_lens``), reads the indptr back to the host and runs each step's decode
    hook on the step's rows, which plans the step's wrapper. refimpl's steps (``SGLangFlashInferAttnBackend`` over
    SGLang's) run ``forward`` over the wrappers each froze and give the eager path and the reference."""

    upstream, attention_backend = "flashinfer_backend:FlashInferMultiStepDraftBackend", "flashinfer"
    step_cls = _SGLangFlashInferStep
    graph_buffer_names = ("cuda_graph_kv_indices",)  # not the indptr: as SGLangFlashInferAttnBackend
    upstream_findings = {r"^reference: step\d+\.paged_kv_ind": _PADDED_DRAFT_ROWS}


_PR_37975 = (
    "0.5.23's decode replay refreshes the eager kv_indptr and the host arrays, not the wrapper's bound kv_indptr / "
    "kv_len_arr (kv_indices is read through the stale kv_indptr): flashinfer_mla_backend.py, "
    "FlashInferMLAIndicesUpdaterDecode; open PR sgl-project/sglang#37975"
)


class SGLangFlashInferMLAAttnBackend(_SGLangFlashInfer, FlashInferMLAAttnBackend):
    """SGLang 0.5.23's ``FlashInferMLAAttnBackend`` (``flashinfer_mla_backend.py``): decode, idle and target verify
    (chains: its verify plans ``causal=True``, no tree mask; 0.5.23 captures no draft extend). At capture its hook
    creates, binds and registers the per-bs wrapper and plans it (then routes its ``plan`` to SGLang's
    ``fast_mla_decode_plan`` / ``fast_mla_prefill_plan``); on replay it re-plans from host arrays. refimpl's ``forward`` runs that wrapper in the
    graph (real FlashInfer on a GPU, refimpl's stand-in on a CPU) and refimpl's unified FlashInfer-MLA shape gives the
    eager path and the reference. Its replay writes the eager ``kv_indptr``, not the bound one: the bound
    ``kv_indptr`` / ``kv_len_arr`` keep the capture batch's values (open PR #37975; the MLA kernel reads its plan's work
    list, so the output does not show it)."""

    upstream = "flashinfer_mla_backend:FlashInferMLAAttnBackend"
    multi_step_class = "refimpl.adapters.sglang:SGLangFlashInferMLAMultiStepDraftBackend"
    graph_modes = frozenset({ForwardMode.DECODE, ForwardMode.IDLE, ForwardMode.TARGET_VERIFY})
    # SGLang's, bound to its wrappers; not the indptrs (its hook never writes kv_indptr[0])
    adopted = ("cuda_graph_kv_indices", "cuda_graph_kv_lens")
    upstream_findings = {r"^(reference: )?kv_(indptr|len_arr|indices)": _PR_37975}

    def _stand_ins(self) -> None:
        from sglang.srt.layers.attention import flashinfer_mla_backend

        _flashinfer_classes(flashinfer_mla_backend, self.device)

    def init_cuda_graph_state(self, max_bs, max_num_tokens, *args) -> None:
        super().init_cuda_graph_state(max_bs, max_num_tokens, *args)
        theirs = self.sglang
        self.cuda_graph_qo_indptr, self.cuda_graph_kv_indptr = theirs.cuda_graph_qo_indptr, theirs.cuda_graph_kv_indptr

    def _take_frozen(self, bs: int) -> None:
        md = self.sglang.forward_metadata
        self.forward_metadata = md.decode_wrapper if hasattr(md, "decode_wrapper") else md.prefill_wrapper


class _SGLangFlashInferMLAStep(SGLangFlashInferMLAAttnBackend):
    """A step of SGLang's FlashInfer-MLA multi-step wrapper (its buffers are the wrapper's to allocate)."""

    in_wrapper = True


class SGLangFlashInferMLAMultiStepDraftBackend(_SGLangMultiStep, FlashInferMLAMultiStepDraftBackend):
    """SGLang 0.5.23's ``FlashInferMLAMultiStepDraftBackend`` (``flashinfer_mla_backend.py``), multi-step draft decode of
    chains: its wrapper builds S-1 ``FlashInferMLAAttnBackend`` steps over its rows of ``kv_indptr`` and allocates
    ``cuda_graph_kv_indices``; its hook fills every row in one launch of ``generate_draft_decode_kv_indices`` and runs each
    step's decode hook on the step's rows (``common_template``), which plans the step's wrapper. refimpl's steps
    (``SGLangFlashInferMLAAttnBackend`` over SGLang's) run ``forward`` over the wrappers each froze and give the eager path
    and the reference.

    Its steps' indices hold each request's prefix and the step's i+1 drafts, but after capture's first, full plan the
    hook re-plans fast from the committed lengths (``seq_lens.cpu()`` at capture, ``seq_lens_cpu`` on replay:
    ``_apply_cuda_graph_metadata``, lines 555-579), so the graph runs a committed-length plan over that layout. The MLA
    kernel takes each request's window from its plan (flashinfer's ``scheduler.cuh``, ``MLAPlan``: ``kv_indptr_h``,
    ``kv_len_arr_h``): request 0 attends its committed prefix, request r >= 1 a window starting r*(i+1) entries before
    its range (the requests before it, then its own leading prefix; none of its drafts). Its eager path attends the
    committed prefix (``init_forward_metadata``, lines 424-433, passes no spec input), as TRTLLM-MLA's steps do;
    refimpl's steps attend prefix + i + 1. Its steps' bound ``kv_indptr`` / ``kv_len_arr`` go stale as #37975
    describes, by another route (the wrapper's launch writes each step's eager row)."""

    upstream, attention_backend = "flashinfer_mla_backend:FlashInferMLAMultiStepDraftBackend", "flashinfer"
    step_cls = _SGLangFlashInferMLAStep
    graph_buffer_names = ("cuda_graph_kv_indices",)  # not the indptr: as SGLangFlashInferMLAAttnBackend
    upstream_findings = {  # what 0.5.23's own steps do that these findings show (docs/reference.md has the why)
        r"^(reference: )?step\d+\.kv_(indptr|len_arr|indices)": "as in #37975, by another route: 0.5.23's multi-step "
        "launch writes each step's eager kv_indptr row, its replay plans from host arrays, the bound kv_indptr / "
        "kv_len_arr keep the capture batch's values (flashinfer_mla_backend.py lines 950-956, 1226, 1274)",
        r"graph vs eager|^history long run: also wrong": "0.5.23 plans each draft step from the committed seq_lens "
        "(flashinfer_mla_backend.py lines 352, 395-405, 555-579) over indices laid out with the i+1 drafts: request 0 "
        "attends its committed prefix, request r >= 1 a window starting r*(i+1) keys early, in the requests before it",
    }
