"""The device half of batch validation (``refimpl.validate``): one launch, one small result.

One sync per index tensor, and a pool-sized slot -> request map per call (127 ms per replay, 197k-slot pool, H200), were
the old cost. This kernel checks every device-side rule over the batch's own entries (the held rule: against the request
table) and writes a few int64s:

| category (``CATEGORIES[k]``) | an entry is bad when |
|---|---|
| ``req_pool_indices range`` | ``rpi[i]`` outside ``[1, pool)`` |
| ``req_pool_indices duplicate`` | ``rpi[i] == rpi[j]`` for some ``j < i`` |
| ``input_ids range`` / ``positions range`` | outside ``[0, vocab)`` / ``[0, L)`` |
| ``out_cache_loc range`` | outside ``[1, num_slots)`` |
| ``out_cache_loc duplicate`` | ``loc[e] == loc[f]`` for some ``f < e`` |
| ``out_cache_loc slot`` | ``loc[e] != req_to_token[rpi[r], col(e)]``: the write is not its row's own new position |
| ``custom_mask self`` | verify (a mask given): draft row ``e`` (request ``r = e // N``, draft ``j = e % N``) does not see itself: its entry ``N * sum(seq_lens[:r]) + r*N*N + j*(seq_r + N) + seq_r + j`` of the tree mask is False (an all-False mask, too) |
| ``seq_lens host`` | ``seq_lens[i] != host_seq_lens[i]`` (a deferred replay's check that the device copy equals ``seq_lens_cpu``, staged in pinned host memory the kernel reads in place: ``refimpl.validate``) |
| ``out_cache_loc held`` | a live row ``p`` (``live_rows``: the pool's allocation state; default every row but 0) holds ``loc[e]`` at a position ``(p, c)`` other than ``e``'s own ``(rpi[r], col(e))``: that KV would be overwritten (a freed row is zeroed; 0 holds nothing) |

Write ``e`` is row ``e % n`` of step ``e // n`` (S = m / n steps: multi-step draft decode; else 1), row ``j`` of its
request ``r``'s ``per`` rows, and fills column ``col(e) = seq_lens[r] + extra - per*S + j*S + e // n`` of the request's
``req_to_token`` row: decode ``seq - 1``; verify (extra N) ``seq + j``; extend and draft extend ``seq - per + j``;
multi-step (extra topk*S) ``seq + k*S + step`` for branch k. A ragged batch passes ``row_req [2, n]``: each row's
request and ``j - per_r`` (its column is ``seq_lens[r] + extra + j - per_r``). A write outside ``[0, L)`` owns nothing.

The held rule scans the request table (``pool * L`` entries), never the KV pool: program ``(b, q)`` checks entry block
``b`` against table part ``q`` of ``table_split`` (``TABLE_CHUNK`` entries an iteration), so the parts run in parallel.

``out`` (int64): ``[nprog, len(CATEGORIES)]`` per-program smallest bad index (``NONE``: none; the host takes the
minimum), then copies of ``seq_lens``, ``accept_length``, ``extend_seq_lens`` (``bs`` each).
"""

import functools
import operator
from collections import Counter

import torch
import triton
import triton.language as tl

from .. import _env
from ._op import cdiv, direct_launch, kernel_op, no_specialisation

CATEGORIES = (
    "req_pool_indices range",
    "req_pool_indices duplicate",
    "input_ids range",
    "positions range",
    "out_cache_loc range",
    "out_cache_loc duplicate",
    "out_cache_loc slot",
    "custom_mask self",
    "seq_lens host",
    "out_cache_loc held",
)
NCAT = len(CATEGORIES)
assert NCAT <= 17 and CATEGORIES[-1] == "out_cache_loc held"  # the kernel's table parts fill the first 16, then held
NONE = 1 << 62  # "no bad entry" in a category
BLOCK = 16  # entries per program
CHUNK = 256  # compared entries per loop iteration: few, wide iterations
TABLE_CHUNK = 1024  # the held rule's scan: table entries per iteration
# ... in at least MIN_SPLIT parts per entry block, and parts enough for about PROGRAMS programs in all (an H200 has 132
# SMs): with 4 parts, a bs-1 batch scanned a 322 x 4096 table in 1.8 ms of GPU time, ten times its decode graph
# (the interpreter runs programs one after another: 8 there)
MIN_SPLIT, PROGRAMS = 4, 8 if _env.INTERPRET else 256
_NO_TENSORS = (None,) * 6  # batch_check's optional tensors, absent


