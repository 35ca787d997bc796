"""Fuzzing every backend x shape x graph mode against eager and the dense oracle.

A ``FuzzTarget`` (backend entry, graph kind, spec: a chain, or a topk > 1 tree where the mode has trees) captures once,
then serves random batches (``draw``: padded or not, page boundaries favoured, random trees and accept lengths). Each
batch must (1) replay == eager == the float64 oracle with no foreign KV write (``rig.KVGuard``), and (2) replay bit for
bit the same after every graph buffer is **poisoned** past the part the graph reads (NaN for floats, -1 or the dtype's
max for indices, 1 for masks): no kernel reads a stale tail. ``tests/test_fuzz.py`` drives ``draw`` with hypothesis (a
bounded CI profile); ``python -m refimpl check --fuzz N`` prints a one-line ``reproduce(...)`` call for any mismatch.
"""

from __future__ import annotations

import random
import shlex
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import torch

from .backends import REGISTRY, BackendEntry, GraphModeNotSupported, find, load_backend_class
from .config import CHAIN, TREE, SpecConfig
from .graphs import GraphEngine, make_engine
from .kernels.bounds import bounds_guard
from .layout import GraphKind
from .rig.core import Names, Rig, graph_buffers, live_masks, poison_value, raised, selection, state_after
from .spec import DraftTree

CAPTURE_BS = (1, 2, 4, 8)
CONTEXT, SLOTS = 640, 102_400  # the default world: lengths past 512, slot ids past 65,536 (random page order)


@dataclass
class FuzzParams:
    """One random batch, printable as a reproducer."""

    raw_bs: int
    seq_lens: list[int]
    trees: list[list[int]] | None = None  # verify: parents per request
    accept_length: list[int] | None = None  # draft extend
    poison_high: bool = False  # index tails poisoned with the dtype's max instead of -1


@dataclass
class FuzzReport:
    batches: Counter[str] = field(
        default_factory=Counter
    )  # "backend/variant/mode/spec" -> count (serialise with vars(): asdict turns a Counter into pairs)
    mismatches: list[str] = field(default_factory=list)  # reproducers
    skipped: list[str] = field(default_factory=list)


def _label(entry, kind, spec):
    """``backend/variant/mode/chain`` or ``.../tree``: a target's name in reports and reproducers."""
    return f"{entry.name}/{entry.variant}/{kind}/{'tree' if spec.topk > 1 else 'chain'}"


class FuzzTarget:
    """One captured (backend entry, graph mode, spec) under test."""

    def __init__(
        self,
        entry: BackendEntry,
        kind: str,
        spec: SpecConfig,
        engine: GraphEngine,
        seed=0,
        capture_bs: tuple[int, ...] = CAPTURE_BS,
        num_layers: int | None = None,
        max_context_len: int = CONTEXT,
        num_slots: int | None = SLOTS,
        worlds: dict | None = None,
    ):
        """``capture_bs`` / ``num_layers`` / ``max_context_len`` / ``num_slots``: smaller for the CI profile (the Triton
        interpreter); ``worlds``: a KV-cache cache shared across targets (``Rig.build``)."""
        self.entry, self.spec, self.kind = entry, spec, GraphKind.parse(kind)
        # GraphModeNotSupported (the backend does not capture this kind): the caller skips
        self.rig = Rig.build(
            entry,
            self.kind,
            spec,
            engine,
            seed=seed,
            worlds=worlds,
            capture_bs=capture_bs,
            max_context_len=max_context_len,
            num_layers=num_layers,
            num_slots=num_slots,
        )
        self.runner, self.gen, self.mode = self.rig.runner, self.rig.gen, self.kind.mode

    @property
    def label(self) -> str:
        return _label(self.entry, self.kind.label, self.spec)

    def draw(self, rng: random.Random) -> FuzzParams:
        """Random batch parameters within what this target's mode allows."""
        mode, s, world = self.mode, self.spec, self.rig.world
        raw_bs = 0 if mode.is_idle() else rng.randint(1, self.runner.max_bs)
        # draft extend: seq_lens count the request's new rows and at least one verified token
        lo = self.kind.rows(s) + 1 if mode.is_any_draft_extend() else 1
        hi, P = world.max_context_len - self.kind.span(s), max(world.page_size, 16)

        def length():
            kind = rng.choice("short boundary boundary uniform max".split())
            if kind == "short":
                return rng.randint(lo, min(hi, lo + 4))
            if kind == "boundary":
                v = rng.choice(range(P, hi + 2, P)) + rng.choice([-1, 0, 1]) if hi >= P else hi
                return min(max(v, lo), hi)
            return hi if kind == "max" else rng.randint(lo, hi)

        return FuzzParams(  # drawn in this order: lengths, poison, trees (verify) or accept lengths (draft extend)
            raw_bs,
            [length() for _ in range(raw_bs)],
            poison_high=rng.random() < 0.5,
            trees=[DraftTree.draw(s, rng).parents for _ in range(raw_bs)] if mode.is_target_verify() else None,
            accept_length=[rng.randint(0, s.num_steps) for _ in range(raw_bs)] if mode.is_any_draft_extend() else None,
        )

    def batch(self, p: FuzzParams):
        if self.mode.is_idle():
            return self.gen.idle()
        kw = dict(seq_lens=p.seq_lens)
        if p.trees is not None:
            kw["trees"] = [DraftTree(t) for t in p.trees]
        if p.accept_length is not None:
            kw["accept_length"] = p.accept_length
        return self.gen.for_mode(self.kind, p.raw_bs, **kw)

    def poison_and_replay(self, fb, graph: torch.Tensor, high: bool = False) -> list[str]:
        """Poison every graph buffer's tail past ``fb``'s live region; a replay must give ``graph`` (the output before
        poisoning) bit for bit."""
        # what the graph for ``fb`` reads, found on a fresh backend (one captured bs, the batch replayed) and mapped onto
        # the runner's buffers, which have the same layout
        q, state = state_after(self.rig.new_backend, self.runner, self.runner.padded_batch(fb), replay=True)
        backend, n = self.runner.backend, 0
        for (name, buf), keep in zip(graph_buffers(backend), live_masks(q, state), strict=True):
            # an eager buffer (``eager_buffer_names``) that no live view covers is the eager path's alone: left as is
            if buf.is_contiguous() and (name.rsplit(".", 1)[-1] not in backend.eager_buffer_names or keep.any()):
                buf.view(-1)[~keep] = poison_value(buf, high)
                n += int((~keep).sum())
        again = self.runner.replay(fb)
        self.runner.synchronize()  # (a refusal its device checks found: now)
        if torch.allclose(again, graph, rtol=0, atol=0, equal_nan=True):  # bit for bit, NaN where NaN
            return []
        err = (again.float() - graph.float()).abs().nan_to_num(float("inf")).max().item()
        return [f"poisoned tails ({n} elements) changed the replay by {err:.3g}"]

    def check(self, p: FuzzParams) -> list[str]:
        """Problems with one batch (empty: it passed)."""
        fb = self.batch(p)
        try:
            v = self.rig.run(fb)
            return v.findings + self.poison_and_replay(fb, v.graph, p.poison_high)
        finally:
            self.gen.release(fb)


