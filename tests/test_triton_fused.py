"""The fused graph-metadata kernel and the Triton ``fused`` / ``in_graph`` shapes.

- the kernel against its first-principles reference (decode and target verify, chain and tree
  masks, int32 / int64 indices) and against the unified path's launches on bad device data,
  inside guard memory (no read or store out of bounds);
- its split counts are ``get_num_kv_splits``' (one jit helper, one source of truth);
- the checker: every row of both shapes passes all four verdicts;
- launch counts: the fused replay hook is one op, the in_graph hook none (verify: the mask
  copy), and the in_graph graph records the fused op.

Shapes stay tiny: the Triton kernels run in the interpreter on CPU.
"""

import functools
import random

import pytest
import torch
from helpers import RecordOps, gate
from refs import fused_graph_metadata_ref

from refimpl._env import default_device  # refimpl first: sets TRITON_INTERPRET on CPU
from refimpl.backends import GraphModeNotSupported, find, must_pass
from refimpl.backends.triton import TritonAttnBackend
from refimpl.backends.triton_fused import TritonAttnBackendFused, TritonAttnBackendInGraph
from refimpl.batch import World
from refimpl.batchgen import BatchGenerator
from refimpl.bench import launches
from refimpl.check import CheckSettings, run_checks
from refimpl.config import GraphConfig, ModelConfig, SpecConfig
from refimpl.graphs import CPUEmulatorEngine
from refimpl.graphs.runner import GraphRunner, call_capture_hook, call_replay_hook
from refimpl.kernels import (
    KERNEL_OPS,
    build_kv_indices,
    fused_graph_metadata,
    fused_graph_metadata_args,
    get_num_kv_splits,
    launch_fused_graph_metadata,
)
from refimpl.model import TinyDecoder
from refimpl.modes import ForwardMode
from refimpl.spec import DraftDecodeInput, DraftTree, build_custom_mask

DEVICE = default_device()  # cpu (Triton interpreter) here; cuda on a GPU machine
FUSED_OP = "refimpl.fused_graph_metadata.default"
SPLITS = dict(num_heads=4, num_kv_heads=2, max_kv_splits=8, core_count=8)


@pytest.fixture(autouse=True)
def _on_device():
    with torch.device(DEVICE):
        yield


def pool_table(pool, L, dtype=torch.int32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 10_000, (pool, L), generator=g, device="cpu").to(dtype).to(DEVICE)


def lengths(bs, L, rnd):
    """Lengths in [1, L], page boundaries (1, 31..33, 63..64) among them."""
    edges = [1, 31, 32, 33, L - 1, L]
    return [edges[i] if i < len(edges) and rnd.random() < 0.5 else rnd.randint(1, L) for i in range(bs)]


# ----------------------------------------------------------------------------------------------
# kernel vs reference


@pytest.mark.parametrize("bs", [1, 3, 8])
@pytest.mark.parametrize("idx", [torch.int32, torch.int64])
def test_decode_matches_reference(bs, idx):
    pool, L, rnd = 12, 64, random.Random(bs)
    r2t = pool_table(pool, L, idx)
    seq = torch.tensor(lengths(bs, L, rnd), dtype=idx)
    rpi = torch.tensor(rnd.sample(range(pool), bs), dtype=idx)
    kv_indptr = torch.full((bs + 3,), -5, dtype=idx)
    kv_indices = torch.full((bs * L + 4,), -5, dtype=idx)
    splits = torch.full((bs + 2,), -5, dtype=torch.int32)
    fused_graph_metadata(r2t, rpi, seq, kv_indptr, kv_indices, num_kv_splits=splits, **SPLITS)
    ref = fused_graph_metadata_ref(r2t, rpi, seq, **SPLITS)
    total = int(ref["kv_indptr"][-1])
    assert kv_indptr[: bs + 1].tolist() == ref["kv_indptr"].tolist()
    assert kv_indices[:total].tolist() == ref["kv_indices"].tolist()
    assert splits[:bs].tolist() == ref["num_kv_splits"].tolist()
    # nothing past the batch is written
    assert kv_indptr[bs + 1 :].tolist() == [-5] * 2 and splits[bs:].tolist() == [-5] * 2
    assert (kv_indices[total:] == -5).all()


