"""Host cost of validating one batch (``refimpl.validate.validate_batch``, what
``GraphRunner.replay`` runs before its first write), against the batch size, with a 1M-slot KV
pool. Goal (issue 14): 30 µs of host or less at bs 64 on the H200, at most one device read.

    python benchmarks/validate_cost.py [--out DIR] [--pin CORE] [--repeats N]

Per (backend layout, mode, bs): the median and p10 / p90 of ``--repeats`` timed calls, after
warm-up, rotating among 4 batches; device reads counted once per point. Host time only:
the GPU is idle at each call (the previous call's read synchronised it), so the read's wait is
the kernel's own run time, which is part of what a replay pays.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from refimpl import default_dtype
from refimpl.batch import World
from refimpl.batchgen import BatchGenerator
from refimpl.bench import environment, pin_to_core
from refimpl.config import CHAIN, tiny_model_config
from refimpl.modes import ForwardMode
from refimpl.validate import validate_batch

SPEC = CHAIN
SLOTS = 1 << 20
# (label, model kind, page size, context, modes)
LAYOUTS = [
    ("triton (MHA, page 1)", "mha", 1, 512, (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY)),
    ("trtllm_mla (MLA, page 64)", "mla", 64, 256, (ForwardMode.DECODE, ForwardMode.DRAFT_EXTEND_V2)),
]


class Reads(TorchDispatchMode):
    """Counts ops that take a device tensor and give a host value (device-to-host reads)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(isinstance(a, torch.Tensor) and a.device.type != "cpu" for a in args) and (
            isinstance(out, (int, float, bool)) or (isinstance(out, torch.Tensor) and out.device.type == "cpu")
        ):
            self.n += 1
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--pin", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--bs", default="1,16,64,256")
    args = ap.parse_args()
    pinned = pin_to_core(args.pin)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sizes = [int(b) for b in args.bs.split(",")]
    rows = []
    for label, kind, page, ctx, modes in LAYOUTS:
        cfg = tiny_model_config(kind, default_dtype(dev), dev.type)
        world = World.create(
            cfg, max_context_len=ctx, pool_size=4 * max(sizes) + 8, num_slots=SLOTS, page_size=page, device=dev, seed=0
        )
        gen = BatchGenerator(world, SPEC, seed=1)
        for mode in modes:
            for bs in sizes:
                batches = [gen.for_mode(mode, bs) for _ in range(4)]
                for fb in batches * 5:  # warm-up: the kernel compiled, the result buffer grown
                    validate_batch(fb, SPEC, for_graph=True)
                with Reads() as reads:
                    validate_batch(batches[0], SPEC, for_graph=True)
                times = []
                for i in range(args.repeats):
                    fb = batches[i % len(batches)]
                    t0 = time.perf_counter_ns()
                    validate_batch(fb, SPEC, for_graph=True)
                    times.append((time.perf_counter_ns() - t0) / 1e3)
                q = statistics.quantiles(times, n=10)
                rows.append(
                    {
                        "layout": label,
                        "mode": mode.label,
                        "bs": bs,
                        "ctx": ctx,
                        "slots": world.kv_cache.num_slots,
                        "device_reads": reads.n,
                        "median_us": statistics.median(times),
                        "p10_us": q[0],
                        "p90_us": q[-1],
                        "repeats": args.repeats,
                    }
                )
                r = rows[-1]
                print(
                    f"{label:<26} {mode.label:<16} bs {bs:>3}: {r['median_us']:7.1f} µs "
                    f"(p10 {r['p10_us']:.1f}, p90 {r['p90_us']:.1f}), "
                    f"{r['device_reads']} device read(s)",
                    flush=True,
                )
                gen.release_all()
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        env = {**environment(), "pinning": pinned}
        (out / "validate_cost.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
        print("wrote", out / "validate_cost.json")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
