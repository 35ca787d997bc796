"""Why the bench's hook column reads high: the same replay hook timed several ways in one process.

    python benchmarks/bench_vs_direct.py [--pin CORE] [--repeats 400] [--out FILE.json]

Per row (backend/variant/mode) and batch size, host µs medians of the replay hook (``runner.replay_hook``):

- ``direct``: the hook alone in a plain loop, one batch, a synchronisation before the loop only;
- ``direct_sync``: the same, a synchronisation before every call (outside the timer);
- ``rotate``: as ``direct_sync``, the batches rotated as the bench rotates them;
- ``after_copies``: as ``rotate``, ``load_inputs`` run just before each call (outside the timer);
- ``after_validate``: as ``after_copies``, ``validate`` run first too (the bench's phase order);
- ``interleaved``: the old bench's loop: synchronise, validate, copies, the hook (timed), ``graph.replay()``, so each
  hook call follows a wait for the previous step's graph;
- ``bench``: ``bench.time_replay_path``'s hook column (each phase in passes of its own, since issue 16).

The column where the number jumps names the cause. ``--sweep-setup --ctx 4096`` builds what ``bench.sweep`` builds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from refimpl import bench
from refimpl.backends import find
from refimpl.config import CHAIN
from refimpl.graphs import make_engine
from refimpl.layout import KINDS
from refimpl.rig import Rig

ROWS = ("triton/unified/decode", "trtllm_mla/unified/draft_extend_v2", "trtllm_mla/in_graph/draft_extend_v2")
SIZES = (1, 16)


def _loop(runner, batches, bs, repeats, warmup, sync_each=True, copies=False, validate=False) -> float:
    sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)
    xs = []
    sync()
    for it in range(warmup + repeats):
        fb = batches[it % len(batches)]
        if validate:
            runner.validate(fb)
        if copies:
            runner.load_inputs(fb, bs)
        if sync_each:
            sync()
        t0 = time.perf_counter()
        runner.replay_hook(fb, bs)
        t1 = time.perf_counter()
        if it >= warmup:
            xs.append((t1 - t0) * 1e6)
    sync()
    return statistics.median(xs)


def _interleaved(runner, batches, bs, repeats, warmup) -> float:
    sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)
    xs = []
    for it in range(warmup + repeats):
        fb = batches[it % len(batches)]
        sync()
        runner.validate(fb)
        runner.load_inputs(fb, bs)
        t0 = time.perf_counter()
        runner.replay_hook(fb, bs)
        t1 = time.perf_counter()
        runner.launch(bs)
        if it >= warmup:
            xs.append((t1 - t0) * 1e6)
    sync()
    return statistics.median(xs)


def measure(row: str, repeats: int, warmup: int, ctx: int = 256, rotate: int = 4, sweep_setup: bool = False) -> dict:
    """``sweep_setup``: the rig, batches and sizes ``bench.sweep`` builds (every captured size of the ladder, pools
    for ``rotate`` batches of the largest, lengths in [ctx/2, ctx], no validation inside replay)."""
    import random

    name, variant, mode = row.split("/")
    spec, kind, entry = CHAIN, KINDS[mode], find(name, variant)[0]
    kw = dict(capture_bs=SIZES, max_context_len=ctx, pool_size=(rotate + 1) * max(SIZES) + 2, gen_seed=1)
    if sweep_setup:
        sizes = tuple(b for b in bench.BATCH_SIZES if b * ctx <= 1 << 21)
        per_req = -(-ctx // entry.page_size) * entry.page_size
        kw.update(capture_bs=sizes, pool_size=(rotate + 1) * max(sizes) + 2, validate_inputs=False)
        kw["num_slots"] = (rotate * max(sizes) + 2) * per_req + entry.page_size
    rig = Rig.build(entry, kind, spec, make_engine("auto"), **kw)
    out, rng = {}, random.Random(0)
    for bs in SIZES:
        if sweep_setup:
            batches = bench.rotated_batches(rig.gen, mode, bs, ctx, spec, rotate, rng)
        else:
            batches = [rig.gen.for_mode(kind, bs) for _ in range(rotate)]
        runner, one = rig.runner, batches[:1]
        runner.load_inputs(one[0], bs)
        r = {"direct": _loop(runner, one, bs, repeats, warmup, sync_each=False)}
        r["direct_sync"] = _loop(runner, one, bs, repeats, warmup)
        r["rotate"] = _loop(runner, batches, bs, repeats, warmup)
        r["after_copies"] = _loop(runner, batches, bs, repeats, warmup, copies=True)
        r["after_validate"] = _loop(runner, batches, bs, repeats, warmup, copies=True, validate=True)
        r["interleaved"] = _interleaved(runner, batches, bs, repeats, warmup)
        r["bench"] = bench.time_replay_path(runner, batches, repeats, warmup)["host_us"]["hook"]["median"]
        out[bs] = r
        rig.gen.release_all()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--repeats", type=int, default=400)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--pin", type=int, default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--sweep-setup", action="store_true", help="build rig and batches as bench.sweep does")
    args = p.parse_args(argv)
    pinned = bench.pin_to_core(args.pin)
    res = {row: measure(row, args.repeats, args.warmup, args.ctx, sweep_setup=args.sweep_setup) for row in args.rows.split(",")}
    cols = ("direct", "direct_sync", "rotate", "after_copies", "after_validate", "interleaved", "bench")
    print(f"{bench.environment()['device']}; {pinned}; host µs medians of the replay hook")
    print(f"{'row':<38} {'bs':>3} " + " ".join(f"{c:>14}" for c in cols))
    for row, by_bs in res.items():
        for bs, r in by_bs.items():
            print(f"{row:<38} {bs:>3} " + " ".join(f"{r[c]:14.1f}" for c in cols))
    if args.out:
        Path(args.out).write_text(json.dumps({"environment": bench.environment(), "pinning": pinned, "rows": res}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
