"""Tests for what outputs cannot show: split counts, padded rows after a larger batch.

Planting bugs showed two blind spots. Split counts (``num_kv_splits``) change how decode splits
the keys, never the result, so computing them with half ``max_kv_splits`` passed every output
comparison. And a runner that stops resetting its padded rows passes every test that replays a
padded batch into freshly captured buffers: the bug shows only when a full batch came first and
left its rows behind. Each check below is a function returning the problems it finds, so the
planted-bug tests at the bottom can show that it does find them. A multi-step replay that skips its split counts
entirely is named by verdict (d) (the last test).
"""

from __future__ import annotations

import pytest
import torch
from helpers import gate

from refimpl import layout
from refimpl.backends import find
from refimpl.batch import World
from refimpl.batchgen import BatchGenerator
from refimpl.config import GraphConfig, ModelConfig, SpecConfig
from refimpl.graphs import CPUEmulatorEngine
from refimpl.graphs.inputs import StaticInputs
from refimpl.graphs.runner import GraphRunner
from refimpl.kernels.triton_decode import get_num_kv_splits, get_num_kv_splits_ref
from refimpl.layout import GraphKind
from refimpl.model import MultiStepDraftProgram, TinyDecoder
from refimpl.modes import ForwardMode
from refimpl.rig import KVGuard, diff_reference

L = 96
SPEC = SpecConfig(num_steps=2, topk=2, num_draft_tokens=5)
CHAIN = SpecConfig(num_steps=2, topk=1, num_draft_tokens=3)  # Wave's multi-step: chains only
# long and short requests together: the heuristic spreads its counts over 1..max_kv_splits
LENS = [3, 90, 41, 17]


def make_runner(name, variant, mode=ForwardMode.DECODE, multi=False, seed=0, capture_bs=(1, 2, 4)):
    cfg = ModelConfig()
    world = World.create(cfg, max_context_len=L, pool_size=32, seed=seed)
    world.randomize_kv(seed)
    entry = next(e for e in find(name) if e.variant == variant)
    spec = CHAIN if name == "wave" else SPEC
    model = TinyDecoder(cfg)
    program = MultiStepDraftProgram(model, spec.num_steps) if multi else model
    gcfg = GraphConfig(max_bs=4, capture_bs=capture_bs, max_context_len=L, speculative=True)
    # fp32 model: on a GPU the real flashinfer has no float32 kernels, so FlashInfer runs its
    # stand-in wrappers there (as on CPU)
    kwargs = {"prefer_real": False} if name == "flashinfer" and not multi else {}
    backend = entry.load(multi)(world, spec, **kwargs)
    runner = GraphRunner(program, backend, CPUEmulatorEngine(), GraphKind.parse("draft_decode" if multi else mode), gcfg, spec)
    runner.capture()
    return runner, BatchGenerator(world, spec, seed=seed + 1)


# --- split counts against the reference --------------------------------------------------------
def _split_buffers(runner) -> list[tuple[str, object, torch.Tensor, int]]:
    """(label, step backend, its num_kv_splits buffer, tokens per sequence) per split buffer."""
    b = runner.backend
    steps = getattr(b, "step_backends", None)
    if steps:
        return [(f"step{i}", s, s.forward_metadata.num_kv_splits, b.topk) for i, s in enumerate(steps)]
    return [("decode", b, b.forward_metadata.num_kv_splits, 1)]


def split_count_problems(runner, gen) -> list[str]:
    """Replay a batch; every split buffer's live part must equal ``get_num_kv_splits_ref`` (the
    pure-Python mirror of the heuristic) for the batch's lengths and the backend's limits."""
    multi = runner.kind.multi_step
    fb = gen.draft_decode(len(LENS), LENS) if multi else gen.decode(len(LENS), LENS)
    runner.replay(fb)
    problems = []
    for label, b, buf, group in _split_buffers(runner):
        want = get_num_kv_splits_ref(
            LENS,
            num_group=group,
            num_heads=b.cfg.num_heads,
            num_kv_heads=b.cfg.num_kv_heads,
            max_kv_splits=b.max_kv_splits,
            core_count=b.core_count,
        )
        got = buf[: len(want)].tolist()
        if got != want:
            problems.append(f"{label}: num_kv_splits {got} != reference {want}")
    gen.release(fb)
    return problems


