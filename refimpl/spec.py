"""EAGLE-style speculative-decoding inputs: draft trees, custom masks and per-mode spec inputs.

The data classes below are the contract the backends and the runner rely on.

Layouts ([facts#target-verify-custom-mask], [facts#multi-step-draft-decode-indices]):

- A draft tree has N nodes; node 0 is the root (the last verified token), ``parents[0] == -1``
  and ``parents[q] < q``. Its ancestry mask ``anc[q, k]`` is True when node k is node q or one
  of its ancestors; a chain's ancestry mask is lower-triangular. Draft token q of request i sits
  at *position* ``seq_lens[i] + depth(q)`` (its depth in the tree), while its KV lives in the
  request's ``req_to_token`` row at *column* ``seq_lens[i] + q`` (EAGLE stores drafts in node
  order).
- ``VerifyInput.custom_mask`` is bool, flattened and concatenated over requests; request i's
  block is row-major ``[N, seq_lens[i] + N]``: the first ``seq_lens[i]`` columns (the prefix) are
  all True, the last N columns are the tree ancestry mask. ``mask_indptr`` = ``[0,
  cumsum(N * (seq_lens + N))]``.

Worked example: N = 3, tree ``parents = [-1, 0, 0]`` (root with two children), two requests
with prefix lengths ``seq_lens = [2, 1]``::

    ancestry (3x3)      request 0 block [3, 2+3]     request 1 block [3, 1+3]
    1 0 0               1 1 | 1 0 0                  1 | 1 0 0
    1 1 0               1 1 | 1 1 0                  1 | 1 1 0
    1 0 1               1 1 | 1 0 1                  1 | 1 0 1

    custom_mask = cat(block0.flatten(), block1.flatten())   # [15 + 12] bool
    mask_indptr = [0, 15, 27]                               # int64
    depths      = [0, 1, 1]  -> request 0 drafts sit at positions [2, 3, 3]
                                and write KV at req_to_token columns [2, 3, 4]
"""

from __future__ import annotations

import random as _random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from . import layout
from .config import SpecConfig, eagle_max_tree_nodes
from .modes import ForwardMode

# --------------------------------------------------------------------------------------------
# Draft trees
# --------------------------------------------------------------------------------------------


