"""Measuring the replay path: what each phase of ``GraphRunner.replay`` costs, host and GPU.

The bench calls the runner's own phases between timers: **validate**, **copies** (``load_inputs``), **hook**
(``replay_hook``: metadata, outside the graph) and **launch** (``graph.replay()``). Host µs from ``time.perf_counter``
with a synchronisation *between* iterations; GPU µs from CUDA events in passes of their own. Method: warm up, rotate
inputs, medians with p10/p25/p75/p90, optional pinning to one core, versions recorded beside every number. ``sweep`` adds
the whole step as a graph vs eagerly, capture time and memory (``python -m refimpl bench``). On CPU (the emulator) the
numbers say what the Python costs, not what a GPU launch costs.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .batch import ForwardBatch
from .config import SpecConfig
from .graphs.recorder import record_ops
from .graphs.runner import GraphRunner
from .layout import KINDS
from .rig import Rig, entries, graph_buffers


def spread(xs: Sequence[float]) -> dict[str, float]:
    """Median and quantiles of ``xs`` (any unit)."""
    q = statistics.quantiles(xs, n=20, method="inclusive") if len(xs) > 1 else [xs[0]] * 19
    return {"median": statistics.median(xs), "p10": q[1], "p25": q[4], "p75": q[14], "p90": q[17], "n": len(xs)}


def pin_to_core(core: int | None) -> str:
    """Pin this process to ``core`` (Linux); returns a note for the results."""
    if core is None:
        return "not pinned: host timings can swing 2x on a busy machine (use --pin)"
    os.sched_setaffinity(0, {core})
    return f"pinned to core {core}"


def environment() -> dict[str, Any]:
    """Device, driver and library versions, git commit: stored beside every result."""
    import triton

    env: dict[str, Any] = dict(torch=torch.__version__, triton=triton.__version__, host=platform.node())
    env["python"] = platform.python_version()
    try:
        import flashinfer

        env["flashinfer"] = flashinfer.__version__
    except Exception:
        env["flashinfer"] = None
    if torch.cuda.is_available():
        env["device"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
        env["driver"] = _run("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")
    else:
        env["device"] = f"CPU ({platform.processor() or platform.machine()}), graph emulator"
    env["git_commit"] = _run("git", "rev-parse", "HEAD")
    return env


def _run(*cmd: str) -> str | None:
    """A command's stripped stdout (run beside this file), or None."""
    try:
        out = subprocess.run(cmd, cwd=os.path.dirname(os.path.abspath(__file__)), capture_output=True, text=True)
    except OSError:
        return None
    return out.stdout.strip() or None


def launches(fn: Callable[[], Any]) -> dict[str, int]:
    """The ops ``fn`` launches (views and allocations left out), by name: the kernel count. Host reads are allowed here
    (``fn`` runs outside any capture)."""
    with record_ops(None, refuse=False) as rec:
        fn()
    counts: dict[str, int] = {}
    for name, launches_work in rec.names:
        if launches_work:
            counts[name] = counts.get(name, 0) + 1
    return counts