SPLIT_TARGETS = [  # CPU CI: decode; the GPU gate: multi-step draft decode too
    (gate if multi else pytest.param)(n, v, multi, id=f"{n}-{v}-{'draft_decode' if multi else 'decode'}")
    for n in ("triton", "wave")
    for v in ("unified", "legacy")
    for multi in (False, True)
]


@pytest.mark.parametrize("name, variant, multi", SPLIT_TARGETS)
def test_split_counts_match_the_reference(name, variant, multi):
    runner, gen = make_runner(name, variant, multi=multi, capture_bs=(4,))
    assert split_count_problems(runner, gen) == []
    # the batch is one where halving max_kv_splits changes the counts (the test can see it)
    b = _split_buffers(runner)[0][1]
    want = get_num_kv_splits_ref(
        LENS, num_heads=b.cfg.num_heads, num_kv_heads=b.cfg.num_kv_heads, max_kv_splits=b.max_kv_splits, core_count=b.core_count
    )
    assert max(want) > b.max_kv_splits // 2, want


def test_planted_half_max_kv_splits_is_caught(monkeypatch):
    """Wave's unified split counts computed with half ``max_kv_splits``: outputs do not change,
    the reference comparison does."""
    from refimpl.backends.wave import WaveAttnBackend

    def half(self, num_kv_splits, seq_lens):
        get_num_kv_splits(
            num_kv_splits,
            seq_lens,
            num_group=num_kv_splits.numel() // max(seq_lens.numel(), 1),
            num_heads=self.cfg.num_heads,
            num_kv_heads=self.cfg.num_kv_heads,
            max_kv_splits=self.max_kv_splits // 2,
            core_count=self.core_count,
        )

    monkeypatch.setattr(WaveAttnBackend, "get_num_kv_splits", half)
    runner, gen = make_runner("wave", "unified", capture_bs=(4,))
    assert split_count_problems(runner, gen)


# --- padded rows after a larger batch ------------------------------------------------------------
def padding_after_full_problems(runner, gen) -> list[str]:
    """(``runner`` captured bs 4 only: its backend's metadata views are the bs-4 graph's.) Replay a full bs-4 batch, keep its requests live, then a bs-3 batch padded to 4: the
    padded row must be a padded row again (fill value, request row 0, slot 0), the graph-read
    state must equal the reference for the padded batch, the output must equal eager, and no
    slot of the full batch's requests may be written."""
    problems: list[str] = []
    full = gen.decode(4, [60, 70, 80, 90])
    runner.replay(full)
    fb = gen.decode(3, [5, 9, 13])
    guard = KVGuard(runner.world, fb)  # the full batch's requests are live and not in fb
    out = runner.replay(fb).clone()
    problems += guard.check()
    bs, fill = 4, runner.fill_value
    static = (runner.inputs.seq_lens[3].item(), runner.inputs.req_pool_indices[3].item(), runner.inputs.out_cache_loc[3].item())
    if static != (fill, layout.PAD_REQ_SLOT, layout.PAD_CACHE_SLOT):
        problems.append(f"padded row 3 holds (seq_len, request, slot) = {static}")
    ref = runner.backend.reference_graph_state(runner.padded_batch(fb))
    problems += diff_reference(runner.backend.graph_state(bs, runner.mode), ref)
    eager = runner.eager(fb)
    if not torch.allclose(out, eager, atol=1e-5, rtol=1e-5):
        problems.append(f"graph vs eager: max error {(out - eager).abs().max().item():.3g}")
    gen.release(fb)
    gen.release(full)
    return problems


PAD_TARGETS = [("torch_native", "unified"), ("triton", "unified"), ("wave", "unified"), ("flashinfer", "unified")]


