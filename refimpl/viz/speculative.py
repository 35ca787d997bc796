"""Speculative decoding drawn: one EAGLE iteration with its graph modes, and the per-step
indices of multi-step draft decode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch, Rectangle

from .buffers import _ancestry, _depths
from .cells import (
    BAD_COLOR,
    CELL_IN,
    DRAFT_COLOR,
    PAD_COLOR,
    TREE_ON_COLOR,
    _cell,
    _fmt,
    _frame,
    _grid_axes,
    _legend,
    _np,
    _req_color,
    _role_handle,
)

# ---------------------------------------------------------------------------------------------
# One EAGLE iteration
# ---------------------------------------------------------------------------------------------
EAGLE_COLORS = {
    "verified": "#d9d9d9",  # the last verified token (the tree's root)
    "step0": "#fdd0a2",  # drafted by the previous draft extend
    "steps": DRAFT_COLOR,  # drafted by the multi-step draft decode graph
    "accepted": "#74c476",
    "rejected": "#f0f0f0",
    "bonus": "#fec44f",  # the target's own next token
}
MODE_BADGE = dict(boxstyle="round,pad=0.25", fc="#f7fbff", ec="#08519c", lw=1.0)


def _tree_layout(parents: Sequence[int], x0, y0, w, h, levels: int) -> dict[int, tuple]:
    """Node q at depth d -> (x, y) inside the box (x0, y0, w, h); depth runs left to right."""
    depths = _depths(parents)
    by_depth: dict[int, list[int]] = {}
    for q, d in enumerate(depths):
        by_depth.setdefault(d, []).append(q)
    dx = (w - 0.6) / max(levels, 1)
    pos = {}
    for d, nodes in by_depth.items():
        for r, q in enumerate(nodes):
            pos[q] = (x0 + 0.3 + d * dx, y0 + h * (r + 1) / (len(nodes) + 1))
    return pos


def _draw_tree(ax, parents, pos, colors: Mapping[int, str], *, dim: Sequence[int] = (),
               edge_colors: Mapping[int, str] | None = None) -> None:  # fmt: skip
    from matplotlib.patches import Circle

    for q, par in enumerate(parents):
        if par >= 0:
            (xa, ya), (xb, yb) = pos[par], pos[q]
            c = (edge_colors or {}).get(q, "#636363")
            ax.plot([xa, xb], [ya, yb], color=c, lw=1.6 if c != "#636363" else 0.9, zorder=1)
    for q, (x, y) in pos.items():
        ax.add_patch(Circle((x, y), 0.19, facecolor=colors[q], edgecolor="#525252", lw=0.8, zorder=2))
        ax.text(x, y, str(q), ha="center", va="center", fontsize=7, zorder=3, color="#969696" if q in dim else "black")


def draw_eagle_iteration(
    parents: Sequence[int], accepted: Sequence[int], num_steps: int, topk: int, *, title: str = ""
) -> Figure:
    """One EAGLE speculative-decoding iteration for one request, left to right: ① draft (the
    multi-step draft decode), ② target verify over the tree, ③ accept, ④ draft extend (v1 and
    v2), each with the graph mode it is captured under and its query rows per request; a band
    at the bottom for IDLE (a data-parallel rank with no requests).

    ``parents``: the draft tree of N = ``len(parents)`` nodes, node 0 the last verified token
    (``DraftTree.parents``); ``accepted``: the draft nodes accepted, a chain from a child of
    node 0 down (``accept_length = len(accepted)``, 0..S); ``num_steps`` S, ``topk`` branches.

    Axes: 1. Texts with gid ``"mode"``: the graph-mode badges (DECODE, TARGET_VERIFY,
    DRAFT_EXTEND, DRAFT_EXTEND_V2, IDLE).
    """
    N, S, acc = len(parents), int(num_steps), list(accepted)
    depths = _depths(parents)
    if not parents or parents[0] != -1 or any(not 0 <= parents[q] < q for q in range(1, N)):
        raise ValueError(f"draw_eagle_iteration: parents {list(parents)} are not a tree rooted at 0")
    if max(depths) > S:
        raise ValueError(f"draw_eagle_iteration: tree depth {max(depths)} > num_steps={S}")
    chain = [0, *acc]
    if len(acc) > S or any(parents[b] != a for a, b in zip(chain, chain[1:])):
        raise ValueError(f"draw_eagle_iteration: accepted {acc} is not a chain from the root "
                         f"of length <= num_steps={S}")  # fmt: skip
    W, H = 17.7, 7.6
    fig = Figure(figsize=(W, H + 0.5), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    ax.set_xlim(0, W)
    ax.set_ylim(0, H)
    ax.set_aspect("equal")
    ax.axis("off")
    xs = [0.15 + k * (_BOX_W + 0.55) for k in range(4)]
    _draft_panel(ax, xs[0], parents, depths, S, topk)
    _verify_panel(ax, xs[1], parents)
    _accept_panel(ax, xs[2], parents, acc, S)
    _extend_panel(ax, xs[3], acc, S, N)
    _arrows_and_idle(ax, xs, W)
    handles = [Patch(facecolor=EAGLE_COLORS[k], edgecolor="#525252", label=lab) for k, lab in (
        ("verified", "last verified token (tree root)"),
        ("step0", "draft from step 0 (previous draft extend)"),
        ("steps", f"draft from steps 1..{S - 1} (draft decode graph)"),
        ("accepted", "accepted draft"), ("bonus", "bonus token (b)"),
        ("rejected", "rejected draft / padding row (–)"))]  # fmt: skip
    handles.append(Patch(facecolor=TREE_ON_COLOR, edgecolor="#bdbdbd", label="mask: may attend"))
    _legend(fig, handles, ncols=4)
    fig.suptitle(title or f"One EAGLE iteration for one request: S = {S} steps, topk = {topk}, "
                 f"N = {N} draft tokens, accept_length = {len(acc)}", fontsize=11)  # fmt: skip
    return fig


_BOX_W, _BOX_Y, _BOX_H = 3.9, 1.35, 6.1  # one step's box: width, bottom, height


def _step_box(ax, x, head: str, modes: Sequence[str], rows: str, caption: str) -> None:
    """A step's box: its name, its graph-mode badges (gid ``"mode"``), rows per request, caption."""
    y0, bw, bh = _BOX_Y, _BOX_W, _BOX_H
    ax.add_patch(FancyBboxPatch((x, y0), bw, bh, boxstyle="round,pad=0.02,rounding_size=0.15",
                                fc="white", ec="#525252", lw=1.0))  # fmt: skip
    ax.text(x + 0.15, y0 + bh - 0.3, head, fontsize=10, fontweight="bold", va="center")
    for j, m in enumerate(modes):
        t = ax.text(x + 0.2, y0 + bh - 0.78 - 0.42 * j, m, fontsize=7.5, family="monospace",
                    va="center", bbox=MODE_BADGE)  # fmt: skip
        t.set_gid("mode")
    ax.text(x + 0.15, y0 + bh - 0.9 - 0.42 * len(modes), rows, fontsize=7.5, va="top")
    ax.text(x + 0.15, y0 + 0.12, caption, fontsize=7, va="bottom", color="#252525", linespacing=1.3)


