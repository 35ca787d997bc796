"""The issue-9 table, before and after: host µs of each part of the replay path, on a GPU.

    python benchmarks/replay_table.py [--pin CORE] [--repeats 400] [--out FILE.json]

Rows: Triton decode, FlashInfer decode, FlashInfer target verify, FlashInfer-MLA target
verify (the unified variants; add ``--rows`` for others), bs 1 / 8 / 64, context 256, tiny
2-layer models, medians of ``--repeats`` iterations after warm-up, 4 rotated batches. Columns:
the replay hook per bs, input copies, batch validation, ``graph.replay()``, GPU time of the
graph (CUDA events). It uses only runner methods that exist before and after the replay-path
work (``validate``, ``_load_inputs``, ``_replay_batch``), so the same file measures an older
checkout too: ``PYTHONPATH=old_tree python benchmarks/replay_table.py``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import sys
import time
from pathlib import Path

if "PYTHONPATH" not in os.environ:  # measure this checkout unless told otherwise
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from refimpl import bench, default_dtype  # noqa: E402
from refimpl.backends import find  # noqa: E402
from refimpl.batch import World  # noqa: E402
from refimpl.batchgen import BatchGenerator  # noqa: E402
from refimpl.config import GraphConfig, SpecConfig, tiny_model_config  # noqa: E402
from refimpl.graphs import make_engine  # noqa: E402
from refimpl.graphs.runner import GraphRunner, call_replay_hook  # noqa: E402
from refimpl.model import TinyDecoder  # noqa: E402
from refimpl.modes import ForwardMode  # noqa: E402

ROWS = ("triton/unified/decode", "flashinfer/unified/decode", "flashinfer/unified/target_verify",
        "flashinfer_mla/unified/target_verify")  # fmt: skip
SIZES = (1, 8, 64)


def replay_batch(runner, fb, bs):
    if "static" in inspect.signature(runner._replay_batch).parameters:  # before the change
        return runner._replay_batch(fb, bs, runner._static())
    return runner._replay_batch(fb, bs)


def measure(row: str, repeats: int, warmup: int, ctx: int = 256, rotate: int = 4) -> dict:
    name, variant, mode_name = row.split("/")
    mode = ForwardMode[mode_name.upper()]
    entry = next(e for e in find(name) if e.variant == variant)
    engine = make_engine("auto")
    dev = engine.device
    dtype = default_dtype(dev)
    cfg = tiny_model_config(entry.model_kind, dtype, dev.type)
    spec = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)
    world = World.create(cfg, max_context_len=ctx, pool_size=(rotate + 1) * max(SIZES) + 2,
                         page_size=entry.page_size, device=dev)  # fmt: skip
    world.randomize_kv(0)
    gcfg = GraphConfig(max_bs=max(SIZES), capture_bs=SIZES, max_context_len=ctx, speculative=True)
    runner = GraphRunner(TinyDecoder(cfg, dev), entry.load()(world, spec), engine, mode, gcfg, spec)
    runner.capture()
    gen = BatchGenerator(world, spec, seed=1)
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    out = {}
    for bs in SIZES:
        batches = [gen.for_mode(mode, bs) for _ in range(rotate)]
        parts = {"validate": [], "copies": [], "hook": [], "launch": [], "gpu_graph": []}
        graph = runner.graphs[bs]
        ev = [torch.cuda.Event(True), torch.cuda.Event(True)] if cuda else None
        for it in range(warmup + repeats):
            fb = batches[it % rotate]
            sync()
            t0 = time.perf_counter()
            runner.validate(fb)
            t1 = time.perf_counter()
            runner._load_inputs(fb, bs)
            t2 = time.perf_counter()
            call_replay_hook(runner.backend, replay_batch(runner, fb, bs))
            t3 = time.perf_counter()
            if cuda:
                ev[0].record()
            graph.replay()
            if cuda:
                ev[1].record()
            t4 = time.perf_counter()
            sync()
            if it >= warmup:
                for k, dt in zip(("validate", "copies", "hook", "launch"),
                                 (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):  # fmt: skip
                    parts[k].append(dt * 1e6)
                if cuda:
                    parts["gpu_graph"].append(ev[0].elapsed_time(ev[1]) * 1e3)
        out[bs] = {k: statistics.median(v) for k, v in parts.items() if v}
        gen.release_all()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--repeats", type=int, default=400)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--pin", type=int, default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    pinned = bench.pin_to_core(args.pin)
    res = {row: measure(row, args.repeats, args.warmup) for row in args.rows.split(",")}
    env = {**bench.environment(), "pinning": pinned, "repeats": args.repeats, "context": 256}
    print(f"{env.get('device')}; {pinned}; medians of {args.repeats}, host µs")
    print("| backend / mode | replay hook, bs 1 / 8 / 64 | input copies | batch validation | "
          "graph launch | graph GPU time, bs 1 / 64 |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for row, r in res.items():
        rng = lambda k: f"{min(r[b][k] for b in SIZES):.0f}–{max(r[b][k] for b in SIZES):.0f}"  # noqa: E731
        gpu = (f"{r[1]['gpu_graph']:.0f} / {r[64]['gpu_graph']:.0f}"
               if "gpu_graph" in r[1] else "-")  # fmt: skip
        hooks = " / ".join(f"{r[b]['hook']:.0f}" for b in SIZES)
        print(f"| {row} | {hooks} | {rng('copies')} | {rng('validate')} | {rng('launch')} | {gpu} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"environment": env, "rows": res}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