@pytest.mark.parametrize("name, variant", PAD_TARGETS, ids=[n for n, _ in PAD_TARGETS])
def test_padding_after_a_larger_batch(name, variant):
    runner, gen = make_runner(name, variant, capture_bs=(4,))
    assert padding_after_full_problems(runner, gen) == []


def test_planted_no_padded_row_reset_is_caught(monkeypatch):
    """The runner no longer resetting padded rows (its copy writing only the batch's own rows):
    the full batch's last request stays in row 3, so the padded row writes that request's KV
    slot and reads its keys."""
    runner, gen = make_runner("triton", "unified", capture_bs=(4,))
    real = StaticInputs.load

    def no_padding(self, fb, bs, *verdict):
        real(self, fb, fb.batch_size, *verdict)  # rows fb.batch_size..bs keep what they held

    monkeypatch.setattr(StaticInputs, "load", no_padding)
    problems = padding_after_full_problems(runner, gen)
    assert any("padded row 3 holds" in p for p in problems), problems
    assert any("KV slot(s) outside the batch" in p for p in problems), problems


def test_guard_sees_a_rewrite_of_identical_values():
    """A stale padded row recomputes its old request's K/V bit for bit on a GPU: a guard that
    compared values would miss that write. The guarded slots hold a sentinel during the
    replay, so the rewrite is seen, and ``check()`` puts every value back."""
    world = World.create(ModelConfig(), max_context_len=L, pool_size=8, device="cpu")
    world.randomize_kv(0)
    gen = BatchGenerator(world, SPEC, seed=1)
    other, fb = gen.decode(2, [20, 30]), gen.decode(1, [10])
    slot = int(world.req_to_token[other.req_pool_indices[1], 5])  # another request's slot
    bufs = world.kv_cache.buffers()
    before = [b.clone() for b in bufs]
    guard = KVGuard(world, fb)
    assert bufs[0][slot].flatten()[0] == KVGuard.SENTINEL  # poisoned for the replay (a slot row's first element)
    bufs[0][slot] = before[0][slot]  # the "write": the very values the slot held
    row, pos = (world.req_to_token == slot).nonzero()[0].tolist()
    locs = torch.tensor([int(fb.out_cache_loc[0]), slot])  # graph row 1, a padded row, targets the slot
    want = "padded or live rows wrote 1 KV slot(s) outside the batch (other requests' or free)"
    assert guard.check(locs, live_rows=1) == [
        f"{want}: slot {slot} (request-table row {row}, position {pos}; written by graph row 1, a padded row)"
    ]
    assert all(torch.equal(b, a) for b, a in zip(bufs, before))  # restored
    held = set(world.req_to_token.flatten().tolist())
    free = next(i for i in range(1, world.kv_cache.num_slots) if i not in held)  # a slot no request holds
    guard = KVGuard(world, fb)
    bufs[0][free] = before[0][free]  # a padded row writing a free, non-reserved slot
    assert guard.check() == [f"{want}: slot {free} (a free slot)"]
    own = int(world.req_to_token[fb.req_pool_indices[0], 3])  # the batch's own earlier token
    guard = KVGuard(world, fb)
    bufs[1][own] += 1.0
    (problem,) = guard.check()
    assert problem.startswith(f"the replay overwrote 1 earlier KV slot(s) of requests in this batch: slot {own} (")


def test_oracle_rebuilds_the_verify_mask_from_the_trees():
    """A mask bug shared by the spec inputs, eager and the graph (here: every draft sees every draft) passes verdict
    (b), and the oracle catches it: it rebuilds each request's mask from the draft tree (``spec_info.parents``)."""
    import dataclasses

    from refimpl.layout import KINDS
    from refimpl.rig import Rig

    rig = Rig.build(
        find("triton", "unified")[0], KINDS["target_verify"], SPEC, CPUEmulatorEngine(), capture_bs=(2,), max_context_len=40
    )
    fb = rig.gen.for_mode(rig.kind, 2)
    assert (v := rig.run(fb)).graph_ok and v.oracle_ok
    everyone = dataclasses.replace(fb.spec_info, custom_mask=torch.ones_like(fb.spec_info.custom_mask))
    v = rig.run(fb.replace(spec_info=everyone))
    assert v.graph_ok and not v.oracle_ok and "eager vs oracle" in v.findings[0], v.findings


