"""Measurements drawn: replay latency against batch size, the bench's part-by-part figures."""

from collections.abc import Mapping, Sequence
from operator import itemgetter
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator, ScalarFormatter

from .cells import save, suptitle, yticks

# a TRTLLM-MLA variant's line (draw_latency_vs_bs)
SHAPE_COLORS = {"legacy": "#d62728", "unified": "#1f77b4", "simplified": "#ff7f0e", "in_graph": "#2ca02c"}
PART_COLORS = {"validate": "#bdbdbd", "copies": "#9ecae1", "hook": "#fd8d3c", "launch": "#31a354"}


# small helpers over bench rows (``refimpl.bench`` results)
Rows = Sequence[Mapping]
_by_bs = lambda rows: sorted(rows, key=lambda r: r["bs"])
_stat = lambda rows, group, key, stat="median": [r[group][key][stat] for r in rows]  # e.g. "host_us", "hook", "p25"
_where = lambda env: env.get("device", "") + (" (emulator timings)" if "emulator" in env.get("note", "") else "")


def _bs_axis(ax, ylabel):
    """A log2 batch-size x axis, the y label, a light grid, y from 0."""
    ax.set_xscale("log", base=2)
    ax.set(xlabel="batch size", ylabel=ylabel)
    ax.grid(alpha=0.3)
    ax.set_ylim(bottom=0)


def draw_latency_vs_bs(rows: Rows, panels: Sequence[tuple[str, str, str]], title: str = "") -> Figure:
    """Median (line) and p25–p75 (shaded) against batch size, one line per ``row["shape"]`` of the
    ``bench.time_replay_path`` ``rows``; a panel per ``(group, key, label)``, e.g. ``("host_us", "hook+launch", "host
    µs")``."""
    fig = Figure(figsize=(5.2 * len(panels), 3.6))
    for k, (group, key, label) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), k + 1)
        for shape in dict.fromkeys(r["shape"] for r in rows):
            if mine := _by_bs(r for r in rows if r["shape"] == shape and group in r):
                bs, color = [r["bs"] for r in mine], SHAPE_COLORS.get(shape)
                ax.plot(bs, _stat(mine, group, key), marker="o", ms=3, label=shape, color=color)
                ax.fill_between(bs, _stat(mine, group, key, "p25"), _stat(mine, group, key, "p75"), alpha=0.25, color=color)
        _bs_axis(ax, label)
        ax.legend(fontsize=8)
    suptitle(fig, title)
    return fig


# --- ``python -m refimpl bench`` results (``refimpl.bench.sweep`` rows) ---
HOST_PARTS = ("copies", "hook", "launch")  # the replay path a timing run measures (validation off)
GPU_COLOR = "#252525"
Series = tuple[str, str, str, str]  # (label, backend, variant, color)


_key = itemgetter("backend", "variant", "mode")  # a bench row's key


def draw_replay_breakdown(
    rows: Rows,
    env: Mapping,
    bs: int,
    context: int,
    keys: Sequence[tuple[str, str, str]] | None = None,
    labels: Sequence[str] | None = None,
    parts: Sequence[str] = (*HOST_PARTS, "validate"),
) -> Figure:
    """One row per ``(backend, variant, mode)`` of ``keys`` (default: every row) at one (bs, context): the host µs of
    ``parts`` stacked (medians; ``validate`` hatched: off in timing runs), its total written at its end, and under it a
    black bar, the GPU µs of the graph where measured. A host bar longer than its black bar is a host-bound step."""
    at = {_key(r): r for r in rows if r["bs"] == bs and r["context"] == context}
    keys = list(at) if keys is None else keys
    fig = Figure(figsize=(8.5, 0.5 * len(keys) + 1.3))
    ax = fig.add_subplot()
    for y, k in enumerate(keys):
        left = 0.0
        for part in parts:
            w, valid = at[k]["host_us"][part]["median"], part == "validate"
            ax.barh(
                y - 0.12,
                w,
                left=left,
                height=0.5,
                color=PART_COLORS[part],
                edgecolor="white",
                lw=0.5,
                hatch="//" if valid else None,
            )
            if y == 0:  # the parts named once, over the first row
                ax.text(left + w / 2, -0.42, "validation" if valid else part, ha="center", fontsize=7)
            left += w
        ax.text(left, y - 0.12, f" host {left:.0f}", va="center", fontsize=7)
        if "gpu_us" in at[k]:
            g = at[k]["gpu_us"]["graph"]["median"]
            ax.barh(y + 0.25, g, height=0.18, color=GPU_COLOR)
            ax.text(g, y + 0.25, f" GPU {g:.0f}", va="center", fontsize=7, color=GPU_COLOR)
    yticks(ax, [f"{b}/{v} {m}" for b, v, m in keys] if labels is None else labels, 8)
    ax.set(ylim=(len(keys) - 0.5, -0.75), xlabel="µs (host: medians of each part; GPU: the graph, CUDA events)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(
        f"One replay at bs {bs}, context {context}, {_where(env)}: host-bound where the host bar outruns the black GPU bar",
        fontsize=9,
    )
    return fig


