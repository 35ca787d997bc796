"""Graph engines (CUDA and the CPU emulator) and the batch-size graph runner."""

from __future__ import annotations

import torch

from .emulator import CPUEmulatorEngine, EmulatedGraph
from .engine import Graph, GraphCaptureError, GraphEngine, GraphReplayError


def make_engine(name: str = "auto", liveness: bool = False) -> GraphEngine:
    """``'auto'``: CUDA when available, else the CPU emulator; or ``'cuda'`` / ``'cpu-emulator'``. ``liveness``: CUDA
    replays check that what a graph reads and did not allocate is still alive at its address (the emulator always
    does; ``refimpl/graphs/cuda.py``)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu-emulator"
    if name in ("cpu", "cpu-emulator", "emulator"):
        return CPUEmulatorEngine()
    if name == "cuda":
        from .cuda import CUDAGraphEngine

        return CUDAGraphEngine(liveness=liveness)
    raise ValueError(f"unknown graph engine {name!r}; valid: auto, cuda, cpu-emulator")


__all__ = ["CPUEmulatorEngine", "EmulatedGraph", "Graph", "GraphCaptureError", "GraphEngine", "GraphReplayError", "make_engine"]
