"""Measuring the replay path: what each phase of ``GraphRunner.replay`` costs, host and GPU.

The bench calls the runner's own phases between timers: **validate**, **copies** (``load_inputs``), **hook**
(``replay_hook``: metadata, outside the graph) and **launch** (``graph.replay()``), then **default**: the whole
``runner.replay(fb)`` a user calls, validation on (its device checks acted on by the load, ``refimpl.validate``). Host
µs from ``time.perf_counter`` with a synchronisation *between* iterations; GPU µs from CUDA events in passes of their own. Method: warm up, rotate
inputs, medians with p10/p25/p75/p90, optional pinning to one core, versions recorded beside every number. ``sweep`` adds
the whole step as a graph vs eagerly, capture time and memory (``python -m refimpl bench``). On CPU (the emulator) the
numbers say what the Python costs, not what a GPU launch costs.
"""

from __future__ import annotations

import os
import platform
import random
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm import tqdm

from .batch import ForwardBatch
from .config import SpecConfig
from .graphs.recorder import record_ops
from .graphs.runner import GraphRunner
from .layout import KINDS, GraphKind
from .rig.core import Rig, selection
from .rig.verdicts import glue_verdict


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

    env = dict(torch=torch.__version__, triton=triton.__version__, host=platform.node(), python=platform.python_version())
    try:
        import flashinfer

        env["flashinfer"] = flashinfer.__version__
    except Exception:
        env["flashinfer"] = None
    if torch.cuda.is_available():
        driver = _run("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")
        env.update(device=torch.cuda.get_device_name(), cuda=torch.version.cuda, driver=driver)
    else:
        env["device"] = f"CPU ({platform.processor() or platform.machine()}), graph emulator"
    env["git_commit"] = _run("git", "rev-parse", "HEAD")
    return env


def _run(*cmd):
    """A command's stripped stdout (run beside this file), or None."""
    try:
        out = subprocess.run(cmd, cwd=os.path.dirname(__file__), capture_output=True, text=True)
    except OSError:
        return None
    return out.stdout.strip() or None


def launches(fn: Callable[[], Any]) -> dict[str, int]:
    """The ops ``fn`` launches (views and allocations left out), by name: the kernel count. Host reads are allowed here
    (``fn`` runs outside any capture)."""
    with record_ops(None, refuse=False) as rec:
        fn()
    return dict(Counter(name for name, launches_work in rec.names if launches_work))


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
    for _ in range(warmup):
        fn()

    def loop(_):
        for _ in range(calls):
            fn()

    loops = [t / calls for t in host_times(loop, [None], repeats, 0, _sync(torch.cuda.is_available()))]
    q = statistics.quantiles(loops, n=10) if len(loops) > 1 else loops  # one loop: its own spread
    return {"median": statistics.median(loops), "p10": q[0], "p90": q[-1]}


def _sync(cuda):
    return torch.cuda.synchronize if cuda else (lambda: None)


RUN = 8  # hook / launch calls per loaded batch in ``time_replay_path``


def time_replay_path(runner: GraphRunner, batches: Sequence[ForwardBatch], repeats: int = 50, warmup: int = 10) -> dict[str, Any]:
    """Host µs of validate / copies / hook / launch and GPU µs of hook / graph of ``runner``'s replay phases, rotating
    ``batches`` (one raw batch size). Each host phase is timed in passes of its own, never right after a wait for a graph
    (that read 1.1-3x high: ``benchmarks/bench_vs_direct.py``). The hook and the launch run on the batch loaded
    (``load_inputs``, untimed) before a run of ``RUN`` calls: a hook fed one batch's spec input over another's lengths
    is no replay (FlashInfer's verify hook refuses the mismatched tree mask), and a load before every call read the
    hook 1.1-1.2x its plain loop on the H200 (cause not isolated). GPU µs: CUDA events, in passes of their own."""
    cuda = runner.device.type == "cuda"
    sync, raw_bs = _sync(cuda), batches[0].batch_size
    bs = runner.pick_bs(raw_bs)
    load = lambda fb: runner.load_inputs(fb, bs)
    hook = lambda fb: runner.replay_hook(fb, bs)
    # validate: a verdict no load read; copies: the validate pass's last verdict read
    settled = dict(before=lambda fb: runner.synchronize())
    loaded = dict(before=load, run=RUN)  # the hook and the launch: on a loaded batch, RUN calls each
    host = {
        name: host_times(f, batches, repeats, warmup, sync, **kw)
        for name, f, kw in (
            ("validate", runner.validate, settled),
            ("copies", load, settled),
            ("hook", hook, loaded),
            ("launch", lambda fb: runner.launch(bs), loaded),
        )
    }
    was, runner.validate_inputs = runner.validate_inputs, True  # the replay a user runs: validation on
    host["default"] = host_times(runner.replay, batches, repeats, warmup, sync)
    runner.validate_inputs = was
    runner.synchronize()
    total = lambda *parts: [sum(x) for x in zip(*(host[p] for p in parts))]  # per iteration
    host["hook+launch"], host["path"] = total("hook", "launch"), total("copies", "hook", "launch")
    gpu = {"hook": [], "graph": []}
    for it in range(warmup + repeats if cuda else 0):
        fb, events = batches[it % len(batches)], [torch.cuda.Event(True) for _ in range(3)]
        load(fb)
        sync()
        events[0].record()
        runner.replay_hook(fb, bs)  # direct calls between the events
        events[1].record()
        runner.launch(bs)
        events[2].record()
        sync()
        if it >= warmup:
            for times, start, end in zip(gpu.values(), events, events[1:]):  # hook, then graph
                times.append(start.elapsed_time(end) * 1e3)
    out = {"raw_bs": raw_bs, "graph_bs": bs, "host_us": {k: spread(v) for k, v in host.items()}}
    if cuda:
        out["gpu_us"] = {k: spread(v) for k, v in gpu.items()}
    load(fb := batches[0])
    return out | dict(
        hook_launches=launches(lambda: hook(fb)),
        copy_launches=launches(lambda: load(fb)),
        graph_kernels=dict(runner.graphs[bs].kernels()),
    )


