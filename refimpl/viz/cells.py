"""What the figures draw with: colours with a meaning (``ROLE_LABELS``), legends, cells, frames, draft-tree shapes;
``save``."""

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from ..spec import DraftTree

REQ_COLORS = ["#9ecae1", "#a1d99b", "#cbc9e2", "#fbb4c4", "#99d8c9", "#fee391", "#d9d9d9"]
PAD_COLOR = "#ffba73"
UNUSED_COLOR = "#f0f0f0"
DRAFT_COLOR = "#fc9272"
TREE_ON_COLOR = "#3182bd"
PREFIX_COLOR = "#c6dbef"  # a tree mask's prefix column (always 1)
BAD_COLOR = "#d62728"
INDPTR_COLOR = "#a50f15"
DIFF_HATCH_COLOR = "#f4a582"  # the hatch over a cell that differs (its frame: BAD_COLOR)

CELL_IN = 0.3  # inches per cell in the grid figures

# a named cell role -> (legend text, face, hatch, edge, text colour); an int role i: live request i (its colour).
# "value": a value with no per-request meaning (an indptr's end, a count); "stale" (cross-hatched): a value some reader
# would see, left by an older batch
ROLES = {
    "pad": ("padded row (request slot 0, seq_len 1)", PAD_COLOR, None, "white", "black"),
    "value": ("other value (e.g. an indptr's end)", "#ffffff", None, "#bdbdbd", "black"),
    "stale": ("stale: left by an earlier batch / the capture", "#bdbdbd", "xx", "white", "black"),
    "unread": ("past the live part: not read", UNUSED_COLOR, None, "white", "#969696"),
}
ROLE_LABELS = {role: style[0] for role, style in ROLES.items()}  # what a cell's colour means


