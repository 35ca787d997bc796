"""Measuring the replay path: what each part of ``GraphRunner.replay`` costs, host and GPU.

A replay runs four phases on the host (``GraphRunner.replay``), timed apart here by calling the
runner's own phase methods between the timers:

0. **validate**: ``refimpl.validate`` (off in timing runs: ``validate_inputs=False``);
1. **copies**: the batch into the static inputs (one foreach copy + the host mirror);
2. **hook**: the backend's ``init_forward_metadata_replay_cuda_graph`` (metadata out of graph);
3. **launch**: ``graph.replay()``.

Host times come from ``time.perf_counter`` around each part, with a device synchronisation
*between* iterations (never inside a timed part), so a part's number is what the host spends
issuing it. GPU time comes from CUDA events around the graph launch (and around the hook, whose
kernels run outside the graph), recorded in separate passes so that no event record is inside
a host-timed part. Method (the usual one for small launch-bound work): warm up, rotate the
inputs among several prepared batches, take medians of many repeats with their spread (p10 /
p25 / p75 / p90), pin the process to one core when asked, and record the device, driver and
library versions beside every number. ``sweep`` runs it per backend x variant x mode x context
x batch size and adds the whole step as a graph vs eagerly, capture time and memory
(``python -m refimpl bench``).

On CPU (the graph emulator) the same code runs and the numbers are labelled as emulator timings:
they say what the Python does, not what a GPU launch costs.
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

    env: dict[str, Any] = {"torch": torch.__version__, "triton": triton.__version__,
                           "python": platform.python_version(), "host": platform.node()}  # fmt: skip
    try:
        import flashinfer

        env["flashinfer"] = flashinfer.__version__
    except Exception:
        env["flashinfer"] = None
    if torch.cuda.is_available():
        env["device"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True)  # fmt: skip
        env["driver"] = smi.stdout.strip() or None
    else:
        env["device"] = f"CPU ({platform.processor() or platform.machine()}), graph emulator"
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        env["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here,
                                           capture_output=True, text=True).stdout.strip() or None  # fmt: skip
    except OSError:
        env["git_commit"] = None
    return env


def launches(fn: Callable[[], Any]) -> dict[str, int]:
    """The ops ``fn`` launches (views and allocations left out), by name: the kernel count.
    Host reads are allowed here (``fn`` runs outside any capture)."""
    with record_ops(None, refuse=False) as rec:
        fn()
    counts: dict[str, int] = {}
    for name, launches_work in rec.names:
        if launches_work:
            counts[name] = counts.get(name, 0) + 1
    return counts


class _Events:
    """CUDA events around a region (no-ops without CUDA)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        if cuda:
            self.start, self.end = torch.cuda.Event(True), torch.cuda.Event(True)

    def __enter__(self):
        if self.cuda:
            self.start.record()

    def __exit__(self, *exc):
        if self.cuda:
            self.end.record()

    def ms(self) -> float | None:
        return self.start.elapsed_time(self.end) if self.cuda else None