def _draft_panel(ax, x, parents, depths, S: int, topk: int) -> None:
    """① draft: the tree the multi-step draft decode grows, node colours by the step that drafted it."""
    N, y0, bw = len(parents), _BOX_Y, _BOX_W
    _step_box(ax, x, "① draft", ["DECODE (multi-step draft)"],
              f"topk = {topk} rows per request per step\n(the graph sees bs·topk rows)",
              f"step 0's {topk} drafts come from the previous\ndraft extend; steps 1..{S - 1} run as "
              f"{S - 1} decode\nsteps captured in one graph. The best\n{N - 1} drafts + the verified "
              f"token\nform the tree of N = {N} nodes.")  # fmt: skip
    pos = _tree_layout(parents, x, y0 + 1.55, bw, 2.6, S)
    cols = {q: EAGLE_COLORS["verified"] if q == 0 else EAGLE_COLORS["step0"] if depths[q] == 1
            else EAGLE_COLORS["steps"] for q in range(N)}  # fmt: skip
    _draw_tree(ax, parents, pos, cols)
    for d in range(S + 1):
        ax.text(x + 0.3 + d * (bw - 0.6) / S, y0 + 1.45, "verified" if d == 0 else f"step {d - 1}", fontsize=6.5,
                ha="center", va="top", color="#525252")  # fmt: skip


