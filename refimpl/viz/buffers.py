"""Buffers drawn: CSR ``kv_indices``, block tables, the tree mask, 1-D buffers and their diffs, sizes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from . import cells as C

OWNER_COLORS = ["#6baed6", "#fd8d3c", "#74c476", "#9e9ac8", "#bdbdbd"]  # draw_buffer_sizes' bars


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
    r2t, rpi = C.to_numpy(req_to_token), C.to_numpy(req_pool_indices).reshape(-1)  # [pool, L], [bs]
    lens, indptr = C.to_numpy(seq_lens_or_kv_lens).reshape(-1), C.to_numpy(kv_indptr).reshape(-1)  # [bs], [bs+1]
    idx = C.to_numpy(kv_indices).reshape(-1)  # [>= total]
    bs, L = rpi.shape[0], r2t.shape[1]
    if lens.shape[0] != bs or indptr.shape[0] != bs + 1:
        got = f"got {lens.shape[0]} and {indptr.shape[0]}"
        raise ValueError(f"draw_csr: {bs} requests need {bs} lengths and {bs + 1} kv_indptr entries, {got}")
    total = int(indptr[-1])
    if idx.shape[0] < total:
        raise ValueError(f"draw_csr: kv_indices has {idx.shape[0]} entries < kv_indptr[-1]={total}")
    rows = r2t[rpi]  # [bs, L]
    nz = np.nonzero(rows.any(0))[0]
    ncols = int(min(L, max(int(lens.max(initial=1)), int(nz[-1]) + 1 if nz.size else 1)))
    expected = np.concatenate([rows[i, : lens[i]] for i in range(bs)] + [np.zeros(0, np.int64)])
    wrap = max(ncols, 8)  # strip cells per line: the same cell size as the rows above
    lines = max(1, -(-total // wrap))
    fig = Figure(figsize=(wrap * C.CELL_IN + 1.8, (bs + 2 * lines) * C.CELL_IN + 1.4), layout="constrained")
    gs = fig.add_gridspec(2, 1, height_ratios=[bs + 0.6, 2 * lines + 0.4])
    top, bot = fig.add_subplot(gs[0]), fig.add_subplot(gs[1])
    C.grid_axes(top, wrap, bs)  # top: the batch's req_to_token rows, the prefix the CSR packs framed
    labels = []
    for i in range(bs):
        pad = int(rpi[i]) == 0
        for j in range(ncols):
            color, ink = (C.owner_color(i, pad), "black") if j < lens[i] else (C.UNUSED_COLOR, "#969696")
            C.cell(top, j, i, color, C.fmt(rows[i, j]), fontsize=5.5, text_color=ink)
        if lens[i] > 0:
            C.frame(top, 0, i, int(lens[i]), 1, "#e6550d" if pad else "#08519c", lw=1.8)
        labels.append(f"{'pad' if pad else f'req {i}'}: row {int(rpi[i])}, len {int(lens[i])}")
    top.set_yticks(range(bs), labels, fontsize=7)
    top.set_xticks(range(0, ncols, 5), [str(j) for j in range(0, ncols, 5)], fontsize=6)
    top.xaxis.tick_top()
    top.set_title("req_to_token[req_pool_indices]  (framed: the prefix the CSR packs)", fontsize=8)
    C.grid_axes(bot, wrap, 2 * lines)  # bottom: kv_indices wrapped at ``wrap`` cells, the kv_indptr boundaries
    owner = np.searchsorted(indptr, np.arange(total), side="right") - 1  # [total] request
    bad = 0
    for p in range(total):
        x, y, i = p % wrap, 2 * (p // wrap) + 1, int(owner[p])
        C.cell(bot, x, y, C.owner_color(i, int(rpi[i]) == 0), C.fmt(idx[p]), fontsize=5.5)
        if p >= expected.shape[0] or idx[p] != expected[p]:
            bad += 1
            C.frame(bot, x, y)
    for p in sorted(set(indptr.tolist())):  # an empty request repeats a boundary: draw it once
        line = min(p // wrap, lines - 1) if p < total or p % wrap else max(p // wrap - 1, 0)
        x, y = p - line * wrap - 0.5, 2 * line + 1
        bot.plot([x, x], [y - 0.75, y + 0.5], color=C.INDPTR_COLOR, lw=1.4)
        bot.text(x, y - 0.8, str(p), ha="center", va="bottom", fontsize=6, color=C.INDPTR_COLOR, gid="kv_indptr")
    spans = [f"kv_indices[{k * wrap}:{min((k + 1) * wrap, total)}]" for k in range(lines)]
    bot.set_yticks([2 * k + 1 for k in range(lines)], spans, fontsize=7)
    bot.set_xticks([])
    note = f"; {bad} entries differ from req_to_token!" if bad or total != expected.size else ""
    bot.set_title(f"kv_indices (packed; red marks: kv_indptr = {indptr.tolist()}){note}", fontsize=8)
    C.suptitle(fig, title)
    if legend:
        live = [i for i in range(bs) if int(rpi[i]) != 0]
        handles = [C.role_handle(i, f"request {i}") for i in live] + [C.role_handle("pad")] * (len(live) < bs)
        handles.append(C.role_handle("unread", "in req_to_token, not packed (past the length)"))
        handles.append(Line2D([], [], color=C.INDPTR_COLOR, lw=1.4, label="kv_indptr boundary"))
        C.legend(fig, handles + [C.differs_handle("differs from req_to_token")] * (bad > 0), max_cols=6)
    return fig


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
    """Per request two rows, one cell per page p: what it should hold (``req_to_token[rpi[i], p*P] // P``) and what
    ``block_table[i, p]`` holds; pages never read (from ``cdiv(lens[i], P)``) grey, read entries that disagree framed
    red and counted in the title. At most ``max_pages`` columns."""
    r2t, rpi = C.to_numpy(req_to_token), C.to_numpy(req_pool_indices).reshape(-1)
    lens, table = C.to_numpy(lens).reshape(-1), C.to_numpy(block_table)
    bs, P, pages = rpi.shape[0], int(page_size), min(table.shape[1], max_pages)
    fig = Figure(figsize=(pages * C.CELL_IN * 1.6 + 2.6, 2 * bs * C.CELL_IN + 1.2), layout="constrained")
    ax = fig.add_subplot()
    C.grid_axes(ax, pages, 2 * bs)
    bad, labels = 0, []
    for i in range(bs):
        read, pad = -(-int(lens[i]) // P), int(rpi[i]) == 0
        for p in range(pages):
            live = p < read
            want = int(r2t[rpi[i], min(p * P, r2t.shape[1] - 1)]) // P
            color = C.owner_color(i, pad) if live else C.UNUSED_COLOR
            C.cell(ax, p, 2 * i, color, str(want) if live else "")
            C.cell(ax, p, 2 * i + 1, color, C.fmt(table[i, p]))
            if live and int(table[i, p]) != want:
                bad += 1
                C.frame(ax, p, 2 * i + 1)
        who = "pad" if pad else f"req {i}"
        labels += [f"{who}: r2t[row {int(rpi[i])}, p*{P}] // {P}", f"block_table[{i}], len {int(lens[i])}"]
    ax.set_yticks(range(2 * bs), labels, fontsize=7)
    ax.set_xticks(range(pages), [f"p{p}" for p in range(pages)], fontsize=6)
    ax.xaxis.tick_top()
    more = f" (first {pages} of {table.shape[1]} pages)" if table.shape[1] > pages else ""
    warn = f"; {bad} read entries differ!" if bad else ""
    ax.set_title(f"page size {P}: grey = never read by the kernel{more}{warn}", fontsize=8)
    C.suptitle(fig, title)
    return fig


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
    """Request ``request``'s ``[N, seq + N]`` block of a flat target-verify ``custom_mask`` (``mask_indptr``:
    ``refimpl.layout.mask_indptr``): prefix columns light blue, tree cells dark where 1. With ``parents``: the tree on
    the right, rows labelled by depth, cells against its ancestry framed red. Axes: 1 (2 with ``parents``). Texts: N*N
    in the mask axes, N node labels in the tree axes."""
    mask = C.to_numpy(custom_mask).reshape(-1).astype(bool)  # [>= total]
    indptr = C.to_numpy(mask_indptr).reshape(-1)  # [bs+1]
    steps = np.diff(indptr)
    if indptr.size < 2 or indptr[0] != 0 or (steps % N != 0).any() or (steps // N < N).any():
        raise ValueError(f"draw_tree_mask: mask_indptr={indptr.tolist()} is not [0, cumsum(N*(seq+N))] for N={N}")
    if not 0 <= request < indptr.shape[0] - 1:
        raise ValueError(f"draw_tree_mask: request {request} outside [0, {indptr.shape[0] - 1})")
    start, end = int(indptr[request]), int(indptr[request + 1])
    width = (end - start) // N
    if end > mask.shape[0]:
        raise ValueError(f"draw_tree_mask: mask has {mask.shape[0]} entries < {end} needed")
    if parents is not None and len(parents) != N:
        raise ValueError(f"draw_tree_mask: {len(parents)} parents for N={N}")
    tree_w = 0.0 if parents is None else 2.6 + 0.4 * max(C.depths(parents))
    fig = Figure(figsize=(width * C.CELL_IN + 1.8 + tree_w, N * C.CELL_IN + 1.6), layout="constrained")
    gs = fig.add_gridspec(1, 2, width_ratios=[width * C.CELL_IN + 1.0, tree_w]) if parents is not None else None
    ax = fig.add_subplot(1, 1, 1) if gs is None else fig.add_subplot(gs[0])
    block, seq, bad = mask[start:end].reshape(N, width), width - N, 0  # [N, seq+N]
    anc = C.ancestry(parents) if parents is not None else None  # [N, N]
    C.grid_axes(ax, width, N)
    for q in range(N):
        for c in range(width):
            on = bool(block[q, c])
            if c < seq:
                C.cell(ax, c, q, C.PREFIX_COLOR if on else C.UNUSED_COLOR)
                bad += int(not on)
                continue
            face, ink = (C.TREE_ON_COLOR, "white") if on else ("white", "#636363")
            C.cell(ax, c, q, face, str(int(on)), fontsize=6, edge="#bdbdbd", text_color=ink)
            if anc is not None and on != bool(anc[q, c - seq]):
                bad += 1
                C.frame(ax, c, q)
    ax.axvline(seq - 0.5, color="black", lw=1.2)
    names = [f"prefix: {seq} columns (all 1)", f"tree: {N} columns"]
    ax.set_xticks([seq / 2 - 0.5, seq + N / 2 - 0.5], names, fontsize=7)
    depths = [f" (depth {d})" for d in C.depths(parents)] if parents is not None else [""] * N
    ax.set_yticks(range(N), [f"draft {q}{depths[q]}" for q in range(N)], fontsize=7)
    note = f"; {bad} cells disagree with the tree!" if bad else ""
    ax.set_title(f"request {request}: custom_mask[{start}:{end}]\nas [N={N}, seq+N={width}]{note}", fontsize=8)
    if gs is not None:  # the draft tree on the right, depth left to right
        ax, slots, top = fig.add_subplot(gs[1]), C.tree_slots(parents), max(C.depths(parents))
        pos = {q: (d, r - (n - 1) / 2) for q, (d, r, n) in slots.items()}
        for q, p in enumerate(parents):
            if p >= 0:
                ax.plot(*zip(pos[p], pos[q]), color="#636363", lw=1.0, zorder=1)
        xs, ys = zip(*(pos[q] for q in range(len(parents))))
        ax.scatter(xs, ys, s=260, facecolor="white", edgecolor=C.TREE_ON_COLOR, lw=1.5, zorder=2)
        for q in range(len(parents)):
            ax.text(*pos[q], str(q), ha="center", va="center", fontsize=8, zorder=3)
        span = max(n for _, _, n in slots.values())
        ax.set(xlim=(-0.5, top + 0.5), ylim=(span / 2 + 0.1, -span / 2 - 0.1), yticks=[])
        ax.set_xticks(range(top + 1), [f"d{d}" for d in range(top + 1)], fontsize=7)
        C.bare_axes(ax)
        ax.set_title(f"tree: parents = {list(parents)}", fontsize=8)
    C.suptitle(fig, title)
    if legend:
        handles = [
            Patch(facecolor=C.PREFIX_COLOR, edgecolor="white", label="prefix column: always 1"),
            Patch(facecolor=C.TREE_ON_COLOR, edgecolor="#bdbdbd", label="1: draft q attends it"),
            Patch(facecolor="white", edgecolor="#bdbdbd", label="0: masked"),
        ]
        C.legend(fig, handles + [C.differs_handle("disagrees with the tree")] * bool(bad))
    return fig


def _lookup(mapping: Mapping | None, name: str, i: int | None = None):
    """``mapping[name]``; for row i of a 2-D buffer ``mapping["name[i]"]`` or ``mapping[name][i]``; None if absent."""
    mapping = mapping or {}
    if i is not None and f"{name}[{i}]" in mapping:
        return mapping[f"{name}[{i}]"]
    whole = mapping.get(name)
    return whole if whole is None or i is None else whole[i]


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
    """1-D buffers as rows of annotated cells (a 2-D one: a row ``name[i]`` per index; past ``max_cells``: a ``+k`` cell),
    scalars as ``name = value`` text. ``roles``: per name, each cell's colour role (``batch_roles`` / ``segment_roles``;
    ``"name[i]"`` or per-row lists for 2-D). ``differs``: per name, a bool per cell (True for a scalar): marked red (gid
    ``"differs"``), ``differs_label`` in the legend. ``legend``: by default when ``roles`` or ``differs`` is given."""
    rows: list[tuple[str, np.ndarray, str, Sequence | None, np.ndarray]] = []  # label, values, shape, roles, differs
    scalars: list[tuple[str, str, bool]] = []
    for name, v in state.items():
        if not (isinstance(v, torch.Tensor) and v.dim() >= 1):
            val = v.item() if isinstance(v, torch.Tensor) else v
            scalars.append((name, val if isinstance(val, str) else C.fmt(val), (differs or {}).get(name) is True))
            continue
        if v.dim() > 2:
            raise ValueError(f"draw_buffers: {name} has {v.dim()} dims (1-D or 2-D only)")
        shape = f"{list(v.shape)} {str(v.dtype).replace('torch.', '')}"
        parts = [(name, v, None)] if v.dim() == 1 else [(f"{name}[{i}]", v[i], i) for i in range(v.shape[0])]
        for label, part, i in parts:
            vals, bad = C.to_numpy(part), _lookup(differs, name, i)  # bad: a bool per cell, False past its end
            bad = C.to_numpy(bad if bad is not None else []).reshape(-1).astype(bool)[: len(vals)]
            rows.append((label, vals, shape, _lookup(roles, name, i), np.pad(bad, (0, len(vals) - len(bad)))))
    legend = bool(roles) or bool(differs) if legend is None else legend
    width = max([min(r[1].shape[0], max_cells) for r in rows] + [1])
    labels = [f"{label}  {shape}" for label, _, shape, _, _ in rows]
    # size the figure so that a cell stays ~0.42 in wide whatever the label / scalar lengths
    label_in = 0.062 * max([len(s) for s in labels] + [0]) + 0.2
    scalar_in = 0.068 * max([len(f"{nm} = {v}") for nm, v, _ in scalars] + [0])
    span = max(width, -(-scalar_in // 0.42), 3)  # axes width in cells (scalars may be longer)
    height = 0.42 * len(rows) + 0.28 * len(scalars) + 0.9 + (0.45 if legend else 0.0)
    fig = Figure(figsize=(label_in + 0.42 * span + 0.3, height), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    ax.set(xlim=(-0.5, span - 0.5), ylim=(len(rows) - 0.5 + 0.7 * len(scalars), -0.5))
    C.bare_axes(ax)
    used_roles: set = set()
    for y, (_, vals, _, row_roles, bad) in enumerate(rows):
        n = vals.shape[0]
        shown = n if n <= max_cells else max_cells - 1
        for x in range(shown):
            role = "value" if row_roles is None else row_roles[x] if x < len(row_roles) else "unread"
            face, hatch, edge, ink = C.role_style(role)
            used_roles.add(role)
            C.cell(ax, x, y, face, C.fmt(vals[x]), fontsize=7, edge=edge, lw=1.0, hatch=hatch, text_color=ink)
            if bad[x]:
                C.differs_mark(ax, x, y)
        if shown < n:
            C.cell(ax, shown, y, C.UNUSED_COLOR, f"+{n - shown}", fontsize=7, edge="white", lw=1.0)
            if bad[shown:].any():
                C.differs_mark(ax, shown, y)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    step = 4 if width > 12 else 1
    ax.set_xticks(range(0, width, step), [str(i) for i in range(0, width, step)], fontsize=6)
    ax.xaxis.tick_top()
    for k, (name, val, flag) in enumerate(scalars):  # a differing scalar in bold red
        style = dict(fontsize=8, family="monospace") | (dict(color=C.BAD_COLOR, fontweight="bold") if flag else {})
        ax.text(-0.5, len(rows) - 0.1 + 0.7 * k, f"{name} = {val}", ha="left", va="center", **style)
    if title:
        ax.set_title(title, fontsize=9, pad=14)
    if legend:
        ints = sorted({int(r) for r in used_roles if not isinstance(r, str)})  # live requests, then named roles
        handles = [C.role_handle(r) for r in ints + [r for r in C.ROLES if r in used_roles]] if roles else []
        C.legend(fig, handles + [C.differs_handle(differs_label)] * bool(differs))
    return fig


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
    legend: bool = True,
) -> Figure:
    """Two states of the same buffers (e.g. the ``graph_state`` the capture path and the replay path left) through
    ``draw_buffers``: every differing cell or scalar (a shape mismatch: every cell) is marked red in both rows, the
    title counts them. ``keys``: which, in order (default: all, sorted); ``roles``: per key, as in ``draw_buffers``;
    ``legend=False``: no colour legend (a notebook that explained the colours before)."""
    keys = list(keys) if keys is not None else sorted(set(first) | set(second))
    state, marks, row_roles, total = {}, {}, {}, 0
    for key in keys:
        a, b = first.get(key), second.get(key)  # bads: a bool per cell of each tensor, or one bool per scalar
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.numel() == b.numel():
            a_, b_ = a.detach().cpu().reshape(-1), b.detach().cpu().reshape(-1)
            bad = (a_ != b_) & ~(a_.isnan() & b_.isnan()) if a_.is_floating_point() else a_ != b_
            bads = (bad.numpy(), bad.numpy())
        elif isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):  # shapes or kinds disagree: every cell
            bads = [np.ones(v.numel(), bool) if isinstance(v, torch.Tensor) else True for v in (a, b)]
        else:  # scalars (or a key one side lacks)
            bads = (bool(a != b),) * 2
        total += max(int(np.sum(bad)) for bad in bads)  # the differing cells of the longer side
        for lab, v, bad in zip(labels, (a, b), bads):
            name = f"{key}: {lab}"
            state[name] = v.detach().reshape(-1) if isinstance(v, torch.Tensor) else ("(not set)" if v is None else v)
            marks[name] = bad
            if roles and key in roles:
                row_roles[name] = roles[key]
    summary = f"{total} cell(s) differ" if total else "no cell differs"
    label = differs_label or f"differs: {labels[0]} vs {labels[1]}"
    style = dict(max_cells=max_cells, roles=row_roles or None, differs=marks, differs_label=label, legend=legend)
    return draw_buffers(state, f"{title}\n{summary}" if title else summary, **style)


def draw_buffer_sizes(
    sizes: Mapping[str, Mapping[str, int]],
    *,
    notes: Mapping[str, Mapping[str, str]] | None = None,
    needed: Mapping[str, tuple[int, str]] | None = None,
    title: str = "",
) -> Figure:
    """Allocated entries of the same buffers in several backends: a panel per buffer, a bar per owner
    (``sizes[buffer][owner]``), ``notes[buffer][owner]`` after it (gid ``"note"``). ``needed[buffer] = (entries, what
    needs them)``: a dashed line (gid ``"need"``); a shorter bar is framed red, "too small"."""
    notes, needed = notes or {}, needed or {}
    owners = list(dict.fromkeys(o for per in sizes.values() for o in per))
    color = {o: OWNER_COLORS[k % len(OWNER_COLORS)] for k, o in enumerate(owners)}
    heights = [len(per) for per in sizes.values()]
    fig = Figure(figsize=(9.0, sum(0.32 * h + 0.55 for h in heights) + 0.9), layout="constrained")
    axes = fig.subplots(len(sizes), 1, squeeze=False, height_ratios=[h + 1.2 for h in heights])
    short = False
    for ax, (buf, per) in zip(axes[:, 0], sizes.items()):  # a buffer's bars against its need
        need = needed.get(buf)
        top = max(list(per.values()) + [need[0] if need else 0])
        for y, (owner, n) in enumerate(per.items()):
            ax.barh(y, n, color=color[owner], height=0.62, edgecolor="white")
            note = f" {notes.get(buf, {}).get(owner, n)}"
            t = ax.text(n + top * 0.01, y, note, va="center", fontsize=7, gid="note", family="monospace")
            if need and n < need[0]:
                short = True
                ax.add_patch(Rectangle((0, y - 0.31), n, 0.62, fill=False, edgecolor=C.BAD_COLOR, lw=1.8, zorder=3))
                t.update(dict(text=t.get_text() + "  too small", color=C.BAD_COLOR, gid="too_small"))
        if need:
            ax.axvline(need[0], color="black", ls="--", lw=1.0)
            ax.text(need[0], -0.55, f" {need[1]}: {need[0]}", fontsize=7, va="bottom", ha="left", gid="need")
        ax.set(xlim=(0, top * 1.75), ylim=(len(per) - 0.5, -0.5 - (0.9 if need else 0.3)))
        ax.set_yticks(range(len(per)), list(per), fontsize=8)
        ax.set_title(buf, loc="left", fontsize=8.5, family="monospace")
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(axis="x", alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
    axes[-1, 0].set_xlabel("entries allocated (each panel its own scale)", fontsize=8)
    handles = [Patch(facecolor=color[o], label=o) for o in owners]
    handles += [Line2D([], [], color="black", ls="--", lw=1.0, label="entries a batch needs")] * bool(needed)
    handles += [Patch(facecolor="none", edgecolor=C.BAD_COLOR, lw=1.8, label="too small for that batch")] * short
    C.legend(fig, handles, max_cols=5)
    C.suptitle(fig, title)
    return fig