def time_replay_path(
    runner: GraphRunner, batches: Sequence[ForwardBatch], repeats: int = 50, warmup: int = 10
) -> dict[str, Any]:
    """Host µs of validation / copies / hook / launch and GPU µs of hook / graph for
    ``runner``'s replay path (``GraphRunner._replay``, part by part), rotating ``batches`` (all
    of one raw batch size). Medians with spread; see the module doc. Host times come from
    passes without CUDA events, GPU times from the passes in between (an event record is
    itself host work)."""
    cuda = runner.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    raw_bs = batches[0].batch_size
    bs = runner.pick_bs(raw_bs)
    graph = runner.graphs[bs]
    host: dict[str, list[float]] = {"validate": [], "copies": [], "hook": [], "launch": []}
    gpu: dict[str, list[float]] = {"hook": [], "graph": []}
    ev_hook, ev_graph = _Events(cuda), _Events(cuda)
    for it in range(warmup + 2 * repeats):
        fb = batches[it % len(batches)]
        timed_gpu = cuda and it >= warmup and (it - warmup) % 2 == 1  # events: their own passes
        sync()
        t0 = time.perf_counter()
        runner.validate(fb)
        t1 = time.perf_counter()
        runner.load_inputs(fb, bs)
        t2 = time.perf_counter()
        if timed_gpu:
            ev_hook.__enter__()
        runner.replay_hook(fb, bs)
        if timed_gpu:
            ev_hook.__exit__()
        t3 = time.perf_counter()
        if timed_gpu:
            ev_graph.__enter__()
        runner.launch(bs)
        if timed_gpu:
            ev_graph.__exit__()
        t4 = time.perf_counter()
        sync()
        if it < warmup:
            continue
        if timed_gpu:
            gpu["hook"].append(ev_hook.ms() * 1e3)
            gpu["graph"].append(ev_graph.ms() * 1e3)
        elif (it - warmup) % 2 == 0 or not cuda:
            for key, dt in (("validate", t1 - t0), ("copies", t2 - t1), ("hook", t3 - t2), ("launch", t4 - t3)):
                host[key].append(dt * 1e6)
    out = {"raw_bs": raw_bs, "graph_bs": bs, "host_us": {k: spread(v) for k, v in host.items()}}
    out["host_us"]["hook+launch"] = spread([a + b for a, b in zip(host["hook"], host["launch"])])
    out["host_us"]["path"] = spread([sum(x) for x in zip(host["copies"], host["hook"], host["launch"])])
    if cuda:
        out["gpu_us"] = {k: spread(v) for k, v in gpu.items()}
    fb = batches[0]
    runner.load_inputs(fb, bs)
    out["hook_launches"] = launches(lambda: runner.replay_hook(fb, bs))
    out["copy_launches"] = launches(lambda: runner.load_inputs(fb, bs))
    out["graph_kernels"] = dict(graph.kernels())
    return out


def time_steps(
    runner: GraphRunner, batches: Sequence[ForwardBatch], repeats: int = 30, warmup: int = 5
) -> dict[str, Any]:
    """The whole decoder step, wall µs with a device synchronisation after each: as a graph
    (``runner.replay``) and eagerly (``runner.eager``: fresh metadata, every kernel launched
    from Python); batch validation as the runner is configured (``sweep``: off, timed apart)."""
    cuda = runner.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    out = {}
    for name, step in (("graph", runner.replay), ("eager", runner.eager)):
        xs = []
        for it in range(warmup + repeats):
            fb = batches[it % len(batches)]
            sync()
            t0 = time.perf_counter()
            step(fb)
            sync()
            if it >= warmup:
                xs.append((time.perf_counter() - t0) * 1e6)
        out[name] = spread(xs)
    out["eager_over_graph"] = out["eager"]["median"] / out["graph"]["median"]
    return out


# ----------------------------------------------------------------------------------------------
# the sweep behind ``python -m refimpl bench``

GPU_DEFAULTS = dict(batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256), contexts=(512, 4096, 32768),
                    repeats=30, warmup=5, rotate=3, token_budget=1 << 21)  # fmt: skip
CPU_DEFAULTS = dict(batch_sizes=(1, 2, 4), contexts=(64,), repeats=5, warmup=1, rotate=2, token_budget=1 << 10)


@dataclass
class BenchSettings:
    """What ``sweep`` measures. ``token_budget``: points with ``bs * context`` above it are
    skipped (memory and time: the KV of every rotated batch stays allocated)."""

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

    @classmethod
    def for_device(cls, cuda: bool, **overrides) -> BenchSettings:
        base = GPU_DEFAULTS if cuda else CPU_DEFAULTS
        return cls(**{**base, **{k: v for k, v in overrides.items() if v is not None}})


