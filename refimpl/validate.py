"""Validation of a ``ForwardBatch`` at the boundary, before anything is written.

``GraphRunner.replay`` / ``eager`` call ``validate_batch`` before their first write (the static
inputs, the KV cache), so a refused batch leaves every buffer untouched. Each refusal is a
``BatchRefused`` (a ``ValueError``) naming the field, the value and the limit.

What is checked:

| field | rule |
|---|---|
| every tensor | dtype, device, size for the mode (``refimpl.layout``) |
| ``seq_lens`` / ``seq_lens_cpu`` | the device copy equals the host copy; ``1 <= seq_len`` and the request's span (verify: ``+ N``; multi-step draft: ``+ topk*S``) ``<= max_context_len``; draft extend: ``seq_len >= rows`` |
| ``req_pool_indices`` | in ``[1, pool)`` (row 0 is the padded rows' reserved row), no duplicates |
| ``out_cache_loc`` | in ``[1, num_slots)`` (slot 0 is reserved), distinct, and **owned**: a row may write only a slot of its own request's ``req_to_token`` row, within the request's span |
| ``input_ids`` / ``positions`` | in ``[0, vocab)`` / ``[0, max_context_len)`` |
| spec inputs | the mode's type; verify: N as captured, a **bool** mask of ``sum N*(seq+N)`` entries; draft extend: accept lengths int32 in ``[0, S]`` agreeing with their host copy, the mode's version, rows per request as the graph lays them out; multi-step: topk and steps as captured |

Cost: a handful of small device ops and host reads (on a GPU, one synchronisation per host read:
tens of µs). ``GraphRunner(validate_inputs=False)`` switches it off for timing runs; the
runner's capture configuration is checked once, up front (``check_capture_config``).
"""

from __future__ import annotations

from typing import Any

import torch

from . import layout
from .config import SpecConfig
from .modes import ForwardMode
from .spec import DraftDecodeInput, DraftExtendInput, VerifyInput


class BatchRefused(ValueError):
    """A batch (or a runner configuration) that cannot be served; the message says why."""


def _refuse(field: str, value: Any, limit: str) -> BatchRefused:
    return BatchRefused(f"{field}={value}: {limit}")


def _first_bad(mask: torch.Tensor, values: torch.Tensor) -> tuple[int, Any]:
    i = int(mask.nonzero()[0, 0])
    return i, values[i].item()


def _structure(fb, locs_per_row: int) -> None:
    dev = fb.world.device
    checks = {
        "input_ids": (fb.input_ids, torch.int64, None),
        "positions": (fb.positions, torch.int64, fb.num_tokens),
        "req_pool_indices": (fb.req_pool_indices, torch.int64, fb.batch_size),
        "seq_lens": (fb.seq_lens, torch.int32, fb.batch_size),
        "out_cache_loc": (fb.out_cache_loc, torch.int64, fb.num_tokens * locs_per_row),
    }
    for name, (t, dtype, n) in checks.items():
        if not isinstance(t, torch.Tensor):
            raise BatchRefused(f"ForwardBatch.{name} must be a tensor, got {type(t).__name__}")
        if t.dtype != dtype:
            raise _refuse(f"ForwardBatch.{name}.dtype", t.dtype, f"expected {dtype}")
        if t.device != dev:
            raise _refuse(f"ForwardBatch.{name}.device", t.device, f"expected {dev}")
        if n is not None and t.numel() != n:
            raise _refuse(f"ForwardBatch.{name} entries", t.numel(), f"expected {n}")
    s = fb.seq_lens_cpu
    if not isinstance(s, torch.Tensor) or s.device.type != "cpu" or s.dtype != torch.int32:
        raise BatchRefused("ForwardBatch.seq_lens_cpu must be an int32 host (cpu) tensor")
    if s.numel() != fb.batch_size:
        raise _refuse("ForwardBatch.seq_lens_cpu entries", s.numel(), f"expected {fb.batch_size}")


def _rows_per_request(fb, mode: ForwardMode, spec: Any) -> torch.Tensor:
    """Query rows of each request, ``[bs]`` on the host."""
    if mode.is_extend():
        return fb.extend_seq_lens.cpu().to(torch.int64)
    if mode.is_any_draft_extend():
        return spec.extend_seq_lens.cpu().to(torch.int64)
    per = fb.num_tokens // max(fb.batch_size, 1)
    return torch.full((fb.batch_size,), per, dtype=torch.int64)