@pytest.mark.parametrize("bs", [1, 3, 8])
@pytest.mark.parametrize("topk", [1, 2])
@pytest.mark.parametrize("idx", [torch.int32, torch.int64])
def test_verify_matches_reference(bs, topk, idx):
    pool, L, n, rnd = 12, 64, 4, random.Random(10 * bs + topk)
    r2t = pool_table(pool, L, idx, seed=1)
    lens = lengths(bs, L - n, rnd)
    trees = [DraftTree.chain(n) if topk == 1 else DraftTree.random(n, topk, 3, rnd.randint(0, 99)) for _ in range(bs)]
    mask_src = build_custom_mask(lens, trees, DEVICE)  # [sum N*(len+N)] bool
    seq, rpi = torch.tensor(lens, dtype=idx), torch.tensor(rnd.sample(range(pool), bs), dtype=idx)
    kv_indptr, kv_indices = torch.zeros(bs + 1, dtype=idx), torch.zeros(bs * L, dtype=idx)
    qo, mask_indptr = torch.full((bs + 1,), -1, dtype=idx), torch.full((bs + 1,), -1)
    buf = torch.full((bs * n * L + 5,), 9, dtype=torch.uint8)  # 9: never a mask value
    fused_graph_metadata(
        r2t,
        rpi,
        seq,
        kv_indptr,
        kv_indices,
        num_draft_tokens=n,
        qo_indptr=qo,
        mask_indptr=mask_indptr,
        custom_mask_src=mask_src,
        custom_mask=buf,
    )
    ref = fused_graph_metadata_ref(r2t, rpi, seq, num_draft_tokens=n, custom_mask_src=mask_src)
    total, mask_total = int(ref["kv_indptr"][-1]), mask_src.numel()
    assert kv_indptr.tolist() == ref["kv_indptr"].tolist()
    assert kv_indices[:total].tolist() == ref["kv_indices"].tolist()
    assert qo.tolist() == ref["qo_indptr"].tolist() == [i * n for i in range(bs + 1)]
    assert mask_indptr.tolist() == ref["mask_indptr"].tolist()
    assert int(mask_indptr[-1]) == mask_total
    assert torch.equal(buf[:mask_total].cpu(), ref["custom_mask"])
    assert (buf[mask_total:] == 9).all()
    # without a source mask: the offsets only, the buffer untouched
    buf2 = torch.full_like(buf, 9)
    fused_graph_metadata(r2t, rpi, seq, kv_indptr, kv_indices, num_draft_tokens=n, qo_indptr=qo, mask_indptr=mask_indptr)
    assert (buf2 == 9).all() and mask_indptr.tolist() == ref["mask_indptr"].tolist()


def test_split_counts_are_get_num_kv_splits():
    """One jit helper behind both kernels: same counts, whatever the lengths and settings."""
    rnd = random.Random(3)
    L = 4096
    r2t = pool_table(9, 8)  # the copy is not under test here (lengths past L are dropped)
    for trial in range(24):
        bs = rnd.choice([1, 2, 3, 5, 8, 17])
        lens = torch.tensor([rnd.choice([0, 1, 64, rnd.randint(1, L)]) for _ in range(bs)])
        heads, kv_heads = rnd.choice([(4, 4), (4, 1), (32, 2), (8, 2)])
        kw = dict(
            num_heads=heads,
            num_kv_heads=kv_heads,
            max_kv_splits=rnd.choice([1, 4, 16]),
            core_count=rnd.choice([0, 8, 132]),
            static=trial % 7 == 0,
        )
        want = torch.full((bs,), -1, dtype=torch.int32)
        get_num_kv_splits(want, lens, **kw)
        got = torch.full((bs,), -1, dtype=torch.int32)
        fused_graph_metadata(
            r2t,
            torch.zeros(bs, dtype=torch.int64),
            lens,
            torch.zeros(bs + 1, dtype=torch.int32),
            torch.zeros(1, dtype=torch.int64),
            num_kv_splits=got,
            **kw,
        )
        assert got.tolist() == want.tolist(), (lens.tolist(), kw)


