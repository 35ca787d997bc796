"""``kernel_op``: a ``torch.library.custom_op`` that skips the dispatcher when nothing watches it.

A ``TorchDispatchMode`` (the CPU emulator's recorder, the tests' op counters) sees one ``refimpl.<name>.default`` per
launch, but the custom-op path costs 25-40 µs of Python per call (H200 replay hook: 41 µs against 16 µs raw), so the
callable runs the function directly when the dispatch-mode stack is empty; both routes run the same body.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence

import torch
import triton

_stack_len = torch._C._len_torch_dispatch_stack


def kernel_op(name: str, mutates_args: Sequence[str]) -> Callable[[Callable], Callable]:
    """Register ``fn`` (it returns nothing: it writes its ``mutates_args``) as the custom op ``name`` with a no-op fake
    (meta) kernel; return the fast-path callable, with ``.op`` the registered op and ``.fn`` the plain function."""

    def wrap(fn: Callable) -> Callable:
        op = torch.library.custom_op(name, fn, mutates_args=mutates_args)
        op.register_fake(lambda *args, **kwargs: None)

        @functools.wraps(fn)
        def call(*args, **kwargs):  # nothing watches the dispatcher: launch directly (fn), else through it (op)
            return (fn if _stack_len() == 0 and not torch.compiler.is_compiling() else op)(*args, **kwargs)

        call.op, call.fn = op, fn
        return call

    return wrap


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` on the host. ``triton.cdiv`` and ``triton.next_power_of_2`` are Triton ``ConstexprFunction`` s:
    about 3 µs a call from Python (against 0.04 here), and a replay's launch wrappers call them several times."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of 2 >= ``n`` (0 for 0), as ``triton.next_power_of_2``, on the host (why: ``cdiv``)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def no_specialisation(args: int, pointers: int) -> dict:
    """``triton.jit`` options for a kernel ``direct_launch`` serves: its first ``args`` arguments (``pointers`` of them
    pointers, first) never specialise one compiled kernel (Triton otherwise compiles a variant per int equal to 1 or
    divisible by 16 and per 16-byte pointer alignment, and the one cached kernel would be wrong for the others)."""
    opts = {"do_not_specialize": range(args)}
    if "do_not_specialize_on_alignment" in inspect.signature(triton.jit).parameters:
        opts["do_not_specialize_on_alignment"] = range(pointers)
    return opts


# compiled kernels by key, launched directly by ``direct_launch``: Triton's JITFunction.run binds every argument in Python
# per call (H200: 26 µs of host for batch_check's 29 arguments, 7.5 µs direct)
_COMPILED: dict = {}
_RUNTIME = getattr(getattr(triton, "knobs", None), "runtime", None)  # where Triton >= 3.4 keeps its launch hooks


def _hooked() -> bool:
    """A launch hook (a profiler's) is set: each is None or a chain whose ``.calls`` may be empty (Triton >= 3.4)."""
    if _RUNTIME is None:
        return False
    enter, leave = _RUNTIME.launch_enter_hook, _RUNTIME.launch_exit_hook
    return (enter is not None and bool(getattr(enter, "calls", True))) or (
        leave is not None and bool(getattr(leave, "calls", True))
    )


def direct_launch(fn, grid: tuple[int, ...], args: tuple, key: tuple, device: torch.device) -> None:
    """Launch the ``@triton.jit`` ``fn`` over ``grid`` with ``args`` (constexprs included). The first launch per ``key``
    compiles through ``fn[grid]``; later ones on CUDA call the compiled kernel directly, on the current stream. ``fn``
    must not specialise on its values (``do_not_specialize``), since one compiled kernel serves every later call of a
    key. A launch hook (a profiler's) set: always through ``fn[grid]``."""
    kernel = _COMPILED.get(key)
    if kernel is None or _hooked():  # first launch or hooked
        kernel = fn[grid](*args)
        if device.type == "cuda" and all(hasattr(kernel, a) for a in ("run", "function", "packed_metadata")):
            _COMPILED[key] = kernel
        return
    stream = torch._C._cuda_getCurrentRawStream(device.index)  # the handle, without parsing the device each call
    kernel.run(*grid, *(1,) * (3 - len(grid)), stream, kernel.function, kernel.packed_metadata, None, None, None, *args)
