"""Validation of a ``ForwardBatch`` at the boundary, before anything is written.

``GraphRunner.replay`` / ``eager`` call ``validate_batch`` before their first write (the static inputs, the KV cache),
so a refused batch leaves every buffer untouched. Each refusal is a ``BatchRefused`` (a ``ValueError``) naming the
field, the value and the limit. The rules:

| field | rule |
|---|---|
| every field | its type (``batch_size``, ``seq_lens_sum`` and the spec input's scalars Python ints); every tensor: dtype, device, size for the mode (``refimpl.layout``); a strided one is served as a contiguous copy (the returned batch) |
| ``world`` | the runner's own ``World`` (a batch built against another one would index and write another pool) |
| ``seq_lens_sum`` | an int equal to ``sum(seq_lens_cpu)`` (kernels size their index buffers from it) |
| ``seq_lens`` / ``seq_lens_cpu`` | the device copy equals the host copy; ``1 <= seq_len`` and the request's span (verify: ``+ N``; multi-step draft: ``+ topk*S``) ``<= max_context_len``; draft extend: ``seq_len >= rows`` |
| ``req_pool_indices`` | in ``[1, pool)`` (row 0 is the padded rows' reserved row), no duplicates |
| ``out_cache_loc`` | in ``[1, num_slots)`` (slot 0 is reserved), distinct, and **exactly the row's own new position**: the slot ``req_to_token`` holds at that row's column of its own request (decode ``seq - 1``, verify ``seq + j``, extend ``seq - rows + j``, multi-step ``seq + k*S + step``; ``refimpl.kernels.validation``), never an earlier position of the request, never another request's; and held by no other position of a live request (the pool's ``live`` rows: a prefix slot of another request would be overwritten) |
| ``input_ids`` / ``positions`` | in ``[0, vocab)`` / ``[0, max_context_len)`` |
| spec inputs | the mode's type (a plain decode / extend batch: none; multi-step draft decode: a ``DraftDecodeInput``); verify: N as captured, a 1-D **bool** mask of ``sum N*(seq+N)`` entries (a graph replay needs one) in which every draft row sees itself (an all-False or self-blind mask is refused unless ``VerifyInput.allow_blind_rows``); draft extend: accept lengths int32 in ``[0, S]`` agreeing with their host copy, the mode's version, rows per request as the graph lays them out; multi-step: topk and steps as captured, and its own ``kv_indptr`` / ``kv_indices``, when given, name only slots its rows' requests hold (``_check_draft_indices``) |

Cost (``refimpl.kernels.validation``): host rules in Python on the host copies, overlapping one kernel launch for the
device rules over the batch's own entries (the held rule: the request table's live rows), work proportional to the
batch and the request table, never to the KV pool. ``validate_batch`` reads that launch's small result at once (one
sync; an eager ragged batch reads its row counts first). A graph replay does not wait for it (``check_batch`` with
``out``, ``GraphRunner.validate``): the host rules run now, the device rules (then also "``seq_lens`` equals
``seq_lens_cpu``", against the host values staged in pinned memory, which the kernels read in place) go to the
runner's verdict buffer, the input load reads the verdict on the device and loads a refused batch as padded rows (each
request at its host length; ``refimpl.kernels.inputs``), and the runner raises the refusal, named as ``validate_batch``
names it, at its next call or ``synchronize()``. A draft-extend batch (its
hooks read the batch's own accept lengths), a multi-step batch carrying its own kv indices, and eager runs are
validated at once.
``GraphRunner(validate_inputs=False)`` switches validation off; the capture configuration is checked once, up front
(``check_capture_config``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from typing import Any

import torch

from . import layout
from .config import SpecConfig
from .kernels.validation import (
    CATEGORIES,
    NCAT,
    NONE,
    batch_check,
    batch_check_ref,
    first_bad,
    num_programs,
    read_result,
    result_size,
    write_target,
)
from .modes import ForwardMode
from .spec import DraftDecodeInput, DraftExtendInput, VerifyInput, verify_n

_CPU = torch.device("cpu")
# check_batch's six tensors, as a refusal names them
_FIELDS = tuple(f"ForwardBatch.{k}" for k in "input_ids positions req_pool_indices seq_lens seq_lens_cpu out_cache_loc".split())


class BatchRefused(ValueError):
    """A batch (or a runner configuration) that cannot be served; the message says why."""


def _refuse(field: str, value: Any, limit: str) -> BatchRefused:
    return BatchRefused(f"{field}={value}: {limit}")


def _int(field: str, value: Any) -> int:
    """``value`` if it is a Python int (not a bool), else a refusal naming its type."""
    if type(value) is not int:
        raise _refuse(field, f"{type(value).__name__} {value}", "must be a Python int")
    return value


def _tensor(field: str, t: Any, dtype: torch.dtype, n: int | None, device: torch.device) -> None:
    """Refuse ``t`` unless it is a ``dtype`` tensor on ``device`` of ``n`` entries (None: any)."""
    if not isinstance(t, torch.Tensor):
        raise _refuse(field, type(t).__name__, f"expected a {dtype} tensor")
    if t.dtype != dtype:  # straight-line: every replay runs these (check_batch's six fields, names made once)
        raise _refuse(f"{field}.dtype", t.dtype, f"expected {dtype}")
    if t.device != device:
        raise _refuse(f"{field}.device", t.device, f"expected {device}")
    if n is not None and t.numel() != n:
        raise _refuse(f"{field} entries", t.numel(), f"expected {n}")


def _need(spec, cls: type, who: str) -> None:
    """Refuse a spec input that is not a ``cls``."""
    if not isinstance(spec, cls):
        raise _refuse("spec_info", type(spec).__name__, f"{who} needs a {cls.__name__}")


def _check_spec(fb, mode, cfg: SpecConfig | None, multi_step: bool) -> int:
    """The mode's spec input (host side); returns the r2t columns a request spans past ``seq_lens``."""
    spec, bs, dev = fb.spec_info, fb.batch_size, fb.world.device
    if mode.is_target_verify():
        _need(spec, VerifyInput, mode.name)
        n = _int("spec_info.draft_token_num", spec.draft_token_num)
        if cfg is not None:
            verify_n(spec, cfg, BatchRefused)
        if fb.num_tokens != bs * n:
            raise _refuse("num_tokens", fb.num_tokens, f"expected bs * N = {bs} * {n}")
        if (mask := spec.custom_mask) is not None:
            _tensor("spec_info.custom_mask", mask, torch.bool, None, dev)  # type, dtype, device (its shape: below)
        return n
    if mode.is_any_draft_extend():
        _need(spec, DraftExtendInput, mode.name)
        version = 2 if mode.is_draft_extend_v2() else 1
        if _int("spec_info.version", spec.version) != version:
            raise _refuse("spec_info.version", spec.version, f"{mode.name} is version {version}")
        for name in ("accept_length", "extend_seq_lens"):
            _tensor(f"spec_info.{name}", getattr(spec, name), torch.int32, bs, dev)
        if cfg is not None:
            rows, got = layout.rows_per_request(mode, cfg), _int("spec_info.num_tokens_per_req", spec.num_tokens_per_req)
            if got != rows:
                raise _refuse("spec_info.num_tokens_per_req", got, f"the graph lays out {rows} rows per request")
        return 0
    if multi_step:  # its type and num_steps: validate_batch, first
        got = (_int("spec_info.topk", spec.topk), spec.num_steps)
        if cfg is not None and got != (cfg.topk, cfg.num_steps):
            raise _refuse("spec_info (topk, num_steps)", got, f"captured for ({cfg.topk}, {cfg.num_steps})")
        return spec.topk * spec.num_steps  # the draft columns: the batch's own topk * S
    if spec is not None:  # a step backend would read a DraftDecodeInput's own kv indices
        raise _refuse(
            "spec_info",
            type(spec).__name__,
            f"{mode.name} on a single-step runner takes no spec input (a DraftDecodeInput: a multi-step runner)",
        )
    return 0


