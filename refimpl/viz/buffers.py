"""Buffers drawn: CSR ``kv_indices`` against ``req_to_token``, block tables, the target-verify
tree mask, 1-D buffers and their differences, allocated sizes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from .cells import (
    BAD_COLOR,
    CELL_IN,
    DIFF_HATCH_COLOR,
    INDPTR_COLOR,
    PAD_COLOR,
    TREE_ON_COLOR,
    UNUSED_COLOR,
    _cell,
    _differs_handle,
    _fmt,
    _frame,
    _grid_axes,
    _legend,
    _np,
    _req_color,
    _role_handle,
    _role_order,
    _role_style,
)


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
        t = bot.text(x, y - 0.8, str(p), ha="center", va="bottom", fontsize=6, color=INDPTR_COLOR)
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
def _check_mask_indptr(t: np.ndarray, N: int) -> np.ndarray:
    """``t`` must be a ``mask_indptr``: 0 first, then steps of ``N * (seq + N)`` (``refimpl.layout``)."""
    steps = np.diff(t)
    if t.size < 2 or t[0] != 0 or (steps % N != 0).any() or (steps // N < N).any():
        raise ValueError(f"draw_tree_mask: mask_indptr={t.tolist()} is not [0, cumsum(N*(seq+N))] for N={N}")
    return t


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
    mask_indptr: torch.Tensor,
    N: int,
    request: int = 0,
    *,
    parents: Sequence[int] | None = None,
    legend: bool = True,
    title: str = "",
) -> Figure:
    """Request ``request``'s ``[N, seq + N]`` block of a flat target-verify ``custom_mask``.

    ``custom_mask`` ``[>= mask_indptr[-1]]`` bool / uint8 (the graph buffer may be longer);
    ``mask_indptr`` ``[bs+1]``: ``[0, cumsum(N * (seq + N))]`` (``refimpl.layout.mask_indptr``). Prefix columns (all 1) are
    light blue, the tree part dark where 1; its cells carry their 0/1. With ``parents`` the tree
    is drawn on the right (node q at depth(q)), rows are labelled by depth, and tree cells that
    disagree with the ancestry of ``parents`` get a red frame. ``legend``: a legend of the
    colours; ``title``: a figure title above the panels.

    Axes: 1, or 2 with ``parents``. Texts: N*N in the mask axes, N node labels in the tree axes.
    """
    mask = _np(custom_mask).reshape(-1).astype(bool)  # [>= total]
    indptr = _check_mask_indptr(_np(mask_indptr).reshape(-1), N)  # [bs+1]
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
            _cell(ax, c, q, TREE_ON_COLOR if on else "white", str(int(on)), fontsize=6, edge="#bdbdbd")
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
        tx.set_xticks(range(max(depths) + 1), [f"d{d}" for d in range(max(depths) + 1)], fontsize=7)
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
            state[name] = v.detach().reshape(-1) if isinstance(v, torch.Tensor) else ("(not set)" if v is None else v)
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
                ax.add_patch(Rectangle((0, y - 0.31), n, 0.62, fill=False, edgecolor=BAD_COLOR, lw=1.8, zorder=3))
                t.set_text(t.get_text() + "  too small")
                t.set_color(BAD_COLOR)
                t.set_gid("too_small")
        if need:
            ax.axvline(need[0], color="black", ls="--", lw=1.0)
            lab = ax.text(need[0], -0.55, f" {need[1]}: {need[0]}", fontsize=7, va="bottom", ha="left")
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
        handles.append(Patch(facecolor="none", edgecolor=BAD_COLOR, lw=1.8, label="too small for that batch"))
    _legend(fig, handles, ncols=min(len(handles), 5))
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
