"""What ``graph.replay()`` costs on the host, and how much of it the step graph's kernel count explains (issue 16, 4).

    python benchmarks/replay_floor.py [--pin CORE] [--repeats 2000] [--out FILE.json]

Synthetic graphs of 1, 4, 16, 64 and 256 small kernels (``x.add_(1)`` each), captured with ``torch.cuda.graph``,
then refimpl's step graphs (``runner.launch``) for a few backends and batch sizes with their recorded op counts
(``Graph.kernels()``). Host µs medians of the launch call alone, a synchronisation between calls (outside the timer).
GPU only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from refimpl import bench  # noqa: E402
from refimpl.backends import find  # noqa: E402
from refimpl.config import SpecConfig  # noqa: E402
from refimpl.graphs import make_engine  # noqa: E402
from refimpl.layout import KINDS  # noqa: E402
from refimpl.rig import Rig  # noqa: E402

ROWS = (
    "triton/unified/decode",
    "triton/in_graph/decode",
    "flashinfer/unified/decode",
    "trtllm_mla/unified/draft_extend_v2",
)
SIZES = (1, 16, 64)


def host_us(fn, repeats: int, warmup: int = 100) -> float:
    xs = []
    for it in range(warmup + repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        if it >= warmup:
            xs.append((t1 - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(xs)


def synthetic(n: int, repeats: int) -> float:
    x = torch.zeros(16, device="cuda")
    g, s = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(2):
            x.add_(1)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        for _ in range(n):
            x.add_(1)
    return host_us(g.replay, repeats)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=2000)
    p.add_argument("--pin", type=int, default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    pinned = bench.pin_to_core(args.pin)
    res = {"synthetic": {n: synthetic(n, args.repeats) for n in (1, 4, 16, 64, 256)}, "steps": {}}
    spec = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)
    for row in ROWS:
        name, variant, mode = row.split("/")
        kw = dict(capture_bs=SIZES, max_context_len=512, pool_size=2 * max(SIZES) + 2, gen_seed=1)
        rig = Rig.build(find(name, variant)[0], KINDS[mode], spec, make_engine("cuda"), **kw)
        for bs in SIZES:
            fb = rig.gen.for_mode(rig.kind, bs)
            rig.runner.load_inputs(fb, bs)
            rig.runner.replay_hook(fb, bs)
            ops = sum(rig.runner.graphs[bs].kernels().values())
            res["steps"][f"{row}/bs{bs}"] = {
                "ops": ops,
                "launch_us": host_us(lambda: rig.runner.launch(bs), args.repeats),
            }
            rig.gen.release(fb)
    print(f"{bench.environment()['device']}; {pinned}; host µs medians of one graph launch")
    for n, us in res["synthetic"].items():
        print(f"synthetic graph of {n:>3} kernels: {us:7.1f}")
    for key, r in res["steps"].items():
        print(f"{key:<46} {r['ops']:>4} ops: {r['launch_us']:7.1f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"environment": bench.environment(), "pinning": pinned, **res}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