def _verify_panel(ax, x, parents) -> None:
    """② target verify: the tree's ancestry mask after a few prefix columns."""
    N = len(parents)
    _step_box(ax, x, "② target verify", ["TARGET_VERIFY"], f"N = {N} rows per request (one per tree node)",
              "The target model scores every node in one\npass; the custom mask [N, prefix + N] lets "
              "a\nnode see the prefix and its own ancestors.\nGraphs capture N rows per request.")  # fmt: skip
    anc = _ancestry(parents)
    c = min(0.34, (_BOX_W - 1.0) / (N + 2.5))
    mx, my = x + 0.75, _BOX_Y + 1.55 + 2.45
    for q in range(N):
        ax.text(mx - 0.12, my - q * c, str(q), fontsize=6, ha="right", va="center")
        for j in range(2):
            ax.add_patch(Rectangle((mx + j * c, my - q * c - c / 2), c, c, fc="#c6dbef", ec="white", lw=0.5))
        for k in range(N):
            ax.add_patch(Rectangle((mx + (k + 2.5) * c, my - q * c - c / 2), c, c,
                                   fc=TREE_ON_COLOR if anc[q, k] else "white", ec="#bdbdbd", lw=0.5))  # fmt: skip
    ax.text(mx + c, my + c, "prefix", fontsize=6, ha="center", va="bottom")
    ax.text(mx + (2.5 + N / 2) * c, my + c, "tree (ancestry)", fontsize=6, ha="center", va="bottom")
    ax.text(mx + 2.25 * c, my - 0.5 * c, "…", fontsize=7, ha="center", va="center")


def _accept_panel(ax, x, parents, acc: list[int], S: int) -> None:
    """③ accept: the accepted chain, the rejected drafts dimmed, the bonus token after the chain."""
    from matplotlib.patches import Circle

    N, chain = len(parents), [0, *acc]
    _step_box(ax, x, "③ accept", ["no graph of its own"], "runs on the verify logits",
              f"accept_length = {len(acc)}: the drafts accepted along\none chain (refimpl counts "
              f"accepted drafts,\n0..S). The target's own token after them\nis the bonus token: "
              f"{len(acc) + 1} new tokens.")  # fmt: skip
    pos = _tree_layout(parents, x, _BOX_Y + 1.55, _BOX_W - 0.5, 2.6, S)
    on_chain = set(chain)
    cols = {q: EAGLE_COLORS["verified"] if q == 0 else EAGLE_COLORS["accepted"] if q in on_chain
            else EAGLE_COLORS["rejected"] for q in range(N)}  # fmt: skip
    _draw_tree(ax, parents, pos, cols, dim=[q for q in range(N) if q not in on_chain],
               edge_colors={q: "#238b45" for q in acc})  # fmt: skip
    lx, ly = pos[chain[-1]]
    bx = lx + (_BOX_W - 1.1) / S
    ax.plot([lx, bx], [ly, ly], color="#cc8400", ls="--", lw=1.2, zorder=1)
    ax.add_patch(Circle((bx, ly), 0.19, fc=EAGLE_COLORS["bonus"], ec="#525252", lw=0.8, zorder=2))
    ax.text(bx, ly, "b", ha="center", va="center", fontsize=7, zorder=3)