_SCRATCH: dict[torch.device, torch.Tensor] = {}


def _scratch(device: torch.device, size: int) -> torch.Tensor:
    """The device checks' int64 result buffer, one per device, grown when a batch needs more."""
    if (buf := _SCRATCH.get(device)) is None or buf.numel() < size:
        buf = _SCRATCH[device] = torch.empty(max(size, 1024), dtype=torch.int64, device=device)
    return buf


def _launch_device_checks(fb, per: int, extra: int, row_req, draft_extend: bool, mask, out, host):
    """The device rules: one ``batch_check`` launch now; the returned callable reads its result (the one device read), so
    the host rules run meanwhile. On the CPU: ``batch_check_ref`` (the interpreted kernel costs ms per batch;
    ``tests/test_batch_check.py`` holds the two to the same answers). The held rule reads the pool's live rows.
    ``out`` / ``host`` (a deferred replay's): the result goes to ``out`` (on the CPU: one program's minima), the host's
    ``seq_lens`` (``host``: staged where the kernel reads it, pinned host memory on CUDA) are compared too, and the
    callable returns the verdict's entries instead."""
    world, bs, n, m = fb.world, fb.batch_size, fb.num_tokens, fb.out_cache_loc.numel()
    tensors = (world.req_to_token, fb.seq_lens, fb.req_pool_indices, fb.input_ids, fb.positions, fb.out_cache_loc)
    sizes, live = (per, extra, world.cfg.vocab_size, world.kv_cache.num_slots), world.req_to_token_pool.live
    cpu, rest = world.device.type == "cpu", (row_req, mask, live, host)  # batch_check's arguments past the copies
    if out is not None and not cpu:  # a deferred replay's (every replay): no copies
        batch_check(out, *tensors, *sizes, None, None, *rest)
        return lambda: num_programs(bs, n, m) * NCAT
    if out is not None:
        first = [NONE if i is None else i for i in batch_check_ref(*tensors, *sizes, *rest).values()]
        out[:NCAT] = torch.tensor(first, device=out.device)
        return lambda: NCAT
    copies = (fb.spec_info.accept_length, fb.spec_info.extend_seq_lens) if draft_extend else (None, None)
    if cpu:
        res = {"first": batch_check_ref(*tensors, *sizes, *rest), "seq_lens": fb.seq_lens.tolist()}
        res.update({k: t.tolist() for k, t in zip(("accept_length", "extend_seq_lens"), copies) if t is not None})
        return lambda: res
    out = _scratch(world.device, result_size(bs, n, m))
    batch_check(out, *tensors, *sizes, *copies, *rest)
    return lambda: read_result(out, bs, n, m)


