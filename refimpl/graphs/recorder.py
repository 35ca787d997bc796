"""The op recorder both graph engines use: a ``TorchDispatchMode`` that sees every tensor op.

Inside ``record_ops(steps)`` every aten op and custom op (each refimpl kernel is one) arrives once, with the tensor
objects it touched. The recorder refuses what CUDA stream capture refuses (host synchronisation, value-dependent output
shapes) with ``GraphCaptureError``; names every op and whether it launches work at replay (``Graph.kernels()``); and,
with ``steps``, keeps a ``Step`` per op for the CPU emulator to replay.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode
from torch.utils._pytree import tree_flatten, tree_flatten_with_path, tree_unflatten

from .. import _env
from .engine import GraphCaptureError, GraphReplayError

# Ops that need the value of device data on the host (CUDA: a sync, illegal while capturing).
HOST_SYNC_OPS = {
    "aten._local_scalar_dense.default": "reads a tensor value on the host (.item(), int(), bool(): data-dependent branching)",
    "aten.is_nonzero.default": "reads a tensor value on the host (bool(tensor))",
    "aten.equal.default": "torch.equal returns a host bool",
    "aten.allclose.default": "torch.allclose returns a host bool",
}
# Ops whose output shape depends on tensor values.
DATA_DEPENDENT_SHAPE = tuple(
    "aten.nonzero. aten.masked_select. aten._unique aten.unique aten.argwhere. aten.repeat_interleave.Tensor".split()
)
PURE_ALLOC = ("aten.empty.", "aten.empty_like.", "aten.empty_strided.", "aten.new_empty")


def tensors_in(obj: Any) -> list[torch.Tensor]:
    return [x for x in tree_flatten(obj)[0] if isinstance(x, torch.Tensor)]


class Borrowed:
    """A tensor a captured op read (or viewed) in memory the graph did not allocate, held as a CUDA graph holds it: by
    address. A weak reference to its storage, and its dtype, offset, sizes and strides; its owner keeps it alive. At
    replay a storage freed since capture (its owner rebound or released it) or moved (resized) raises
    ``GraphReplayError`` naming the op's argument: a CUDA graph would read freed or re-carved memory there, often
    without an error."""

    __slots__ = ("ref", "ptr", "geometry", "name")

    def __init__(self, t: torch.Tensor, name: str):
        storage = t.untyped_storage()
        self.ref, self.ptr, self.name = StorageWeakRef(storage), storage.data_ptr(), name
        self.geometry = t.dtype, t.device, t.storage_offset(), t.size(), t.stride()

    def check(self, op) -> torch.UntypedStorage:
        """Its storage, alive at the address captured; else ``GraphReplayError`` naming ``op``'s argument."""
        storage = torch.UntypedStorage._new_with_weak_ptr(self.ref.cdata)  # None once freed
        if storage is None or storage.data_ptr() != self.ptr:
            dtype, size = self.geometry[0], self.geometry[3]
            what = f"{op}'s {self.name} ({tuple(size)} {str(dtype).removeprefix('torch.')}, memory the graph did not allocate)"
            if storage is None:
                raise GraphReplayError(f"{what} was freed after capture: keep it alive while the graph can replay (liveness)")
            raise GraphReplayError(f"{what} moved after capture (its storage was resized): the graph reads the old address")
        return storage

    def get(self, op) -> torch.Tensor:
        dtype, device, offset, size, stride = self.geometry
        storage = self.check(op)
        with torch._C._DisableTorchDispatch():  # not an op of the replay (a capture around it, a launch count)
            return torch.empty(0, dtype=dtype, device=device).set_(storage, offset, size, stride)