def time_steps(runner: GraphRunner, batches: Sequence[ForwardBatch], repeats: int = 30, warmup: int = 5) -> dict:
    """The whole decoder step, wall µs with a synchronisation after each: as a graph (``runner.replay``) and eagerly
    (``runner.eager``); validation as the runner is configured."""
    sync = _sync(runner.device.type == "cuda")
    out = {
        n: spread(host_times(f, batches, repeats, warmup, sync, sync_after=True))
        for n, f in (("graph", runner.replay), ("eager", runner.eager))
    }
    out["eager_over_graph"] = out["eager"]["median"] / out["graph"]["median"]
    return out


# ----------------------------------------------------------------------------------------------
# the sweep behind ``python -m refimpl bench``

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CPU_DEFAULTS = dict(batch_sizes=(1, 2, 4), contexts=(64,), repeats=5, warmup=1, rotate=2, token_budget=1 << 10)


@dataclass
class BenchSettings:
    """What ``sweep`` measures. ``token_budget``: points with ``bs * context`` above it are skipped (memory and time: the
    KV of every rotated batch stays allocated)."""

    backends: Sequence[str] | None = None
    variants: Sequence[str] | None = None  # default: every variant that must pass
    modes: Sequence[str] = ("decode", "target_verify")
    batch_sizes: Sequence[int] = BATCH_SIZES  # the fields' defaults are the GPU defaults
    contexts: Sequence[int] = (512, 4096, 32768)
    repeats: int = 30
    warmup: int = 5
    rotate: int = 3
    token_budget: int = 1 << 21
    spec: SpecConfig = field(default_factory=lambda: SpecConfig(3, 1, 4))
    glue: bool = False  # also each shape the checker's glue verdict passes, its hook in a glue graph ("<variant>+glue")

    @classmethod
    def for_device(cls, cuda: bool, **overrides) -> BenchSettings:
        """The GPU defaults (the fields') or ``CPU_DEFAULTS``, then every override that is not None."""
        return cls(**{**({} if cuda else CPU_DEFAULTS), **{k: v for k, v in overrides.items() if v is not None}})


def _static_bytes(runner):
    """Bytes of the runner's static inputs and the backend's graph buffers (host mirrors are not device memory)."""
    tensors = {id(t): t for t in [*runner.backend.graph_buffers().values(), *runner.inputs.views().values()]}
    return sum(t.nbytes for t in tensors.values() if runner.device.type == "cpu" or t.device.type != "cpu")


