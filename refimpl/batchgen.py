"""Realistic random ``ForwardBatch`` es, one generator method per forward mode.

Every method allocates fresh requests in a ``World`` (``World.new_request`` reserves a request
slot plus token slots for every position the request will touch and fills its ``req_to_token``
row), builds the batch on ``world.device`` and validates it (``refimpl.validate``). ``release``
gives the request slots and pages back.

Row layouts (``rpi`` = ``req_pool_indices``, ``r2t`` = ``world.req_to_token``; see the
``seq_lens`` table in ``refimpl/batch.py``):

| mode              | rows of req i    | seq_lens[i]         | row j position   | row j r2t column |
|-------------------|------------------|---------------------|------------------|------------------|
| EXTEND            | ext_i (ragged)   | prefix_i + ext_i    | prefix_i + j     | prefix_i + j     |
| DECODE            | 1                | incl. the new token | seq_len_i - 1    | seq_len_i - 1    |
| TARGET_VERIFY     | N                | prefix_i only       | prefix_i + dep_j | prefix_i + j     |
| DRAFT_EXTEND v1   | acc_i+1 (ragged) | incl. the new rows  | seq_len_i-rows+j | seq_len_i-rows+j |
| DRAFT_EXTEND_V2   | N                | incl. the N rows    | seq_len_i - N+j  | seq_len_i - N+j  |
| DECODE multi-step | topk (branches)  | prefix (verified)   | seq_len_r (+step)| see below        |

(``dep_j`` = depth of draft node j in request i's tree; ``acc_i`` = ``accept_length[i]``.)

Multi-step draft decode (``draft_decode``): with ``num_seqs`` sequences, ``topk`` branches and
``S`` steps, the batch has ``num_seqs*topk`` rows ordered ``[seq][branch]`` (the rows of step 0;
step j re-uses them with positions + j). Branch k's draft tokens live at ``r2t`` columns
``seq_len + k*S + j`` (branch-major), so each request is allocated ``seq_len + topk*S`` tokens.
``out_cache_loc`` has ``S*num_seqs*topk`` entries ordered ``[step][seq][branch]``. Example:
2 sequences with ``seq_lens = [5, 3]``, topk = 2, S = 3::

    r2t row of seq 0:  cols 0..4 prefix | 5 6 7 branch 0 steps 0..2 | 8 9 10 branch 1
    positions      = [5, 5, 3, 3]                      # [num_seqs*topk]: step 0; step j: +j
    out_cache_loc  = [r2t[s0,5], r2t[s0,8], r2t[s1,3], r2t[s1,6],     # step 0
                      r2t[s0,6], r2t[s0,9], r2t[s1,4], r2t[s1,7],     # step 1
                      r2t[s0,7], r2t[s0,10], r2t[s1,5], r2t[s1,8]]    # step 2

``draft_decode_step_view(batch)`` reshapes it to ``[S, num_seqs*topk]``.

Target verify example (N = 3, tree ``[-1, 0, 0]``, prefix 5): rows sit at positions
``[5, 6, 6]`` and write KV at ``r2t`` columns ``[5, 6, 7]``.

Lengths are sampled to look like real traffic: a mix of short sequences, long ones close to
``max_context_len``, lengths one below / at / one above a page boundary (the page size, or 16
when pages are single tokens) and uniform ones; they always leave room for the positions the
mode touches. Asking for more raises a ``ValueError`` naming the length and the limit.
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


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def draft_decode_step_view(batch: ForwardBatch) -> torch.Tensor:
    """A multi-step draft-decode batch's ``out_cache_loc`` as ``# [S, num_seqs*topk] int64``."""
    spec = batch.spec_info
    if not isinstance(spec, DraftDecodeInput):
        raise ValueError(  # noqa: TRY004  (a bad batch, reported like every other one)
            f"not a draft-decode batch: spec_info is {type(spec).__name__}"
        )
    rows = batch.batch_size * spec.topk
    return batch.out_cache_loc.view(spec.num_steps, rows)