def validate_batch(fb, spec: SpecConfig | None = None, kind: layout.GraphKind | None = None, for_graph=False, world=None):
    """Refuse a malformed batch before anything is written (rules and cost: the module docstring). ``spec``: the
    configuration the batch must match (N, topk, steps); ``kind``: the runner's graph kind (default: the batch's own,
    ``ForwardBatch.kind``); ``for_graph``: also the graph's uniform row layout (an eager
    batch may be ragged); ``world``: the ``World`` the batch must belong to (the runner's). Returns ``fb``, or a copy of it
    with its strided tensors made contiguous."""
    return check_batch(fb, spec, kind, for_graph, world)[0]


def check_batch(fb, spec=None, kind=None, for_graph=False, world=None, out=None, host=None):
    """``validate_batch``'s rules, of which a graph replay's device rules may go unread: with ``out`` (an int64 buffer of
    ``result_size`` entries for the runner's largest batch) and ``host`` (a callable that stages ``seq_lens_cpu`` where
    the device checks read it and returns it), a batch that may be deferred (the module docstring) has its host rules
    checked now and its device rules launched into ``out``; returns ``(fb, entries)``, ``entries`` the verdict's length in ``out`` (for
    ``load_inputs``), else ``(fb, None)`` after every rule was checked."""
    if world is not None and fb.world is not world:
        raise BatchRefused(
            f"ForwardBatch.world is another World (id {id(fb.world):#x}) than the runner's: the runner writes its own world's"
            " KV pool and reads its own request table"
        )
    mode, world, spec_info = fb.forward_mode, fb.world, fb.spec_info
    if not isinstance(mode, ForwardMode):
        raise _refuse("ForwardBatch.forward_mode", f"{type(mode).__name__} {mode}", "must be a ForwardMode")
    multi = (kind or fb.kind).multi_step
    if multi:
        _need(spec_info, DraftDecodeInput, "draft decode")
    dev, i64, i32, bs = world.device, torch.int64, torch.int32, _int("ForwardBatch.batch_size", fb.batch_size)
    ts = (fb.input_ids, fb.positions, fb.req_pool_indices, fb.seq_lens, fb.seq_lens_cpu, fb.out_cache_loc)
    n = ts[0].numel() if isinstance(ts[0], torch.Tensor) else 0  # (a non-tensor: refused first, below)
    locs = n * _int("spec_info.num_steps", spec_info.num_steps) if multi else n
    # (dtype, entries, device) per field of _FIELDS; seq_lens_cpu: the host copy
    want = ((i64, None, dev), (i64, n, dev), (i64, bs, dev), (i32, bs, dev), (i32, bs, _CPU), (i64, locs, dev))
    for name, t, (dtype, count, device) in zip(_FIELDS, ts, want):  # (no f-string per call: host µs)
        _tensor(name, t, dtype, count, device)
    fb = _contiguous(fb)
    spec_info, L, seq = fb.spec_info, world.max_context_len, fb.seq_lens_cpu.tolist()
    total = _int("ForwardBatch.seq_lens_sum", fb.seq_lens_sum)
    if total != sum(seq):
        raise _refuse("ForwardBatch.seq_lens_sum", total, f"expected sum(seq_lens_cpu) = {sum(seq)}")
    # an eager batch may carry another N / topk than the graphs were captured for
    cfg = spec if for_graph else None
    extra = _check_spec(fb, mode, cfg, multi)
    if bs == 0:
        return fb, None
    verify, draft_extend = mode.is_target_verify(), mode.is_any_draft_extend()
    # rows per request: uniform in a graph and in decode / verify; an eager extend may be ragged
    # (its lengths are read first: one more device read, on the eager path only)
    row_req, rows, per = None, None, n // bs
    if mode.is_extend() or (draft_extend and not for_graph):
        ext = fb.extend_seq_lens if mode.is_extend() else spec_info.extend_seq_lens
        _tensor("extend_seq_lens", ext, i32, bs, dev)  # the row counts
        rows = ext.tolist()
        if len(set(rows)) > 1:  # each row's request, then its column past seq_lens + extra: j - rows[r]
            owner = [(r, j - k) for r, k in enumerate(rows) for j in range(k)]
            row_req = torch.tensor(owner, dtype=i32).T.contiguous().to(dev)
    if (want := per * bs if rows is None else sum(rows)) != n:
        raise _refuse("num_tokens", n, f"expected {want} rows for the batch's {bs} requests in {mode.name}")
    mask = spec_info.custom_mask if verify else None
    on_device = mask if mask is None or mask.dim() == 1 else None  # (a blind mask the batch allows: not a device rule)
    own_kv = multi and (spec_info.kv_indptr is not None or spec_info.kv_indices is not None)  # a batch's own kv indices
    defer = out is not None and for_graph and not draft_extend and result_size(bs, n, fb.out_cache_loc.numel()) <= out.numel()
    defer &= not own_kv
    if defer and getattr(spec_info, "allow_blind_rows", False):
        on_device = None
    staged = host(fb.seq_lens_cpu) if defer else None
    read = _launch_device_checks(fb, per, extra, row_req, draft_extend, on_device, out if defer else None, staged)
    # host rules, in order, while the kernel runs; then the device results
    if (lo := min(seq)) < 1:  # builtins over host ints: the usual case costs no Python loop
        raise _refuse(f"seq_lens[{seq.index(lo)}]", lo, "must be >= 1")
    if max(seq) + extra > L:
        i = first_bad(seq, lambda _, s: s + extra > L)
        what = f"seq_lens[{i}] + {extra}" if extra else f"seq_lens[{i}]"
        raise _refuse(what, seq[i] + extra, f"exceeds max_context_len={L}")
    if mask is None and for_graph and verify:
        why = "a verify graph reads its mask buffer, which still holds the last batch's mask: give this batch's (a chain's is causal)"
        raise _refuse("spec_info.custom_mask", None, why)
    if mask is not None:  # its size depends on seq_lens, checked above
        if (got := mask.numel()) != (want := layout.tree_mask_total(seq, extra)):
            raise _refuse("spec_info.custom_mask entries", got, f"expected sum over requests of N*(seq_len+N) = {want}")
        if mask.dim() != 1:
            raise _refuse(
                "spec_info.custom_mask.shape",
                list(mask.shape),
                f"expected 1-D [{want}]: sum over requests of N*(seq_len+N) entries",
            )
    if defer:
        return fb, read()
    res = read()
    if res["seq_lens"] != seq:
        raise _refuse("seq_lens (device)", res["seq_lens"], f"disagrees with seq_lens_cpu={seq}")
    if draft_extend:
        acc, cpu = res["accept_length"], list(spec_info.accept_length_cpu)  # acc: the device copy, read back
        if acc != cpu:
            raise _refuse("spec_info.accept_length", acc, f"disagrees with accept_length_cpu={cpu}")
        steps = cfg.num_steps if cfg else math.inf  # without a SpecConfig: >= 0 only
        if min(acc) < 0 or (max(acc) > steps):
            i = first_bad(acc, lambda _, a: not 0 <= a <= steps)
            raise _refuse(f"spec_info.accept_length[{i}]", acc[i], f"outside [0, num_steps={steps}]")
        rows = res["extend_seq_lens"]
        if for_graph and rows != [per] * bs:
            raise _refuse("spec_info.extend_seq_lens", rows, f"the graph lays out {per} rows per request")
    if rows is not None and any(map(operator.lt, seq, rows)):  # extend: seq counts new rows
        i = first_bad(rows, lambda r, k: seq[r] < k)
        raise _refuse(f"seq_lens[{i}]", seq[i], f"counts the request's {rows[i]} new rows")
    _report_device_findings(fb, res["first"], seq, extra, per, row_req)
    if own_kv:
        _check_draft_indices(fb, seq, extra)
    return fb, None