def to_numpy(x: torch.Tensor | Sequence | np.ndarray) -> np.ndarray:
    """Host numpy copy of a tensor / list (bool kept, floats as float64, integers as int64)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        x = x if x.dtype == torch.bool else x.to(torch.float64 if x.is_floating_point() else torch.int64)
    return np.asarray(x)


def flat(x: torch.Tensor | Sequence | np.ndarray) -> np.ndarray:  # ``to_numpy(x)``, 1-D
    return to_numpy(x).reshape(-1)


def role_style(role) -> tuple[str, str | None, str, str]:
    """(face colour, hatch, edge colour, text colour) of a cell role (an int or a ``ROLE_LABELS`` key)."""
    if isinstance(role, (int, np.integer)) and not isinstance(role, bool):
        return REQ_COLORS[role % len(REQ_COLORS)], None, "white", "black"
    if isinstance(role, str) and role in ROLES:
        return ROLES[role][1:]
    raise ValueError(f"unknown cell role {role!r}: an int (live request), {sorted(ROLE_LABELS)}")


def role_handles(roles, live: str = "live request {}", **labels: str) -> list[Patch]:
    """Legend handles of the cell ``roles`` used: live requests in order (``live`` names them), then the named roles in
    ``ROLES`` order (their ``ROLE_LABELS``, or ``labels[role]``)."""
    labels, out = {**ROLE_LABELS, **labels}, []
    for r in sorted({r for r in roles if not isinstance(r, str)}) + [r for r in ROLES if r in roles]:
        face, hatch, edge, _ = role_style(r)
        out.append(swatch(face, "#969696" if edge == "white" else edge, labels.get(r, live.format(r)), hatch=hatch, lw=0.6))
    return out


def swatch(face: str, edge: str, label: str, **style) -> Patch:  # a legend entry: a patch of these colours
    return Patch(facecolor=face, edgecolor=edge, label=label, **style)


_DIFFERS = dict(edgecolor=BAD_COLOR, hatch="//", hatchcolor=DIFF_HATCH_COLOR)  # a differing cell's mark


def differs_handle(label: str) -> Patch:
    return Patch(facecolor="none", lw=1.5, label=label, **_DIFFERS)


def legend(fig: Figure, handles: list, max_cols: int = 4) -> None:
    """One legend under the axes, at most ``max_cols`` columns (the figure must use the constrained layout)."""
    if handles:
        fig.legend(
            handles=handles,
            ncols=min(len(handles), max_cols),
            loc="outside lower center",
            fontsize=7,
            frameon=False,
            handlelength=1.6,
            columnspacing=1.4,
        ).set_gid("legend")


def suptitle(fig: Figure, title: str) -> None:
    if title:
        fig.suptitle(title, fontsize=10)


def batch_roles(n: int, live: int, bs: int | None = None, *, indptr: bool = False) -> list:
    """Colour roles of the first ``n`` entries of a per-request buffer (``seq_lens``, ``num_kv_splits``): live request i
    for ``i < live``, padded for ``live <= i < bs`` (``bs`` defaults to ``live``), unread past ``bs``. ``indptr=True``
    (``[bs+1]`` buffers such as ``kv_indptr``): entry ``bs`` (the total) is a plain value."""
    bs = live if bs is None else bs
    if not 0 <= live <= bs:
        raise ValueError(f"batch_roles: need 0 <= live={live} <= bs={bs}")
    return [i if i < live else "pad" if i < bs else "value" if indptr and i == bs else "unread" for i in range(n)]


def segment_roles(indptr: torch.Tensor | Sequence[int], live: int, n: int) -> list:
    """Colour roles of the first ``n`` entries of a packed buffer (``kv_indices``, a flat mask): entry p belongs to request
    i with ``indptr[i] <= p < indptr[i+1]`` (padded for ``i >= live``); entries at or past ``indptr[-1]`` are unread."""
    ptr = flat(indptr).astype(np.int64)
    owner = np.searchsorted(ptr, np.arange(n), side="right") - 1
    end = ptr[-1] if ptr.size else 0
    return ["unread" if p >= end else int(owner[p]) if owner[p] < live else "pad" for p in range(n)]


def cell(ax, x, y, color, text=None, *, fontsize=5.5, edge="white", lw=0.6, hatch=None, text_color="black", size=1):
    """One square cell (``size`` wide, a unit by default) centred on (x, y), optionally with a centred text."""
    ax.add_patch(Rectangle((x - size / 2, y - size / 2), size, size, facecolor=color, edgecolor=edge, lw=lw, hatch=hatch))
    if text is not None:
        ax.text(x, y, text, ha="center", va="center", fontsize=fontsize, color=text_color)


def role_cell(ax, x, y, role, text=None, **style):
    """A ``cell`` in the colours of a cell role (``role_style``)."""
    face, hatch, edge, ink = role_style(role)
    cell(ax, x, y, face, text, edge=edge, hatch=hatch, text_color=ink, **style)


def frame(ax, x0, y0, w=1, h=1, color=BAD_COLOR, lw=1.5):
    """An unfilled rectangle around cells x0..x0+w-1, y0..y0+h-1 (by default: red, a wrong value)."""
    ax.add_patch(Rectangle((x0 - 0.5, y0 - 0.5), w, h, fill=False, edgecolor=color, lw=lw, zorder=3))


def differs_mark(ax, x, y) -> None:
    """A red frame and hatch over cell (x, y) (gid ``"differs"``); the cell's text turns bold, on top."""
    ax.add_patch(Rectangle((x - 0.46, y - 0.46), 0.92, 0.92, fill=False, lw=2.0, zorder=2.5, gid="differs", **_DIFFERS))
    for t in ax.texts[::-1]:  # the cell's own text: the last one drawn there
        if t.get_position() == (x, y):
            t.set(fontweight="bold", zorder=4)
            break


def grid_axes(ax, width: int, height: int) -> None:
    """Axes of ``width`` x ``height`` unit cells, row 0 on top."""
    ax.set(xlim=(-0.5, width - 0.5), ylim=(height - 0.5, -0.5), aspect="equal")
    bare_axes(ax)


def yticks(ax, labels: Sequence[str], fontsize: float = 7) -> None:  # a labelled tick per row 0, 1, ...
    ax.set_yticks(range(len(labels)), labels, fontsize=fontsize)


def bare_axes(ax) -> None:  # no spines, no tick marks
    ax.spines[:].set_visible(False)
    ax.tick_params(length=0)


def fmt(v) -> str:
    return f"{v:.3g}" if isinstance(v, (float, np.floating)) else str(int(v))


# draft trees: ``parents[q]`` is node q's parent, -1 for the root (node 0); ``DraftTree`` checks and walks them
def depths(parents: Sequence[int]) -> list[int]:
    return DraftTree(parents).depths()


def tree_slots(parents: Sequence[int]) -> dict[int, tuple[int, int, int]]:
    """Node q -> (its depth d, its rank among the nodes at depth d, their count)."""
    d = depths(parents)
    return {q: (d[q], d[:q].count(d[q]), d.count(d[q])) for q in range(len(d))}


def ancestry(parents: Sequence[int]) -> np.ndarray:  # [N, N] bool: node k is q or one of its ancestors
    return DraftTree(parents).ancestry_mask().numpy()


def save(fig: Figure, path: str | Path) -> Path:
    """``fig.savefig(path, dpi=110, bbox_inches="tight")`` without a software tag; makes dirs."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    return path
