"""Figure builders for the notebooks: the graph buffers of the attention backends, drawn.

Every builder takes plain tensors (any device; they are copied to the host), returns a
``matplotlib.figure.Figure`` built without ``pyplot`` (nothing is shown, nothing leaks into a
pyplot figure manager) and is deterministic: the same inputs give the same picture.

- ``draw_csr``: a batch's ``req_to_token`` rows above the packed ``kv_indices`` strip that a
  CSR builder ([facts#csr-kv-index-builder]) makes from them, with the ``kv_indptr`` boundaries.
- ``draw_tree_mask``: one request's target-verify custom-mask block ``[N, seq + N]`` and,
  given the parents, its draft tree.
- ``draw_block_table``: a paged block table against ``req_to_token``, page by page.
- ``draw_buffers``: 1-D buffers as rows of annotated cells, scalars as text.
- ``draw_draft_decode_indices``: the per-step ``kv_indptr`` / ``kv_indices`` rows of multi-step
  draft decode ([facts#multi-step-draft-decode-indices]), prefix and draft slots colour-coded.
- ``draw_latency_vs_bs``: measured medians and spread against batch size, one line per shape.
- ``draw_state_diff``: two states of the same buffers (capture path vs replay path, or a bound
  buffer vs what the batch needs), every differing cell framed and hatched red.
- ``draw_buffer_sizes``: allocated sizes of the same buffers in several backends, against what a
  batch needs.
- ``draw_eagle_iteration``: one EAGLE iteration (draft, verify, accept, draft extend) with the
  graph mode and the rows per request of each step.
- ``batch_roles`` / ``segment_roles``: the colour role of every cell of a per-request buffer /
  a packed buffer (for ``draw_buffers(roles=...)``).
- ``save``: write a figure reproducibly (no software tag in the PNG).

Cell colours carry a meaning, and every grid figure has a legend that says which (``ROLE_LABELS``):
live request i gets a light colour of its own (blue, green, purple, ...), padded rows (request
slot 0, the reserved row) orange, cells past the live part (never read) light grey, stale values
(left by an earlier batch or the capture) grey and cross-hatched, other values (an indptr's
end) white, as in notebook 00's padding figure. A value that contradicts what the builder can
recompute (a ``kv_indices`` entry that is not the ``req_to_token`` prefix, a mask that is not the
tree's ancestry) or that differs between two states gets a red frame and the title says how many.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch, Rectangle

from . import layout

__all__ = [
    "batch_roles",
    "draw_block_table",
    "draw_buffer_sizes",
    "draw_buffers",
    "draw_csr",
    "draw_draft_decode_indices",
    "draw_eagle_iteration",
    "draw_state_diff",
    "draw_bench_figures",
    "draw_capture_cost",
    "draw_host_vs_bs",
    "draw_latency_vs_bs",
    "draw_replay_breakdown",
    "draw_step_graph_vs_eager",
    "draw_tree_mask",
    "save",
    "segment_roles",
]

# live requests (light), the padded row, unused cells, draft slots, mismatches
REQ_COLORS = ["#9ecae1", "#a1d99b", "#cbc9e2", "#fbb4c4", "#99d8c9", "#fee391", "#d9d9d9"]
PAD_COLOR = "#ffba73"
UNUSED_COLOR = "#f0f0f0"
DRAFT_COLOR = "#fc9272"
TREE_ON_COLOR = "#3182bd"
BAD_COLOR = "#d62728"
INDPTR_COLOR = "#a50f15"
STALE_COLOR = "#bdbdbd"  # cross-hatched: a value some reader would see, left by an older batch
VALUE_COLOR = "#ffffff"  # a value with no per-request meaning (an indptr's end, a count)
DIFF_HATCH_COLOR = "#f4a582"  # the hatch over a cell that differs (its frame: BAD_COLOR)

CELL_IN = 0.3  # inches per cell in the grid figures

# what a cell's colour means: role -> legend text (an int role i: "live request i")
ROLE_LABELS = {
    "pad": "padded row (request slot 0, seq_len 1)",
    "value": "other value (e.g. an indptr's end)",
    "stale": "stale: left by an earlier batch / the capture",
    "unread": "past the live part: not read",
}


def _np(x: torch.Tensor | Sequence | np.ndarray) -> np.ndarray:
    """Host numpy copy of a tensor / list (bool and integer dtypes kept, int widened)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dtype == torch.bool:
            return x.numpy()
        if x.is_floating_point():
            return x.to(torch.float64).numpy()
        return x.to(torch.int64).numpy()
    return np.asarray(x)


def _req_color(i: int) -> str:
    return REQ_COLORS[i % len(REQ_COLORS)]


# ---------------------------------------------------------------------------------------------
# Colour roles and legends
# ---------------------------------------------------------------------------------------------
def _role_style(role) -> tuple[str, str | None, str, str]:
    """(face colour, hatch, edge colour, text colour) of a cell role: an int (live request i),
    ``"pad"``, ``"value"``, ``"stale"``, ``"unread"``."""
    if isinstance(role, (int, np.integer)) and not isinstance(role, bool):
        return _req_color(int(role)), None, "white", "black"
    if role == "pad":
        return PAD_COLOR, None, "white", "black"
    if role == "value":
        return VALUE_COLOR, None, "#bdbdbd", "black"
    if role == "stale":
        return STALE_COLOR, "xx", "white", "black"
    if role == "unread":
        return UNUSED_COLOR, None, "white", "#969696"
    raise ValueError(f"unknown cell role {role!r}: an int (live request), {sorted(ROLE_LABELS)}")


def _role_handle(role, label: str | None = None) -> Patch:
    face, hatch, edge, _ = _role_style(role)
    if label is None:
        label = f"live request {int(role)}" if not isinstance(role, str) else ROLE_LABELS[role]
    return Patch(facecolor=face, hatch=hatch, edgecolor="#969696" if edge == "white" else edge,
                 lw=0.6, label=label)  # fmt: skip


def _differs_handle(label: str) -> Patch:
    return Patch(facecolor="none", edgecolor=BAD_COLOR, hatch="//", hatchcolor=DIFF_HATCH_COLOR,
                 lw=1.5, label=label)  # fmt: skip


def _role_order(roles) -> list:
    ints = sorted({int(r) for r in roles if not isinstance(r, str)})
    return ints + [r for r in ("pad", "value", "stale", "unread") if r in set(roles)]


def _legend(fig: Figure, handles: list, ncols: int | None = None) -> None:
    """One legend under the axes (the figure must use the constrained layout)."""
    if not handles:
        return
    ncols = ncols or min(len(handles), 4)
    leg = fig.legend(handles=handles, loc="outside lower center", ncols=ncols, fontsize=7,
                     frameon=False, handlelength=1.6, columnspacing=1.4)  # fmt: skip
    leg.set_gid("legend")


def batch_roles(n: int, live: int, bs: int | None = None, *, indptr: bool = False) -> list:
    """Colour roles of the first ``n`` entries of a per-request buffer (``seq_lens``,
    ``num_kv_splits``, ``kv_len_arr``): entry i is live request i for ``i < live``, a padded row
    for ``live <= i < bs`` (``bs`` defaults to ``live``), past ``bs`` unread. ``indptr=True``
    (``kv_indptr``, ``qo_indptr``, ``[bs+1]``): entry i < bs is where request i starts, entry
    ``bs`` (the total) is a plain value, entries past it unread."""
    bs = live if bs is None else bs
    if not 0 <= live <= bs:
        raise ValueError(f"batch_roles: need 0 <= live={live} <= bs={bs}")
    out: list = []
    for i in range(n):
        if i < live:
            out.append(i)
        elif i < bs:
            out.append("pad")
        elif indptr and i == bs:
            out.append("value")
        else:
            out.append("unread")
    return out


