"""The FlashInfer layer: real flashinfer wrappers on a GPU, stand-ins (:mod:`.standin`) everywhere else.

:func:`flashinfer_available` (None, or why not), :func:`wrapper_classes` (the three paged wrapper
classes under flashinfer's names), :func:`make_workspace` (their shared float workspace); :mod:`.fast_plan`
(the graph-path re-plan without a device-to-host copy); :mod:`.ops` (``wrapper.run`` as one custom op);
:func:`count_plans` (the ``plan()`` calls a backend makes, which a metadata glue graph cannot hold).
Importing this package never imports flashinfer: the functions do, lazily.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, fields, replace

import torch
from torch.utils._python_dispatch import _disable_current_modes

from . import standin
from .standin import is_standin, read_partition, set_kv_window  # noqa: F401  (re-exported)

REAL_WORKSPACE_BYTES = 128 * 1024 * 1024  # flashinfer's recommended float workspace
STANDIN_WORKSPACE_BYTES = 1024 * 1024  # the stand-ins never touch it
REAL_DTYPES = (torch.float16, torch.bfloat16)  # what flashinfer's kernels are compiled for


@dataclass(frozen=True)
class FlashInferClasses:
    """The three wrapper classes a backend builds, under their flashinfer names."""

    BatchDecodeWithPagedKVCacheWrapper: type
    BatchPrefillWithPagedKVCacheWrapper: type
    BatchMLAPagedAttentionWrapper: type
    real: bool  # True: flashinfer's own classes
    reason: str | None = None  # why the stand-ins were chosen (None when real or asked for)

    @classmethod
    def _of(cls, module, real: bool) -> FlashInferClasses:  # module: flashinfer or .standin
        return cls(*(getattr(module, f.name) for f in fields(cls)[:3]), real)


_STANDINS = FlashInferClasses._of(standin, False)


@functools.cache
def _import_error():
    try:
        import flashinfer  # noqa: F401
    except Exception as e:  # ImportError, or a broken install failing at import time
        return f"flashinfer does not import: {type(e).__name__}: {e}"


def flashinfer_available() -> str | None:
    """``None`` if the real flashinfer imports and CUDA is available, else the reason."""
    return _import_error() if torch.cuda.is_available() else "CUDA is not available"


def real_wrapper_classes() -> FlashInferClasses:
    """flashinfer's own classes (they import on CPU; constructing them needs CUDA); ImportError if not."""
    if (err := _import_error()) is not None:
        raise ImportError(err)
    import flashinfer

    return FlashInferClasses._of(flashinfer, True)


def wrapper_classes(prefer_real: bool = True, dtype: torch.dtype | None = None) -> FlashInferClasses:
    """The real classes when ``prefer_real``, :func:`flashinfer_available` is None and ``dtype`` (the model's) has
    flashinfer kernels; else the stand-ins, whose ``reason`` says why when real ones were preferred (flashinfer has no
    float32 attention kernels: the stand-ins serve it, on a GPU too)."""
    if not prefer_real:
        return _STANDINS
    why = flashinfer_available()
    if why is None and dtype is not None and dtype not in REAL_DTYPES:
        why = f"flashinfer has no {str(dtype).removeprefix('torch.')} kernels (float16 / bfloat16)"
    return real_wrapper_classes() if why is None else replace(_STANDINS, reason=why)


def make_workspace(device: torch.device | str, size_bytes: int | None = None, *, real: bool | None = None):
    """A zeroed uint8 float workspace on ``device`` (flashinfer needs it zero before first use): by default 128 MiB when
    the real library will use it (``real``, default: a CUDA device and flashinfer available), else 1 MiB."""
    if size_bytes is None:
        if real is None:
            real = torch.device(device).type == "cuda" and flashinfer_available() is None
        size_bytes = REAL_WORKSPACE_BYTES if real else STANDIN_WORKSPACE_BYTES
    if size_bytes < 1:
        raise ValueError(f"size_bytes={size_bytes}: must be >= 1")
    return torch.zeros(size_bytes, dtype=torch.uint8, device=device)


_LEAVES = (int, float, str, bytes, type(None), torch.Tensor, torch.dtype, torch.device, type)


