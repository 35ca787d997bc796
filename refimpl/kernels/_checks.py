"""Argument checks every kernel wrapper shares: shapes, dtypes, devices and Python scalars, never a tensor *value* (a host
read: the wrappers run inside captured graphs). A refusal is a ``ValueError`` (``TypeError`` for a non-tensor) naming
the value and the rule.
"""

from __future__ import annotations

import math

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)
MASK_DTYPES = (torch.bool, torch.uint8)


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def check_tensor(
    t, name: str, dtypes: tuple, ndim: int | None = None, device: torch.device | None = None, *, min_len: int = 0
) -> None:
    """A tensor of one of ``dtypes``, ``ndim``-D, last dim contiguous, on ``device``. Plain ``if``s: a message is only
    formatted for a refusal (replay hooks call this for every argument)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name}.dtype={t.dtype}: must be one of {' / '.join(map(str, dtypes))}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}.shape={tuple(t.shape)}: must be {ndim}-D")
    if t.dim() and t.numel() and t.stride(-1) != 1:
        raise ValueError(f"{name}.stride(-1)={t.stride(-1)}: last dim must be contiguous")
    if t.dim() and t.shape[0] < min_len:
        raise ValueError(f"{name}.shape[0]={t.shape[0]}: must be >= {min_len}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}.device={t.device}: must match {device}")


def check_pool_inputs(req_to_token, req_pool_indices, lens, lens_name: str, kv_start_idx=None) -> tuple:
    """What reading the request pool needs: ``lens [bs]``, ``req_to_token [pool, L]``, ``req_pool_indices [>= bs]``,
    ``kv_start_idx [>= bs]`` (optional), int32 / int64, on lens' device. Returns ``(bs, device)``."""
    check_tensor(lens, lens_name, INDEX_DTYPES, 1)
    bs, dev = lens.shape[0], lens.device
    check_tensor(req_to_token, "req_to_token", INDEX_DTYPES, 2, dev)
    check_tensor(req_pool_indices, "req_pool_indices", INDEX_DTYPES, 1, dev, min_len=bs)
    if kv_start_idx is not None:
        check_tensor(kv_start_idx, "kv_start_idx", INDEX_DTYPES, 1, dev, min_len=bs)
    return bs, dev


def check_int(value, name: str, low: int) -> None:
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= low):  # the message only on a refusal
        raise ValueError(f"{name}={value!r}: must be an int >= {low}")


def check_float(value, name: str) -> None:
    check(
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
        f"{name}={value!r}: must be a finite Python float (a tensor would need a host read)",
    )


def check_paged_qkvo(q, k, v, o, names=("q", "k_buffer", "v_buffer", "o")) -> tuple[int, ...]:
    """``q [T, H, D]``, ``k [slots, Hkv, D]``, ``v [slots, Hkv, Dv]``, ``o [T, H, Dv]`` (GQA: Hkv divides H), float, one
    device. Returns ``(T, H, Hkv, D, Dv)``."""
    nq, nk, nv, no = names
    check_tensor(q, nq, FLOAT_DTYPES, 3)
    for name, t in zip(names[1:], (k, v, o)):
        check_tensor(t, name, FLOAT_DTYPES, 3, q.device)
    (rows, heads, dim), (slots, kv_heads, k_dim), dv = q.shape, k.shape, v.shape[2]
    check(kv_heads >= 1 and heads % kv_heads == 0, f"{nk}.shape[1]={kv_heads}: must divide {nq}.shape[1]={heads} (GQA groups)")
    check(k_dim == dim, f"{nk}.shape[2]={k_dim}: must equal {nq}.shape[2]={dim}")
    check(v.shape[:2] == (slots, kv_heads), f"{nv}.shape={tuple(v.shape)}: must start with {(slots, kv_heads)} like {nk}")
    check(o.shape == (rows, heads, dv), f"{no}.shape={tuple(o.shape)}: must be {(rows, heads, dv)}")
    return rows, heads, kv_heads, dim, dv


def check_mask(custom_mask, mask_indptr, bs: int, device: torch.device) -> None:
    """A flattened bool / uint8 ``custom_mask`` with ``mask_indptr [>= bs+1]``, or neither."""
    if (custom_mask is None) != (mask_indptr is None):
        raise ValueError(
            f"custom_mask is {'None' if custom_mask is None else 'set'} but mask_indptr is {'None' if mask_indptr is None else 'set'}: pass both or neither"
        )
    if custom_mask is not None:
        check_tensor(custom_mask, "custom_mask", MASK_DTYPES, 1, device, min_len=1)
        check_tensor(mask_indptr, "mask_indptr", INDEX_DTYPES, 1, device, min_len=bs + 1)