def targets(
    backends: Names = None, modes: Names = None, variants: Names = None, given: Iterable[BackendEntry] | None = None
) -> list[tuple[BackendEntry, str, SpecConfig]]:
    """Every (entry, mode, spec) to fuzz: ``rig.selection``'s (entry, kind) pairs (by default every shape that must pass),
    with a chain, and a tree too where the mode has topk > 1 trees. Entries that cannot run here, or modes a backend does
    not capture, are left to ``FuzzTarget`` to refuse."""
    trees = ("target_verify", "draft_decode", "draft_extend_v2")  # the modes with topk > 1 trees; chains everywhere
    return [
        (e, k.label, spec)
        for e, k in selection(backends, modes, variants, given)
        for spec in ((CHAIN, TREE) if k.label in trees else (CHAIN,))
    ]


@bounds_guard()  # metadata pointing outside a buffer: a finding, not a crash (kernels/bounds.py)
def reproduce(label: str, params: dict, seed: int = 0, engine: str = "auto", backend_class: str | None = None) -> list[str]:
    """Re-run one reported batch: ``label`` and ``params`` as a mismatch line prints them (``backend_class``: the
    ``module:Class`` of a backend under review)."""
    name, variant, kind, shape = label.split("/")
    entry = load_backend_class(backend_class) if backend_class is not None else find(name, variant)[0]
    target = FuzzTarget(entry, kind, TREE if shape == "tree" else CHAIN, make_engine(engine, liveness=True), seed=seed)
    return target.check(FuzzParams(**params))


@bounds_guard()
def fuzz(
    n: int,
    seed: int = 0,
    backends: Names = None,
    modes: Names = None,
    variants: Names = None,
    engine: str = "auto",
    progress: bool = False,
    given: Iterable[BackendEntry] | None = None,
) -> FuzzReport:
    """``n`` random batches per (backend, shape, mode, spec) target (``targets``; ``given``: backends under review)."""
    eng, worlds, report = make_engine(engine, liveness=True), {}, FuzzReport()

    def mismatch(line):
        report.mismatches.append(line)
        if progress:
            print(f"MISMATCH {line}", flush=True)

    for entry, kind, spec in targets(backends, modes, variants, given):
        label = _label(entry, kind, spec)
        try:
            target = FuzzTarget(entry, kind, spec, eng, seed=seed, worlds=worlds)
        except GraphModeNotSupported as e:
            report.skipped.append(f"{entry.name}/{entry.variant}/{kind}: {e}")
            continue
        except Exception as e:  # noqa: BLE001 - the capture raised: a mismatch, and on to the next target
            mismatch(f"{label} capture: {raised(e)}")
            continue
        for i in range(n):
            params = target.draw(random.Random(f"{seed}:{label}:{i}"))
            try:
                problems = target.check(params)
            except Exception as e:  # noqa: BLE001 - the review tool survives the code it reviews: a finding, not a crash
                problems = [raised(e)]
            report.batches[label] += 1
            if problems:
                cls = "" if entry in REGISTRY else f', backend_class="{entry.target}"'
                call = f'reproduce("{label}", {asdict(params)}, seed={seed}{cls})'
                how = "python -c " + shlex.quote(f"from refimpl.fuzz import reproduce; print({call})")  # a shell line
                mismatch(f"{label} batch {i}: {'; '.join(problems)}\n    reproduce: {how}")
        if progress:
            print(f"fuzz {label}: {report.batches[label]} batches", flush=True)
    return report
