"""SGLang #29077 before / after: the TRTLLM-MLA draft-extend-v2 replay path, per shape and bs.

    python benchmarks/trtllm_mla_draft_extend.py [--pin CORE] [--out DIR] [--bs 1,2,...]

Shapes: ``unified`` (after #26665: per-replay cu_seqlens_q arange copy, seq_lens_q fill and
identity arithmetic), ``simplified`` (#29077: those gone) and ``in_graph`` (the metadata rebuild
recorded inside the graph). Host time of the replay path (metadata hook + ``graph.replay()``;
input copies reported apart) and GPU time (CUDA events), warm-up, medians of ``--repeats``
repeats with p10-p90, inputs rotated among ``--rotate`` batches (``refimpl.bench``). Writes
``results.json`` / ``results.csv`` (with device, driver, versions, git commit) under ``--out``
and the figure ``benchmarks/results/trtllm_mla_draft_extend/replay.png``. On CPU (``--smoke``) the numbers
are emulator timings, labelled as such.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from refimpl import bench, viz
from refimpl.backends import find
from refimpl.config import CHAIN
from refimpl.graphs import make_engine
from refimpl.layout import KINDS
from refimpl.rig import Rig

ROOT = Path(__file__).resolve().parent.parent


def sweep(
    shapes: Sequence[str] = ("unified", "simplified", "in_graph"),
    batch_sizes: Sequence[int] = bench.BATCH_SIZES,
    *,
    context_len: int = 256,
    repeats: int = 50,
    warmup: int = 10,
    rotate: int = 4,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Replay-path cost of TRTLLM-MLA draft extend v2 per shape and batch size (graph engine of this machine: CUDA graphs
    on a GPU, the emulator on CPU). One row per (shape, bs)."""
    engine, spec = make_engine("auto"), CHAIN
    runners, world, gen = {}, None, None
    for shape in shapes:  # one world: every shape replays the same batches
        kw = dict(max_context_len=context_len, pool_size=(rotate + 1) * max(batch_sizes) + 1)
        kw.update(world=world, capture_bs=tuple(batch_sizes), gen_seed=1, capture=False)
        rig = Rig.build(find("trtllm_mla", shape)[0], KINDS["draft_extend_v2"], spec, engine, **kw)
        rig.runner.capture(progress=progress)
        runners[shape], world, gen = rig.runner, rig.world, gen or rig.gen
    rows = []
    for bs in batch_sizes:
        batches = [gen.draft_extend(bs, 2) for _ in range(rotate)]
        for shape, runner in runners.items():
            row = bench.time_replay_path(runner, batches, repeats, warmup)
            rows.append({"shape": shape, "bs": bs, **row})
        gen.release_all()
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bs", default="1,2,4,8,16,32,64,128,256")
    p.add_argument("--shapes", default="unified,simplified,in_graph")
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--rotate", type=int, default=4)
    p.add_argument("--ctx", type=int, default=256, help="context length L")
    p.add_argument("--pin", type=int, default=None, help="pin the process to this core")
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/trtllm_mla_draft_extend"))
    p.add_argument("--fig", default=str(ROOT / "benchmarks/results/trtllm_mla_draft_extend/replay.png"))
    p.add_argument("--smoke", action="store_true", help="tiny sizes (a CPU sanity run)")
    args = p.parse_args(argv)
    if args.smoke:
        args.bs, args.repeats, args.warmup, args.rotate, args.ctx = "1,2", 3, 1, 2, 64
    pinned = bench.pin_to_core(args.pin)
    rows = sweep(
        args.shapes.split(","),
        [int(x) for x in args.bs.split(",")],
        context_len=args.ctx,
        repeats=args.repeats,
        warmup=args.warmup,
        rotate=args.rotate,
        progress=True,
    )
    env = {
        **bench.environment(),
        "pinning": pinned,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "rotate": args.rotate,
        "context_len": args.ctx,
        "mode": "draft_extend_v2",
        "N": 4,
        "page_size": 64,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "shape",
                "bs",
                "host_hook_launch_us",
                "p25",
                "p75",
                "host_hook_us",
                "host_launch_us",
                "host_copies_us",
                "gpu_graph_us",
                "gpu_hook_us",
                "hook_launches",
                "graph_kernels",
            ]
        )
        for r in rows:
            h, g = r["host_us"], r.get("gpu_us", {})
            w.writerow(
                [
                    r["shape"],
                    r["bs"],
                    *(round(h["hook+launch"][k], 2) for k in ("median", "p25", "p75")),
                    round(h["hook"]["median"], 2),
                    round(h["launch"]["median"], 2),
                    round(h["copies"]["median"], 2),
                    *(round(g[k]["median"], 2) if k in g else "" for k in ("graph", "hook")),
                    sum(r["hook_launches"].values()),
                    sum(r["graph_kernels"].values()),
                ]
            )
    where = env["device"] + ("" if "gpu_us" in rows[0] else " (emulator timings)")
    panels = [("host_us", "hook+launch", "host µs: replay hook + graph.replay()")]
    if "gpu_us" in rows[0]:
        panels.append(("gpu_us", "graph", "GPU µs: the graph"))
    fig = viz.draw_latency_vs_bs(rows, panels, f"TRTLLM-MLA draft extend v2 replay path, before/after #29077 — {where}")
    viz.save(fig, args.fig)
    print(f"{pinned}; wrote {out}/results.json, results.csv and {args.fig}")
    for r in rows:
        print(
            f"{r['shape']:<11} bs {r['bs']:>4}: host hook+launch "
            f"{r['host_us']['hook+launch']['median']:9.1f} us, hook launches "
            f"{sum(r['hook_launches'].values())}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
