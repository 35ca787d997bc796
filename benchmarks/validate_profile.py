"""Where a replay's host time goes: ``cProfile`` over ``runner.validate`` + ``load_inputs`` (host rules, the staged host
lengths, the device checks' launch, the input load; on a GPU nothing waits for the checks), or over the whole
``runner.replay(fb)`` a user calls (``--replay``: a synchronisation after each call, as the bench's default column
has), on one Triton decode and one verify rig; on a GPU also the device checks' and the load's GPU time.

    python benchmarks/validate_profile.py [--bs 1] [--ctx 4096] [--calls 2000] [--top 18] [--variant in_graph] [--replay] [--trace]

Prints per shape the mean µs per call with the profiler off, the functions with the most own time (``tottime``), and
(CUDA) the median GPU µs of ``runner.validate`` (the ``batch_check`` launch) and of ``load_inputs`` between CUDA events,
each after a synchronisation. ``validate + load`` back to back waits in ``Event.synchronize`` when those GPU times
exceed the host's time per call.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import torch

from refimpl import bench
from refimpl.backends import find
from refimpl.config import CHAIN
from refimpl.graphs import make_engine
from refimpl.layout import KINDS
from refimpl.rig import Rig


def gpu_us(runner, fb, bs: int, calls: int) -> dict[str, float]:
    """Median GPU µs of the device checks' launch (``validate``) and of the input load, each between events."""
    spans = {"validate (batch_check)": [], "load_inputs": []}
    for _ in range(calls):
        torch.cuda.synchronize()
        events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        events[0].record()
        runner.validate(fb)
        events[1].record()
        runner.load_inputs(fb, bs)
        events[2].record()
        torch.cuda.synchronize()
        for times, start, end in zip(spans.values(), events, events[1:]):
            times.append(start.elapsed_time(end) * 1e3)
    runner.synchronize()
    return {k: statistics.median(v) for k, v in spans.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bs", type=int, default=1)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--top", type=int, default=18)
    p.add_argument("--pin", type=int, default=None)
    p.add_argument("--variant", default="unified", help="the Triton variant (unified, fused, in_graph)")
    p.add_argument("--replay", action="store_true", help="profile runner.replay(fb) with a synchronisation after each")
    p.add_argument("--trace", action="store_true", help="(CUDA) also torch.profiler over 200 calls: GPU µs per kernel")
    args = p.parse_args(argv)
    print(bench.pin_to_core(args.pin), bench.environment().get("device"))
    for mode in ("decode", "target_verify"):
        entry = find("triton", args.variant)[0]
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
        cuda = runner.device.type == "cuda"
        sync = bench._sync(cuda)

        def loop():
            for _ in range(args.calls):
                if args.replay:
                    runner.replay(fb)
                    sync()
                else:
                    runner.validate(fb)
                    runner.load_inputs(fb, args.bs)  # the verdict acted on, as a replay does
            sync()

        loop()
        t0 = time.perf_counter()
        loop()
        per_call = (time.perf_counter() - t0) / args.calls * 1e6
        prof = cProfile.Profile()
        prof.runcall(loop)
        what = "replay + synchronize" if args.replay else "validate + load_inputs"
        print(f"\n== triton/{args.variant}/{mode}, bs {args.bs}, ctx {args.ctx}: {per_call:.1f} µs per {what}")
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)
        if cuda and args.trace:
            acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=acts) as tp:
                for _ in range(200):
                    runner.replay(fb) if args.replay else (runner.validate(fb), runner.load_inputs(fb, args.bs))
                    sync()
            print(tp.key_averages().table(sort_by="self_device_time_total", row_limit=args.top, max_name_column_width=60))
        if cuda:
            gpu = gpu_us(runner, fb, args.bs, min(args.calls, 300))
            print("GPU µs, medians:", ", ".join(f"{k} {v:.1f}" for k, v in gpu.items()))
        runner.synchronize()
        rig.gen.release_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
