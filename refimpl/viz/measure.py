"""Measurements drawn: replay latency against batch size, the bench's part-by-part figures."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure

from .cells import save, suptitle

SHAPE_COLORS = {"legacy": "#d62728", "unified": "#1f77b4", "simplified": "#ff7f0e", "in_graph": "#2ca02c"}
SHAPE_COLORS |= {"faithful": "#1f77b4", "fused": "#ff7f0e"}  # the bench's variants
PART_COLORS = {"validate": "#bdbdbd", "copies": "#9ecae1", "hook": "#fd8d3c", "launch": "#31a354"}


# small helpers over bench rows (``refimpl.bench`` results)
_by_bs = lambda rows: sorted(rows, key=lambda r: r["bs"])
_stat = lambda rows, group, key, stat: [r[group][key][stat] for r in rows]  # e.g. "host_us", "hook", "median"
_label = lambda r: f"{r['backend']}/{r['variant']} {r['mode']}"
_where = lambda env: env.get("device", "") + (" (emulator timings)" if "emulator" in env.get("note", "") else "")


def _bs_axis(ax, ylabel: str) -> None:
    """A log2 batch-size x axis, the y label, a light grid."""
    ax.set_xscale("log", base=2)
    ax.set(xlabel="batch size", ylabel=ylabel)
    ax.grid(alpha=0.3)


def draw_latency_vs_bs(
    rows: Sequence[Mapping], panels: Sequence[tuple[str, str, str]], title: str = "", second_run: Sequence[Mapping] = ()
) -> Figure:
    """Median (line) and p25–p75 (shaded) against batch size, one line per ``row["shape"]`` of the
    ``bench.time_replay_path`` ``rows``; a panel per ``(group, key, label)``, e.g. ``("host_us", "hook+launch", "host
    µs")``. ``second_run``: the same measurement repeated, as dotted medians."""
    fig = Figure(figsize=(5.2 * len(panels), 3.6))
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    for k, (group, key, label) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), k + 1)
        for shape in shapes:
            mine = _by_bs(r for r in rows if r["shape"] == shape and group in r)
            if not mine:
                continue
            bs, color = [r["bs"] for r in mine], SHAPE_COLORS.get(shape)
            ax.plot(bs, _stat(mine, group, key, "median"), marker="o", ms=3, label=shape, color=color)
            ax.fill_between(bs, _stat(mine, group, key, "p25"), _stat(mine, group, key, "p75"), alpha=0.25, color=color)
            again = _by_bs(r for r in second_run if r["shape"] == shape and group in r)
            if again:
                ax.plot([r["bs"] for r in again], _stat(again, group, key, "median"), ls=":", color=color, alpha=0.8)
        _bs_axis(ax, label)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    suptitle(fig, title)
    return fig


