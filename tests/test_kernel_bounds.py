"""Index-building kernels never read or write out of bounds, whatever the device data holds.

``seq_lens`` / ``lens`` / ``kv_start_idx`` / ``req_pool_indices`` / ``kv_indptr`` are device data
that a graph replay may fill with anything (``python -m refimpl check --topk 44`` once fed lengths
past the context length and corrupted the heap). Every case here feeds such values to

- ``build_kv_indices``, ``build_block_table`` (refimpl/kernels/indices.py),
- ``draft_decode_kv_indices`` (refimpl/kernels/draft_indices.py),
- ``trtllm_mla_graph_metadata`` (refimpl/kernels/mla_paged.py),

with every tensor the kernel touches allocated as a slice of a larger *guard* tensor (the attention kernels, which read
the cache *through* such indices, are the bounds guard's: the last section):

- ``req_to_token`` sits inside a READ_GUARD-filled block (guard rows above and below, guard
  columns left and right). A read outside ``[pool, L]`` that lands there puts READ_GUARD (or
  READ_GUARD // P) into the output, which then differs from the expected value.
- every output sits inside an OUT_GUARD-filled block; after the launch the guard must still hold
  OUT_GUARD everywhere (no store outside the output).

Expected values come from the ``*_ref`` functions on *clipped* inputs. Clipped semantics: an
element whose source lies outside ``req_to_token`` (request index outside ``[0, pool)``, column
outside ``[0, L)``) or whose destination lies outside the output is *dropped*: the output keeps
its previous value there; nothing is clamped onto another element. Negative lengths count as 0.
The per-kernel clipping helpers below (``clip_csr``, ``clip_pages``, ``padded_pool``) turn raw
inputs into ref inputs that express exactly this.
"""

import pytest
import torch
from helpers import RecordOps
from refs import trtllm_mla_graph_metadata_ref

from refimpl._env import default_device  # refimpl first: sets TRITON_INTERPRET on CPU
from refimpl.graphs import make_engine
from refimpl.kernels import (
    bounds,
    build_block_table,
    build_block_table_ref,
    build_kv_indices,
    build_kv_indices_ref,
    decode_attention,
    dense_paged_attention,
    draft_decode_kv_indices,
    draft_decode_kv_indices_ref,
    mla_paged_attention,
    trtllm_mla_graph_metadata,
)

