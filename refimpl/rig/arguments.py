"""What a backend does with each argument it is handed: read, or dead (issue 33: SGLang's attention test kit lists a
dead argument passed to an eager verify path, its "M12", among the mutations no output comparison can see; a
buffer-level checker can say why: nothing the backend produces depends on it).

``argument_use(rig, fb)`` varies one field of the batch at a time (and of its spec input), so that no allocation is
smaller than what fills it (``_varied``: host values only grow, device values only shrink), and reruns two paths on a
fresh backend. A kernel planned from a grown host length can then read index entries nothing filled: refimpl's
kernels are bounds-guarded (``kernels/bounds.py``, a finding), real FlashInfer's on a GPU are not, so the CLI runs
``--arguments`` on a CPU only. The two paths:

- the **replay hook** (``state_after``: the capture hook on the runner's capture batch, then the replay hook on the
  padded batch): the graph-read state and the FlashInfer plans (the captured forward also reads the runner's own
  ``seq_lens``, ``positions`` and ``out_cache_loc`` directly: a field dead to the hook may still reach the graph);
- the **eager path** (``init_forward_metadata``, then the model, single-step modes): the output and the KV rows at the
  batch's write targets (a kernel that takes the new tokens' K and V from its inputs never reads them back, so a
  rotated ``out_cache_loc`` shows there only). Only the backend sees the varied field; the model (token embeddings,
  positions) keeps the batch's own, so a field the model reads but the backend does not is dead here.

A field is ``read`` when the state or output changes (the changed buffers are named; the eager path says ``output``),
``raised`` when the path raises on it (it looked), ``dead`` when nothing changed, ``dead, yet required`` when nothing
changed but the path raises when it is None (it looks at the field, asserts it or takes its maximum, and nothing it
produces depends on it: Cutlass-MLA's legacy replay hook asserts ``seq_lens_cpu``), ``not varied`` when the rule
leaves it no variation (a rotation of one request, a count of 1). ``dead`` is a statement about this
batch and this variation: a field read only through a quantity the variation keeps (a length never past a page
boundary, say) can look dead, so the classification is information, never a verdict.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..batch import ForwardBatch
from ..kernels import bounds
from .core import Rig, raised, state_after

Use = dict[str, str]  # field -> "read: <what changed>" | "raised: <error>" | "dead" | "dead, yet required: <error>"
# | "not varied"
STRUCTURAL = {"forward_mode", "batch_size", "world", "meta", "spec_info"}  # what selects the path, not an input to it


HOST = ("seq_lens_sum",)  # host values besides the *_cpu fields: they size allocations


def _varied(name: str, v: Any) -> Any:
    """``v`` changed, or None when no change keeps to the rule: device values never ask for more than the batch holds,
    host values never for less (a host length sizes an allocation the device lengths then fill: smaller, a kernel
    would write past it). So the request table's rows and the write targets rotate within the batch, masks flip,
    device counts and lengths past 1 halve, host lengths and sums double (the batch's sum and maximum change with them;
    a long length crosses page boundaries, a short one may not)."""
    host = name.endswith("_cpu") or name in HOST
    change = (lambda x: 2 * x) if host else (lambda x: x // 2 if x > 1 else x)
    if isinstance(v, torch.Tensor):
        if v.dtype == torch.bool:
            new = ~v
        elif v.is_floating_point():
            new = v + 1
        elif name in ("req_pool_indices", "out_cache_loc"):
            new = v.roll(1)
        else:
            new = 2 * v if host else torch.where(v > 1, v // 2, v)
        return None if not v.numel() or torch.equal(new, v) else new
    if isinstance(v, bool) or not isinstance(v, (int, list)):
        return None
    new = change(v) if isinstance(v, int) else [change(x) if type(x) is int else x for x in v]
    return None if new == v else new


def variations(fb: ForwardBatch):
    """``(name, with, value)`` per field of ``fb`` and of its spec input that is set: ``with`` makes the batch with that
    field alone replaced, ``value`` is its variation (None: it has none, ``_varied``)."""
    for f in dataclasses.fields(fb):
        if f.name not in STRUCTURAL and (v := getattr(fb, f.name)) is not None:
            yield f.name, (lambda x, k=f.name: fb.replace(**{k: x})), _varied(f.name, v)
    spec = fb.spec_info
    for f in dataclasses.fields(spec) if dataclasses.is_dataclass(spec) else ():
        if (v := getattr(spec, f.name)) is not None:
            with_ = lambda x, k=f.name: fb.replace(spec_info=dataclasses.replace(spec, **{k: x}))  # noqa: E731
            yield f"spec_info.{f.name}", with_, _varied(f.name, v)


def _changed(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    def same(x, y):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            return x.shape == y.shape and bool(((x.cpu() == y.cpu()) | (x.cpu() != x.cpu()) & (y.cpu() != y.cpu())).all())
        return type(x) is type(y) and (x is y or x == y)

    return sorted(k for k in a.keys() | b.keys() if k not in a or k not in b or not same(a[k], b[k]))


def _classify(run, fb) -> Use:
    """``run(batch)`` for every variation of ``fb``, against ``run(fb)``: what changed, what raised, what did not; a
    field whose values change nothing is also passed as None: a path that then raises requires an argument nothing it
    produces depends on (Cutlass-MLA's legacy replay hook asserts ``seq_lens_cpu``)."""
    base = run(fb)
    bounds.take()  # the row's own findings are the row's verdicts' business

    def attempt(batch):
        try:
            got = run(batch)
        except Exception as e:  # noqa: BLE001 - a path that raises on the varied field looked at it
            return raised(e).removeprefix("the batch raised ").rstrip(": ")
        finally:
            outside = bounds.take()  # the bounds guard's findings of this run are the variation's, not the row's
        return _changed(base, got) + ["an out-of-bounds read"] * bool(outside)

    def without(with_):  # the batch with the field None; None when the batch (its spec input) refuses None itself
        try:
            return with_(None)
        except (TypeError, ValueError):
            return None

    use = {}
    for name, with_, value in variations(fb):
        try:
            varied = None if value is None else with_(value)
        except (TypeError, ValueError):  # the spec input refuses the variation itself
            varied = None
        if varied is None:
            use[name] = "not varied"
            continue
        got = attempt(varied)
        if isinstance(got, str):
            use[name] = f"raised: {got}"
        elif got:
            use[name] = f"read: {', '.join(got)}"
        else:
            required = None if (batch := without(with_)) is None else attempt(batch)
            use[name] = f"dead, yet required: None raises {required}" if isinstance(required, str) else "dead"
    return use


class _Sees:
    """``backend`` as the model calls it, handing every ``forward`` the batch ``fb`` instead of the model's."""

    def __init__(self, backend, fb: ForwardBatch):
        self.backend, self.fb = backend, fb

    def forward(self, q, k, v, layer, _fb):
        return self.backend.forward(q, k, v, layer, self.fb)


def argument_use(rig: Rig, fb: ForwardBatch) -> dict[str, Use]:
    """``{"replay hook": {field: use}, "eager": {field: use}}`` for ``fb`` (the eager path: single-step modes only).
    The KV slots the batch writes are restored after the eager runs (a rotated ``out_cache_loc`` writes its rows in
    another order)."""
    runner = rig.runner
    padded = runner.padded_batch(fb)

    def hook(batch):
        return dict(state_after(rig.new_backend, runner, batch, replay=True, plans=True)[1])

    out = {"replay hook": _classify(hook, padded)}
    if rig.kind.multi_step:
        return out
    locs, kv = fb.out_cache_loc.to(rig.world.device), rig.world.kv_cache.buffers()
    saved = [buf[locs].clone() for buf in kv]

    def eager(batch):
        b = rig.new_backend()
        b.init_forward_metadata(batch)
        logits = rig.program(fb, _Sees(b, batch)).clone()
        return {"output": logits, "KV written": torch.cat([buf[locs].flatten(1) for buf in kv], 1)}

    try:
        out["eager"] = _classify(eager, fb)
    finally:
        for buf, rows in zip(kv, saved):
            buf[locs] = rows
    return out


def summary(use: Use) -> str:
    """``dead: a, b; required, no effect: c (None raises ...); read: d (x, y); raised: e (ValueError ...)`` for one
    path."""
    dead = [k for k, v in use.items() if v == "dead"]
    parts = [f"dead: {', '.join(dead) or 'none'}"]
    for what, label in (("dead, yet required", "required, no effect"), ("read", "read"), ("raised", "raised")):
        got = [f"{k} ({v.partition(': ')[2]})" for k, v in use.items() if v.partition(":")[0] == what]
        parts += [f"{label}: {', '.join(got)}"] if got else []
    same = [k for k, v in use.items() if v == "not varied"]
    return "; ".join(parts + ([f"not varied: {', '.join(same)}"] if same else []))
