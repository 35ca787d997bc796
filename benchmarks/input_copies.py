"""What loading a batch into a graph's static inputs costs on the host, three ways (issue 16, deliverable 2).

    python benchmarks/input_copies.py [--pin CORE] [--repeats 1000] [--out FILE.json]

Per graph kind (decode; multi-step draft decode, whose cache locations are one block per step) and batch size, host µs
medians of:

- ``mixed``: one ``torch._foreach_copy_`` over the int64 and int32 tensors as they are (refimpl before this change). A
  list of mixed dtypes is not PyTorch's fast path: it copies tensor by tensor, one launch each.
- ``by_dtype``: one ``_foreach_copy_`` per dtype (two launches).
- ``runner``: ``GraphRunner.load_inputs`` as it is now: one Triton kernel (``refimpl/kernels/inputs.py``; from 7bc3424 to
  5df02c7 it was one ``_foreach_copy_`` over every tensor as bytes, ``benchmarks/copies_parts.py`` rebuilds that one).

Each includes the host mirror copy of ``seq_lens_cpu``; padded rows are reset in each (the batch is one request short
of the graph's size). A synchronisation between calls, outside the timer. Launch counts from the profiler's CUDA
kernel list. The same code runs on CPU (no launches; what the Python costs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from refimpl import bench
from refimpl.backends import find
from refimpl.config import CHAIN
from refimpl.graphs import make_engine
from refimpl.layout import KINDS
from refimpl.rig import Rig

SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def _sources(runner, fb) -> list[torch.Tensor]:
    """The batch's tensors in the runner's copy-plan order (multi-step: one cache-location block per step)."""
    loc = fb.out_cache_loc
    locs = list(loc.view(runner.spec_cfg.num_steps, -1).unbind()) if runner.kind.multi_step else [loc]
    return [fb.input_ids, fb.positions, fb.req_pool_indices, fb.seq_lens, *locs]


def ways(runner, bs: int, fb0):
    """``{name: fn(fb)}``: the three loaders of a batch the size of ``fb0`` into the ``bs`` graph's inputs. The old
    ways' destinations and padded-row sources are views of the static inputs, made once (as the old copy plan was)."""
    inp, raw, n = runner.inputs, fb0.batch_size, fb0.num_tokens
    loc = inp.out_cache_loc[: inp.steps * bs * inp.rows].view(inp.steps, -1)  # [step][graph row]
    dst = [inp.input_ids[:n], inp.positions[:n], inp.req_pool_indices[:raw], inp.seq_lens[:raw], *loc[:, :n].unbind()]
    pads, host_live, host_pad = [], inp.seq_lens_cpu[:raw], None
    if raw < bs:  # what every padded row holds
        pad = inp.at_rest(bs - raw)
        dst += [inp.req_pool_indices[raw:bs], inp.seq_lens[raw:bs], *loc[:, n:].unbind()]
        pads = [pad.req_pool_indices, pad.seq_lens, *pad.out_cache_loc.view(inp.steps, -1)[:, : loc.shape[1] - n]]
        host_pad = inp.seq_lens_cpu[raw:bs]
    groups = {dt: [i for i, d in enumerate(dst) if d.dtype == dt] for dt in (torch.int64, torch.int32)}

    def host(fb):
        host_live.copy_(fb.seq_lens_cpu)
        if host_pad is not None:
            host_pad.fill_(runner.fill_value)

    def mixed(fb):
        torch._foreach_copy_(dst, _sources(runner, fb) + pads)
        host(fb)

    def by_dtype(fb):
        src = _sources(runner, fb) + pads
        for pick in groups.values():
            torch._foreach_copy_([dst[i] for i in pick], [src[i] for i in pick])
        host(fb)

    return {"mixed": mixed, "by_dtype": by_dtype, "runner": lambda fb: runner.load_inputs(fb, bs)}


def kernel_launches(fn, fb, cuda: bool) -> int | None:
    if not cuda:
        return None
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(fb)
        torch.cuda.synchronize()
    return sum(e.count for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--sizes", default=",".join(map(str, SIZES)))
    p.add_argument("--pin", type=int, default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    pinned = bench.pin_to_core(args.pin)
    sizes = tuple(int(x) for x in args.sizes.split(","))
    engine, spec = make_engine("auto"), CHAIN
    cuda = engine.device.type == "cuda"
    res = {}
    for case in ("decode", "draft_decode"):
        kw = dict(capture_bs=sizes, max_context_len=64, pool_size=4 * max(sizes) + 2, capture=False)
        rig = Rig.build(find("triton", "unified")[0], KINDS[case], spec, engine, **kw)
        for bs in sizes:
            raw = max(bs - 1, 1)
            batches = [rig.gen.for_mode(KINDS[case], raw) for _ in range(3)]
            for name, fn in ways(rig.runner, bs, batches[0]).items():
                sync = torch.cuda.synchronize if cuda else (lambda: None)
                us = statistics.median(bench.host_times(fn, batches, args.repeats, args.warmup, sync))
                res.setdefault(case, {}).setdefault(name, {})[bs] = {
                    "host_us": us,
                    "launches": kernel_launches(fn, batches[0], cuda),
                }
            rig.gen.release_all()
    env = {**bench.environment(), "pinning": pinned, "repeats": args.repeats, "warmup": args.warmup}
    print(f"{env.get('device')}; {pinned}; medians of {args.repeats}, host µs (kernel launches)")
    for case, by_way in res.items():
        print(f"\n{case}: | way | " + " | ".join(f"bs {b}" for b in sizes) + " |")
        for name, by_bs in by_way.items():
            cells = [f"{v['host_us']:.1f}" + (f" ({v['launches']})" if v["launches"] is not None else "") for v in by_bs.values()]
            print(f"| {name} | " + " | ".join(cells) + " |")
    if args.out:
        Path(args.out).write_text(json.dumps({"environment": env, "results": res}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
