"""The replay-path table of issues 9 and 16: host µs of each part of the replay path, on a GPU.

    python benchmarks/replay_table.py [--rows ...] [--ctx 4096] [--sizes 1,8,64] [--pin CORE] [--repeats 600] [--out F]
    python benchmarks/replay_table.py --agree RUN1.json[,...] RUN2.json[,...]   # two runs' default paths, point by point

Rows ``backend/variant/mode``, ``+glue`` after the variant for its hook replayed from a metadata glue graph (the row is
measured only when the checker's glue verdict passes on this engine; otherwise the table says why). Default: issue 16's
Triton decode / target verify, faithful (``unified``), ``fused``, ``in_graph`` and glued, beside FlashInfer's; tiny
2-layer models, medians of ``--repeats`` iterations after warm-up, 4 rotated batches. Columns per bs: validation
(``runner.validate``: the host rules and the device checks' launch, not waited for), the replay hook, input copies
(under the checks' verdict), ``graph.replay()``, copies + hook + launch, the **default path** (``runner.replay(fb)`` as a
user calls it, validation on), the graph's GPU time. A client of ``refimpl.rig`` and ``refimpl.bench.time_replay_path``. Issue 9's before / after
numbers (context 256, 400 repeats) were measured with this file's earlier version.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from refimpl import bench
from refimpl.backends import find
from refimpl.config import CHAIN
from refimpl.graphs import make_engine
from refimpl.layout import KINDS
from refimpl.rig import Rig

ROWS = tuple(f"triton/{v}/{m}" for m in ("decode", "target_verify") for v in ("unified", "fused", "in_graph"))
ROWS += ("triton/unified+glue/decode", "triton/in_graph+glue/decode", "triton/unified+glue/target_verify")
ROWS += ("flashinfer/unified/decode", "flashinfer/unified/target_verify", "trtllm_mla/in_graph/draft_extend_v2")


def measure(row: str, sizes, repeats: int, warmup: int, ctx: int, rotate: int = 4) -> dict:
    from refimpl.rig.verdicts import glue_verdict

    name, variant, mode = row.split("/")
    variant, glue = variant.removesuffix("+glue"), variant.endswith("+glue")
    entry, engine = find(name, variant)[0], make_engine("auto")
    if glue and not (verdict := glue_verdict(entry, mode, engine))[0]:
        return {"not_glued": verdict[1][0]}
    rig = Rig.build(
        entry,
        KINDS[mode],
        CHAIN,
        engine,
        capture_bs=sizes,
        max_context_len=ctx,
        pool_size=(rotate + 1) * max(sizes) + 2,
        gen_seed=1,
        glue=glue,
    )
    out = {}
    for bs in sizes:
        lens = [ctx - KINDS[mode].span(rig.spec) - i % 7 for i in range(bs)]
        batches = [rig.gen.for_mode(rig.kind, bs, seq_lens=lens) for _ in range(rotate)]
        r = bench.time_replay_path(rig.runner, batches, repeats, warmup)
        out[bs] = {k: r["host_us"][k]["median"] for k in ("validate", "copies", "hook", "launch", "path", "default")}
        if "gpu_us" in r:
            out[bs]["gpu_graph"] = r["gpu_us"]["graph"]["median"]
        rig.gen.release_all()
    out["replays"] = dict(rig.runner.replays)
    return out


def agreement(run1: list[str], run2: list[str], tol: float = 0.15) -> str:
    """Two runs' default path per row and bs (each run: one or more ``--out`` files, rows merged), the relative
    difference (larger over smaller, minus 1) and how many points agree within ``tol``."""
    runs = [{k: v for f in files for k, v in json.loads(Path(f).read_text())["rows"].items()} for files in (run1, run2)]
    lines, agree, points = ["| row | bs | default, run 1 / run 2 (µs) | difference |", "|---|---|---|---|"], 0, 0
    for row in runs[0]:
        for bs, a in runs[0][row].items():
            b = runs[1].get(row, {}).get(bs) or {}
            if "default" not in a or "default" not in b:  # the row's replay counts, a row not glued, a missing point
                continue
            d = max(a["default"], b["default"]) / min(a["default"], b["default"]) - 1
            points, agree = points + 1, agree + (d <= tol)
            lines.append(f"| {row} | {bs} | {a['default']:.0f} / {b['default']:.0f} | {d:.0%}{'' if d <= tol else ' *'} |")
    return "\n".join([*lines, f"{agree} of {points} points agree within {tol:.0%} (* : outside)"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agree", nargs=2, metavar=("RUN1", "RUN2"), help="compare two runs' --out files (comma-separated)")
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--sizes", default="1,8,64")
    p.add_argument("--repeats", type=int, default=600)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--pin", type=int, default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.agree:
        print(agreement(*(a.split(",") for a in args.agree)))
        return 0
    pinned = bench.pin_to_core(args.pin)
    sizes = tuple(int(x) for x in args.sizes.split(","))
    env = {**bench.environment(), "pinning": pinned, "repeats": args.repeats, "context": args.ctx}
    res = {}
    for row in args.rows.split(","):  # written as they come: a run stopped early keeps what it measured
        t0 = time.perf_counter()
        res[row] = measure(row, sizes, args.repeats, args.warmup, args.ctx)
        print(f"{row}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps({"environment": env, "rows": res}, indent=1))
    print(f"{env.get('device')}; {pinned}; context {args.ctx}; medians of {args.repeats}, host µs")
    per_bs = " / ".join(map(str, sizes))
    cols = ("validate", "hook", "copies", "launch", "path", "default", "gpu_graph")
    names = ("validation", "replay hook", "input copies", "graph launch", "copies + hook + launch", "default path", "graph GPU")
    print("| backend / variant / mode | " + " | ".join(f"{c}, bs {per_bs}" for c in names) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for row, r in res.items():
        if "not_glued" in r:
            print(f"| {row} | not glue-safe: {r['not_glued']} |" + " |" * (len(cols) - 1))
            continue
        each = lambda k: " / ".join(f"{r[b][k]:.1f}" if k in r[b] else "-" for b in sizes)  # noqa: E731
        print(f"| {row} | " + " | ".join(each(c) for c in cols) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