def host_times(fn, batches, repeats: int, warmup: int, sync, before=None, sync_after: bool = False, run: int = 1) -> list[float]:
    """Host µs of ``fn(fb)``, ``repeats`` calls after ``warmup``, ``batches`` rotated every ``run`` calls: ``before(fb)``
    untimed when the batch changes, ``sync()`` untimed before each call; with ``sync_after``, a synchronisation inside
    the timer (the wall time of a whole step)."""
    xs = []
    for it in range(warmup + repeats):
        fb = batches[it // run % len(batches)]
        sync()
        if before is not None and it % run == 0:
            before(fb)
        t0 = time.perf_counter()
        fn(fb)
        if sync_after:
            sync()
        if it >= warmup:
            xs.append((time.perf_counter() - t0) * 1e6)
    sync()
    return xs


def per_call_us(fn: Callable[[], Any], calls: int = 50, repeats: int = 200, warmup: int = 200) -> dict[str, float]:
    """Host µs per call of ``fn`` launched back to back: ``repeats`` loops of ``calls`` calls after ``warmup`` calls, a
    synchronisation between loops outside the timer; the median, p10 and p90 of the loops' per-call times (what one
    launch costs: ``benchmarks/launch_cost.py``)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    loops = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        loops.append((time.perf_counter() - t0) * 1e6 / calls)
        sync()
    q = statistics.quantiles(loops, n=10) if len(loops) > 1 else loops  # one loop: its own spread
    return {"median": statistics.median(loops), "p10": q[0], "p90": q[-1]}


RUN = 8  # hook / launch calls per loaded batch in ``time_replay_path``


def time_replay_path(runner: GraphRunner, batches: Sequence[ForwardBatch], repeats: int = 50, warmup: int = 10) -> dict[str, Any]:
    """Host µs of validate / copies / hook / launch and GPU µs of hook / graph of ``runner``'s replay phases, rotating
    ``batches`` (one raw batch size). Each host phase is timed in passes of its own, never right after a wait for a graph
    (that read 1.1-3x high: ``benchmarks/bench_vs_direct.py``). The hook and the launch run on the batch loaded
    (``load_inputs``, untimed) before a run of ``RUN`` calls: a hook fed one batch's spec input over another's lengths
    is no replay (FlashInfer's verify hook refuses the mismatched tree mask), and a load before every call read the
    hook 1.1-1.2x its plain loop on the H200 (cause not isolated). GPU µs: CUDA events, in passes of their own."""
    cuda = runner.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    raw_bs = batches[0].batch_size
    bs = runner.pick_bs(raw_bs)
    load = lambda fb: runner.load_inputs(fb, bs)
    phases = dict(validate=runner.validate, copies=load, hook=lambda fb: runner.replay_hook(fb, bs))
    phases["launch"] = lambda fb: runner.launch(bs)
    host: dict[str, list[float]] = {}
    for name, phase in phases.items():
        loaded = name in ("hook", "launch")
        host[name] = host_times(phase, batches, repeats, warmup, sync, before=load if loaded else None, run=RUN if loaded else 1)
    gpu: dict[str, list[float]] = {"hook": [], "graph": []}
    for it in range(warmup + repeats if cuda else 0):
        fb, events = batches[it % len(batches)], [torch.cuda.Event(True) for _ in range(3)]
        load(fb)
        sync()
        events[0].record()
        runner.replay_hook(fb, bs)
        events[1].record()
        runner.launch(bs)
        events[2].record()
        sync()
        if it >= warmup:
            gpu["hook"].append(events[0].elapsed_time(events[1]) * 1e3)
            gpu["graph"].append(events[1].elapsed_time(events[2]) * 1e3)
    out = {"raw_bs": raw_bs, "graph_bs": bs, "host_us": {k: spread(v) for k, v in host.items()}}
    out["host_us"]["hook+launch"] = spread([a + b for a, b in zip(host["hook"], host["launch"])])
    out["host_us"]["path"] = spread([sum(x) for x in zip(host["copies"], host["hook"], host["launch"])])
    if cuda:
        out["gpu_us"] = {k: spread(v) for k, v in gpu.items()}
    fb = batches[0]
    load(fb)
    out["hook_launches"] = launches(lambda: runner.replay_hook(fb, bs))
    out["copy_launches"] = launches(lambda: load(fb))
    out["graph_kernels"] = dict(runner.graphs[bs].kernels())
    return out


def time_steps(runner: GraphRunner, batches: Sequence[ForwardBatch], repeats: int = 30, warmup: int = 5) -> dict:
    """The whole decoder step, wall µs with a synchronisation after each: as a graph (``runner.replay``) and eagerly
    (``runner.eager``); validation as the runner is configured."""
    sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)
    out = {
        n: spread(host_times(f, batches, repeats, warmup, sync, sync_after=True))
        for n, f in (("graph", runner.replay), ("eager", runner.eager))
    }
    out["eager_over_graph"] = out["eager"]["median"] / out["graph"]["median"]
    return out


# ----------------------------------------------------------------------------------------------
# the sweep behind ``python -m refimpl bench``

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
GPU_DEFAULTS = dict(batch_sizes=BATCH_SIZES, contexts=(512, 4096, 32768), repeats=30, warmup=5, rotate=3)
GPU_DEFAULTS["token_budget"] = 1 << 21
CPU_DEFAULTS = dict(batch_sizes=(1, 2, 4), contexts=(64,), repeats=5, warmup=1, rotate=2, token_budget=1 << 10)


@dataclass
class BenchSettings:
    """What ``sweep`` measures. ``token_budget``: points with ``bs * context`` above it are skipped (memory and time: the
    KV of every rotated batch stays allocated)."""

    backends: Sequence[str] | None = None
    variants: Sequence[str] | None = None  # default: every variant that must pass
    modes: Sequence[str] = ("decode", "target_verify")
    batch_sizes: Sequence[int] = GPU_DEFAULTS["batch_sizes"]
    contexts: Sequence[int] = GPU_DEFAULTS["contexts"]
    repeats: int = 30
    warmup: int = 5
    rotate: int = 3
    token_budget: int = 1 << 21
    spec: SpecConfig = field(default_factory=lambda: SpecConfig(3, 1, 4))
    glue: bool = False  # also each shape the checker's glue verdict passes, its hook in a glue graph ("<variant>+glue")

    @classmethod
    def for_device(cls, cuda: bool, **overrides) -> BenchSettings:
        base = GPU_DEFAULTS if cuda else CPU_DEFAULTS
        return cls(**{**base, **{k: v for k, v in overrides.items() if v is not None}})


def _static_bytes(runner: GraphRunner) -> int:
    """Bytes of the runner's static inputs and the backend's graph buffers (host mirrors are not device memory)."""
    tensors = {id(t): t for _, t in graph_buffers(runner.backend)} | {id(t): t for t in runner.static_inputs().values()}
    on_host = runner.device.type == "cpu"
    return sum(t.numel() * t.element_size() for t in tensors.values() if on_host or t.device.type != "cpu")


def rotated_batches(gen, mode_case: str, bs: int, ctx: int, spec: SpecConfig, rotate: int, rng):
    """``rotate`` batches of ``bs`` requests, lengths uniform in [ctx/2, the mode's limit]."""
    kind = KINDS[mode_case]
    out = []
    for _ in range(rotate):
        if kind.mode.is_idle():
            out.append(gen.idle())
            continue
        hi = ctx - kind.span(spec)
        lens = [rng.randint(max(1, hi // 2), hi) for _ in range(bs)]
        if kind.mode.is_any_draft_extend():
            lens = [max(v, spec.num_draft_tokens + 1) for v in lens]
        out.append(gen.for_mode(kind, bs, seq_lens=lens))
    return out


def sweep(settings: BenchSettings, progress: bool = False, sink: Callable[[list], Any] | None = None) -> list[dict[str, Any]]:
    """One row per backend x variant x mode x context x batch size (see ``BenchSettings``); ``sink(rows)`` is called after
    each runner (write partial results as they come)."""
    import random

    from .backends import GraphModeNotSupported
    from .graphs import make_engine

    engine = make_engine("auto")
    cuda = engine.device.type == "cuda"
    spec = settings.spec
    from .check import glue_verdict

    plan = []
    for e in entries(settings.backends, settings.variants):
        for case in settings.modes:
            plan.append((e, case, False))
            if settings.glue and glue_verdict(e, case, engine)[0]:  # proven on this engine: glued, right after
                plan.append((e, case, True))
    points = [(e, case, ctx, glue) for e, case, glue in plan for ctx in settings.contexts]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(points), desc="bench")
    rows: list[dict[str, Any]] = []
    cold_done: set[tuple] = set()
    for entry, case, ctx, glue in points:
        variant = entry.variant + ("+glue" if glue else "")
        if bar is not None:
            bar.set_postfix_str(f"{entry.name}/{variant}/{case}/ctx {ctx}")
            bar.update()
        sizes = [b for b in settings.batch_sizes if b * ctx <= settings.token_budget]
        if not sizes:
            continue
        max_bs, P = max(sizes), entry.page_size
        per_req = -(-ctx // P) * P
        kw = dict(capture_bs=tuple(sizes), max_context_len=ctx, pool_size=(settings.rotate + 1) * max_bs + 2)
        kw.update(num_slots=(settings.rotate * max_bs + 2) * per_req + P, gen_seed=1, capture=False)
        try:  # validation is timed as its own phase (time_replay_path); the steps run without it
            rig = Rig.build(entry, KINDS[case], spec, engine, validate_inputs=False, glue=glue, **kw)
        except GraphModeNotSupported:
            continue
        runner, backend = rig.runner, rig.backend
        key = (entry.name, variant, case)
        first = {r.bs: r for r in runner.capture()}
        again = {r.bs: r for r in runner.capture()[len(first) :]}  # warm: caches filled
        cold_label = "cold" if key not in cold_done else "warm (not first in process)"
        cold_done.add(key)
        static_bytes = _static_bytes(runner)
        gen, rng = rig.gen, random.Random(f"{(entry.name, entry.variant, case)}:{ctx}")  # a glued row: its twin's batches
        for bs in sizes:
            batches = rotated_batches(gen, case, bs, ctx, spec, settings.rotate, rng)
            row = dict(backend=entry.name, variant=variant, pattern=backend.pattern, mode=case, context=ctx)
            row.update(bs=bs, engine=engine.name)
            row.update(time_replay_path(runner, batches, settings.repeats, settings.warmup))
            row["step_us"] = time_steps(runner, batches, settings.repeats, settings.warmup)
            row["capture_s"] = {"first": first[bs].seconds, "first_is": cold_label, "warm": again[bs].seconds}
            row.update(pool_growth_bytes=first[bs].pool_growth, pool_bytes=first[bs].pool_bytes)
            row["static_bytes"] = static_bytes
            rows.append(row)
            gen.release_all()
        if sink is not None:
            sink(rows)
        del rig, runner, backend
        if cuda:
            torch.cuda.empty_cache()
    if bar is not None:
        bar.close()
    return rows


CSV_COLUMNS = tuple(
    "backend variant pattern mode context bs graph_bs validate_us copies_us hook_us launch_us path_us path_p10 "
    "path_p90 gpu_graph_us gpu_hook_us graph_step_us eager_step_us eager_over_graph hook_launches copy_launches "
    "capture_first_s capture_warm_s pool_growth_bytes static_bytes".split()
)


def summary_table(rows: Sequence[dict[str, Any]]) -> str:
    """One line per point: host µs per part, the GPU graph time, the step as graph vs eager."""
    head = f"{'backend/variant':<26} {'mode':<14} {'ctx':>6} {'bs':>4} {'valid':>7} {'copies':>7} {'hook':>7} "
    head += f"{'launch':>7} {'gpu':>8} {'graph':>8} {'eager':>8} {'x':>5}"
    units = "host µs, medians: valid(ation) / copies / hook / launch; gpu: the graph's GPU µs; graph / eager: the whole step"
    lines = [units + ", wall µs; x: eager / graph", head, "-" * len(head)]
    for r in rows:
        h, g, st = r["host_us"], r.get("gpu_us"), r["step_us"]
        gpu = f"{g['graph']['median']:8.1f}" if g else f"{'-':>8}"
        name, parts = (r["backend"] + "/" + r["variant"], [h[k]["median"] for k in ("validate", "copies", "hook", "launch")])
        line = f"{name:<26} {r['mode']:<14} {r['context']:>6} {r['bs']:>4} " + " ".join(f"{x:7.1f}" for x in parts)
        lines.append(line + f" {gpu} {st['graph']['median']:8.1f} {st['eager']['median']:8.1f} {st['eager_over_graph']:5.2f}")
    return "\n".join(lines)


def csv_row(r: dict[str, Any]) -> list:
    h, g, st = r["host_us"], r.get("gpu_us", {}), r["step_us"]
    med = lambda d, k: round(d[k]["median"], 2) if k in d else ""  # noqa: E731
    cols = [r[k] for k in ("backend", "variant", "pattern", "mode", "context", "bs", "graph_bs")]
    cols += [med(h, k) for k in ("validate", "copies", "hook", "launch", "path")]
    cols += [round(h["path"]["p10"], 2), round(h["path"]["p90"], 2), med(g, "graph"), med(g, "hook")]
    cols += [med(st, "graph"), med(st, "eager"), round(st["eager_over_graph"], 2)]
    cols += [sum(r["hook_launches"].values()), sum(r["copy_launches"].values())]
    cols += [round(r["capture_s"]["first"], 4), round(r["capture_s"]["warm"], 4)]
    return cols + [r["pool_growth_bytes"], r["static_bytes"]]
