"""EAGLE-style speculative-decoding inputs: draft trees, custom masks and per-mode spec inputs.

The contract the backends and the runner rely on ([facts#target-verify-custom-mask],
[facts#multi-step-draft-decode-indices]). A draft tree has N nodes, node 0 the root (the last verified token):
``parents[0] == -1``, ``parents[q] < q``; ``anc[q, k]``: node k is q or one of its ancestors. Draft q of request i sits
at *position* ``seq_lens[i] + depth(q)``; its KV lives at ``req_to_token`` *column* ``seq_lens[i] + q`` (node order).
Mask blocks and ``mask_indptr``: ``refimpl.layout``. Example: N = 3, tree ``[-1, 0, 0]``, two requests with ``seq_lens =
[2, 1]``::

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
from ._env import Device
from .config import SpecConfig, eagle_max_tree_nodes
from .modes import ForwardMode

_Lens = Sequence[int] | torch.Tensor


# --- draft trees --------------------------------------------------------------------------------
@dataclass
class DraftTree:
    """A draft tree given by its parent list (node 0 = root, ``parents[q] < q``)."""

    parents: list[int]

    def __post_init__(self):
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
        return self.depths()[q]

    def depths(self) -> list[int]:
        out = [0] * self.num_nodes
        for q in range(1, self.num_nodes):
            out[q] = out[self.parents[q]] + 1  # parents[q] < q, already computed
        return out

    def num_children(self) -> list[int]:
        return [self.parents[1:].count(q) for q in range(self.num_nodes)]

    def ancestry_mask(self) -> torch.Tensor:
        """``anc[q, k]`` True iff k == q or k is an ancestor of q.  # [N, N] bool, cpu"""
        anc = torch.eye(self.num_nodes, dtype=torch.bool, device="cpu")
        for q in range(1, self.num_nodes):
            anc[q] |= anc[self.parents[q]]  # parent's row is final because parents[q] < q
        return anc

    @classmethod
    def chain(cls, n: int) -> DraftTree:
        """topk == 1: node q's parent is q-1; the ancestry mask is lower-triangular."""
        if n < 1:
            raise ValueError(f"a chain needs n >= 1 nodes, got n={n}")
        return cls([-1, *range(n - 1)])

    @classmethod
    def draw(cls, spec: SpecConfig, rng: _random.Random) -> DraftTree:
        """A tree for ``spec``: its chain when ``topk == 1`` (nothing drawn), else :meth:`random` from ``rng``."""
        n = spec.num_draft_tokens
        return cls.chain(n) if spec.topk == 1 else cls.random(n, spec.topk, spec.num_steps, rng)

    @classmethod
    def random(
        cls, num_draft_tokens: int, topk: int, num_steps: int, generator: _random.Random | torch.Generator | int | None = None
    ) -> DraftTree:
        """A random EAGLE-like tree of exactly ``num_draft_tokens`` nodes: depth <= ``num_steps``, every node <= ``topk``
        children, each depth >= 2 hanging off <= ``topk`` parents (EAGLE's beams, so <= ``topk*topk`` nodes a level).
        Nodes are numbered level by level, grouped by parent. ``generator``: a ``random.Random``, a ``torch.Generator`` (a seed drawn from it) or a seed (None: fresh)."""
        n, limit = num_draft_tokens, eagle_max_tree_nodes(topk, num_steps)
        if topk < 1 or num_steps < 1:
            raise ValueError(f"need topk >= 1 and num_steps >= 1, got topk={topk}, S={num_steps}")
        if not 1 <= n <= limit:
            raise ValueError(
                f"num_draft_tokens={n} is not drawable: {num_steps} steps of topk={topk} draft at most {limit} nodes incl. the root"
            )
        if isinstance(generator, torch.Generator):  # draw a seed from it
            generator = int(torch.randint(0, 2**31 - 1, (1,), generator=generator, device=generator.device))
        rng = generator if isinstance(generator, _random.Random) else _random.Random(generator)
        cap = lambda prev: topk * min(topk, prev)  # level d holds at most topk*min(topk, n_{d-1})
        # max nodes levels d+1..S can hold: cap(n_d), then cap(cap(n_d)) (topk*topk or 0) per level
        room_after = lambda d, n_d: 0 if d >= num_steps else cap(n_d) + (num_steps - d - 1) * cap(cap(n_d))
        counts, remaining = [1], n - 1  # 1) nodes per depth (level 0 is the root)
        for d in range(1, num_steps + 1):
            hi = min(cap(counts[-1]), remaining)  # level 1: cap(1) = topk children of the root
            lo = next(k for k in range(hi + 1) if remaining - k <= room_after(d, k))
            counts.append(rng.randint(lo, hi))
            remaining -= counts[-1]
        assert remaining == 0, (counts, n)
        parents, level = [-1], [0]  # 2) each level picks <= topk beams of the last, <= topk kids each
        for k in filter(None, counts[1:]):  # the levels drawn (only the last ones can be empty)
            beams = rng.sample(level, rng.randint(-(-k // topk), min(topk, len(level))))
            seats = sorted(rng.sample([b for b in beams for _ in range(topk)], k))
            level, parents = list(range(len(parents), len(parents) + k)), parents + seats
        return cls(parents)


def tree_positions(tree: DraftTree, device: Device = "cpu") -> torch.Tensor:
    """Depth of every node (draft q sits at position ``prefix_len + depth(q)``).  # [N] int64"""
    return torch.tensor(tree.depths(), dtype=torch.int64, device=device)


# --- custom mask (target verify, [facts#target-verify-custom-mask]) ----------------------------
def build_custom_mask(seq_lens: _Lens, trees: Sequence[DraftTree], device: Device = "cpu") -> torch.Tensor:
    """Verify custom mask: request blocks ``[N, seq_lens[i] + N]`` flattened and concatenated, after checking one tree of
    a uniform N per request and ``seq_lens >= 0``. Returns ``# [sum_i N*(seq_lens[i]+N)] bool, device``."""
    lens = [int(x) for x in seq_lens]
    if len(trees) != len(lens):
        raise ValueError(f"got {len(trees)} trees for {len(lens)} requests (seq_lens)")
    if not trees:
        raise ValueError("need at least one request to build a verify mask")
    n = trees[0].num_nodes
    for i, (s, t) in enumerate(zip(lens, trees)):
        if t.num_nodes != n:
            raise ValueError(f"tree {i} has {t.num_nodes} nodes, tree 0 has {n}: N must be uniform")
        if s < 0:
            raise ValueError(f"seq_lens[{i}]={s} must be >= 0")
    ones = lambda s: torch.ones(n, s, dtype=torch.bool, device="cpu")  # [N, s]: the prefix columns
    return torch.cat([torch.cat([ones(s), t.ancestry_mask()], 1).flatten() for s, t in zip(lens, trees)]).to(device)


# --- per-mode spec inputs -----------------------------------------------------------------------
@dataclass
class VerifyInput:
    """Target verify (EagleVerifyInput): N draft tokens per request, checked in one forward."""

    draft_token_num: int  # N
    custom_mask: torch.Tensor | None  # [sum_i N*(seq_lens[i]+N)] bool, device; None = causal
    parents: list[list[int]] | None = None  # per request, the tree (for drawing / oracle)
    topk: int = 1
    mask_indptr: torch.Tensor | None = None  # [bs+1] int64, device (eager convenience)
    allow_blind_rows: bool = False  # validation refuses a draft row that does not see itself unless this is set


def make_verify_input(seq_lens: _Lens, trees: Sequence[DraftTree], device: Device = "cpu", topk=None) -> VerifyInput:
    """VerifyInput for prefix lengths ``seq_lens`` and one draft tree per request; ``topk`` defaults to the largest child
    count of any node (1 for chains)."""
    mask, n = build_custom_mask(seq_lens, trees, device), trees[0].num_nodes  # (the trees checked)
    if topk is None:
        topk = max(1, max(max(t.num_children()) for t in trees))
    indptr = layout.mask_indptr(torch.tensor([int(s) for s in seq_lens], device=device), n)
    return VerifyInput(n, mask, [list(t.parents) for t in trees], int(topk), indptr)


@dataclass
class DraftExtendInput:
    """Draft extend after verify (EagleDraftInput for v1, its fixed-shape v2 variant, [facts#triton]). v1: S+1 rows per
    request, the first ``accept_length[i] + 1`` real (accepted drafts + the bonus token); v2: N rows. The rest are
    rejected drafts, their outputs discarded (causal attention keeps the real rows independent of them);
    ``ragged=True``: v1's real rows only (old eager layout)."""

    version: int  # 1 or 2
    accept_length: torch.Tensor  # [bs] int32, device: accepted draft tokens (0..S)
    accept_length_cpu: list[int]
    extend_seq_lens: torch.Tensor  # [bs] int32, device: query rows per request
    num_tokens_per_req: int  # the uniform stride in a graph: S+1 (v1) or N (v2)

    def __post_init__(self):
        if self.version not in (1, 2):
            raise ValueError(f"DraftExtendInput.version must be 1 or 2, got {self.version!r}")


def make_draft_extend_input(
    version: int, accept_length: Sequence[int], spec: SpecConfig, device: Device = "cpu", ragged: bool = False
) -> DraftExtendInput:
    """DraftExtendInput for accepted lengths in ``[0, S]``: ``layout.rows_per_request`` rows per request, or
    (``ragged=True``, v1 only) accept+1, the old eager layout."""
    acc = [int(a) for a in accept_length]  # (a version other than 1 or 2: refused by DraftExtendInput)
    for i, a in enumerate(acc):
        if not 0 <= a <= spec.num_steps:
            raise ValueError(f"accept_length[{i}]={a} outside [0, num_steps={spec.num_steps}]")
    if ragged and version != 1:
        raise ValueError("only draft extend v1 has a ragged layout")
    stride = layout.rows_per_request(ForwardMode.DRAFT_EXTEND if version == 1 else ForwardMode.DRAFT_EXTEND_V2, spec)
    rows = [a + 1 for a in acc] if ragged else [stride] * len(acc)
    i32 = lambda v: torch.tensor(v, dtype=torch.int32, device=device)  # [bs] int32
    return DraftExtendInput(version, i32(acc), acc, i32(rows), stride)


@dataclass
class DraftDecodeInput:
    """Multi-step draft decode: S steps of ``topk`` branches per request (columns: ``refimpl.layout``); the multi-step
    backend sets ``kv_indptr`` / ``kv_indices`` per step (SGLang's common_template)."""

    topk: int
    num_steps: int  # S
    kv_indptr: torch.Tensor | None = None  # set per step by the multi-step backend
    kv_indices: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)


def dummy_spec_input(
    kind: layout.GraphKind, bs: int, spec: SpecConfig | None, fill_value: int, device: Device
) -> VerifyInput | DraftExtendInput | DraftDecodeInput | None:
    """The spec input of a capture batch of ``kind`` (every row padded, ``seq_len = fill_value``): verify, a chain mask per
    request (SGLang captures with a dummy mask too); draft extend, nothing accepted, uniform rows; multi-step draft
    decode, the step shape only."""
    mode = kind.mode
    if mode.is_target_verify():
        n = spec.num_draft_tokens  # blocks [N, seq + N]: prefix all ones, then a causal chain
        return VerifyInput(n, build_custom_mask([fill_value] * bs, [DraftTree.chain(n)] * bs, device), topk=spec.topk)
    if mode.is_any_draft_extend():
        return make_draft_extend_input(2 if mode.is_draft_extend_v2() else 1, [0] * bs, spec, device)
    return DraftDecodeInput(spec.topk, spec.num_steps) if kind.multi_step else None


def verify_n(spec_info: VerifyInput, cfg: SpecConfig | None, error: type[ValueError] = ValueError) -> int:
    """N of a verify batch, which must be the N its graph was captured for (``cfg``): the one home of this rule."""
    if cfg is None:
        raise error("target verify under graphs needs a SpecConfig (its N)")
    if (got := spec_info.draft_token_num) != (n := cfg.num_draft_tokens):
        raise error(f"spec_info.draft_token_num={got}: captured N is {n} (num_draft_tokens={n})")
    return n


_S = TypeVar("_S", VerifyInput, DraftExtendInput, DraftDecodeInput)


def require_spec(mode: ForwardMode, spec_info: object, expected_type: type[_S]) -> _S:
    """``spec_info`` if it is an ``expected_type``, else a ValueError (on purpose: a bad batch input)."""
    if not isinstance(spec_info, expected_type):
        got = "None" if spec_info is None else type(spec_info).__name__
        raise ValueError(f"{mode.name} needs a {expected_type.__name__} spec input, got {got}")
    return spec_info