# ----------------------------------------------------------------------------------------------
# bounds: bad device data, guard memory

OUT_GUARD, READ_GUARD, G = -7, -(2**20) - 3, 3


def guarded(shape, fill, guard, dtype):
    """A 1-D or 2-D view filled with ``fill`` inside a ``guard``-filled block; (view, block)."""
    block = torch.full(tuple(s + 2 * G for s in shape), guard, dtype=dtype)
    view = block[tuple(slice(G, G + s) for s in shape)]
    view.fill_(fill)
    return view, block


def guard_intact(block, shape, guard):
    inside = torch.zeros(block.shape, dtype=torch.bool)
    inside[tuple(slice(G, G + s) for s in shape)] = True
    return bool((block[~inside] == guard).all())


def test_bad_device_data_stays_in_bounds_and_matches_the_unified_launches():
    """Lengths past L, negative, out-of-pool request indices, outputs too short: every read
    inside ``req_to_token`` / the mask source, every store inside its output, and the result is
    what the unified hook's cumsum + ``build_kv_indices`` (+ mask prefix copy) leave."""
    pool, L, n = 4, 16, 2
    r2t, r2t_block = guarded((pool, L), 0, READ_GUARD, torch.int32)
    r2t.copy_(torch.arange(pool * L, dtype=torch.int32).view(pool, L) + 100)
    rpi = torch.tensor([4, -1, 2, 1000, 1, 3])
    seq = torch.tensor([5, 6, 20, 3, -2, 17], dtype=torch.int32)  # 20, 17 > L; -2 < 0
    bs, numel = 6, 30  # sum(seq) = 49 > numel
    # decode, and the unified launches on the same inputs
    ind, ind_b = guarded((bs + 1,), -1, OUT_GUARD, torch.int32)
    idx, idx_b = guarded((numel,), -1, OUT_GUARD, torch.int64)
    spl, spl_b = guarded((bs,), -1, OUT_GUARD, torch.int32)
    fused_graph_metadata(r2t, rpi, seq, ind, idx, num_kv_splits=spl, **SPLITS)
    ind_u, idx_u = torch.zeros(bs + 1, dtype=torch.int32), torch.full((numel,), -1)
    ind_u[1:] = torch.cumsum(seq, 0)
    build_kv_indices(r2t, rpi, seq, ind_u, idx_u)
    spl_u = torch.zeros(bs, dtype=torch.int32)
    get_num_kv_splits(spl_u, seq, **SPLITS)
    assert ind.tolist() == ind_u.tolist() and idx.tolist() == idx_u.tolist()
    assert spl.tolist() == spl_u.tolist()
    assert not (idx == READ_GUARD).any()
    for block, shape in ((ind_b, (bs + 1,)), (idx_b, (numel,)), (spl_b, (bs,))):
        assert guard_intact(block, shape, OUT_GUARD)
    assert guard_intact(r2t_block, (pool, L), READ_GUARD)
    # verify: a mask source shorter than the blocks, a buffer shorter than the source
    src, src_b = guarded((40,), 1, 5, torch.uint8)  # 5 around it: a read outside shows up
    src[::3] = 0
    buf, buf_b = guarded((33,), 9, 77, torch.uint8)
    qo, qo_b = guarded((bs + 1,), -1, OUT_GUARD, torch.int64)
    mi, mi_b = guarded((bs + 1,), -1, OUT_GUARD, torch.int64)
    fused_graph_metadata(
        r2t, rpi, seq, ind, idx, num_draft_tokens=n, qo_indptr=qo, mask_indptr=mi, custom_mask_src=src, custom_mask=buf
    )
    mi_u = torch.zeros(bs + 1, dtype=torch.int64)
    mi_u[1:] = torch.cumsum(n * (seq.long() + n), 0)
    assert mi.tolist() == mi_u.tolist() and qo.tolist() == [i * n for i in range(bs + 1)]
    # blocks [mask_indptr[i], +N*(seq_i+N)) of non-negative size, clipped to 33 = min(40, 33)
    want = torch.full((33,), 9, dtype=torch.uint8)
    for i in range(bs):
        lo, hi = int(mi_u[i]), min(int(mi_u[i + 1]), 33)
        if hi > lo >= 0:
            want[lo:hi] = src[lo:hi]
    assert buf.tolist() == want.tolist()
    for block, shape, guard in (
        (buf_b, (33,), 77),
        (qo_b, (bs + 1,), OUT_GUARD),
        (mi_b, (bs + 1,), OUT_GUARD),
        (src_b, (40,), 5),
    ):
        assert guard_intact(block, shape, guard)


