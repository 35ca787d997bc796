"""Buffers drawn: CSR ``kv_indices``, block tables, the tree mask and 1-D buffers and their diffs."""

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from . import cells as C

State = Mapping[str, torch.Tensor | int | float | str]  # buffers by name: tensors, or scalars drawn as text


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
    """Top: the batch's ``req_to_token`` rows ``[pool, L]``, each used prefix (``seq_lens_or_kv_lens``: ``seq_lens``, or
    ``seq_lens - rows`` in draft extend) framed; bottom: the packed ``kv_indices`` (used part) in the same colours,
    entries that differ from ``req_to_token`` framed red. Axes: 2. Strip texts: one per entry plus one per distinct
    boundary (gid ``"kv_indptr"``)."""
    r2t = C.to_numpy(req_to_token)  # [pool, L]
    rpi, lens, indptr, idx = map(C.flat, (req_pool_indices, seq_lens_or_kv_lens, kv_indptr, kv_indices))
    bs = len(rpi)  # rpi, lens: [bs]; indptr: [bs+1]; idx: [>= total]
    if len(lens) != bs or len(indptr) != bs + 1:
        raise ValueError(
            f"draw_csr: {bs} requests need {bs} lengths and {bs + 1} kv_indptr entries, got {len(lens)} and {len(indptr)}"
        )
    total = indptr[-1]
    if len(idx) < total:
        raise ValueError(f"draw_csr: kv_indices has {len(idx)} entries < kv_indptr[-1]={total}")
    rows, roles = r2t[rpi], ["pad" if r == 0 else i for i, r in enumerate(rpi)]  # [bs, L], a colour role per request
    ncols = min(r2t.shape[1], max(lens.max(initial=1), np.flatnonzero(rows.any(0)).max(initial=0) + 1))
    expected = rows[np.arange(r2t.shape[1]) < lens[:, None]]  # the used prefixes, concatenated
    wrap = max(ncols, 8)  # strip cells per line: the same cell size as the rows above
    lines = max(1, -(-total // wrap))
    fig = Figure(figsize=(wrap * C.CELL_IN + 1.8, (bs + 2 * lines) * C.CELL_IN + 1.4), layout="constrained")
    top, bot = fig.subplots(2, height_ratios=[bs + 0.6, 2 * lines + 0.4])
    C.grid_axes(top, wrap, bs)  # top: the batch's req_to_token rows, the prefix the CSR packs framed
    for i, role in enumerate(roles):
        for j in range(ncols):
            C.role_cell(top, j, i, role if j < lens[i] else "unread", C.fmt(rows[i, j]))
        if lens[i] > 0:
            C.frame(top, 0, i, lens[i], 1, "#e6550d" if role == "pad" else "#08519c", lw=1.8)
    labels = [f"{'pad' if r == 'pad' else f'req {i}'}: row {rpi[i]}, len {lens[i]}" for i, r in enumerate(roles)]
    C.yticks(top, labels)
    ticks = range(0, ncols, 5)
    top.set_xticks(ticks, ticks, fontsize=6)
    top.xaxis.tick_top()
    top.set_title("req_to_token[req_pool_indices]  (framed: the prefix the CSR packs)", fontsize=8)
    C.grid_axes(bot, wrap, 2 * lines)  # bottom: kv_indices wrapped at ``wrap`` cells, the kv_indptr boundaries
    owner = C.segment_roles(indptr, bs, total)  # [total] each entry's request
    bad = 0
    for p in range(total):
        x, y = p % wrap, 2 * (p // wrap) + 1
        C.role_cell(bot, x, y, roles[owner[p]], C.fmt(idx[p]))
        if p >= len(expected) or idx[p] != expected[p]:
            bad += 1
            C.frame(bot, x, y)
    for p in np.unique(indptr):  # an empty request repeats a boundary: draw it once
        line = min(max(p - (p == total), 0) // wrap, lines - 1)  # the total: at the end of the line before
        x, y = p - line * wrap - 0.5, 2 * line + 1
        bot.plot([x, x], [y - 0.75, y + 0.5], color=C.INDPTR_COLOR, lw=1.4)
        bot.text(x, y - 0.8, p, ha="center", va="bottom", fontsize=6, color=C.INDPTR_COLOR, gid="kv_indptr")
    bot.set_yticks(
        range(1, 2 * lines, 2), [f"kv_indices[{k * wrap}:{min((k + 1) * wrap, total)}]" for k in range(lines)], fontsize=7
    )
    bot.set_xticks([])
    note = f"; {bad} entries differ from req_to_token!" if bad or total != expected.size else ""
    bot.set_title(f"kv_indices (packed; red marks: kv_indptr = {indptr.tolist()}){note}", fontsize=8)
    C.suptitle(fig, title)
    if legend:
        handles = C.role_handles([*roles, "unread"], "request {}", unread="in req_to_token, not packed (past the length)")
        handles += [Line2D([], [], color=C.INDPTR_COLOR, lw=1.4, label="kv_indptr boundary")]
        C.legend(fig, handles + [C.differs_handle("differs from req_to_token")] * (bad > 0), max_cols=6)
    return fig


def draw_tree_mask(
    custom_mask: torch.Tensor,
    mask_indptr: torch.Tensor,
    N: int,
    request: int = 0,
    *,
    parents: Sequence[int] | None = None,
    title: str = "",
) -> Figure:
    """Request ``request``'s ``[N, seq + N]`` block of a flat target-verify ``custom_mask`` (``mask_indptr``:
    ``refimpl.layout.mask_indptr``): prefix columns light blue, tree cells dark where 1. With ``parents``: the tree on
    the right, rows labelled by depth, cells against its ancestry framed red. Axes: 1 (2 with ``parents``). Texts: N*N
    in the mask axes, N node labels in the tree axes."""
    mask, indptr = C.flat(custom_mask).astype(bool), C.flat(mask_indptr)  # [>= total], [bs+1]
    steps, tree = np.diff(indptr), parents is not None
    if indptr.size < 2 or indptr[0] != 0 or any(steps % N) or steps.min() < N * N:
        raise ValueError(f"draw_tree_mask: mask_indptr={indptr.tolist()} is not [0, cumsum(N*(seq+N))] for N={N}")
    if not 0 <= request < len(indptr) - 1:
        raise ValueError(f"draw_tree_mask: request {request} outside [0, {len(indptr) - 1})")
    start, end = indptr[request : request + 2]
    width = (end - start) // N
    if end > len(mask):
        raise ValueError(f"draw_tree_mask: mask has {len(mask)} entries < {end} needed")
    if tree and len(parents) != N:
        raise ValueError(f"draw_tree_mask: {len(parents)} parents for N={N}")
    depths = C.depths(parents) if tree else [0] * N
    tree_w = (2.6 + 0.4 * max(depths)) * tree
    fig = Figure(figsize=(width * C.CELL_IN + 1.8 + tree_w, N * C.CELL_IN + 1.6), layout="constrained")
    ax, *tree_ax = fig.subplots(1, 1 + tree, squeeze=False, width_ratios=[width * C.CELL_IN + 1.0, tree_w][: 1 + tree])[0]
    block, seq, bad = mask[start:end].reshape(N, width), width - N, 0  # [N, seq+N]
    anc = C.ancestry(parents) if tree else None  # [N, N]
    C.grid_axes(ax, width, N)
    for q, c in np.ndindex(N, width):
        on = block[q, c]
        if c < seq:
            C.cell(ax, c, q, C.PREFIX_COLOR if on else C.UNUSED_COLOR)
            bad += not on
            continue
        face, ink = (C.TREE_ON_COLOR, "white") if on else ("white", "#636363")
        C.cell(ax, c, q, face, str(int(on)), fontsize=6, edge="#bdbdbd", text_color=ink)
        if tree and on != anc[q, c - seq]:
            bad += 1
            C.frame(ax, c, q)
    ax.axvline(seq - 0.5, color="black", lw=1.2)
    ax.set_xticks([seq / 2 - 0.5, seq + N / 2 - 0.5], [f"prefix: {seq} columns (all 1)", f"tree: {N} columns"], fontsize=7)
    C.yticks(ax, [f"draft {q}" + f" (depth {d})" * tree for q, d in enumerate(depths)])
    note = f"; {bad} cells disagree with the tree!" if bad else ""
    ax.set_title(f"request {request}: custom_mask[{start}:{end}]\nas [N={N}, seq+N={width}]{note}", fontsize=8)
    if tree:  # the draft tree on the right, depth left to right
        (ax,), levels = tree_ax, range(max(depths) + 1)
        pos = {q: (d, r - (n - 1) / 2) for q, (d, r, n) in C.tree_slots(parents).items()}
        ax.scatter(*zip(*pos.values()), s=260, facecolor="white", edgecolor=C.TREE_ON_COLOR, lw=1.5, zorder=2)
        for q, p in enumerate(parents):  # node q's label, the edge to its parent
            ax.text(*pos[q], q, ha="center", va="center", fontsize=8, zorder=3)
            if q:
                ax.plot(*zip(pos[p], pos[q]), color="#636363", lw=1.0, zorder=1)
        span = max(map(depths.count, depths))  # the most nodes at one depth
        ax.set(xlim=(-0.5, len(levels) - 0.5), ylim=(span / 2 + 0.1, -span / 2 - 0.1), yticks=[])
        ax.set_xticks(levels, [f"d{d}" for d in levels], fontsize=7)
        C.bare_axes(ax)
        ax.set_title(f"tree: parents = {list(parents)}", fontsize=8)
    C.suptitle(fig, title)
    handles = [
        C.swatch(C.PREFIX_COLOR, "white", "prefix column: always 1"),
        C.swatch(C.TREE_ON_COLOR, "#bdbdbd", "1: draft q attends it"),
        C.swatch("white", "#bdbdbd", "0: masked"),
    ]
    C.legend(fig, handles + [C.differs_handle("disagrees with the tree")] * bool(bad))
    return fig


def draw_buffers(
    state: State,
    title: str = "",
    *,
    max_cells: int = 32,
    roles: Mapping[str, Sequence] | None = None,
    differs: Mapping[str, Sequence[bool] | torch.Tensor | bool] | None = None,
    differs_label: str = "differs",
    legend: bool | None = None,
) -> Figure:
    """1-D buffers as rows of annotated cells (a 2-D one: a row ``name[i]`` per index; past ``max_cells``: a ``+k`` cell),
    scalars as ``name = value`` text. ``roles``: per name, each cell's colour role (``batch_roles`` / ``segment_roles``;
    per-row lists for 2-D). ``differs``: per name, a bool per cell (True for a scalar): marked red (gid
    ``"differs"``), ``differs_label`` in the legend. ``legend``: by default when ``roles`` or ``differs`` is given."""
    roles, differs = roles or {}, differs or {}
    rows, scalars = [], []  # (label, values, roles, differs per cell) per row; (text, differs) per scalar
    for name, v in state.items():
        if not (isinstance(v, torch.Tensor) and v.dim() >= 1):
            val = v.item() if isinstance(v, torch.Tensor) else v
            scalars.append((f"{name} = {val if isinstance(val, str) else C.fmt(val)}", differs.get(name) is True))
            continue
        if v.dim() > 2:
            raise ValueError(f"draw_buffers: {name} has {v.dim()} dims (1-D or 2-D only)")
        shape = f"{list(v.shape)} {str(v.dtype).replace('torch.', '')}"
        one = v.dim() == 1  # else a row name[i] per index, its roles / differs: row i of those given
        for i, part in enumerate([v] if one else v):
            vals, label = C.to_numpy(part), name if one else f"{name}[{i}]"
            row_roles, bad = (m.get(name) if one or m.get(name) is None else m[name][i] for m in (roles, differs))
            bad = C.flat([] if bad is None else bad).astype(bool)[: len(vals)]  # a bool per cell, False past its end
            rows.append((f"{label}  {shape}", vals, row_roles, np.pad(bad, (0, len(vals) - len(bad)))))
    legend = bool(roles or differs) if legend is None else legend
    width = min(max_cells, max([1] + [len(r[1]) for r in rows]))
    # size the figure so that a cell stays ~0.42 in wide whatever the label / scalar lengths
    label_in = 0.062 * max([len(r[0]) for r in rows] + [0]) + 0.2
    scalar_in = 0.068 * max([len(t) for t, _ in scalars] + [0])
    span = max(width, -(-scalar_in // 0.42), 3)  # axes width in cells (scalars may be longer)
    height = 0.42 * len(rows) + 0.28 * len(scalars) + 0.9 + 0.45 * legend
    fig = Figure(figsize=(label_in + 0.42 * span + 0.3, height), layout="constrained")
    ax = fig.add_subplot(xlim=(-0.5, span - 0.5), ylim=(len(rows) - 0.5 + 0.7 * len(scalars), -0.5))
    C.bare_axes(ax)
    used_roles = set()
    for y, (_, vals, row_roles, bad) in enumerate(rows):
        for x in range(min(len(vals), max_cells)):
            if x == max_cells - 1 < len(vals) - 1:  # the last cell drawn: how many more (marked if any differs)
                C.cell(ax, x, y, C.UNUSED_COLOR, f"+{len(vals) - x}", fontsize=7, lw=1.0)
                bad[x] = bad[x:].any()
            else:
                role = "value" if row_roles is None else row_roles[x] if x < len(row_roles) else "unread"
                used_roles.add(role)
                C.role_cell(ax, x, y, role, C.fmt(vals[x]), fontsize=7, lw=1.0)
            if bad[x]:
                C.differs_mark(ax, x, y)
    C.yticks(ax, [r[0] for r in rows], 8)
    ticks = range(0, width, 4 if width > 12 else 1)
    ax.set_xticks(ticks, ticks, fontsize=6)
    ax.xaxis.tick_top()
    for k, (text, flag) in enumerate(scalars):  # a differing scalar in bold red
        style = dict(color=C.BAD_COLOR, fontweight="bold") if flag else {}
        ax.text(-0.5, len(rows) - 0.1 + 0.7 * k, text, va="center", fontsize=8, family="monospace", **style)
    if title:
        ax.set_title(title, fontsize=9, pad=14)
    if legend:
        handles = C.role_handles(used_roles) if roles else []
        C.legend(fig, handles + [C.differs_handle(differs_label)] * bool(differs))
    return fig


def draw_state_diff(
    first: State,
    second: State,
    *,
    labels: tuple[str, str] = ("after the capture path", "after the replay path"),
    keys: Sequence[str] | None = None,
    roles: Mapping[str, Sequence] | None = None,
    title: str = "",
    legend: bool = True,
) -> Figure:
    """Two states of the same buffers (e.g. the ``graph_state`` the capture path and the replay path left) through
    ``draw_buffers``: every differing cell or scalar (a shape mismatch: every cell) is marked red in both rows, the
    title counts them. ``keys``: which, in order (default: all, sorted); ``roles``: per key, as in ``draw_buffers``;
    ``legend=False``: no colour legend (a notebook that explained the colours before)."""
    state, marks, row_roles, total, roles = {}, {}, {}, 0, roles or {}
    for key in sorted({*first, *second}) if keys is None else keys:
        a, b = first.get(key), second.get(key)  # bads: a bool per cell of each tensor, or one bool per scalar
        tensors = isinstance(a, torch.Tensor), isinstance(b, torch.Tensor)
        if all(tensors) and a.numel() == b.numel():
            a_, b_ = C.flat(a), C.flat(b)
            bads = ((a_ != b_) & ~(np.isnan(a_) & np.isnan(b_)),) * 2  # NaN == NaN here
        elif any(tensors):  # shapes or kinds disagree: every cell
            bads = [np.ones(v.numel(), bool) if isinstance(v, torch.Tensor) else True for v in (a, b)]
        else:  # scalars (or a key one side lacks)
            bads = (bool(a != b),) * 2
        total += max(map(np.sum, bads))  # the differing cells of the longer side
        for lab, v, bad in zip(labels, (a, b), bads):
            name = f"{key}: {lab}"
            state[name] = v.detach().reshape(-1) if isinstance(v, torch.Tensor) else ("(not set)" if v is None else v)
            marks[name] = bad
            if key in roles:
                row_roles[name] = roles[key]
    summary = f"{total} cell(s) differ" if total else "no cell differs"
    return draw_buffers(
        state,
        f"{title}\n{summary}" if title else summary,
        roles=row_roles,
        differs=marks,
        differs_label=f"differs: {labels[0]} vs {labels[1]}",
        legend=legend,
    )
