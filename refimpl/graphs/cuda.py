"""The real thing: ``torch.cuda.CUDAGraph`` behind the same contract as the emulator.

What it adds to a bare ``torch.cuda.graph`` block (PyTorch "CUDA Graphs" notes, SGLang's ``CudaGraphRunner.capture``,
[facts#capture]): warm-ups on a side stream (lazy initialisation is not captured); one memory pool shared by every graph
(largest batch captured first); op names from the shared recorder, so ``kernels()`` works on both engines; a failed
capture contained (``_discard``), so the next capture and replay succeed; no garbage collection during capture; every
graph kept as long as its engine. That last rule is for cuBLAS: PyTorch caches one cuBLAS workspace per (handle,
stream), every graph captured on the engine's stream bakes that workspace's address into its GEMMs, and destroying any
one of those graphs frees the workspace of all of them (``CUDAGraph::reset`` clears the capture stream's workspaces,
pytorch/pytorch#193402). A short-lived graph (the checker's glue graph, a refused capture) dropped while the step graphs
live made their next replay's split-K GEMM write to freed memory: ``cudaErrorIllegalAddress`` on the H200.

``liveness=True`` (the checker's and the fuzzer's engines) adds the emulator's rule 6: the tensors the captured ops read
in memory the graph did not allocate (``recorder.borrow_inputs``: a backend's buffers, the runner's inputs, the KV
cache, the weights; a refimpl kernel's arguments included, as one custom op) are held by weak reference, and a replay
after one was freed or its storage moved raises ``GraphReplayError`` naming the op's argument instead of reading that
memory. Not covered: what a kernel launched outside any torch op reads (SGLang's index kernels; FlashInfer 0.7.2's, whose
custom-op registration is a no-op). PyTorch 2.13's
``torch.cuda.graph(check_input_liveness=True)`` is the same rule by the same means (a dispatch mode during capture, a
check before each replay) with the same blind spot (its docstring: kernels launched outside PyTorch); the device's
torch 2.11 has no such flag, and the emulator needs the rule without CUDA, so refimpl keeps its own. It costs a weak-reference
lookup per borrowed storage at every replay, so the bench and the course's engines run without it.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import torch

from .engine import Graph, GraphCaptureError, GraphEngine
from .recorder import borrow_inputs, record_ops


class CUDAGraphHandle(Graph):
    engine_name = "cuda"

    def __init__(self, engine: "CUDAGraphEngine"):
        super().__init__()
        self.engine = engine
        self.graph = torch.cuda.CUDAGraph()
        self._borrowed = []  # liveness: (op, recorder.Borrowed) per storage the graph reads and did not allocate

    def capture(self, fn: Callable[[], Any]) -> Any:
        if self.captured:
            raise GraphCaptureError("this graph was already captured; make a new one")
        eng = self.engine
        torch.cuda.synchronize(eng.device)
        eng.graphs.append(self.graph)  # destroyed with the engine, never before (module docstring)
        caller_stream = torch.cuda.current_stream(eng.device)
        # No garbage collection while capturing: collecting an old graph frees pool memory
        # (cudaFree), which invalidates the capture (seen on the H200 as random cuBLAS failures).
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            # the recorder opens inside the graph context, so torch.cuda.graph's own set-up ops
            # (the RNG seed/offset fills) are not listed among the program's kernels
            with (
                torch.cuda.graph(self.graph, pool=eng.pool, stream=eng.stream),
                torch.no_grad(),  # as the emulator captures
                record_ops([] if eng.liveness else None, raw_launches=True) as rec,
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
        self._op_log, self.captured = rec.names, True
        # weak references only (the steps go); a CPU op ran at capture only: of host memory, a replay reads pinned
        # buffers (a host-to-device copy's source)
        self._borrowed = borrow_inputs(rec.steps, host_read=torch.Tensor.is_pinned) if eng.liveness else []
        return out

    def _discard(self, caller_stream):
        """After any error inside capture, leave the process as if it never began: capture ended, the caller's stream
        current, the half-recorded graph set aside. It is not reset: its reset would free the cuBLAS workspace the
        engine's other graphs replay with (module docstring); the engine keeps it."""
        eng = self.engine
        with torch.cuda.stream(eng.stream):
            if torch.cuda.is_current_stream_capturing():
                try:
                    self.graph.capture_end()
                except RuntimeError:
                    pass  # an invalidated capture ends with an error: it has ended all the same
        torch.cuda.set_stream(caller_stream)
        self.graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize(eng.device)

    def replay(self):
        self._check_captured()
        for op, borrowed in self._borrowed:
            borrowed.check(op)
        self.graph.replay()


class CUDAGraphEngine(GraphEngine):
    name = "cuda"

    def __init__(self, device: str | torch.device = "cuda", liveness: bool = False):
        if not torch.cuda.is_available():
            raise RuntimeError("CUDAGraphEngine needs a CUDA device; use CPUEmulatorEngine")
        dev = torch.device(device)
        # an explicit index ("cuda:0"): tensors report one and devices are compared exactly
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        self.device = dev
        self.stream = torch.cuda.Stream(self.device)
        self.pool = None  # set by the first capture (graph.pool()), shared afterwards
        self.graphs: list[torch.cuda.CUDAGraph] = []  # every graph begun here, alive as long as the engine
        self.liveness = liveness  # a replay checks that what its graph reads and did not allocate is alive (docstring)

    def new_graph(self) -> CUDAGraphHandle:
        return CUDAGraphHandle(self)

    def warmup(self, fn: Callable[[], Any], n: int):
        cur = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(cur)
        with torch.cuda.stream(self.stream):
            for _ in range(n):
                fn()
        cur.wait_stream(self.stream)
        torch.cuda.synchronize(self.device)

    def synchronize(self):
        torch.cuda.synchronize(self.device)

    def memory_in_use(self) -> int:
        return torch.cuda.memory_reserved(self.device)