def test_one_op_per_launch_and_argument_errors():
    r2t, seq = pool_table(4, 8), torch.tensor([3, 5], dtype=torch.int32)
    rpi, ind, idx = torch.tensor([1, 2]), torch.zeros(3, dtype=torch.int32), torch.zeros(16)
    spl, idx64 = torch.zeros(2, dtype=torch.int32), idx.long()
    with RecordOps() as rec:
        fused_graph_metadata(r2t, rpi, seq, ind, idx64, num_kv_splits=spl, **SPLITS)
    assert rec.names == [FUSED_OP]
    assert "refimpl::fused_graph_metadata" in KERNEL_OPS
    with pytest.raises(ValueError, match="not both"):
        fused_graph_metadata(r2t, rpi, seq, ind, idx64, num_kv_splits=spl, num_draft_tokens=2, **SPLITS)
    with pytest.raises(ValueError, match="kv_indptr.shape"):
        fused_graph_metadata(r2t, rpi, seq, ind[:2], idx64, num_kv_splits=spl, **SPLITS)
    with pytest.raises(ValueError, match="qo_indptr and mask_indptr"):
        fused_graph_metadata(r2t, rpi, seq, ind, idx64, num_draft_tokens=2)
    with pytest.raises(ValueError, match="custom_mask_src"):
        fused_graph_metadata(
            r2t,
            rpi,
            seq,
            ind,
            idx64,
            num_draft_tokens=2,
            qo_indptr=ind,
            mask_indptr=ind,
            custom_mask=torch.zeros(4, dtype=torch.uint8),
        )
    with pytest.raises(ValueError, match="dtype"):  # float kv_indices
        fused_graph_metadata(r2t, rpi, seq, ind, idx, num_kv_splits=spl, **SPLITS)
    args = fused_graph_metadata_args(r2t, rpi, seq, ind, idx64, num_kv_splits=spl, **SPLITS)
    with pytest.raises(ValueError, match="without a mask copy"):  # a fresh mask, no copy planned
        launch_fused_graph_metadata(args, torch.ones(4, dtype=torch.bool))


# ----------------------------------------------------------------------------------------------
# the backends


@pytest.mark.parametrize("variant, pattern", [("fused", "A"), gate("in_graph", "in-graph")])
def test_checker_passes_every_verdict(variant, pattern):
    settings = CheckSettings(
        capture_bs=(1, 4), max_context_len=40, num_slots=None, glue_replays=0, history=False
    )  # (e): test_glue.py, the matrix
    rows = run_checks(["triton"], ["decode", "idle", "target_verify"], [variant], "cpu-emulator", settings)
    assert [r.mode for r in rows] == ["decode", "idle", "target_verify"]
    for r in rows:
        assert must_pass(r.variant) and r.pattern == pattern
        verdicts = (r.capture_equals_replay, r.graph_equals_eager, r.matches_oracle, r.replay_matches_reference)
        assert verdicts == (True,) * 4 and not r.findings, (r.variant, r.mode, r.bs, r.findings)


SMALL = ModelConfig(kind="mha", num_layers=1, num_heads=2, num_kv_heads=1)  # cheap captures
VERIFY_SPEC = SpecConfig(topk=2, num_steps=3, num_draft_tokens=6)  # trees: a real mask