def segment_roles(indptr: torch.Tensor | Sequence[int], live: int, n: int) -> list:
    """Colour roles of the first ``n`` entries of a packed buffer (``kv_indices``, a flat mask,
    query rows): entry p belongs to the request i with ``indptr[i] <= p < indptr[i+1]`` (a
    padded row for ``i >= live``); entries at or past ``indptr[-1]`` are unread."""
    ptr = _np(indptr).reshape(-1).astype(np.int64)
    owner = np.searchsorted(ptr, np.arange(n), side="right") - 1
    end = int(ptr[-1]) if ptr.size else 0
    return [("unread" if p >= end else int(owner[p]) if owner[p] < live else "pad")
            for p in range(n)]  # fmt: skip


def _cell(ax, x, y, color, text=None, *, fontsize=6.0, edge="white", lw=0.6, hatch=None):
    """One unit cell centred on (x, y), optionally with a centred text."""
    ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=color, edgecolor=edge, lw=lw, hatch=hatch))
    if text is not None:
        ax.text(x, y, text, ha="center", va="center", fontsize=fontsize)


def _frame(ax, x0, y0, w, h, color, lw=1.8):
    """An unfilled rectangle around cells x0..x0+w-1, y0..y0+h-1."""
    ax.add_patch(Rectangle((x0 - 0.5, y0 - 0.5), w, h, fill=False, edgecolor=color, lw=lw, zorder=3))


def _grid_axes(ax, width: int, height: int) -> None:
    ax.set_xlim(-0.5, width - 0.5)
    ax.set_ylim(height - 0.5, -0.5)  # row 0 on top
    ax.set_aspect("equal")
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    ax.tick_params(length=0)


