"""The replay path's own Python, on any machine: ``check_batch`` (the host rules, then the device checks' launch wrapper)
and ``StaticInputs.load`` (the load's launch wrapper and the host mirror), down their CUDA branches with the kernels
stubbed, over tensors on the ``meta`` device (sizes, dtypes, no data).

    python benchmarks/host_python.py [--pin CORE] [--ctx 4096] [--calls 400] [--rounds 15] [--out FILE.json]

Why: on the H200 the validation and copies columns of ``replay_table.py`` are 60-90 and 15-20 µs, and a cProfile there
(``results/default_path/verdict_step/profile_after_ce3ad6c.txt``) puts almost all of it in these functions' own
Python; a host about 3x slower per Python operation than a 2024 desktop core (``isinstance``: 0.23 µs there). What this
prints is that Python without the C launch (``kernel.run``), the events and the staging: a floor the H200's columns
sit above, and the part a code change can move. Host µs, the median of ``--rounds`` rounds of ``--calls`` calls each.
Rows: Triton ``in_graph`` decode and target verify (the host rules depend on the graph kind, not the backend), bs 1 /
8 / 64.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from unittest import mock

import torch

import refimpl
from refimpl import bench
from refimpl import validate as V
from refimpl.backends import find
from refimpl.config import CHAIN
from refimpl.graphs import make_engine
from refimpl.graphs.inputs import StaticInputs
from refimpl.graphs.runner import GraphRunner
from refimpl.kernels import inputs as KI
from refimpl.kernels import validation as KV
from refimpl.layout import KINDS
from refimpl.rig import Rig

META = torch.device("meta")


def median_us(f, calls: int, rounds: int) -> float:
    for _ in range(calls):  # warm-up
        f()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            f()
        times.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(times)


def row(mode: str, bs: int, ctx: int, calls: int, rounds: int) -> dict:
    rig = Rig.build(
        find("triton", "in_graph")[0],
        KINDS[mode],
        CHAIN,
        make_engine("auto"),
        capture_bs=(bs,),
        max_context_len=ctx,
        pool_size=2 * bs + 2,
        gen_seed=1,
        capture=False,
    )
    runner, lens = rig.runner, [ctx - KINDS[mode].span(rig.spec) - i % 7 for i in range(bs)]
    world = rig.world.clone_to(META)
    fb = rig.gen.for_mode(rig.kind, bs, seq_lens=lens).to_world(world)  # seq_lens_cpu stays on the host
    with stubbed():  # (not before: the generator's own check of the batch runs the real device checks on a GPU)
        return timed(runner, world, fb, mode, bs, calls, rounds)


def stubbed() -> contextlib.ExitStack:
    """The two kernels stubbed, and the load down its CUDA wrapper (meta tensors are not ``is_cuda``), until exit."""
    stack = contextlib.ExitStack()
    for module, name, stand_in in (
        (KV, "direct_launch", lambda *a, **k: None),
        (KI, "direct_launch", lambda *a, **k: None),
        (KI, "load_inputs_ref", KI.launch_load_inputs),
    ):
        stack.enter_context(mock.patch.object(module, name, stand_in))
    return stack


def timed(runner: GraphRunner, world, fb, mode: str, bs: int, calls: int, rounds: int) -> dict:
    """``row``'s timings, the kernels stubbed."""
    # the runner's replay-path state on the meta device, its methods unchanged (no capture: nothing is launched)
    meta = object.__new__(GraphRunner)
    meta.__dict__.update({k: v for k, v in vars(runner).items() if not isinstance(v, torch.Tensor)}, world=world)
    meta.inputs = StaticInputs(runner.kind, runner.spec_cfg, bs, runner.fill_value, META)
    meta._verdict = torch.empty_like(runner._verdict, device=META)
    meta._staged, meta._record, meta._pending = runner._staged, runner._record, None  # host buffers (pinned on CUDA)
    meta._done = None  # no CUDA event (on a GPU the runner's would wait for nothing here)
    meta._captured_with = meta._bound()  # the identity checks run, as after a capture
    meta.validate(fb)
    assert (last := meta._pending), "a graph replay's device rules are deferred"
    last[2] = True

    def validate():
        meta._pending = last  # the last replay, loaded: synchronize reads its record (0: served)
        return meta.validate(fb)

    load = lambda: meta.load_inputs(fb, bs)
    out = dict(mode=mode, bs=bs, validate=median_us(validate, calls, rounds), load=median_us(load, calls, rounds))
    with mock.patch.object(V, "_launch_device_checks", lambda *a, **k: lambda: 0):
        out["host_rules"] = median_us(validate, calls, rounds)
    out["checks_launch"] = out["validate"] - out["host_rules"]
    return out


def floor(calls: int, rounds: int) -> float:
    """The host rules' bare operations on a decode batch of one request: six type / dtype / device / size / contiguity
    checks, the host lengths' list, sum, min and max; no names, no modes, no refusal paths."""
    entry = find("triton", "in_graph")[0]
    rig = Rig.build(entry, KINDS["decode"], CHAIN, make_engine("auto"), capture_bs=(1,), max_context_len=64, capture=False)
    fb = rig.gen.for_mode(rig.kind, 1, seq_lens=[40])
    kinds, places = (torch.int64, torch.int32), (fb.world.device, torch.device("cpu"))

    def rules():
        for t in (fb.input_ids, fb.positions, fb.req_pool_indices, fb.seq_lens, fb.seq_lens_cpu, fb.out_cache_loc):
            if not (isinstance(t, torch.Tensor) and t.dtype in kinds and t.device in places and t.numel() and t.is_contiguous()):
                raise ValueError(t)
        seq = fb.seq_lens_cpu.tolist()
        if fb.seq_lens_sum != sum(seq) or min(seq) < 1 or max(seq) > 64:
            raise ValueError(seq)

    return median_us(rules, calls, rounds)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pin", type=int, default=None)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--calls", type=int, default=400)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    print(bench.pin_to_core(args.pin), "| refimpl from", refimpl.__file__)
    rows = [row(m, bs, args.ctx, args.calls, args.rounds) for m in ("decode", "target_verify") for bs in (1, 8, 64)]
    print("| mode | bs | validate | of it: the rest | of it: device checks' launch | load_inputs |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        cells = (r["validate"], r["host_rules"], r["checks_launch"], r["load"])
        print(f"| {r['mode']} | {r['bs']} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    print(f"floor: the host rules' bare operations, {(bare := floor(args.calls, args.rounds)):.2f} µs")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(environment=bench.environment(), rows=rows, floor=bare), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
