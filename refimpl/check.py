"""The capture/replay equivalence checker: the verdicts (``refimpl.rig.verdicts``: (a) capture equals replay, (b) graph
equals eager, (c) eager matches the oracle, (d) replay keeps the padded-row invariants and matches the reference, (e)
the glue graph equals eager, (f) a history of replays) per backend x variant x graph kind x batch size, as records, and
the table of them.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import re
import sys
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from .backends import REGISTRY, BackendEntry, find, must_pass
from .backends.base import GraphModeNotSupported
from .graphs import GraphEngine, make_engine
from .kernels.bounds import bounds_guard
from .layout import GraphKind
from .modes import ForwardMode
from .rig.arguments import argument_use, summary
from .rig.core import INVARIANT, Names, Rig, raised, selection
from .rig.verdicts import (
    CheckSettings,
    capture_vs_replay,
    glue_per_size,
    glue_verdict,  # noqa: F401 - re-exported: refimpl.check's callers import it from here
    history_verdict,
    run_one,
)


@dataclass
class CheckRecord:
    backend: str
    variant: str
    mode: str
    bs: int  # 0 for idle, and for a skipped row (the backend does not capture the mode)
    engine: str
    capture_equals_replay: bool | None
    graph_equals_eager: bool | None
    matches_oracle: bool | None
    findings: list[str] = field(default_factory=list)
    pattern: str = ""
    replay_matches_reference: bool | None = None
    glue_equals_eager: bool | None = None
    glue_findings: list[str] = field(default_factory=list)  # why (e) is "no" or refused: information, fine unglued
    history_ok: bool | None = None  # (f) a sequence of replays through the captured graphs, each right (largest bs row)
    arguments: dict[str, dict[str, str]] = field(default_factory=dict)  # --arguments: path -> field -> use (information)

    expected: bool = False  # a legacy / as-upstream shape: its findings are the historical bugs it reproduces

    @property
    def verdicts(self) -> tuple[bool | None, ...]:
        """Verdicts (a), (b), (c), (d) and (f) ((e) is information)."""
        return (
            self.capture_equals_replay,
            self.graph_equals_eager,
            self.matches_oracle,
            self.replay_matches_reference,
            self.history_ok,
        )

    @property
    def passed(self) -> bool:
        return False not in self.verdicts

    @property
    def skipped(self) -> bool:
        """The backend does not capture the mode: no verdict was asked."""
        return bool(self.findings) and self.findings[0].startswith("skipped:") and self.capture_equals_replay is None

    @property
    def status(self) -> str:
        """``ok``, ``skipped``, ``expected`` (a historical shape's finding) or ``FAIL`` (a row that must pass did not)."""
        return "skipped" if self.skipped else "ok" if self.passed else "expected" if self.expected else "FAIL"

    def to_json(self) -> dict:
        return dataclasses.asdict(self) | {"status": self.status}


# --- one backend entry x graph kind --------------------------------------------------------------
def row_lengths(raw_bs: int) -> str:
    """How a row's batch draws its lengths (``BatchGenerator.lengths``): one request near the context and the others
    short; a lone request short (a lone long one saturates the split heuristic at its maximum, the value a buffer that
    was never refreshed may hold)."""
    return "one long" if raw_bs > 1 else "short"


@bounds_guard()  # metadata pointing outside a buffer: a finding, not a crash (kernels/bounds.py)
def check_entry_mode(
    entry: BackendEntry,
    kind: str | ForwardMode | GraphKind,
    engine: GraphEngine,
    settings: CheckSettings,
    worlds: dict | None = None,
) -> list[CheckRecord]:
    """The verdicts for one entry and graph kind, one record per raw batch size (one ``skipped`` record when the
    backend does not capture the kind). ``worlds``: a cache of KV caches shared across calls (``Rig.build``)."""
    kind = GraphKind.parse(kind)
    expected = not must_pass(entry.variant) and entry in REGISTRY  # a class under review (--backend-class) must pass

    try:
        cls = entry.load(kind.multi_step)
    except GraphModeNotSupported:
        cls = entry.load()
    pattern = getattr(cls, "pattern", "")
    notes = getattr(cls, "upstream_findings", {})  # {regex: the upstream code a matching finding reproduces}

    def noted(findings):
        return [f + "".join(f" [upstream: {n}]" for p, n in notes.items() if re.search(p, f)) for f in findings]

    def record(bs, *verdicts, findings, ref=None):
        return CheckRecord(
            entry.name, entry.variant, kind.label, bs, engine.name, *verdicts, noted(findings), pattern, ref, expected=expected
        )

    try:
        rig = Rig.build(entry, kind, settings.spec, engine, num_slots=settings.num_slots, worlds=worlds, **settings.rig_args())
    except GraphModeNotSupported as e:
        return [record(0, None, None, None, findings=[f"skipped: {e}"])]
    except Exception as e:  # noqa: BLE001 - the capture (or its warm-up) raised: a failing row, not a crash
        return [record(max(settings.raw_bs), False, None, None, findings=[f"capture: {raised(e)}"])]
    rows, raised_on_a_batch = [], False
    sizes = (0,) if kind.mode.is_idle() else settings.raw_bs
    for raw_bs in sizes:
        rig.gen.lengths = row_lengths(raw_bs)
        fb = rig.gen.for_mode(kind, raw_bs)
        try:
            # (a) capture path vs replay path, (d) replay state vs the first-principles reference
            diffs, ref_diffs = capture_vs_replay(rig.new_backend, rig.runner, fb)
            # (b) graph replay vs eager, no write into another request's KV; (c) eager vs the oracle
            v = run_one(rig, fb)
        except Exception as e:  # noqa: BLE001 - a hook that raises on a valid batch: a failing row, not a crash
            rows.append(record(raw_bs, False, None, None, findings=[raised(e)]))
            rig.gen.release(fb)
            raised_on_a_batch = True
            continue
        found = diffs + (ref_diffs or [])
        # (d)'s invariants again after the graph's replay (Rig.run): named once, and (d) fails on them
        more = [f for f in v.findings if f not in found]
        ref = False if any(f.startswith(INVARIANT) for f in more) else None if ref_diffs is None else not ref_diffs
        rows.append(record(raw_bs, not diffs, v.graph_ok, v.oracle_ok, findings=found + more, ref=ref))
        if settings.arguments and not kind.mode.is_idle():  # what the backend does with each field (information)
            rows[-1].arguments = argument_use(rig, fb)
        if settings.history and not kind.mode.is_idle() and raw_bs == max(sizes):  # (f): this replay is its step A
            rows[-1].history_ok, found = history_verdict(rig, raw_bs, a=fb)
            rows[-1].findings += noted(found)
        rig.gen.release(fb)
    if settings.glue_replays and not raised_on_a_batch:  # (e) last: the other verdicts' batches do not depend on it
        for row, (ok, found) in zip(rows, glue_per_size(rig, sizes, settings.glue_replays)):
            row.glue_equals_eager, row.glue_findings = ok, found
    return rows


_WORLDS: dict = {}  # a worker process's KV caches, shared by the targets it checks (``Rig.build(worlds=...)``)


def _check_one(entry: BackendEntry, kind: GraphKind, engine: str, settings: CheckSettings) -> list[CheckRecord]:
    torch.set_num_threads(1)  # one core per worker
    return check_entry_mode(entry, kind, make_engine(engine, liveness=True), settings, _WORLDS)


# default run, 114 targets on 2 workers, idle 2-core CPU machine: 157 s of rows at 84230ce, 166 s at 3022d29 (the same
# hour); 248 s at c0e701a, on a day that machine ran 1.5x slower
CPU_SECONDS_PER_TARGET = 2.8


def targets(backends=None, modes=None, variants=None, entries=None) -> list[tuple[BackendEntry, GraphKind]]:
    """The (entry, graph kind) pairs ``run_checks`` checks (``rig.selection``: every variant unless ``variants``). A
    selection with nothing in it raises ``ValueError``."""
    if not (found := selection(backends, modes, variants, entries, every_variant=True)) and entries is None:
        have = sorted({e.variant for n in backends or [None] for e in find(n)})
        raise ValueError(f"nothing to check: no variant {sorted(variants)} of {backends or 'any backend'} (have: {have})")
    return found


def run_checks(
    backends: Names = None,
    modes: Names = None,
    variants: Names = None,
    engine: str = "auto",
    settings: CheckSettings | None = None,
    entries: Iterable[BackendEntry] | None = None,
    progress: bool = False,
    jobs: int = 1,
) -> list[CheckRecord]:
    """Check the registered backends (``backends`` / ``variants`` filter them) or ``entries``; ``progress``: a bar on
    stderr, one step per entry x graph kind; ``jobs``: worker processes on the CPU emulator, each target checked whole
    in one (the rows come back in order; a CUDA engine checks in this process). A selection with nothing in it raises
    ``ValueError``."""
    settings, todo = settings or CheckSettings(), targets(backends, modes, variants, entries)
    eng = make_engine(engine, liveness=True)  # a replay of a freed input: a finding, not a read of freed memory
    bar = dict(desc="check", unit="target", file=sys.stderr, disable=not progress)
    if jobs > 1 and eng.device.type == "cpu" and len(todo) > 1:
        fork = multiprocessing.get_context("fork")  # workers inherit what is imported (and classes defined) here
        # the longest targets first (a multi-step kind runs the model once per step; idle, no request), so no worker
        # is left with a long one at the end; the rows come back in ``todo``'s order
        cost = lambda c: 3 if c.multi_step else 0 if c.mode.is_idle() else 1 if c.mode.is_decode() else 2
        with ProcessPoolExecutor(min(jobs, len(todo)), mp_context=fork) as pool:
            futures = {t: pool.submit(_check_one, *t, eng.name, settings) for t in sorted(todo, key=lambda t: -cost(t[1]))}
            return [r for t in tqdm(todo, **bar) for r in futures[t].result()]
    tasks, rows, worlds = tqdm(todo, **bar), [], {}  # worlds: one random KV cache per world shape, for every target
    for entry, kind in tasks:
        tasks.set_postfix_str(f"{entry.name}/{entry.variant} {kind.label}")
        rows.extend(check_entry_mode(entry, kind, eng, settings, worlds))
    return rows


# --- the table -------------------------------------------------------------------------------------
def table(rows: list[CheckRecord]) -> str:
    """The records as the CLI prints them: one line per row, its findings below it."""
    cols = "backend variant pattern mode bs engine cap=rep graph=eager oracle ref glue history status".split()
    v = {None: "-", True: "ok", False: "FAIL"}
    glue = {None: "-", True: "yes", False: "no"}  # (e) is not pass / fail
    cells = [
        (
            r.backend,
            r.variant,
            r.pattern,
            r.mode,
            "-" if r.skipped else str(r.bs),
            r.engine,
            *map(v.get, r.verdicts[:4]),
            glue[r.glue_equals_eager],
            v[r.history_ok],
            r.status,
        )
        for r in rows
    ]
    width = [max(map(len, column)) for column in zip(cols, *cells)]
    line = lambda values: " ".join(f"{x:<{w}}" for x, w in zip(values, width)).rstrip()
    lines = [line(cols), "-" * (sum(width) + len(width) - 1)]
    for r, row in zip(rows, cells):
        lines += [line(row), *(f"    - {f}" for f in r.findings), *map(_glue_line, r.glue_findings)]
        lines += [f"    (args) {path}: {summary(use)}" for path, use in r.arguments.items()]
    return "\n".join(lines)


def _glue_line(finding):
    """A verdict (e) finding as information: the row's status does not depend on it."""
    what, _, rest = finding.partition(": ")
    if what == "not glue-safe":
        return f"    (e) not glue-safe (information, not a failure): {rest}"
    return f"    (e) {what} (information): {rest}" if rest else f"    (e) {finding} (information)"


def failing(records: list[CheckRecord]) -> set[str]:
    """The verdicts that failed in any of ``records``, as letters ((e) is information, never a failure)."""
    return {c for r in records for c, x in zip("abcdf", r.verdicts) if x is False}
