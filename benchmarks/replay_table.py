"""The replay-path table of issues 9 and 16: host µs of each part of the replay path, on a GPU.

    python benchmarks/replay_table.py [--rows ...] [--ctx 4096] [--sizes 1,8,64] [--pin CORE] [--repeats 600] [--rounds 10] [--out F]
    python benchmarks/replay_table.py --agree RUN1.json[,...] RUN2.json[,...]   # two runs, point by point, then pooled

Rows ``backend/variant/mode``, ``+glue`` after the variant for its hook replayed from a metadata glue graph (the row is
measured only when the checker's glue verdict passes on this engine; otherwise the table says why). Default: issue 16's
Triton decode / target verify, faithful (``unified``), ``fused``, ``in_graph`` and glued, beside FlashInfer's; tiny
2-layer models, 4 rotated batches, ``--repeats`` calls per phase and point spread over ``--rounds`` interleaved rounds
(``measure``). Columns per bs: validation (``runner.validate``: the host rules and the device checks' launch, not waited
for), the replay hook, input copies (under the checks' verdict), ``graph.replay()``, copies + hook + launch, the
**default path** (``runner.replay(fb)`` as a user calls it, validation on), the graph's GPU time; then the same phases
timed in sequence within one call (``in_sequence``). Each process also times a fixed pure-Python loop before and after
its rows (``host_probe_us``): the host's own speed in that process, which moved by up to 1.7x from one process to the
next on the H200 (``results/default_path/interleaved_31184d2/``). A run given to ``--agree`` may be several processes'
files: each point is then the least disturbed one's (``agreement``). A client of ``refimpl.rig`` and
``refimpl.bench.time_replay_path``. Issue 9's before / after numbers (context 256, 400 repeats) were measured with this
file's earlier version.
"""

from __future__ import annotations

import argparse
import json
import statistics
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


def build(row: str, sizes, ctx: int, rotate: int = 4):
    """``(rig, {bs: batches})`` for one row, ``rotate`` batches per bs, every bs's alive at once (``measure``
    interleaves them); ``{"not_glued": why}`` when the row is glued and the checker's glue verdict fails on this engine."""
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
        pool_size=rotate * sum(sizes) + 2,
        gen_seed=1,
        glue=glue,
    )
    lens = {bs: [ctx - KINDS[mode].span(rig.spec) - i % 7 for i in range(bs)] for bs in sizes}
    return rig, {bs: [rig.gen.for_mode(rig.kind, bs, seq_lens=lens[bs]) for _ in range(rotate)] for bs in sizes}


def time_point(runner, batches, repeats: int, warmup: int) -> dict:
    """One point's medians, host µs: each phase alone (``bench.time_replay_path``), the default path, the phases in
    sequence (``in_sequence``) and, on a GPU, the graph's GPU µs."""
    r = bench.time_replay_path(runner, batches, repeats, warmup)
    out = {k: r["host_us"][k]["median"] for k in ("validate", "copies", "hook", "launch", "path", "default")}
    out |= in_sequence(runner, batches, repeats, warmup)
    if "gpu_us" in r:
        out["gpu_graph"] = r["gpu_us"]["graph"]["median"]
    return out