def borrow_inputs(steps: list["Step"], **host_read) -> list[tuple[Any, Borrowed]]:
    """After capture: every step's arguments in storages the graph did not allocate become ``Borrowed`` (``Step.borrow``,
    which ``host_read`` is passed to); returns ``(op, borrowed)`` once per such storage, the first op that read it (what a
    CUDA graph's replay checks)."""
    own = set().union(*(step.fresh for step in steps))  # the storages the graph allocated
    seen, out = set(), []
    for step in steps:
        step.borrow(own, **host_read)
        for x in step.leaves if step.spec is not None else ():
            if isinstance(x, Borrowed) and x.ref.cdata not in seen:
                seen.add(x.ref.cdata)
                out.append((step.func, x))
    return out


def _arg_name(func, path) -> str:
    """``path`` (into ``(args, kwargs)``) as the op's argument name: ``attn_logits``, ``tensors[1]``."""
    where, key, *rest = path
    names = [a.name for a in func._schema.arguments]
    name = (names[key.idx] if key.idx < len(names) else f"argument {key.idx}") if where.idx == 0 else str(key.key)
    return name + "".join(f"[{k.idx}]" for k in rest if hasattr(k, "idx"))


class Step:
    """One recorded op: ``func(*args, **kwargs)`` and how to redo it at replay."""

    __slots__ = ("func", "args", "kwargs", "outs", "rerun", "copy_back", "fresh", "spec", "leaves")

    def __init__(self, func, args, kwargs, out):
        self.func, self.args, self.kwargs, self.spec = func, args, kwargs, None
        name = str(func)
        ins = tensors_in((args, kwargs))
        inputs = {t.untyped_storage().data_ptr() for t in ins if t.numel()}  # storages read
        self.outs = tensors_in(out)
        aliased = [t.numel() == 0 or t.untyped_storage().data_ptr() in inputs for t in self.outs]
        self.rerun, self.copy_back = True, []
        if name.startswith(PURE_ALLOC):
            self.rerun = False  # an allocation is not a kernel
        elif func._schema.is_mutable:
            pass  # writes its inputs in place: just run again
        elif self.outs and all(aliased):
            self.rerun = False  # a view: the captured view object stays valid
        else:  # a functional op: recompute and write the result into the captured output
            self.copy_back = [i for i, a in enumerate(aliased) if not a]
        # the storages this op made (the graph's own memory), by identity: a 0-element one a later op grows, a lifted
        # constant (`torch.tensor(...)` in the captured code) included
        read = {t.untyped_storage()._cdata for t in ins}
        lifted = name.startswith("aten.lift_fresh")
        self.fresh = {s._cdata for s in (t.untyped_storage() for t in self.outs) if lifted or s._cdata not in read}

    def borrow(self, own: set[int], host_read=lambda x: x.dim() > 0) -> None:
        """After capture: every tensor in a storage outside ``own`` (those the graph made) becomes a ``Borrowed``, named
        by the op's argument; outputs not written back at replay are dropped. Nothing the graph did not allocate stays
        alive through it. Not borrowed: empty tensors (nothing is read) and host tensors ``host_read`` says a replay
        does not read (the emulator's default: 0-d ones, ``t[i] = 1``'s scalar, whose value a CUDA graph bakes at
        capture; the CUDA engine: all but pinned ones, since a CPU op runs at capture only)."""

        def outside(x):
            if not isinstance(x, torch.Tensor) or not x.numel() or (x.device.type == "cpu" and not host_read(x)):
                return False
            return x.untyped_storage()._cdata not in own

        flat, spec = tree_flatten_with_path((self.args, self.kwargs))
        if any(outside(x) for _, x in flat):  # else the step keeps its arguments (the graph's own, or scalars)
            self.leaves = [Borrowed(x, _arg_name(self.func, path)) if outside(x) else x for path, x in flat]
            self.spec, self.args, self.kwargs = spec, None, None
        self.outs = [t if i in self.copy_back else None for i, t in enumerate(self.outs)]

    def replay(self):
        if not self.rerun:
            return
        args, kwargs = self.args, self.kwargs
        if self.spec is not None:  # borrowed inputs: looked up (and checked) at every replay
            args, kwargs = tree_unflatten([x.get(self.func) if isinstance(x, Borrowed) else x for x in self.leaves], self.spec)
        result = self.func(*args, **kwargs)
        if not self.copy_back:
            return
        fresh = tensors_in(result)
        for i in self.copy_back:
            dst, src = self.outs[i], fresh[i]
            if dst.shape != src.shape:
                raise GraphReplayError(f"{self.func} produced shape {tuple(src.shape)} at replay, {tuple(dst.shape)} at capture")
            dst.copy_(src)