class BatchGenerator:
    """Random batches per mode over ``world``; ``spec`` is needed by the speculative modes."""

    def __init__(self, world: World, spec: SpecConfig | None = None, seed: int = 0):
        self.world = world
        self.spec = spec
        self.rng = random.Random(seed)
        self.torch_gen = torch.Generator().manual_seed(seed)
        self._owned: dict[int, int] = {}  # request slot -> tokens allocated in its row

    # ---------------------------------------------------------------------------------------
    # public: one method per mode
    # ---------------------------------------------------------------------------------------
    def extend(
        self, bs: int, prefix_lens: Sequence[int] | None = None, extend_lens: Sequence[int] | None = None
    ) -> ForwardBatch:
        """EXTEND (eager prefill): ``extend_lens[i]`` new rows after a cached prefix."""
        L = self.world.max_context_len
        self._check_bs(bs, min_bs=1)
        if prefix_lens is None:
            pre = None
        else:
            pre = self._listify(prefix_lens, bs, "prefix_lens")
            for i, p in enumerate(pre):  # a prefix must leave room for >= 1 new token
                self._check_range(f"prefix_lens[{i}]", p, 0, L - 1, f"max_context_len={L} - 1")
        if extend_lens is None:
            room = [L - p for p in (pre or [0] * bs)]  # tokens left after the prefix
            ext = [self._sample_len(1, max(1, min(r, L // 4))) for r in room]
        else:
            ext = self._listify(extend_lens, bs, "extend_lens")
            for i, e in enumerate(ext):
                self._check_range(f"extend_lens[{i}]", e, 1, L, f"max_context_len={L}")
        if pre is None:
            pre = [self._sample_len(0, L - e) for e in ext]
        for i, (p, e) in enumerate(zip(pre, ext)):
            if p + e > L:
                raise ValueError(f"request {i}: prefix_len {p} + extend_len {e} = {p + e} exceeds max_context_len={L}")
        seq = [p + e for p, e in zip(pre, ext)]
        rpi = self._alloc(seq)

        cols = [list(range(p, p + e)) for p, e in zip(pre, ext)]
        batch = self._assemble(
            ForwardMode.EXTEND,
            rpi,
            seq,
            cols,
            positions=cols,
            extend_seq_lens=self._i32(ext),
            extend_prefix_lens=self._i32(pre),
        )
        batch.meta.update(prefix_lens=pre, extend_lens=ext)
        return self._finish(batch)

    def decode(self, bs: int, seq_lens: Sequence[int] | None = None) -> ForwardBatch:
        """DECODE: one row per request at position ``seq_len - 1`` (seq_lens incl. the token)."""
        L = self.world.max_context_len
        self._check_bs(bs, min_bs=1)
        seq = self._lens(seq_lens, bs, "seq_lens", 1, L, "max_context_len")
        rpi = self._alloc(seq)
        cols = [[s - 1] for s in seq]
        return self._finish(self._assemble(ForwardMode.DECODE, rpi, seq, cols, positions=cols))

    def idle(self) -> ForwardBatch:
        """IDLE: a rank with no requests (bs = 0, every tensor empty)."""
        dev = self.world.device
        empty64 = torch.zeros(0, dtype=torch.int64, device=dev)
        batch = ForwardBatch(
            forward_mode=ForwardMode.IDLE,
            batch_size=0,
            input_ids=empty64.clone(),  # [0] int64
            positions=empty64.clone(),  # [0] int64
            req_pool_indices=empty64.clone(),  # [0] int64
            seq_lens=torch.zeros(0, dtype=torch.int32, device=dev),  # [0] int32
            seq_lens_cpu=torch.zeros(0, dtype=torch.int32, device="cpu"),  # [0] int32, cpu
            out_cache_loc=empty64.clone(),  # [0] int64
            seq_lens_sum=0,
            world=self.world,
        )
        return self._finish(batch)

    def target_verify(
        self, bs: int, seq_lens: Sequence[int] | None = None, trees: Sequence[DraftTree] | None = None
    ) -> ForwardBatch:
        """TARGET_VERIFY: N rows per request; seq_lens = prefix; custom mask from the trees."""
        spec = self._need_spec(ForwardMode.TARGET_VERIFY)
        N, L = spec.num_draft_tokens, self.world.max_context_len
        self._check_bs(bs, min_bs=1)
        seq = self._lens(seq_lens, bs, "seq_lens", 1, L - N, f"max_context_len={L} - N")
        if trees is None:
            trees = [self._random_tree(spec) for _ in range(bs)]
        trees = list(trees)
        if len(trees) != bs:
            raise ValueError(f"got {len(trees)} trees for bs={bs}")
        for i, t in enumerate(trees):
            if t.num_nodes != N:
                raise ValueError(f"trees[{i}] has {t.num_nodes} nodes, expected N={N}")
        rpi = self._alloc([s + N for s in seq])  # prefix + the N draft slots

        cols = [[s + q for q in range(N)] for s in seq]  # KV column = prefix + node index
        pos = [[s + d for d in t.depths()] for s, t in zip(seq, trees)]  # position = prefix+depth
        spec_info = make_verify_input(seq, trees, self.world.device, topk=spec.topk)
        batch = self._assemble(ForwardMode.TARGET_VERIFY, rpi, seq, cols, positions=pos, spec_info=spec_info)
        batch.meta.update(trees=trees, draft_token_num=N)
        return self._finish(batch)

    def draft_extend(
        self,
        bs: int,
        version: int,
        seq_lens: Sequence[int] | None = None,
        accept_length: Sequence[int] | None = None,
        ragged: bool = False,
    ) -> ForwardBatch:
        """DRAFT_EXTEND (v1: S+1 rows per request) or DRAFT_EXTEND_V2 (N rows per request).

        ``ragged=True`` (v1): only the accept+1 real rows per request (SGLang's old eager layout).
        """
        if version not in (1, 2):
            raise ValueError(f"draft extend version must be 1 or 2, got {version!r}")
        mode = ForwardMode.DRAFT_EXTEND if version == 1 else ForwardMode.DRAFT_EXTEND_V2
        spec = self._need_spec(mode)
        S, L = spec.num_steps, self.world.max_context_len
        self._check_bs(bs, min_bs=1)
        if accept_length is None:
            acc = [self.rng.randint(0, S) for _ in range(bs)]
        else:
            acc = self._listify(accept_length, bs, "accept_length")
            for i, a in enumerate(acc):
                self._check_range(f"accept_length[{i}]", a, 0, S, "num_steps")
        spec_info = make_draft_extend_input(version, acc, spec, self.world.device, ragged)
        rows = spec_info.extend_seq_lens.tolist()
        if seq_lens is None:  # at least one verified token before the new rows
            seq = [self._sample_len(r + 1, L) for r in rows]
        else:
            seq = self._listify(seq_lens, bs, "seq_lens")
            for i, (s, r) in enumerate(zip(seq, rows)):
                self._check_range(f"seq_lens[{i}]", s, r + 1, L, "max_context_len")
        rpi = self._alloc(seq)

        cols = [list(range(s - r, s)) for s, r in zip(seq, rows)]
        batch = self._assemble(mode, rpi, seq, cols, positions=cols, spec_info=spec_info)
        batch.meta.update(accept_length=acc, rows_per_req=rows, ragged=ragged)
        return self._finish(batch)

    def draft_decode(self, bs: int, seq_lens: Sequence[int] | None = None) -> ForwardBatch:
        """Multi-step draft DECODE over ``bs`` sequences (layout in the module docstring)."""
        spec = self._need_spec(ForwardMode.DECODE)
        S, topk, L = spec.num_steps, spec.topk, self.world.max_context_len
        self._check_bs(bs, min_bs=1)
        width = layout.request_span(ForwardMode.DECODE, spec, True)  # draft columns after the prefix: topk * S
        seq = self._lens(seq_lens, bs, "seq_lens", 1, L - width, f"max_context_len={L} - topk*S")
        rpi = self._alloc([s + width for s in seq])

        dev = self.world.device
        seq_t = torch.tensor(seq, dtype=torch.int64, device=dev)  # [bs]
        rpi_t = torch.tensor(rpi, dtype=torch.int64, device=dev)  # [bs]
        step = torch.arange(S, device=dev).view(S, 1, 1)  # [S,1,1]
        branch = torch.arange(topk, device=dev).view(1, 1, topk)  # [1,1,topk]
        col = seq_t.view(1, bs, 1) + branch * S + step  # [S, bs, topk]
        loc = self.world.req_to_token[rpi_t.view(1, bs, 1), col]  # [S, bs, topk] int32
        out_cache_loc = loc.reshape(-1).to(torch.int64)  # [S*bs*topk] int64, [step][seq][branch]
        positions = seq_t.repeat_interleave(topk)  # [bs*topk] int64: step 0 positions

        batch = ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=self._random_ids(bs * topk),  # [bs*topk] int64
            positions=positions,
            req_pool_indices=rpi_t,
            seq_lens=seq_t.to(torch.int32),  # [bs] int32: prefix (verified tokens)
            seq_lens_cpu=torch.tensor(seq, dtype=torch.int32, device="cpu"),  # [bs] int32, cpu
            out_cache_loc=out_cache_loc,
            seq_lens_sum=sum(seq),
            world=self.world,
            spec_info=DraftDecodeInput(topk=topk, num_steps=S),
            meta={"multi_step_draft": True, "num_seqs": bs, "rows": bs * topk},
        )
        return self._finish(batch)

    def for_mode(self, mode: ForwardMode | layout.GraphKind | str, bs: int, **kw) -> ForwardBatch:
        """Dispatch on ``mode`` (or a graph kind); ``multi_step_draft=True`` turns DECODE into
        ``draft_decode``. IDLE ignores ``bs`` (an idle batch has none)."""
        if isinstance(mode, str):
            mode = ForwardMode.parse(mode)
        multi = bool(kw.pop("multi_step_draft", False))
        if isinstance(mode, layout.GraphKind):
            mode, multi = mode.mode, mode.multi_step or multi
        if multi and not mode.is_decode():
            raise ValueError(f"multi_step_draft=True only applies to DECODE, got {mode.name}")
        if mode.is_extend():
            return self.extend(bs, **kw)
        if mode.is_decode():
            return self.draft_decode(bs, **kw) if multi else self.decode(bs, **kw)
        if mode.is_idle():
            if kw:
                raise ValueError(f"IDLE takes no arguments, got {sorted(kw)}")
            return self.idle()
        if mode.is_target_verify():
            return self.target_verify(bs, **kw)
        if mode.is_draft_extend_v1():
            return self.draft_extend(bs, 1, **kw)
        if mode.is_draft_extend_v2():
            return self.draft_extend(bs, 2, **kw)
        raise ValueError(f"no generator for mode {mode!r}")  # pragma: no cover

    def release(self, batch: ForwardBatch) -> None:
        """Give the batch's request slots and their pages back to the world."""
        slots = [int(s) for s in batch.req_pool_indices.cpu().tolist()]
        foreign = [s for s in slots if s not in self._owned]
        if foreign:
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
            assert len(pages) == _cdiv(n, P)
            self.world.allocator.free_page_ids(pages)
            self.world.req_to_token_pool.free([slot])

    @property
    def live_requests(self) -> dict[int, int]:
        """request slot -> tokens reserved in its row, for requests not yet released."""
        return dict(self._owned)

    # ---------------------------------------------------------------------------------------
    # internals
    # ---------------------------------------------------------------------------------------
    def _need_spec(self, mode: ForwardMode) -> SpecConfig:
        if self.spec is None:
            raise ValueError(f"{mode.name} batches need a SpecConfig; BatchGenerator has spec=None")
        return self.spec

    def _check_bs(self, bs: int, min_bs: int) -> None:
        free = self.world.req_to_token_pool.available
        if bs < min_bs:
            raise ValueError(f"bs={bs} must be >= {min_bs}")
        if bs > free:
            raise ValueError(
                f"bs={bs} exceeds the {free} free request slots "
                f"(pool size {self.world.req_to_token_pool.size}, slot 0 reserved)"
            )

    @staticmethod
    def _listify(values: Sequence[int] | torch.Tensor, bs: int, name: str) -> list[int]:
        if isinstance(values, torch.Tensor):
            values = values.detach().cpu().tolist()
        out = [int(v) for v in values]
        if len(out) != bs:
            raise ValueError(f"{name} has {len(out)} entries, expected bs={bs}")
        return out

    @staticmethod
    def _check_range(name: str, value: int, lo: int, hi: int, limit_name: str) -> None:
        if value > hi:
            raise ValueError(f"{name}={value} exceeds the limit {hi} ({limit_name})")
        if value < lo:
            raise ValueError(f"{name}={value} is below the minimum {lo}")

    def _lens(self, given: Sequence[int] | None, bs: int, name: str, lo: int, hi: int, limit: str) -> list[int]:
        if hi < lo:
            raise ValueError(f"no room: the longest allowed {name} is {hi} ({limit}) but the minimum is {lo}")
        if given is None:
            return [self._sample_len(lo, hi) for _ in range(bs)]
        out = self._listify(given, bs, name)
        for i, v in enumerate(out):
            self._check_range(f"{name}[{i}]", v, lo, hi, limit)
        return out

    def _sample_len(self, lo: int, hi: int) -> int:
        """A realistic length in ``[lo, hi]``: short, long, near a page boundary, or uniform."""
        assert lo <= hi, (lo, hi)
        r = self.rng
        kind = r.choices(["short", "long", "boundary", "uniform"], weights=[3, 3, 3, 2])[0]
        if kind == "short":
            return r.randint(lo, min(hi, lo + 7))
        if kind == "long":
            return r.randint(max(lo, hi - max(1, hi // 4)), hi)
        if kind == "boundary":
            unit = self.world.page_size if self.world.page_size > 1 else 16
            multiples = [m * unit for m in range(lo // unit, hi // unit + 2) if m > 0]
            if multiples:
                v = r.choice(multiples) + r.choice([-1, 0, 1])
                return min(max(v, lo), hi)
        return r.randint(lo, hi)

    def _alloc(self, num_tokens: list[int]) -> list[int]:
        """Allocate one request per entry (all or nothing) and remember its length."""
        L, P = self.world.max_context_len, self.world.page_size
        for i, n in enumerate(num_tokens):
            if n > L:
                raise ValueError(f"request {i} needs {n} tokens, exceeds max_context_len={L}")
        pages = sum(_cdiv(n, P) for n in num_tokens)
        free = self.world.allocator.free_pages
        if pages > free:
            raise ValueError(f"batch needs {pages} pages of {P} slots, only {free} free")
        self._check_bs(len(num_tokens), min_bs=0)
        slots = []
        for n in num_tokens:
            slot = self.world.new_request(n)
            self._owned[slot] = n
            slots.append(slot)
        return slots

    def _random_tree(self, spec: SpecConfig) -> DraftTree:
        if spec.topk == 1:
            return DraftTree.chain(spec.num_draft_tokens)
        return DraftTree.random(spec.num_draft_tokens, spec.topk, spec.num_steps, self.rng)

    def _random_ids(self, n: int) -> torch.Tensor:
        ids = torch.randint(0, self.world.cfg.vocab_size, (n,), generator=self.torch_gen, device="cpu")
        return ids.to(self.world.device)  # [n] int64, device

    def _i32(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=self.world.device)

    def _assemble(
        self,
        mode: ForwardMode,
        rpi: list[int],
        seq: list[int],
        cols: list[list[int]],
        positions: list[list[int]],
        spec_info: object = None,
        **extra,
    ) -> ForwardBatch:
        """Rows of request i write KV at ``r2t[rpi[i], cols[i]]`` and sit at ``positions[i]``."""
        dev = self.world.device
        row_req = [i for i, c in enumerate(cols) for _ in c]  # request of every row
        flat_cols = torch.tensor([c for cs in cols for c in cs], dtype=torch.int64, device=dev)
        rpi_t = torch.tensor(rpi, dtype=torch.int64, device=dev)  # [bs] int64
        row_rpi = rpi_t[torch.tensor(row_req, dtype=torch.int64, device=dev)]  # [T]
        out_cache_loc = self.world.req_to_token[row_rpi, flat_cols].to(torch.int64)  # [T]
        pos = torch.tensor([p for ps in positions for p in ps], dtype=torch.int64, device=dev)
        return ForwardBatch(
            forward_mode=mode,
            batch_size=len(rpi),
            input_ids=self._random_ids(len(row_req)),  # [T] int64
            positions=pos,  # [T] int64
            req_pool_indices=rpi_t,  # [bs] int64
            seq_lens=torch.tensor(seq, dtype=torch.int32, device=dev),  # [bs] int32
            seq_lens_cpu=torch.tensor(seq, dtype=torch.int32, device="cpu"),  # [bs] int32, cpu
            out_cache_loc=out_cache_loc,  # [T] int64
            seq_lens_sum=int(sum(seq)),
            world=self.world,
            spec_info=spec_info,
            **extra,
        )

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
