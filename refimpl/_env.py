"""Process-wide set-up that must happen before any ``@triton.jit`` function is defined.

Triton reads ``TRITON_INTERPRET`` when a kernel is *defined*; setting it later fails with "0 active drivers". On a
machine without CUDA we therefore switch the interpreter on here, and ``refimpl/__init__.py`` imports this module first.
The interpreter mishandles bf16 (garbage without an error), so CPU paths use fp32 / fp16 (``check_cpu_dtype``).
"""

from __future__ import annotations

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
Device = str | torch.device  # a device, or its name


LAUNCH_CHECKS: list = []  # each called with the kernel before an interpreted launch (the emulator's capture: one)


def _patch_lang_once_per_launch():
    """Make the interpreter's nested ``@triton.jit`` calls cheap. The interpreter re-patches ``triton.language`` (every
    builtin, found by ``inspect.getmembers``) on *every* call of a device function: ``tl.max`` and ``tl.sum`` are such
    functions, so a kernel's inner loop paid about 1.7 ms per reduction, more than half of a CPU check's kernel time
    (profiled in ``triton/runtime/interpreter.py``, triton 3.6-3.9). Within one launch nothing undoes those patches (the
    launch restores its own when it ends), so patching each function once per launch leaves the same state. Does
    nothing if the interpreter's internals are not the ones this was written against."""
    try:
        from triton.runtime import interpreter as ti
    except ImportError:
        return
    if not all(hasattr(ti, n) for n in ("_patch_lang", "GridExecutor", "_LangPatchScope")):
        return
    real_patch, real_launch, seen = ti._patch_lang, ti.GridExecutor.__call__, set()

    def patch_lang(fn):
        if fn in seen:  # already patched in this launch
            return ti._LangPatchScope()
        seen.add(fn)
        return real_patch(fn)

    def launch(self, *args, **kwargs):
        for check in LAUNCH_CHECKS:
            check(getattr(self, "fn", None))
        seen.clear()  # the previous launch restored what its own patch set
        try:
            return real_launch(self, *args, **kwargs)
        finally:
            seen.clear()

    ti._patch_lang, ti.GridExecutor.__call__ = patch_lang, launch


if INTERPRET:
    _patch_lang_once_per_launch()


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() and not INTERPRET else "cpu")


def resolve_device(device: Device | None = None) -> torch.device:
    """``device`` (None: ``default_device()``), a bare ``"cuda"`` given the current index: tensors report one, so
    devices then compare exactly."""
    dev = torch.device(device) if device is not None else default_device()
    return torch.device("cuda", torch.cuda.current_device()) if dev.type == "cuda" and dev.index is None else dev


def default_dtype(device: Device) -> torch.dtype:
    """The model dtype the backends run on ``device``: bfloat16 on a GPU (what the real kernels take), float32 on the CPU
    (the Triton interpreter mishandles bf16)."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def check_cpu_dtype(t: torch.Tensor, name: str):
    """Refuse bf16 on the Triton interpreter instead of returning garbage silently."""
    if INTERPRET and t.dtype == torch.bfloat16:
        raise TypeError(
            f"{name} is bfloat16, which the Triton interpreter (TRITON_INTERPRET=1) computes "
            "wrongly; use float32 or float16 on CPU"
        )
