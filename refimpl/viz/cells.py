"""The cell primitives every grid figure draws with: colours with a meaning (``ROLE_LABELS``),
roles, legends, cells and frames; ``save``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

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
    return Patch(facecolor=face, hatch=hatch, edgecolor="#969696" if edge == "white" else edge, lw=0.6, label=label)


def _differs_handle(label: str) -> Patch:
    return Patch(facecolor="none", edgecolor=BAD_COLOR, hatch="//", hatchcolor=DIFF_HATCH_COLOR, lw=1.5, label=label)


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
    return [("unread" if p >= end else int(owner[p]) if owner[p] < live else "pad") for p in range(n)]


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
def save(fig: Figure, path: str | Path) -> Path:
    """``fig.savefig(path, dpi=110, bbox_inches="tight")`` without a software tag; makes dirs."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    return path
