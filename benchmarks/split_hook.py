"""FlashInfer's replay hook split in two (issue 32 part 4; ``[facts#host-device-split]``): what a replay's metadata costs
before (the eager hook, host then device phase) and after (the host phase eagerly, then the glue graph holding the
device phase), beside the host phase alone (the plan: the floor while the plan stays on the host).

    python benchmarks/split_hook.py [--rows flashinfer/decode,...] [--sizes 1,8,64] [--ctx 4096] [--pin 3] [--out F]

Per row and batch size, host µs (medians of ``--repeats`` calls after ``--warmup``, ``rotate`` batches, each loaded
untimed before a run of ``bench.RUN`` calls, a synchronisation before each call outside the timer, as
``refimpl.bench.time_replay_path`` times its hook): ``eager hook`` (``call_replay_hook``: both phases eagerly); then, in
one pass, each call timed in parts: ``host phase`` (``prepare_host_metadata``), ``glue replay`` (the device phase's
graph) and ``glued hook`` (the two: what ``runner.replay_hook`` runs when glued). Timing the parts inside the same call
keeps a noisy host's drift out of their difference. The goal: ``glued hook`` at most ``host phase`` + 15 µs.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from refimpl import bench
from refimpl.backends import find
from refimpl.config import CHAIN
from refimpl.graphs import make_engine
from refimpl.graphs.runner import call_replay_hook
from refimpl.layout import KINDS
from refimpl.rig import Rig

ROWS = ("flashinfer/decode", "flashinfer/target_verify", "flashinfer_mla/decode", "flashinfer_mla/target_verify")
PARTS = ("eager hook", "host phase", "glue replay", "glued hook")


def measure(row: str, sizes, repeats: int, warmup: int, ctx: int, rotate: int = 4) -> dict:
    name, mode = row.split("/")
    rig = Rig.build(
        find(name, "unified")[0],
        KINDS[mode],
        CHAIN,
        make_engine("auto"),
        capture_bs=sizes,
        max_context_len=ctx,
        pool_size=(rotate + 1) * max(sizes) + 2,
        gen_seed=1,
        glue=True,
    )
    runner, out = rig.runner, {}
    assert runner.glue_split and not runner.glue_refused, runner.glue_refused
    sync = bench._sync(runner.device.type == "cuda")
    for bs in sizes:
        lens = [ctx - KINDS[mode].span(rig.spec) - i % 7 for i in range(bs)]
        batches = [rig.gen.for_mode(rig.kind, bs, seq_lens=lens) for _ in range(rotate)]
        glue, backend, xs = runner.glue_graphs[bs], runner.backend, {k: [] for k in PARTS}

        def split(fb):  # what runner.replay_hook runs for a split hook, its two parts timed apart in the same call
            t0 = time.perf_counter()
            backend.prepare_host_metadata(runner._replay_batch(fb, bs))
            t1 = time.perf_counter()
            glue.replay()
            t2 = time.perf_counter()
            xs["host phase"].append((t1 - t0) * 1e6)
            xs["glue replay"].append((t2 - t1) * 1e6)
            xs["glued hook"].append((t2 - t0) * 1e6)

        loaded = dict(before=lambda fb: runner.load_inputs(fb, bs), run=bench.RUN)
        eager = lambda fb: call_replay_hook(backend, runner._replay_batch(fb, bs))  # noqa: E731
        xs["eager hook"] = bench.host_times(eager, batches, repeats, warmup, sync, **loaded)
        bench.host_times(split, batches, repeats, warmup, sync, **loaded)
        out[bs] = {k: bench.spread(v[-repeats:])["median"] for k, v in xs.items()}  # (split: its warm-up calls dropped)
        rig.gen.release_all()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--sizes", default="1,8,64")
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--pin", type=int, default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    env = bench.environment() | {"pinned": bench.pin_to_core(args.pin)}
    sizes = tuple(int(s) for s in args.sizes.split(","))
    res = {}
    for row in args.rows.split(","):
        res[row] = measure(row, sizes, args.repeats, args.warmup, args.ctx)
        if args.out:  # written as they come
            Path(args.out).write_text(json.dumps({"environment": env, "rows": res}, indent=1))
    print(f"{env.get('device')}; {env['pinned']}; context {args.ctx}; medians of {args.repeats}, host µs")
    print("| row | " + " | ".join(f"{k}, bs {' / '.join(map(str, sizes))}" for k in PARTS) + " | glued - host phase |")
    print("|---" * (len(PARTS) + 2) + "|")
    for row, r in res.items():
        cols = [" / ".join(f"{r[bs][k]:.1f}" for bs in sizes) for k in PARTS]
        extra = " / ".join(f"{r[bs]['glued hook'] - r[bs]['host phase']:.1f}" for bs in sizes)
        print(f"| {row} | " + " | ".join(cols) + f" | {extra} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
