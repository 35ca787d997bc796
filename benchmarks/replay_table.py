"""The issue-9 table: host µs of each part of the replay path, on a GPU.

    python benchmarks/replay_table.py [--pin CORE] [--repeats 400] [--out FILE.json]

Rows: Triton decode, FlashInfer decode, FlashInfer target verify, FlashInfer-MLA target
verify (the unified variants; add ``--rows`` for others), bs 1 / 8 / 64, context 256, tiny
2-layer models, medians of ``--repeats`` iterations after warm-up, 4 rotated batches. Columns:
the replay hook per bs, input copies, batch validation, ``graph.replay()``, GPU time of the
graph (CUDA events). A client of ``refimpl.rig`` (the set-up) and ``refimpl.bench.
time_replay_path`` (the runner's own replay phases, timed apart). The before / after numbers
of issue 9 were measured with this file's earlier version, which ran on older checkouts too.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from refimpl import bench  # noqa: E402
from refimpl.backends import find  # noqa: E402
from refimpl.config import SpecConfig  # noqa: E402
from refimpl.graphs import make_engine  # noqa: E402
from refimpl.layout import KINDS  # noqa: E402
from refimpl.rig import Rig  # noqa: E402

ROWS = ("triton/unified/decode", "flashinfer/unified/decode", "flashinfer/unified/target_verify",
        "flashinfer_mla/unified/target_verify")  # fmt: skip
SIZES = (1, 8, 64)


def measure(row: str, repeats: int, warmup: int, ctx: int = 256, rotate: int = 4) -> dict:
    name, variant, mode = row.split("/")
    rig = Rig.build(find(name, variant)[0], KINDS[mode], SpecConfig(num_steps=3, topk=1, num_draft_tokens=4),
                    make_engine("auto"), capture_bs=SIZES, max_context_len=ctx,
                    pool_size=(rotate + 1) * max(SIZES) + 2, gen_seed=1)  # fmt: skip
    out = {}
    for bs in SIZES:
        batches = [rig.gen.for_mode(rig.kind.mode, bs) for _ in range(rotate)]
        r = bench.time_replay_path(rig.runner, batches, repeats, warmup)
        out[bs] = {k: r["host_us"][k]["median"] for k in ("validate", "copies", "hook", "launch")}
        if "gpu_us" in r:
            out[bs]["gpu_graph"] = r["gpu_us"]["graph"]["median"]
        rig.gen.release_all()
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
