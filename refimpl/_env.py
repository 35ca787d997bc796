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


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() and not INTERPRET else "cpu")


def default_dtype(device: torch.device | str) -> torch.dtype:
    """The model dtype the backends run on ``device``: bfloat16 on a GPU (what the real kernels take), float32 on the CPU
    (the Triton interpreter mishandles bf16)."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def check_cpu_dtype(t: torch.Tensor, name: str) -> None:
    """Refuse bf16 on the Triton interpreter instead of returning garbage silently."""
    if INTERPRET and t.dtype == torch.bfloat16:
        raise TypeError(
            f"{name} is bfloat16, which the Triton interpreter (TRITON_INTERPRET=1) computes "
            "wrongly; use float32 or float16 on CPU"
        )
