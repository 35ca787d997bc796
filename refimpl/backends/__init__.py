"""Backend registry: every (backend, variant) the checker and the notebooks can build.

Importing ``refimpl.backends`` imports no backend module: an entry names its class, loaded lazily.
``load_backend_class("package.module:Class")`` turns an out-of-tree backend into an entry (``python -m refimpl check
--backend-class ...``): a reviewer's tool for any new backend.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

from .base import CLASSIC_PAIR, NEITHER_INTERFACE, AttentionBackend, GraphModeNotSupported, dead_classic_hooks, hook_interface


@dataclass(frozen=True)
class BackendEntry:
    name: str
    variant: str
    target: str  # "module:Class", imported lazily
    multi_step_target: str | None = None  # "module:Class" of its multi-step draft wrapper
    page: int | None = None  # another page size its kernels take (TRTLLM-MLA: 32 or 64); None: the class's

    def load(self, multi_step: bool = False) -> type[AttentionBackend]:
        target = self.multi_step_target if multi_step else self.target
        if target is None:
            raise GraphModeNotSupported(f"{self.name}/{self.variant} has no multi-step draft backend")
        module, cls = target.split(":")
        return getattr(importlib.import_module(module, __name__), cls)

    @property
    def model_kind(self) -> str:
        """``"mha"`` or ``"mla"``: the model the backend serves (declared on its class)."""
        return getattr(self.load(), "model_kind", "mha")

    @property
    def page_size(self) -> int:
        """The KV page size the rig builds its world with: ``page``, else its class's ``page_size``."""
        return self.page or getattr(self.load(), "page_size", 1)

    @classmethod
    def from_class(cls, backend_cls: type, target: str) -> "BackendEntry":
        """An entry for a backend class outside the registry. Its labels, ``model_kind`` and ``page_size`` come from the
        class (``AttentionBackend``'s defaults: MHA, page size 1), its multi-step draft wrapper from ``multi_step_class
        = "module:Class"`` (default: none)."""
        labels = getattr(backend_cls, "name", backend_cls.__name__), getattr(backend_cls, "variant", "unified")
        return cls(*labels, target, getattr(backend_cls, "multi_step_class", None))  # a duck-typed class may lack it


# what --backend-class requires: AttentionBackend's public methods (its abstract hooks and those it defaults), but the
# metadata hooks, where either interface will do (``hook_interface``)
HOOKS = ("init_forward_metadata_out_graph", *CLASSIC_PAIR)
CONTRACT = tuple(n for n, v in vars(AttentionBackend).items() if callable(v) and not n.startswith("_") and n not in HOOKS)


class BackendLoadError(ValueError):
    """``--backend-class`` could not be turned into a backend; the message says why."""


def load_backend_class(spec: str) -> BackendEntry:
    """``"package.module:ClassName"`` -> a ``BackendEntry`` (clear one-line errors)."""
    module_name, sep, cls_name = spec.partition(":")
    if not (module_name and sep and cls_name):
        raise BackendLoadError(f"--backend-class {spec!r}: expected package.module:ClassName")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or whatever the module raises while importing
        raise BackendLoadError(f"--backend-class {spec!r}: cannot import {module_name!r} ({type(e).__name__}: {e})") from None
    backend_cls = getattr(module, cls_name, None)
    if not isinstance(backend_cls, type):
        raise BackendLoadError(f"--backend-class {spec!r}: {module_name} has no class {cls_name!r}")
    if inspect.isabstract(backend_cls):
        left = ", ".join(sorted(backend_cls.__abstractmethods__))
        raise BackendLoadError(f"--backend-class {spec!r}: {cls_name} is abstract: it leaves {left} unimplemented")
    if hook_interface(backend_cls) is None:
        raise BackendLoadError(f"--backend-class {spec!r}: {cls_name} {NEITHER_INTERFACE}")
    if dead := dead_classic_hooks(backend_cls):
        raise BackendLoadError(
            f"--backend-class {spec!r}: {cls_name} defines {', '.join(dead)}, which the runner never calls: it implements "
            "init_forward_metadata_out_graph (SGLang 0.5.23's entry point); put the change there"
        )
    missing = [m for m in CONTRACT if not callable(getattr(backend_cls, m, None))]
    if missing:
        raise BackendLoadError(
            f"--backend-class {spec!r}: {cls_name} does not implement the backend contract "
            f"(refimpl.backends.base.AttentionBackend); missing: {', '.join(missing)}"
        )
    return BackendEntry.from_class(backend_cls, spec)