def _wrappers(obj, seen, depth=0):
    """The flashinfer wrappers (real or stand-in) reachable from a backend: its attributes, their lists / dicts /
    dataclasses, its step backends; never the world (its allocator lists hold millions of ints)."""
    if isinstance(obj, _LEAVES) or id(obj) in seen or depth > 6 or hasattr(obj, "req_to_token_pool"):
        return
    seen.add(id(obj))
    if is_standin(obj) or type(obj).__module__.startswith("flashinfer"):
        if hasattr(obj, "plan"):
            yield obj
        return
    if isinstance(obj, (list, tuple)):
        children = obj if obj and not isinstance(obj[0], _LEAVES) else ()
    else:
        children = (obj if isinstance(obj, dict) else getattr(obj, "__dict__", {})).values()
    for child in children:
        yield from _wrappers(child, seen, depth + 1)


def plan_state(backend) -> dict[str, torch.Tensor]:
    """What the last plan of each wrapper ``backend`` holds, by the wrapper's position: its plan info (the work
    partition's host summary), for a stand-in the planned lengths, and the integer inputs of its last plan calls made
    inside :func:`count_plans` (in CUDA-graph mode flashinfer's plan info is offsets fixed by the batch size: only the
    inputs tell one plan from another). Verdict (e) compares a split hook's host phase through it: the bound buffers say
    nothing of the plan."""
    out = {}
    for i, w in enumerate(_wrappers(backend, set())):
        for name, inputs in w.__dict__.get("_planned_from", {}).items():
            out[f"plan[{i}].{name}"] = inputs
        if (info := getattr(w, "_plan_info", None)) is None:
            continue
        try:
            out[f"plan[{i}].info"] = torch.tensor([int(x) for x in info], device="cpu")  # (never an ambient device)
        except (TypeError, ValueError):  # a plan info that is not a sequence of ints: not compared
            continue
        if is_standin(w):
            out[f"plan[{i}].q_len"], out[f"plan[{i}].kv_len"] = (t.cpu() for t in read_partition(w))
    return out


def _int_inputs(args, kw) -> torch.Tensor:
    """The integer values a plan call was given (ints, integer and bool tensors but the uint8 workspaces), in order,
    as one int64 tensor on the host."""
    parts = []
    for a in (*args, *kw.values()):
        if isinstance(a, torch.Tensor) and (a.dtype == torch.bool or (a.dtype != torch.uint8 and not a.is_floating_point())):
            parts.append(a.detach().reshape(-1).to("cpu", torch.int64))
        elif isinstance(a, int):
            parts.append(torch.tensor([int(a)], device="cpu"))
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64, device="cpu")


def _counted(fn, calls, w=None, name="plan"):
    def counted(*args, **kw):
        calls[0] += 1
        if w is not None and not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
            if name == "plan":  # a wrapper's plan: what its kernel module's scheduling records next belongs to it
                w._planned_from = {}
            with _disable_current_modes():  # (never an op of a graph the emulator records)
                w.__dict__.setdefault("_planned_from", {})[name] = _int_inputs(args, kw)
        return fn(*args, **kw)

    return counted


class _CountedModule:
    """A wrapper's kernel module whose ``plan`` / ``plan_with_staged_workspace_bytes`` (flashinfer 0.7.2's MLA: the host
    scheduling every plan ends in, fast ones included) count, and record their inputs on the wrapper."""

    def __init__(self, module, calls, w):
        self._module, self._calls, self._w = module, calls, w

    def __getattr__(self, name):
        attr = getattr(self._module, name)
        return _counted(attr, self._calls, self._w, f"module.{name}") if name.startswith("plan") else attr


@contextlib.contextmanager
def count_plans(backend):
    """``calls[0]`` > 0 iff the block planned a wrapper ``backend`` holds: called its ``plan()``, or its kernel module's
    scheduling directly (``fast_prefill_plan``). A full plan may count twice."""
    calls, shadowed = [0], []
    for w in _wrappers(backend, set()):
        own = w.__dict__.get("plan")  # a fast plan installs itself as an instance attribute
        w.plan, module = _counted(w.plan, calls, w), getattr(w, "_cached_module", None)
        if module is not None:
            w._cached_module = _CountedModule(module, calls, w)
        shadowed.append((w, own, module))
    try:
        yield calls
    finally:
        for w, own, module in shadowed:
            if own is None:
                del w.plan
            else:
                w.plan = own
            if isinstance(getattr(w, "_cached_module", None), _CountedModule):  # a full plan may have chosen another
                w._cached_module = module
