"""Where a replay's validation spends its host time: ``cProfile`` over ``runner.validate`` (host rules, the staged host
lengths, the device checks' launch; on a GPU nothing waits for them) on one Triton decode and one verify rig.

    python benchmarks/validate_profile.py [--bs 1] [--ctx 4096] [--calls 2000] [--top 18]

Prints the functions with the most own time (``tottime``) per shape, and the mean µs per call with the profiler off.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from refimpl import bench
from refimpl.backends import find
from refimpl.config import CHAIN
from refimpl.graphs import make_engine
from refimpl.layout import KINDS
from refimpl.rig import Rig


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bs", type=int, default=1)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--top", type=int, default=18)
    p.add_argument("--pin", type=int, default=None)
    args = p.parse_args(argv)
    print(bench.pin_to_core(args.pin), bench.environment().get("device"))
    for mode in ("decode", "target_verify"):
        entry = find("triton", "unified")[0]
        rig = Rig.build(
            entry,
            KINDS[mode],
            CHAIN,
            make_engine("auto"),
            capture_bs=(args.bs,),
            max_context_len=args.ctx,
            pool_size=5 * args.bs + 2,
            gen_seed=1,
        )
        lens = [args.ctx - KINDS[mode].span(rig.spec) - i % 7 for i in range(args.bs)]
        fb, runner = rig.gen.for_mode(rig.kind, args.bs, seq_lens=lens), rig.runner
        sync = bench._sync(runner.device.type == "cuda")

        def loop():
            for _ in range(args.calls):
                runner.validate(fb)
                runner.load_inputs(fb, args.bs)  # the verdict acted on, as a replay does
            sync()

        loop()
        t0 = time.perf_counter()
        loop()
        per_call = (time.perf_counter() - t0) / args.calls * 1e6
        prof = cProfile.Profile()
        prof.runcall(loop)
        print(f"\n== triton/unified/{mode}, bs {args.bs}, ctx {args.ctx}: {per_call:.1f} µs per validate + load_inputs")
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)
        runner.synchronize()
        rig.gen.release_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