@pytest.mark.parametrize("name", ["torch_native", "triton", "flashinfer"])
def test_no_verify_mask_means_chains_on_every_backend(name):
    """One rule (no mask means chains): an eager verify batch without a custom mask is run as chains, the same output as
    the batch with its chain mask (torch_native once read it as "every draft sees every draft")."""
    import dataclasses

    from refimpl.layout import KINDS
    from refimpl.rig import Rig

    chain = CHAIN
    rig = Rig.build(
        find(name, "unified")[0],
        KINDS["target_verify"],
        chain,
        CPUEmulatorEngine(),
        capture_bs=(2,),
        max_context_len=40,
        capture=False,
    )
    fb = rig.gen.for_mode(rig.kind, 2)
    with_mask = rig.runner.eager(fb).clone()
    without = rig.runner.eager(fb.replace(spec_info=dataclasses.replace(fb.spec_info, custom_mask=None)))
    assert torch.equal(with_mask, without)


def test_findings_name_rows_columns_padded_rows_and_nan_rows():
    """A reviewer reads a finding without decoding flat indices: row and column of a 2-D buffer (the raw index kept),
    whether the row is a padded request's, and which output rows differ or hold NaN."""
    from refimpl.rig import close, diff_states

    table = torch.zeros(4, 64, dtype=torch.int32)
    other = table.clone()
    other[3, 0] = 7  # row 3 of a bs-4 graph whose batch has 3 live requests
    (line,) = diff_states({"block_table": table}, {"block_table": other}, rows=(3, 4))
    assert "[192] (row 3, col 0, a padded row) 0 vs 7" in line, line
    lens = torch.tensor([5, 6, 7, 1])
    (line,) = diff_states({"seq_lens": lens}, {"seq_lens": lens + torch.tensor([0, 1, 0, 0])}, rows=(3, 4))
    assert "[1] 6 vs 7" in line and "padded" not in line, line
    out, ref = torch.zeros(4, 8), torch.zeros(4, 8)
    out[1, 2], out[3, 0] = 1.0, float("nan")
    findings: list[str] = []
    assert not close(out, ref, dict(rtol=1e-4, atol=1e-4), "graph vs eager", findings)
    assert findings == ["graph vs eager: max abs difference 1 (rtol 0.0001, atol 0.0001); rows 1 differ; NaN in rows 3"]


def test_a_multi_step_replay_that_skips_its_split_counts_is_named():
    """Invisible in every output: the multi-step replay regenerates the indices but never calls ``get_num_kv_splits``,
    so the shared buffer keeps ``max_kv_splits`` (the split count groups the keys of one reduction: right, slower).
    (a)-(c) pass; (d) names each step's ``num_kv_splits`` at every size, the padded row too."""
    from refimpl.backends import load_backend_class
    from refimpl.check import CheckSettings, run_checks

    settings = CheckSettings(capture_bs=(1, 4), raw_bs=(1, 3), max_context_len=32, num_slots=None, history=False)
    rows = run_checks(
        modes=["draft_decode"],
        engine="cpu-emulator",
        settings=settings,
        entries=[load_backend_class("broken_backends:MultiStepSkipsSplits")],
    )
    assert [r.bs for r in rows] == [1, 3]
    for r in rows:
        assert r.capture_equals_replay and r.graph_equals_eager and r.matches_oracle, r.findings  # the output: fine
        assert r.replay_matches_reference is False
        assert [f.split(":")[:2] for f in r.findings] == [
            ["reference", " step0.num_kv_splits"],
            ["reference", " step1.num_kv_splits"],
        ]
