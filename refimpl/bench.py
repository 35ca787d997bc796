"""Measuring the replay path: what each part of ``GraphRunner.replay`` costs, host and GPU.

A replay does three things on the host (``GraphRunner._replay``), timed apart here:

1. **copies**: the batch into the static inputs (``_write_inputs``, + the padded-row reset);
2. **hook**: the backend's ``init_forward_metadata_replay_cuda_graph`` (metadata out of graph);
3. **launch**: ``graph.replay()``.

Host times come from ``time.perf_counter`` around each part, with a device synchronisation
*between* iterations (never inside a timed part), so a part's number is what the host spends
issuing it. GPU time comes from CUDA events around the graph launch (and around the hook, whose
kernels run outside the graph). Method (the usual one for small launch-bound work): warm up,
rotate the inputs among several prepared batches, take medians of many repeats with their
spread (p10 / p25 / p75 / p90), pin the process to one core when asked, and record the device,
driver and library versions beside every number.

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
from typing import Any

import torch

from .batch import ForwardBatch
from .graphs.recorder import record_ops
from .graphs.runner import GraphRunner, call_replay_hook


def spread(xs: Sequence[float]) -> dict[str, float]:
    """Median and quantiles of ``xs`` (any unit)."""
    q = statistics.quantiles(xs, n=20, method="inclusive") if len(xs) > 1 else [xs[0]] * 19
    return {"median": statistics.median(xs), "p10": q[1], "p25": q[4], "p75": q[14], "p90": q[17],
            "n": len(xs)}  # fmt: skip


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
    """The ops ``fn`` launches (views and allocations left out), by name: the kernel count."""
    with record_ops(None) as rec:
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
    """Host µs of copies / hook / launch and GPU µs of hook / graph for ``runner``'s replay path,
    rotating ``batches`` (all of one raw batch size). Medians with spread; see the module doc."""
    cuda = runner.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    raw_bs = batches[0].batch_size
    bs = runner.pick_bs(raw_bs)
    graph, static = runner.graphs[bs], runner._static()
    host: dict[str, list[float]] = {"copies": [], "hook": [], "launch": []}
    gpu: dict[str, list[float]] = {"hook": [], "graph": []}
    ev_hook, ev_graph = _Events(cuda), _Events(cuda)
    for it in range(warmup + repeats):
        fb = batches[it % len(batches)]
        sync()
        t0 = time.perf_counter()
        runner._load_inputs(fb, bs)
        t1 = time.perf_counter()
        with ev_hook:
            call_replay_hook(runner.backend, runner._replay_batch(fb, bs, static))
        t2 = time.perf_counter()
        with ev_graph:
            graph.replay()
        t3 = time.perf_counter()
        sync()
        if it < warmup:
            continue
        for key, dt in (("copies", t1 - t0), ("hook", t2 - t1), ("launch", t3 - t2)):
            host[key].append(dt * 1e6)
        if cuda:
            gpu["hook"].append(ev_hook.ms() * 1e3)
            gpu["graph"].append(ev_graph.ms() * 1e3)
    out = {"raw_bs": raw_bs, "graph_bs": bs, "host_us": {k: spread(v) for k, v in host.items()}}
    out["host_us"]["hook+launch"] = spread([a + b for a, b in zip(host["hook"], host["launch"])])
    if cuda:
        out["gpu_us"] = {k: spread(v) for k, v in gpu.items()}
    fb = batches[0]
    runner._load_inputs(fb, bs)
    out["hook_launches"] = launches(
        lambda: call_replay_hook(runner.backend, runner._replay_batch(fb, bs, static))
    )
    out["graph_kernels"] = dict(graph.kernels())
    return out


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
    page_size: int = 64,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Replay-path cost of TRTLLM-MLA draft extend v2 per shape and batch size (graph engine of
    this machine: CUDA graphs on a GPU, the emulator on CPU). One row per (shape, bs)."""
    from .backends import find
    from .batch import World
    from .batchgen import BatchGenerator
    from .config import GraphConfig, SpecConfig, tiny_model_config
    from .graphs import make_engine
    from .model import TinyDecoder
    from .modes import ForwardMode

    engine = make_engine("auto")
    dev = engine.device
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    cfg = tiny_model_config("mla", dtype, dev.type)
    spec = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)
    max_bs = max(batch_sizes)
    world = World.create(cfg, max_context_len=context_len, pool_size=(rotate + 1) * max_bs + 1,
                         page_size=page_size, device=dev)  # fmt: skip
    world.randomize_kv(0)
    model = TinyDecoder(cfg, dev)
    gcfg = GraphConfig(max_bs=max_bs, capture_bs=tuple(batch_sizes), max_context_len=context_len)
    mode = ForwardMode.DRAFT_EXTEND_V2
    runners = {}
    for shape in shapes:
        backend = find("trtllm_mla", shape)[0].load()(world, spec)
        runners[shape] = GraphRunner(model, backend, engine, mode, gcfg, spec)
        runners[shape].capture(progress=progress)
    gen = BatchGenerator(world, spec, seed=1)
    rows = []
    for bs in batch_sizes:
        batches = [gen.draft_extend(bs, 2) for _ in range(rotate)]
        for shape, runner in runners.items():
            row = time_replay_path(runner, batches, repeats, warmup)
            rows.append({"shape": shape, "bs": bs, **row})
        gen.release_all()
    return rows
