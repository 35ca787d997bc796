"""The real thing: ``torch.cuda.CUDAGraph`` behind the same contract as the emulator.

What this engine adds to a bare ``torch.cuda.graph`` block (PyTorch "CUDA Graphs" notes,
SGLang's ``CudaGraphRunner.capture``, [facts#capture]):

- warm-up runs happen on a side stream, so lazy initialisation (cuBLAS handles, Triton
  compilation, allocator growth) is not captured;
- every graph of an engine shares one memory pool (``graph.pool()`` of the first capture), and
  the runner captures the largest batch first so smaller graphs reuse its blocks;
- while capturing, the op names are listed by the shared op recorder (``recorder.py``) in naming-only mode, so
  ``kernels()`` works on both engines.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .engine import Graph, GraphCaptureError, GraphEngine
from .recorder import record_ops


class CUDAGraphHandle(Graph):
    engine_name = "cuda"

    def __init__(self, engine: "CUDAGraphEngine") -> None:
        super().__init__()
        self.engine = engine
        self.graph = torch.cuda.CUDAGraph()

    def capture(self, fn: Callable[[], Any]) -> Any:
        if self.captured:
            raise GraphCaptureError("this graph was already captured; make a new one")
        eng = self.engine
        torch.cuda.synchronize(eng.device)
        try:
            # the recorder opens inside the graph context, so torch.cuda.graph's own set-up ops
            # (the RNG seed/offset fills) are not listed among the program's kernels
            with (
                torch.cuda.graph(self.graph, pool=eng.pool, stream=eng.stream),
                torch.no_grad(),  # as the emulator captures
                record_ops(None) as rec,
            ):
                out = fn()
        except RuntimeError as e:  # "operation not permitted when stream is capturing", ...
            # a failed capture can leave cuBLAS workspaces pointing into the dead graph's pool
            torch.cuda.synchronize(eng.device)
            if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
                torch._C._cuda_clearCublasWorkspaces()
            if isinstance(e, GraphCaptureError):  # refused by the shared recorder, not by CUDA
                raise
            raise GraphCaptureError(f"CUDA stream capture failed: {e}") from e
        if eng.pool is None:
            eng.pool = self.graph.pool()  # every later capture shares this pool
        self._op_log = rec.names
        self.captured = True
        return out

    def replay(self) -> None:
        self._check_captured()
        self.graph.replay()


class CUDAGraphEngine(GraphEngine):
    name = "cuda"

    def __init__(self, device: str | torch.device = "cuda") -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("CUDAGraphEngine needs a CUDA device; use CPUEmulatorEngine")
        dev = torch.device(device)
        # an explicit index ("cuda:0"): tensors report one and devices are compared exactly
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        self.device = dev
        self.stream = torch.cuda.Stream(self.device)
        self.pool = None  # set by the first capture (graph.pool()), shared afterwards

    def new_graph(self) -> CUDAGraphHandle:
        return CUDAGraphHandle(self)

    def warmup(self, fn: Callable[[], Any], n: int) -> None:
        cur = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(cur)
        with torch.cuda.stream(self.stream):
            for _ in range(n):
                fn()
        cur.wait_stream(self.stream)
        torch.cuda.synchronize(self.device)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def memory_in_use(self) -> int:
        return torch.cuda.memory_reserved(self.device)