def refused_categories(out: torch.Tensor, entries: int) -> list[str]:
    """The device checks' categories with a bad entry in a deferred verdict (``out[:entries]``; one read)."""
    least = out[:entries].view(-1, NCAT).amin(0).tolist()
    return [c for c, v in zip(CATEGORIES, least) if v < NONE]


def _contiguous(fb):
    """``fb`` with contiguous copies of its tensors (and its spec input's) that are not: the device checks, kernels and
    ``load_inputs`` read raw memory. ``fb`` itself when every one is (the usual case: one pass, no copy)."""
    spec = fb.spec_info
    if all(not isinstance(t, torch.Tensor) or t.is_contiguous() for t in _tensors(fb) + _tensors(spec)):
        return fb
    fix = lambda o: {
        k: t.contiguous()
        for k, t in zip(_tensor_fields(type(o)), _tensors(o))
        if isinstance(t, torch.Tensor) and not t.is_contiguous()
    }
    own = fix(fb)
    if moved := fix(spec):
        own["spec_info"] = dataclasses.replace(spec, **moved)
    return fb.replace(**own)


@functools.cache
def _tensor_fields(cls: type) -> tuple[str, ...]:
    """The fields of dataclass ``cls`` annotated as tensors (the annotations are strings here), once per class;
    ``tests/test_bad_inputs.py`` holds every tensor a batch of each mode carries to them."""
    return tuple(f.name for f in dataclasses.fields(cls) if "Tensor" in str(f.type)) if dataclasses.is_dataclass(cls) else ()


