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
- ``save``: write a figure reproducibly (no software tag in the PNG).

Cell colours: live requests get light colours (blue, green, purple, ...), padded rows (request
slot 0, the reserved row) orange, unused cells grey, as in notebook 00's padding figure. A value
that contradicts what the builder can recompute (a ``kv_indices`` entry that is not the
``req_to_token`` prefix, a mask that is not the tree's ancestry) gets a red frame and the title
says how many.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from . import layout

__all__ = [
    "draw_block_table",
    "draw_buffers",
    "draw_csr",
    "draw_draft_decode_indices",
    "draw_latency_vs_bs",
    "draw_tree_mask",
    "save",
]

# live requests (light), the padded row, unused cells, draft slots, mismatches
REQ_COLORS = ["#9ecae1", "#a1d99b", "#cbc9e2", "#fbb4c4", "#99d8c9", "#fee391", "#d9d9d9"]
PAD_COLOR = "#ffba73"
UNUSED_COLOR = "#f0f0f0"
DRAFT_COLOR = "#fc9272"
TREE_ON_COLOR = "#3182bd"
BAD_COLOR = "#d62728"
INDPTR_COLOR = "#a50f15"

CELL_IN = 0.3  # inches per cell in the grid figures


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


def _cell(ax, x, y, color, text=None, *, fontsize=6.0, edge="white", lw=0.6, hatch=None):
    """One unit cell centred on (x, y), optionally with a centred text."""
    ax.add_patch(
        Rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=color, edgecolor=edge, lw=lw, hatch=hatch)
    )
    if text is not None:
        ax.text(x, y, text, ha="center", va="center", fontsize=fontsize)


def _frame(ax, x0, y0, w, h, color, lw=1.8):
    """An unfilled rectangle around cells x0..x0+w-1, y0..y0+h-1."""
    ax.add_patch(
        Rectangle((x0 - 0.5, y0 - 0.5), w, h, fill=False, edgecolor=color, lw=lw, zorder=3)
    )


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
) -> Figure:
    """Top: the batch's ``req_to_token`` rows; bottom: the packed ``kv_indices`` strip.

    ``req_to_token`` ``[pool, L]``, ``req_pool_indices`` ``[bs]``, ``seq_lens_or_kv_lens`` ``[bs]``
    (the lengths the CSR was built from: ``seq_lens`` in decode and verify, ``seq_lens - rows``
    in draft extend), ``kv_indptr`` ``[bs+1]``, ``kv_indices`` ``[>= kv_indptr[-1]]`` (a graph
    buffer may be longer; only the used prefix is drawn). The used prefix of every row is framed
    in its request's colour; the strip uses the same colours, so it reads as the concatenation
    of the framed prefixes. Strip cells that differ from ``req_to_token`` get a red frame.

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

    fig = Figure(
        figsize=(wrap * CELL_IN + 1.8, (bs + 2 * lines) * CELL_IN + 1.4), layout="constrained"
    )
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
    bot.set_title(
        f"kv_indices (packed; red marks: kv_indptr = {indptr.tolist()}){note}", fontsize=8
    )
    if title:
        fig.suptitle(title, fontsize=10)
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
    fig = Figure(
        figsize=(pages * CELL_IN * 1.6 + 2.6, 2 * bs * CELL_IN + 1.2), layout="constrained"
    )
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
        labels += [
            f"{who}: r2t[row {int(rpi[i])}, p*{P}] // {P}",
            f"block_table[{i}], len {int(lens[i])}",
        ]
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
) -> Figure:
    """Request ``request``'s ``[N, seq + N]`` block of a flat target-verify ``custom_mask``.

    ``custom_mask`` ``[>= mask_indptr[-1]]`` bool / uint8 (the graph buffer may be longer);
    ``mask_indptr_or_seq_lens``: ``mask_indptr`` ``[bs+1]`` (recognised by a leading 0 and steps
    that are multiples of N) or the prefix ``seq_lens`` ``[bs]``. Prefix columns (all 1) are
    light blue, the tree part dark where 1; its cells carry their 0/1. With ``parents`` the tree
    is drawn on the right (node q at depth(q)), rows are labelled by depth, and tree cells that
    disagree with the ancestry of ``parents`` get a red frame.

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
        [seq / 2 - 0.5, seq + N / 2 - 0.5],
        [f"prefix: {seq} columns (all 1)", f"tree: {N} columns"],
        fontsize=7,
    )
    if parents is None:
        ylabels = [f"draft {q}" for q in range(N)]
    else:
        ylabels = [f"draft {q} (depth {d})" for q, d in enumerate(_depths(parents))]
    ax.set_yticks(range(N), ylabels, fontsize=7)
    note = f"; {bad} cells disagree with the tree!" if bad else ""
    ax.set_title(
        f"request {request}: custom_mask[{start}:{end}]\nas [N={N}, seq+N={width}]{note}",
        fontsize=8,
    )

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
    return fig


