"""Realistic random ``ForwardBatch`` es, one generator method per forward mode.

Each allocates fresh requests in a ``World``, builds the batch on ``world.device`` and validates it
(``refimpl.validate``); ``release`` gives the slots back. Rows per request and what ``seq_lens`` counts:
``refimpl.layout``. Row j of request i sits at position ``seq_lens[i] - rows_i + j`` and writes its KV at
``req_to_token`` (``r2t``) column ``seq_lens[i] - rows_i + j`` (the new rows end the sequence), except in TARGET_VERIFY
(``seq_lens`` = the prefix): column ``seq_lens[i] + j``, position ``seq_lens[i] + depth(j)`` in request i's draft tree.

Multi-step draft decode (``draft_decode``; columns and ordering: ``refimpl.layout``): ``num_seqs*topk`` rows ordered
``[seq][branch]``, step j at positions + j; a request holds ``seq_len + topk*S`` tokens; ``draft_decode_step_view``
shows ``out_cache_loc`` as ``[S, num_seqs*topk]``. Example, ``seq_lens = [5, 3]``, topk = 2, S = 3::

    r2t row of seq 0:  cols 0..4 prefix | 5 6 7 branch 0 steps 0..2 | 8 9 10 branch 1
    positions      = [5, 5, 3, 3]                      # [num_seqs*topk]: step 0; step j: +j
    out_cache_loc  = [r2t[s0,5], r2t[s0,8], r2t[s1,3], r2t[s1,6],     # step 0
                      r2t[s0,6], r2t[s0,9], r2t[s1,4], r2t[s1,7],     # step 1
                      r2t[s0,7], r2t[s0,10], r2t[s1,5], r2t[s1,8]]    # step 2

Lengths look like real traffic; one the mode leaves no room for raises a ``ValueError`` naming the limit.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from . import layout
from .batch import ForwardBatch, World
from .config import SpecConfig
from .modes import ForwardMode
from .spec import DraftDecodeInput, DraftTree, make_draft_extend_input, make_verify_input
from .validate import validate_batch

__all__ = ["BatchGenerator"]
_Lens = Sequence[int] | None


class BatchGenerator:
    """Random batches per mode over ``world``; ``spec`` is needed by the speculative modes. The attribute ``lengths``, when
    a batch's lengths are not given: ``"mixed"`` (every request short, long, near a page boundary or uniform), ``"one long"``
    (request 0 within 8 of the longest the mode allows, the others short or near a small page boundary: long
    contexts at the cost of one request, what the checker draws) or ``"short"`` (every request so)."""

    def __init__(self, world: World, spec: SpecConfig | None = None, seed: int = 0):
        self.world, self.spec, self.lengths = world, spec, "mixed"  # callers set lengths to "one long" or "short"
        self.rng = random.Random(seed)
        self.torch_gen = torch.Generator().manual_seed(seed)
        self._owned = {}  # request slot -> tokens allocated in its row

    # --- public: one method per mode ------------------------------------------------------------
    def extend(self, bs: int, prefix_lens: _Lens = None, extend_lens: _Lens = None) -> ForwardBatch:
        """EXTEND (eager prefill): ``extend_lens[i]`` new rows after a cached prefix."""
        L = self.world.max_context_len
        self._check_bs(bs)
        if prefix_lens is not None:  # a prefix must leave room for >= 1 new token
            prefix_lens = self._lens(prefix_lens, bs, "prefix_lens", 0, L - 1, f"max_context_len={L} - 1")
        if extend_lens is None:  # room: tokens left after the prefix
            ext = [self._sample_len(1, max(1, min(L - p, L // 4))) for p in (prefix_lens or [0] * bs)]
        else:
            ext = self._lens(extend_lens, bs, "extend_lens", 1, L, f"max_context_len={L}")
        pre = prefix_lens or [self._sample_len(0, L - e) for e in ext]  # validated: bs >= 1 entries
        for i, (p, e) in enumerate(zip(pre, ext)):
            if p + e > L:
                raise ValueError(f"request {i}: prefix_len {p} + extend_len {e} = {p + e} exceeds max_context_len={L}")
        seq = [p + e for p, e in zip(pre, ext)]
        i32 = lambda v: torch.tensor(v, dtype=torch.int32, device=self.world.device)  # [bs] int32
        return self._assemble(ForwardMode.EXTEND, seq, ext, extend_seq_lens=i32(ext), extend_prefix_lens=i32(pre))

    def decode(self, bs: int, seq_lens: _Lens = None) -> ForwardBatch:
        """DECODE: one row per request at position ``seq_len - 1`` (seq_lens incl. the token)."""
        seq = self._lens(seq_lens, bs, "seq_lens", 1, self.world.max_context_len, "max_context_len")
        return self._assemble(ForwardMode.DECODE, seq, [1] * bs)

    def idle(self, bs: int = 0) -> ForwardBatch:
        """IDLE: a rank with no requests (bs = 0, every tensor empty; ``bs`` is ignored)."""
        return self._assemble(ForwardMode.IDLE, [])

    def target_verify(self, bs: int, seq_lens: _Lens = None, trees: Sequence[DraftTree] | None = None) -> ForwardBatch:
        """TARGET_VERIFY: N rows per request; seq_lens = prefix; custom mask from the trees."""
        spec = self._need_spec(ForwardMode.TARGET_VERIFY)
        N, L = spec.num_draft_tokens, self.world.max_context_len
        seq = self._lens(seq_lens, bs, "seq_lens", 1, L - N, f"max_context_len={L} - N")
        trees = list(trees) if trees is not None else [DraftTree.draw(spec, self.rng) for _ in range(bs)]
        spec_info = make_verify_input(seq, trees, self.world.device, spec.topk)  # the trees' count and uniform N checked
        if trees[0].num_nodes != N:
            raise ValueError(f"trees[0] has {trees[0].num_nodes} nodes, expected N={N}")
        # the N draft slots after the prefix: KV column = prefix + node index; position = prefix + depth
        pos = [s + d for s, t in zip(seq, trees) for d in t.depths()]
        return self._assemble(ForwardMode.TARGET_VERIFY, seq, [N] * bs, N, pos, spec_info)

    def draft_extend(
        self, bs: int, version: int, seq_lens: _Lens = None, accept_length: _Lens = None, ragged: bool = False
    ) -> ForwardBatch:
        """DRAFT_EXTEND (v1: S+1 rows per request) or DRAFT_EXTEND_V2 (N rows per request). ``ragged=True`` (v1): only the
        accept+1 real rows per request (SGLang's old eager layout). A version other than 1 or 2: a ValueError
        (``DraftExtendInput``)."""
        mode = ForwardMode.DRAFT_EXTEND if version == 1 else ForwardMode.DRAFT_EXTEND_V2
        spec = self._need_spec(mode)
        acc = self._lens(accept_length, bs, "accept_length", 0, spec.num_steps, "num_steps", sample=self.rng.randint)
        spec_info = make_draft_extend_input(version, acc, spec, self.world.device, ragged)
        rows = spec_info.extend_seq_lens.tolist()  # at least one verified token before the new rows
        seq = self._lens(seq_lens, bs, "seq_lens", [r + 1 for r in rows], self.world.max_context_len, "max_context_len")
        return self._assemble(mode, seq, rows, spec_info=spec_info, meta=dict(accept_length=acc, ragged=ragged))

    def draft_decode(self, bs: int, seq_lens: _Lens = None) -> ForwardBatch:
        """Multi-step draft DECODE over ``bs`` sequences (layout in the module docstring)."""
        spec = self._need_spec(ForwardMode.DECODE)
        S, topk, L = spec.num_steps, spec.topk, self.world.max_context_len
        width = layout.KINDS["draft_decode"].span(spec)  # draft columns after the prefix: topk * S
        seq = self._lens(seq_lens, bs, "seq_lens", 1, L - width, f"max_context_len={L} - topk*S")
        # [step][seq][branch]: S blocks of bs*topk writes; the rows' step-0 positions are the prefix lengths
        writes = [(i, layout.draft_column(s, k, j, spec)) for j in range(S) for i, s in enumerate(seq) for k in range(topk)]
        pos = [s for s in seq for _ in range(topk)]
        return self._assemble(ForwardMode.DECODE, seq, (), width, pos, DraftDecodeInput(topk, S), writes)

    def for_mode(self, kind: layout.GraphKind | ForwardMode | str, bs: int, **kw) -> ForwardBatch:
        """Dispatch on a graph kind (a ``GraphKind``, its label or a forward mode; ``"draft_decode"``: multi-step draft
        decode; EXTEND too, eager only) to the method of its name. IDLE ignores ``bs`` (an idle batch has none)."""
        kind = layout.GraphKind.parse(kind)
        if kind.mode.is_idle() and kw:
            raise ValueError(f"IDLE takes no arguments, got {sorted(kw)}")
        if kind.mode.is_any_draft_extend():
            kw["version"] = 2 if kind.mode.is_draft_extend_v2() else 1
        return getattr(self, kind.label.removesuffix("_v2"))(bs, **kw)

    def release(self, batch: ForwardBatch):
        """Give the batch's request slots and their pages back to the world."""
        slots = batch.req_pool_indices.tolist()
        if foreign := [s for s in slots if s not in self._owned]:
            raise ValueError(f"request slots {foreign} were not allocated by this generator (or were already released)")
        self._free(slots)

    def release_all(self):
        """Free every request this generator still holds."""
        self._free(list(self._owned))

    def _free(self, slots):
        P = self.world.page_size
        for slot in slots:  # one entry per page: row[p*P] // P
            self.world.allocator.free_page_ids((self.world.req_to_token[slot, : self._owned.pop(slot) : P] // P).tolist())
            self.world.req_to_token_pool.free([slot])

    @property
    def live_requests(self) -> dict[int, int]:
        """request slot -> tokens reserved in its row, for requests not yet released."""
        return dict(self._owned)

    # --- internals ------------------------------------------------------------------------------
    def _need_spec(self, mode):
        if self.spec is None:
            raise ValueError(f"{mode.name} batches need a SpecConfig; BatchGenerator has spec=None")
        return self.spec

    def _check_bs(self, bs):
        pool = self.world.req_to_token_pool
        if bs < 1:
            raise ValueError(f"bs={bs} must be >= 1")
        if bs > pool.available:
            raise ValueError(f"bs={bs} exceeds the {pool.available} free request slots (pool size {pool.size}, slot 0 reserved)")

    def _lens(self, given, bs, name, lo, hi, limit, sample=None):
        """``bs`` checked, then ``given`` against ``[lo, hi]`` (``lo``: one bound, or one per request) or ``bs`` values
        drawn by ``sample``."""
        self._check_bs(bs)
        lows = lo if isinstance(lo, list) else [lo] * bs
        if hi < max(lows):
            raise ValueError(f"no room: the longest allowed {name} is {hi} ({limit}) but the minimum is {max(lows)}")
        if given is None:
            return [sample(lo, hi) if sample else self._sample_len(lo, hi, i) for i, lo in enumerate(lows)]
        out = [int(v) for v in given]  # ints, from a list or a tensor
        if len(out) != bs:
            raise ValueError(f"{name} has {len(out)} entries, expected bs={bs}")
        for i, (v, lo) in enumerate(zip(out, lows)):
            if not lo <= v <= hi:
                why = f"exceeds the limit {hi} ({limit})" if v > hi else f"is below the minimum {lo}"
                raise ValueError(f"{name}[{i}]={v} {why}")
        return out

    def _sample_len(self, lo, hi, i=None):
        """A realistic length in ``[lo, hi]`` for request ``i`` of a batch: short, long, near a page boundary, or uniform
        (``self.lengths`` narrows it; ``i=None``: an eager prefill's draw, always ``"mixed"``)."""
        assert lo <= hi, (lo, hi)
        r, P = self.rng, self.world.page_size
        unit = max(P, 16)
        if i is not None and self.lengths != "mixed":
            if i == 0 and self.lengths == "one long":
                return r.randint(max(lo, hi - 7), hi)
            hi = min(hi, lo + 2 * unit + 1)  # short, or across the first page boundary or two
        kind = r.choices("short long boundary uniform".split(), weights=[3, 3, 3, 2])[0]
        if kind == "short":
            return r.randint(lo, min(hi, lo + 7))
        if kind == "long":
            return r.randint(max(lo, hi - max(1, hi // 4)), hi)
        if kind == "boundary":
            unit = P if P > 1 else 16
            multiples = [m * unit for m in range(lo // unit, hi // unit + 2) if m > 0]
            if multiples:
                return min(max(r.choice(multiples) + r.choice([-1, 0, 1]), lo), hi)
        return r.randint(lo, hi)

    def _alloc(self, num_tokens):
        """Allocate one request per entry (all or nothing: the callers checked the count and lengths) and remember its
        length."""
        P = self.world.page_size
        pages, free = sum(-(-n // P) for n in num_tokens), self.world.allocator.free_pages
        if pages > free:
            raise ValueError(f"batch needs {pages} pages of {P} slots, only {free} free")
        slots = [self.world.new_request(n) for n in num_tokens]  # cannot fail after the checks above
        self._owned.update(zip(slots, num_tokens))
        return slots

    def _assemble(self, mode, seq, rows=(), span=0, positions=None, spec_info=None, writes=None, **extra) -> ForwardBatch:
        """The batch of new requests holding ``seq[i] + span`` tokens each, validated (``refimpl.validate``: slot 0
        unwritten, no slot written twice, all S steps in a draft decode): request i's ``rows[i]`` rows write KV at its
        last ``rows[i]`` columns, or ``writes`` gives each write's (request index, column) (multi-step draft decode:
        ``S`` blocks of writes); row j sits at ``positions[j]`` (None: the written column); random ``input_ids`` (one
        per position), ``seq_lens`` int32 on both sides."""
        dev, ends = self.world.device, [s + span for s in seq]
        i64 = lambda v: torch.tensor(v, dtype=torch.int64, device=dev)
        rpi = i64(self._alloc(ends))
        if writes is None:
            writes = [(i, c) for i, (e, k) in enumerate(zip(ends, rows)) for c in range(e - k, e)]
        pos, (req, col) = i64([c for _, c in writes] if positions is None else positions), i64(writes).view(-1, 2).T
        ids = torch.randint(0, self.world.cfg.vocab_size, (pos.numel(),), generator=self.torch_gen, device="cpu").to(dev)
        seq_dev, seq_cpu = (torch.tensor(seq, dtype=torch.int32, device=d) for d in (dev, "cpu"))
        loc = self.world.req_to_token[rpi[req], col].to(torch.int64)  # [T * steps]
        batch = ForwardBatch(mode, len(seq), ids, pos, rpi, seq_dev, seq_cpu, loc, sum(seq), self.world, spec_info, **extra)
        # a ragged draft extend (the old eager layout) is valid for eager only
        return validate_batch(batch, self.spec, for_graph=not batch.meta.get("ragged", False))