def _static_bytes(runner: GraphRunner) -> int:
    """Bytes of the runner's static inputs and the backend's graph buffers."""
    seen, total = set(), 0
    tensors = [t for _, t in graph_buffers(runner.backend)] + list(runner._static().values())
    for t in tensors:
        if id(t) in seen or (t.device.type == "cpu" and runner.device.type != "cpu"):
            continue  # host mirrors are not device memory
        seen.add(id(t))
        total += t.numel() * t.element_size()
    return total


def _batches(gen, mode_case: str, bs: int, ctx: int, spec: SpecConfig, rotate: int, rng):
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


def sweep(
    settings: BenchSettings, progress: bool = False, sink: Callable[[list], Any] | None = None
) -> list[dict[str, Any]]:
    """One row per backend x variant x mode x context x batch size (see ``BenchSettings``);
    ``sink(rows)`` is called after each runner (write partial results as they come)."""
    import random

    from .backends import GraphModeNotSupported
    from .graphs import make_engine

    engine = make_engine("auto")
    cuda = engine.device.type == "cuda"
    spec = settings.spec
    plan = [(e, case) for e in entries(settings.backends, settings.variants) for case in settings.modes]
    points = [(e, case, ctx) for e, case in plan for ctx in settings.contexts]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(points), desc="bench")
    rows: list[dict[str, Any]] = []
    cold_done: set[tuple] = set()
    for entry, case, ctx in points:
        if bar is not None:
            bar.set_postfix_str(f"{entry.name}/{entry.variant}/{case}/ctx {ctx}")
            bar.update()
        sizes = [b for b in settings.batch_sizes if b * ctx <= settings.token_budget]
        if not sizes:
            continue
        max_bs, P = max(sizes), entry.page_size
        per_req = -(-ctx // P) * P
        try:  # validation is timed as its own part (time_replay_path); the steps run without it
            rig = Rig.build(entry, KINDS[case], spec, engine, capture_bs=tuple(sizes), max_context_len=ctx,
                            pool_size=(settings.rotate + 1) * max_bs + 2, gen_seed=1, capture=False,
                            num_slots=(settings.rotate * max_bs + 2) * per_req + P, validate_inputs=False)  # fmt: skip
        except GraphModeNotSupported:
            continue
        runner, backend, world = rig.runner, rig.backend, rig.world
        key = (entry.name, entry.variant, case)
        first = {r.bs: r for r in runner.capture()}
        again = {r.bs: r for r in runner.capture()[len(first) :]}  # warm: caches filled
        cold_label = "cold" if key not in cold_done else "warm (not first in process)"
        cold_done.add(key)
        static_bytes = _static_bytes(runner)
        gen, rng = rig.gen, random.Random(f"{key}:{ctx}")
        for bs in sizes:
            batches = _batches(gen, case, bs, ctx, spec, settings.rotate, rng)
            row = {"backend": entry.name, "variant": entry.variant, "pattern": backend.pattern,
                   "mode": case, "context": ctx, "bs": bs, "engine": engine.name}  # fmt: skip
            row.update(time_replay_path(runner, batches, settings.repeats, settings.warmup))
            row["step_us"] = time_steps(runner, batches, settings.repeats, settings.warmup)
            row["capture_s"] = {"first": first[bs].seconds, "first_is": cold_label, "warm": again[bs].seconds}
            row["pool_growth_bytes"] = first[bs].pool_growth
            row["pool_bytes"] = first[bs].pool_bytes
            row["static_bytes"] = static_bytes
            rows.append(row)
            gen.release_all()
        if sink is not None:
            sink(rows)
        del rig, runner, backend, world
        if cuda:
            torch.cuda.empty_cache()
    if bar is not None:
        bar.close()
    return rows


CSV_COLUMNS = ("backend", "variant", "pattern", "mode", "context", "bs", "graph_bs",
               "validate_us", "copies_us", "hook_us", "launch_us", "path_us", "path_p10",
               "path_p90", "gpu_graph_us", "gpu_hook_us", "graph_step_us", "eager_step_us",
               "eager_over_graph", "hook_launches", "copy_launches", "capture_first_s",
               "capture_warm_s", "pool_growth_bytes", "static_bytes")  # fmt: skip


def summary_table(rows: Sequence[dict[str, Any]]) -> str:
    """One line per point: host µs per part, the GPU graph time, the step as graph vs eager."""
    head = (f"{'backend/variant':<26} {'mode':<14} {'ctx':>6} {'bs':>4} {'valid':>7} "
            f"{'copies':>7} {'hook':>7} {'launch':>7} {'gpu':>8} {'graph':>8} {'eager':>8} "
            f"{'x':>5}")  # fmt: skip
    lines = [head, "-" * len(head)]
    for r in rows:
        h, g, st = r["host_us"], r.get("gpu_us"), r["step_us"]
        gpu = f"{g['graph']['median']:8.1f}" if g else f"{'-':>8}"
        lines.append(
            f"{r['backend'] + '/' + r['variant']:<26} {r['mode']:<14} {r['context']:>6} "
            f"{r['bs']:>4} {h['validate']['median']:7.1f} {h['copies']['median']:7.1f} "
            f"{h['hook']['median']:7.1f} {h['launch']['median']:7.1f} {gpu} "
            f"{st['graph']['median']:8.1f} {st['eager']['median']:8.1f} "
            f"{st['eager_over_graph']:5.2f}"
        )
    return "\n".join(lines)


def csv_row(r: dict[str, Any]) -> list:
    h, g, st = r["host_us"], r.get("gpu_us", {}), r["step_us"]
    med = lambda d, k: round(d[k]["median"], 2) if k in d else ""  # noqa: E731
    return [r["backend"], r["variant"], r["pattern"], r["mode"], r["context"], r["bs"],
            r["graph_bs"], med(h, "validate"), med(h, "copies"), med(h, "hook"),
            med(h, "launch"), med(h, "path"), round(h["path"]["p10"], 2),
            round(h["path"]["p90"], 2), med(g, "graph"), med(g, "hook"), med(st, "graph"),
            med(st, "eager"), round(st["eager_over_graph"], 2), sum(r["hook_launches"].values()),
            sum(r["copy_launches"].values()), round(r["capture_s"]["first"], 4),
            round(r["capture_s"]["warm"], 4), r["pool_growth_bytes"], r["static_bytes"]]  # fmt: skip


# ----------------------------------------------------------------------------------------------
# SGLang #29077 before / after: TRTLLM-MLA draft extend v2, one runner per shape


def trtllm_draft_extend_sweep(
    shapes: Sequence[str] = ("unified", "simplified", "in_graph"),
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256),
    *,
    context_len: int = 256,
    repeats: int = 50,
    warmup: int = 10,
    rotate: int = 4,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Replay-path cost of TRTLLM-MLA draft extend v2 per shape and batch size (graph engine of
    this machine: CUDA graphs on a GPU, the emulator on CPU). One row per (shape, bs)."""
    from .backends import find
    from .graphs import make_engine

    engine, spec = make_engine("auto"), SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)
    runners, world, gen = {}, None, None
    for shape in shapes:  # one world: every shape replays the same batches
        rig = Rig.build(find("trtllm_mla", shape)[0], KINDS["draft_extend_v2"], spec, engine, world=world,
                        capture_bs=tuple(batch_sizes), max_context_len=context_len, speculative=False,
                        pool_size=(rotate + 1) * max(batch_sizes) + 1, gen_seed=1, capture=False)  # fmt: skip
        rig.runner.capture(progress=progress)
        runners[shape], world, gen = rig.runner, rig.world, gen or rig.gen
    rows = []
    for bs in batch_sizes:
        batches = [gen.draft_extend(bs, 2) for _ in range(rotate)]
        for shape, runner in runners.items():
            row = time_replay_path(runner, batches, repeats, warmup)
            rows.append({"shape": shape, "bs": bs, **row})
        gen.release_all()
    return rows