def _check_spec(fb, mode, cfg: SpecConfig | None, multi_step: bool, for_graph: bool) -> int:
    """The mode's spec input; returns the extra r2t columns a request spans past ``seq_lens``."""
    spec, bs = fb.spec_info, fb.batch_size
    if mode.is_target_verify():
        if not isinstance(spec, VerifyInput):
            raise _refuse("spec_info", type(spec).__name__, "TARGET_VERIFY needs a VerifyInput")
        n = int(spec.draft_token_num)
        if cfg is not None and n != cfg.num_draft_tokens:
            raise _refuse("spec_info.draft_token_num", n, f"captured N is {cfg.num_draft_tokens}")
        if fb.num_tokens != bs * n:
            raise _refuse("num_tokens", fb.num_tokens, f"expected bs * N = {bs} * {n}")
        mask = spec.custom_mask
        if mask is not None:
            if mask.dtype != torch.bool:
                raise _refuse("spec_info.custom_mask.dtype", mask.dtype, "must be torch.bool")
            if mask.device != fb.world.device:
                raise _refuse("spec_info.custom_mask.device", mask.device,
                              f"expected {fb.world.device}")  # fmt: skip
        return n
    if mode.is_any_draft_extend():
        if not isinstance(spec, DraftExtendInput):
            raise _refuse("spec_info", type(spec).__name__, f"{mode.name} needs a DraftExtendInput")
        version = 2 if mode.is_draft_extend_v2() else 1
        if spec.version != version:
            raise _refuse("spec_info.version", spec.version, f"{mode.name} is version {version}")
        acc = spec.accept_length
        if acc.dtype != torch.int32 or acc.numel() != bs:
            raise _refuse("spec_info.accept_length", f"{acc.dtype}[{acc.numel()}]", f"int32[{bs}]")
        host = acc.cpu()
        if host.tolist() != list(spec.accept_length_cpu):
            raise _refuse("spec_info.accept_length", host.tolist(),
                          f"disagrees with accept_length_cpu={list(spec.accept_length_cpu)}")  # fmt: skip
        steps = cfg.num_steps if cfg is not None else None  # without a SpecConfig: >= 0 only
        bad = (host < 0) | (host > steps) if steps is not None else host < 0
        if bool(bad.any()):
            i, v = _first_bad(bad, host)
            raise _refuse(f"spec_info.accept_length[{i}]", v, f"outside [0, num_steps={steps}]")
        if cfg is not None and for_graph:
            rows = layout.rows_per_request(mode, cfg)
            if spec.num_tokens_per_req != rows:
                raise _refuse("spec_info.num_tokens_per_req", spec.num_tokens_per_req,
                              f"the graph lays out {rows} rows per request")  # fmt: skip
        return 0
    if multi_step:
        if not isinstance(spec, DraftDecodeInput):
            raise _refuse("spec_info", type(spec).__name__, "draft decode needs a DraftDecodeInput")
        if cfg is not None and (spec.topk, spec.num_steps) != (cfg.topk, cfg.num_steps):
            raise _refuse("spec_info (topk, num_steps)", (spec.topk, spec.num_steps),
                          f"captured for ({cfg.topk}, {cfg.num_steps})")  # fmt: skip
        return spec.topk * spec.num_steps
    return 0


def _owner_rows(fb, rows: torch.Tensor, multi_step: bool) -> torch.Tensor:
    """For every ``out_cache_loc`` entry, the index of the request that writes it (host)."""
    per_req = torch.repeat_interleave(torch.arange(fb.batch_size), rows)  # [num_tokens]
    if multi_step:  # [step][seq][branch]: every step block repeats the rows
        per_req = per_req.repeat(fb.spec_info.num_steps)
    return per_req