@dataclass
class DraftTree:
    """A draft tree given by its parent list (node 0 = root, ``parents[q] < q``)."""

    parents: list[int]

    def __post_init__(self) -> None:
        self.parents = [int(p) for p in self.parents]
        if not self.parents:
            raise ValueError("DraftTree needs at least one node (the root), got parents=[]")
        if self.parents[0] != -1:
            raise ValueError(f"DraftTree root must have parent -1, got parents[0]={self.parents[0]}")
        for q, p in enumerate(self.parents[1:], start=1):
            if not 0 <= p < q:
                raise ValueError(f"DraftTree parents[{q}]={p} must be in [0, {q}) (parents precede children)")

    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    def depth(self, q: int) -> int:
        """Edges from the root to node q (the root has depth 0)."""
        if not 0 <= q < self.num_nodes:
            raise ValueError(f"node {q} out of range [0, {self.num_nodes})")
        d = 0
        while self.parents[q] != -1:
            q = self.parents[q]
            d += 1
        return d

    def depths(self) -> list[int]:
        out = [0] * self.num_nodes
        for q in range(1, self.num_nodes):
            out[q] = out[self.parents[q]] + 1  # parents[q] < q, already computed
        return out

    def num_children(self) -> list[int]:
        out = [0] * self.num_nodes
        for p in self.parents[1:]:
            out[p] += 1
        return out

    def ancestry_mask(self) -> torch.Tensor:
        """``anc[q, k]`` True iff k == q or k is an ancestor of q.  # [N, N] bool, cpu"""
        n = self.num_nodes
        anc = torch.eye(n, dtype=torch.bool, device="cpu")
        for q in range(1, n):
            anc[q] |= anc[self.parents[q]]  # parent's row is final because parents[q] < q
        return anc

    @classmethod
    def chain(cls, n: int) -> DraftTree:
        """topk == 1: node q's parent is q-1; the ancestry mask is lower-triangular."""
        if n < 1:
            raise ValueError(f"a chain needs n >= 1 nodes, got n={n}")
        return cls([-1] + list(range(n - 1)))

    @classmethod
    def random(
        cls,
        num_draft_tokens: int,
        topk: int,
        num_steps: int,
        generator: _random.Random | torch.Generator | int | None = None,
    ) -> DraftTree:
        """A random EAGLE-like tree with exactly ``num_draft_tokens`` nodes.

        Guarantees: depth <= ``num_steps``; every node has <= ``topk`` children; the root has
        <= ``topk`` children; at each depth >= 2 the children hang off at most ``topk`` distinct
        parents (EAGLE's beams), so a level holds <= ``topk*topk`` nodes. Nodes are numbered
        level by level, children grouped by parent.
        """
        n, limit = num_draft_tokens, eagle_max_tree_nodes(topk, num_steps)
        if topk < 1 or num_steps < 1:
            raise ValueError(f"need topk >= 1 and num_steps >= 1, got topk={topk}, S={num_steps}")
        if not 1 <= n <= limit:
            raise ValueError(
                f"num_draft_tokens={n} is not drawable: {num_steps} steps of topk={topk} draft "
                f"at most {limit} nodes incl. the root"
            )
        rng = _as_rng(generator)

        # 1) nodes per depth: level 0 is the root; level d holds at most topk*min(topk, n_{d-1})
        def cap(prev: int) -> int:
            return topk * min(topk, prev)

        def room_after(d: int, n_d: int) -> int:  # max nodes levels d+1..S can hold
            total, prev = 0, n_d
            for _ in range(d + 1, num_steps + 1):
                prev = cap(prev)
                total += prev
            return total

        counts, remaining = [1], n - 1
        for d in range(1, num_steps + 1):
            hi = min(cap(counts[-1]) if d > 1 else topk, remaining)
            lo = next(k for k in range(hi + 1) if remaining - k <= room_after(d, k))
            counts.append(rng.randint(lo, hi))
            remaining -= counts[-1]
        assert remaining == 0, (counts, n)

        # 2) parents: each level picks <= topk beams of the previous level, <= topk kids each
        parents, level = [-1], [0]
        for d in range(1, num_steps + 1):
            k = counts[d]
            if k == 0:
                break
            n_beams_lo = -(-k // topk)
            n_beams = rng.randint(n_beams_lo, min(topk, len(level)))
            beams = rng.sample(level, n_beams)
            seats = sorted(rng.sample([b for b in beams for _ in range(topk)], k))
            start = len(parents)
            parents.extend(seats)
            level = list(range(start, len(parents)))
        tree = cls(parents)
        assert tree.num_nodes == n and max(tree.depths()) <= num_steps
        assert max(tree.num_children()) <= topk
        return tree


def _as_rng(generator: _random.Random | torch.Generator | int | None) -> _random.Random:
    if isinstance(generator, _random.Random):
        return generator
    if isinstance(generator, torch.Generator):
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator, device=generator.device))
        return _random.Random(seed)
    return _random.Random(generator)


def tree_positions(tree: DraftTree, device: str | torch.device = "cpu") -> torch.Tensor:
    """Depth of every node: draft token q sits at position ``prefix_len + depth(q)``.

    Returns ``# [N] int64``.
    """
    return torch.tensor(tree.depths(), dtype=torch.int64, device=device)


# --------------------------------------------------------------------------------------------
# Custom mask (target verify, [facts#target-verify-custom-mask])
# --------------------------------------------------------------------------------------------


def _as_int_list(seq_lens: Sequence[int] | torch.Tensor) -> list[int]:
    if isinstance(seq_lens, torch.Tensor):
        return [int(x) for x in seq_lens.detach().cpu().tolist()]
    return [int(x) for x in seq_lens]