def _extend_panel(ax, x, acc: list[int], S: int, N: int) -> None:
    """④ draft extend: the rows v1 (S + 1) and v2 (N) lay out per request."""
    _step_box(ax, x, "④ draft extend", ["DRAFT_EXTEND (v1)", "DRAFT_EXTEND_V2"],
              f"v1: S + 1 = {S + 1} rows per request\nv2: N = {N} rows per request",
              "The draft model runs over the new tokens\n(graph rows past them: rejected drafts,\n"
              "outputs dropped). Its output gives the next\niteration's step-0 drafts (back to ①).")  # fmt: skip
    real = [f"n{q}" for q in acc] + ["b"]
    cw = min(0.45, (_BOX_W - 0.9) / max(N, S + 1))
    for j, (lab, n) in enumerate((("v1", S + 1), ("v2", N))):
        yy = _BOX_Y + 3.55 - j * 1.0
        ax.text(x + 0.2, yy, lab, fontsize=7.5, va="center")
        for r in range(n):
            kind = ("accepted" if r < len(acc) else "bonus") if r < len(real) else "rejected"
            ax.add_patch(
                Rectangle((x + 0.6 + r * cw, yy - cw / 2), cw, cw, fc=EAGLE_COLORS[kind], ec="#525252", lw=0.6)
            )
            ax.text(x + 0.6 + (r + 0.5) * cw, yy, real[r] if r < len(real) else "–", ha="center", va="center",
                    fontsize=6.5)  # fmt: skip


def _arrows_and_idle(ax, xs: list[float], W: float) -> None:
    """Arrows between the steps and back to ①; the IDLE band under them."""
    y0, bw, bh = _BOX_Y, _BOX_W, _BOX_H
    for k in range(3):
        ax.add_patch(FancyArrowPatch((xs[k] + bw + 0.05, y0 + bh / 2), (xs[k + 1] - 0.05, y0 + bh / 2),
                                     arrowstyle="-|>", mutation_scale=14, color="#252525", lw=1.3))  # fmt: skip
    yb = y0 - 0.32  # back to ①, under the boxes
    ax.plot([xs[3] + bw / 2, xs[3] + bw / 2, xs[0] + bw / 2], [y0 - 0.02, yb, yb], color="#525252", lw=1.1, ls="--")
    ax.add_patch(FancyArrowPatch((xs[0] + bw / 2, yb), (xs[0] + bw / 2, y0 - 0.02),
                                 arrowstyle="-|>", mutation_scale=14, color="#525252", lw=1.1))  # fmt: skip
    ax.text(W / 2, yb + 0.05, "next iteration: draft extend's output seeds step 0 of the next draft",
            fontsize=7, ha="center", va="bottom", color="#525252")  # fmt: skip
    ax.add_patch(FancyBboxPatch((0.15, 0.08), W - 0.3, 0.62, boxstyle="round,pad=0.02,rounding_size=0.12",
                                fc="#fafafa", ec="#969696", lw=0.8))  # fmt: skip
    t = ax.text(0.35, 0.39, "IDLE", fontsize=7.5, family="monospace", va="center", bbox=MODE_BADGE)
    t.set_gid("mode")
    ax.text(1.2, 0.39, "a data-parallel rank with no requests still runs every step above "
            "(bs 0), so that the collectives of all ranks line up; under graphs it replays the "
            "smallest captured graph with every row padded.", fontsize=7.5, va="center")  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Multi-step draft decode: per-step kv rows
