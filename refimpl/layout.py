"""The per-mode layout rules, in one place.

A captured graph has fixed shapes, so every request of a graph mode occupies the same number of query rows; capture and
replay must lay them out identically (SGLang #21987, #27545). Upstream keeps the rule in ``cuda_graph_runner.py``
(``num_tokens_per_bs``; ``[facts#the-graph-runner]``):

| graph mode                   | query rows per request | ``seq_lens[i]`` counts (refimpl)       |
|------------------------------|------------------------|----------------------------------------|
| DECODE / IDLE                | 1                      | every token, incl. the one decoded     |
| multi-step draft decode      | topk (one per branch)  | the verified prefix                    |
| TARGET_VERIFY                | N (num_draft_tokens)   | the prefix only (before the N drafts)  |
| DRAFT_EXTEND (v1)            | S + 1 (num_steps + 1)  | every token, incl. the S+1 new rows    |
| DRAFT_EXTEND_V2              | N                      | every token, incl. the N new rows      |

Upstream's v1 passes ``seq_lens`` without the new rows and v2 subtracts ``extend_seq_lens``
(``[facts#where-refimpl-deliberately-differs-from-upstream]``). The keys a request attends: ``attended_kv_lens`` (incl.
its new rows: FlashInfer family, TRTLLM-MLA, the oracle) and ``prefix_kv_lens`` (before them: the Triton / Wave extend
kernel, which takes the new rows' k/v directly). Multi-step draft decode: branch k's step-j token sits at
``req_to_token`` column ``seq_len + k*S + j``; ``out_cache_loc`` is ordered ``[step][seq][branch]``.

Target verify's tree mask (``[facts#kernel-level-facts]``): request i's block is row-major ``[N, seq_lens[i] + N]``
(prefix columns 1, then the tree's ancestry), blocks concatenated, ``mask_indptr = [0, cumsum(N * (seq_lens + N))]``.

Padding (``[facts#the-graph-runner]``): ``raw_bs`` requests replay the smallest captured ``bs >= raw_bs``; rows
``raw_bs..bs`` are *padded rows*: ``seq_len`` = fill value (1), request slot ``PAD_REQ_SLOT`` and cache slot
``PAD_CACHE_SLOT`` (both 0, reserved): they write KV where no live request reads, and their outputs are discarded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .config import RESERVED_REQ_SLOT, RESERVED_TOKEN_SLOT, SpecConfig
from .modes import GRAPH_MODES, ForwardMode

PAD_REQ_SLOT = RESERVED_REQ_SLOT  # request slot of every padded row
PAD_CACHE_SLOT = RESERVED_TOKEN_SLOT  # KV slot every padded row writes


# --- graph kinds --------------------------------------------------------------------------------
@dataclass(frozen=True)
class GraphKind:
    """What a runner captures: a forward mode, or multi-step draft decode (``S`` DECODE steps of the draft model in one
    graph, ``topk`` rows per request). A batch knows its own (``ForwardBatch.kind``)."""

    label: str
    mode: ForwardMode
    multi_step: bool = False

    def rows(self, spec: SpecConfig | None) -> int:
        """Query rows every request occupies in a captured graph (the table above)."""
        return _need_spec(self.mode, spec).topk if self.multi_step else rows_per_request(self.mode, spec)

    def span(self, spec: SpecConfig | None) -> int:
        """Columns of ``req_to_token`` a request spans past ``seq_lens``: verify ``N`` (its drafts), multi-step draft
        decode ``topk * S`` (each branch's S steps), every other mode 0."""
        drafts = self.multi_step or self.mode.is_target_verify()
        return self.rows(spec) * self.cache_writes(spec) if drafts else 0  # the columns its rows write

    def cache_writes(self, spec: SpecConfig | None) -> int:
        """KV slots each query row writes: S in multi-step draft decode (one per step), else 1."""
        return _need_spec(self.mode, spec).num_steps if self.multi_step else 1

    def cache_loc_steps(self, out_cache_loc: torch.Tensor, spec: SpecConfig | None) -> torch.Tensor:
        """``out_cache_loc`` as ``[steps, rows]``: one block per step in multi-step draft decode (``[step][seq][branch]``),
        else one block. Step ``i`` of a draft decode writes ``[i]``."""
        return out_cache_loc.view(self.cache_writes(spec), -1)

    @staticmethod
    def parse(name: str | ForwardMode | GraphKind) -> GraphKind:
        """The one constructor: a kind from its label (``"draft-decode"`` works too), a forward mode, or a kind. EXTEND's
        (an eager batch's, never captured) is not in ``KINDS``."""
        if isinstance(name, GraphKind):
            return name
        key = (name.label if isinstance(name, ForwardMode) else name).strip().lower().replace("-", "_")
        if key == "extend":
            return EXTEND
        if key not in KINDS:
            raise ValueError(f"unknown graph mode {name!r}; valid: {', '.join(KINDS)}")
        return KINDS[key]


# label -> kind: one per graph mode (decode, idle, target_verify, draft_extend, draft_extend_v2), then draft_decode
KINDS = {m.label: GraphKind(m.label, m) for m in GRAPH_MODES} | {
    "draft_decode": GraphKind("draft_decode", ForwardMode.DECODE, True)
}


EXTEND = GraphKind("extend", ForwardMode.EXTEND)


# --- rows per request --------------------------------------------------------------------------
def rows_per_request(mode: ForwardMode, spec: SpecConfig | None = None) -> int:
    """Query rows every request of a single-step ``mode`` occupies in a captured graph (the table above)."""
    if mode.is_decode_or_idle():
        return 1
    if mode.is_target_verify() or mode.is_draft_extend_v2():
        return _need_spec(mode, spec).num_draft_tokens
    if mode.is_draft_extend_v1():
        return _need_spec(mode, spec).num_steps + 1
    raise ValueError(f"{mode.label} is not captured in a graph (no uniform row layout)")


def draft_column(seq_len, branch, step, spec: SpecConfig):
    """Multi-step draft decode: ``req_to_token`` column of branch ``k``'s step-``j`` token, ``seq_len + k*S + j``
    (branch-major; ints or broadcasting tensors)."""
    return seq_len + branch * spec.num_steps + step


def draft_step_kv_lens(seq_lens, step: int, topk: int = 1):
    """Multi-step draft decode: the keys of step ``step``'s ``bs * topk`` rows (request-major): the prefix and the
    branch's ``step + 1`` drafts."""
    return (seq_lens + step + 1).repeat_interleave(topk)


def _need_spec(mode, spec) -> SpecConfig:
    if spec is None:
        raise ValueError(f"{mode.label} lays out speculative rows: it needs a SpecConfig")
    return spec


# --- which keys a request attends ----------------------------------------------------------------
def attended_kv_lens(mode: ForwardMode, seq_lens: torch.Tensor, num_draft_tokens: int = 0):
    """Keys incl. the request's new rows: verify ``seq + N``, every other mode ``seq``."""
    return seq_lens + num_draft_tokens if mode.is_target_verify() else seq_lens


def prefix_kv_lens(mode: ForwardMode, seq_lens: torch.Tensor, rows: int | torch.Tensor):
    """Keys before the request's new rows: verify ``seq`` (the prefix only); (draft) extend ``seq - rows``, clamped at 0 (a
    padded row's ``seq_len`` 1 is below its rows)."""
    if mode.is_target_verify() or mode.is_decode_or_idle():
        return seq_lens
    return torch.clamp(seq_lens - rows, min=0)


# --- the target-verify tree mask ----------------------------------------------------------------
def tree_mask_sizes(seq_lens: Sequence[int], num_draft_tokens: int) -> list[int]:
    """Entries of each request's mask block: ``N * (seq_lens[i] + N)`` (host ints)."""
    n = int(num_draft_tokens)
    return [n * (int(s) + n) for s in seq_lens]


def tree_mask_total(seq_lens: Sequence[int], num_draft_tokens: int) -> int:
    """``sum(tree_mask_sizes(...))`` in closed form (the replay path's validation calls it)."""
    n = int(num_draft_tokens)
    return n * (sum(seq_lens) + len(seq_lens) * n)


def mask_indptr(seq_lens: torch.Tensor, num_draft_tokens: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """``[0, cumsum(N * (seq_lens + N))]``  # [bs+1] int64; written into ``out`` (a zeroed static buffer: graph-safe) when
    given, else a fresh tensor."""
    bs, n = seq_lens.numel(), int(num_draft_tokens)
    if out is None:
        out = torch.zeros(bs + 1, dtype=torch.int64, device=seq_lens.device)
    out[1 : bs + 1] = torch.cumsum(n * (seq_lens.to(torch.int64) + n), 0)
    return out[: bs + 1]


def check_mask_fits(mask: torch.Tensor, buffer: torch.Tensor):
    """Refuse a tree mask larger than the static buffer a graph reads it from."""
    if mask.numel() > buffer.numel():
        raise ValueError(
            f"tree mask of {mask.numel()} entries exceeds the graph buffer of {buffer.numel()} (max_num_tokens * max_context_len)"
        )


# --- padding a batch to a captured size ------------------------------------------------------
def padded_seq_lens_sum(raw_sum: int, raw_bs: int, bs: int, fill_value: int) -> int:
    """``seq_lens_sum`` of a padded batch: the live sum + one fill value per padded row."""
    return raw_sum + (bs - raw_bs) * fill_value