# (name, variant, backend class, multi-step draft wrapper); model kind and page size: on the class
REGISTRY: list[BackendEntry] = [
    BackendEntry(*row)
    for row in (
        ("torch_native", "unified", ".torch_native:TorchNativeBackend"),
        ("torch_native_mla", "unified", ".torch_native:TorchNativeMLABackend"),
        ("triton", "unified", ".triton:TritonAttnBackend", ".triton:TritonMultiStepDraftBackend"),
        ("triton", "legacy", ".triton:TritonAttnBackendLegacy", ".triton:TritonMultiStepDraftBackendLegacy"),
        ("triton", "out_graph", ".triton:TritonAttnBackendOutGraph"),
        ("triton", "fused", ".triton_fused:TritonAttnBackendFused"),
        ("triton", "in_graph", ".triton_fused:TritonAttnBackendInGraph"),
        ("wave", "unified", ".wave:WaveAttnBackend", ".wave:WaveMultiStepDraftBackend"),
        ("wave", "legacy", ".wave:WaveAttnBackendLegacy", ".wave:WaveMultiStepDraftBackendLegacy"),
        ("flashinfer", "unified", ".flashinfer:FlashInferAttnBackend", ".flashinfer:FlashInferMultiStepDraftBackend"),
        ("flashinfer", "legacy", ".flashinfer:FlashInferAttnBackendLegacy", ".flashinfer:FlashInferMultiStepDraftBackendLegacy"),
        (
            "flashinfer_mla",
            "unified",
            ".flashinfer_mla:FlashInferMLAAttnBackend",
            ".flashinfer_mla:FlashInferMLAMultiStepDraftBackend",
        ),
        ("flashinfer_mla", "as-upstream", ".flashinfer_mla:FlashInferMLAAttnBackendAsUpstream"),
        ("flashinfer_mla", "legacy", ".flashinfer_mla:FlashInferMLAAttnBackendLegacy"),
        ("cutlass_mla", "unified", ".cutlass_mla:CutlassMLAAttnBackend"),
        ("cutlass_mla", "legacy", ".cutlass_mla:CutlassMLAAttnBackendLegacy"),
        ("trtllm_mla", "legacy", ".trtllm_mla:TRTLLMMLAAttnBackendLegacy", ".trtllm_mla:TRTLLMMLAMultiStepDraftBackendLegacy"),
        ("trtllm_mla", "unified", ".trtllm_mla:TRTLLMMLAAttnBackend", ".trtllm_mla:TRTLLMMLAMultiStepDraftBackend"),
        (
            "trtllm_mla",
            "simplified",
            ".trtllm_mla:TRTLLMMLAAttnBackendSimplified",
            ".trtllm_mla:TRTLLMMLAMultiStepDraftBackendSimplified",
        ),
        (
            "trtllm_mla",
            "in_graph",
            ".trtllm_mla:TRTLLMMLAAttnBackendInGraph",
            ".trtllm_mla:TRTLLMMLAMultiStepDraftBackendInGraph",
        ),
    )
]


HISTORICAL_VARIANTS = frozenset({"legacy", "as-upstream"})  # expected to show their findings


def must_pass(variant: str) -> bool:
    """Every shape but the historical ones must pass every checker verdict."""
    return variant not in HISTORICAL_VARIANTS


def find(name: str | None = None, variant: str | None = None) -> list[BackendEntry]:
    out = [e for e in REGISTRY if name in (None, e.name) and variant in (None, e.variant)]
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
