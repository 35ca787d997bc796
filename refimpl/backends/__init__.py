"""Backend registry: every (backend, variant) the checker and the notebooks can build.

Heavy or hardware-bound backends register with an ``unavailable()`` probe that returns a reason
string when they cannot run on this machine; importing ``refimpl.backends`` never imports them.
``load_backend_class("package.module:Class")`` turns an out-of-tree backend into an entry
(``python -m refimpl check --backend-class ...``): a reviewer's tool for any new backend.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from .base import AttentionBackend, GraphModeNotSupported


@dataclass(frozen=True)
class BackendEntry:
    name: str
    variant: str
    target: str  # "module:Class", imported lazily
    model_kind: str  # "mha" or "mla": the model flavour it serves
    page_size: int = 1
    unavailable: Callable[[], str | None] | None = None
    multi_step_target: str | None = None  # "module:Class" of its multi-step draft wrapper

    def load(self, multi_step: bool = False) -> type[AttentionBackend]:
        target = self.multi_step_target if multi_step else self.target
        if target is None:
            raise GraphModeNotSupported(f"{self.name}/{self.variant} has no multi-step draft backend")
        module, cls = target.split(":")
        return getattr(importlib.import_module(module, __name__), cls)

    def why_unavailable(self) -> str | None:
        return self.unavailable() if self.unavailable else None

    @classmethod
    def from_class(cls, backend_cls: type, target: str) -> "BackendEntry":
        """An entry for a backend class outside the registry. The class may say which model it
        serves (``model_kind = "mla"``), its ``page_size`` and its multi-step draft wrapper
        (``multi_step_class = "module:Class"``); defaults: MHA, page size 1, none."""
        multi = getattr(backend_cls, "multi_step_class", None)
        return cls(
            name=getattr(backend_cls, "name", backend_cls.__name__),
            variant=getattr(backend_cls, "variant", "unified"),
            target=target,
            model_kind=getattr(backend_cls, "model_kind", "mha"),
            page_size=getattr(backend_cls, "page_size", 1),
            multi_step_target=multi,
        )


CONTRACT = (
    "init_forward_metadata",
    "init_cuda_graph_state",
    "init_forward_metadata_capture_cuda_graph",
    "init_forward_metadata_replay_cuda_graph",
    "get_cuda_graph_seq_len_fill_value",
    "forward",
    "graph_state",
    "check_graph_mode",
)


class BackendLoadError(ValueError):
    """``--backend-class`` could not be turned into a backend; the message says why."""


def load_backend_class(spec: str) -> BackendEntry:
    """``"package.module:ClassName"`` -> a ``BackendEntry`` (clear one-line errors)."""
    module_name, sep, cls_name = spec.partition(":")
    if not sep or not module_name or not cls_name:
        raise BackendLoadError(f"--backend-class {spec!r}: expected package.module:ClassName")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or whatever the module raises while importing
        raise BackendLoadError(
            f"--backend-class {spec!r}: cannot import {module_name!r} ({type(e).__name__}: {e})"
        ) from None
    backend_cls = getattr(module, cls_name, None)
    if not isinstance(backend_cls, type):
        raise BackendLoadError(f"--backend-class {spec!r}: {module_name} has no class {cls_name!r}")
    missing = [m for m in CONTRACT if not callable(getattr(backend_cls, m, None))]
    if missing:
        raise BackendLoadError(
            f"--backend-class {spec!r}: {cls_name} does not implement the backend contract "
            f"(refimpl.backends.base.AttentionBackend); missing: {', '.join(missing)}"
        )
    return BackendEntry.from_class(backend_cls, spec)


REGISTRY: list[BackendEntry] = [
    BackendEntry("torch_native", "unified", ".torch_native:TorchNativeBackend", "mha"),
    BackendEntry("torch_native_mla", "unified", ".torch_native:TorchNativeBackend", "mla"),
    BackendEntry("triton", "unified", ".triton:TritonAttnBackend", "mha",
                 multi_step_target=".triton:TritonMultiStepDraftBackend"),
    BackendEntry("triton", "legacy", ".triton:TritonAttnBackendLegacy", "mha",
                 multi_step_target=".triton:TritonMultiStepDraftBackendLegacy"),
    BackendEntry("triton", "fused", ".triton:TritonAttnBackendFused", "mha"),
    BackendEntry("triton", "in_graph", ".triton:TritonAttnBackendInGraph", "mha"),
    BackendEntry("wave", "unified", ".wave:WaveAttnBackend", "mha",
                 multi_step_target=".wave:WaveMultiStepDraftBackend"),
    BackendEntry("wave", "legacy", ".wave:WaveAttnBackendLegacy", "mha",
                 multi_step_target=".wave:WaveMultiStepDraftBackendLegacy"),
    BackendEntry("flashinfer", "unified", ".flashinfer:FlashInferAttnBackend", "mha",
                 multi_step_target=".flashinfer:FlashInferMultiStepDraftBackend"),
    BackendEntry("flashinfer", "legacy", ".flashinfer:FlashInferAttnBackendLegacy", "mha",
                 multi_step_target=".flashinfer:FlashInferMultiStepDraftBackendLegacy"),
    BackendEntry("flashinfer_mla", "unified", ".flashinfer_mla:FlashInferMLAAttnBackend", "mla"),
    BackendEntry("flashinfer_mla", "as-upstream",
                 ".flashinfer_mla:FlashInferMLAAttnBackendAsUpstream", "mla"),
    BackendEntry("flashinfer_mla", "legacy", ".flashinfer_mla:FlashInferMLAAttnBackendLegacy", "mla"),
    BackendEntry("cutlass_mla", "unified", ".cutlass_mla:CutlassMLAAttnBackend", "mla", 128),
    BackendEntry("cutlass_mla", "legacy", ".cutlass_mla:CutlassMLAAttnBackendLegacy", "mla", 128),
    BackendEntry("trtllm_mla", "legacy", ".trtllm_mla:TRTLLMMLAAttnBackendLegacy", "mla", 64,
                 multi_step_target=".trtllm_mla:TRTLLMMLAMultiStepDraftBackendLegacy"),
    BackendEntry("trtllm_mla", "unified", ".trtllm_mla:TRTLLMMLAAttnBackend", "mla", 64,
                 multi_step_target=".trtllm_mla:TRTLLMMLAMultiStepDraftBackend"),
    BackendEntry("trtllm_mla", "simplified", ".trtllm_mla:TRTLLMMLAAttnBackendSimplified", "mla",
                 64, multi_step_target=".trtllm_mla:TRTLLMMLAMultiStepDraftBackendSimplified"),
    BackendEntry("trtllm_mla", "in_graph", ".trtllm_mla:TRTLLMMLAAttnBackendInGraph", "mla", 64,
                 multi_step_target=".trtllm_mla:TRTLLMMLAMultiStepDraftBackendInGraph"),
]  # fmt: skip


HISTORICAL_VARIANTS = frozenset({"legacy", "as-upstream"})  # expected to show their findings


def must_pass(variant: str) -> bool:
    """Every shape but the historical ones must pass every checker verdict."""
    return variant not in HISTORICAL_VARIANTS


def find(name: str | None = None, variant: str | None = None) -> list[BackendEntry]:
    out = [e for e in REGISTRY if (name is None or e.name == name)]
    out = [e for e in out if (variant is None or e.variant == variant)]
    if name is not None and not out:
        names = sorted({e.name for e in REGISTRY})
        raise ValueError(f"unknown backend {name!r} (variant {variant!r}); known: {names}")
    return out


__all__ = [
    "AttentionBackend",
    "BackendEntry",
    "BackendLoadError",
    "CONTRACT",
    "GraphModeNotSupported",
    "REGISTRY",
    "HISTORICAL_VARIANTS",
    "find",
    "load_backend_class",
    "must_pass",
]
