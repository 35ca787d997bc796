"""The capability matrix: what each backend x variant does in each graph mode, read from the code.

Per registered entry and ``layout.KINDS`` kind (chains): **graph** (``check_graph_mode``, or the
multi-step wrapper's, accepts it), **eager** (not captured, but the eager hook serves a batch) or
**—**; and **glue**: the captured kinds whose replay hook the checker's verdict (e) proved safe to replay from a
metadata glue graph (``refimpl.check.glue_verdict``), or why none. ``python -m refimpl matrix`` prints it;
``tests/test_capabilities.py`` keeps the copy in docs/reference.md current.
"""

from __future__ import annotations

from typing import Any

import torch

from ._env import default_device
from .backends import REGISTRY, BackendEntry, GraphModeNotSupported
from .batch import World
from .batchgen import BatchGenerator
from .config import SpecConfig
from .layout import KINDS, GraphKind
from .rig import Rig

SPEC = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)
MODES = tuple(KINDS)  # decode, idle, target_verify, draft_extend, draft_extend_v2, draft_decode
L = 160  # room for a 128-token page


def _eager_serves(backend, world: World, kind: GraphKind) -> bool:
    if kind.multi_step:
        return False  # multi-step draft decode exists only as graphs of its step backends
    gen = BatchGenerator(world, SPEC, seed=0)
    try:
        fb = gen.for_mode(kind.mode, 1)
        backend.init_forward_metadata(fb)
        return True
    except (GraphModeNotSupported, NotImplementedError, ValueError):
        return False
    finally:
        gen.release_all()


def capability(entry: BackendEntry, case: str) -> str:
    """``"graph"``, ``"eager"`` or ``"—"`` for one entry and one ``layout.KINDS`` kind."""
    kind = KINDS[case]
    # this machine's device (Triton compiled for a GPU takes no host tensors), a float32 model
    world = Rig.world_for(entry, default_device(), torch.float32, max_context_len=L, pool_size=4)
    try:
        backend = entry.load(kind.multi_step)(world, SPEC)
        backend.check_graph_mode(kind.mode)
        return "graph"
    except GraphModeNotSupported:
        pass
    single = entry.load(False)(world, SPEC)
    return "eager" if _eager_serves(single, world, kind) else "—"


def glue(entry: BackendEntry, cases: list[str]) -> str:
    """The kinds of ``cases`` (captured ones) the glue verdict passed, ``none``, or the refusal's reason."""
    from .check import CheckSettings, glue_verdict
    from .graphs import CPUEmulatorEngine

    settings, engine = CheckSettings(spec=SPEC, raw_bs=(1, 3), glue_replays=2), CPUEmulatorEngine()
    verdicts = {case: glue_verdict(entry, case, engine, settings) for case in cases}
    refused = [f for ok, found in verdicts.values() if ok is None for f in found]
    if any("plan()" in f for f in refused):
        return "refused: plan()"
    safe = [KINDS[c].label.replace("_", " ") for c, (ok, _) in verdicts.items() if ok]
    return ", ".join(safe) or ("refused: host read" if refused else "none")


def matrix(entries: list[BackendEntry] | None = None) -> list[dict[str, Any]]:
    rows = []
    for entry in entries or REGISTRY:
        pattern = getattr(entry.load(), "pattern", "")
        row = {"backend": entry.name, "variant": entry.variant, "pattern": pattern}
        row.update({case: capability(entry, case) for case in MODES})
        rows.append({**row, "glue": glue(entry, [c for c in MODES if row[c] == "graph"])})
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    head = "| backend | variant | pattern | " + " | ".join(m.replace("_", " ") for m in MODES) + " | glue |"
    lines = [head, "|" + "---|" * (4 + len(MODES))]
    for r in rows:
        cells = [r["backend"], r["variant"], r["pattern"], *(r[m] for m in MODES), r["glue"]]
        lines.append("| " + " | ".join(f"`{c}`" if i < 2 else c for i, c in enumerate(cells)) + " |")
    return "\n".join(lines)