DEVICE = default_device()  # cpu (Triton interpreter) here; cuda on a GPU machine
OUT_GUARD = -7  # fills the memory around every output: must survive every launch
READ_GUARD = -(2**20) - 3  # fills the memory around req_to_token: must never reach an output
FILL = -1  # what the output itself holds before the launch (kept where nothing is written)
G = 3  # guard rows / columns / entries on each side
cdiv = lambda a, b: -(-a // b)


@pytest.fixture(autouse=True)
def _on_device():
    with torch.device(DEVICE):
        yield


# ----------------------------------------------------------------------------------------------
# guarded allocations


def guarded_pool(pool, L, page_size=1, dtype=torch.int32):
    """``req_to_token [pool, L]`` as a view into a READ_GUARD block; returns (view, block).

    Row r holds distinct pages ``100*(r+1) + c // P`` (slot ``page*P + c % P``), so a value
    read from the wrong row or column is always a different number."""
    block = torch.full((pool + 2 * G, L + 2 * G), READ_GUARD, dtype=dtype)
    view = block[G : G + pool, G : G + L]
    c = torch.arange(L)
    for r in range(pool):
        view[r] = ((100 * (r + 1) + c // page_size) * page_size + c % page_size).to(dtype)
    return view, block


def guarded_out(shape, dtype):
    """An output of ``shape`` (1-D or 2-D) filled with FILL inside an OUT_GUARD block; returns
    (view, block, inside) where ``inside`` marks the view's entries in the block."""
    if len(shape) == 1:
        block = torch.full((shape[0] + 2 * G,), OUT_GUARD, dtype=dtype)
        view = block[G : G + shape[0]]
    else:
        block = torch.full((shape[0] + 2 * G, shape[1] + 2 * G), OUT_GUARD, dtype=dtype)
        view = block[G : G + shape[0], G : G + shape[1]]
    inside = torch.zeros(block.shape, dtype=torch.bool)
    inside[(slice(G, G + shape[0]),) + ((slice(G, G + shape[1]),) if len(shape) == 2 else ())] = 1
    view.fill_(FILL)
    return view, block, inside


def assert_guard_intact(block, inside, what):
    outside = block[~inside]
    assert outside.numel() > 0
    assert (outside == OUT_GUARD).all(), f"{what}: store outside the output"


def assert_pool_intact(pool_block, pool_view_before):
    inside = torch.zeros(pool_block.shape, dtype=torch.bool)
    inside[G:-G, G:-G] = True
    assert (pool_block[~inside] == READ_GUARD).all()
    assert torch.equal(pool_block[G:-G, G:-G], pool_view_before)


def t(values, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype)


# ----------------------------------------------------------------------------------------------
# build_kv_indices


def clip_csr(r, s, n, pool, L):
    """Clipped inputs of one request: ``(row, start, len, skip)`` such that the kernel writes
    ``build_kv_indices_ref(row, start, len)`` to ``kv_indptr[i] + skip + q`` (``q < len``, each
    store kept only inside ``[0, numel)``), or None when it writes nothing. Positions j with
    source column ``s + j`` outside ``[0, L)`` are dropped, so only ``[max(0, -s), min(n, L - s))``
    remain; an out-of-pool row drops everything."""
    if not 0 <= r < pool:
        return None
    lo, hi = max(0, -s), min(n, L - s)
    return (r, s + lo, hi - lo, lo) if hi > lo else None


def expected_csr(req_to_token, rpi, lens, kv_indptr, before, starts):
    pool, L = req_to_token.shape
    out = before.clone()
    for i, (r, n) in enumerate(zip(rpi.tolist(), lens.tolist())):
        s = 0 if starts is None else int(starts[i])
        clipped = clip_csr(r, s, n, pool, L)
        if clipped is None:
            continue
        row, start, length, skip = clipped
        seg = build_kv_indices_ref(req_to_token, t([row]), t([length]), kv_start_idx=t([start]))
        assert seg.numel() == length
        for q in range(length):
            pos = int(kv_indptr[i]) + skip + q
            if 0 <= pos < out.numel():
                out[pos] = seg[q]
    return out


def cumsum_indptr(lens, dtype=torch.int64):
    indptr = torch.zeros(len(lens) + 1, dtype=dtype)
    indptr[1:] = torch.cumsum(t(lens), 0)
    return indptr


CSR_CASES = {
    # the `check --topk 44` crash: 4 requests of 49 > L = 48 tokens, kv_indices sized 4 * L
    "lens-past-row-and-output": dict(pool=24, L=48, rpi=[0, 1, 2, 3], lens=[49] * 4, numel=192),
    "request-index-past-pool": dict(pool=4, L=16, rpi=[4, -1, 2, 1000], lens=[5, 6, 7, 3], numel=21),
    "negative-lens": dict(pool=4, L=16, rpi=[1, 2, 3], lens=[-5, 4, -1], numel=6),
    "starts-outside-row": dict(pool=4, L=16, rpi=[0, 1, 2, 3], lens=[6, 6, 6, 6], starts=[-3, 13, 16, 40], numel=24),
    "huge-lens": dict(pool=3, L=20, rpi=[2, 0], lens=[2**40, 5], numel=30),
    # kv_indptr itself out of range: before the output, straddling its end, past it
    "indptr-outside-output": dict(pool=4, L=16, rpi=[1, 2, 3], lens=[4, 4, 4], numel=10, indptr=[-2, 8, 2**35, 2**35 + 4]),
}


@pytest.mark.parametrize("name", list(CSR_CASES))
@pytest.mark.parametrize("dst_dtype", [torch.int32, torch.int64])
def test_build_kv_indices_stays_in_bounds(name, dst_dtype):
    c = CSR_CASES[name]
    req_to_token, pool_block = guarded_pool(c["pool"], c["L"])
    pool_before = pool_block[G:-G, G:-G].clone()
    rpi, lens = t(c["rpi"]), t(c["lens"])
    kv_indptr = t(c["indptr"]) if "indptr" in c else cumsum_indptr(c["lens"])
    starts = t(c["starts"]) if "starts" in c else None
    out, block, inside = guarded_out((c["numel"],), dst_dtype)
    before = out.clone()

    build_kv_indices(req_to_token, rpi, lens, kv_indptr, out, kv_start_idx=starts)

    assert_guard_intact(block, inside, name)
    assert_pool_intact(pool_block, pool_before)
    want = expected_csr(req_to_token, rpi, lens, kv_indptr, before, starts)
    assert torch.equal(out.long(), want.long()), (out.tolist(), want.tolist())
    assert (out != FILL).any() or name == "negative-lens", "nothing written: case is vacuous"


def test_build_kv_indices_topk44_regression_values():
    """The crash case spelled out: each request gets its first L slots, nothing past the end."""
    L, numel = 48, 192
    req_to_token, _ = guarded_pool(24, L)
    lens = t([49] * 4, torch.int32)
    out, block, inside = guarded_out((numel,), torch.int32)
    build_kv_indices(req_to_token, t([0, 1, 2, 3]), lens, cumsum_indptr([49] * 4), out)
    assert_guard_intact(block, inside, "topk44")
    for i in range(4):
        start = 49 * i
        got = out[start : min(start + L, numel)]
        assert torch.equal(got, req_to_token[i, : got.numel()]), i
        if start + L < numel:
            assert out[start + L] == FILL  # position j = 48 >= L: dropped, not clamped


def test_valid_inputs_unchanged_by_the_bounds():
    """A guarded, fully valid batch matches the plain ref exactly (no entry is dropped)."""
    req_to_token, _ = guarded_pool(6, 32)
    rpi, lens, starts = t([5, 0, 3]), t([32, 0, 10]), t([0, 7, 22])
    out, block, inside = guarded_out((42,), torch.int64)
    build_kv_indices(req_to_token, rpi, lens, cumsum_indptr([32, 0, 10]), out, kv_start_idx=starts)
    assert_guard_intact(block, inside, "valid")
    assert torch.equal(out, build_kv_indices_ref(req_to_token, rpi, lens, kv_start_idx=starts))


# ----------------------------------------------------------------------------------------------
# build_block_table


def clip_pages(r, s, n, pool, L, P):
    """Clipped inputs of one request: ``(row, start, len, first_page)`` such that the kernel
    writes ``build_block_table_ref(row, len, start)`` into the table row from column
    ``first_page`` on (the ref already stops at the table width), or None. Page p is dropped when
    its first position ``s + p*P`` lies outside ``[0, L)``: the first kept page is
    ``p0 = cdiv(-s, P)`` for ``s < 0``, and the length is cut at ``L - (s + p0*P)``."""
    if not 0 <= r < pool:
        return None
    p0 = cdiv(-s, P) if s < 0 else 0
    start = s + p0 * P
    length = min(n - p0 * P, L - start)
    return (r, start, length, p0) if length > 0 else None


def expected_table(req_to_token, rpi, lens, before, P, starts):
    pool, L = req_to_token.shape
    out = before.clone()
    for i, (r, n) in enumerate(zip(rpi.tolist(), lens.tolist())):
        s = 0 if starts is None else int(starts[i])
        clipped = clip_pages(r, s, n, pool, L, P)
        if clipped is None or clipped[3] >= out.shape[1]:
            continue
        row, start, length, p0 = clipped
        out[i : i + 1, p0:] = build_block_table_ref(
            req_to_token, t([row]), t([length]), out[i : i + 1, p0:], P, kv_start_idx=t([start])
        )
    return out


TABLE_CASES = {
    # lens past the row (L = 2.5 pages) and past the table width (4 pages > the row's 3)
    "lens-past-row-and-width": dict(P=16, pool=4, L=40, width=4, rpi=[0, 1, 3], lens=[41, 200, 16 * 4 + 1]),
    "request-index-past-pool": dict(P=8, pool=3, L=32, width=4, rpi=[3, -1, 1, 99], lens=[9, 9, 9, 9]),
    "negative-lens": dict(P=8, pool=3, L=32, width=4, rpi=[0, 1], lens=[-9, -1]),
    "starts-outside-row": dict(P=8, pool=4, L=32, width=5, rpi=[0, 1, 2, 3], lens=[20] * 4, starts=[-10, 24, 32, 1000]),
    "huge-lens": dict(P=1, pool=2, L=12, width=16, rpi=[1, 0], lens=[2**40, 3]),
}


@pytest.mark.parametrize("name", list(TABLE_CASES))
def test_build_block_table_stays_in_bounds(name):
    c = TABLE_CASES[name]
    P = c["P"]
    req_to_token, pool_block = guarded_pool(c["pool"], c["L"], P)
    pool_before = pool_block[G:-G, G:-G].clone()
    rpi, lens = t(c["rpi"]), t(c["lens"], torch.int32 if name != "huge-lens" else torch.int64)
    starts = t(c["starts"]) if "starts" in c else None
    bs = len(c["lens"])
    table, block, inside = guarded_out((bs + 1, c["width"]), torch.int32)  # a spare row too
    before = table.clone()

    build_block_table(req_to_token, rpi, lens, table, P, kv_start_idx=starts)

    assert_guard_intact(block, inside, name)
    assert_pool_intact(pool_block, pool_before)
    want = expected_table(req_to_token, rpi, lens, before, P, starts)
    assert torch.equal(table, want), (table.tolist(), want.tolist())
    assert (table[bs] == FILL).all(), "row >= bs written"
    assert (table != FILL).any() or name == "negative-lens", "nothing written: case is vacuous"


# ----------------------------------------------------------------------------------------------
# draft_decode_kv_indices


def padded_pool(req_to_token, rpi, seq_lens, topk, num_steps):
    """Clipped inputs for draft_decode_kv_indices_ref: ``seq_lens`` clamped at 0, and the table
    padded with FILL columns up to every column the layout names, plus one FILL row that
    out-of-pool requests are redirected to. FILL is what the kernel leaves in an entry it drops
    (the output starts as FILL), so the ref's output on these inputs is the expected one."""
    pool, L = req_to_token.shape
    lens = seq_lens.clamp(min=0)
    width = max(L, int(lens.max()) + topk * num_steps)
    table = torch.full((pool + 1, width), FILL, dtype=torch.int64)
    table[:pool, :L] = req_to_token
    rows = torch.where((rpi >= 0) & (rpi < pool), rpi, pool)
    return table, rows, lens


DRAFT_CASES = {
    # drafts (and prefix) past the row: seq_len + topk*S > L
    "drafts-past-row": dict(pool=3, L=24, rpi=[0, 2], seq_lens=[20, 26], topk=2, S=3, W=120),
    "request-index-past-pool": dict(pool=3, L=24, rpi=[3, -2, 1], seq_lens=[4, 5, 6], topk=2, S=2, W=60),
    "negative-seq-lens": dict(pool=3, L=24, rpi=[0, 1, 2], seq_lens=[-5, 7, -1], topk=3, S=2, W=60),
    "width-too-small": dict(pool=3, L=24, rpi=[1, 0], seq_lens=[10, 12], topk=2, S=2, W=30),
}


@pytest.mark.parametrize("name", list(DRAFT_CASES))
def test_draft_decode_kv_indices_stays_in_bounds(name):
    c = DRAFT_CASES[name]
    topk, S, W = c["topk"], c["S"], c["W"]
    req_to_token, pool_block = guarded_pool(c["pool"], c["L"])
    pool_before = pool_block[G:-G, G:-G].clone()
    rpi, seq_lens = t(c["rpi"]), t(c["seq_lens"], torch.int32)
    rows = seq_lens.numel() * topk
    kv_indices, idx_block, idx_inside = guarded_out((S, W), torch.int64)
    kv_indptr, ptr_block, ptr_inside = guarded_out((S, rows + 1), torch.int32)

    draft_decode_kv_indices(rpi, req_to_token, seq_lens, kv_indices, kv_indptr, topk=topk, num_steps=S)

    assert_guard_intact(idx_block, idx_inside, f"{name} kv_indices")
    assert_guard_intact(ptr_block, ptr_inside, f"{name} kv_indptr")
    assert_pool_intact(pool_block, pool_before)
    table, ref_rows, ref_lens = padded_pool(req_to_token, rpi, seq_lens, topk, S)
    want_indptr, want_indices = draft_decode_kv_indices_ref(ref_rows, table, ref_lens, topk=topk, num_steps=S)
    for i in range(S):
        assert torch.equal(kv_indptr[i].long(), want_indptr[i]), f"step {i} indptr"
        used = want_indices[i].numel()
        n = min(used, W)
        assert torch.equal(kv_indices[i, :n], want_indices[i][:n]), f"step {i} indices"
        assert (kv_indices[i, n:] == FILL).all(), f"step {i}: entries past the used length"
    assert (kv_indices != FILL).any(), "nothing written: case is vacuous"


def test_draft_decode_huge_seq_len_is_bounded():
    """A 2**40 prefix: the copy loop stops at L, kv_indptr still follows the layout formula."""
    topk, S, L, W = 2, 2, 16, 40
    req_to_token, _ = guarded_pool(2, L)
    rpi, seq_lens = t([1, 0]), t([2**40, 3])
    kv_indices, block, inside = guarded_out((S, W), torch.int64)
    kv_indptr, ptr_block, ptr_inside = guarded_out((S, 2 * topk + 1), torch.int64)
    draft_decode_kv_indices(rpi, req_to_token, seq_lens, kv_indices, kv_indptr, topk=topk, num_steps=S)
    assert_guard_intact(block, inside, "kv_indices")
    assert_guard_intact(ptr_block, ptr_inside, "kv_indptr")
    for i in range(S):
        lens = [2**40] * topk + [3] * topk
        want = [0]
        for n in lens:
            want.append(want[-1] + n + i + 1)
        assert kv_indptr[i].tolist() == want
        assert torch.equal(kv_indices[i, :L], req_to_token[1].long())  # row (0, 0): the prefix
        assert (kv_indices[i, L:] == FILL).all()  # columns >= L dropped, nothing past W


# ----------------------------------------------------------------------------------------------
# trtllm_mla_graph_metadata (mla_paged.py): reads bounded by L, stores by the table width


def run_metadata(c, offset=0, dtype=torch.int64):
    P = c["P"]
    req_to_token, pool_block = guarded_pool(c["pool"], c["L"], P)
    pool_before = pool_block[G:-G, G:-G].clone()
    rpi, seq_lens = t(c["rpi"], dtype), t(c["seq_lens"], dtype)
    bs = seq_lens.numel()
    table, block, inside = guarded_out((bs + 1, c["width"]), torch.int32)
    lens_k, k_block, k_inside = guarded_out((bs,), dtype)
    before = table.clone()
    trtllm_mla_graph_metadata(rpi, seq_lens, req_to_token, table, lens_k, seqlen_offset=offset, page_size=P)
    assert_guard_intact(block, inside, "block_table")
    assert_guard_intact(k_block, k_inside, "seq_lens_k")
    assert_pool_intact(pool_block, pool_before)
    # clipped: the pages whose first position lies in [0, L), i.e. lens_k clipped to L
    pool, L = req_to_token.shape
    clipped = (seq_lens + offset).clamp(max=L) - offset
    rows = torch.where((rpi >= 0) & (rpi < pool), rpi, 0)
    want_table, _ = trtllm_mla_graph_metadata_ref(
        rows, clipped, req_to_token, before, lens_k.clone(), seqlen_offset=offset, page_size=P
    )
    for i, r in enumerate(rpi.tolist()):
        if not 0 <= r < pool:
            want_table[i] = before[i]  # an out-of-pool request: nothing read, nothing written
    assert torch.equal(lens_k, (seq_lens + offset).to(dtype)), "seq_lens_k is not clipped"
    assert torch.equal(table, want_table), (table.tolist(), want_table.tolist())
    assert (table[bs] == FILL).all()


METADATA_CASES = {
    "lens-past-row-and-width": dict(P=32, pool=3, L=3 * 32 + 5, width=3, rpi=[0, 2, 1], seq_lens=[4 * 32, 3 * 32 + 6, 2**40]),
    "lens-past-row-within-width": dict(P=32, pool=2, L=40, width=4, rpi=[1, 0], seq_lens=[200, 41]),
    "negative-lens": dict(P=64, pool=2, L=128, width=2, rpi=[0, 1], seq_lens=[-100, -1]),
}


@pytest.mark.parametrize("name", list(METADATA_CASES))
@pytest.mark.parametrize("offset", [0, 3])
def test_trtllm_mla_graph_metadata_stays_in_bounds(name, offset):
    run_metadata(METADATA_CASES[name], offset)


def test_trtllm_mla_graph_metadata_request_index_past_pool():
    run_metadata(dict(P=32, pool=3, L=64, width=2, rpi=[3, -1, 1], seq_lens=[40, 40, 40]))


# ----------------------------------------------------------------------------------------------
# graph safety: one dispatched op per call, nothing that syncs, even on overflowing input


def test_bounded_kernels_are_still_one_op_each():
    req_to_token, _ = guarded_pool(4, 16)
    rpi, lens = t([5, 1]), t([40, -3])
    kv_indices, _, _ = guarded_out((8,), torch.int64)
    table, _, _ = guarded_out((2, 2), torch.int32)
    draft_idx, _, _ = guarded_out((2, 10), torch.int64)
    draft_ptr, _, _ = guarded_out((2, 5), torch.int32)
    kv_indptr = cumsum_indptr([40, -3])
    with RecordOps() as rec:
        build_kv_indices(req_to_token, rpi, lens, kv_indptr, kv_indices)
        build_block_table(req_to_token, rpi, lens, table, 4)
        draft_decode_kv_indices(rpi, req_to_token, lens, draft_idx, draft_ptr, topk=2, num_steps=2)
    assert rec.names == [
        "refimpl.build_kv_indices.default",
        "refimpl.build_block_table.default",
        "refimpl.draft_decode_kv_indices.default",
    ], rec.names


# --- the bounds guard (refimpl/kernels/bounds.py): attention fed metadata that points outside the cache -------------
SLOTS, HEADS, DIM = 16, 2, 16


def d(values, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype, device=DEVICE)


def dense(indices):
    """Two decode requests over a 16-slot cache; kv_indices[5] is a stale tail entry (past kv_indptr[2]: never read)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, HEADS, DIM, generator=g, device="cpu").to(DEVICE) for n in (2, SLOTS, SLOTS))
    return q, k, v, d([0, 3, 5], torch.int32), t(indices + [10**9]), torch.zeros(2, HEADS, DIM, device=DEVICE)


def run_dense(q, k, v, ptr, idx, out):
    dense_paged_attention(q, k, v, ptr, idx, out, sm_scale=0.25, max_kv_len=3, q_per_req=1)
    return out


def run_decode(q, k, v, ptr, idx, out):
    logits, lse = torch.zeros(2, HEADS, 2, DIM, device=DEVICE), torch.zeros(2, HEADS, 2, device=DEVICE)
    decode_attention(q, k, v, out, ptr, idx, logits, lse, d([2, 2], torch.int32), 2, 0.25)
    return out


@pytest.mark.parametrize("name,kernel", [("dense_paged_attention", run_dense), ("decode_attention", run_decode)])
def test_guarded_attention_names_the_entry_and_reads_slot_0_instead(name, kernel):
    """On the checker's path a live slot past the cache is recorded (which entry, what it held, the limit) and read as
    slot 0, the padding slot: the run goes on and its output is the same call's with that entry 0."""
    bounds.take()
    with bounds.bounds_guard():
        got = kernel(*dense([1, 2, 10**9, 4, 5]))
    assert bounds.take() == [f"{name}: kv_indices[2] = 1000000000: a live entry outside the cache's slots [0, {SLOTS})"]
    assert torch.equal(got, kernel(*dense([1, 2, 0, 4, 5])))
    assert bounds.take() == []  # the tail entry (past kv_indptr[bs]) is never read, so never reported


def test_guarded_indptr_out_of_order_is_made_non_decreasing():
    """kv_indptr [0, 3, 2]: request 1 would span backwards. The guard reads [0, 3, 3] (request 1 empty: zeros)."""
    q, k, v, _, idx, out = dense([1, 2, 3, 4, 5])
    with bounds.bounds_guard():
        run_dense(q, k, v, d([0, 3, 2], torch.int32), idx, out)
    assert bounds.take() == [
        "dense_paged_attention: kv_indptr[2] = 2: outside [0, 6] (kv_indices.numel()) or below the entry before it"
    ]
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.equal(out, run_dense(q, k, v, d([0, 3, 3], torch.int32), idx, torch.zeros_like(out)))


def test_guarded_block_table_names_row_and_column():
    """MLA through a block table: request 1's second page (a column it reads) is past the cache's pages."""
    g = torch.Generator().manual_seed(1)
    pages, page, dim = 4, 32, 32  # kv_lora_rank 16 + rope 16
    kv = torch.randn(pages, page, dim, generator=g, device="cpu").to(DEVICE)
    q = torch.randn(2, 1, HEADS, dim, generator=g, device="cpu").to(DEVICE)
    table = d([[1, -1], [2, 77]], torch.int32)  # row 0 reads column 0 only: its -1 is never read
    lens, out = d([20, 40], torch.int32), torch.zeros(2, 1, HEADS, 16, device=DEVICE)
    with bounds.bounds_guard():
        mla_paged_attention(q, kv, table, lens, out, 64, 0.25, 16)
    assert bounds.take() == [
        f"mla_paged_attention: block_table[1, 1] (row, col) = 77: a read entry outside the cache's pages [0, {pages})"
    ]
    want = mla_paged_attention(q, kv, d([[1, -1], [2, 0]], torch.int32), lens, torch.zeros_like(out), 64, 0.25, 16)
    assert torch.equal(out, want)


def test_outside_the_guard_nothing_changes():
    q, k, v, ptr, idx, out = dense([1, 2, 3, 4, 5])
    assert bounds.guard_csr("x", ptr, idx, 2, SLOTS) == (ptr, idx)  # the same tensors: no op launched
    with RecordOps() as rec:
        run_dense(q, k, v, ptr, idx, out)
    assert rec.names == ["refimpl.dense_paged_attention.default"], rec.names


def test_a_guarded_graph_checks_every_replay():
    """The guard's ops are captured with the kernel, so a replay whose metadata went bad is recorded too, and a good
    replay after it is clean."""
    engine = make_engine("auto")
    q, k, v, ptr, idx, out = dense([1, 2, 3, 4, 5])
    with bounds.bounds_guard():
        engine.warmup(lambda: run_dense(q, k, v, ptr, idx, out), 1)
        graph = engine.new_graph()
        graph.capture(lambda: run_dense(q, k, v, ptr, idx, out))
    bounds.take()
    idx[4] = -2
    graph.replay()
    assert bounds.take() == [f"dense_paged_attention: kv_indices[4] = -2: a live entry outside the cache's slots [0, {SLOTS})"]
    idx[4] = 5
    graph.replay()
    assert bounds.take() == []
