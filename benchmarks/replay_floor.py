"""What ``graph.replay()`` costs on the host, and how much of it the step graph's kernel count explains (issue 16, 4).

    python benchmarks/replay_floor.py [--pin CORE] [--repeats 2000] [--out FILE.json]

Synthetic graphs of 1, 4, 16, 64 and 256 small kernels (``x.add_(1)`` each), captured with ``torch.cuda.graph``,
then refimpl's step graphs (``runner.launch``) for a few backends and batch sizes with their recorded op counts
(``Graph.kernels()``) and the node count of the instantiated CUDA graph by node type (``cudaGraphGetNodes`` /
``cudaGraphNodeGetType`` through ctypes, graphs captured with ``keep_graph=True``; left out where the runtime library
cannot be found). Host µs medians of the launch call alone, a synchronisation between calls (outside the timer). GPU
only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from refimpl import bench
from refimpl.backends import find
from refimpl.config import CHAIN
from refimpl.graphs import make_engine
from refimpl.layout import KINDS
from refimpl.rig import Rig

ROWS = ("triton/unified/decode", "triton/in_graph/decode", "flashinfer/unified/decode", "trtllm_mla/unified/draft_extend_v2")
SIZES = (1, 16, 64)


NODE_TYPES = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "graph", 5: "empty", 6: "wait_event", 7: "event"}


def _cudart():
    import ctypes
    import glob
    import os

    names = ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]
    for base in {os.path.dirname(p) for p in torch.__path__} | {os.path.dirname(os.path.dirname(torch.__file__))}:
        names += sorted(glob.glob(os.path.join(base, "nvidia", "**", "libcudart.so*"), recursive=True))
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def node_types(raw_graph: int) -> dict[str, int] | None:
    """``{node type: count}`` of a ``cudaGraph_t`` (an int handle), or None without a runtime library."""
    import ctypes

    rt = _cudart()
    if rt is None:
        return None
    count = ctypes.c_size_t(0)
    if rt.cudaGraphGetNodes(ctypes.c_void_p(raw_graph), None, ctypes.byref(count)):
        return None
    nodes = (ctypes.c_void_p * count.value)()
    rt.cudaGraphGetNodes(ctypes.c_void_p(raw_graph), nodes, ctypes.byref(count))
    out: dict[str, int] = {}
    for node in nodes:
        kind = ctypes.c_int(-1)
        rt.cudaGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind))
        name = NODE_TYPES.get(kind.value, f"type {kind.value}")
        out[name] = out.get(name, 0) + 1
    return out


def keep_graphs() -> None:
    """Make every ``torch.cuda.CUDAGraph`` keep its ``cudaGraph_t`` (``raw_cuda_graph()``), where torch allows it."""
    import functools

    try:
        torch.cuda.CUDAGraph(keep_graph=True)
    except TypeError:
        return
    torch.cuda.CUDAGraph = functools.partial(torch.cuda.CUDAGraph, keep_graph=True)


def raw_nodes(graph) -> dict[str, int] | None:
    try:
        return node_types(graph.raw_cuda_graph())
    except Exception:  # noqa: BLE001 - an older torch, no runtime library: leave the count out
        return None


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


def synthetic(n: int, repeats: int) -> dict:
    x = torch.zeros(16, device="cuda")
    g, s = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(2):
            x.add_(1)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        for _ in range(n):
            x.add_(1)
    g.replay()
    return {"launch_us": host_us(g.replay, repeats), "nodes": raw_nodes(g)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=2000)
    p.add_argument("--pin", type=int, default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    pinned = bench.pin_to_core(args.pin)
    keep_graphs()
    res = {"synthetic": {n: synthetic(n, args.repeats) for n in (1, 4, 16, 64, 256)}, "steps": {}}
    spec = CHAIN
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
                "nodes": raw_nodes(rig.runner.graphs[bs].graph),
            }
            rig.gen.release(fb)
    print(f"{bench.environment()['device']}; {pinned}; host µs medians of one graph launch")
    for n, r in res["synthetic"].items():
        print(f"synthetic graph of {n:>3} kernels: {r['launch_us']:7.1f}  nodes {r['nodes']}")
    for key, r in res["steps"].items():
        print(f"{key:<46} {r['ops']:>4} ops: {r['launch_us']:7.1f}  nodes {r['nodes']}")
    if args.out:
        Path(args.out).write_text(json.dumps({"environment": bench.environment(), "pinning": pinned, **res}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