# ---------------------------------------------------------------------------------------------
def draw_draft_decode_indices(
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    *,
    used_steps: int | None = None,
    live_seqs: int | None = None,
    title: str = "",
    legend: bool = True,
) -> Figure:
    """Per step, each (seq, branch) row of the draft-decode CSR: prefix vs draft slots.

    ``kv_indptr`` ``[S, >= rows+1]`` (the wrapper's ``[S, pool*topk+1]`` buffer is sliced),
    ``kv_indices`` ``[S, W]``, ``seq_lens`` ``[num_seqs]``, ``rows = num_seqs * topk`` ordered
    ``[seq][branch]``. Row (r, k) of step i holds ``seq_lens[r]`` prefix slots (the sequence's
    colour) then ``i + 1`` draft slots (red); the draft area has ``num_steps`` columns, unused
    ones hatched. Labels give the row's ``kv_indptr`` range. Rows whose length disagrees with
    ``seq_lens[r] + i + 1`` get a red frame. ``used_steps``: steps at or past it are marked as
    filled but not read (EAGLE runs S-1 decode steps); ``live_seqs``: later sequences are
    labelled as padding. ``legend``: a legend of the colours.

    Axes: ``num_steps``. Texts: one per drawn kv_indices entry.
    """
    seq = _np(seq_lens).reshape(-1)  # [num_seqs]
    num_seqs = seq.shape[0]
    rows = num_seqs * topk
    indptr = _np(kv_indptr)[:num_steps, : rows + 1]  # [S, rows+1]
    idx = _np(kv_indices)[:num_steps]  # [S, W]
    if indptr.shape != (num_steps, rows + 1):
        raise ValueError(
            f"draw_draft_decode_indices: kv_indptr needs [{num_steps}, >= {rows + 1}] for "
            f"{num_seqs} seqs x topk {topk}, got {tuple(_np(kv_indptr).shape)}"
        )
    pmax = int(seq.max(initial=1))
    width = pmax + 1 + num_steps  # prefix area | gap | draft area
    fig = Figure(figsize=(width * CELL_IN + 2.2, num_steps * (rows * CELL_IN + 0.7) + 0.6), layout="constrained")
    axes = [fig.add_subplot(num_steps, 1, i + 1) for i in range(num_steps)]
    for i, ax in enumerate(axes):
        _grid_axes(ax, width, rows)
        labels, bad = [], 0
        for row in range(rows):
            r, k = divmod(row, topk)
            a, b = int(indptr[i, row]), int(indptr[i, row + 1])
            pad = live_seqs is not None and r >= live_seqs
            pre_color = PAD_COLOR if pad else _req_color(r)
            n_pre = int(seq[r])
            vals = idx[i, a:b]
            for j in range(n_pre):
                if j < vals.shape[0]:
                    _cell(ax, j, row, pre_color, _fmt(vals[j]), fontsize=5.5)
            for j in range(num_steps):
                x = pmax + 1 + j
                if j <= i and n_pre + j < vals.shape[0]:
                    _cell(ax, x, row, DRAFT_COLOR, _fmt(vals[n_pre + j]), fontsize=5.5)
                else:
                    _cell(ax, x, row, "white", hatch="////", edge="#d9d9d9")
            if b - a != n_pre + i + 1:
                bad += 1
                _frame(ax, 0, row, width, 1, BAD_COLOR, lw=1.5)
            who = f"pad {r}" if pad else f"seq {r}"
            labels.append(f"{who} br {k}  [{a}:{b}]")
            if k == topk - 1 and row < rows - 1:
                ax.axhline(row + 0.5, color="black", lw=0.8)
        ax.set_yticks(range(rows), labels, fontsize=7)
        ax.set_xticks(
            [pmax / 2 - 0.5, pmax + 1 + (num_steps - 1) / 2],
            [f"prefix slots (seq_lens, up to {pmax})", "draft slots"],
            fontsize=7,
        )
        unused = used_steps is not None and i >= used_steps
        note = "  (filled, but no step backend reads it)" if unused else ""
        warn = f"  {bad} rows have the wrong length!" if bad else ""
        ax.set_title(
            f"step {i}: rows of prefix + {i + 1} draft slot(s), kv_indptr[{i}] = {indptr[i].tolist()}{note}{warn}",
            fontsize=7.5,
        )
    if title:
        fig.suptitle(title, fontsize=10)
    if legend:
        live = num_seqs if live_seqs is None else min(live_seqs, num_seqs)
        handles = [_role_handle(r, f"seq {r}: prefix slots") for r in range(live)]
        if live < num_seqs:
            handles.append(_role_handle("pad", "padded seq: prefix slot 0"))
        handles += [Patch(facecolor=DRAFT_COLOR, edgecolor="white", label="draft slots (branch k)"),
                    Patch(facecolor="white", hatch="////", edgecolor="#d9d9d9",
                          label="draft slot not yet written")]  # fmt: skip
        _legend(fig, handles, ncols=min(len(handles), 5))
    return fig
