"""Graph engines (CUDA and the CPU emulator) and the batch-size graph runner."""

from __future__ import annotations

import torch

from .emulator import CPUEmulatorEngine, EmulatedGraph
from .engine import Graph, GraphCaptureError, GraphEngine, GraphReplayError


def make_engine(name: str = "auto") -> GraphEngine:
    """``'auto'``: CUDA when available, else the CPU emulator; or ``'cuda'`` / ``'cpu-emulator'``."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu-emulator"
    if name in ("cpu", "cpu-emulator", "emulator"):
        return CPUEmulatorEngine()
    if name == "cuda":
        from .cuda import CUDAGraphEngine

        return CUDAGraphEngine()
    raise ValueError(f"unknown graph engine {name!r}; valid: auto, cuda, cpu-emulator")


__all__ = ["CPUEmulatorEngine", "EmulatedGraph", "Graph", "GraphCaptureError", "GraphEngine", "GraphReplayError", "make_engine"]
