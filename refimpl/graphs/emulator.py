"""A CPU emulator of CUDA graphs: record the tensor ops of a step, replay them without Python.

CI and most readers have no GPU, yet every lesson here is about capture and replay. The emulator keeps
``torch.cuda.CUDAGraph``'s contract on CPU tensors:

1. **Record.** ``capture(fn)`` runs ``fn`` once under the op recorder (``recorder.py``, shared with the CUDA engine),
   which logs every aten/custom op with the tensor objects it touched (a refimpl kernel is one custom op).
2. **Replay on captured storage.** ``replay()`` re-executes the log: an op that made a fresh tensor at capture writes
   its new result *into that same tensor* (same "address"); an op that mutates its inputs runs again on the same
   memory; views and allocations are not re-run.
3. **Frozen Python.** Scalars, shapes and branches are whatever they were at capture.
4. **No host synchronisation.** ``.item()``, ``bool(tensor)``, ``.tolist()``, ``.cpu()``, ``torch.equal`` and
   value-dependent shapes (``nonzero``, ``unique``...) raise ``GraphCaptureError`` during capture, as CUDA's does.
5. **Fresh tensors are invisible.** Rebinding ``self.buf = new_tensor`` after capture changes nothing at replay: the
   "stale bound buffer" bug class of a GPU (while something still holds the old tensor: 6).
6. **Addresses, not references.** What the graph did not allocate (the backend's buffers, the runner's inputs, the KV
   cache, the weights) it holds by address (``recorder.Borrowed``): freed after capture (nothing holds it any more)
   or moved (its storage resized), a replay raises ``GraphReplayError`` naming the op's argument, where a CUDA graph
   would read that memory. Not covered: what an op reaches other than through its arguments (a FlashInfer stand-in
   wrapper's bound buffers, looked up by handle, ``refimpl/flashinfer_wrappers/ops.py``).

Where it differs from a CUDA graph (``tests/test_emulator_parity.py`` runs both): capture
*executes* the step here; the graph's own allocations (intermediates, outputs) stay alive here and are never shared,
where graphs sharing one CUDA pool may overwrite each other's outputs; random ops draw fresh values at each replay
here, from offsets fixed at capture on CUDA.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from unittest import mock

import torch

from .._env import resolve_device
from .engine import Graph, GraphCaptureError, GraphEngine
from .recorder import Step, borrow_inputs, record_ops


def _refuse(what: str):
    def method(self, *a, **k):
        raise GraphCaptureError(f"host synchronisation during capture: Tensor.{what}()")

    return method


def refuse_host_reads():
    """Make ``Tensor.tolist/cpu/numpy`` raise: on CPU they do not reach the dispatcher."""
    return mock.patch.multiple(torch.Tensor, **{m: _refuse(m) for m in ("tolist", "cpu", "numpy")})


class EmulatedGraph(Graph):
    engine_name = "cpu-emulator"

    def __init__(self):
        super().__init__()
        self._steps: list[Step] = []

    def capture(self, fn: Callable[[], Any]) -> Any:
        if self.captured:
            raise GraphCaptureError("this graph was already captured; make a new one")
        with torch.inference_mode(False), torch.no_grad(), refuse_host_reads(), record_ops([]) as rec:
            out = fn()
        self._steps, self._op_log, self.captured = rec.steps, rec.names, True  # (a refused capture keeps none)
        borrow_inputs(self._steps)  # each step looks its borrowed inputs up (and checks them) at replay
        return out

    def replay(self):
        self._check_captured()
        with torch.no_grad():
            for step in self._steps:
                step.replay()

    def __len__(self) -> int:
        return len(self._steps)


class CPUEmulatorEngine(GraphEngine):
    """The emulator engine: CPU tensors where Triton runs interpreted; on a CUDA machine the same op log runs on CUDA
    tensors (``"emulator-cuda"``), so a GPU run can compare it with real graphs."""

    def __init__(self, device: str | torch.device | None = None):
        self.device = resolve_device(device)
        self.name = "cpu-emulator" if self.device.type == "cpu" else f"emulator-{self.device.type}"

    def new_graph(self) -> EmulatedGraph:
        return EmulatedGraph()

    def warmup(self, fn, n: int):
        """One eager run before capture, not SGLang's two: the second is for what a GPU initialises lazily (cuBLAS
        handles, Triton's compiles, the allocator's pools), which the emulator has none of. On the interpreter a step
        costs seconds, and every capture in the test suite pays it."""
        super().warmup(fn, min(n, 1))