def validate_batch(
    fb, spec: SpecConfig | None = None, multi_step_draft: bool | None = None, for_graph=False
) -> None:
    """Refuse a malformed batch before anything is written (table in the module docstring).

    ``spec``: the configuration the batch must match (N, topk, steps); ``for_graph``: also the
    graph's uniform row layout (an eager batch may be ragged)."""
    mode, world = fb.forward_mode, fb.world
    multi = (
        isinstance(fb.spec_info, DraftDecodeInput) if multi_step_draft is None else multi_step_draft
    )
    _structure(fb, fb.spec_info.num_steps if multi else 1)
    bs, L = fb.batch_size, world.max_context_len
    seq = fb.seq_lens_cpu.to(torch.int64)
    if not torch.equal(fb.seq_lens.cpu().to(torch.int64), seq):
        raise _refuse("seq_lens (device)", fb.seq_lens.cpu().tolist(),
                      f"disagrees with seq_lens_cpu={seq.tolist()}")  # fmt: skip
    # an eager batch may carry another N / topk than the graphs were captured for
    extra = _check_spec(fb, mode, spec if for_graph else None, multi, for_graph)
    if bs == 0:
        return
    if bool((seq < 1).any()):
        i, v = _first_bad(seq < 1, seq)
        raise _refuse(f"seq_lens[{i}]", v, "must be >= 1")
    if bool((seq + extra > L).any()):
        i, v = _first_bad(seq + extra > L, seq + extra)
        what = f"seq_lens[{i}] + {extra}" if extra else f"seq_lens[{i}]"
        raise _refuse(what, v, f"exceeds max_context_len={L}")
    mask = getattr(fb.spec_info, "custom_mask", None) if mode.is_target_verify() else None
    if mask is not None:  # its size depends on seq_lens, checked above
        want = sum(layout.tree_mask_sizes(seq.tolist(), extra))
        if mask.numel() != want:
            raise _refuse("spec_info.custom_mask entries", mask.numel(),
                          f"expected sum over requests of N*(seq_len+N) = {want}")  # fmt: skip
    rows = _rows_per_request(fb, mode, fb.spec_info)
    if int(rows.sum()) != fb.num_tokens:
        raise _refuse("num_tokens", fb.num_tokens, f"expected {int(rows.sum())} rows for the "
                      f"batch's {bs} requests in {mode.name}")  # fmt: skip
    if (mode.is_any_draft_extend() or mode.is_extend()) and bool((seq < rows).any()):
        i, v = _first_bad(seq < rows, seq)
        raise _refuse(f"seq_lens[{i}]", v, f"counts the request's {int(rows[i])} new rows")
    pool = world.req_to_token_pool.size
    rpi = fb.req_pool_indices.cpu()
    bad = (rpi < 1) | (rpi >= pool)
    if bool(bad.any()):
        i, v = _first_bad(bad, rpi)
        limit = "row 0 is reserved for padded rows" if v == 0 else f"outside [1, pool={pool})"
        raise _refuse(f"req_pool_indices[{i}]", v, limit)
    if rpi.unique().numel() != bs:
        raise _refuse("req_pool_indices", rpi.tolist(), "a request appears twice in the batch")
    vocab = world.cfg.vocab_size
    for name, t, hi in (("input_ids", fb.input_ids, vocab), ("positions", fb.positions, L)):
        host = t.cpu()
        if bool(((host < 0) | (host >= hi)).any()):
            i, v = _first_bad((host < 0) | (host >= hi), host)
            raise _refuse(f"{name}[{i}]", v, f"outside [0, {hi})")
    _check_cache_slots(fb, seq + extra, rows, multi)


def _check_cache_slots(fb, span: torch.Tensor, rows: torch.Tensor, multi: bool) -> None:
    world, loc = fb.world, fb.out_cache_loc
    slots = world.kv_cache.num_slots
    host = loc.cpu()
    bad = (host < 1) | (host >= slots)
    if bool(bad.any()):
        i, v = _first_bad(bad, host)
        limit = "slot 0 is reserved for padded rows" if v == 0 else f"outside [1, {slots})"
        raise _refuse(f"out_cache_loc[{i}]", v, limit)
    if host.unique().numel() != host.numel():
        raise _refuse("out_cache_loc", "duplicates", "two rows would write the same KV slot")
    # ownership: which request's req_to_token span holds each slot (device work, one read)
    dev, r2t = world.device, world.req_to_token
    rpi = fb.req_pool_indices
    width = int(span.max())
    cols = torch.arange(width, device=dev)
    mine = r2t[rpi, :width].to(torch.int64)  # [bs, width]
    mine = torch.where(cols[None, :] < span.to(dev)[:, None], mine, slots)  # outside: a dump
    owner = torch.full((slots + 1,), -1, dtype=torch.int64, device=dev)
    owner.scatter_(
        0, mine.flatten(), torch.arange(fb.batch_size, device=dev).repeat_interleave(width)
    )
    writer = _owner_rows(fb, rows, multi).to(dev)
    wrong = (owner[loc] != writer).cpu()
    if bool(wrong.any()):
        i = int(wrong.nonzero()[0, 0])
        who = int(owner[loc[i]])
        whose = "no request of this batch" if who < 0 else f"request {who}"
        raise _refuse(f"out_cache_loc[{i}]", int(host[i]),
                      f"belongs to {whose}, not to the row's request {int(writer[i])}: a batch "
                      "may write only its own requests' KV slots")  # fmt: skip


def check_capture_config(runner) -> None:
    """Refuse, before any allocation, a capture the static buffers cannot hold."""
    spec, L, fill = runner.spec_cfg, runner.world.max_context_len, runner.fill_value
    span = fill + (spec.num_draft_tokens if runner.mode.is_target_verify() else 0)
    if runner.multi_step_draft:
        span = fill + spec.topk * spec.num_steps
    if span > L:
        raise BatchRefused(
            f"capture batch span {span} (fill value {fill} + the mode's drafts) exceeds "
            f"max_context_len={L}: raise the context length or lower N / topk / num_steps"
        )
    if runner.mode.is_any_draft_extend() and runner.tokens_per_req > L:
        raise BatchRefused(f"{runner.tokens_per_req} rows per request exceed max_context_len={L}")
    width = runner.max_bs * runner.tokens_per_req * L
    if width >= 2**31:
        raise BatchRefused(
            f"kv index buffers of max_bs * rows * L = {width} entries exceed int32 addressing "
            f"(2^31): max_bs={runner.max_bs}, rows={runner.tokens_per_req}, L={L}"
        )
