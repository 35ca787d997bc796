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
- ``draw_state_diff``: two states of the same buffers (capture path vs replay path, or a bound
  buffer vs what the batch needs), every differing cell framed and hatched red.
- ``draw_buffer_sizes``: allocated sizes of the same buffers in several backends, against what a
  batch needs.
- ``draw_eagle_iteration``: one EAGLE iteration (draft, verify, accept, draft extend) with the
  graph mode and the rows per request of each step.
- ``batch_roles`` / ``segment_roles``: the colour role of every cell of a per-request buffer /
  a packed buffer (for ``draw_buffers(roles=...)``).
- ``save``: write a figure reproducibly (no software tag in the PNG).

Cell colours carry a meaning, and every grid figure has a legend that says which (``ROLE_LABELS``):
live request i gets a light colour of its own (blue, green, purple, ...), padded rows (request
slot 0, the reserved row) orange, cells past the live part (never read) light grey, stale values
(left by an earlier batch or the capture) grey and cross-hatched, other values (an indptr's
end) white, as in notebook 00's padding figure. A value that contradicts what the builder can
recompute (a ``kv_indices`` entry that is not the ``req_to_token`` prefix, a mask that is not the
tree's ancestry) or that differs between two states gets a red frame and the title says how many.
"""

from .buffers import draw_block_table, draw_buffer_sizes, draw_buffers, draw_csr, draw_state_diff, draw_tree_mask
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
    "draw_block_table",
    "draw_buffer_sizes",
    "draw_buffers",
    "draw_csr",
    "draw_draft_decode_indices",
    "draw_eagle_iteration",
    "draw_state_diff",
    "draw_bench_figures",
    "draw_capture_cost",
    "draw_host_vs_bs",
    "draw_latency_vs_bs",
    "draw_replay_breakdown",
    "draw_step_graph_vs_eager",
    "draw_tree_mask",
    "save",
    "segment_roles",
]

# live requests (light), the padded row, unused cells, draft slots, mismatches
