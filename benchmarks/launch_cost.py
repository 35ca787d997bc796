"""What one launch costs on the host: the unit a replay hook's time is made of (notebook 06).

    taskset -c 2 python benchmarks/launch_cost.py [--repeats 200] [--calls 50] [--out FILE.json]

Host µs per call, each item timed in loops of ``--calls`` calls, ``--repeats`` loops (median, p10, p90 of the per-call
time of each loop), a synchronisation between loops outside the timer, after a warm-up; the whole set twice
(``rounds``), so two runs can be compared. Items:

* ``eager op``: ``x.add_(1)`` on 128 floats, one PyTorch op through the dispatcher;
* ``triton, from Python``: a one-block Triton kernel called as ``kernel[grid](...)`` (the JIT binds and specialises the
  arguments, looks the compiled kernel up, then launches);
* ``triton, compiled handle``: the same kernel launched through the ``CompiledKernel`` that ``warmup`` returns (no
  binding, no cache lookup);
* ``refimpl kernel, as a hook calls it``: refimpl's kv-index builder for 8 requests (``build_kv_indices``: argument
  checks, then the Triton launch), what a Triton replay hook launches;
* ``refimpl kernel, custom op``: the same launch through its registered ``torch.library`` op (``.op``: what a dispatch
  mode or ``torch.compile`` sees; ``refimpl/kernels/_op.py`` skips it when nothing watches);
* ``graph.replay(), 1 kernel`` / ``64 kernels``: a captured graph of that many ``add_`` kernels;
* ``host read (.item())``: an op followed by a device-to-host read, which waits for the GPU.

GPU µs of the one-block kernel itself comes from a graph of 64 of them timed with CUDA events. GPU only (on a CPU it
says so and exits 0).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch


def items() -> dict:
    import triton
    import triton.language as tl

    from refimpl.kernels.indices import _build_kv_indices_op, build_kv_indices

    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        m = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=m) + 1, mask=m)

    dev = torch.device("cuda")
    x = torch.zeros(128, device=dev)
    out = {"eager op": lambda: x.add_(1)}
    out["triton, from Python"] = lambda: add_one[(1,)](x, 128, BLOCK=128)
    compiled = add_one.warmup(x, 128, BLOCK=128, grid=(1,))
    out["triton, compiled handle"] = lambda: compiled[(1, 1, 1)](x, 128, 128)  # every parameter, constexprs included

    bs, ctx = 8, 512
    req_to_token = torch.arange(16 * ctx, device=dev, dtype=torch.int32).view(16, ctx)
    rpi = torch.arange(1, bs + 1, device=dev)
    seq = torch.full((bs,), ctx // 2, device=dev, dtype=torch.int32)
    indptr = torch.zeros(bs + 1, device=dev, dtype=torch.int32)
    indptr[1:] = torch.cumsum(seq, 0)
    indices = torch.zeros(bs * ctx, device=dev, dtype=torch.int64)
    args = (req_to_token, rpi, seq, indptr, indices)
    out["refimpl kernel, as a hook calls it"] = lambda: build_kv_indices(*args)
    out["refimpl kernel, custom op"] = lambda: _build_kv_indices_op.op(*args, None)

    for n in (1, 64):
        g, y = torch.cuda.CUDAGraph(), torch.zeros(128, device=dev)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            y.add_(1)  # warm-up off the capture
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            for _ in range(n):
                y.add_(1)
        out[f"graph.replay(), {n} kernel{'s' if n > 1 else ''}"] = g.replay
    out["host read (.item())"] = lambda: x.add_(1).sum().item()
    return out


def kernel_gpu_us() -> float:
    """GPU µs of one ``add_`` on 128 floats: a graph of 64 of them, timed with events."""
    y, g = torch.zeros(128, device="cuda"), torch.cuda.CUDAGraph()
    y.add_(1)
    with torch.cuda.graph(g):
        for _ in range(64):
            y.add_(1)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(50):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / 64)
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("launch_cost: needs a CUDA device; nothing measured")
        return 0
    from refimpl import bench

    fns = items()
    rounds = [{name: bench.per_call_us(fn, a.calls, a.repeats) for name, fn in fns.items()} for _ in range(a.rounds)]
    env = bench.environment()
    result = {"environment": env, "calls": a.calls, "repeats": a.repeats, "kernel_gpu_us": kernel_gpu_us()}
    result["cores"] = sorted(os.sched_getaffinity(0))  # taskset -c N: one core
    result["rounds"] = rounds
    for name in fns:
        print(f"{name:<28} " + "  ".join(f"{r[name]['median']:7.2f}" for r in rounds) + "  host µs per call")
    print(f"one add_ kernel on the GPU: {result['kernel_gpu_us']:.2f} µs; {env.get('device')}, cores {result['cores']}")
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
