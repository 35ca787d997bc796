"""The rig: one backend under capture and replay, built the same way for every tool.

``Rig.build`` makes world, backend, model or multi-step program, dense oracle, ``GraphRunner`` and batch generator for a
(backend entry, graph kind, spec, engine); ``check``, ``fuzz``, ``bench``, ``capabilities``, ``benchmarks/`` and the
notebooks are its clients. Beside it lives what their verdicts share: tolerances (``close``), the KV guard,
``state_after`` and ``graph_buffers``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from .._env import default_dtype
from ..backends import BackendEntry, find, must_pass
from ..backends.oracle import OracleBackend, OracleMultiStep
from ..batch import ForwardBatch, World
from ..batchgen import BatchGenerator
from ..config import GraphConfig, SpecConfig, tiny_model_config
from ..graphs import GraphEngine
from ..graphs.runner import GraphRunner, call_capture_hook, call_in_graph_hook, call_replay_hook, thawed
from ..kernels import bounds
from ..layout import KINDS, GraphKind
from ..model import MultiStepDraftProgram, TinyDecoder
from ..validate import BatchRefused

Names = Iterable[str] | None  # a selection by name (backends, variants, modes); None: every one


def selection(
    backends: Names = None,
    modes: Names = None,
    variants: Names = None,
    given: Iterable[BackendEntry] | None = None,
    every_variant: bool = False,
) -> list[tuple[BackendEntry, GraphKind]]:
    """The (entry, graph kind) pairs a tool runs: the ``given`` entries, else the registered ones of ``backends`` (default:
    all) and ``variants`` (default: every shape that must pass, not the historical ``legacy`` / ``as-upstream``; with
    ``every_variant``, every shape); each with every ``layout.KINDS`` kind, or ``modes``."""
    if given is None:
        given = [
            e
            for b in backends or [None]
            for e in find(b)
            if (e.variant in variants if variants else every_variant or must_pass(e.variant))
        ]
    kinds = [GraphKind.parse(m) for m in modes] if modes else KINDS.values()
    return [(e, k) for e in given for k in kinds]


def close(out: torch.Tensor, ref: torch.Tensor, tol: dict, what: str, findings: list[str]) -> bool:
    """``out`` equals ``ref`` within ``tol`` (and holds no NaN); else a finding says by how much."""
    if out.shape != ref.shape:
        findings.append(f"{what}: shape {tuple(out.shape)} vs {tuple(ref.shape)}")
        return False
    o, r = out.float(), ref.float()
    if torch.allclose(o, r, **tol) and not o.isnan().any():  # (empty tensors are close)
        return True
    diff = (o - r).abs()
    finite = diff[~(o.isnan() | r.isnan())]
    err = finite.max().item() if finite.numel() else float("nan")
    msg = f"{what}: max abs difference {err:.3g} (rtol {tol['rtol']}, atol {tol['atol']})"
    for mask, what in (
        (diff > tol["atol"] + tol["rtol"] * r.abs(), "; rows {} differ"),
        (o.isnan() & ~r.isnan(), "; NaN in rows {}"),
    ):
        if bad := mask.reshape(len(mask), -1).any(1).nonzero().flatten().tolist():  # the rows (tokens) it marks
            msg += what.format(_first_few(bad))
    findings.append(msg)
    return False


def _first_few(xs, n=8, name=str):
    return ", ".join(map(name, xs[:n])) + (f", ... ({len(xs)} in all)" if len(xs) > n else "")


def raised(e: Exception) -> str:
    """A batch whose replay or eager run raised, as a finding: the review tool survives the code it reviews (on a CPU an
    index past a buffer raises; a GPU kernel may read garbage instead)."""
    first = (str(e).strip().splitlines() or [""])[0]
    if isinstance(e, BatchRefused):  # the generator validated the batch: what changed it since ran in between
        return f"the runner refused a batch that was valid when drawn (did the backend change its input?): {first}"
    outside = isinstance(e, IndexError) or "out of bounds" in first or "out of range" in first
    return f"the batch raised {type(e).__name__}: {first}" + (" (metadata pointing outside a buffer?)" if outside else "")


class KVGuard:
    """Catch any write into a KV slot that the batch does not write itself.

    Every slot outside the batch (other live requests' and free ones; slot 0, the padded rows' reserved target, aside)
    holds a sentinel in its first element during the replay, so even a write of the old values is seen (a stale padded
    row recomputes them bit for bit; a correct replay never reads them). A KV write stores a whole slot row, so one
    element per slot and buffer suffices: a 100,000-slot MLA cache costs 0.4 MB, not 460. The batch's own earlier
    slots are compared whole with a snapshot. ``check()`` counts the writes and restores the foreign elements."""

    SENTINEL = -1234.5

    def __init__(self, world: World, fb: ForwardBatch):
        dev, buffers = world.device, world.kv_cache.buffers()
        writes = fb.out_cache_loc.to(dev)
        rows = world.req_to_token[fb.req_pool_indices.to(dev)]  # the request table lives on the world's device
        own = torch.zeros(world.kv_cache.num_slots, dtype=torch.bool, device=dev)
        own[rows[rows > 0]] = True
        outside = ~own
        outside[0] = outside[writes] = own[writes] = False  # own: the batch's own earlier tokens
        self.foreign, self.own = outside.nonzero().flatten(), own.nonzero().flatten()
        self.world, self.violations = world, 0
        self.firsts = [b.view(b.shape[0], -1)[:, 0] for b in buffers]  # [slots] views, one per buffer
        self.saved = [f[self.foreign].clone() for f in self.firsts]
        for f in self.firsts:
            f[self.foreign] = self.SENTINEL
        self.own_before = [b[self.own].clone() for b in buffers]

    def check(self, graph_locs: torch.Tensor | None = None, live_rows: int | None = None) -> list[str]:
        """Count the guarded slots written since construction and say whose they were; restore the foreign ones.
        ``graph_locs``: the graph's write targets (the runner's static ``out_cache_loc``), to name the row that wrote a
        slot; rows from ``live_rows`` on are padded."""
        # the sentinel in each buffer's dtype marks the untouched slots
        hit_foreign = torch.stack([f[self.foreign] != f.new_tensor(self.SENTINEL) for f in self.firsts]).any(0)
        for first, saved in zip(self.firsts, self.saved):
            first[self.foreign] = saved
        buffers = zip(self.world.kv_cache.buffers(), self.own_before)
        hit_own = torch.stack([(buf[self.own] != before).flatten(1).any(1) for buf, before in buffers]).any(0)
        problems = []
        for hit, slots, what in (
            (hit_foreign, self.foreign, "padded or live rows wrote {} KV slot(s) outside the batch (other requests' or free)"),
            (hit_own, self.own, "the replay overwrote {} earlier KV slot(s) of requests in this batch"),
        ):
            if n := int(hit.sum()):  # slots, over every layer
                self.violations += n
                problems.append(what.format(n) + self._whose(slots[hit], graph_locs, live_rows))
        return problems

    def _whose(self, slots, graph_locs, live_rows):
        """``: slot s (request-table row p, position t; written by graph row r, a padded row), ...``"""
        table = self.world.req_to_token.to(slots.device)

        def whose(s):
            held = (table == s).nonzero().tolist()
            out = f"request-table row {held[0][0]}, position {held[0][1]}" if held else "a free slot"
            if graph_locs is not None:
                writers = (graph_locs.to(slots.device) == s).nonzero().flatten().tolist()[:2]  # the first two
                for r in writers:
                    out += f"; written by graph row {r}" + (", a padded row" if live_rows is not None and r >= live_rows else "")
            return f"slot {s} ({out})"

        return ": " + _first_few(slots.tolist(), 4, whose)


def poison_value(t: torch.Tensor, high: bool = False):
    """NaN for floats, 1 for masks, -1 (or, ``high``, the dtype's largest value) for indices."""
    if t.dtype in (torch.bool, torch.uint8):
        return 1
    if t.is_floating_point():
        return float("nan")
    return torch.iinfo(t.dtype).max if high else -1


def state_after(
    new_backend: Callable[[], Any], runner: GraphRunner, padded: ForwardBatch, replay: bool, poisoned=False, plans=False
):
    """``(backend, graph_state)`` of a fresh backend fed ``padded`` as a graph would see it: through the capture hook
    (``replay=False``), or through the capture hook on the runner's capture batch and then the replay hook
    (``replay=True``, what a replay does). Backends that rebuild metadata inside the graph get their in-graph hook after
    the last out-of-graph one. ``poisoned``: every graph buffer poisoned first (``poison_value``): what still holds the
    poison the hooks never wrote (an index buffer gets its dtype's largest value, not the -1 a block table starts at).
    ``plans``: the replay hook's FlashInfer plans too (``flashinfer_wrappers.plan_state``, their inputs recorded)."""
    from ..flashinfer_wrappers import count_plans, plan_state

    b, bs = new_backend(), padded.batch_size
    b.init_cuda_graph_state(runner.max_bs, runner.max_num_tokens)
    for _, buf in graph_buffers(b) if poisoned else ():
        buf.fill_(poison_value(buf, high=True))  # not -1: a block table starts at -1
    call_capture_hook(b, runner.capture_batch(bs) if replay else padded)
    if replay:
        with count_plans(b) if plans else contextlib.nullcontext():
            call_replay_hook(b, padded)
    call_in_graph_hook(b, padded)  # what a graph's own metadata nodes would do first
    return b, b.graph_state(bs, runner.mode) | (plan_state(b) if plans else {})


def graph_buffers(backend) -> list[tuple[str, torch.Tensor]]:
    """``backend.graph_buffers()`` as ``(name, tensor)`` pairs, each tensor once (multi-step steps repeat some)."""
    seen = set()
    return [(n, t) for n, t in backend.graph_buffers().items() if id(t) not in seen and not seen.add(id(t))]


def live_masks(backend, state: dict[str, Any]) -> list[torch.Tensor]:
    """For each of the backend's graph buffers, which elements ``state``'s live views cover (the views share the buffers'
    storage, as ``graph_state`` returns them)."""
    views = [v for v in state.values() if isinstance(v, torch.Tensor) and v.numel()]
    masks = []
    for _, buf in graph_buffers(backend):
        keep = torch.zeros(buf.numel(), dtype=torch.bool, device=buf.device)  # laid out as buf's elements
        lo, ptr = buf.storage_offset(), buf.untyped_storage().data_ptr()
        for v in views:
            off = v.storage_offset()
            end = off + sum((n - 1) * st for n, st in zip(v.shape, v.stride())) + 1
            inside = v.untyped_storage().data_ptr() == ptr and lo <= off and end <= lo + buf.numel()
            if inside and v.dtype == buf.dtype:  # a view inside this buffer
                keep.as_strided(v.shape, v.stride(), off - lo).fill_(True)
        masks.append(keep)
    return masks


INVARIANT = "invariant:"  # how a padded-row invariant's finding starts


def padded_row_invariants(state: dict[str, Any], rows: int) -> list[str]:
    """Verdict (d)'s rules for every backend, reference or not, checked again after every replay (``Rig.run``, the
    history's long run), over the first ``rows`` rows of the captured size (padded rows included): each CSR pointer (``*indptr``, ``*cu_seqlens*``) starts at 0 and never decreases over its first
    ``rows + 1`` entries, each length (a name holding ``len`` or ``seqused``) is >= 0 over its first ``rows``. A kernel
    loops zero times over a negative range, so no output shows a break; this names the buffer and the entry. SGLang
    0.5.23's attention test kit asserts the same after each decode replay init (``assert_cg_metadata_well_formed``, over
    its own list of field names: [facts#padding])."""
    out = []
    for key, v in state.items():
        name, t = key.rsplit(".", 1)[-1], torch.tensor(v, device="cpu") if type(v) is int else v
        if not isinstance(t, torch.Tensor) or t.is_floating_point() or t.dtype == torch.bool or not t.numel():
            continue
        t = t.reshape(-1).to("cpu", torch.int64)
        if name.endswith("indptr") or "cu_seqlens" in name:
            t = t[: rows + 1]
            drops = (t[1:] < t[:-1]).nonzero().flatten().tolist()
            if int(t[0]):
                out.append(f"{INVARIANT} {key}[0] = {int(t[0])}, must be 0")
            elif drops:
                i = drops[0] + 1
                out.append(f"{INVARIANT} {key}[{i}] = {int(t[i])} < {key}[{i - 1}] = {int(t[i - 1])}: must never decrease")
        elif ("len" in name or "seqused" in name) and (neg := (t[:rows] < 0).nonzero().flatten().tolist()):
            out.append(f"{INVARIANT} {key}[{neg[0]}] = {int(t[neg[0]])}: a length, must be >= 0")
    return out


@dataclass
class Verdict:  # one batch replayed, run eagerly and on the oracle: the checker's (b) and (c)
    graph: torch.Tensor
    eager: torch.Tensor
    graph_ok: bool  # graph == eager and no guarded KV slot written
    oracle_ok: bool  # eager == the dense oracle
    findings: list[str]  # why not: empty when both are ok


@dataclass
class Rig:
    """A backend entry captured for one graph kind: ``Rig.build(...)``, then ``rig.runner``."""

    entry: BackendEntry
    kind: GraphKind
    spec: SpecConfig
    world: World
    backend: Any
    program: Any
    oracle: Any
    runner: GraphRunner
    gen: BatchGenerator
    tol: dict

    @staticmethod
    def world_for(
        entry: BackendEntry, device: torch.device, dtype: torch.dtype | None = None, num_layers: int | None = None, **kw
    ) -> World:
        """The world an entry's model kind and page size need (float32 on CPU, bf16 on CUDA); ``kw``: ``World.create``'s."""
        cfg = tiny_model_config(entry.model_kind, dtype or default_dtype(device), device.type)
        if num_layers is not None:
            cfg = dataclasses.replace(cfg, num_layers=num_layers)
        return World.create(cfg, page_size=entry.page_size, device=device, **kw)

    @classmethod
    def build(
        cls,
        entry: BackendEntry,
        kind: GraphKind,
        spec: SpecConfig,
        engine: GraphEngine,
        *,
        capture_bs: tuple[int, ...],
        max_context_len: int,
        dtype: torch.dtype | None = None,
        seed: int = 0,
        gen_seed: int | None = None,
        num_slots: int | None = None,
        pool_size: int | None = None,
        num_layers: int | None = None,
        world: World | None = None,
        worlds: dict | None = None,
        capture: bool = True,
        **runner_kw,
    ) -> Rig:
        """World (random KV from ``seed``; or a shared ``world``; or, given a ``worlds`` cache, the KV cache of an earlier
        build with the same sizes under fresh request and slot tables: a 100,000-slot MLA cache takes 1.3 s to draw on a
        CPU), backend, program, oracle, runner (captured unless ``capture=False``) and batch generator (``gen_seed``,
        default ``seed + 1``). Raises ``GraphModeNotSupported`` before any capture when the backend does not capture
        ``kind``."""
        if world is None:
            world = cls.world_for(
                entry,
                engine.device,
                dtype,
                num_layers,
                max_context_len=max_context_len,
                pool_size=pool_size or 4 * max(capture_bs) + 8,
                num_slots=num_slots,
                seed=seed,
                kv_caches={} if worlds is None else worlds,  # {}: a KV cache of its own, drawn at random
            )
        backend = entry.load(kind.multi_step)(world, spec)
        backend.check_graph_mode(kind.mode)
        model = TinyDecoder(world.cfg, engine.device)
        program = MultiStepDraftProgram(model, spec.num_steps) if kind.multi_step else model
        oracle = (OracleMultiStep if kind.multi_step else OracleBackend)(world, spec)
        gcfg = GraphConfig(max(capture_bs), tuple(capture_bs), max_context_len=max_context_len)
        runner = GraphRunner(program, backend, engine, kind, gcfg, spec, **runner_kw)
        if capture:
            bounds.take()
            runner.capture()
            bounds.take()  # the capture's dummy batches: every replay re-runs (and re-records) what the graph reads
        gen = BatchGenerator(world, spec, seed=seed + 1 if gen_seed is None else gen_seed)
        t = 1e-4 if world.cfg.dtype == torch.float32 else 3e-2  # the tolerances
        return cls(entry, kind, spec, world, backend, program, oracle, runner, gen, dict(rtol=t, atol=t))

    def new_backend(self):
        """A fresh instance of the rig's backend class on the same world."""
        return type(self.backend)(self.world, self.spec)

    def invariants(self, raw_bs: int) -> list[str]:
        """``padded_row_invariants`` of what the graph for ``raw_bs`` requests reads as the last replay left it: the
        runner's backend's ``graph_state`` over the metadata that graph captured (``GraphRunner.frozen``; a later
        capture, eager run or hook may have set another since)."""
        bs, runner = self.runner.pick_bs(raw_bs), self.runner
        per = runner.spec_cfg.topk if runner.kind.multi_step else 1  # multi-step draft decode: a row per branch
        with thawed(runner.backend, runner.frozen[bs]):
            return padded_row_invariants(runner.backend.graph_state(bs, runner.mode), bs * per)

    def run(self, fb: ForwardBatch) -> Verdict:
        """Replay ``fb`` under the KV guard, run it eagerly and on the oracle; compare."""
        guard = KVGuard(self.world, fb)
        try:
            graph = self.runner.replay(fb).clone()
            self.runner.synchronize()  # a refusal its device checks found: now
        finally:  # restore the guarded slots even when the replay raised; a multi-step graph's static targets hold every
            # step: no single live-row boundary
            findings = guard.check(self.runner.inputs.out_cache_loc, None if self.kind.multi_step else fb.out_cache_loc.numel())
        findings += self.invariants(fb.batch_size)  # the graph's buffers as this replay left them
        outside = [f"out of bounds: the graph read {f}" for f in bounds.take()]  # (bounds_guard() on: a finding)
        eager = self.runner.eager(fb).clone()
        outside += [f"out of bounds: eager read {f}" for f in bounds.take()]
        findings += outside
        graph_ok = close(graph, eager, self.tol, "graph vs eager", findings) and not guard.violations and not outside
        self.oracle.init_forward_metadata(fb)
        follow = {"follow": eager} if self.kind.multi_step else {}  # the oracle's steps take eager's picks
        oracle_ok = close(eager, self.program(fb, self.oracle, **follow), self.tol, "eager vs oracle", findings)
        return Verdict(graph, eager, graph_ok, oracle_ok, findings)


__all__ = [
    "Names",
    "selection",
    "close",
    "raised",
    "KVGuard",
    "poison_value",
    "state_after",
    "graph_buffers",
    "live_masks",
    "INVARIANT",
    "padded_row_invariants",
    "Verdict",
    "Rig",
]
