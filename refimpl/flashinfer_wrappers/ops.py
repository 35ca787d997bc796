"""``wrapper.run`` as registered torch custom ops.

The real wrappers launch kernels through their own JIT module, invisible to a ``TorchDispatchMode`` (the CPU graph
emulator, the CUDA engine's op listing). One ``refimpl::fi_*_run`` op per ``run`` makes the call one visible kernel and
lets the emulator replay it: the op finds the wrapper by a handle frozen at capture, as a CUDA graph is bound to the
wrapper it captured. (For the stand-ins, one extra ``copy_``.)
"""

import weakref
from typing import Any

import torch

from ..kernels._op import kernel_op

# weak: the backend's per-bs registry keeps a captured wrapper alive, as long as its graph lives
_WRAPPERS = weakref.WeakValueDictionary()
Tensor = torch.Tensor


def handle_of(wrapper: Any) -> int:
    """A stable integer handle for ``wrapper`` (``id``; valid while the wrapper lives)."""
    h = id(wrapper)
    _WRAPPERS[h] = wrapper
    return h


@kernel_op("refimpl::fi_run", mutates_args=("out",))
def _fi_run(handle: int, q: Tensor, k_cache: Tensor, v_cache: Tensor, out: Tensor) -> None:
    out.copy_(_WRAPPERS[handle].run(q, (k_cache, v_cache)))


@kernel_op("refimpl::fi_mla_run", mutates_args=("out",))
def _fi_mla_run(handle: int, q_nope: Tensor, q_pe: Tensor, ckv: Tensor, kpe: Tensor, out: Tensor) -> None:
    out.copy_(_WRAPPERS[handle].run(q_nope, q_pe, ckv, kpe))


def fi_run(wrapper: Any, q: Tensor, k_cache: Tensor, v_cache: Tensor) -> Tensor:
    """Decode or prefill ``wrapper.run(q, (k, v))`` -> ``[tokens, H, Dv]``."""
    out = q.new_empty(*q.shape[:2], v_cache.shape[-1])
    _fi_run(handle_of(wrapper), q, k_cache, v_cache, out)
    return out


def fi_mla_run(wrapper: Any, q_nope, q_pe, ckv, kpe) -> Tensor:
    """MLA ``wrapper.run(q_nope, q_pe, ckv, kpe)`` -> ``[tokens, H, kv_lora_rank]``."""
    out = torch.empty_like(q_nope)
    _fi_mla_run(handle_of(wrapper), q_nope, q_pe, ckv, kpe, out)
    return out
