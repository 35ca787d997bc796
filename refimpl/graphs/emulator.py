"""A CPU emulator of CUDA graphs: record the tensor ops of a step, replay them without Python.

Why: CI and most readers have no GPU, yet every lesson here is about capture and replay. The
emulator gives the same contract as ``torch.cuda.CUDAGraph`` on CPU tensors (design §3):

1. **Record.** ``capture(fn)`` runs ``fn`` once under a ``TorchDispatchMode`` that logs every
   aten/custom op with the exact tensor objects it touched. A registered custom op (every
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
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .engine import Graph, GraphCaptureError, GraphEngine

# Ops that need the value of device data on the host (CUDA: a sync, illegal while capturing).
_HOST_SYNC_OPS = {
    "aten._local_scalar_dense.default": "reads a tensor value on the host (.item(), int(), bool(): "
    "data-dependent branching)",
    "aten.is_nonzero.default": "reads a tensor value on the host (bool(tensor))",
    "aten.equal.default": "torch.equal returns a host bool",
    "aten.allclose.default": "torch.allclose returns a host bool",
}
# Ops whose output shape depends on tensor values.
_DATA_DEPENDENT_SHAPE = (
    "aten.nonzero.",
    "aten.masked_select.",
    "aten._unique",
    "aten.unique",
    "aten.repeat_interleave.Tensor",
    "aten.argwhere.",
)
_PURE_ALLOC = ("aten.empty.", "aten.empty_like.", "aten.empty_strided.", "aten.new_empty")


def _tensors(obj: Any) -> list[torch.Tensor]:
    return [x for x in tree_flatten(obj)[0] if isinstance(x, torch.Tensor)]


def _storage_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class _Step:
    """One recorded op: ``func(*args, **kwargs)`` and how to redo it at replay."""

    __slots__ = ("func", "args", "kwargs", "outs", "rerun", "copy_back")

    def __init__(self, func, args, kwargs, out):
        self.func, self.args, self.kwargs = func, args, kwargs
        name = str(func)
        inputs = {_storage_ptr(t) for t in _tensors((args, kwargs)) if t.numel()}
        self.outs = _tensors(out)
        aliased = [t.numel() == 0 or _storage_ptr(t) in inputs for t in self.outs]
        mutable = func._schema.is_mutable
        if name.startswith(_PURE_ALLOC):
            self.rerun, self.copy_back = False, []  # an allocation is not a kernel
        elif mutable:
            self.rerun, self.copy_back = True, []  # writes its inputs in place: just run again
        elif self.outs and all(aliased):
            self.rerun, self.copy_back = False, []  # a view: the captured view object stays valid
        else:
            # a functional op: recompute and write the result into the captured output
            self.rerun = True
            self.copy_back = [i for i, a in enumerate(aliased) if not a]

    def replay(self) -> None:
        if not self.rerun:
            return
        result = self.func(*self.args, **self.kwargs)
        if not self.copy_back:
            return
        fresh = _tensors(result)
        for i in self.copy_back:
            dst, src = self.outs[i], fresh[i]
            if dst.shape != src.shape:
                raise GraphCaptureError(
                    f"{self.func} produced shape {tuple(src.shape)} at replay, "
                    f"{tuple(dst.shape)} at capture"
                )
            dst.copy_(src)


class _Recorder(TorchDispatchMode):
    def __init__(self, steps: list[_Step] | None):
        super().__init__()
        self.steps = steps  # None: list op names only (used by the CUDA engine)
        self.names: list[tuple[str, bool]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        if name in _HOST_SYNC_OPS:
            raise GraphCaptureError(
                f"host synchronisation during capture: {name} {_HOST_SYNC_OPS[name]}"
            )
        if name.startswith(_DATA_DEPENDENT_SHAPE):
            raise GraphCaptureError(
                f"data-dependent output shape during capture: {name} (its size needs a host sync)"
            )
        if name.startswith(("aten.index.Tensor", "aten.index_put")) and any(
            t.dtype in (torch.bool, torch.uint8) for t in _tensors(args[1])
        ):
            raise GraphCaptureError(
                f"data-dependent output shape during capture: {name} with a boolean mask"
            )
        out = func(*args, **kwargs)
        step = _Step(func, args, kwargs, out)
        self.names.append((name, step.rerun))  # rerun == launches work at replay
        if self.steps is not None:
            self.steps.append(step)
        return out


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


@contextlib.contextmanager
def record_ops(steps: list[_Step] | None = None):
    """Record (or, with ``steps=None``, only name) the ops run inside the block."""
    rec = _Recorder(steps)
    with rec:
        yield rec


class EmulatedGraph(Graph):
    engine_name = "cpu-emulator"

    def __init__(self) -> None:
        super().__init__()
        self._steps: list[_Step] = []

    def capture(self, fn: Callable[[], Any]) -> Any:
        if self.captured:
            raise GraphCaptureError("this graph was already captured; make a new one")
        steps: list[_Step] = []
        with (
            torch.inference_mode(False),
            torch.no_grad(),
            refuse_host_reads(),
            record_ops(steps) as rec,
        ):
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