def rotated_batches(gen, kind: str | GraphKind, bs: int, ctx: int, spec: SpecConfig, rotate: int, rng):
    """``rotate`` batches of ``bs`` requests, lengths uniform in [ctx/2, the mode's limit]."""
    kind = GraphKind.parse(kind)
    hi, lo = ctx - kind.span(spec), spec.num_draft_tokens + 1 if kind.mode.is_any_draft_extend() else 1
    lens = lambda: {} if kind.mode.is_idle() else dict(seq_lens=[max(rng.randint(max(1, hi // 2), hi), lo) for _ in range(bs)])
    return [gen.for_mode(kind, bs, **lens()) for _ in range(rotate)]


def sweep(settings: BenchSettings, progress: bool = False, sink: Callable[[list], Any] | None = None) -> list[dict[str, Any]]:
    """One row per backend x variant x mode x context x batch size (see ``BenchSettings``); ``sink(rows)`` is called after
    each runner (write partial results as they come)."""
    from .backends import GraphModeNotSupported
    from .graphs import make_engine

    engine, r = make_engine(), settings.rotate
    points = [
        (e, kind.label, ctx, glue)
        for e, kind in selection(settings.backends, settings.modes, settings.variants)
        for glue in (False, True)
        if not glue or settings.glue and glue_verdict(e, kind, engine)[0]  # proven on this engine: glued, right after
        for ctx in settings.contexts
    ]
    rows, cold_done = [], set()
    for entry, kind, ctx, glue in (bar := tqdm(points, desc="bench", disable=not progress)):
        variant = entry.variant + ("+glue" if glue else "")
        bar.set_postfix_str(f"{entry.name}/{variant}/{kind}/ctx {ctx}")
        sizes = [b for b in settings.batch_sizes if b * ctx <= settings.token_budget]
        if not sizes:
            continue
        P, max_bs = entry.page_size, max(sizes)
        try:  # validation is timed as its own phase (time_replay_path); the steps run without it
            rig = Rig.build(
                entry,
                KINDS[kind],
                settings.spec,
                engine,
                validate_inputs=False,
                glue=glue,
                capture_bs=tuple(sizes),
                max_context_len=ctx,
                pool_size=(r + 1) * max_bs + 2,
                num_slots=(r * max_bs + 2) * -(-ctx // P) * P + P,  # every rotated batch's pages, each request's rounded up
                gen_seed=1,
                capture=False,
            )
        except GraphModeNotSupported:
            continue
        runner, key = rig.runner, (entry.name, variant, kind)
        first = {c.bs: c for c in runner.capture()}
        again = {c.bs: c for c in runner.capture()[len(first) :]}  # warm: caches filled
        cold_label = "cold" if key not in cold_done else "warm (not first in process)"
        cold_done.add(key)
        gen, rng = rig.gen, random.Random(f"{(entry.name, entry.variant, kind)}:{ctx}")  # a glued row: its twin's batches
        for bs in sizes:
            batches = rotated_batches(gen, kind, bs, ctx, settings.spec, r, rng)
            rows.append(
                dict(
                    backend=entry.name,
                    variant=variant,
                    pattern=rig.backend.pattern,
                    mode=kind,
                    context=ctx,
                    bs=bs,
                    engine=engine.name,
                    **time_replay_path(runner, batches, settings.repeats, settings.warmup),
                    step_us=time_steps(runner, batches, settings.repeats, settings.warmup),
                    capture_s={"first": first[bs].seconds, "first_is": cold_label, "warm": again[bs].seconds},
                    pool_growth_bytes=first[bs].pool_growth,
                    pool_bytes=first[bs].pool_bytes,
                    static_bytes=_static_bytes(runner),
                )
            )
            gen.release_all()
        if sink:
            sink(rows)
        del rig, runner
        torch.cuda.empty_cache()  # (a no-op without CUDA)
    return rows


CSV_COLUMNS = tuple(
    "backend variant pattern mode context bs graph_bs validate_us copies_us hook_us launch_us path_us path_p10 "
    "path_p90 default_us gpu_graph_us gpu_hook_us graph_step_us eager_step_us eager_over_graph hook_launches copy_launches "
    "capture_first_s capture_warm_s pool_growth_bytes static_bytes".split()
)


def summary_table(rows: Sequence[dict[str, Any]]) -> str:
    """One line per point: host µs per part, the GPU graph time, the step as graph vs eager."""
    head = f"{'backend/variant':<26} {'mode':<14} {'ctx':>6} {'bs':>4} {'valid':>7} {'copies':>7} {'hook':>7} "
    head += f"{'launch':>7} {'gpu':>8} {'graph':>8} {'eager':>8} {'x':>5}"
    units = "host µs, medians: valid(ation) / copies / hook / launch; gpu: the graph's GPU µs; graph / eager: the whole step"
    lines = [units + ", wall µs; x: eager / graph", head, "-" * len(head)]
    for r in rows:
        g, st, name = r.get("gpu_us"), r["step_us"], f"{r['backend']}/{r['variant']}"
        gpu = f"{g['graph']['median']:8.1f}" if g else f"{'-':>8}"
        parts = " ".join(f"{r['host_us'][k]['median']:7.1f}" for k in ("validate", "copies", "hook", "launch"))
        lines.append(
            f"{name:<26} {r['mode']:<14} {r['context']:>6} {r['bs']:>4} {parts} {gpu} {st['graph']['median']:8.1f} "
            f"{st['eager']['median']:8.1f} {st['eager_over_graph']:5.2f}"
        )
    return "\n".join(lines)


def csv_row(r: dict[str, Any]) -> list:
    h, g, st = r["host_us"], r.get("gpu_us", {}), r["step_us"]
    med = lambda d, *keys: [round(d[k]["median"], 2) if k in d else "" for k in keys]  # noqa: E731
    return [
        *(r[k] for k in "backend variant pattern mode context bs graph_bs".split()),
        *med(h, "validate", "copies", "hook", "launch", "path"),
        *(round(h["path"][q], 2) for q in ("p10", "p90")),
        *med(h, "default"),
        *med(g, "graph", "hook"),
        *med(st, "graph", "eager"),
        round(st["eager_over_graph"], 2),
        *(sum(r[k].values()) for k in ("hook_launches", "copy_launches")),
        *(round(r["capture_s"][k], 4) for k in ("first", "warm")),
        r["pool_growth_bytes"],
        r["static_bytes"],
    ]  # the CSV_COLUMNS, in order
