"""The bounds guard: on the checker's and the fuzzer's runs, metadata that points outside a buffer is a finding, not a
crash.

An attention kernel reads a backend's metadata as addresses: a CSR ``kv_indptr`` / ``kv_indices`` (token slots of the
KV cache) or a block table (pages). One wrong entry makes it read outside a buffer: on a CPU an ``IndexError``; on a GPU a
device-side assert or an illegal address, which ends the CUDA context and every later row with it. Inside
``bounds_guard()`` each attention wrapper passes its index tensors through ``guard_csr`` / ``guard_table`` first: device
ops only, so they are graph-safe (a captured graph re-runs them at every replay). Every entry the kernel would read
outside its buffer is replaced by a safe one (slot or page 0, the padding slot the pools reserve; an ``indptr`` out of
range or order by an empty batch), and the first such entry is recorded. ``take()`` reads and clears the records (a
host read: after a run, never inside a capture). Outside the guard the wrappers launch exactly what they always did.
Entries the kernel never reads (a stale tail past ``kv_indptr[bs]``, table columns past a row's length) are not checked.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

_NONE = 2**62  # "no entry recorded"
_state = {"on": False}  # a dict, not a rebound global: one object however the functions are imported
_records: dict[
    tuple[str, str], tuple[torch.Tensor, tuple[int, ...], int]
] = {}  # (device, what) -> ([first, value], shape, limit)


@contextmanager
def bounds_guard() -> Iterator[None]:
    """Guard every attention launch made inside (and every graph captured inside: its replays stay guarded)."""
    before, _state["on"] = _state["on"], True
    try:
        yield
    finally:
        _state["on"] = before


def _record(what: str, bad: torch.Tensor, values: torch.Tensor, rule: str) -> None:
    """Keep the first flat position of ``bad`` (and the value there) for ``what``; device ops only."""
    key = (str(bad.device), what)
    rec = _records[key][0] if key in _records else torch.full((2,), _NONE, dtype=torch.int64, device=bad.device)
    _records[key] = (rec, tuple(bad.shape), rule)  # the shape names the entry: the latest call's
    flat = bad.reshape(-1)
    pos = torch.arange(flat.numel(), device=flat.device)
    if not flat.numel():
        return
    first = torch.where(flat, pos, _NONE).amin()  # a 0-dim tensor: indexing with it would read it on the host
    value = values.reshape(-1).index_select(0, first.clamp(max=flat.numel() - 1).reshape(1))[0].to(torch.int64)
    newer = first < rec[0]
    rec.copy_(torch.where(newer, torch.stack([first, value]), rec))


def take() -> list[str]:
    """What the guarded kernels found since the last call, one line each (a host read), and clear it."""
    found = []
    for (_, what), (rec, shape, rule) in _records.items():
        first, value = (int(v) for v in rec.tolist())
        if first == _NONE:
            continue
        where = f"[{first}]" if len(shape) < 2 else f"[{first // shape[1]}, {first % shape[1]}] (row, col)"
        found.append(f"{what}{where} = {value}: {rule}")
        rec.fill_(_NONE)
    return found


def guard_csr(
    what: str, kv_indptr: torch.Tensor, kv_indices: torch.Tensor, bs: int, num_slots: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(kv_indptr, kv_indices)`` a kernel may read for ``bs`` requests over a cache of ``num_slots`` slots: unchanged
    outside the guard; inside it, an indptr outside ``[0, kv_indices.numel()]`` or decreasing becomes all zeros (every
    request empty) and a live slot outside ``[0, num_slots)`` becomes slot 0, each recorded."""
    if not _state["on"]:
        return kv_indptr, kv_indices
    n, ptr = kv_indices.shape[0], kv_indptr[: bs + 1].to(torch.int64)
    bad_ptr = (ptr < 0) | (ptr > n)
    bad_ptr[1:] |= ptr[1:] < ptr[:-1]
    _record(f"{what}: kv_indptr", bad_ptr, ptr, f"outside [0, {n}] (kv_indices.numel()) or below the entry before it")
    kv_indptr = torch.where(bad_ptr.any(), torch.zeros_like(kv_indptr), kv_indptr)
    ptr = kv_indptr[: bs + 1].to(torch.int64)
    pos = torch.arange(n, device=kv_indices.device)
    live = (pos >= ptr[0]) & (pos < ptr[bs])
    bad = live & ((kv_indices < 0) | (kv_indices >= num_slots))
    _record(f"{what}: kv_indices", bad, kv_indices, f"a live entry outside the cache's slots [0, {num_slots})")
    return kv_indptr, torch.where(bad, torch.zeros_like(kv_indices), kv_indices)


def guard_table(
    what: str, block_table: torch.Tensor, seq_lens: torch.Tensor, bs: int, bound: int, page_size: int, num_pages: int
) -> torch.Tensor:
    """The ``block_table`` a kernel may read: request i reads columns ``p < cdiv(min(seq_lens[i], bound), page_size)``.
    Unchanged outside the guard; inside it, a read page outside ``[0, num_pages)`` becomes page 0, recorded."""
    if not _state["on"]:
        return block_table
    width = block_table.shape[1]
    lens = seq_lens[:bs].to(torch.int64).clamp(0, bound)
    cols = torch.arange(width, device=block_table.device)
    live = torch.zeros_like(block_table, dtype=torch.bool)
    live[:bs] = cols[None, :] < (lens[:, None] + page_size - 1) // page_size
    bad = live & ((block_table < 0) | (block_table >= num_pages))
    _record(f"{what}: block_table", bad, block_table, f"a read entry outside the cache's pages [0, {num_pages})")
    return torch.where(bad, torch.zeros_like(block_table), block_table)
