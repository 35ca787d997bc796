"""Backend registry: every (backend, variant) the checker and the notebooks can build.

Heavy or hardware-bound backends register with an ``unavailable()`` probe that returns a reason
string when they cannot run on this machine; importing ``refimpl.backends`` never imports them.
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
            raise GraphModeNotSupported(
                f"{self.name}/{self.variant} has no multi-step draft backend"
            )
        module, cls = target.split(":")
        return getattr(importlib.import_module(module, __name__), cls)

    def why_unavailable(self) -> str | None:
        return self.unavailable() if self.unavailable else None


REGISTRY: list[BackendEntry] = [
    BackendEntry("torch_native", "unified", ".torch_native:TorchNativeBackend", "mha"),
    BackendEntry("torch_native_mla", "unified", ".torch_native:TorchNativeBackend", "mla"),
    BackendEntry("triton", "unified", ".triton:TritonAttnBackend", "mha",
                 multi_step_target=".multistep:TritonMultiStepDraftBackend"),
    BackendEntry("triton", "legacy", ".triton:TritonAttnBackendLegacy", "mha",
                 multi_step_target=".multistep:TritonMultiStepDraftBackendLegacy"),
    BackendEntry("wave", "unified", ".wave:WaveAttnBackend", "mha",
                 multi_step_target=".multistep:WaveMultiStepDraftBackend"),
    BackendEntry("wave", "legacy", ".wave:WaveAttnBackendLegacy", "mha",
                 multi_step_target=".multistep:WaveMultiStepDraftBackendLegacy"),
    BackendEntry("flashinfer", "unified", ".flashinfer:FlashInferAttnBackend", "mha",
                 multi_step_target=".multistep:FlashInferMultiStepDraftBackend"),
    BackendEntry("flashinfer", "legacy", ".flashinfer:FlashInferAttnBackendLegacy", "mha",
                 multi_step_target=".multistep:FlashInferMultiStepDraftBackendLegacy"),
    BackendEntry("flashinfer_mla", "unified", ".flashinfer_mla:FlashInferMLAAttnBackend", "mla"),
    BackendEntry("flashinfer_mla", "as-upstream",
                 ".flashinfer_mla:FlashInferMLAAttnBackendAsUpstream", "mla"),
    BackendEntry("flashinfer_mla", "legacy", ".flashinfer_mla:FlashInferMLAAttnBackendLegacy", "mla"),
]  # fmt: skip


def register(entry: BackendEntry) -> None:
    if any((e.name, e.variant) == (entry.name, entry.variant) for e in REGISTRY):
        raise ValueError(f"backend {entry.name}/{entry.variant} is already registered")
    REGISTRY.append(entry)


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
    "GraphModeNotSupported",
    "REGISTRY",
    "find",
    "register",
]
