"""Speculative decoding drawn: one EAGLE iteration and its graph modes, multi-step draft decode's indices."""

from collections.abc import Sequence

import torch
from matplotlib.figure import Figure
from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch

from . import cells as C

# a token's part in the iteration -> (colour, legend label), in legend order
EAGLE_PARTS = {
    "verified": ("#d9d9d9", "last verified token (tree root)"),
    "step0": ("#fdd0a2", "draft from step 0 (previous draft extend)"),
    "steps": (C.DRAFT_COLOR, "draft from steps 1..{last} (draft decode graph)"),
    "accepted": ("#74c476", "accepted draft"),
    "bonus": ("#fec44f", "bonus token (b)"),  # the target's own next token
    "rejected": ("#f0f0f0", "rejected draft / padding row (–)"),
}
_BADGE = dict(  # a graph-mode badge
    fontsize=7.5,
    family="monospace",
    va="center",
    gid="mode",
    bbox=dict(boxstyle="round,pad=0.25", fc="#f7fbff", ec="#08519c", lw=1.0),
)


def _node(ax, x, y, part, label):  # a token: a circle in the colour of its ``EAGLE_PARTS`` key (rejected: a grey label)
    ax.add_patch(Circle((x, y), 0.19, facecolor=EAGLE_PARTS[part][0], edgecolor="#525252", lw=0.8, zorder=2))
    ax.text(x, y, label, ha="center", va="center", fontsize=7, zorder=3, color="#969696" if part == "rejected" else "black")