def _check_trees(seq_lens: list[int], trees: Sequence[DraftTree]) -> int:
    if len(trees) != len(seq_lens):
        raise ValueError(f"got {len(trees)} trees for {len(seq_lens)} requests (seq_lens)")
    if not trees:
        raise ValueError("need at least one request to build a verify mask")
    n = trees[0].num_nodes
    for i, t in enumerate(trees):
        if t.num_nodes != n:
            raise ValueError(f"tree {i} has {t.num_nodes} nodes, tree 0 has {n}: N must be uniform")
    for i, s in enumerate(seq_lens):
        if s < 0:
            raise ValueError(f"seq_lens[{i}]={s} must be >= 0")
    return n


def build_custom_mask(
    seq_lens: Sequence[int] | torch.Tensor, trees: Sequence[DraftTree], device: str | torch.device = "cpu"
) -> torch.Tensor:
    """Verify custom mask: request blocks ``[N, seq_lens[i] + N]`` flattened and concatenated.

    Returns ``# [sum_i N*(seq_lens[i]+N)] bool, device``.
    """
    lens = _as_int_list(seq_lens)
    n = _check_trees(lens, trees)
    blocks = []
    for s, tree in zip(lens, trees):
        block = torch.ones(n, s + n, dtype=torch.bool, device="cpu")  # [N, s+N]: prefix columns all True
        block[:, s:] = tree.ancestry_mask()  # last N columns: the tree
        blocks.append(block.flatten())
    mask = torch.cat(blocks).to(device)
    assert mask.numel() == sum(layout.tree_mask_sizes(lens, n))
    return mask


# --------------------------------------------------------------------------------------------
# Per-mode spec inputs
# --------------------------------------------------------------------------------------------


@dataclass
class VerifyInput:
    """Target verify (EagleVerifyInput): N draft tokens per request, checked in one forward."""

    draft_token_num: int  # N
    custom_mask: torch.Tensor | None  # [sum_i N*(seq_lens[i]+N)] bool, device; None = causal
    parents: list[list[int]] | None = None  # per request, the tree (for drawing / oracle)
    topk: int = 1
    mask_indptr: torch.Tensor | None = None  # [bs+1] int64, device (eager convenience)


def make_verify_input(
    seq_lens: Sequence[int] | torch.Tensor,
    trees: Sequence[DraftTree],
    device: str | torch.device = "cpu",
    topk: int | None = None,
) -> VerifyInput:
    """VerifyInput for prefix lengths ``seq_lens`` and one draft tree per request.

    ``topk`` defaults to the largest child count of any node (1 for chains).
    """
    lens = _as_int_list(seq_lens)
    n = _check_trees(lens, trees)
    if topk is None:
        topk = max(1, max(max(t.num_children()) for t in trees))
    return VerifyInput(
        draft_token_num=n,
        custom_mask=build_custom_mask(lens, trees, device),
        parents=[list(t.parents) for t in trees],
        topk=int(topk),
        mask_indptr=layout.mask_indptr(torch.tensor(lens, dtype=torch.int64, device=device), n),
    )


@dataclass
class DraftExtendInput:
    """Draft extend after verify (EagleDraftInput for v1, its fixed-shape v2 variant).

    v1: every request carries the S+1 tokens of its verified chain (uniform stride S+1, the
        layout a captured graph uses, [facts#triton]); the first ``accept_length[i] + 1`` are real
        (accepted drafts + the bonus token), the rest are rejected drafts whose outputs are
        discarded. (``ragged=True`` in ``make_draft_extend_input`` builds SGLang's old eager
        layout with only the ``accept_length[i] + 1`` real rows; graphs never see it.)
    v2: every request extends by exactly N tokens (``extend_seq_lens`` == N); rows past a
        request's accepted tokens carry rejected drafts whose outputs are discarded.
    Causal attention makes the real rows' outputs independent of the rejected rows after them.
    """

    version: int  # 1 or 2
    accept_length: torch.Tensor  # [bs] int32, device: accepted draft tokens (0..S)
    accept_length_cpu: list[int]
    extend_seq_lens: torch.Tensor  # [bs] int32, device: query rows per request
    num_tokens_per_req: int  # the uniform stride in a graph: S+1 (v1) or N (v2)

    def __post_init__(self) -> None:
        if self.version not in (1, 2):
            raise ValueError(f"DraftExtendInput.version must be 1 or 2, got {self.version!r}")


