"""The FlashInfer layer: real flashinfer wrappers on a GPU, faithful stand-ins everywhere else.

- :func:`flashinfer_available`: ``None`` when flashinfer imports *and* CUDA is available, else
  the reason (a string).
- :func:`wrapper_classes`: the three paged wrapper classes (real when available and preferred,
  else the stand-ins of :mod:`refimpl.fi.standins`, which carry ``IS_STANDIN = True``).
- :func:`make_workspace`: the float workspace the wrappers share (128 MiB for the real library,
  a small one for the stand-ins, which do not use it).
- :mod:`refimpl.fi.fast_plan`: the graph-path re-plan without a device-to-host copy.

Importing this package never imports flashinfer: that happens lazily inside the functions.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from . import standins
from .standins import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchMLAPagedAttentionWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    is_standin,
    set_kv_window,
)

REAL_WORKSPACE_BYTES = 128 * 1024 * 1024  # flashinfer's recommended float workspace
STANDIN_WORKSPACE_BYTES = 1024 * 1024  # the stand-ins never touch it

__all__ = [
    "BatchDecodeWithPagedKVCacheWrapper",
    "BatchMLAPagedAttentionWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "FlashInferClasses",
    "REAL_WORKSPACE_BYTES",
    "STANDIN_WORKSPACE_BYTES",
    "flashinfer_available",
    "is_standin",
    "make_workspace",
    "real_wrapper_classes",
    "set_kv_window",
    "standins",
    "wrapper_classes",
]


@dataclass(frozen=True)
class FlashInferClasses:
    """The three wrapper classes a backend builds, under their flashinfer names."""

    BatchDecodeWithPagedKVCacheWrapper: type
    BatchPrefillWithPagedKVCacheWrapper: type
    BatchMLAPagedAttentionWrapper: type
    real: bool  # True: flashinfer's own classes
    reason: str | None = None  # why the stand-ins were chosen (None when real or preferred)


_STANDINS = FlashInferClasses(
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchMLAPagedAttentionWrapper,
    real=False,
)


@functools.lru_cache(maxsize=1)
def _import_error() -> str | None:
    try:
        import flashinfer  # noqa: F401
    except Exception as e:  # ImportError, or a broken install failing at import time
        return f"flashinfer does not import: {type(e).__name__}: {e}"
    return None


def flashinfer_available() -> str | None:
    """``None`` if the real flashinfer imports and CUDA is available, else the reason."""
    if not torch.cuda.is_available():
        return "CUDA is not available"
    return _import_error()


def real_wrapper_classes() -> FlashInferClasses:
    """flashinfer's own classes, whether or not CUDA is present (the classes import on CPU;
    constructing them needs CUDA). Raises ImportError with the reason when it does not import."""
    err = _import_error()
    if err is not None:
        raise ImportError(err)
    import flashinfer

    return FlashInferClasses(
        flashinfer.BatchDecodeWithPagedKVCacheWrapper,
        flashinfer.BatchPrefillWithPagedKVCacheWrapper,
        flashinfer.BatchMLAPagedAttentionWrapper,
        real=True,
    )


def wrapper_classes(prefer_real: bool = True) -> FlashInferClasses:
    """The real classes when ``prefer_real`` and :func:`flashinfer_available` is None, else the
    stand-ins (``reason`` says why when real ones were preferred)."""
    if not prefer_real:
        return _STANDINS
    why = flashinfer_available()
    if why is None:
        return real_wrapper_classes()
    return replace(_STANDINS, reason=why)


def make_workspace(
    device: torch.device | str, size_bytes: int | None = None, *, real: bool | None = None
) -> torch.Tensor:
    """A zeroed uint8 float workspace on ``device``.

    Default size: 128 MiB (flashinfer's recommendation; it must be zero before first use) when
    the real library will use it (``real``, default: a CUDA device and flashinfer available),
    else 1 MiB (the stand-ins keep their partition in their own int workspace)."""
    device = torch.device(device)
    if size_bytes is None:
        if real is None:
            real = device.type == "cuda" and flashinfer_available() is None
        size_bytes = REAL_WORKSPACE_BYTES if real else STANDIN_WORKSPACE_BYTES
    if size_bytes < 1:
        raise ValueError(f"size_bytes={size_bytes}: must be >= 1")
    return torch.zeros(size_bytes, dtype=torch.uint8, device=device)