def draw_eagle_iteration(
    parents: Sequence[int], accepted: Sequence[int], num_steps: int, topk: int, *, title: str = ""
) -> Figure:
    """One EAGLE iteration for one request: ① draft (multi-step draft decode), ② target verify, ③ accept, ④ draft extend
    (v1, v2), each with its graph mode (gid ``"mode"``) and rows per request; an IDLE band. ``parents``: the draft tree
    (``DraftTree.parents``, node 0 the last verified token); ``accepted``: the accepted drafts, a chain from a child of
    node 0; ``num_steps`` S; ``topk`` branches."""
    N, S, acc, depths = len(parents), int(num_steps), list(accepted), C.depths(parents)  # depths: checks the tree
    if max(depths) > S:
        raise ValueError(f"draw_eagle_iteration: tree depth {max(depths)} > num_steps={S}")
    chain = [0, *acc]
    if len(acc) > S or any(parents[b] != a for a, b in zip(chain, chain[1:])):
        raise ValueError(f"draw_eagle_iteration: accepted {acc} is not a chain from the root of length <= num_steps={S}")
    W, y0, bw, bh = 17.7, 1.35, 3.9, 6.1  # the figure's width (its height: 7.6); each step's box: bottom, width, height
    fig = Figure(figsize=(W, 8.1), layout="constrained")
    ax = fig.add_subplot(xlim=(0, W), ylim=(0, 7.6), aspect="equal")
    ax.axis("off")
    xs = [0.15 + k * (bw + 0.55) for k in range(4)]
    text = lambda x, y, s, size, va="center", **kw: ax.text(x, y, s, fontsize=size, va=va, **kw)  # centred by default

    def tree(x0, w, parts):
        """The tree in the box (x0, y0 + 1.55) w wide, 2.6 high, depth left to right: nodes q in the colour of ``parts[q]``
        (an ``EAGLE_PARTS`` key) over the edges (to an accepted node: thick green); returns their (x, y)."""
        pos = {
            q: (x0 + 0.3 + d * ((w - 0.6) / S), y0 + 1.55 + 2.6 * (r + 1) / (n + 1))
            for q, (d, r, n) in C.tree_slots(parents).items()
        }
        for q, par in enumerate(parents):
            _node(ax, *pos[q], parts[q], q)
            if q:
                accepted = parts[q] == "accepted"
                ax.plot(*zip(pos[par], pos[q]), zorder=1, color="#238b45" if accepted else "#636363", lw=1.6 if accepted else 0.9)
        return pos

    boxes = [  # per step: its name, its graph modes, rows per request, caption
        (
            "① draft",
            ["DECODE (multi-step draft)"],
            f"topk = {topk} rows per request per step\n(the graph sees bs·topk rows)",
            f"step 0's {topk} drafts come from the previous\ndraft extend; steps 1..{S - 1} run as {S - 1} decode\n"
            f"steps captured in one graph. The best\n{N - 1} drafts + the verified token\n"
            f"form the tree of N = {N} nodes.",
        ),
        (
            "② target verify",
            ["TARGET_VERIFY"],
            f"N = {N} rows per request (one per tree node)",
            "The target model scores every node in one\npass; the custom mask [N, prefix + N] lets a\n"
            "node see the prefix and its own ancestors.\nGraphs capture N rows per request.",
        ),
        (
            "③ accept",
            ["no graph of its own"],
            "runs on the verify logits",
            f"accept_length = {len(acc)}: the drafts accepted along\none chain (refimpl counts accepted drafts,\n"
            f"0..S). The target's own token after them\nis the bonus token: {len(acc) + 1} new tokens.",
        ),
        (
            "④ draft extend",
            ["DRAFT_EXTEND (v1)", "DRAFT_EXTEND_V2"],
            f"v1: S + 1 = {S + 1} rows per request\nv2: N = {N} rows per request",
            "The draft model runs over the new tokens\n(graph rows past them: rejected drafts,\n"
            "outputs dropped). Its output gives the next\niteration's step-0 drafts (back to ①).",
        ),
    ]
    for x, (head, modes, rows, caption) in zip(xs, boxes):
        ax.add_patch(
            FancyBboxPatch((x, y0), bw, bh, boxstyle="round,pad=0.02,rounding_size=0.15", fc="white", ec="#525252", lw=1.0)
        )
        text(x + 0.15, y0 + bh - 0.3, head, 10, fontweight="bold")
        for j, m in enumerate(modes):
            ax.text(x + 0.2, y0 + bh - 0.78 - 0.42 * j, m, **_BADGE)
        text(x + 0.15, y0 + bh - 0.9 - 0.42 * len(modes), rows, 7.5, "top")
        text(x + 0.15, y0 + 0.12, caption, 7, "bottom", color="#252525", linespacing=1.3)

    # ① draft: the tree the multi-step draft decode grows, node colours by the step that drafted it
    tree(xs[0], bw, [["verified", "step0", "steps"][min(d, 2)] for d in depths])
    for d in range(S + 1):
        text(
            xs[0] + 0.3 + d * (bw - 0.6) / S,
            y0 + 1.45,
            f"step {d - 1}" if d else "verified",
            6.5,
            "top",
            ha="center",
            color="#525252",
        )

    # ② target verify: the tree's ancestry mask after a few prefix columns
    anc, c = C.ancestry(parents), min(0.34, (bw - 1.0) / (N + 2.5))
    mx, my = xs[1] + 0.75, y0 + 1.55 + 2.45
    for q in range(N):  # row q at y
        y = my - q * c
        text(mx - 0.12, y, q, 6, ha="right")
        for j in (0.5, 1.5):
            C.cell(ax, mx + j * c, y, C.PREFIX_COLOR, lw=0.5, size=c)
        for k in range(N):
            C.cell(ax, mx + (k + 3) * c, y, C.TREE_ON_COLOR if anc[q, k] else "white", edge="#bdbdbd", lw=0.5, size=c)
    for x, head in ((mx + c, "prefix"), (mx + (2.5 + N / 2) * c, "tree (ancestry)")):
        text(x, my + c, head, 6, "bottom", ha="center")
    text(mx + 2.25 * c, my - 0.5 * c, "…", 7, ha="center")

    # ③ accept: the accepted chain, the rejected drafts dimmed, the bonus token after the chain
    parts = ["verified" if q == 0 else "accepted" if q in chain else "rejected" for q in range(N)]
    lx, ly = tree(xs[2], bw - 0.5, parts)[chain[-1]]
    bx = lx + (bw - 1.1) / S
    ax.plot([lx, bx], [ly, ly], color="#cc8400", ls="--", lw=1.2, zorder=1)
    _node(ax, bx, ly, "bonus", "b")

    # ④ draft extend: the rows v1 (S + 1) and v2 (N) lay out per request
    cells = [(f"n{q}", "accepted") for q in acc] + [("b", "bonus")] + [("–", "rejected")] * (N + S)  # text, part
    cw = min(0.45, (bw - 0.9) / max(N, S + 1))
    for yy, lab, n in ((y0 + 3.55, "v1", S + 1), (y0 + 2.55, "v2", N)):
        text(xs[3] + 0.2, yy, lab, 7.5)
        for r, (s, part) in enumerate(cells[:n]):
            C.cell(ax, xs[3] + 0.6 + (r + 0.5) * cw, yy, EAGLE_PARTS[part][0], s, fontsize=6.5, edge="#525252", size=cw)

    # arrows between the steps and back to ①; the IDLE band
    arrow, ym = dict(arrowstyle="-|>", mutation_scale=14), y0 + bh / 2
    for a, b in zip(xs, xs[1:]):
        ax.add_patch(FancyArrowPatch((a + bw + 0.05, ym), (b - 0.05, ym), color="#252525", lw=1.3, **arrow))
    yb, mid = y0 - 0.32, xs[0] + bw / 2  # back to ①, under the boxes
    ax.plot([xs[3] + bw / 2] * 2 + [mid], [y0 - 0.02, yb, yb], color="#525252", lw=1.1, ls="--")
    ax.add_patch(FancyArrowPatch((mid, yb), (mid, y0 - 0.02), color="#525252", lw=1.1, **arrow))
    text(
        W / 2,
        yb + 0.05,
        "next iteration: draft extend's output seeds step 0 of the next draft",
        7,
        "bottom",
        ha="center",
        color="#525252",
    )
    ax.add_patch(  # the IDLE band
        FancyBboxPatch(
            (0.15, 0.08), W - 0.3, 0.62, boxstyle="round,pad=0.02,rounding_size=0.12", fc="#fafafa", ec="#969696", lw=0.8
        )
    )
    ax.text(0.35, 0.39, "IDLE", **_BADGE)
    text(
        1.2,
        0.39,
        "a data-parallel rank with no requests still runs every step above (bs 0), so that the collectives of all "
        "ranks line up; under graphs it replays the smallest captured graph with every row padded.",
        7.5,
    )

    handles = [C.swatch(c, "#525252", lab.format(last=S - 1)) for c, lab in EAGLE_PARTS.values()]
    C.legend(fig, [*handles, C.swatch(C.TREE_ON_COLOR, "#bdbdbd", "mask: may attend")])
    fig.suptitle(
        title
        or f"One EAGLE iteration for one request: S = {S} steps, topk = {topk}, N = {N} draft tokens, accept_length = {len(acc)}",
        fontsize=11,
    )
    return fig


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
    """Per step i (an axes each), each (seq r, branch k) row of the draft-decode CSR (``kv_indptr`` ``[S, >= rows+1]``,
    ``kv_indices`` ``[S, W]``): ``seq_lens[r]`` prefix slots, then ``i + 1`` draft slots (red); rows of the wrong length
    framed red. ``used_steps``: later steps are filled but not read; ``live_seqs``: later sequences are padding. Texts:
    one per drawn ``kv_indices`` entry."""
    seq, full = C.flat(seq_lens), C.to_numpy(kv_indptr)  # [num_seqs], [S, >= rows+1]
    num_seqs, rows = len(seq), len(seq) * topk
    indptr, idx = full[:num_steps, : rows + 1], C.to_numpy(kv_indices)[:num_steps]  # [S, rows+1], [S, W]
    if indptr.shape != (num_steps, rows + 1):
        raise ValueError(
            f"draw_draft_decode_indices: kv_indptr needs [{num_steps}, >= {rows + 1}] for {num_seqs} seqs x "
            f"topk {topk}, got {full.shape}"
        )
    pmax, live = seq.max(initial=1), num_seqs if live_seqs is None else min(live_seqs, num_seqs)
    width = pmax + 1 + num_steps  # prefix area | gap | draft area
    fig = Figure(figsize=(width * C.CELL_IN + 2.2, num_steps * (rows * C.CELL_IN + 0.7) + 0.6), layout="constrained")
    for i in range(num_steps):  # step i's rows: prefix slots | gap | draft slots
        ax, labels, bad = fig.add_subplot(num_steps, 1, i + 1), [], 0
        C.grid_axes(ax, width, rows)
        for row in range(rows):
            r, k = divmod(row, topk)
            a, b = indptr[i, row : row + 2]
            n_pre, vals = seq[r], idx[i][a:b]
            for j, v in enumerate(vals[:n_pre]):
                C.role_cell(ax, j, row, r if r < live else "pad", C.fmt(v))
            for j in range(num_steps):
                if j <= i and n_pre + j < len(vals):
                    C.cell(ax, pmax + 1 + j, row, C.DRAFT_COLOR, C.fmt(vals[n_pre + j]))
                else:
                    C.cell(ax, pmax + 1 + j, row, "white", hatch="////", edge="#d9d9d9")
            if b - a != n_pre + i + 1:
                bad += 1
                C.frame(ax, 0, row, w=width)
            labels.append(f"{'seq' if r < live else 'pad'} {r} br {k}  [{a}:{b}]")
            if k == topk - 1 and row < rows - 1:
                ax.axhline(row + 0.5, color="black", lw=0.8)
        C.yticks(ax, labels)
        areas = [pmax / 2 - 0.5, pmax + 1 + (num_steps - 1) / 2]  # the middle of the prefix area | of the draft area
        ax.set_xticks(areas, [f"prefix slots (seq_lens, up to {pmax})", "draft slots"], fontsize=7)
        note = "  (filled, but no step backend reads it)" * (used_steps is not None and i >= used_steps)
        warn = f"  {bad} rows have the wrong length!" if bad else ""
        ax.set_title(
            f"step {i}: rows of prefix + {i + 1} draft slot(s), kv_indptr[{i}] = {indptr[i].tolist()}{note}{warn}", fontsize=7.5
        )
    C.suptitle(fig, title)
    handles = C.role_handles(
        [*range(live)] + ["pad"] * (live < num_seqs), "seq {}: prefix slots", pad="padded seq: prefix slot 0"
    )
    handles += [
        C.swatch(C.DRAFT_COLOR, "white", "draft slots (branch k)"),
        C.swatch("white", "#d9d9d9", "draft slot not yet written", hatch="////"),
    ]
    C.legend(fig, handles, max_cols=5)
    return fig
