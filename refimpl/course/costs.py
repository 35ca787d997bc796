"""Notebook 06's helpers: the committed H200 measurements it reads (one launch's host cost, the replay sweep, the
replay table), the launches of the Triton decode hooks counted live, its figures and tables, and the planted glue bug.

Every number comes from a file under ``benchmarks/results/``: ``launch_cost/launch_cost.json``
(``benchmarks/launch_cost.py``), ``replay_cost/results.json`` (``python -m refimpl bench``) and
``replay_path/replay_table.json`` (``benchmarks/replay_table.py``).
"""

import sys
from functools import cache, partial

import torch
from matplotlib.figure import Figure

from .. import bench, viz
from ..backends import BackendEntry, find
from ..config import CHAIN
from ..graphs import make_engine
from ..kernels.indices import build_kv_indices
from ..layout import KINDS
from ..rig.core import Rig
from ..viz.measure import HOST_PARTS
from . import ROOT, entry, results

SHAPES = {"faithful": "unified", "fused": "fused", "in-graph": "in_graph", "glued": "unified+glue"}  # Triton decode
COLORS = {"faithful": "#1f77b4", "fused": "#ff7f0e", "in-graph": "#2ca02c", "glued": "#9467bd"}
REPLAY = "graph.replay()"  # the glue graph's launch, and the step graph's
BATCH_SIZES = (1, 8, 64, 256)  # the sizes the step tables and lines show


_json = cache(results)  # read once per process


def _range(values):
    """``(lowest, highest)`` of ``values``."""
    values = list(values)
    return min(values), max(values)


def sweep() -> tuple[dict, list[dict]]:
    """The environment and the 900 rows of ``replay_cost/results.json`` (H200, 2026-12-01, medians of 30)."""
    data = _json("replay_cost/results.json")
    return data["environment"], data["rows"]


def launch_costs() -> dict[str, tuple]:
    """Host µs per call of each item of ``launch_cost.json``: (lowest, highest) median over its rounds; the two
    ``graph.replay()`` rows (1 and 64 kernels) merged as ``REPLAY``, the kernel's GPU time as
    ``"kernel on the GPU"``."""
    data = _json("launch_cost/launch_cost.json")
    out = {item: _range(r[item]["median"] for r in data["rounds"]) for item in data["rounds"][0]}
    out[REPLAY] = _range(us for k, v in out.items() if k.startswith("graph.replay()") for us in v)
    out["kernel on the GPU"] = (data["kernel_gpu_us"],) * 2
    return out