# ---------------------------------------------------------------------------------------------
# 1-D buffers as annotated cells
# ---------------------------------------------------------------------------------------------
def draw_buffers(
    state: Mapping[str, torch.Tensor | int | float | str],
    title: str = "",
    *,
    max_cells: int = 32,
) -> Figure:
    """A compact view of 1-D buffers (one row of annotated cells each) and scalars (text).

    Tensors with more than ``max_cells`` entries show the first ``max_cells - 1`` and a ``+k``
    cell; a 2-D tensor becomes one row per leading index (``name[i]``); 0-d tensors and Python
    numbers / strings are scalars, listed under the rows as ``name = value``. Row labels carry
    the shape and dtype.

    Axes: 1. Texts: one per drawn cell plus one per scalar.
    """
    rows: list[tuple[str, np.ndarray, str]] = []
    scalars: list[tuple[str, str]] = []
    for name, v in state.items():
        if isinstance(v, torch.Tensor) and v.dim() >= 1:
            dt = str(v.dtype).replace("torch.", "")
            if v.dim() == 1:
                rows.append((name, _np(v), f"{list(v.shape)} {dt}"))
            elif v.dim() == 2:
                for i in range(v.shape[0]):
                    rows.append((f"{name}[{i}]", _np(v[i]), f"{list(v.shape)} {dt}"))
            else:
                raise ValueError(f"draw_buffers: {name} has {v.dim()} dims (1-D or 2-D only)")
        else:
            val = v.item() if isinstance(v, torch.Tensor) else v
            scalars.append((name, val if isinstance(val, str) else _fmt(val)))
    width = max([min(r[1].shape[0], max_cells) for r in rows] + [1])
    # size the figure so that a cell stays ~0.42 in wide whatever the label / scalar lengths
    label_in = 0.062 * max([len(f"{nm}  {shape}") for nm, _, shape in rows] + [0]) + 0.2
    scalar_in = 0.068 * max([len(f"{nm} = {v}") for nm, v in scalars] + [0])
    span = max(width, -(-scalar_in // 0.42), 3)  # axes width in cells (scalars may be longer)
    fig = Figure(
        figsize=(label_in + 0.42 * span + 0.3, 0.42 * len(rows) + 0.28 * len(scalars) + 0.9),
        layout="constrained",
    )
    ax = fig.add_subplot(1, 1, 1)
    ax.set_xlim(-0.5, span - 0.5)
    ax.set_ylim(len(rows) - 0.5 + 0.7 * len(scalars), -0.5)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    ax.tick_params(length=0)
    for y, (_, vals, _) in enumerate(rows):
        n = vals.shape[0]
        shown = n if n <= max_cells else max_cells - 1
        for x in range(shown):
            _cell(ax, x, y, _req_color(y), _fmt(vals[x]), fontsize=7, edge="white", lw=1.0)
        if shown < n:
            _cell(ax, shown, y, UNUSED_COLOR, f"+{n - shown}", fontsize=7, edge="white", lw=1.0)
    ax.set_yticks(range(len(rows)), [f"{nm}  {shape}" for nm, _, shape in rows], fontsize=8)
    ax.set_xticks(range(0, width, 4 if width > 12 else 1),
                  [str(i) for i in range(0, width, 4 if width > 12 else 1)], fontsize=6)  # fmt: skip
    ax.xaxis.tick_top()
    for k, (name, val) in enumerate(scalars):
        ax.text(-0.5, len(rows) - 0.1 + 0.7 * k, f"{name} = {val}", ha="left", va="center",
                fontsize=8, family="monospace")  # fmt: skip
    if title:
        ax.set_title(title, fontsize=9, pad=14)
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
) -> Figure:
    """Per step, each (seq, branch) row of the draft-decode CSR: prefix vs draft slots.

    ``kv_indptr`` ``[S, >= rows+1]`` (the wrapper's ``[S, pool*topk+1]`` buffer is sliced),
    ``kv_indices`` ``[S, W]``, ``seq_lens`` ``[num_seqs]``, ``rows = num_seqs * topk`` ordered
    ``[seq][branch]``. Row (r, k) of step i holds ``seq_lens[r]`` prefix slots (the sequence's
    colour) then ``i + 1`` draft slots (red); the draft area has ``num_steps`` columns, unused
    ones hatched. Labels give the row's ``kv_indptr`` range. Rows whose length disagrees with
    ``seq_lens[r] + i + 1`` get a red frame. ``used_steps``: steps at or past it are marked as
    filled but not read (EAGLE runs S-1 decode steps); ``live_seqs``: later sequences are
    labelled as padding.

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
    fig = Figure(
        figsize=(width * CELL_IN + 2.2, num_steps * (rows * CELL_IN + 0.7) + 0.6),
        layout="constrained",
    )
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
            f"step {i}: rows of prefix + {i + 1} draft slot(s), kv_indptr[{i}] = "
            f"{indptr[i].tolist()}{note}{warn}",
            fontsize=7.5,
        )
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


# ---------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------
SHAPE_COLORS = {"legacy": "#d62728", "unified": "#1f77b4", "simplified": "#ff7f0e",
                "in_graph": "#2ca02c", "faithful": "#1f77b4", "fused": "#ff7f0e"}  # fmt: skip


def draw_latency_vs_bs(
    rows: Sequence[Mapping],
    panels: Sequence[tuple[str, str, str]],
    title: str = "",
    second_run: Sequence[Mapping] = (),
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
def save(fig: Figure, path: str | Path) -> Path:
    """``fig.savefig(path, dpi=110, bbox_inches="tight")`` without a software tag; makes dirs."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    return path