# --- ``python -m refimpl bench`` results (``refimpl.bench.sweep`` rows) ---
def draw_replay_breakdown(rows: Sequence[Mapping], env: Mapping, bs: int, context: int) -> Figure:
    """Stacked host µs of the replay path per backend x variant x mode at one (bs, context): validation (hatched: off with
    ``validate_inputs=False``), input copies, the replay hook, ``graph.replay()``; the graph's GPU time as a black tick
    where measured."""
    mine = [r for r in rows if r["bs"] == bs and r["context"] == context]
    fig = Figure(figsize=(8.5, 0.32 * len(mine) + 1.4))
    ax = fig.add_subplot(1, 1, 1)
    for y, r in enumerate(mine):
        left = 0.0
        for part in ("copies", "hook", "launch", "validate"):
            w = r["host_us"][part]["median"]
            style = dict(color=PART_COLORS[part], edgecolor="white", lw=0.5, hatch="//" if part == "validate" else None)
            ax.barh(y, w, left=left, label=part if y == 0 else None, **style)
            left += w
        if "gpu_us" in r:
            g, label = r["gpu_us"]["graph"]["median"], "GPU time of the graph" if y == 0 else None
            ax.plot([g, g], [y - 0.4, y + 0.4], color="black", lw=1.5, label=label)
    ax.set_yticks(range(len(mine)), [_label(r) for r in mine], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("host µs (medians)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"The replay path, part by part: bs {bs}, context {context} — {_where(env)}", fontsize=9)
    return fig


def draw_host_vs_bs(rows: Sequence[Mapping], env: Mapping, context: int, backend: str = "triton"):
    """Host µs of copies + hook + launch against bs, one line per variant of ``backend``, one panel per mode (faithful vs
    fused vs in-graph metadata)."""
    mine = [r for r in rows if r["backend"] == backend and r["context"] == context]
    modes = list(dict.fromkeys(r["mode"] for r in mine))
    fig = Figure(figsize=(5.0 * max(len(modes), 1), 3.5))
    for k, mode in enumerate(modes):
        ax = fig.add_subplot(1, len(modes), k + 1)
        for variant in dict.fromkeys(r["variant"] for r in mine):
            pts = _by_bs(r for r in mine if r["mode"] == mode and r["variant"] == variant)
            if not pts:
                continue
            color, bs = SHAPE_COLORS.get(variant), [r["bs"] for r in pts]
            for part, ls, what in (("path", "-", "copies+hook+launch"), ("hook", "--", "hook")):
                us = _stat(pts, "host_us", part, "median")
                ax.plot(bs, us, ls=ls, marker="o", ms=3, color=color, label=f"{variant}: {what}")
            lo, hi = (_stat(pts, "host_us", "path", q) for q in ("p10", "p90"))
            ax.fill_between(bs, lo, hi, color=color, alpha=0.15)
        _bs_axis(ax, "host µs (median, p10–p90)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{backend} {mode}", fontsize=9)
        ax.legend(fontsize=6)
    fig.suptitle(f"Host cost of a replay vs batch size, context {context} — {_where(env)}", fontsize=10)
    return fig


def draw_step_graph_vs_eager(rows: Sequence[Mapping], env: Mapping, context: int) -> Figure:
    """The whole decoder step (wall µs, synchronised) as a graph and eagerly, against bs; one panel per mode, one colour
    per backend/variant (solid: graph, dashed: eager)."""
    mine = [r for r in rows if r["context"] == context]
    modes = list(dict.fromkeys(r["mode"] for r in mine))
    fig = Figure(figsize=(5.4 * max(len(modes), 1), 3.8))
    cmap = matplotlib.colormaps["tab20"]
    for k, mode in enumerate(modes):
        ax = fig.add_subplot(1, len(modes), k + 1)
        labels = list(dict.fromkeys(f"{r['backend']}/{r['variant']}" for r in mine if r["mode"] == mode))
        for c, lab in enumerate(labels):
            pts = _by_bs(r for r in mine if r["mode"] == mode and f"{r['backend']}/{r['variant']}" == lab)
            bs, color = [r["bs"] for r in pts], cmap(c % 20)
            ax.plot(bs, _stat(pts, "step_us", "graph", "median"), color=color, marker="o", ms=3, label=lab)
            ax.plot(bs, _stat(pts, "step_us", "eager", "median"), color=color, ls="--")
        _bs_axis(ax, "step µs (solid: graph, dashed: eager)")
        ax.set_yscale("log")
        ax.set_title(mode, fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=6, ncol=2)
    fig.suptitle(f"Graph vs eager, whole decoder step, context {context} — {_where(env)}", fontsize=10)
    return fig


def draw_capture_cost(rows: Sequence[Mapping], env: Mapping, context: int) -> Figure:
    """Capture time per bs (first in process and again, warm) and the static-buffer bytes and graph-pool growth per bs, one
    line per backend/variant/mode."""
    mine = [r for r in rows if r["context"] == context]
    fig = Figure(figsize=(11, 3.8))
    ax_t, ax_m = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    cmap = matplotlib.colormaps["tab20"]
    for c, lab in enumerate(dict.fromkeys(_label(r) for r in mine)):
        pts = _by_bs(r for r in mine if _label(r) == lab)
        bs, color = [r["bs"] for r in pts], cmap(c % 20)
        ax_t.plot(bs, [r["capture_s"]["first"] * 1e3 for r in pts], color=color, marker="o", ms=3, label=lab)
        ax_t.plot(bs, [r["capture_s"]["warm"] * 1e3 for r in pts], color=color, ls="--")
        if pts[0].get("pool_growth_bytes") is not None:
            ax_m.plot(bs, [(r["pool_growth_bytes"] or 0) / 2**20 for r in pts], color=color, marker="o", ms=3, label=lab)
        ax_m.plot(bs, [r["static_bytes"] / 2**20 for r in pts], color=color, ls=":")
    _bs_axis(ax_t, "capture ms (solid: first, dashed: again)")
    ax_t.set_yscale("log")
    _bs_axis(ax_m, "MiB (solid: pool growth, dotted: static buffers)")
    ax_t.legend(fontsize=5, ncol=2)
    fig.suptitle(f"Capture cost per batch size, context {context} — {_where(env)}", fontsize=10)
    return fig


def draw_bench_figures(rows: Sequence[Mapping], env: Mapping, out_dir: str | Path) -> list[Path]:
    """The four bench plots into ``out_dir`` (file names start with ``replay_``)."""
    ctx = min(r["context"] for r in rows)
    sizes = sorted({r["bs"] for r in rows if r["context"] == ctx})
    bs = 8 if 8 in sizes else sizes[len(sizes) // 2]
    figs = {"replay_breakdown.png": draw_replay_breakdown(rows, env, bs, ctx)}
    figs["replay_step_graph_vs_eager.png"] = draw_step_graph_vs_eager(rows, env, ctx)
    figs["replay_capture_cost.png"] = draw_capture_cost(rows, env, ctx)
    if any(r["backend"] == "triton" for r in rows):
        figs["replay_host_vs_bs_triton.png"] = draw_host_vs_bs(rows, env, ctx, "triton")
    return [save(f, Path(out_dir) / name) for name, f in figs.items()]
