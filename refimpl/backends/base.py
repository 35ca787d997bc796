"""The attention-backend contract: SGLang's hook names, mini-sglang's typed shape.

| refimpl / SGLang hook                          | mini-sglang            | when it runs                 |
|------------------------------------------------|------------------------|------------------------------|
| ``init_forward_metadata(fb)``                  | ``prepare_metadata``   | every eager step             |
| ``init_cuda_graph_state(max_bs, max_tokens)``  | ``init_capture_graph`` | once, before any capture     |
| ``init_forward_metadata_capture_cuda_graph``   | ``prepare_for_capture``| once per (bs, mode) capture  |
| ``init_forward_metadata_replay_cuda_graph``    | ``prepare_for_replay`` | before every replay          |
| ``get_cuda_graph_seq_len_fill_value()``        |                        | padding (1 for all six)      |
| ``forward(q, k, v, layer, fb)``                | ``forward``            | inside the captured step     |

The capture and replay hooks run **outside** the graph ([facts#capture]): what they compute
is never recorded. Only ``forward`` is. So everything ``forward`` reads must be a static buffer
allocated in ``init_cuda_graph_state`` (or a view of one), and replay must refill those buffers
in place ([facts#what-is-and-is-not-captured]).

Variants: every backend comes in a ``legacy`` shape, written as upstream looked before the
unification (#26134 / #26665), and a ``unified`` shape; some have more (``as-upstream``). Each
class carries one label from ``PATTERNS`` ([facts#pattern-vocabulary]); where refimpl's unified
shape differs from upstream's, its docstring says so.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from typing import Any

import torch

from ..batch import ForwardBatch, World
from ..config import SpecConfig
from ..modes import ForwardMode

PATTERNS = {
    "A": "capture runs the replay body, then freezes metadata views of the static buffers",
    "B": "capture prepares graph-bound objects (wrappers), then runs the replay body",
    "C": "capture and replay are separate bodies that must be kept in step by hand",
    "C, merged branches": "separate bodies; identical mode branches inside each merged",
    "in-graph": "the metadata rebuild is recorded inside the graph; the replay hook re-points",
}


class GraphModeNotSupported(ValueError):
    """A backend was asked to capture a mode it does not support under graphs."""


class AttentionBackend(ABC):
    name: str = "?"
    variant: str = "unified"  # "legacy" | "unified" | "as-upstream" | ...
    pattern: str = "A"  # a key of PATTERNS
    graph_modes: frozenset[ForwardMode] = frozenset()

    def __init__(self, world: World, spec: SpecConfig | None = None):
        self.world = world
        self.cfg = world.cfg
        self.spec = spec
        self.device = world.device
        self.forward_metadata: Any = None
        self.max_bs: int | None = None
        self.max_num_tokens: int | None = None

    # --- eager --------------------------------------------------------------------------------
    @abstractmethod
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        """Build ``self.forward_metadata`` for one eager step (fresh tensors are fine here)."""

    # --- graphs ---------------------------------------------------------------------------------
    @abstractmethod
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Allocate every tensor a captured ``forward`` will read, sized for the largest graph."""

    @abstractmethod
    def init_forward_metadata_capture_cuda_graph(
        self,
        bs: int,
        num_tokens: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        encoder_lens: torch.Tensor | None,
        forward_mode: ForwardMode,
        spec_info: Any,
    ) -> None: ...

    @abstractmethod
    def init_forward_metadata_replay_cuda_graph(
        self,
        bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_sum: int | None,
        encoder_lens: torch.Tensor | None,
        forward_mode: ForwardMode,
        spec_info: Any,
        seq_lens_cpu: torch.Tensor | None,
    ) -> None: ...

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1  # all six SGLang backends ([facts#static-inputs]); 0 would give an empty kv range

    # --- the captured step ----------------------------------------------------------------------
    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, fb: ForwardBatch) -> torch.Tensor:
        """Write this layer's KV at ``fb.out_cache_loc`` and return attention output."""

    # --- checker support ------------------------------------------------------------------------
    def graph_state(self, bs: int, mode: ForwardMode) -> dict[str, Any]:
        """What a captured ``forward`` of batch size ``bs`` reads: live views + frozen scalars.

        The checker compares this between the capture path and the replay path. The default
        takes every field of ``self.forward_metadata``; backends narrow tensors to the live part
        (e.g. ``kv_indices[:kv_indptr[bs]]``) so that stale tails, which no kernel reads, are
        not reported.
        """
        md = self.forward_metadata
        if md is None:
            return {}
        if dataclasses.is_dataclass(md):
            fields = {f.name: getattr(md, f.name) for f in dataclasses.fields(md)}
        else:
            fields = dict(vars(md))
        return {k: v for k, v in fields.items() if v is not None}

    def reference_graph_state(self, fb: ForwardBatch) -> dict[str, Any] | None:
        """What ``graph_state`` must hold after the replay hook ran on ``fb`` (a batch padded to
        its captured size), computed from first principles: the ``*_ref`` builders of
        ``refimpl.kernels`` and the rules of ``refimpl.layout``, never the hook's own code.

        Tensors cover the region a correct hook must write (the checker compares that prefix
        of the flattened state); scalars must be equal. ``None``: the backend gives no
        reference, and the checker's fourth verdict is not applied.
        """
        return None

    def check_graph_mode(self, mode: ForwardMode) -> None:
        if mode not in self.graph_modes:
            supported = ", ".join(sorted(m.label for m in self.graph_modes))
            raise GraphModeNotSupported(
                f"{self.name}/{self.variant} does not support {mode.label} under graphs (supported: {supported})"
            )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(variant={self.variant!r}, pattern={self.pattern!r})"