def draw_host_vs_bs(rows: Rows, env: Mapping, context: int, series: Sequence[Series]) -> Figure:
    """The host µs of the decode replay path (copies + hook + launch, median) against bs, one line per ``(label, backend,
    variant, color)`` of ``series`` (at most 6 with the GPU line), and the GPU µs of the first series' graph (black);
    each line labelled at its end. Where a host line lies above the GPU line, the step is host-bound."""
    if len(series) > 5:
        raise ValueError(f"draw_host_vs_bs: {len(series)} series; at most 5 (and the GPU line) stay readable")
    fig = Figure(figsize=(7.0, 3.8))
    ax, ends = fig.add_subplot(), []  # (text, x, y, color) of each line's last point
    for k, (label, backend, variant, color) in enumerate(series):
        pts = _by_bs(r for r in rows if _key(r) == (backend, variant, "decode") and r["context"] == context)
        bs, host = [r["bs"] for r in pts], _stat(pts, "host_us", "path")
        ax.plot(bs, host, marker="o", ms=3, color=color)
        ends.append((f"{label}: host", bs[-1], host[-1], color))
        if k == 0 and all("gpu_us" in r for r in pts):
            gpu = _stat(pts, "gpu_us", "graph")
            ax.plot(bs, gpu, color=GPU_COLOR, lw=2.2, ls="--")
            ends.append(("GPU: the graph", bs[-1], gpu[-1], GPU_COLOR))
    _bs_axis(ax, "µs per replay")
    last = -np.inf  # each label just right of its line's end, nudged apart by at least 6% of the y range
    for text, x, y, color in sorted(ends, key=lambda t: t[2]):
        last = max(y, last + 0.06 * ax.get_ylim()[1])
        ax.annotate(text, (x, last), (6, 0), textcoords="offset points", va="center", fontsize=8, color=color)
    ax.set_xlim(right=ax.get_xlim()[1] * 3)  # room for the labels
    ax.set_xticks(sorted({r["bs"] for r in rows if r["context"] == context}))
    ax.xaxis.set(major_formatter=ScalarFormatter(), minor_locator=NullLocator())
    where = f"{' / '.join(dict.fromkeys(b for _, b, _, _ in series))} decode, context {context}, {_where(env)}"
    ax.set_title(f"{where}:\nhost-bound where a host line lies above the GPU line", fontsize=9)
    return fig


def _bar_pairs(rows, env, context, bs, pick, pair, names, fmt, xlabel, title):
    """Two bars per backend x variant x mode at one bs (default: ``pick`` of the context's), upper ``pair(row)[0]``,
    lower ``[1]`` (``names`` says which), each value written at its end (``fmt``); a log x axis."""
    bs = pick(r["bs"] for r in rows if r["context"] == context) if bs is None else bs
    mine = [r for r in rows if r["context"] == context and r["bs"] == bs]
    fig = Figure(figsize=(8.0, 0.32 * len(mine) + 1.2))
    ax = fig.add_subplot()
    for y, r in enumerate(mine):
        for dy, v, color in zip((-0.18, 0.18), pair(r), ("#1f77b4", "#d62728")):
            ax.barh(y + dy, v, height=0.34, color=color)
            ax.text(v, y + dy, " " + fmt.format(v), va="center", fontsize=6)
    yticks(ax, [f"{r['backend']}/{r['variant']} {r['mode']}" for r in mine])
    ax.invert_yaxis()
    note = f"upper bar: {names[0]}; lower bar: {names[1]}"
    ax.text(0.99, 0.01, note, transform=ax.transAxes, ha="right", va="bottom", fontsize=7)
    ax.set(xscale="log", xlabel=xlabel)
    ax.set_title(f"{title}, bs {bs}, context {context} — {_where(env)}", fontsize=9)
    return fig


def draw_step_graph_vs_eager(rows: Rows, env: Mapping, context: int, bs: int | None = None) -> Figure:
    """The whole decoder step (wall µs, synchronised), as a graph and eagerly, one pair of bars per backend x variant x
    mode at one bs (default: the smallest), each value written at its bar's end."""
    return _bar_pairs(
        rows,
        env,
        context,
        bs,
        min,
        lambda r: (r["step_us"]["graph"]["median"], r["step_us"]["eager"]["median"]),
        ("graph", "eager"),
        "{:.0f}",
        "whole step, wall µs (median, synchronised)",
        "Graph vs eager, whole decoder step",
    )


def draw_capture_cost(rows: Rows, env: Mapping, context: int, bs: int | None = None) -> Figure:
    """Capture time (warm-up + capture) of one batch size (default: the largest), first in the process and again (warm),
    one pair of bars per backend x variant x mode. Memory is not drawn: the bench's ``pool_growth_bytes`` is a
    ``memory_reserved`` difference, which counts every cached block of the process and goes negative when the allocator
    releases some."""
    return _bar_pairs(
        rows,
        env,
        context,
        bs,
        max,
        lambda r: (r["capture_s"]["first"] * 1e3, r["capture_s"]["warm"] * 1e3),
        ("first capture", "again (warm)"),
        "{:.1f}",
        "ms (warm-up + capture)",
        "Capture time per batch size",
    )


def draw_bench_figures(rows: Rows, env: Mapping, out_dir: str | Path) -> list[Path]:
    """The bench plots into ``out_dir`` (file names start with ``replay_``)."""
    ctx = min(r["context"] for r in rows)
    sizes = sorted({r["bs"] for r in rows if r["context"] == ctx})
    figs = {
        "replay_breakdown.png": draw_replay_breakdown(rows, env, 8 if 8 in sizes else sizes[len(sizes) // 2], ctx),
        "replay_step_graph_vs_eager.png": draw_step_graph_vs_eager(rows, env, ctx),
        "replay_capture_cost.png": draw_capture_cost(rows, env, ctx),
    }
    triton = dict.fromkeys(r["variant"] for r in rows if r["backend"] == "triton" and r["mode"] == "decode")
    if series := [(v, "triton", v, matplotlib.colormaps["tab10"](i)) for i, v in enumerate(list(triton)[:5])]:
        figs["replay_host_vs_bs_triton.png"] = draw_host_vs_bs(rows, env, ctx, series)
    return [save(f, Path(out_dir) / name) for name, f in figs.items()]
