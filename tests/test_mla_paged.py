"""Tests for refimpl.kernels.mla_paged: paged MLA attention vs its float64 reference (page sizes,
page-boundary lengths, causal multi-row queries, heads, truncation at max_seq_len, poisoning of
unread pages and stale table entries), the TRTLLM / Cutlass interface wrappers, capture/replay
under the CPU graph emulator, and the fused TRTLLM-MLA graph-metadata kernel.

Shapes stay small (R = 32, Rr = 16 unless a test says otherwise): the Triton kernels run in the
interpreter on CPU. The ``gpu`` test uses the real 512 + 64 MLA widths in bfloat16.
"""

import inspect

import pytest
import torch
from helpers import DEVICE, RecordOps, on_device, rng  # noqa: F401  (on_device: autouse)
from refs import mla_paged_attention_ref, relative_error, trtllm_mla_graph_metadata_ref

from refimpl._env import INTERPRET
from refimpl.graphs import CPUEmulatorEngine, make_engine
from refimpl.kernels import KERNEL_OPS
from refimpl.kernels.mla_paged import (
    cutlass_mla_decode,
    mla_paged_attention,
    trtllm_batch_decode_with_kv_cache_mla,
    trtllm_mla_graph_metadata,
)
from refimpl.memory import TokenSlotAllocator

TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 5e-3}  # bf16: H200 saw 1.7e-3
R, RR = 32, 16  # small kv_lora_rank / rope dims for the interpreter
GARBAGE_PAGE = 2**30  # a page id far out of range: reading it would fault or return junk
TAIL_ROWS = 2  # padded graph rows past bs in the table and seq_lens (never read)
cdiv = lambda a, b: -(-a // b)


# ----------------------------------------------------------------------------------------------
# a paged MLA batch


class Case:
    """bs requests over a paged latent cache, plus everything the kernel must not read.

    Pages 0 and 1 are never owned and hold NaN; so does every slot of an owned page at or past
    its request's length. Table entries past a request's pages hold ``stale`` (1: the NaN page,
    in range; GARBAGE_PAGE: out of range), and so do the TAIL_ROWS padded rows.
    """

    def __init__(
        self,
        seed,
        lens,
        *,
        page_size,
        q_len=1,
        heads=4,
        dtype=torch.float32,
        rank=R,
        rope=RR,
        width=None,
        num_pages=None,
        stale=1,
        sm_scale=None,
    ):
        g = rng(seed)
        p, bs, dim = page_size, len(lens), rank + rope
        need = [cdiv(n, p) for n in lens]
        self.width = width if width is not None else max(need + [1]) + 1
        self.num_pages = num_pages if num_pages is not None else 2 + sum(need) + 1
        assert self.num_pages >= 2 + sum(need) and self.width >= max(need + [0])
        owned = (torch.randperm(self.num_pages - 2, generator=g) + 2).tolist()  # shuffled
        # the latent cache as SGLang stores it, [slots, 1, R + Rr], and its paged view
        self.slots = torch.full((self.num_pages * p, 1, dim), float("nan"), dtype=dtype)
        self.kv = self.slots.view(self.num_pages, p, dim)  # [num_pages, P, R + Rr]
        self.block_table = torch.full((bs + TAIL_ROWS, self.width), stale, dtype=torch.int32)
        for i, (n, k) in enumerate(zip(lens, need)):
            pages, owned = owned[:k], owned[k:]
            if k:
                self.block_table[i, :k] = torch.tensor(pages, dtype=torch.int32)
            pos = torch.arange(n)
            rows = torch.tensor(pages, dtype=torch.int64)[pos // p] * p + pos % p
            self.slots[rows] = torch.randn(n, 1, dim, generator=g).to(dtype)
        self.seq_lens = torch.tensor(list(lens) + [10**6] * TAIL_ROWS, dtype=torch.int32)
        self.q = torch.randn(bs, q_len, heads, dim, generator=g).to(dtype)
        self.out = torch.full((bs, q_len, heads, rank), float("nan"), dtype=dtype)
        self.page_size, self.rank, self.lens = p, rank, list(lens)
        self.sm_scale = sm_scale if sm_scale is not None else dim**-0.5

    def run(self, max_seq_len, sm_scale=None, out_scale=1.0):
        scale = self.sm_scale if sm_scale is None else sm_scale
        return mla_paged_attention(
            self.q, self.kv, self.block_table, self.seq_lens, self.out, max_seq_len, scale, self.rank, out_scale
        )

    def ref(self, max_seq_len, sm_scale=None):
        scale = self.sm_scale if sm_scale is None else sm_scale
        bs = len(self.lens)
        return mla_paged_attention_ref(self.q, self.kv, self.block_table, self.seq_lens[:bs], max_seq_len, scale, self.rank)

    def copy_into(self, other: "Case") -> None:
        """Overwrite other's tensors in place with this case's contents (same shapes)."""
        for name in ("slots", "block_table", "seq_lens", "q"):
            getattr(other, name).copy_(getattr(self, name))


def boundary_lens(p):
    return [p - 1, p, p + 1]  # one below / at / one above a page boundary


# ----------------------------------------------------------------------------------------------
# the kernel against the reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("q_len", [1, 4])
@pytest.mark.parametrize("page_size", [32, 64, 128])
def test_matches_reference(page_size, q_len, dtype):
    case = Case(page_size + q_len, boundary_lens(page_size), page_size=page_size, q_len=q_len, dtype=dtype)
    max_seq_len = case.width * page_size
    out = case.run(max_seq_len)
    assert out is case.out
    assert relative_error(out, case.ref(max_seq_len)) < TOL[dtype]


@pytest.mark.parametrize("heads", [1, 16, 20])  # one group padded to 16; a full one; 16 + 4
def test_head_groups(heads):
    case = Case(heads, [37, 64, 5], page_size=32, q_len=2, heads=heads)
    out = case.run(96)
    assert relative_error(out, case.ref(96)) < TOL[torch.float32]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_one_percent_scale_error_is_caught(dtype):
    """The bounds are tight: a 1% error in the softmax scale fails them."""
    case = Case(7, [63, 100, 129], page_size=64, q_len=2, dtype=dtype)
    want = case.ref(256)
    assert relative_error(case.run(256), want) < TOL[dtype]
    assert relative_error(case.run(256, sm_scale=case.sm_scale * 1.01), want) > 3 * TOL[dtype]


@pytest.mark.parametrize("q_len", [1, 4])
def test_max_seq_len_truncates(q_len):
    """Keys at or past max_seq_len are not attended: exactly the truncated reference."""
    case = Case(11, [70, 45, 20], page_size=32, q_len=q_len)
    bound = 40  # inside page 1 of the first two requests, past the third
    out = case.run(bound)
    assert relative_error(out, case.ref(bound)) < TOL[torch.float32]
    assert relative_error(out, case.ref(case.width * 32)) > 1e-2  # not the full answer
    # a bound on a page edge, and one that hides everything
    assert relative_error(case.run(32), case.ref(32)) < TOL[torch.float32]
    assert torch.equal(case.run(0), torch.zeros_like(case.out))


def test_rows_without_keys_are_zero():
    """seq_len 0, and causal rows before the first key (seq_len < q_len), write zeros."""
    case = Case(3, [0, 2, 33], page_size=32, q_len=4)
    out = case.run(64)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert torch.equal(out[1, :2], torch.zeros_like(out[1, :2]))  # rows 0, 1 of a 2-token row
    assert not torch.isnan(out).any()
    assert relative_error(out, case.ref(64)) < TOL[torch.float32]


@pytest.mark.parametrize("stale", [1, GARBAGE_PAGE])
def test_stale_table_entries_and_unread_pages_never_leak(stale):
    """Entries past each request's pages hold the NaN page 1, or a page id far out of range;
    cache slots past each length and unowned pages are NaN. None of it may be read."""
    case = Case(5, [31, 65, 1, 96], page_size=32, q_len=4, width=6, stale=stale)
    out = case.run(6 * 32)
    assert not torch.isnan(out).any()
    assert relative_error(out, case.ref(6 * 32)) < TOL[torch.float32]


def test_width_bounds_the_table_read():
    """Called raw (no wrapper check), with lengths and max_seq_len past the table's width: the
    kernel stops at width * P and never reads the columns beyond (they name the NaN page 1)."""
    case = Case(9, [100, 40], page_size=32, q_len=2, width=4)
    guard = torch.full((case.block_table.shape[0], 7), 1, dtype=torch.int32)
    guard[:, :2] = case.block_table[:, :2]
    table = guard[:, :2]  # [bs + tail, 2], row stride 7: keys 0..63 only
    torch.ops.refimpl.mla_paged_attention(case.q, case.kv, table, case.seq_lens, case.out, 10**6, case.sm_scale, R)
    want = mla_paged_attention_ref(case.q, case.kv, table, case.seq_lens[:2], 10**6, case.sm_scale, R)
    assert relative_error(case.out, want) < TOL[torch.float32]
    # the same as truncating at 64 with the full table
    assert relative_error(case.out, case.ref(64)) < TOL[torch.float32]


def test_int64_seq_lens_and_out_scale():
    case = Case(13, [50, 3], page_size=32, q_len=1)
    case.seq_lens = case.seq_lens.long()
    out = case.run(64, out_scale=0.5)
    assert relative_error(out, 0.5 * case.ref(64)) < TOL[torch.float32]


def test_generic_wrapper_validation():
    case = Case(1, [10], page_size=32)
    args = (case.q, case.kv, case.block_table, case.seq_lens, case.out)
    with pytest.raises(ValueError, match=r"max_seq_len=65.*too narrow|2 pages of 32"):
        mla_paged_attention(*args, 65, 0.1, R)  # width 2 * 32 = 64 < 65
    with pytest.raises(ValueError, match="page size"):
        bad = torch.zeros(4, 16, R + RR)
        mla_paged_attention(case.q, bad, *args[2:], 16, 0.1, R)
    with pytest.raises(ValueError, match="kv_lora_rank=24"):
        mla_paged_attention(*args, 64, 0.1, 24)
    with pytest.raises(ValueError, match="out.shape"):
        mla_paged_attention(*args[:4], case.out[..., :16], 64, 0.1, R)
    with pytest.raises(ValueError, match="sm_scale=nan"):
        mla_paged_attention(*args, 64, float("nan"), R)
    with pytest.raises(ValueError, match="block_table.dtype=torch.int64"):
        mla_paged_attention(*args[:2], case.block_table.long(), *args[3:], 64, 0.1, R)


def _op_name(recorded: str) -> str:
    """``refimpl.<name>.default`` (what the recorder sees) -> ``refimpl::<name>``."""
    ns, name, _ = recorded.split(".")
    return f"{ns}::{name}"


def test_one_op_per_launch():
    case = Case(2, [40], page_size=32)
    with RecordOps() as rec:
        case.run(64)
    assert rec.names == ["refimpl.mla_paged_attention.default"]
    assert _op_name(rec.names[0]) in KERNEL_OPS  # the recorded launch is a listed kernel op


# ----------------------------------------------------------------------------------------------
# the real kernels' interfaces


def trtllm_call(case, max_seq_len, out=None, **kw):
    return trtllm_batch_decode_with_kv_cache_mla(
        query=case.q,
        kv_cache=case.kv.unsqueeze(1),  # SGLang: k_buffer.view(-1, P, 576).unsqueeze(1)
        workspace_buffer=torch.zeros(16, dtype=torch.int8),
        qk_nope_head_dim=128,
        kv_lora_rank=case.rank,
        qk_rope_head_dim=case.q.shape[-1] - case.rank,
        block_tables=case.block_table[: len(case.lens)],
        seq_lens=case.seq_lens[: len(case.lens)],
        max_seq_len=max_seq_len,
        out=out,
        bmm1_scale=kw.pop("bmm1_scale", case.sm_scale),
        **kw,
    )


@pytest.mark.parametrize("page_size,q_len", [(32, 1), (64, 4)])
def test_trtllm_interface(page_size, q_len):
    width = 128 // page_size * 2  # width * P a multiple of 128
    case = Case(21, [page_size + 1, 2 * page_size - 1], page_size=page_size, q_len=q_len, heads=8, width=width)
    out = trtllm_call(case, width * page_size)  # out allocated
    assert out.shape == (2, q_len, 8, R) and out.dtype == case.q.dtype
    assert relative_error(out, case.ref(width * page_size)) < TOL[torch.float32]
    given = torch.empty(2, q_len, 8, R)
    res = trtllm_call(case, width * page_size, out=given, bmm2_scale=2.0)
    assert res is given
    assert relative_error(res, 2.0 * case.ref(width * page_size)) < TOL[torch.float32]


def test_trtllm_interface_real_widths():
    """576-wide rows (512 + 64), 16 heads, page 64, MTP-style q_len 2."""
    case = Case(22, [64, 130], page_size=64, q_len=2, heads=16, rank=512, rope=64, width=4)
    out = trtllm_call(case, 256)
    assert out.shape == (2, 2, 16, 512)
    assert relative_error(out, case.ref(256)) < TOL[torch.float32]


def test_trtllm_interface_errors():
    case = Case(23, [40], page_size=32, width=4)
    with pytest.raises(ValueError, match="page_size=128"):
        c128 = Case(23, [40], page_size=128, width=1)
        trtllm_call(c128, 128)
    # a bound above the table (SGLang's verify: L + N over a table of L) reads no key past it
    assert relative_error(trtllm_call(case, 200), case.ref(128)) < TOL[torch.float32]
    with pytest.raises(ValueError, match=r"block_tables.shape\[1\]=3.*multiple of 128"):
        c3 = Case(23, [40], page_size=32, width=3)
        trtllm_call(c3, 96)
    with pytest.raises(ValueError, match="query.dtype=torch.float64"):
        c64 = Case(23, [40], page_size=32, width=4)
        c64.q = c64.q.double()
        trtllm_call(c64, 128)
    with pytest.raises(ValueError, match="block_tables.dtype=torch.int64"):
        c = Case(23, [40], page_size=32, width=4)
        c.block_table = c.block_table.long()
        trtllm_call(c, 128)
    with pytest.raises(ValueError, match="seq_lens.dtype=torch.int64"):
        c = Case(23, [40], page_size=32, width=4)
        c.seq_lens = c.seq_lens.long()
        trtllm_call(c, 128)
    with pytest.raises(ValueError, match="bmm1_scale"):
        trtllm_call(case, 128, bmm1_scale=torch.tensor(0.1))
    with pytest.raises(ValueError, match="sparse_mla_top_k=2048"):
        trtllm_call(case, 128, sparse_mla_top_k=2048)
    with pytest.raises(ValueError, match=r"block_tables.shape\[0\]=3: must equal bs=1"):
        trtllm_batch_decode_with_kv_cache_mla(
            case.q, case.kv.unsqueeze(1), torch.zeros(1), 128, R, RR, case.block_table, case.seq_lens[:1], 128, bmm1_scale=0.1
        )
    with pytest.raises(ValueError, match=r"kv_cache.shape=\(.*\): must be \[num_pages, 1,"):
        trtllm_batch_decode_with_kv_cache_mla(
            case.q, case.kv, torch.zeros(1), 128, R, RR, case.block_table[:1], case.seq_lens[:1], 128, bmm1_scale=0.1
        )


@pytest.mark.skipif(not INTERPRET, reason="bf16 is refused only on the Triton interpreter")
def test_bf16_refused_on_interpreter():
    case = Case(24, [40], page_size=32, width=4, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="bfloat16"):
        trtllm_call(case, 128)


def test_trtllm_signature_matches_flashinfer():
    try:
        from flashinfer.mla import trtllm_batch_decode_with_kv_cache_mla as real
    except Exception as e:  # ImportError, or a CUDA probe failing at import
        pytest.skip(f"real flashinfer not importable: {e}")
    import flashinfer

    if flashinfer.__version__ != "0.7.2":  # the version SGLang 0.5.23 pins (CI installs it)
        pytest.skip(f"the stand-in mirrors flashinfer 0.7.2's signature; {flashinfer.__version__} is installed")

    def params(f):
        return [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()]

    assert params(trtllm_batch_decode_with_kv_cache_mla) == params(real)


def test_cutlass_interface():
    case = Case(31, [127, 128, 129], page_size=128, heads=16, width=2)
    q_nope, q_pe = case.q[:, 0, :, :R].contiguous(), case.q[:, 0, :, R:].contiguous()
    args = (case.kv, case.seq_lens[:3], case.block_table[:3], torch.zeros(8, dtype=torch.uint8))
    out = cutlass_mla_decode(q_nope, q_pe, *args, case.sm_scale)
    assert out.shape == (3, 16, R)
    want = case.ref(2 * 128)[:, 0]  # the table width is the bound
    assert relative_error(out, want) < TOL[torch.float32]
    given = torch.empty(3, 16, R)
    assert cutlass_mla_decode(q_nope, q_pe, *args, case.sm_scale, 1, out=given) is given
    assert relative_error(given, want) < TOL[torch.float32]


def test_cutlass_interface_errors():
    case = Case(32, [40], page_size=64, width=1)
    q_nope, q_pe = case.q[:, 0, :, :R].contiguous(), case.q[:, 0, :, R:].contiguous()
    ws = torch.zeros(8, dtype=torch.uint8)
    with pytest.raises(ValueError, match="page_size=64"):
        cutlass_mla_decode(q_nope, q_pe, case.kv, case.seq_lens[:1], case.block_table[:1], ws, 0.1)
    c = Case(32, [40], page_size=128, width=1)
    args = (c.kv, c.seq_lens[:1], c.block_table[:1], ws, 0.1)
    with pytest.raises(ValueError, match="q_nope.dtype=torch.float64"):
        cutlass_mla_decode(q_nope.double(), q_pe.double(), *args)
    with pytest.raises(ValueError, match=r"seq_lens.dtype=torch.int64"):
        cutlass_mla_decode(q_nope, q_pe, c.kv, c.seq_lens[:1].long(), *args[2:])
    with pytest.raises(ValueError, match=r"q_pe.shape=\(1, 2, 16\)"):
        cutlass_mla_decode(q_nope, q_pe[:, :2], *args)
    with pytest.raises(ValueError, match="num_kv_splits=0"):
        cutlass_mla_decode(q_nope, q_pe, *args, 0)


# ----------------------------------------------------------------------------------------------
# capture / replay (CPU emulator; the emulator runs on CUDA tensors on a GPU machine)


@pytest.mark.parametrize("q_len", [1, 4])
def test_replay_sees_new_lengths_and_cache(q_len):
    """Capture one TRTLLM call with max_seq_len = L; change seq_lens, table and cache in place;
    replay: the output is the reference for the NEW lengths (one longer than any at capture)."""
    p, context = 32, 160
    max_seq_len = context if q_len == 1 else context + q_len  # L (decode) / L + N (verify)
    width = cdiv(cdiv(max_seq_len, p), 4) * 4
    shape = dict(page_size=p, q_len=q_len, width=width, num_pages=2 + 2 * width)
    live = Case(41, [40, 70], **shape)
    g = CPUEmulatorEngine().new_graph()
    out = g.capture(lambda: trtllm_call(live, max_seq_len))
    assert relative_error(out, live.ref(max_seq_len)) < TOL[torch.float32]

    nxt = Case(42, [max_seq_len, 33], **shape)  # longer than the captured max, and shorter
    nxt.copy_into(live)
    g.replay()
    assert relative_error(out, nxt.ref(max_seq_len)) < TOL[torch.float32]


def test_replay_with_max_seq_len_frozen_at_capture_truncates():
    """The historical TRTLLM-MLA bug: max_seq_len = seq_lens.max() at capture. A longer
    sequence at replay is silently cut at the captured value."""
    p = 32
    shape = dict(page_size=p, q_len=1, width=4, num_pages=10)
    live = Case(43, [40, 20], **shape)
    frozen = max(live.lens)  # the bug: a host read of the capture batch, frozen in the graph
    g = CPUEmulatorEngine().new_graph()
    out = g.capture(lambda: trtllm_call(live, frozen))
    nxt = Case(44, [100, 20], **shape)
    nxt.copy_into(live)
    g.replay()
    assert relative_error(out, nxt.ref(frozen)) < TOL[torch.float32]  # truncated at 40
    assert relative_error(out[0], nxt.ref(128)[0]) > 1e-2  # not the right answer
    assert relative_error(out[1], nxt.ref(128)[1]) < TOL[torch.float32]  # short row unaffected


def test_replay_fused_metadata_then_verify_attention():
    """One graph: the fused metadata rebuild (seq_lens_k = seq_lens + N, block table from the
    pool) then N-row verify attention over it. New requests, lengths and cache at replay."""
    p, n, context, heads = 32, 4, 192, 4
    max_bs, bs, pool = 4, 2, 6
    max_seq_len = context + n
    width = cdiv(cdiv(max_seq_len, p), 4) * 4
    num_slots = p * (2 + pool * cdiv(context + n, p))
    alloc = TokenSlotAllocator(num_slots, p, seed=5)
    req_to_token = torch.zeros(pool, context + n, dtype=torch.int32)
    for r in range(1, pool):
        pages = alloc.alloc_pages(cdiv(context + n, p))
        req_to_token[r] = alloc.slots_for(pages, context + n).to(DEVICE).int()
    g_ = rng(6)
    slots = torch.randn(num_slots, 1, R + RR, generator=g_)
    kv = slots.view(-1, p, R + RR).unsqueeze(1)  # [pages, 1, P, R + Rr]
    # graph buffers
    rpi = torch.tensor([1, 2], dtype=torch.int64)
    seq_lens = torch.tensor([40, 90], dtype=torch.int32)  # prefix lengths (before the drafts)
    seq_lens_k = torch.zeros(max_bs, dtype=torch.int32)
    table = torch.ones(max_bs, width, dtype=torch.int32)
    q = torch.randn(bs, n, heads, R + RR, generator=g_)
    ws = torch.zeros(16, dtype=torch.int8)
    scale = (R + RR) ** -0.5

    def step():
        trtllm_mla_graph_metadata(rpi, seq_lens, req_to_token, table, seq_lens_k[:bs], seqlen_offset=n, page_size=p)
        return trtllm_batch_decode_with_kv_cache_mla(
            q, kv, ws, 128, R, RR, table[:bs], seq_lens_k[:bs], max_seq_len, bmm1_scale=scale
        )

    def expected():
        want_table, want_k = trtllm_mla_graph_metadata_ref(
            rpi, seq_lens, req_to_token, table, seq_lens_k[:bs], seqlen_offset=n, page_size=p
        )
        attn = mla_paged_attention_ref(q, kv[:, 0], want_table, want_k, max_seq_len, scale, R)
        return want_table, want_k, attn

    g = CPUEmulatorEngine().new_graph()
    out = g.capture(step)
    want_table, want_k, attn = expected()
    assert torch.equal(table, want_table) and torch.equal(seq_lens_k[:bs], want_k)
    assert relative_error(out, attn) < TOL[torch.float32]
    assert g.kernels() == {"refimpl.trtllm_mla_graph_metadata.default": 1, "refimpl.mla_paged_attention.default": 1}, g.ops()

    rpi.copy_(torch.tensor([5, 3]))
    seq_lens.copy_(torch.tensor([context, 7], dtype=torch.int32))
    slots.copy_(torch.randn(num_slots, 1, R + RR, generator=g_))
    q.copy_(torch.randn(bs, n, heads, R + RR, generator=g_))
    g.replay()
    want_table, want_k, attn = expected()
    assert torch.equal(table, want_table) and torch.equal(seq_lens_k[:bs], want_k)
    assert relative_error(out, attn) < TOL[torch.float32]


# ----------------------------------------------------------------------------------------------
# fused TRTLLM-MLA graph metadata


SENTINEL = -7


def metadata_case(seed, bs, page_size, offset, idx_dtype=torch.int64):
    """A pool, lengths around page edges (one request's pages overrun the table width), and a
    table / seq_lens_k that are slices of larger sentinel-filled guard tensors."""
    p, width, pool = page_size, 4, bs + 2
    context = (width + 2) * p  # >= width * P: an overrunning request still reads inside its row
    g = rng(seed)
    alloc = TokenSlotAllocator(p * (2 + pool * (width + 2)), p, seed=seed)
    req_to_token = torch.zeros(pool, context, dtype=torch.int32)
    for r in range(1, pool):
        pages = alloc.alloc_pages(width + 2)
        req_to_token[r] = alloc.slots_for(pages, context).to(DEVICE).int()
    rpi = (torch.randperm(pool - 1, generator=g)[:bs] + 1).to(idx_dtype)
    choices = [0, 1, p - 1, p, p + 1, 2 * p - offset, 3 * p + 5, width * p + 3 - offset]
    lens = [choices[(seed + 3 * i) % len(choices)] for i in range(bs)]
    lens[-1] = width * p + 3 - offset  # pages past the width: writes must stop at the edge
    seq_lens = torch.tensor(lens + [999] * TAIL_ROWS, dtype=idx_dtype)
    guard = torch.full((bs + 3, width + 3), SENTINEL, dtype=torch.int32)
    table = guard[: bs + 1, :width]  # row stride width + 3; row bs is a padded graph row
    lens_guard = torch.full((bs + 2,), SENTINEL, dtype=torch.int32)
    return req_to_token, rpi, seq_lens, guard, table, lens_guard


@pytest.mark.parametrize("offset", [0, 4])
@pytest.mark.parametrize("page_size", [32, 64])
@pytest.mark.parametrize("bs", [1, 3, 8])
def test_metadata_bit_exact_and_bounded(bs, page_size, offset):
    idx_dtype = torch.int32 if bs == 3 else torch.int64
    req_to_token, rpi, seq_lens, guard, table, lens_guard = metadata_case(
        bs + page_size + offset, bs, page_size, offset, idx_dtype
    )
    guard_before, lens_before = guard.clone(), lens_guard.clone()
    seq_lens_k = lens_guard[:bs]
    want_table, want_k = trtllm_mla_graph_metadata_ref(
        rpi, seq_lens, req_to_token, table, seq_lens_k, seqlen_offset=offset, page_size=page_size
    )
    trtllm_mla_graph_metadata(rpi, seq_lens, req_to_token, table, seq_lens_k, seqlen_offset=offset, page_size=page_size)
    assert torch.equal(table, want_table)
    assert torch.equal(seq_lens_k, want_k)
    # untouched: entries past each request's pages, the padded row, the guard columns / rows
    width = table.shape[1]
    for i, n in enumerate(want_k.tolist()):
        k = min(cdiv(n, page_size), width)
        assert (table[i, k:] == SENTINEL).all(), (i, n)
    assert torch.equal(guard[bs:], guard_before[bs:])
    assert torch.equal(guard[:, width:], guard_before[:, width:])
    assert torch.equal(lens_guard[bs:], lens_before[bs:])
    # the overrunning request filled its whole row with real pages
    assert (table[bs - 1] != SENTINEL).all()


def test_metadata_one_op_and_validation():
    req_to_token, rpi, seq_lens, _, table, lens_guard = metadata_case(0, 2, 32, 0)
    seq_lens_k = lens_guard[:2]
    with RecordOps() as rec:
        trtllm_mla_graph_metadata(rpi, seq_lens, req_to_token, table, seq_lens_k, seqlen_offset=0, page_size=32)
    assert rec.names == ["refimpl.trtllm_mla_graph_metadata.default"]
    assert _op_name(rec.names[0]) in KERNEL_OPS
    kw = dict(seqlen_offset=0, page_size=32)
    with pytest.raises(ValueError, match="block_table.dtype=torch.int64"):
        trtllm_mla_graph_metadata(rpi, seq_lens, req_to_token, table.long(), lens_guard[:2], **kw)
    with pytest.raises(ValueError, match="seq_lens.dtype=torch.float32"):
        trtllm_mla_graph_metadata(rpi, seq_lens.float(), req_to_token, table, lens_guard[:2], **kw)
    with pytest.raises(ValueError, match=r"req_pool_indices.shape\[0\]=2: must be >= bs=3"):
        trtllm_mla_graph_metadata(rpi, seq_lens, req_to_token, table, lens_guard[:3], **kw)
    with pytest.raises(ValueError, match="page_size=0"):
        trtllm_mla_graph_metadata(rpi, seq_lens, req_to_token, table, lens_guard[:2], seqlen_offset=0, page_size=0)
    with pytest.raises(ValueError, match="seqlen_offset=True"):
        trtllm_mla_graph_metadata(rpi, seq_lens, req_to_token, table, lens_guard[:2], seqlen_offset=True, page_size=32)


# ----------------------------------------------------------------------------------------------
# GPU: real widths, bfloat16, real CUDA graphs


@pytest.mark.gpu
def test_gpu_bf16_attention_metadata_and_cuda_graph():
    assert DEVICE.type == "cuda", "the gpu marker should have skipped this test"
    tol = TOL[torch.bfloat16]
    big = dict(rank=512, rope=64, dtype=torch.bfloat16)
    # attention: every page size, decode and verify, 16 and 128 heads, page-edge lengths
    for p in (32, 64, 128):
        for q_len, heads in ((1, 16), (4, 128), (1, 128)):
            lens = boundary_lens(p) + [1, 5 * p + 17]
            case = Case(p + q_len + heads, lens, page_size=p, q_len=q_len, heads=heads, **big)
            out = case.run(case.width * p)
            torch.cuda.synchronize()
            assert not torch.isnan(out).any(), (p, q_len, heads)
            err = relative_error(out, case.ref(case.width * p))
            assert err < tol, (p, q_len, heads, err)
            bound = p + 3  # truncation
            err = relative_error(case.run(bound), case.ref(bound))
            assert err < tol, ("truncated", p, q_len, heads, err)
    # stale entries out of range are never read
    case = Case(1, [31, 65, 96], page_size=32, q_len=4, heads=16, width=6, stale=GARBAGE_PAGE, **big)
    assert relative_error(case.run(6 * 32), case.ref(6 * 32)) < tol
    # the two interfaces
    case = Case(2, [100, 200], page_size=64, q_len=2, heads=128, width=4, **big)
    assert relative_error(trtllm_call(case, 256), case.ref(256)) < tol
    case = Case(3, [127, 129], page_size=128, heads=128, width=2, **big)
    q_nope, q_pe = case.q[:, 0, :, :512].contiguous(), case.q[:, 0, :, 512:].contiguous()
    out = cutlass_mla_decode(
        q_nope, q_pe, case.kv, case.seq_lens[:2], case.block_table[:2], torch.zeros(8, dtype=torch.uint8), case.sm_scale
    )
    assert relative_error(out, case.ref(256)[:, 0]) < tol
    # metadata: bit-exact on CUDA
    for bs, p, offset in ((1, 32, 0), (3, 64, 4), (8, 32, 4)):
        req_to_token, rpi, seq_lens, guard, table, lens_guard = metadata_case(bs, bs, p, offset)
        guard_before = guard.clone()
        want_table, want_k = trtllm_mla_graph_metadata_ref(
            rpi, seq_lens, req_to_token, table, lens_guard[:bs], seqlen_offset=offset, page_size=p
        )
        trtllm_mla_graph_metadata(rpi, seq_lens, req_to_token, table, lens_guard[:bs], seqlen_offset=offset, page_size=p)
        assert torch.equal(table, want_table) and torch.equal(lens_guard[:bs], want_k)
        assert torch.equal(guard[:, table.shape[1] :], guard_before[:, table.shape[1] :])
    # a real CUDA graph: capture with max_seq_len = L, replay with new lengths and cache
    shape = dict(page_size=64, q_len=4, heads=128, width=6, num_pages=14, **big)
    live, nxt = Case(4, [40, 70], **shape), Case(5, [6 * 64, 3], **shape)
    eng = make_engine("cuda")
    eng.warmup(lambda: trtllm_call(live, 6 * 64, out=live.out), 2)
    g = eng.new_graph()
    g.capture(lambda: trtllm_call(live, 6 * 64, out=live.out))
    nxt.copy_into(live)
    g.replay()
    torch.cuda.synchronize()
    assert relative_error(live.out, nxt.ref(6 * 64)) < tol
