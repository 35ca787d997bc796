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

__all__ = ["BatchGenerator", "draft_decode_step_view"]
_Lens = Sequence[int] | None


def draft_decode_step_view(batch: ForwardBatch) -> torch.Tensor:
    """A multi-step draft-decode batch's ``out_cache_loc`` as ``# [S, num_seqs*topk] int64``."""
    spec = batch.spec_info
    if not isinstance(spec, DraftDecodeInput):  # a ValueError: a bad batch, reported like every other one
        raise ValueError(f"not a draft-decode batch: spec_info is {type(spec).__name__}")
    return batch.out_cache_loc.view(spec.num_steps, batch.batch_size * spec.topk)


LENGTHS = ("mixed", "one long", "short")  # how a batch's lengths are drawn when not given (``BatchGenerator.lengths``)


class BatchGenerator:
    """Random batches per mode over ``world``; ``spec`` is needed by the speculative modes. ``lengths``, when a batch's
    lengths are not given: ``"mixed"`` (every request short, long, near a page boundary or uniform), ``"one long"``
    (request 0 within 8 of the longest the mode allows, the others short or near a small page boundary: long
    contexts at the cost of one request, what the checker draws) or ``"short"`` (every request so)."""

    def __init__(self, world: World, spec: SpecConfig | None = None, seed: int = 0, lengths: str = "mixed"):
        if lengths not in LENGTHS:
            raise ValueError(f"lengths={lengths!r}: expected one of {LENGTHS}")
        self.world, self.spec, self.lengths = world, spec, lengths
        self.rng = random.Random(seed)
        self.torch_gen = torch.Generator().manual_seed(seed)
        self._owned: dict[int, int] = {}  # request slot -> tokens allocated in its row

    # --- public: one method per mode ------------------------------------------------------------
    def extend(self, bs: int, prefix_lens: _Lens = None, extend_lens: _Lens = None) -> ForwardBatch:
        """EXTEND (eager prefill): ``extend_lens[i]`` new rows after a cached prefix."""
        L = self.world.max_context_len
        self._check_bs(bs, min_bs=1)
        if prefix_lens is not None:  # a prefix must leave room for >= 1 new token
            prefix_lens = self._lens(prefix_lens, bs, "prefix_lens", 0, L - 1, f"max_context_len={L} - 1")
        if extend_lens is None:  # room: tokens left after the prefix
            ext = [self._sample_len(1, max(1, min(L - p, L // 4))) for p in (prefix_lens or [0] * bs)]
        else:
            ext = self._lens(extend_lens, bs, "extend_lens", 1, L, f"max_context_len={L}")
        pre = prefix_lens if prefix_lens is not None else [self._sample_len(0, L - e) for e in ext]
        for i, (p, e) in enumerate(zip(pre, ext)):
            if p + e > L:
                raise ValueError(f"request {i}: prefix_len {p} + extend_len {e} = {p + e} exceeds max_context_len={L}")
        seq = [p + e for p, e in zip(pre, ext)]
        rpi, cols = self._alloc(seq), [list(range(p, p + e)) for p, e in zip(pre, ext)]
        i32 = lambda v: torch.tensor(v, dtype=torch.int32, device=self.world.device)  # [bs] int32
        extra = dict(extend_seq_lens=i32(ext), extend_prefix_lens=i32(pre))
        meta = dict(prefix_lens=pre, extend_lens=ext)
        return self._finish(self._assemble(ForwardMode.EXTEND, rpi, seq, cols, cols, meta=meta, **extra))

    def decode(self, bs: int, seq_lens: _Lens = None) -> ForwardBatch:
        """DECODE: one row per request at position ``seq_len - 1`` (seq_lens incl. the token)."""
        seq = self._lens(seq_lens, bs, "seq_lens", 1, self.world.max_context_len, "max_context_len")
        rpi, cols = self._alloc(seq), [[s - 1] for s in seq]
        return self._finish(self._assemble(ForwardMode.DECODE, rpi, seq, cols, cols))

    def idle(self) -> ForwardBatch:
        """IDLE: a rank with no requests (bs = 0, every tensor empty)."""
        e = lambda dtype=torch.int64, dev=self.world.device: torch.zeros(0, dtype=dtype, device=dev)  # [0]
        i32 = torch.int32  # seq_lens on the device and its host (cpu) copy; every other tensor int64
        return self._finish(ForwardBatch(ForwardMode.IDLE, 0, e(), e(), e(), e(i32), e(i32, "cpu"), e(), 0, self.world))

    def target_verify(self, bs: int, seq_lens: _Lens = None, trees: Sequence[DraftTree] | None = None) -> ForwardBatch:
        """TARGET_VERIFY: N rows per request; seq_lens = prefix; custom mask from the trees."""
        spec = self._need_spec(ForwardMode.TARGET_VERIFY)
        N, L, k = spec.num_draft_tokens, self.world.max_context_len, spec.topk
        seq = self._lens(seq_lens, bs, "seq_lens", 1, L - N, f"max_context_len={L} - N")
        rand = lambda: DraftTree.chain(N) if k == 1 else DraftTree.random(N, k, spec.num_steps, self.rng)
        trees = list(trees) if trees is not None else [rand() for _ in range(bs)]
        if len(trees) != bs:
            raise ValueError(f"got {len(trees)} trees for bs={bs}")
        for i, t in enumerate(trees):
            if t.num_nodes != N:
                raise ValueError(f"trees[{i}] has {t.num_nodes} nodes, expected N={N}")
        span = layout.request_span(ForwardMode.TARGET_VERIFY, spec)  # the N draft slots after the prefix
        rpi = self._alloc([s + span for s in seq])
        cols = [[s + q for q in range(N)] for s in seq]  # KV column = prefix + node index
        pos = [[s + d for d in t.depths()] for s, t in zip(seq, trees)]  # position = prefix + depth
        spec_info = make_verify_input(seq, trees, self.world.device, topk=spec.topk)
        meta = dict(trees=trees, draft_token_num=N)
        return self._finish(self._assemble(ForwardMode.TARGET_VERIFY, rpi, seq, cols, pos, spec_info, meta=meta))

    def draft_extend(
        self, bs: int, version: int, seq_lens: _Lens = None, accept_length: _Lens = None, ragged: bool = False
    ) -> ForwardBatch:
        """DRAFT_EXTEND (v1: S+1 rows per request) or DRAFT_EXTEND_V2 (N rows per request). ``ragged=True`` (v1): only the
        accept+1 real rows per request (SGLang's old eager layout)."""
        if version not in (1, 2):
            raise ValueError(f"draft extend version must be 1 or 2, got {version!r}")
        mode = ForwardMode.DRAFT_EXTEND if version == 1 else ForwardMode.DRAFT_EXTEND_V2
        spec = self._need_spec(mode)
        S, L = spec.num_steps, self.world.max_context_len
        acc = self._lens(accept_length, bs, "accept_length", 0, S, "num_steps", sample=self.rng.randint)
        spec_info = make_draft_extend_input(version, acc, spec, self.world.device, ragged)
        rows = spec_info.extend_seq_lens.tolist()
        if seq_lens is None:  # at least one verified token before the new rows
            seq = [self._sample_len(r + 1, L, i) for i, r in enumerate(rows)]
        else:
            seq = self._listify(seq_lens, bs, "seq_lens")
            for i, (s, r) in enumerate(zip(seq, rows)):
                self._check_range(f"seq_lens[{i}]", s, r + 1, L, "max_context_len")
        rpi, cols = self._alloc(seq), [list(range(s - r, s)) for s, r in zip(seq, rows)]
        meta = dict(accept_length=acc, rows_per_req=rows, ragged=ragged)
        return self._finish(self._assemble(mode, rpi, seq, cols, cols, spec_info, meta=meta))

    def draft_decode(self, bs: int, seq_lens: _Lens = None) -> ForwardBatch:
        """Multi-step draft DECODE over ``bs`` sequences (layout in the module docstring)."""
        spec = self._need_spec(ForwardMode.DECODE)
        S, topk, L = spec.num_steps, spec.topk, self.world.max_context_len
        width = layout.request_span(ForwardMode.DECODE, spec, True)  # draft columns after the prefix: topk * S
        seq = self._lens(seq_lens, bs, "seq_lens", 1, L - width, f"max_context_len={L} - topk*S")
        rpi, dev = self._alloc([s + width for s in seq]), self.world.device
        seq_t, rpi_t = (torch.tensor(v, dtype=torch.int64, device=dev) for v in (seq, rpi))  # [bs] each
        step, branch = torch.arange(S, device=dev).view(S, 1, 1), torch.arange(topk, device=dev).view(1, 1, topk)
        col = layout.draft_column(seq_t.view(1, bs, 1), branch, step, spec)  # [S, bs, topk]
        loc = self.world.req_to_token[rpi_t.view(1, bs, 1), col]  # [S, bs, topk] int32
        out_cache_loc = loc.reshape(-1).to(torch.int64)  # [S*bs*topk] int64, [step][seq][branch]
        positions = seq_t.repeat_interleave(topk)  # [bs*topk] int64: step 0 positions; seq_lens: the prefix
        meta, spec_info = {"multi_step_draft": True, "num_seqs": bs, "rows": bs * topk}, DraftDecodeInput(topk, S)
        return self._finish(self._batch(ForwardMode.DECODE, rpi_t, seq, positions, out_cache_loc, spec_info, meta=meta))

    def for_mode(self, mode: ForwardMode | layout.GraphKind | str, bs: int, **kw) -> ForwardBatch:
        """Dispatch on ``mode`` (or a graph kind); ``multi_step_draft=True`` turns DECODE into ``draft_decode``. IDLE
        ignores ``bs`` (an idle batch has none)."""
        mode = ForwardMode.parse(mode) if isinstance(mode, str) else mode
        multi = bool(kw.pop("multi_step_draft", False))
        if isinstance(mode, layout.GraphKind):
            mode, multi = mode.mode, mode.multi_step or multi
        if multi and not mode.is_decode():
            raise ValueError(f"multi_step_draft=True only applies to DECODE, got {mode.name}")
        if mode.is_idle():
            if kw:
                raise ValueError(f"IDLE takes no arguments, got {sorted(kw)}")
            return self.idle()
        if mode.is_decode():
            return self.draft_decode(bs, **kw) if multi else self.decode(bs, **kw)
        if mode.is_any_draft_extend():
            return self.draft_extend(bs, 2 if mode.is_draft_extend_v2() else 1, **kw)
        return self.extend(bs, **kw) if mode.is_extend() else self.target_verify(bs, **kw)

    def release(self, batch: ForwardBatch) -> None:
        """Give the batch's request slots and their pages back to the world."""
        slots = [int(s) for s in batch.req_pool_indices.cpu().tolist()]
        if foreign := [s for s in slots if s not in self._owned]:
            raise ValueError(f"request slots {foreign} were not allocated by this generator (or were already released)")
        self._free(slots)

    def release_all(self) -> None:
        """Free every request this generator still holds."""
        self._free(list(self._owned))

    def _free(self, slots: list[int]) -> None:
        P = self.world.page_size
        for slot in slots:
            n = self._owned.pop(slot)
            row = self.world.req_to_token[slot, :n].to(torch.int64).cpu()  # [n]
            pages = (row[::P] // P).tolist()  # one entry per page: row[p*P] // P
            assert len(pages) == -(-n // P)
            self.world.allocator.free_page_ids(pages)
            self.world.req_to_token_pool.free([slot])

    @property
    def live_requests(self) -> dict[int, int]:
        """request slot -> tokens reserved in its row, for requests not yet released."""
        return dict(self._owned)

    # --- internals ------------------------------------------------------------------------------
    def _need_spec(self, mode: ForwardMode) -> SpecConfig:
        if self.spec is None:
            raise ValueError(f"{mode.name} batches need a SpecConfig; BatchGenerator has spec=None")
        return self.spec

    def _check_bs(self, bs: int, min_bs: int) -> None:
        free, size = self.world.req_to_token_pool.available, self.world.req_to_token_pool.size
        if bs < min_bs:
            raise ValueError(f"bs={bs} must be >= {min_bs}")
        if bs > free:
            raise ValueError(f"bs={bs} exceeds the {free} free request slots (pool size {size}, slot 0 reserved)")

    @staticmethod
    def _listify(values: Sequence[int] | torch.Tensor, bs: int, name: str) -> list[int]:
        out = [int(v) for v in (values.tolist() if isinstance(values, torch.Tensor) else values)]
        if len(out) != bs:
            raise ValueError(f"{name} has {len(out)} entries, expected bs={bs}")
        return out

    @staticmethod
    def _check_range(name: str, value: int, lo: int, hi: int, limit_name: str) -> None:
        if value > hi:
            raise ValueError(f"{name}={value} exceeds the limit {hi} ({limit_name})")
        if value < lo:
            raise ValueError(f"{name}={value} is below the minimum {lo}")

    def _lens(self, given: _Lens, bs: int, name: str, lo: int, hi: int, limit: str, sample=None) -> list[int]:
        """``bs`` checked, then ``given`` against ``[lo, hi]`` or ``bs`` values drawn by ``sample``."""
        self._check_bs(bs, min_bs=1)
        if hi < lo:
            raise ValueError(f"no room: the longest allowed {name} is {hi} ({limit}) but the minimum is {lo}")
        if given is None:
            return [sample(lo, hi) if sample else self._sample_len(lo, hi, i) for i in range(bs)]
        out = self._listify(given, bs, name)
        for i, v in enumerate(out):
            self._check_range(f"{name}[{i}]", v, lo, hi, limit)
        return out

    def _sample_len(self, lo: int, hi: int, i: int | None = None) -> int:
        """A realistic length in ``[lo, hi]`` for request ``i`` of a batch: short, long, near a page boundary, or uniform
        (``self.lengths`` narrows it; ``i=None``: an eager prefill's draw, always ``"mixed"``)."""
        assert lo <= hi, (lo, hi)
        r, unit = self.rng, max(self.world.page_size, 16)
        if i is not None and self.lengths != "mixed":
            if i == 0 and self.lengths == "one long":
                return r.randint(max(lo, hi - 7), hi)
            hi = min(hi, lo + 2 * unit + 1)  # short, or across the first page boundary or two
        kind = r.choices(["short", "long", "boundary", "uniform"], weights=[3, 3, 3, 2])[0]
        if kind == "short":
            return r.randint(lo, min(hi, lo + 7))
        if kind == "long":
            return r.randint(max(lo, hi - max(1, hi // 4)), hi)
        if kind == "boundary":
            unit = self.world.page_size if self.world.page_size > 1 else 16
            multiples = [m * unit for m in range(lo // unit, hi // unit + 2) if m > 0]
            if multiples:
                return min(max(r.choice(multiples) + r.choice([-1, 0, 1]), lo), hi)
        return r.randint(lo, hi)

    def _alloc(self, num_tokens: list[int]) -> list[int]:
        """Allocate one request per entry (all or nothing) and remember its length."""
        L, P = self.world.max_context_len, self.world.page_size
        for i, n in enumerate(num_tokens):
            if n > L:
                raise ValueError(f"request {i} needs {n} tokens, exceeds max_context_len={L}")
        pages, free = sum(-(-n // P) for n in num_tokens), self.world.allocator.free_pages
        if pages > free:
            raise ValueError(f"batch needs {pages} pages of {P} slots, only {free} free")
        self._check_bs(len(num_tokens), min_bs=0)
        slots = [self.world.new_request(n) for n in num_tokens]  # cannot fail after the checks above
        self._owned.update(zip(slots, num_tokens))
        return slots

    def _assemble(self, mode, rpi: list[int], seq: list[int], cols, positions, spec_info=None, **extra) -> ForwardBatch:
        """Rows of request i write KV at ``r2t[rpi[i], cols[i]]`` and sit at ``positions[i]``."""
        i64 = lambda v: torch.tensor(v, dtype=torch.int64, device=self.world.device)
        rpi_t, row_rpi = i64(rpi), i64([r for r, cs in zip(rpi, cols) for _ in cs])  # [bs]; [T]: every row's request
        out_cache_loc = self.world.req_to_token[row_rpi, i64([c for cs in cols for c in cs])].to(torch.int64)  # [T]
        pos = i64([p for ps in positions for p in ps])  # [T]
        return self._batch(mode, rpi_t, seq, pos, out_cache_loc, spec_info, **extra)

    def _batch(self, mode, rpi_t, seq: list[int], positions, out_cache_loc, spec_info, **extra) -> ForwardBatch:
        """A batch with random ``input_ids`` (one per position) and ``seq_lens`` int32 on both sides."""
        n, dev = positions.numel(), self.world.device
        ids = torch.randint(0, self.world.cfg.vocab_size, (n,), generator=self.torch_gen, device="cpu").to(dev)  # [T]
        seq_dev, seq_cpu = (torch.tensor(seq, dtype=torch.int32, device=d) for d in (dev, "cpu"))
        fields = (ids, positions, rpi_t, seq_dev, seq_cpu, out_cache_loc, sum(seq), self.world, spec_info)
        return ForwardBatch(mode, len(seq), *fields, **extra)

    def _finish(self, batch: ForwardBatch) -> ForwardBatch:
        """Validate (and assert the generator's own invariants) before handing the batch out."""
        spec = batch.spec_info
        if isinstance(spec, DraftDecodeInput):  # all S steps: [step][seq][branch]
            assert batch.out_cache_loc.numel() == spec.num_steps * batch.num_tokens
        # a ragged draft extend (the old eager layout) is valid for eager only
        validate_batch(batch, self.spec, for_graph=not batch.meta.get("ragged", False))
        assert not bool((batch.out_cache_loc == 0).any()), "live rows never write slot 0"
        assert batch.out_cache_loc.unique().numel() == batch.out_cache_loc.numel()
        return batch
