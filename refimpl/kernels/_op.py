"""``kernel_op``: a ``torch.library.custom_op`` that skips the dispatcher when nothing watches it.

A ``TorchDispatchMode`` (the CPU emulator's recorder, the tests' op counters) sees one ``refimpl.<name>.default`` per
launch, but the custom-op path costs 25-40 µs of Python per call (H200 replay hook: 41 µs against 16 µs raw), so the
callable runs the function directly when the dispatch-mode stack is empty; both routes run the same body.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch

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
