"""The capability matrix: what each backend x variant does in each graph mode, read from the code.

Per registered entry and ``layout.KINDS`` kind (chains): **graph** (``check_graph_mode``, or the
multi-step wrapper's, accepts it), **eager** (not captured, but the eager hook serves a batch) or
**—**; and **glue**: the captured kinds whose replay hook the backend declares safe to replay from a metadata glue graph
(``glue_refusal`` is ``None``), or why none (``tests/test_glue.py`` holds each declaration to the checker's verdict
(e)). ``python -m refimpl matrix`` prints it; ``tests/test_capabilities.py`` keeps the copy in docs/reference.md
current.
"""

from __future__ import annotations

from typing import Any

import torch

from ._env import default_device
from .backends import REGISTRY, BackendEntry, GraphModeNotSupported
from .batchgen import BatchGenerator
from .config import CHAIN
from .layout import KINDS, GraphKind
from .rig.core import Rig

MODES = tuple(KINDS)  # decode, idle, target_verify, draft_extend, draft_extend_v2, draft_decode
L = 160  # room for a 128-token page


def _world(entry):
    """A small world for ``entry``: this machine's device (Triton compiled for a GPU takes no host tensors), float32."""
    return Rig.world_for(entry, default_device(), torch.float32, max_context_len=L, pool_size=4)


def capability(entry: BackendEntry, kind: str | GraphKind, world=None) -> tuple[str, str | None]:
    """``"graph"``, ``"eager"`` or ``"—"`` for one entry and one ``layout.KINDS`` kind, and for a captured kind the
    backend's ``glue_refusal`` (``None``: it may be glued; a split hook's device phase may be). ``world``: one from ``_world(entry)`` to reuse (an eager
    probe releases the requests it draws)."""
    kind, world = GraphKind.parse(kind), world or _world(entry)
    try:
        backend = entry.load(kind.multi_step)(world, CHAIN)
        backend.check_graph_mode(kind.mode)
        return "graph", None if backend.splits_hook(kind.mode) else backend.glue_refusal(kind.mode)  # split: its device phase
    except GraphModeNotSupported:
        pass
    if kind.multi_step:
        return "—", None  # multi-step draft decode exists only as graphs of its step backends
    backend, gen = entry.load()(world, CHAIN), BatchGenerator(world, CHAIN)
    try:  # does the eager hook serve a batch?
        backend.init_forward_metadata(gen.for_mode(kind.mode, 1))
        return "eager", None
    except (GraphModeNotSupported, NotImplementedError, ValueError):
        return "—", None
    finally:
        gen.release_all()


def glue(refusals: dict[str, str | None]) -> str:
    """The captured kinds whose hook may be glued, or why none: ``refused: plan()``, ``refused: host read``, ``none``."""
    safe = [kind.replace("_", " ") for kind, why in refusals.items() if why is None]
    why = " ".join(w for w in refusals.values() if w)
    return ", ".join(safe) or ("refused: plan()" if "plan()" in why else "refused: host read" if "host" in why else "none")


def matrix(entries: list[BackendEntry] | None = None) -> list[dict[str, Any]]:
    rows = []
    for entry in entries or REGISTRY:
        row = {"backend": entry.name, "variant": entry.variant, "pattern": getattr(entry.load(), "pattern", "")}
        refusals, world = {}, _world(entry)  # the captured kinds' glue_refusal; one world for the entry's kinds
        for kind in MODES:
            row[kind], why = capability(entry, kind, world)
            if row[kind] == "graph":
                refusals[kind] = why
        rows.append(row | {"glue": glue(refusals)})
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [f"| backend | variant | pattern | {' | '.join(MODES).replace('_', ' ')} | glue |", "|" + "---|" * (4 + len(MODES))]
    for r in rows:
        cells = [f"`{r['backend']}`", f"`{r['variant']}`", r["pattern"], *(r[m] for m in MODES), r["glue"]]
        lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines)