def draw_launch_costs() -> Figure:
    """One bar per item of ``launch_cost.json`` (its highest round median; the range written at its end), the tiny
    kernel's own GPU time last."""
    costs, env = launch_costs(), _json("launch_cost/launch_cost.json")["environment"]
    del costs[REPLAY]  # its two items have their own bars
    kinds = {"GPU": "#252525", "graph": "#31a354", "host read": "#bdbdbd", "refimpl": "#fd8d3c"}  # else: a launch
    fig = Figure(figsize=(7.5, 3.4))
    ax = fig.add_subplot()
    for y, (k, (lo, hi)) in enumerate(costs.items()):
        ax.barh(y, hi, color=next((c for word, c in kinds.items() if word in k), "#1f77b4"))
        ax.text(hi, y, f" {lo:.1f}" + (f"–{hi:.1f}" if hi - lo >= 0.05 else "") + " µs", va="center", fontsize=8)
    ax.set_yticks(range(len(costs)), list(costs), fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(right=max(hi for _, hi in costs.values()) * 1.25)
    ax.set_xlabel("µs per call: host time (two rounds of 200 loops of 50 calls, one core); the last bar: GPU time")
    ax.set_title(
        f"One launch costs the host {costs['eager op'][0]:.1f}–{costs['triton, from Python'][1]:.1f} µs; the kernel runs "
        f"{costs['kernel on the GPU'][0]:.1f} µs on the GPU ({env['device']})",
        fontsize=9,
    )
    return fig


def priced_as(op: str) -> str:
    """The ``launch_costs`` item an op of ``hook_launches`` costs: a refimpl kernel as a hook calls it (argument checks,
    then the launch), one ``graph.replay()``, or an eager PyTorch op."""
    return "refimpl kernel, as a hook calls it" if op.startswith("refimpl.") else REPLAY if op == REPLAY else "eager op"


def hook_launches() -> dict[str, dict]:
    """Per Triton decode shape, the ops its replay hook launches (``aten.cumsum``, ``refimpl.build_kv_indices``, ...),
    counted here (CPU emulator) with ``bench.launches`` on a bs-2 graph (context 64). The glued hook is one replay of its
    glue graph (``GraphRunner.replay_hook``): on a GPU it launches nothing else, and the emulator replays a graph by
    running its ops again, so it is not counted."""
    engine, out = make_engine("auto"), {}
    for shape in ("faithful", "fused", "in-graph"):
        rig, fb = _loaded_rig(SHAPES[shape], engine, 2, 64, pool_size=8)
        ops = bench.launches(partial(rig.runner.replay_hook, fb, 2))
        out[shape] = {op.removesuffix(".default"): n for op, n in ops.items()}
    return out | {"glued": {REPLAY: 1}}


def _loaded_rig(variant, engine, bs, ctx, seq_lens=None, **kw):
    """``(rig, batch)``: a Triton decode ``Rig`` of ``variant`` with one graph (``bs``, context ``ctx``), and a batch of
    ``bs`` (``seq_lens``) loaded into its static inputs."""
    rig = Rig.build(find("triton", variant)[0], KINDS["decode"], CHAIN, engine, capture_bs=(bs,), max_context_len=ctx, **kw)
    fb = rig.gen.decode(bs, seq_lens)
    rig.runner.load_inputs(fb, bs)
    return rig, fb


def span(low: float, high: float) -> str:
    """``"82-84"``, or ``"34"`` when both round to the same µs."""
    return f"{low:.0f}" if round(low) == round(high) else f"{low:.0f}-{high:.0f}"


def measured_hooks() -> dict[str, tuple]:
    """Per Triton decode shape, the lowest and highest median host µs of its replay hook at bs 1 / 8 / 64
    (``replay_path/replay_table.json``: H200, context 4096, medians of 600)."""
    rows = _json("replay_path/replay_table.json")["rows"]
    return {
        shape: _range(rows[f"triton/{variant}/decode"][bs]["hook"] for bs in ("1", "8", "64"))
        for shape, variant in SHAPES.items()
    }


def host_gpu(variant: str, mode: str = "decode") -> dict[int, dict]:
    """bs -> host µs of the replay path (copies + hook + launch), GPU µs of the graph and the synchronised graph step of
    Triton's ``variant`` at context 512, medians from ``results.json``."""
    return {
        r["bs"]: dict(
            host=r["host_us"]["path"]["median"], gpu=r["gpu_us"]["graph"]["median"], step=r["step_us"]["graph"]["median"]
        )
        for r in sorted(sweep()[1], key=lambda r: r["bs"])
        if (r["backend"], r["variant"], r["mode"], r["context"]) == ("triton", variant, mode, 512)
    }


def host_bound(variant: str, mode: str = "decode") -> set[int]:
    """The batch sizes among ``BATCH_SIZES`` whose host path is longer than the GPU time of the graph."""
    return {bs for bs, p in host_gpu(variant, mode).items() if bs in BATCH_SIZES and p["host"] > p["gpu"]}


def gpu_line(variant: str, mode: str = "decode") -> str:
    """The GPU µs of the graph at each of ``BATCH_SIZES``, one line."""
    return ", ".join(f"bs {bs}: {p['gpu']:.0f}" for bs, p in host_gpu(variant, mode).items() if bs in BATCH_SIZES)


def step_table(variant: str, mode: str = "decode") -> str:
    """One line per bs of ``BATCH_SIZES``: host, GPU, their sum against the measured synchronised step, and max(host,
    GPU): the step a host that runs ahead would reach."""
    lines = [f"triton/{variant} {mode}, context 512, µs: host + GPU vs the measured step; max(host, GPU)"]
    for bs, p in host_gpu(variant, mode).items():
        if bs in BATCH_SIZES:
            h, g, s = p.values()  # host, GPU, step
            lines.append(
                f"  bs {bs:>3}: {h:4.0f} + {g:4.0f} = {h + g:5.0f} vs {s:5.0f} measured; max {max(h, g):4.0f}  "
                f"{'host' if h > g else 'GPU'}-bound"
            )
    return "\n".join(lines)


BREAKDOWN = [  # (label, backend, variant, mode) of the breakdown figure
    ("Triton decode, faithful", "triton", "unified", "decode"),
    ("Triton decode, glued", "triton", "unified+glue", "decode"),
    ("Triton decode, in-graph", "triton", "in_graph", "decode"),
    ("FlashInfer decode", "flashinfer", "unified", "decode"),
    ("FlashInfer target verify", "flashinfer", "unified", "target_verify"),
    ("FlashInfer-MLA decode", "flashinfer_mla", "unified", "decode"),
    ("TRTLLM-MLA decode", "trtllm_mla", "unified", "decode"),
]


def draw_breakdown() -> Figure:
    """``viz.draw_replay_breakdown`` of the ``BREAKDOWN`` rows at bs 8, context 512: copies, hook, launch, and the GPU
    bar."""
    env, rows = sweep()
    return viz.draw_replay_breakdown(rows, env, 8, 512, [k[1:] for k in BREAKDOWN], [k[0] for k in BREAKDOWN], HOST_PARTS)


def draw_host_vs_gpu() -> Figure:
    """``viz.draw_host_vs_bs``: the four Triton decode shapes' host paths and the graph's GPU time, context 512."""
    env, rows = sweep()
    series = [(shape, "triton", variant, COLORS[shape]) for shape, variant in SHAPES.items()]
    return viz.draw_host_vs_bs(rows, env, 512, series)


def planted_backend() -> BackendEntry:
    """``tests/broken_backends.py:HostValueInHook`` (it subclasses ``examples/paged_decode_backend.py``)."""
    if (tests := str(ROOT / "tests")) not in sys.path:
        sys.path.insert(0, tests)
    return entry("broken_backends:HostValueInHook")  # ``entry`` puts the repository root on the path too


def glued_rig(entry: BackendEntry) -> Rig:
    """``entry``'s decode runner on the CPU emulator, graphs of bs 1 / 2 / 4, each replay hook in a glue graph."""
    return Rig.build(
        entry, KINDS["decode"], CHAIN, make_engine("cpu-emulator"), capture_bs=(1, 2, 4), max_context_len=32, glue=True
    )


def hook_parts(bs: int = 8, ctx: int = 512, calls: int = 50, repeats: int = 100) -> str:
    """The faithful Triton decode replay hook and its pieces, host µs each, timed one by one in this process on one
    batch of ``bs`` (meant for a GPU; on the emulator the numbers say what the Python costs)."""
    engine, seq_lens = make_engine("auto"), [ctx // 2 + 7 * i for i in range(bs)]
    rig, fb = _loaded_rig("unified", engine, bs, ctx, seq_lens, validate_inputs=False, pool_size=bs + 4)
    be, view = rig.backend, rig.runner._replay_batch(fb, bs)
    seq, rpi, indptr = view.seq_lens[:bs], view.req_pool_indices[:bs], be.kv_indptr[: bs + 1]

    def assign():
        indptr[1:] = torch.cumsum(seq, 0)  # an int64 result, converted back to int32

    parts = {
        "the whole replay hook": partial(rig.runner.replay_hook, fb, bs),
        "kv_indptr[1:] = cumsum(...)": assign,
        "build_kv_indices": lambda: build_kv_indices(be.world.req_to_token, rpi, seq, indptr, be.cuda_graph_kv_indices),
        "split counts (get_num_kv_splits)": lambda: be.get_num_kv_splits(be.cuda_graph_num_kv_splits[:bs], seq),
        "one eager op (add_)": partial(torch.zeros(128, device=engine.device).add_, 1),
    }
    where = torch.cuda.get_device_name() if engine.device.type == "cuda" else "CPU emulator"
    lines = [f"faithful Triton decode hook, bs {bs}, {where}, host µs (median of {repeats} loops of {calls} calls)"]
    for name, fn in parts.items():
        lines.append(f"  {name:<34} {bench.per_call_us(fn, calls, repeats, warmup=calls)['median']:8.1f}")
    return "\n".join(lines)