def _fmt(v) -> str:
    if isinstance(v, (bool, np.bool_)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return f"{v:.3g}"
    return str(int(v))


# ---------------------------------------------------------------------------------------------
# CSR: req_to_token rows -> kv_indptr / kv_indices
# ---------------------------------------------------------------------------------------------
def draw_csr(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens_or_kv_lens: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    *,
    title: str = "",
    legend: bool = True,
) -> Figure:
    """Top: the batch's ``req_to_token`` rows; bottom: the packed ``kv_indices`` strip.

    ``req_to_token`` ``[pool, L]``, ``req_pool_indices`` ``[bs]``, ``seq_lens_or_kv_lens`` ``[bs]``
    (the lengths the CSR was built from: ``seq_lens`` in decode and verify, ``seq_lens - rows``
    in draft extend), ``kv_indptr`` ``[bs+1]``, ``kv_indices`` ``[>= kv_indptr[-1]]`` (a graph
    buffer may be longer; only the used prefix is drawn). The used prefix of every row is framed
    in its request's colour; the strip uses the same colours, so it reads as the concatenation
    of the framed prefixes. Strip cells that differ from ``req_to_token`` get a red frame.
    ``legend``: a legend of the colours (live requests, padded row, not packed, boundaries).

    Axes: 2 (rows, strip). Texts in the strip axes: one per ``kv_indices`` cell plus one
    ``kv_indptr`` label per distinct boundary (gid ``"kv_indptr"``; an empty request, e.g. a
    padded draft-extend row with no prefix, repeats its boundary).
    """
    r2t = _np(req_to_token)  # [pool, L]
    rpi = _np(req_pool_indices).reshape(-1)  # [bs]
    lens = _np(seq_lens_or_kv_lens).reshape(-1)  # [bs]
    indptr = _np(kv_indptr).reshape(-1)  # [bs+1]
    idx = _np(kv_indices).reshape(-1)  # [>= total]
    bs, L = rpi.shape[0], r2t.shape[1]
    if lens.shape[0] != bs or indptr.shape[0] != bs + 1:
        raise ValueError(
            f"draw_csr: {bs} requests need {bs} lengths and {bs + 1} kv_indptr entries, "
            f"got {lens.shape[0]} and {indptr.shape[0]}"
        )
    total = int(indptr[-1])
    if idx.shape[0] < total:
        raise ValueError(f"draw_csr: kv_indices has {idx.shape[0]} entries < kv_indptr[-1]={total}")
    rows = r2t[rpi]  # [bs, L]
    nz = np.nonzero(rows.any(0))[0]
    ncols = int(min(L, max(int(lens.max(initial=1)), int(nz[-1]) + 1 if nz.size else 1)))
    expected = np.concatenate([rows[i, : lens[i]] for i in range(bs)] + [np.zeros(0, np.int64)])
    wrap = max(ncols, 8)  # strip cells per line: the same cell size as the rows above
    lines = max(1, -(-total // wrap))

    fig = Figure(figsize=(wrap * CELL_IN + 1.8, (bs + 2 * lines) * CELL_IN + 1.4), layout="constrained")
    gs = fig.add_gridspec(2, 1, height_ratios=[bs + 0.6, 2 * lines + 0.4])
    top, bot = fig.add_subplot(gs[0]), fig.add_subplot(gs[1])

    # --- top: request rows ------------------------------------------------------------------
    _grid_axes(top, wrap, bs)
    labels = []
    for i in range(bs):
        pad = int(rpi[i]) == 0
        color = PAD_COLOR if pad else _req_color(i)
        for j in range(ncols):
            used = j < lens[i]
            _cell(top, j, i, color if used else UNUSED_COLOR, _fmt(rows[i, j]), fontsize=5.5)
            if not used:
                top.texts[-1].set_color("#969696")
        if lens[i] > 0:
            _frame(top, 0, i, int(lens[i]), 1, "#e6550d" if pad else "#08519c")
        labels.append(f"{'pad' if pad else f'req {i}'}: row {int(rpi[i])}, len {int(lens[i])}")
    top.set_yticks(range(bs), labels, fontsize=7)
    top.set_xticks(range(0, ncols, 5), [str(j) for j in range(0, ncols, 5)], fontsize=6)
    top.xaxis.tick_top()
    top.set_title("req_to_token[req_pool_indices]  (framed: the prefix the CSR packs)", fontsize=8)

    # --- bottom: kv_indices strip, wrapped ---------------------------------------------------
    _grid_axes(bot, wrap, 2 * lines)
    owner = np.searchsorted(indptr, np.arange(total), side="right") - 1  # [total] request
    bad = 0
    for p in range(total):
        x, y = p % wrap, 2 * (p // wrap) + 1
        i = int(owner[p])
        color = PAD_COLOR if int(rpi[i]) == 0 else _req_color(i)
        _cell(bot, x, y, color, _fmt(idx[p]), fontsize=5.5)
        if p >= expected.shape[0] or idx[p] != expected[p]:
            bad += 1
            _frame(bot, x, y, 1, 1, BAD_COLOR, lw=1.5)
    for p in sorted(set(indptr.tolist())):  # an empty request repeats a boundary: draw it once
        line = min(p // wrap, lines - 1) if p < total or p % wrap else max(p // wrap - 1, 0)
        x = p - line * wrap - 0.5
        y = 2 * line + 1
        bot.plot([x, x], [y - 0.75, y + 0.5], color=INDPTR_COLOR, lw=1.4)
        t = bot.text(x, y - 0.8, str(p), ha="center", va="bottom", fontsize=6,
                     color=INDPTR_COLOR)  # fmt: skip
        t.set_gid("kv_indptr")
    bot.set_yticks(
        [2 * k + 1 for k in range(lines)],
        [f"kv_indices[{k * wrap}:{min((k + 1) * wrap, total)}]" for k in range(lines)],
        fontsize=7,
    )
    bot.set_xticks([])
    note = f"; {bad} entries differ from req_to_token!" if bad or total != expected.size else ""
    bot.set_title(f"kv_indices (packed; red marks: kv_indptr = {indptr.tolist()}){note}", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    if legend:
        live = [i for i in range(bs) if int(rpi[i]) != 0]
        handles = [_role_handle(i, f"request {i}") for i in live]
        if len(live) < bs:
            handles.append(_role_handle("pad"))
        handles.append(_role_handle("unread", "in req_to_token, not packed (past the length)"))
        handles.append(Line2D([], [], color=INDPTR_COLOR, lw=1.4, label="kv_indptr boundary"))
        if bad:
            handles.append(_differs_handle("differs from req_to_token"))
        _legend(fig, handles, ncols=min(len(handles), 6))
    return fig


# ---------------------------------------------------------------------------------------------
# Paged block tables (Cutlass-MLA, TRTLLM-MLA)
# ---------------------------------------------------------------------------------------------
def draw_block_table(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    lens: torch.Tensor,
    block_table: torch.Tensor,
    page_size: int,
    *,
    max_pages: int = 16,
    title: str = "",
) -> Figure:
    """Per request two rows of cells, one per page p: what the page *should* hold,
    ``req_to_token[rpi[i], p * P] // P`` (the first slot of the page over the page size), and
    what ``block_table[i, p]`` holds. Pages at or past ``cdiv(lens[i], P)`` are never read by the
    kernel: grey, with whatever the table keeps there (1 or -1 by convention). A read entry that
    disagrees gets a red frame and the title counts them. At most ``max_pages`` columns.
    """
    r2t, rpi = _np(req_to_token), _np(req_pool_indices).reshape(-1)
    lens, table = _np(lens).reshape(-1), _np(block_table)
    bs, P = rpi.shape[0], int(page_size)
    pages = min(table.shape[1], max_pages)
    fig = Figure(figsize=(pages * CELL_IN * 1.6 + 2.6, 2 * bs * CELL_IN + 1.2), layout="constrained")
    ax = fig.add_subplot()
    _grid_axes(ax, pages, 2 * bs)
    bad, labels = 0, []
    for i in range(bs):
        read = -(-int(lens[i]) // P)
        pad = int(rpi[i]) == 0
        color = PAD_COLOR if pad else _req_color(i)
        for p in range(pages):
            live = p < read
            col = min(p * P, r2t.shape[1] - 1)
            want = int(r2t[rpi[i], col]) // P
            _cell(ax, p, 2 * i, color if live else UNUSED_COLOR, str(want) if live else "")
            _cell(ax, p, 2 * i + 1, color if live else UNUSED_COLOR, _fmt(table[i, p]))
            if live and int(table[i, p]) != want:
                bad += 1
                _frame(ax, p, 2 * i + 1, 1, 1, BAD_COLOR, lw=1.5)
        who = "pad" if pad else f"req {i}"
        labels += [f"{who}: r2t[row {int(rpi[i])}, p*{P}] // {P}", f"block_table[{i}], len {int(lens[i])}"]
    ax.set_yticks(range(2 * bs), labels, fontsize=7)
    ax.set_xticks(range(pages), [f"p{p}" for p in range(pages)], fontsize=6)
    ax.xaxis.tick_top()
    more = f" (first {pages} of {table.shape[1]} pages)" if table.shape[1] > pages else ""
    warn = f"; {bad} read entries differ!" if bad else ""
    ax.set_title(f"page size {P}: grey = never read by the kernel{more}{warn}", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


# ---------------------------------------------------------------------------------------------
# Target verify: one request's custom mask block, and its tree
# ---------------------------------------------------------------------------------------------
def _mask_indptr(t: np.ndarray, N: int) -> np.ndarray:
    """Read ``t`` as mask_indptr (starts at 0, steps of N*(seq+N)) or else as seq_lens."""
    steps = np.diff(t)
    if t.size >= 2 and t[0] == 0 and (steps % N == 0).all() and (steps // N >= N).all():
        return t
    return np.concatenate([[0], np.cumsum(layout.tree_mask_sizes(t.tolist(), N))])


def _ancestry(parents: Sequence[int]) -> np.ndarray:
    n = len(parents)
    anc = np.eye(n, dtype=bool)  # [N, N]
    for q in range(1, n):
        anc[q] |= anc[parents[q]]
    return anc


def _depths(parents: Sequence[int]) -> list[int]:
    d = [0] * len(parents)
    for q in range(1, len(parents)):
        d[q] = d[parents[q]] + 1
    return d


def draw_tree_mask(
    custom_mask: torch.Tensor,
    mask_indptr_or_seq_lens: torch.Tensor,
    N: int,
    request: int = 0,
    *,
    parents: Sequence[int] | None = None,
    legend: bool = True,
    title: str = "",
) -> Figure:
    """Request ``request``'s ``[N, seq + N]`` block of a flat target-verify ``custom_mask``.

    ``custom_mask`` ``[>= mask_indptr[-1]]`` bool / uint8 (the graph buffer may be longer);
    ``mask_indptr_or_seq_lens``: ``mask_indptr`` ``[bs+1]`` (recognised by a leading 0 and steps
    that are multiples of N) or the prefix ``seq_lens`` ``[bs]``. Prefix columns (all 1) are
    light blue, the tree part dark where 1; its cells carry their 0/1. With ``parents`` the tree
    is drawn on the right (node q at depth(q)), rows are labelled by depth, and tree cells that
    disagree with the ancestry of ``parents`` get a red frame. ``legend``: a legend of the
    colours; ``title``: a figure title above the panels.

    Axes: 1, or 2 with ``parents``. Texts: N*N in the mask axes, N node labels in the tree axes.
    """
    mask = _np(custom_mask).reshape(-1).astype(bool)  # [>= total]
    indptr = _mask_indptr(_np(mask_indptr_or_seq_lens).reshape(-1), N)  # [bs+1]
    bs = indptr.shape[0] - 1
    if not 0 <= request < bs:
        raise ValueError(f"draw_tree_mask: request {request} outside [0, {bs})")
    start, end = int(indptr[request]), int(indptr[request + 1])
    width = (end - start) // N
    seq = width - N
    if end > mask.shape[0]:
        raise ValueError(f"draw_tree_mask: mask has {mask.shape[0]} entries < {end} needed")
    block = mask[start:end].reshape(N, width)  # [N, seq+N]
    anc = _ancestry(parents) if parents is not None else None  # [N, N]
    if parents is not None and len(parents) != N:
        raise ValueError(f"draw_tree_mask: {len(parents)} parents for N={N}")

    tree_w = 0.0 if parents is None else 2.6 + 0.4 * max(_depths(parents))
    fig = Figure(figsize=(width * CELL_IN + 1.8 + tree_w, N * CELL_IN + 1.6), layout="constrained")
    if parents is None:
        ax = fig.add_subplot(1, 1, 1)
    else:
        gs = fig.add_gridspec(1, 2, width_ratios=[width * CELL_IN + 1.0, tree_w])
        ax = fig.add_subplot(gs[0])
    _grid_axes(ax, width, N)
    bad = 0
    for q in range(N):
        for c in range(width):
            on = bool(block[q, c])
            if c < seq:
                _cell(ax, c, q, "#c6dbef" if on else UNUSED_COLOR)
                bad += int(not on)
                continue
            k = c - seq
            _cell(ax, c, q, TREE_ON_COLOR if on else "white", str(int(on)), fontsize=6,
                  edge="#bdbdbd")  # fmt: skip
            ax.texts[-1].set_color("white" if on else "#636363")
            if anc is not None and on != bool(anc[q, k]):
                bad += 1
                _frame(ax, c, q, 1, 1, BAD_COLOR, lw=1.5)
    ax.axvline(seq - 0.5, color="black", lw=1.2)
    ax.set_xticks(
        [seq / 2 - 0.5, seq + N / 2 - 0.5], [f"prefix: {seq} columns (all 1)", f"tree: {N} columns"], fontsize=7
    )
    if parents is None:
        ylabels = [f"draft {q}" for q in range(N)]
    else:
        ylabels = [f"draft {q} (depth {d})" for q, d in enumerate(_depths(parents))]
    ax.set_yticks(range(N), ylabels, fontsize=7)
    note = f"; {bad} cells disagree with the tree!" if bad else ""
    ax.set_title(f"request {request}: custom_mask[{start}:{end}]\nas [N={N}, seq+N={width}]{note}", fontsize=8)

    if parents is not None:  # --- the tree ----------------------------------------------------
        tx = fig.add_subplot(gs[1])
        depths = _depths(parents)
        by_depth: dict[int, list[int]] = {}
        for q, d in enumerate(depths):
            by_depth.setdefault(d, []).append(q)
        pos = {}
        for d, nodes in by_depth.items():
            for r, q in enumerate(nodes):
                pos[q] = (d, r - (len(nodes) - 1) / 2)
        for q, p in enumerate(parents):
            if p >= 0:
                (x0, y0), (x1, y1) = pos[p], pos[q]
                tx.plot([x0, x1], [y0, y1], color="#636363", lw=1.0, zorder=1)
        xs, ys = zip(*(pos[q] for q in range(N)))
        tx.scatter(xs, ys, s=260, facecolor="white", edgecolor=TREE_ON_COLOR, lw=1.5, zorder=2)
        for q in range(N):
            tx.text(*pos[q], str(q), ha="center", va="center", fontsize=8, zorder=3)
        span = max(len(v) for v in by_depth.values())
        tx.set_xlim(-0.5, max(depths) + 0.5)
        tx.set_ylim(span / 2 + 0.1, -span / 2 - 0.1)
        tx.set_xticks(range(max(depths) + 1), [f"d{d}" for d in range(max(depths) + 1)],
                      fontsize=7)  # fmt: skip
        tx.set_yticks([])
        for side in ("top", "right", "left", "bottom"):
            tx.spines[side].set_visible(False)
        tx.tick_params(length=0)
        tx.set_title(f"tree: parents = {list(parents)}", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    if legend:
        handles = [
            Patch(facecolor="#c6dbef", edgecolor="white", label="prefix column: always 1"),
            Patch(facecolor=TREE_ON_COLOR, edgecolor="#bdbdbd", label="1: draft q attends it"),
            Patch(facecolor="white", edgecolor="#bdbdbd", label="0: masked"),
        ]
        if bad:
            handles.append(_differs_handle("disagrees with the tree"))
        _legend(fig, handles)
    return fig


# ---------------------------------------------------------------------------------------------
# 1-D buffers as annotated cells
# ---------------------------------------------------------------------------------------------
def _lookup(mapping: Mapping | None, name: str, i: int | None = None):
    """``mapping[name]`` (1-D row) or, for row i of a 2-D buffer, ``mapping["name[i]"]`` or
    ``mapping[name][i]``; None when absent."""
    if not mapping:
        return None
    if i is None:
        return mapping.get(name)
    if f"{name}[{i}]" in mapping:
        return mapping[f"{name}[{i}]"]
    whole = mapping.get(name)
    return None if whole is None else whole[i]


def _mask(flags, n: int) -> np.ndarray:
    """A boolean ``[n]`` from a bool sequence / tensor (shorter: padded with False)."""
    out = np.zeros(n, dtype=bool)
    if flags is None:
        return out
    f = _np(flags).reshape(-1).astype(bool)[:n]
    out[: f.shape[0]] = f
    return out


def draw_buffers(
    state: Mapping[str, torch.Tensor | int | float | str],
    title: str = "",
    *,
    max_cells: int = 32,
    roles: Mapping[str, Sequence] | None = None,
    differs: Mapping[str, Sequence[bool] | torch.Tensor | bool] | None = None,
    differs_label: str = "differs",
    legend: bool | None = None,
) -> Figure:
    """A compact view of 1-D buffers (one row of annotated cells each) and scalars (text).

    Tensors with more than ``max_cells`` entries show the first ``max_cells - 1`` and a ``+k``
    cell; a 2-D tensor becomes one row per leading index (``name[i]``); 0-d tensors and Python
    numbers / strings are scalars, listed under the rows as ``name = value``. Row labels carry
    the shape and dtype.

    ``roles``: per buffer name, the colour role of each cell (``batch_roles`` /
    ``segment_roles``: an int = live request i, ``"pad"``, ``"value"``, ``"stale"``,
    ``"unread"``; cells past the given roles are unread). For a 2-D buffer give ``"name[i]"`` or
    a list of per-row lists. Rows without roles are plain values (white). ``differs``: per name,
    a boolean per cell (or True for a scalar); those cells get a red frame and hatch, labelled
    ``differs_label`` in the legend (a hidden cell that differs frames the ``+k`` cell).
    ``legend``: draw the legend of the roles and marks used (default: when ``roles`` or
    ``differs`` is given).

    Axes: 1. Texts: one per drawn cell plus one per scalar. Differing cells: one patch each with
    gid ``"differs"``.
    """
    # rows: (label, values, shape, roles per cell or None, differs mask)
    rows: list[tuple[str, np.ndarray, str, Sequence | None, np.ndarray]] = []
    scalars: list[tuple[str, str, bool]] = []
    for name, v in state.items():
        if isinstance(v, torch.Tensor) and v.dim() >= 1:
            dt = str(v.dtype).replace("torch.", "")
            if v.dim() == 1:
                vals = _np(v)
                rows.append((name, vals, f"{list(v.shape)} {dt}", _lookup(roles, name),
                             _mask(_lookup(differs, name), vals.shape[0])))  # fmt: skip
            elif v.dim() == 2:
                for i in range(v.shape[0]):
                    vals = _np(v[i])
                    rows.append((f"{name}[{i}]", vals, f"{list(v.shape)} {dt}",
                                 _lookup(roles, name, i),
                                 _mask(_lookup(differs, name, i), vals.shape[0])))  # fmt: skip
            else:
                raise ValueError(f"draw_buffers: {name} has {v.dim()} dims (1-D or 2-D only)")
        else:
            val = v.item() if isinstance(v, torch.Tensor) else v
            flag = bool((differs or {}).get(name, False) is True)
            scalars.append((name, val if isinstance(val, str) else _fmt(val), flag))
    if legend is None:
        legend = bool(roles) or bool(differs)
    width = max([min(r[1].shape[0], max_cells) for r in rows] + [1])
    # size the figure so that a cell stays ~0.42 in wide whatever the label / scalar lengths
    label_in = 0.062 * max([len(f"{nm}  {shape}") for nm, _, shape, _, _ in rows] + [0]) + 0.2
    scalar_in = 0.068 * max([len(f"{nm} = {v}") for nm, v, _ in scalars] + [0])
    span = max(width, -(-scalar_in // 0.42), 3)  # axes width in cells (scalars may be longer)
    fig = Figure(
        figsize=(label_in + 0.42 * span + 0.3,
                 0.42 * len(rows) + 0.28 * len(scalars) + 0.9 + (0.45 if legend else 0.0)),
        layout="constrained",
    )  # fmt: skip
    ax = fig.add_subplot(1, 1, 1)
    ax.set_xlim(-0.5, span - 0.5)
    ax.set_ylim(len(rows) - 0.5 + 0.7 * len(scalars), -0.5)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    ax.tick_params(length=0)
    used_roles: set = set()
    any_differs = False
    for y, (_, vals, _, row_roles, bad) in enumerate(rows):
        n = vals.shape[0]
        shown = n if n <= max_cells else max_cells - 1
        for x in range(shown):
            role = "value" if row_roles is None else row_roles[x] if x < len(row_roles) else "unread"
            face, hatch, edge, color = _role_style(role)
            used_roles.add(role)
            _cell(ax, x, y, face, _fmt(vals[x]), fontsize=7, edge=edge, lw=1.0, hatch=hatch)
            ax.texts[-1].set_color(color)
            if bad[x]:
                any_differs = True
                _differs_mark(ax, x, y)
        if shown < n:
            _cell(ax, shown, y, UNUSED_COLOR, f"+{n - shown}", fontsize=7, edge="white", lw=1.0)
            if bad[shown:].any():
                any_differs = True
                _differs_mark(ax, shown, y)
    ax.set_yticks(range(len(rows)), [f"{nm}  {shape}" for nm, _, shape, _, _ in rows], fontsize=8)
    ax.set_xticks(range(0, width, 4 if width > 12 else 1),
                  [str(i) for i in range(0, width, 4 if width > 12 else 1)], fontsize=6)  # fmt: skip
    ax.xaxis.tick_top()
    for k, (name, val, flag) in enumerate(scalars):
        t = ax.text(-0.5, len(rows) - 0.1 + 0.7 * k, f"{name} = {val}", ha="left", va="center",
                    fontsize=8, family="monospace")  # fmt: skip
        if flag:
            any_differs = True
            t.set_color(BAD_COLOR)
            t.set_fontweight("bold")
    if title:
        ax.set_title(title, fontsize=9, pad=14)
    if legend:
        handles = [_role_handle(r) for r in _role_order(used_roles)] if roles else []
        if any_differs or differs:
            handles.append(_differs_handle(differs_label))
        _legend(fig, handles)
    return fig


def _differs_mark(ax, x, y) -> None:
    """A red frame and a light red hatch over cell (x, y): the value differs (gid ``"differs"``);
    the cell's text turns bold and stays on top."""
    ax.add_patch(Rectangle((x - 0.46, y - 0.46), 0.92, 0.92, fill=False, edgecolor=BAD_COLOR,
                           hatch="//", hatchcolor=DIFF_HATCH_COLOR, lw=2.0, zorder=2.5,
                           gid="differs"))  # fmt: skip
    for t in ax.texts[::-1]:  # the cell's own text, drawn last for that cell
        if t.get_position() == (x, y):
            t.set_fontweight("bold")
            t.set_zorder(4)
            break


def draw_state_diff(
    first: Mapping[str, torch.Tensor | int | float | str],
    second: Mapping[str, torch.Tensor | int | float | str],
    *,
    labels: tuple[str, str] = ("after the capture path", "after the replay path"),
    keys: Sequence[str] | None = None,
    roles: Mapping[str, Sequence] | None = None,
    title: str = "",
    max_cells: int = 32,
    differs_label: str | None = None,
) -> Figure:
    """Two states of the same buffers, cell by cell: every cell (or scalar) that differs is
    framed and hatched red in both rows, and the title counts the differing cells.

    ``first`` / ``second``: e.g. two ``graph_state`` snapshots, the one the capture path left and
    the one the replay path left (``refimpl.check`` compares exactly these), or a reference and
    what a bound buffer holds. ``keys``: which to draw, in order (default: every key of either,
    sorted). Tensors are flattened; a shape mismatch marks every cell. ``roles``: per key, the
    colour roles of its cells (as in ``draw_buffers``), used for both rows.

    Axes: 1. Differing cells: one patch per drawn cell with gid ``"differs"`` (both rows).
    """
    keys = list(keys) if keys is not None else sorted(set(first) | set(second))
    state: dict = {}
    marks: dict = {}
    row_roles: dict = {}
    total = 0
    for key in keys:
        a, b = first.get(key), second.get(key)
        for lab, v in zip(labels, (a, b)):
            name = f"{key}: {lab}"
            state[name] = v.detach().reshape(-1) if isinstance(v, torch.Tensor) else (
                "(not set)" if v is None else v)  # fmt: skip
            if roles and key in roles:
                row_roles[name] = roles[key]
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            a_, b_ = a.detach().cpu().reshape(-1), b.detach().cpu().reshape(-1)
            if a_.shape == b_.shape:
                bad = a_ != b_
                if a_.is_floating_point():
                    bad &= ~(a_.isnan() & b_.isnan())
                bad_a = bad_b = bad.numpy()
            else:
                bad_a, bad_b = np.ones(a_.numel(), bool), np.ones(b_.numel(), bool)
            total += int(max(bad_a.sum(), bad_b.sum()))
        elif isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):  # one side only
            bad_a = np.ones(a.numel(), bool) if isinstance(a, torch.Tensor) else True
            bad_b = np.ones(b.numel(), bool) if isinstance(b, torch.Tensor) else True
            total += max(int(np.sum(bad_a)), int(np.sum(bad_b)))
        else:
            bad_a = bad_b = bool(a != b)  # scalars (or a key one side lacks)
            total += int(bad_a)
        marks[f"{key}: {labels[0]}"], marks[f"{key}: {labels[1]}"] = bad_a, bad_b
    summary = f"{total} cell(s) differ" if total else "no cell differs"
    return draw_buffers(
        state, f"{title}\n{summary}" if title else summary, max_cells=max_cells,
        roles=row_roles or None, differs=marks,
        differs_label=differs_label or f"differs: {labels[0]} vs {labels[1]}", legend=True,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Buffer sizes across backends
# ---------------------------------------------------------------------------------------------
OWNER_COLORS = ["#6baed6", "#fd8d3c", "#74c476", "#9e9ac8", "#bdbdbd"]


def draw_buffer_sizes(
    sizes: Mapping[str, Mapping[str, int]],
    *,
    notes: Mapping[str, Mapping[str, str]] | None = None,
    needed: Mapping[str, tuple[int, str]] | None = None,
    title: str = "",
) -> Figure:
    """Allocated entries of the same buffers in several backends: one panel per buffer, one
    horizontal bar per owner (``sizes[buffer][owner] = numel``; an owner keeps its colour in
    every panel). ``notes[buffer][owner]``: text after the bar (shape, dtype). ``needed[buffer]
    = (entries, what needs them)``: a dashed line; a bar shorter than it is framed red and
    labelled "too small".

    Axes: one per buffer. Texts: one note per bar (gid ``"note"``), one label per need line
    (gid ``"need"``), one "too small" per short bar (gid ``"too_small"``).
    """
    notes, needed = notes or {}, needed or {}
    owners = list(dict.fromkeys(o for per in sizes.values() for o in per))
    color = {o: OWNER_COLORS[k % len(OWNER_COLORS)] for k, o in enumerate(owners)}
    heights = [len(per) for per in sizes.values()]
    fig = Figure(figsize=(9.0, sum(0.32 * h + 0.55 for h in heights) + 0.9), layout="constrained")
    axes = fig.subplots(len(sizes), 1, squeeze=False, height_ratios=[h + 1.2 for h in heights])
    short = False
    for ax, (buf, per) in zip(axes[:, 0], sizes.items()):
        need = needed.get(buf)
        top = max(list(per.values()) + [need[0] if need else 0])
        for y, (owner, n) in enumerate(per.items()):
            ax.barh(y, n, color=color[owner], height=0.62, edgecolor="white")
            t = ax.text(n + top * 0.01, y, f" {notes.get(buf, {}).get(owner, n)}", va="center",
                        fontsize=7, family="monospace")  # fmt: skip
            t.set_gid("note")
            if need and n < need[0]:
                short = True
                ax.add_patch(Rectangle((0, y - 0.31), n, 0.62, fill=False, edgecolor=BAD_COLOR,
                                       lw=1.8, zorder=3))  # fmt: skip
                t.set_text(t.get_text() + "  too small")
                t.set_color(BAD_COLOR)
                t.set_gid("too_small")
        if need:
            ax.axvline(need[0], color="black", ls="--", lw=1.0)
            lab = ax.text(need[0], -0.55, f" {need[1]}: {need[0]}", fontsize=7, va="bottom",
                          ha="left")  # fmt: skip
            lab.set_gid("need")
        ax.set_xlim(0, top * 1.75)
        ax.set_ylim(len(per) - 0.5, -0.5 - (0.9 if need else 0.3))
        ax.set_yticks(range(len(per)), list(per), fontsize=8)
        ax.set_title(buf, loc="left", fontsize=8.5, family="monospace")
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(axis="x", alpha=0.3)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    axes[-1, 0].set_xlabel("entries allocated (each panel its own scale)", fontsize=8)
    handles = [Patch(facecolor=color[o], label=o) for o in owners]
    if needed:
        handles.append(Line2D([], [], color="black", ls="--", lw=1.0, label="entries a batch needs"))
    if short:
        handles.append(Patch(facecolor="none", edgecolor=BAD_COLOR, lw=1.8,
                             label="too small for that batch"))  # fmt: skip
    _legend(fig, handles, ncols=min(len(handles), 5))
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


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
        ax.add_patch(Circle((x, y), 0.19, facecolor=colors[q], edgecolor="#525252", lw=0.8,
                            zorder=2))  # fmt: skip
        ax.text(x, y, str(q), ha="center", va="center", fontsize=7, zorder=3,
                color="#969696" if q in dim else "black")  # fmt: skip


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
    bw, gap, y0, bh = 3.9, 0.55, 1.35, 6.1
    xs = [0.15 + k * (bw + gap) for k in range(4)]

    def box(k, head, mode, rows, caption):
        x = xs[k]
        ax.add_patch(FancyBboxPatch((x, y0), bw, bh, boxstyle="round,pad=0.02,rounding_size=0.15",
                                    fc="white", ec="#525252", lw=1.0))  # fmt: skip
        ax.text(x + 0.15, y0 + bh - 0.3, head, fontsize=10, fontweight="bold", va="center")
        for j, m in enumerate(mode):
            t = ax.text(x + 0.2, y0 + bh - 0.78 - 0.42 * j, m, fontsize=7.5, family="monospace",
                        va="center", bbox=MODE_BADGE)  # fmt: skip
            t.set_gid("mode")
        ax.text(x + 0.15, y0 + bh - 0.9 - 0.42 * len(mode), rows, fontsize=7.5, va="top")
        ax.text(x + 0.15, y0 + 0.12, caption, fontsize=7, va="bottom", color="#252525",
                linespacing=1.3)  # fmt: skip

    # ① draft
    box(0, "① draft", ["DECODE (multi-step draft)"],
        f"topk = {topk} rows per request per step\n(the graph sees bs·topk rows)",
        f"step 0's {topk} drafts come from the previous\ndraft extend; steps 1..{S - 1} run as "
        f"{S - 1} decode\nsteps captured in one graph. The best\n{N - 1} drafts + the verified "
        f"token\nform the tree of N = {N} nodes.")  # fmt: skip
    pos = _tree_layout(parents, xs[0], y0 + 1.55, bw, 2.6, S)
    cols = {q: EAGLE_COLORS["verified"] if q == 0 else EAGLE_COLORS["step0"] if depths[q] == 1
            else EAGLE_COLORS["steps"] for q in range(N)}  # fmt: skip
    _draw_tree(ax, parents, pos, cols)
    for d in range(S + 1):
        x = xs[0] + 0.3 + d * (bw - 0.6) / S
        ax.text(x, y0 + 1.45, "verified" if d == 0 else f"step {d - 1}", fontsize=6.5,
                ha="center", va="top", color="#525252")  # fmt: skip

    # ② target verify: the tree's ancestry mask after a few prefix columns
    box(1, "② target verify", ["TARGET_VERIFY"],
        f"N = {N} rows per request (one per tree node)",
        "The target model scores every node in one\npass; the custom mask [N, prefix + N] lets "
        "a\nnode see the prefix and its own ancestors.\nGraphs capture N rows per request.")  # fmt: skip
    anc = _ancestry(parents)
    c = min(0.34, (bw - 1.0) / (N + 2.5))
    mx, my = xs[1] + 0.75, y0 + 1.55 + 2.45
    for q in range(N):
        ax.text(mx - 0.12, my - q * c, str(q), fontsize=6, ha="right", va="center")
        for j in range(2):
            ax.add_patch(Rectangle((mx + j * c, my - q * c - c / 2), c, c, fc="#c6dbef",
                                   ec="white", lw=0.5))  # fmt: skip
        for k in range(N):
            on = bool(anc[q, k])
            ax.add_patch(Rectangle((mx + (k + 2.5) * c, my - q * c - c / 2), c, c,
                                   fc=TREE_ON_COLOR if on else "white", ec="#bdbdbd", lw=0.5))  # fmt: skip
    ax.text(mx + c, my + c, "prefix", fontsize=6, ha="center", va="bottom")
    ax.text(mx + (2.5 + N / 2) * c, my + c, "tree (ancestry)", fontsize=6, ha="center",
            va="bottom")  # fmt: skip
    ax.text(mx + 2.25 * c, my - 0.5 * c, "…", fontsize=7, ha="center", va="center")

    # ③ accept
    box(2, "③ accept", ["no graph of its own"],
        "runs on the verify logits",
        f"accept_length = {len(acc)}: the drafts accepted along\none chain (refimpl counts "
        f"accepted drafts,\n0..S). The target's own token after them\nis the bonus token: "
        f"{len(acc) + 1} new tokens.")  # fmt: skip
    pos3 = _tree_layout(parents, xs[2], y0 + 1.55, bw - 0.5, 2.6, S)
    on_chain = set(chain)
    cols3 = {q: EAGLE_COLORS["verified"] if q == 0 else EAGLE_COLORS["accepted"] if q in on_chain
             else EAGLE_COLORS["rejected"] for q in range(N)}  # fmt: skip
    _draw_tree(ax, parents, pos3, cols3, dim=[q for q in range(N) if q not in on_chain],
               edge_colors={q: "#238b45" for q in acc})  # fmt: skip
    from matplotlib.patches import Circle

    lx, ly = pos3[chain[-1]]
    bx = lx + (bw - 1.1) / S
    ax.plot([lx, bx], [ly, ly], color="#cc8400", ls="--", lw=1.2, zorder=1)
    ax.add_patch(Circle((bx, ly), 0.19, fc=EAGLE_COLORS["bonus"], ec="#525252", lw=0.8, zorder=2))
    ax.text(bx, ly, "b", ha="center", va="center", fontsize=7, zorder=3)

    # ④ draft extend: v1 and v2 rows
    box(3, "④ draft extend", ["DRAFT_EXTEND (v1)", "DRAFT_EXTEND_V2"],
        f"v1: S + 1 = {S + 1} rows per request\nv2: N = {N} rows per request",
        "The draft model runs over the new tokens\n(graph rows past them: rejected drafts,\n"
        "outputs dropped). Its output gives the next\niteration's step-0 drafts (back to ①).")  # fmt: skip
    real = [f"n{q}" for q in acc] + ["b"]
    for j, (lab, n) in enumerate((("v1", S + 1), ("v2", N))):
        yy = y0 + 3.55 - j * 1.0
        ax.text(xs[3] + 0.2, yy, lab, fontsize=7.5, va="center")
        cw = min(0.45, (bw - 0.9) / max(N, S + 1))
        for r in range(n):
            kind = ("accepted" if r < len(acc) else "bonus") if r < len(real) else "rejected"
            ax.add_patch(Rectangle((xs[3] + 0.6 + r * cw, yy - cw / 2), cw, cw,
                                   fc=EAGLE_COLORS[kind], ec="#525252", lw=0.6))  # fmt: skip
            ax.text(xs[3] + 0.6 + (r + 0.5) * cw, yy, real[r] if r < len(real) else "–",
                    ha="center", va="center", fontsize=6.5)  # fmt: skip

    # arrows between the steps, and back to ①
    for k in range(3):
        ax.add_patch(FancyArrowPatch((xs[k] + bw + 0.05, y0 + bh / 2), (xs[k + 1] - 0.05, y0 + bh / 2),
                                     arrowstyle="-|>", mutation_scale=14, color="#252525", lw=1.3))  # fmt: skip
    yb = y0 - 0.32  # back to ①, under the boxes
    ax.plot([xs[3] + bw / 2, xs[3] + bw / 2, xs[0] + bw / 2], [y0 - 0.02, yb, yb],
            color="#525252", lw=1.1, ls="--")  # fmt: skip
    ax.add_patch(FancyArrowPatch((xs[0] + bw / 2, yb), (xs[0] + bw / 2, y0 - 0.02),
                                 arrowstyle="-|>", mutation_scale=14, color="#525252", lw=1.1))  # fmt: skip
    ax.text(W / 2, yb + 0.05, "next iteration: draft extend's output seeds step 0 of the next draft",
            fontsize=7, ha="center", va="bottom", color="#525252")  # fmt: skip

    # IDLE
    ax.add_patch(FancyBboxPatch((0.15, 0.08), W - 0.3, 0.62,
                                boxstyle="round,pad=0.02,rounding_size=0.12", fc="#fafafa",
                                ec="#969696", lw=0.8))  # fmt: skip
    t = ax.text(0.35, 0.39, "IDLE", fontsize=7.5, family="monospace", va="center", bbox=MODE_BADGE)
    t.set_gid("mode")
    ax.text(1.2, 0.39, "a data-parallel rank with no requests still runs every step above "
            "(bs 0), so that the collectives of all ranks line up; under graphs it replays the "
            "smallest captured graph with every row padded.", fontsize=7.5, va="center")  # fmt: skip

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


# ---------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------
SHAPE_COLORS = {"legacy": "#d62728", "unified": "#1f77b4", "simplified": "#ff7f0e",
                "in_graph": "#2ca02c", "faithful": "#1f77b4", "fused": "#ff7f0e"}  # fmt: skip


def draw_latency_vs_bs(
    rows: Sequence[Mapping], panels: Sequence[tuple[str, str, str]], title: str = "", second_run: Sequence[Mapping] = ()
) -> Figure:
    """Median (line) and p25–p75 (shaded) against batch size, one line per ``row["shape"]``.

    ``rows``: ``bench.time_replay_path`` results with ``shape`` and ``bs``; ``panels``: one
    ``(group, key, label)`` per panel, e.g. ``("host_us", "hook+launch", "host µs")``.
    ``second_run``: the same measurement repeated, drawn as dotted medians (do they agree?).
    """
    fig = Figure(figsize=(5.2 * len(panels), 3.6))
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    for k, (group, key, label) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), k + 1)
        for shape in shapes:
            mine = sorted((r for r in rows if r["shape"] == shape and group in r),
                          key=lambda r: r["bs"])  # fmt: skip
            if not mine:
                continue
            bs = [r["bs"] for r in mine]
            med = [r[group][key]["median"] for r in mine]
            color = SHAPE_COLORS.get(shape)
            ax.plot(bs, med, marker="o", ms=3, label=shape, color=color)
            ax.fill_between(bs, [r[group][key]["p25"] for r in mine],
                            [r[group][key]["p75"] for r in mine], alpha=0.25, color=color)  # fmt: skip
            again = sorted((r for r in second_run if r["shape"] == shape and group in r),
                           key=lambda r: r["bs"])  # fmt: skip
            if again:
                ax.plot([r["bs"] for r in again], [r[group][key]["median"] for r in again],
                        ls=":", color=color, alpha=0.8)  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


# ---------------------------------------------------------------------------------------------
# ``python -m refimpl bench`` results (``refimpl.bench.sweep`` rows)

PART_COLORS = {"validate": "#bdbdbd", "copies": "#9ecae1", "hook": "#fd8d3c", "launch": "#31a354"}


def _label(r: Mapping) -> str:
    return f"{r['backend']}/{r['variant']} {r['mode']}"


def _where(env: Mapping) -> str:
    return env.get("device", "") + (" (emulator timings)" if "note" in env else "")


def draw_replay_breakdown(rows: Sequence[Mapping], env: Mapping, bs: int, context: int) -> Figure:
    """Stacked host µs of the replay path per backend x variant x mode at one (bs, context):
    validation (hatched: off with ``validate_inputs=False``), input copies, the replay hook,
    ``graph.replay()``; the graph's GPU time as a black tick where measured."""
    mine = [r for r in rows if r["bs"] == bs and r["context"] == context]
    fig = Figure(figsize=(8.5, 0.32 * len(mine) + 1.4))
    ax = fig.add_subplot(1, 1, 1)
    for y, r in enumerate(mine):
        left = 0.0
        for part in ("copies", "hook", "launch", "validate"):
            w = r["host_us"][part]["median"]
            ax.barh(y, w, left=left, color=PART_COLORS[part], edgecolor="white", lw=0.5,
                    hatch="//" if part == "validate" else None,
                    label=part if y == 0 else None)  # fmt: skip
            left += w
        if "gpu_us" in r:
            g = r["gpu_us"]["graph"]["median"]
            ax.plot([g, g], [y - 0.4, y + 0.4], color="black", lw=1.5,
                    label="GPU time of the graph" if y == 0 else None)  # fmt: skip
    ax.set_yticks(range(len(mine)), [_label(r) for r in mine], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("host µs (medians)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"The replay path, part by part: bs {bs}, context {context} — {_where(env)}",
                 fontsize=9)  # fmt: skip
    return fig


def draw_host_vs_bs(rows: Sequence[Mapping], env: Mapping, context: int, backend: str = "triton"):
    """Host µs of copies + hook + launch against bs, one line per variant of ``backend``, one
    panel per mode (faithful vs fused vs in-graph metadata)."""
    mine = [r for r in rows if r["backend"] == backend and r["context"] == context]
    modes = list(dict.fromkeys(r["mode"] for r in mine))
    fig = Figure(figsize=(5.0 * max(len(modes), 1), 3.5))
    for k, mode in enumerate(modes):
        ax = fig.add_subplot(1, len(modes), k + 1)
        for variant in dict.fromkeys(r["variant"] for r in mine):
            pts = sorted((r for r in mine if r["mode"] == mode and r["variant"] == variant),
                         key=lambda r: r["bs"])  # fmt: skip
            if not pts:
                continue
            color = SHAPE_COLORS.get(variant)
            bs = [r["bs"] for r in pts]
            for part, ls in (("path", "-"), ("hook", "--")):
                ax.plot(bs, [r["host_us"][part]["median"] for r in pts], ls=ls, marker="o",
                        ms=3, color=color,
                        label=f"{variant}: {'copies+hook+launch' if part == 'path' else 'hook'}")  # fmt: skip
            ax.fill_between(bs, [r["host_us"]["path"]["p10"] for r in pts],
                            [r["host_us"]["path"]["p90"] for r in pts], color=color, alpha=0.15)  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("batch size")
        ax.set_ylabel("host µs (median, p10–p90)")
        ax.set_title(f"{backend} {mode}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(f"Host cost of a replay vs batch size, context {context} — {_where(env)}",
                 fontsize=10)  # fmt: skip
    return fig


def draw_step_graph_vs_eager(rows: Sequence[Mapping], env: Mapping, context: int) -> Figure:
    """The whole decoder step (wall µs, synchronised) as a graph and eagerly, against bs; one
    panel per mode, one colour per backend/variant (solid: graph, dashed: eager)."""
    mine = [r for r in rows if r["context"] == context]
    modes = list(dict.fromkeys(r["mode"] for r in mine))
    fig = Figure(figsize=(5.4 * max(len(modes), 1), 3.8))
    cmap = matplotlib.colormaps["tab20"]
    for k, mode in enumerate(modes):
        ax = fig.add_subplot(1, len(modes), k + 1)
        labels = list(dict.fromkeys(f"{r['backend']}/{r['variant']}" for r in mine
                                    if r["mode"] == mode))  # fmt: skip
        for c, lab in enumerate(labels):
            pts = sorted((r for r in mine if r["mode"] == mode
                          and f"{r['backend']}/{r['variant']}" == lab), key=lambda r: r["bs"])  # fmt: skip
            bs = [r["bs"] for r in pts]
            color = cmap(c % 20)
            ax.plot(bs, [r["step_us"]["graph"]["median"] for r in pts], color=color, marker="o",
                    ms=3, label=lab)  # fmt: skip
            ax.plot(bs, [r["step_us"]["eager"]["median"] for r in pts], color=color, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.set_ylabel("step µs (solid: graph, dashed: eager)")
        ax.set_title(mode, fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=6, ncol=2)
    fig.suptitle(f"Graph vs eager, whole decoder step, context {context} — {_where(env)}",
                 fontsize=10)  # fmt: skip
    return fig


def draw_capture_cost(rows: Sequence[Mapping], env: Mapping, context: int) -> Figure:
    """Capture time per bs (first in process and again, warm) and the static-buffer bytes and
    graph-pool growth per bs, one line per backend/variant/mode."""
    mine = [r for r in rows if r["context"] == context]
    fig = Figure(figsize=(11, 3.8))
    ax_t, ax_m = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    cmap = matplotlib.colormaps["tab20"]
    for c, lab in enumerate(dict.fromkeys(_label(r) for r in mine)):
        pts = sorted((r for r in mine if _label(r) == lab), key=lambda r: r["bs"])
        bs, color = [r["bs"] for r in pts], cmap(c % 20)
        ax_t.plot(bs, [r["capture_s"]["first"] * 1e3 for r in pts], color=color, marker="o",
                  ms=3, label=lab)  # fmt: skip
        ax_t.plot(bs, [r["capture_s"]["warm"] * 1e3 for r in pts], color=color, ls="--")
        if pts[0].get("pool_growth_bytes") is not None:
            ax_m.plot(bs, [(r["pool_growth_bytes"] or 0) / 2**20 for r in pts], color=color,
                      marker="o", ms=3, label=lab)  # fmt: skip
        ax_m.plot(bs, [r["static_bytes"] / 2**20 for r in pts], color=color, ls=":")
    ax_t.set(xscale="log", yscale="log", xlabel="batch size",
             ylabel="capture ms (solid: first, dashed: again)")  # fmt: skip
    ax_m.set(xscale="log", xlabel="batch size",
             ylabel="MiB (solid: pool growth, dotted: static buffers)")  # fmt: skip
    for ax in (ax_t, ax_m):
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
    ax_t.legend(fontsize=5, ncol=2)
    fig.suptitle(f"Capture cost per batch size, context {context} — {_where(env)}", fontsize=10)
    return fig


def draw_bench_figures(rows: Sequence[Mapping], env: Mapping, out_dir: str | Path) -> list[Path]:
    """The four bench plots into ``out_dir`` (file names start with ``replay_``)."""
    out = Path(out_dir)
    ctx = min(r["context"] for r in rows)
    sizes = sorted({r["bs"] for r in rows if r["context"] == ctx})
    bs = 8 if 8 in sizes else sizes[len(sizes) // 2]
    figs = {"replay_breakdown.png": draw_replay_breakdown(rows, env, bs, ctx),
            "replay_step_graph_vs_eager.png": draw_step_graph_vs_eager(rows, env, ctx),
            "replay_capture_cost.png": draw_capture_cost(rows, env, ctx)}  # fmt: skip
    if any(r["backend"] == "triton" for r in rows):
        figs["replay_host_vs_bs_triton.png"] = draw_host_vs_bs(rows, env, ctx, "triton")
    return [save(f, out / name) for name, f in figs.items()]


# ---------------------------------------------------------------------------------------------
def save(fig: Figure, path: str | Path) -> Path:
    """``fig.savefig(path, dpi=110, bbox_inches="tight")`` without a software tag; makes dirs."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    return path