def make_draft_extend_input(
    version: int,
    accept_length: Sequence[int],
    spec: SpecConfig,
    device: str | torch.device = "cpu",
    ragged: bool = False,
) -> DraftExtendInput:
    """DraftExtendInput for accepted lengths in ``[0, S]``: S+1 (v1) or N (v2) rows per request
    (``refimpl.layout.rows_per_request``). ``ragged=True`` (v1 only): rows = accept+1 per
    request, the old eager layout."""
    if version not in (1, 2):
        raise ValueError(f"draft extend version must be 1 or 2, got {version!r}")
    acc = [int(a) for a in accept_length]
    for i, a in enumerate(acc):
        if not 0 <= a <= spec.num_steps:
            raise ValueError(f"accept_length[{i}]={a} outside [0, num_steps={spec.num_steps}]")
    if ragged and version != 1:
        raise ValueError("only draft extend v1 has a ragged layout")
    mode = ForwardMode.DRAFT_EXTEND if version == 1 else ForwardMode.DRAFT_EXTEND_V2
    stride = layout.rows_per_request(mode, spec)
    rows = [a + 1 for a in acc] if ragged else [stride] * len(acc)
    return DraftExtendInput(
        version=version,
        accept_length=torch.tensor(acc, dtype=torch.int32, device=device),  # [bs] int32
        accept_length_cpu=acc,
        extend_seq_lens=torch.tensor(rows, dtype=torch.int32, device=device),  # [bs] int32
        num_tokens_per_req=stride,
    )


@dataclass
class DraftDecodeInput:
    """Multi-step draft decode: S steps, each expanding ``topk`` branches per request.

    Step i of branch k of request r attends the request's ``seq_lens[r]`` prefix slots plus the
    ``i+1`` draft slots of branch k. The draft slots live in the request's row of
    ``req_to_token`` at columns ``seq_lens[r] + k*S + j`` (branch-major).
    The multi-step backend sets ``kv_indptr`` / ``kv_indices`` per step (SGLang's common_template).
    """

    topk: int
    num_steps: int  # S
    kv_indptr: torch.Tensor | None = None  # set per step by the multi-step backend
    kv_indices: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)


def dummy_spec_input(
    mode: ForwardMode,
    bs: int,
    spec: SpecConfig | None,
    fill_value: int,
    device: str | torch.device,
    multi_step_draft: bool = False,
) -> VerifyInput | DraftExtendInput | DraftDecodeInput | None:
    """The spec input of a capture batch (every row a padded row, ``seq_len = fill_value``).

    Target verify: a chain mask per request (SGLang captures with a dummy mask too); draft
    extend: nothing accepted, uniform rows; multi-step draft decode: the step shape only.
    """
    if mode.is_target_verify():
        n = spec.num_draft_tokens
        # request block [N, seq + N]: prefix all ones, then a causal chain over the drafts
        block = torch.cat(
            [
                torch.ones(n, fill_value, dtype=torch.bool, device="cpu"),
                torch.ones(n, n, dtype=torch.bool, device="cpu").tril(),
            ],
            1,
        )
        return VerifyInput(n, block.flatten().repeat(bs).to(device), topk=spec.topk)
    if mode.is_any_draft_extend():
        version = 2 if mode.is_draft_extend_v2() else 1
        return make_draft_extend_input(version, [0] * bs, spec, device)
    if mode.is_decode_or_idle() and multi_step_draft:
        return DraftDecodeInput(topk=spec.topk, num_steps=spec.num_steps)
    return None


SpecInput = VerifyInput | DraftExtendInput | DraftDecodeInput

_S = TypeVar("_S", VerifyInput, DraftExtendInput, DraftDecodeInput)


def require_spec(mode: ForwardMode, spec_info: object, expected_type: type[_S]) -> _S:
    """Return ``spec_info`` if it is an ``expected_type``, else raise a ValueError naming both."""
    if not isinstance(spec_info, expected_type):
        got = "None" if spec_info is None else type(spec_info).__name__
        # a ValueError (not TypeError) on purpose: callers treat it like any bad batch input
        raise ValueError(  # noqa: TRY004
            f"{mode.name} needs a {expected_type.__name__} spec input, got {got}"
        )
    return spec_info