@functools.lru_cache(256)  # the replay path's sizes: a few per runner (host µs)
def _blocks(bs: int, num_rows: int, num_writes: int) -> int:
    return cdiv(max(bs, num_rows, num_writes, 1), BLOCK)


def table_split(blocks: int) -> int:
    """Table parts per entry block."""
    return max(MIN_SPLIT, -(-PROGRAMS // blocks))


@functools.lru_cache(256)
def num_programs(bs: int, num_rows: int, num_writes: int) -> int:
    """Programs (entry block, table part): rows of ``out``."""
    return (blocks := _blocks(bs, num_rows, num_writes)) * table_split(blocks)


@functools.lru_cache(256)
def result_size(bs: int, num_rows: int, num_writes: int) -> int:
    """int64 entries ``out`` needs: the per-program minima, then three ``[bs]`` copies; never less for larger sizes (a
    buffer sized for a runner's largest batch holds every smaller one's)."""
    return (PROGRAMS + MIN_SPLIT * _blocks(bs, num_rows, num_writes)) * NCAT + 3 * bs


@triton.jit
def _ld(ptr, idx, ok, other):
    """``ptr[idx]`` where ``ok`` (else ``other``), as int64."""
    return tl.load(ptr + idx, mask=ok, other=other).to(tl.int64)


@triton.jit
def _put(res, bad, e, NONE_: tl.constexpr):
    """Store at ``res`` the smallest entry index ``e`` that is ``bad`` (``NONE_``: none)."""
    tl.store(res, tl.min(tl.where(bad, e, NONE_), 0))


@triton.jit
def _has_earlier_equal(x, e, src_ptr, count, CHUNK_: tl.constexpr):
    """[BLOCK] bool: x[i] equals src[j] for some j < e[i] (j < count)."""
    dup = tl.zeros(x.shape, dtype=tl.int32)
    for c0 in range(0, count, CHUNK_):
        j = c0 + tl.arange(0, CHUNK_).to(tl.int64)
        hit = (x[:, None] == _ld(src_ptr, j, j < count, 0)[None, :]) & (j[None, :] < e[:, None])
        dup = tl.maximum(dup, tl.max(hit.to(tl.int32), 1))
    return dup > 0


# one compiled kernel for every batch (a variant per batch: minutes of compiles in a GPU test run): the first 26
# arguments, the 13 pointers then the sizes, everything but the constexprs
@triton.jit(**no_specialisation(26, 13))
def _batch_check_kernel(
    out_ptr,  # [nprog * NCAT + 3 * bs] int64, written
    r2t_ptr,  # [pool, L] int32 req_to_token
    seq_ptr,  # [bs] int32 seq_lens (device)
    rpi_ptr,  # [bs] req_pool_indices
    ids_ptr,  # [n] input_ids
    pos_ptr,  # [n] positions
    loc_ptr,  # [m] out_cache_loc (m = n, or S * n in multi-step draft decode)
    acc_ptr,  # [bs] accept_length (read when HAS_ACC)
    ext_ptr,  # [bs] extend_seq_lens (read when HAS_EXT)
    row_req_ptr,  # [2, n] each row's request, then j - per_r (read when HAS_ROW_REQ)
    mask_ptr,  # [mask_size] bool tree mask (read when HAS_MASK)
    live_ptr,  # [pool] bool: the live request rows (read when HAS_LIVE)
    host_ptr,  # [bs] int32 seq_lens_cpu, staged in pinned host memory (read in place when HAS_HOST)
    r2t_stride,
    pool,
    L,
    vocab,
    slots,
    bs,
    n,
    m,
    rows_per_req,
    extra,  # columns a request spans past seq_lens (verify N, multi-step topk * S)
    mask_size,
    nprog,
    split,  # table parts per entry block (table_split)
    HAS_ACC: tl.constexpr,
    HAS_EXT: tl.constexpr,
    HAS_ROW_REQ: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HAS_LIVE: tl.constexpr,
    HAS_HOST: tl.constexpr,
    BLOCK_: tl.constexpr,
    CHUNK_: tl.constexpr,
    TABLE_CHUNK_: tl.constexpr,
    NCAT_: tl.constexpr,
    NONE_: tl.constexpr,
):
    blk, part = tl.program_id(0), tl.program_id(1)  # entry block; table part (part 0 also checks every other rule)
    e = blk * BLOCK_ + tl.arange(0, BLOCK_).to(tl.int64)  # [BLOCK] entry indices
    res = out_ptr + (blk * split + part) * NCAT_
    # per cache write: the row's own new position in req_to_token (its request's row, column)
    in_m = e < m
    loc = _ld(loc_ptr, e, in_m, 1)
    n1 = tl.maximum(n, 1)
    row = e % n1
    if HAS_ROW_REQ:
        req = _ld(row_req_ptr, row, in_m, 0)
        col = extra + _ld(row_req_ptr, n + row, in_m, 0)
    else:
        req = row // rows_per_req
        steps = m // n1
        col = extra - rows_per_req * steps + (row % rows_per_req) * steps + e // n1
    req_ok = in_m & (req >= 0) & (req < bs)
    slot = _ld(rpi_ptr, req, req_ok, -1)
    col += _ld(seq_ptr, req, req_ok, 0)
    ok = req_ok & (slot >= 0) & (slot < pool) & (col >= 0) & (col < L)  # else the write owns nothing
    own_p, own_c = tl.where(ok, slot, -1), tl.where(ok, col, -1)
    if part == 0:
        copies = out_ptr + nprog * NCAT_ + e
        # per request: the host's copies, req_pool_indices in range and distinct
        in_b = e < bs
        seq_b = _ld(seq_ptr, e, in_b, 0)
        tl.store(copies, seq_b, mask=in_b)
        if HAS_HOST:
            _put(res + 8, in_b & (seq_b != _ld(host_ptr, e, in_b, 0)), e, NONE_)
        else:
            tl.store(res + 8, NONE_)
        if HAS_ACC:
            tl.store(copies + bs, _ld(acc_ptr, e, in_b, 0), mask=in_b)
        if HAS_EXT:
            tl.store(copies + 2 * bs, _ld(ext_ptr, e, in_b, 0), mask=in_b)
        rpi = _ld(rpi_ptr, e, in_b, 1)
        _put(res, in_b & ((rpi < 1) | (rpi >= pool)), e, NONE_)
        _put(res + 1, in_b & _has_earlier_equal(rpi, e, rpi_ptr, bs, CHUNK_), e, NONE_)
        # per row: token ids and positions in range
        in_n = e < n
        ids, pos = _ld(ids_ptr, e, in_n, 0), _ld(pos_ptr, e, in_n, 0)
        _put(res + 2, in_n & ((ids < 0) | (ids >= vocab)), e, NONE_)
        _put(res + 3, in_n & ((pos < 0) | (pos >= L)), e, NONE_)
        # per cache write: in range, distinct, and exactly its row's own new position
        _put(res + 4, in_m & ((loc < 1) | (loc >= slots)), e, NONE_)
        _put(res + 5, in_m & _has_earlier_equal(loc, e, loc_ptr, m, CHUNK_), e, NONE_)
        want = _ld(r2t_ptr, own_p * r2t_stride + own_c, ok, -1)
        _put(res + 6, in_m & ~(ok & (want == loc)), e, NONE_)
        if HAS_MASK:  # verify: draft row e sees itself (its diagonal entry of the tree mask)
            r, j, per = e // rows_per_req, e % rows_per_req, rows_per_req
            in_r = in_n & (r < bs)
            before = tl.zeros([BLOCK_], dtype=tl.int64)  # sum(seq_lens[:r])
            for c0 in range(0, bs, CHUNK_):
                q = c0 + tl.arange(0, CHUNK_).to(tl.int64)
                before += tl.sum(tl.where(q[None, :] < r[:, None], _ld(seq_ptr, q, q < bs, 0)[None, :], 0), 1)
            s_r = _ld(seq_ptr, r, in_r, 0)
            idx = per * before + r * per * per + j * (s_r + per) + s_r + j
            inside = in_r & (idx >= 0) & (idx < mask_size)  # device lengths the host has not compared yet: stay inside
            _put(res + 7, in_r & (_ld(mask_ptr, tl.where(inside, idx, 0), inside, 0) == 0), e, NONE_)
        else:
            tl.store(res + 7, NONE_)
    else:  # the other parts: only the held rule
        k = tl.arange(0, 16)
        tl.store(res + k, NONE_, mask=k < NCAT_ - 1)
    # ... and no other position of a live request holds the slot (the last category): this part of the request table
    held = tl.zeros([BLOCK_], dtype=tl.int32)
    for t0 in range(part * TABLE_CHUNK_, pool * L, split * TABLE_CHUNK_):
        t = t0 + tl.arange(0, TABLE_CHUNK_).to(tl.int64)
        p, c = t // L, t % L
        in_t = (t < pool * L) & (p >= 1)
        if HAS_LIVE:
            in_t = in_t & (_ld(live_ptr, p, in_t, 0) != 0)
        v = _ld(r2t_ptr, p * r2t_stride + c, in_t, 0)
        other = (p[None, :] != own_p[:, None]) | (c[None, :] != own_c[:, None])
        hit = (v[None, :] == loc[:, None]) & (v[None, :] != 0) & other
        held = tl.maximum(held, tl.max(hit.to(tl.int32), 1))
    _put(res + NCAT_ - 1, in_m & (held > 0), e, NONE_)


@kernel_op("refimpl::batch_check", mutates_args=("out",))
def batch_check(
    out: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    req_pool_indices: torch.Tensor,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    out_cache_loc: torch.Tensor,
    rows_per_req: int,
    extra: int,
    vocab: int,
    num_slots: int,
    accept_length: torch.Tensor | None = None,
    extend_seq_lens: torch.Tensor | None = None,
    row_req: torch.Tensor | None = None,
    custom_mask: torch.Tensor | None = None,
    live_rows: torch.Tensor | None = None,
    host_seq_lens: torch.Tensor | None = None,
) -> None:
    """Launch the checks into ``out`` (int64, >= ``result_size`` entries). The caller (``refimpl.validate``) has checked
    dtypes, devices (``out``'s) and sizes: ``seq_lens`` / ``req_pool_indices`` / ``accept_length`` / ``extend_seq_lens``
    hold ``bs`` entries, ``input_ids`` / ``positions`` ``n``, ``row_req`` ``[2, n]``, ``out_cache_loc`` ``m``,
    ``live_rows`` (bool) ``pool``, ``host_seq_lens`` (int32; on CUDA pinned host memory, read in place) ``bs``."""
    # every replay runs this: no generator, each size computed once (host µs: benchmarks/host_python.py)
    bs, n, m = seq_lens.numel(), input_ids.numel(), out_cache_loc.numel()
    blocks, nprog = _blocks(bs, n, m), num_programs(bs, n, m)
    split = nprog // blocks  # table_split(blocks): the table parts per entry block
    optional = (accept_length, extend_seq_lens, row_req, custom_mask, live_rows, host_seq_lens)
    flags = tuple(map(operator.is_not, optional, _NO_TENSORS))
    mask_size = 0 if custom_mask is None else custom_mask.numel()
    # the optional pointers (seq_lens: a dummy, never read), then the sizes
    pointers = [seq_lens if t is None else t for t in optional]
    pool, L = req_to_token.shape
    args = (out, req_to_token, seq_lens, req_pool_indices, input_ids, positions, out_cache_loc, *pointers)
    args += (req_to_token.stride(0), pool, L, vocab, num_slots, bs, n, m, max(rows_per_req, 1), extra, mask_size)
    args += (nprog, split, *flags, BLOCK, CHUNK, TABLE_CHUNK, NCAT, NONE)
    direct_launch(_batch_check_kernel, (blocks, split), args, (_batch_check_kernel, out.device, *flags), out.device)


def read_result(out: torch.Tensor, bs: int, num_rows: int, num_writes: int) -> dict:
    """``out`` read back once: ``{"first": {category: index or None}, "seq_lens": [...], "accept_length": [...],
    "extend_seq_lens": [...]}`` (the copies as the kernel wrote them)."""
    base = num_programs(bs, num_rows, num_writes) * NCAT  # the per-program minima, then the copies
    res = out[: base + 3 * bs].tolist()  # the one device-to-host read
    got = {k: res[base + i * bs :][:bs] for i, k in enumerate(("seq_lens", "accept_length", "extend_seq_lens"))}
    return {"first": {c: (None if (v := min(res[k:base:NCAT])) >= NONE else v) for k, c in enumerate(CATEGORIES)}, **got}


def write_target(e: int, n: int, m: int, per: int, extra: int, seq: list[int], row_req=None) -> tuple[int, int | None]:
    """Write ``e``'s request and the ``req_to_token`` column of its row's new position (the table above; ``n`` rows,
    ``m`` writes, ``row_req``: a ragged batch's ``[requests, j - per_r]`` as lists); the column is None for a request
    outside the batch. The definition the kernel computes on the device, and what a refusal names."""
    row = e % n
    if row_req is not None:
        r, col = row_req[0][row], extra + row_req[1][row]
    else:
        steps = m // n
        r, col = row // per, extra - per * steps + (row % per) * steps + e // n
    return r, (seq[r] + col if 0 <= r < len(seq) else None)


def first_bad(values, bad) -> int | None:
    """Index of the first entry ``v`` (at ``i``) with ``bad(i, v)``, or None (the host rules' and the reference's scan)."""
    return next((i for i, v in enumerate(values) if bad(i, v)), None)


def batch_check_ref(
    req_to_token,
    seq_lens,
    req_pool_indices,
    input_ids,
    positions,
    out_cache_loc,
    rows_per_req,
    extra,
    vocab,
    num_slots,
    row_req=None,
    custom_mask=None,
    live_rows=None,
    host_seq_lens=None,
) -> dict:
    """The first bad index per category, straight from the table above, in host Python over the batch's own
    ``req_to_token`` rows; the held rule reads every live row too (set intersections in C, no Python loop over slots: the
    request table's ``pool * L`` entries, never the KV pool)."""
    pool, L = req_to_token.shape
    seq, rpi, ids, pos, loc, rows, mask, live, host = (
        None if t is None else t.tolist()
        for t in (seq_lens, req_pool_indices, input_ids, positions, out_cache_loc, row_req, custom_mask, live_rows, host_seq_lens)
    )
    live = {p for p, a in enumerate([1] * pool if live is None else live) if a and p}
    r2t = {p: req_to_token[p].tolist() for p in live.union(rpi) if 0 <= p < pool}  # the live rows and the batch's
    n, per = max(len(ids), 1), max(rows_per_req, 1)
    outside = lambda values, lo, hi: first_bad(values, lambda i, v: not lo <= v < hi)
    repeated = lambda values: first_bad(values, lambda i, v: v in values[:i])

    def own_slot(e, v, owners=r2t):  # loc[e] is the slot of its row's own new position (in a row of ``owners``)
        r, col = write_target(e, n, len(loc), per, extra, seq, rows)
        return col is not None and rpi[r] in owners and 0 <= col < L and r2t[rpi[r]][col] == v

    held, want = Counter(), set(loc) - {0}  # written slot -> live positions holding it (0 holds nothing)
    for p in live:
        held.update({v: r2t[p].count(v) for v in want.intersection(r2t[p])})

    def blind(e, _):  # verify: draft row e does not see itself (its own entry of the tree mask is False)
        r, j = divmod(e, per)
        if r >= len(seq):
            return False
        idx = per * sum(seq[:r]) + r * per * per + j * (seq[r] + per) + seq[r] + j
        return not (0 <= idx < len(mask) and mask[idx])

    return dict(
        zip(
            CATEGORIES,
            (  # in CATEGORIES' order
                outside(rpi, 1, pool),
                repeated(rpi),
                outside(ids, 0, vocab),
                outside(pos, 0, L),
                outside(loc, 1, num_slots),
                repeated(loc),
                first_bad(loc, lambda e, v: not own_slot(e, v)),
                None if mask is None else first_bad(ids, blind),
                None if host is None else first_bad(seq, lambda i, v: v != host[i]),
                first_bad(loc, lambda e, v: held[v] > own_slot(e, v, live)),  # another live position holds it
            ),
        )
    )
