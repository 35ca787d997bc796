"""The bounds guard: on the checker's and the fuzzer's runs, metadata that points outside a buffer is a finding, not a
crash.

An attention kernel reads a backend's metadata as addresses: a CSR ``kv_indptr`` / ``kv_indices`` (token slots of the
KV cache) or a block table (pages). One wrong entry makes it read outside a buffer: on a CPU an ``IndexError``; on a
GPU a device-side assert or an illegal address, which ends the CUDA context and every later row with it. Inside
``bounds_guard()`` each attention wrapper passes its index tensors through ``guard_csr`` / ``guard_table`` first: device
ops only, so they are graph-safe (a captured graph re-runs them at every replay). Every entry the kernel would read
outside its buffer is replaced by a safe one (slot or page 0, the padding slot the pools reserve; an ``indptr`` clamped
into ``[0, kv_indices.numel()]`` and made non-decreasing), and the first such entry is recorded. ``take()`` reads and
clears the records (a host read: after a run, never inside a capture). Outside the guard the wrappers launch exactly
what they always did.
Entries the kernel never reads (a stale tail past ``kv_indptr[bs]``, table columns past a row's length) are not checked.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

_NONE = 2**62  # "no entry recorded"
_state = {"on": False}  # a dict, not a rebound global: one object however the functions are imported
_records: dict[tuple[str, str], tuple] = {}  # (device, what) -> ([1] int64 first bad entry, its shape, rule)


@contextmanager
def bounds_guard() -> Iterator[None]:
    """Guard every attention launch made inside (and every graph captured inside: its replays stay guarded)."""
    before, _state["on"] = _state["on"], True
    try:
        yield
    finally:
        _state["on"] = before


def _record(what: str, bad: torch.Tensor, values: torch.Tensor, rule: str) -> None:
    """Keep the first bad entry of ``values`` (``bad``: same shape) for ``what``, device ops only: its flat position in
    the high 32 bits of one int64, its value's low 32 bits below, so a minimum keeps both."""
    key, dev = (str(bad.device), what), bad.device
    rec = _records[key][0] if key in _records else torch.full((1,), _NONE, dtype=torch.int64, device=dev)
    _records[key] = (rec, tuple(values.shape), rule)
    if bad.numel():
        code = (torch.arange(bad.numel(), device=dev).view(bad.shape) << 32) | (values.to(torch.int64) & 0xFFFFFFFF)
        torch.minimum(rec, torch.where(bad, code, _NONE).amin(), out=rec)


def take() -> list[str]:
    """What the guarded kernels found since the last call, one line each (a host read), and clear it."""
    found = []
    for (_, what), (rec, shape, rule) in _records.items():
        if (code := int(rec)) == _NONE:
            continue
        first, value = code >> 32, code & 0xFFFFFFFF
        value -= (value >= 2**31) << 32  # the int32 it was (indices past 32 bits show modulo 2**32)
        where = f"[{first}]" if len(shape) < 2 else f"[{first // shape[1]}, {first % shape[1]}] (row, col)"
        found.append(f"{what}{where} = {value}: {rule}")
        rec.fill_(_NONE)
    return found


def guard_csr(
    what: str, kv_indptr: torch.Tensor, kv_indices: torch.Tensor, bs: int, num_slots: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(kv_indptr, kv_indices)`` a kernel may read for ``bs`` requests over a cache of ``num_slots`` slots: unchanged
    outside the guard; inside it, ``kv_indptr[:bs+1]`` clamped into ``[0, kv_indices.numel()]`` and made non-decreasing,
    and a live slot outside ``[0, num_slots)`` replaced by slot 0, each change recorded."""
    if not _state["on"]:
        return kv_indptr, kv_indices
    n, ptr = kv_indices.shape[0], kv_indptr[: bs + 1]
    safe = ptr.clamp(0, n).cummax(0).values
    _record(f"{what}: kv_indptr", safe != ptr, ptr, f"outside [0, {n}] (kv_indices.numel()) or below the entry before it")
    pos = torch.arange(n, device=kv_indices.device)
    bad = (pos >= safe[0]) & (pos < safe[bs]) & ((kv_indices < 0) | (kv_indices >= num_slots))
    _record(f"{what}: kv_indices", bad, kv_indices, f"a live entry outside the cache's slots [0, {num_slots})")
    return safe, torch.where(bad, 0, kv_indices)


def guard_table(
    what: str, block_table: torch.Tensor, seq_lens: torch.Tensor, bs: int, bound: int, page_size: int, num_pages: int
) -> torch.Tensor:
    """The ``block_table`` rows ``[:bs]`` a kernel may read: request i reads columns ``p < cdiv(min(seq_lens[i], bound),
    page_size)``. Unchanged outside the guard; inside it, a read page outside ``[0, num_pages)`` becomes page 0,
    recorded."""
    if not _state["on"]:
        return block_table
    table = block_table[:bs]
    pages = (seq_lens[:bs].clamp(0, bound) + page_size - 1) // page_size  # [bs] columns each request reads
    bad = (torch.arange(block_table.shape[1], device=block_table.device) < pages[:, None]) & ((table < 0) | (table >= num_pages))
    _record(f"{what}: block_table", bad, table, f"a read entry outside the cache's pages [0, {num_pages})")
    return torch.where(bad, 0, table)
