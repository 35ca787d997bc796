"""The real thing: ``torch.cuda.CUDAGraph`` behind the same contract as the emulator.

What this engine adds to a bare ``torch.cuda.graph`` block (PyTorch "CUDA Graphs" notes,
SGLang's ``CudaGraphRunner.capture``, [facts#capture]):

- warm-up runs happen on a side stream, so lazy initialisation (cuBLAS handles, Triton
  compilation, allocator growth) is not captured;
- every graph of an engine shares one memory pool (``graph.pool()`` of the first capture), and
  the runner captures the largest batch first so smaller graphs reuse its blocks;
- while capturing, the op names are listed by the shared op recorder (``recorder.py``) in
  naming-only mode, so ``kernels()`` works on both engines;
- a failed capture is contained (``_discard``): whatever raised inside it, the capture is ended,
  the caller's stream restored and the graph dropped, so the next capture and replay in the same
  process succeed; and no garbage collection runs during a capture (see ``capture``).
"""

from __future__ import annotations

import gc
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
        caller_stream = torch.cuda.current_stream(eng.device)
        # No garbage collection while capturing: a collection could destroy an unreachable old
        # graph, whose pool release (cudaFree) is forbidden during capture and invalidates it.
        # Seen on the H200: cuBLAS "execution failed" and "operation failed due to a previous
        # error during capture" at random points of a long test run, whenever a dropped runner
        # was collected inside another capture.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            # the recorder opens inside the graph context, so torch.cuda.graph's own set-up ops
            # (the RNG seed/offset fills) are not listed among the program's kernels
            with (
                torch.cuda.graph(self.graph, pool=eng.pool, stream=eng.stream),
                torch.no_grad(),  # as the emulator captures
                record_ops(None) as rec,
            ):
                out = fn()
        except BaseException as e:  # a refusal, a kernel error, CUDA's own capture error, ...
            self._discard(caller_stream)
            if isinstance(e, GraphCaptureError) or not isinstance(e, RuntimeError):
                raise  # refused by the shared recorder, or the caller's own exception
            raise GraphCaptureError(f"CUDA stream capture failed: {e}") from e
        finally:
            if gc_was_enabled:
                gc.enable()
        if eng.pool is None:
            eng.pool = self.graph.pool()  # every later capture shares this pool
        self._op_log = rec.names
        self.captured = True
        return out

    def _discard(self, caller_stream: torch.cuda.Stream) -> None:
        """After any error inside capture, leave the process as if the capture never began: the
        capture ended (``torch.cuda.graph`` ends it, but skips restoring the stream when ending
        it raises), the caller's stream current again, the half-recorded graph and the cuBLAS
        workspaces allocated into its pool dropped, a fresh graph object in its place."""
        eng = self.engine
        with torch.cuda.stream(eng.stream):
            if torch.cuda.is_current_stream_capturing():
                try:
                    self.graph.capture_end()
                except RuntimeError:
                    pass  # an invalidated capture ends with an error: it has ended all the same
        torch.cuda.set_stream(caller_stream)
        try:
            self.graph.reset()
        except Exception:  # noqa: BLE001 - nothing was instantiated: nothing to free
            pass
        self.graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize(eng.device)
        if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
            torch._C._cuda_clearCublasWorkspaces()

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