def measure(rows, sizes, repeats: int, warmup: int, ctx: int, rounds: int = 10, done=None) -> dict:
    """Every row's rig built first, then ``rounds`` rounds, each timing every (row, bs) point for ``repeats / rounds``
    calls per phase after ``warmup``, the points' order rotated by one each round; a point's value per column is the
    median of its rounds' medians. Why interleaved: timed one after the other, each point sat in its own second of the
    process, and the host's speed moved within a process as well as between processes (``results/default_path/
    h100_beee57b/``, 12 processes: one process's 21 points read 0.45-1.73x their medians over all 12, the steadiest
    process's 1.00-1.25x); interleaved, every point samples the whole process. ``done(res)`` after each round: a
    process stopped early keeps the rounds it finished."""
    res, points = {row: {} for row in rows}, []
    for row in rows:
        built = build(row, sizes, ctx)
        if isinstance(built, dict):
            res[row] = built
        else:
            points += [(row, built[0], bs, built[1][bs]) for bs in sizes]
    chunk, seen = -(-repeats // rounds), {}
    for r in range(rounds if points else 0):
        k = r % len(points)
        for row, rig, bs, batches in points[k:] + points[:k]:
            for col, v in time_point(rig.runner, batches, chunk, warmup).items():
                seen.setdefault((row, bs), {}).setdefault(col, []).append(v)
        for row, _, bs, _ in points:
            res[row][bs] = {col: statistics.median(v) for col, v in seen[row, bs].items()}
        for row, rig, _, _ in points:
            res[row]["replays"] = dict(rig.runner.replays)
        if done is not None:
            done(res)
    return res


SEQ = ("validate", "copies", "hook", "launch", "total")


def in_sequence(runner, batches, repeats: int, warmup: int) -> dict:
    """``runner.replay(fb)``'s phases in its order within one call (``GraphRunner._replay``), each call after a
    synchronisation as the default path's, a time stamp between phases: ``seq_<phase>`` medians, host µs. Beside the
    phases timed alone, it says in which phase the default path's extra time sits (the 35-90 µs of it that no column
    held on the H200: ``results/default_path/``). Not in it: ``replay``'s ``can_run`` and the output view (a few µs)."""
    sync, stamps = bench._sync(runner.device.type == "cuda"), []
    for it in range(warmup + repeats):
        sync()
        t = [time.perf_counter()]
        fb = runner.validate(batches[it % len(batches)])
        t.append(time.perf_counter())
        bs = runner.pick_bs(fb.batch_size)
        runner.load_inputs(fb, bs)
        t.append(time.perf_counter())
        runner.replay_hook(fb, bs)
        t.append(time.perf_counter())
        runner.launch(bs)
        t.append(time.perf_counter())
        if it >= warmup:
            stamps.append([(b - a) * 1e6 for a, b in zip(t, t[1:])] + [(t[-1] - t[0]) * 1e6])
    sync()
    runner.synchronize()
    return {f"seq_{k}": statistics.median(v) for k, v in zip(SEQ, zip(*stamps))}


COLS = {"validate": "validation", "copies": "input copies", "hook": "replay hook", "launch": "graph launch"}
COLS["default"] = "default path"


def host_probe_us(n: int = 200) -> float:
    """Median µs of a fixed pure-Python loop: no GPU, no allocation, only this process's share of its core."""
    xs = []
    for _ in range(n):
        t0, s = time.perf_counter(), 0
        for i in range(2000):
            s += i * i
        xs.append(time.perf_counter() - t0)
    return statistics.median(xs) * 1e6


def pooled(files: list[str]) -> dict:
    """``{row: {bs: {column: [value per file]}}}`` over the ``--out`` files of one run (a file may hold any rows)."""
    out = {}
    for f in files:
        for row, r in json.loads(Path(f).read_text())["rows"].items():
            for bs, point in r.items():  # besides the sizes: the replay counts, a row not glued
                if isinstance(point, dict) and "default" in point:
                    for col in (c for c in (*COLS, *(f"seq_{k}" for k in SEQ)) if c in point):  # seq_*: in_sequence's
                        out.setdefault(row, {}).setdefault(bs, {}).setdefault(col, []).append(point[col])
    return out


def differ(x: float, y: float) -> float:
    """How far two positive values are apart: the larger over the smaller, minus 1."""
    return max(x, y) / min(x, y) - 1


def agreement(run1: list[str], run2: list[str], tol: float = 0.15) -> str:
    """Two runs per row and bs, each point its least disturbed file's value (the smallest over the run's files: a busy
    host only ever adds time): every column's two values and their relative difference (larger over smaller, minus 1);
    how many points agree within ``tol`` per column, by that estimate and by the median of the run's files; then both
    runs pooled, each point as the median and the range over every file, and each file's host probe."""
    # a run without a file (its processes cut short): the pooled table alone
    runs = [pooled(files) for files in (run1, run2)] if run1 and run2 else [{}, {}]
    head = "| row | bs | " + " | ".join(f"{c}, run 1 / run 2 (µs)" for c in COLS.values()) + " |"
    lines, points = ["Each run's least disturbed file per point", head, "|---" * (len(COLS) + 2) + "|"], 0
    agree = {"least": dict.fromkeys(COLS, 0), "median": dict.fromkeys(COLS, 0)}
    for row in runs[0]:
        for bs, a in runs[0][row].items():
            if not (b := runs[1].get(row, {}).get(bs)):
                continue
            points, cells = points + 1, []
            for col in COLS:
                x, y = min(a[col]), min(b[col])
                d = differ(x, y)
                agree["least"][col] += d <= tol
                agree["median"][col] += differ(statistics.median(a[col]), statistics.median(b[col])) <= tol
                cells.append(f"{x:.0f} / {y:.0f} ({d:.0%}{'' if d <= tol else ' *'})")
            lines.append(f"| {row} | {bs} | " + " | ".join(cells) + " |")
    lines += [
        f"{COLS[c]}: {n} of {points} points agree within {tol:.0%} (* : outside); by the median of each run's files: "
        f"{agree['median'][c]}"
        for c, n in agree["least"].items()
    ]
    both, n = pooled(run1 + run2), len(run1) + len(run2)
    lines += [
        "",
        f"Both runs pooled ({n} files): median [least - most], host µs",
        head.replace(", run 1 / run 2", ""),
        "|---" * (len(COLS) + 2) + "|",
    ]
    for row, r in both.items():
        for bs, p in r.items():
            cells = [f"{statistics.median(p[c]):.0f} [{min(p[c]):.0f} - {max(p[c]):.0f}]" for c in COLS]
            lines.append(f"| {row} | {bs} | " + " | ".join(cells) + " |")
    seq = [f"seq_{k}" for k in SEQ]
    lines += ["", "In sequence (in_sequence), pooled: median [least - most], host µs", "| row | bs | " + " | ".join(SEQ) + " |"]
    lines.append("|---" * (len(SEQ) + 2) + "|")
    for row, r in both.items():
        for bs, p in r.items():
            if all(c in p for c in seq):
                cells = [f"{statistics.median(p[c]):.0f} [{min(p[c]):.0f} - {max(p[c]):.0f}]" for c in seq]
                lines.append(f"| {row} | {bs} | " + " | ".join(cells) + " |")
    # each file's default path over the pooled median, point by point: one number per file if the host's speed moved
    # only between processes, a wide range if it moved within one too
    lines += ["", "Per file: host probe; default path / the point's pooled median, median [least - most] over its points"]
    for f in run1 + run2:
        data = json.loads(Path(f).read_text())
        ratios = sorted(
            pt["default"] / statistics.median(both[row][bs]["default"])
            for row, r in data["rows"].items()
            for bs, pt in r.items()
            if isinstance(pt, dict) and "default" in pt
        )
        probe = ", ".join(f"{k} {v:.1f} µs" for k, v in data["environment"].get("host_probe_us", {}).items())
        spread = f"{statistics.median(ratios):.2f} [{ratios[0]:.2f} - {ratios[-1]:.2f}]" if ratios else "-"
        lines.append(f"{Path(f).name}: host probe {probe}; default path / pooled median {spread}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agree", nargs=2, metavar=("RUN1", "RUN2"), help="compare two runs' --out files (comma-separated)")
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--sizes", default="1,8,64")
    p.add_argument("--repeats", type=int, default=600)
    p.add_argument("--warmup", type=int, default=10, help="untimed calls before each point's calls in each round")
    p.add_argument("--rounds", type=int, default=10, help="rounds over every point (see measure)")
    p.add_argument("--pin", type=int, default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.agree:
        print(agreement(*([f for f in a.split(",") if f] for a in args.agree)))
        return 0
    pinned = bench.pin_to_core(args.pin)
    sizes = tuple(int(x) for x in args.sizes.split(","))
    env = {**bench.environment(), "pinning": pinned, "repeats": args.repeats, "context": args.ctx}
    env |= {"rounds": args.rounds, "host_probe_us": {"start": host_probe_us()}}

    def done(res):  # whole or not at all: a process killed while writing leaves the last complete file
        env["host_probe_us"]["end"] = host_probe_us()
        if args.out:
            Path(args.out + ".tmp").write_text(json.dumps({"environment": env, "rows": res}, indent=1))
            Path(args.out + ".tmp").replace(args.out)
        print(f"round done: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    res = measure(args.rows.split(","), sizes, args.repeats, args.warmup, args.ctx, args.rounds, done)
    probe = " / ".join(f"{v:.1f}" for v in env["host_probe_us"].values())
    each = f"medians of {args.rounds} rounds' medians of {-(-args.repeats // args.rounds)}"
    print(f"{env.get('device')}; {pinned}; context {args.ctx}; {each}, host µs; probe {probe} µs")
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
    print(f"\nIn sequence (in_sequence: runner.replay's phases in one call), host µs, bs {per_bs}:")
    print("| backend / variant / mode | " + " | ".join(SEQ) + " |")
    print("|---" * (len(SEQ) + 1) + "|")
    for row, r in res.items():
        if "not_glued" not in r:
            print(f"| {row} | " + " | ".join(" / ".join(f"{r[b].get('seq_' + k, 0):.1f}" for b in sizes) for k in SEQ) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
