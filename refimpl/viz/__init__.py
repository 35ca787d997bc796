"""Figure builders for the notebooks: the graph buffers of the attention backends, drawn.

Every ``draw_*`` builder takes plain tensors (any device), returns a ``matplotlib.figure.Figure`` made without
``pyplot`` and is deterministic. Cell colours carry a meaning, told by each grid figure's legend (``ROLE_LABELS``): live
request i a light colour of its own, padded rows orange, cells past the live part light grey, stale values grey and
cross-hatched, other values white. A value that contradicts what a builder recomputes, or differs between two states, is
framed red and the title counts them. ``batch_roles`` / ``segment_roles`` give the roles of a buffer's cells; ``save``
writes a figure reproducibly.
"""

from .buffers import draw_buffers, draw_csr, draw_state_diff, draw_tree_mask
from .cells import BAD_COLOR, PAD_COLOR, REQ_COLORS, ROLE_LABELS, batch_roles, save, segment_roles
from .measure import (
    draw_bench_figures,
    draw_capture_cost,
    draw_host_vs_bs,
    draw_latency_vs_bs,
    draw_replay_breakdown,
    draw_step_graph_vs_eager,
)
from .speculative import draw_draft_decode_indices, draw_eagle_iteration

__all__ = [
    "BAD_COLOR",
    "PAD_COLOR",
    "REQ_COLORS",
    "ROLE_LABELS",
    "batch_roles",
    "save",
    "segment_roles",
    "draw_buffers",
    "draw_csr",
    "draw_state_diff",
    "draw_tree_mask",
    "draw_bench_figures",
    "draw_capture_cost",
    "draw_host_vs_bs",
    "draw_latency_vs_bs",
    "draw_replay_breakdown",
    "draw_step_graph_vs_eager",
    "draw_draft_decode_indices",
    "draw_eagle_iteration",
]
