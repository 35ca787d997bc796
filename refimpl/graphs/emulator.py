"""A CPU emulator of CUDA graphs: record the tensor ops of a step, replay them without Python.

Why: CI and most readers have no GPU, yet every lesson here is about capture and replay. The
emulator gives the same contract as ``torch.cuda.CUDAGraph`` on CPU tensors:

1. **Record.** ``capture(fn)`` runs ``fn`` once under the op recorder (``recorder.py``, a
   ``TorchDispatchMode`` shared with the CUDA engine) that logs every aten/custom op with the
   exact tensor objects it touched. A registered custom op (every
   refimpl kernel) arrives as one op; the ops inside it are not logged.
2. **Replay on captured storage.** ``replay()`` re-executes the log. An op that produced a fresh
   tensor at capture has its new result copied *into that same tensor* (same "address"); an op
   that mutates its inputs (``copy_``, ``index_copy_``, a kernel writing ``out``) simply runs
   again on the same objects; views and pure allocations (``empty``) are not re-run: on a GPU
   they are not kernels either.
3. **Frozen Python.** Python scalars, shapes and the branches taken are whatever they were at
   capture: nothing from ``fn`` runs at replay.
4. **No host synchronisation.** ``.item()``, ``bool(tensor)`` (data-dependent branching),
   ``.tolist()``, ``.cpu()``, ``.numpy()``, ``torch.equal`` and data-dependent shapes
   (``nonzero``, ``masked_select``, ``unique``...) raise ``GraphCaptureError`` during capture,
   as CUDA stream capture does. In the emulator every tensor counts as device memory.
5. **Fresh tensors are invisible.** A tensor allocated after capture is not in the log, so
   replay never reads it: rebinding ``self.buf = new_tensor`` after capture changes nothing,
   exactly the "stale bound buffer" bug class on a GPU.

Where the emulator and a CUDA graph differ (``tests/test_emulator_parity.py`` runs the same
programs under both): capture *executes* the step here (its writes happen once and the returned
outputs are valid), while CUDA capture only records (outputs are valid after the first replay);
the emulator keeps every captured tensor alive, while a CUDA graph keeps only addresses (a freed
rebound buffer's block may be reused by another tensor); graphs sharing one CUDA pool may
overwrite each other's outputs, here never; a random op draws fresh values from the live
generator at each replay here, from per-replay seed offsets fixed at capture on CUDA.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from .engine import Graph, GraphCaptureError, GraphEngine
from .recorder import Step, record_ops


def _refuse(what: str):
    def method(self, *a, **k):
        raise GraphCaptureError(f"host synchronisation during capture: Tensor.{what}()")

    return method


@contextlib.contextmanager
def refuse_host_reads():
    """Make ``Tensor.tolist/cpu/numpy`` raise: on CPU they do not reach the dispatcher."""
    saved = {m: getattr(torch.Tensor, m) for m in ("tolist", "cpu", "numpy")}
    try:
        for m in saved:
            setattr(torch.Tensor, m, _refuse(m))
        yield
    finally:
        for m, f in saved.items():
            setattr(torch.Tensor, m, f)


class EmulatedGraph(Graph):
    engine_name = "cpu-emulator"

    def __init__(self) -> None:
        super().__init__()
        self._steps: list[Step] = []

    def capture(self, fn: Callable[[], Any]) -> Any:
        if self.captured:
            raise GraphCaptureError("this graph was already captured; make a new one")
        steps: list[Step] = []
        with torch.inference_mode(False), torch.no_grad(), refuse_host_reads(), record_ops(steps) as rec:
            out = fn()
        self._steps = steps
        self._op_log = rec.names
        self.captured = True
        return out

    def replay(self) -> None:
        self._check_captured()
        with torch.no_grad():
            for step in self._steps:
                step.replay()

    def __len__(self) -> int:
        return len(self._steps)


class CPUEmulatorEngine(GraphEngine):
    """The emulator engine. Its tensors live on CPU wherever Triton runs interpreted (no CUDA).

    On a CUDA machine Triton kernels cannot run on CPU tensors, so the same emulator runs on
    CUDA tensors there (``name == "emulator-cuda"``): recording and replaying the op log is
    device-agnostic, which lets a GPU run compare the emulator with real CUDA graphs.
    """

    def __init__(self, device: str | torch.device | None = None) -> None:
        from .._env import default_device

        self.device = torch.device(device) if device is not None else default_device()
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.name = "cpu-emulator" if self.device.type == "cpu" else f"emulator-{self.device.type}"

    def new_graph(self) -> EmulatedGraph:
        return EmulatedGraph()