def _device_to_host(name: str, args, kwargs) -> bool:
    """A copy from an accelerator tensor into host memory (``.to("cpu")``, ``cpu.copy_(gpu)``)."""
    if name == "aten._to_copy.default":
        dev = kwargs.get("device")
        return dev is not None and torch.device(dev).type == "cpu" and args[0].device.type != "cpu"
    if name == "aten.copy_.default":
        return args[0].device.type == "cpu" and args[1].device.type != "cpu"
    return False


class Recorder(TorchDispatchMode):
    """``with record_ops(steps) as rec:`` records (or, with ``steps=None``, only names in ``rec.names``) the ops run
    inside the block; ``refuse``: raise ``GraphCaptureError`` on what a capture cannot record (host reads, ...);
    ``raw_launches``: a Triton kernel launched outside any torch op is allowed (a CUDA graph records it; only its
    arguments are not among the steps' inputs)."""

    def __init__(self, steps: list[Step] | None = None, refuse: bool = True, raw_launches: bool = False):
        super().__init__()
        self.steps = steps  # None: name the ops only (the CUDA engine, unless it checks liveness)
        self.refuse = refuse  # False: count ops outside any capture (host reads allowed)
        self.raw_launches = raw_launches or steps is None  # a CUDA graph records a raw Triton launch; the emulator not
        self.names: list[tuple[str, bool]] = []  # (op name, launches work at replay)

    def __enter__(self):
        if not self.raw_launches:  # the emulator replays what it recorded, and a raw launch is not recorded
            _env.LAUNCH_CHECKS.append(self._outside_an_op)
        return super().__enter__()

    def __exit__(self, *exc):
        if self._outside_an_op in _env.LAUNCH_CHECKS:
            _env.LAUNCH_CHECKS.remove(self._outside_an_op)
        return super().__exit__(*exc)

    def _outside_an_op(self, kernel):
        """A Triton launch while this recorder is the innermost mode: not inside a torch op (a refimpl kernel is one),
        so nothing records it and the emulator's replay would skip it (a CUDA graph records the launch itself)."""
        if _get_current_dispatch_mode() is self:
            name = f"{getattr(kernel, '__module__', '?')}.{getattr(kernel, '__name__', kernel)}"
            raise GraphCaptureError(
                f"a Triton kernel launched outside any torch op during capture ({name}): the CPU "
                "emulator records torch ops only and would not replay it"
            )

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        if self.refuse:  # what a capture cannot record
            if name in HOST_SYNC_OPS:
                raise GraphCaptureError(f"host synchronisation during capture: {name} {HOST_SYNC_OPS[name]}")
            if name.startswith(DATA_DEPENDENT_SHAPE):
                raise GraphCaptureError(f"data-dependent output shape during capture: {name} (its size needs a host sync)")
            if name.startswith(("aten.index.Tensor", "aten.index_put")) and any(
                t.dtype in (torch.bool, torch.uint8) for t in tensors_in(args[1])
            ):
                raise GraphCaptureError(f"data-dependent output shape during capture: {name} with a boolean mask")
            if _device_to_host(name, args, kwargs):
                raise GraphCaptureError(f"host synchronisation during capture: {name} copies a device tensor to the host")
        out = func(*args, **kwargs)
        step = Step(func, args, kwargs, out)
        self.names.append((name, name not in HOST_SYNC_OPS and step.rerun))  # a host read launches no work at replay
        if self.steps is not None:
            self.steps.append(step)
        return out


record_ops = Recorder  # the context manager both engines open around a capture