@functools.cache
def _getter(cls: type):
    """A function of a ``cls`` that returns its ``_tensor_fields``' values, a tuple (one C call)."""
    names = _tensor_fields(cls)
    get = operator.attrgetter(*names) if names else lambda o: ()
    return get if len(names) != 1 else lambda o: (get(o),)


def _tensors(o) -> tuple:
    return _getter(type(o))(o)


def _check_draft_indices(fb, seq: list[int], span: int) -> None:
    """A DraftDecodeInput's own ``kv_indptr`` / ``kv_indices`` (a step backend attends to the slots they name; the
    multi-step backend makes its own): an int32 indptr of ``bs*topk + 1`` entries from 0, never decreasing, within
    ``kv_indices``, no row longer than its request; every entry a slot its row's own request holds
    (``req_to_token[rpi[r], :seq_r + topk*S]``): never past the cache, never another request's KV. Vectorised; two reads,
    only when a batch carries them."""
    spec, world, bs, dev = fb.spec_info, fb.world, fb.batch_size, fb.world.device
    for name, dtypes in (("kv_indptr", (torch.int32,)), ("kv_indices", (torch.int32, torch.int64))):
        t = getattr(spec, name)
        if not isinstance(t, torch.Tensor) or t.dtype not in dtypes or t.dim() != 1 or t.device != dev:
            got = f"{t.dtype}{list(t.shape)} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise _refuse(f"spec_info.{name}", got, f"expected a 1-D {' or '.join(map(str, dtypes))} tensor on {dev}")
    ptr, idx, topk, rows = spec.kv_indptr.tolist(), spec.kv_indices, spec.topk, bs * spec.topk
    if len(ptr) != rows + 1:
        raise _refuse("spec_info.kv_indptr entries", len(ptr), f"expected bs * topk + 1 = {rows + 1}")
    lens, held = [b - a for a, b in zip(ptr, ptr[1:])], [s + span for s in seq]  # held: the columns a request holds
    if ptr[0] != 0 or min(lens) < 0 or ptr[-1] > idx.numel():
        raise _refuse("spec_info.kv_indptr", ptr, f"must start at 0, never decrease, end within kv_indices ({idx.numel()})")
    if (i := first_bad(lens, lambda j, k: k > held[j // topk])) is not None:
        raise _refuse(f"spec_info.kv_indptr row {i} length", lens[i], f"exceeds its request's {held[i // topk]} positions")
    S, used = world.kv_cache.num_slots, idx[: ptr[-1]].to(torch.int64)
    req = (torch.arange(rows, device=dev) // topk).repeat_interleave(torch.tensor(lens, device=dev))  # each entry's request
    keys = world.req_to_token[fb.req_pool_indices] + torch.arange(bs, device=dev)[:, None] * S  # [bs, L]: request * S + slot
    cols = torch.arange(keys.shape[1], device=dev) < torch.tensor(held, device=dev)[:, None]  # the columns each one holds
    owned = torch.isin(req * S + used, keys[cols])
    if (bad := (used < 1) | (used >= S) | ~owned).any():
        j = int(bad.nonzero()[0])
        r, v = int(req[j]), int(used[j])
        why = f"not a slot of request {r}'s {held[r]} positions: a draft row reads its own request's KV"
        raise _refuse(f"spec_info.kv_indices[{j}]", v, why if 1 <= v < S else f"outside [1, {S})")


def _report_device_findings(fb, first: dict, seq: list[int], extra: int, per: int, row_req):
    """The first bad entry of each device rule, in order, as its refusal (values read back only here)."""
    world, rpi, loc, n = fb.world, fb.req_pool_indices, fb.out_cache_loc, fb.num_tokens
    for name, lo, hi, twice in (  # a range [lo, hi) (0 is reserved: a padded row's), what a duplicate means
        ("req_pool_indices", 1, f"pool={world.req_to_token_pool.size}", "a request appears twice in the batch"),
        ("input_ids", 0, world.cfg.vocab_size, None),
        ("positions", 0, world.max_context_len, None),
        ("out_cache_loc", 1, world.kv_cache.num_slots, "two rows would write the same KV slot"),
    ):
        t = getattr(fb, name)
        if (i := first[f"{name} range"]) is not None:
            v = int(t[i])
            zero = f"{'row' if t is rpi else 'slot'} 0 is reserved for padded rows"
            raise _refuse(f"{name}[{i}]", v, zero if v == 0 else f"outside [{lo}, {hi})")
        if twice and (i := first[f"{name} duplicate"]) is not None:
            raise _refuse(f"{name}[{i}]", int(t[i]), twice)
    rows = row_req.tolist() if row_req is not None else None
    target = lambda i: write_target(i, n, loc.numel(), per, extra, seq, rows)
    if (i := first["out_cache_loc slot"]) is not None:
        v, (writer, col) = int(loc[i]), target(i)
        table = world.req_to_token[rpi].cpu()  # [bs, L]: the batch's rows only
        hits = torch.nonzero(table == v).tolist()
        held = " and ".join(f"request {r}'s position {c}" for r, c in hits) or "no position of this batch's requests"
        # (the host rules put every new position in [0, L))
        why = f"is the slot of {held}; row {i % n} must write request {writer}'s new position {col} (slot {int(table[writer, col])})"
        raise _refuse(f"out_cache_loc[{i}]", v, why)
    if (e := first["custom_mask self"]) is not None and not getattr(fb.spec_info, "allow_blind_rows", False):
        raise _refuse(
            "spec_info.custom_mask",
            f"row {e} (request {e // per}, draft {e % per})",
            "does not see itself: an all-False or self-blind tree mask (VerifyInput.allow_blind_rows=True passes one)",
        )
    if (i := first["out_cache_loc held"]) is not None:  # (its own position holds it: the slot rule passed)
        v, (writer, col) = int(loc[i]), target(i)
        hits = (world.req_to_token == v) & world.req_to_token_pool.live[:, None]  # live rows (never the reserved row 0)
        hits[int(rpi[writer]), col] = False  # its own position
        (p, c), batch = torch.nonzero(hits)[0].tolist(), rpi.tolist()
        who = f"request {batch.index(p)}" if p in batch else f"the live request in pool row {p}, outside the batch,"
        why = f"is also held by {who} at position {c}: row {i % n} would overwrite that KV (a new slot belongs to its own position only)"
        raise _refuse(f"out_cache_loc[{i}]", v, why)


def check_capture_config(runner) -> None:
    """Refuse, before any allocation, a capture the static buffers cannot hold."""
    spec, L, fill, rows = runner.spec_cfg, runner.world.max_context_len, runner.fill_value, runner.tokens_per_req
    if (span := fill + runner.kind.span(spec)) > L:
        raise BatchRefused(
            f"capture batch span {span} (fill value {fill} + the mode's drafts) exceeds max_context_len={L}: raise the context"
            " length or lower N / topk / num_steps"
        )
    if runner.mode.is_any_draft_extend() and rows > L:
        raise BatchRefused(f"{rows} rows per request exceed max_context_len={L}")
    if (width := runner.max_bs * rows * L) >= 2**31:
        raise BatchRefused(
            f"kv index buffers of max_bs * rows * L = {width} entries exceed int32 addressing (2^31): max_bs={runner.max_bs},"
            f" rows={rows}, L={L}"
        )