@functools.cache
def captured(cls, mode):
    """A CPU-emulator runner of ``cls`` with one graph (bs 4), and a batch generator."""
    w = World.create(SMALL, max_context_len=32, pool_size=12, page_size=1, device=DEVICE, seed=0)
    w.randomize_kv(0)
    gcfg = GraphConfig(max_bs=4, capture_bs=(4,), max_context_len=32, speculative=True, num_warmups=1)
    runner = GraphRunner(TinyDecoder(SMALL, w.device), cls(w, VERIFY_SPEC), CPUEmulatorEngine(), mode, gcfg, VERIFY_SPEC)
    runner.capture()
    return runner, BatchGenerator(w, VERIFY_SPEC, seed=5)


def hook_launches(cls, mode):
    runner, gen = captured(cls, mode)
    fb = gen.for_mode(mode, 3)
    padded = runner.padded_batch(fb)
    counts = launches(lambda: call_replay_hook(runner.backend, padded))
    gen.release(fb)
    return runner, counts


def test_replay_hooks_launch_one_fused_op_or_nothing():
    for mode in (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY):
        _, unified = hook_launches(TritonAttnBackend, mode)
        _, fused = hook_launches(TritonAttnBackendFused, mode)
        runner, in_graph = hook_launches(TritonAttnBackendInGraph, mode)
        assert sum(unified.values()) >= 3, unified  # cumsum + CSR + splits / mask work
        assert fused == {FUSED_OP: 1}, fused  # verify: the mask copy folded into the launch
        if mode.is_decode():
            assert in_graph == {}, in_graph  # re-point only
        else:
            assert in_graph == {"aten.copy_.default": 1}, in_graph  # the spec's mask
        kernels = runner.graphs[4].custom_kernels()  # in_graph: the rebuild is in the graph
        assert kernels[FUSED_OP] == 1, kernels
        assert not {"refimpl.build_kv_indices.default", "refimpl.num_kv_splits.default"} & set(kernels)
        fused_runner, _ = captured(TritonAttnBackendFused, mode)  # (cached)
        assert FUSED_OP not in fused_runner.graphs[4].custom_kernels()  # out of the graph


def test_in_graph_replay_rebuilds_inside_the_graph():
    runner, gen = captured(TritonAttnBackendInGraph, ForwardMode.DECODE)
    for lens in ([32, 2, 17], [1, 31, 9]):
        fb = gen.decode(3, lens)
        out = runner.replay(fb).clone()
        b = runner.backend
        assert b.kv_indptr[1:4].tolist() == torch.tensor(lens).cumsum(0).tolist()
        assert torch.allclose(out, runner.eager(fb), atol=1e-4)
        gen.release(fb)


def test_other_modes_are_refused_naming_the_supported_ones():
    for cls in (TritonAttnBackendFused, TritonAttnBackendInGraph):
        assert cls.graph_modes == {ForwardMode.DECODE, ForwardMode.IDLE, ForwardMode.TARGET_VERIFY}
        w = World.create(SMALL, max_context_len=16, pool_size=8, page_size=1, device=DEVICE)
        b = cls(w, SpecConfig())
        for mode in (ForwardMode.DRAFT_EXTEND, ForwardMode.DRAFT_EXTEND_V2):
            with pytest.raises(GraphModeNotSupported, match="decode, idle, target_verify"):
                b.check_graph_mode(mode)
        b.init_cuda_graph_state(2, 2)
        with pytest.raises(GraphModeNotSupported, match="multi-step draft decode"):
            call_capture_hook(b, _draft_batch(w))
    for variant in ("fused", "in_graph"):
        (entry,) = find("triton", variant)
        assert entry.multi_step_target is None
        with pytest.raises(GraphModeNotSupported):
            entry.load(multi_step=True)


def _draft_batch(w):
    fb = BatchGenerator(w, SpecConfig(), seed=0).decode(1, [3])
    fb.spec_info = DraftDecodeInput(topk=1, num_steps=3)
    return fb


@pytest.mark.gpu
def test_checker_passes_under_cuda_graphs():
    rows = run_checks(
        ["triton"], ["decode", "idle", "target_verify"], ["fused", "in_graph"], "cuda", CheckSettings(capture_bs=(1, 4))
    )
    assert rows and all(r.passed and not r.findings for r in rows), [r.findings for r in rows]
