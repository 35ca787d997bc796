"""Verdict (f), the history, and what the default check reaches (issue 30): every step of the history is pinned here by
the planted bug it exists for (``broken_backends.py``) or by the property that defines it, and the default check
replays every captured graph in a world where lengths pass 512 positions and slot ids pass 65,536.

A test below fails when its step is removed: the bug it plants is then first seen by a later step, or by none."""

from __future__ import annotations

import pytest
import torch
from helpers import gate

from refimpl.backends import find, load_backend_class
from refimpl.check import CheckSettings, check_entry_mode
from refimpl.config import CHAIN, TREE
from refimpl.graphs import CPUEmulatorEngine
from refimpl.graphs.runner import GraphRunner
from refimpl.layout import KINDS
from refimpl.rig import LONG_RUN, Rig, history_steps, history_verdict, long_run

EXAMPLE = "examples.paged_decode_backend:PagedDecodeBackend"


def rig_for(entry, kind="decode", spec=CHAIN, **kw) -> Rig:
    sizes = dict(capture_bs=(1, 2, 4), max_context_len=640, num_slots=102_400) | kw
    rig = Rig.build(entry, KINDS[kind], spec, CPUEmulatorEngine(), **sizes)
    rig.gen.lengths = "one long"  # as the checker draws
    return rig


def first_failing_step(target: str) -> str:
    """The label of the first history replay that fails, on a fresh rig (no per-size rows before it; a small world: the
    steps' order is the point)."""
    ok, findings = history_verdict(rig_for(load_backend_class(target), max_context_len=64, num_slots=None), 3)
    assert not ok and findings
    return findings[0].split(": ", 1)[0]


STEP_BUGS = [  # (planted bug, the history step that must be the first to fail on it)
    ("RefreshOnlyWhenSizeChanges", "history replay 2 (A's lengths, other requests, bs 3)"),
    ("RefreshOnlyWhenLengthsChange", "history replay 2 (A's lengths, other requests, bs 3)"),
    ("IndptrOnlyWhenSizeChanges", "history replay 3 (B, A's size, other lengths, bs 3)"),
    ("EveryKthReplaySkips", "history replay 8 (long run, replay 4 of 20 through the bs-1 graph)"),
]


@pytest.mark.parametrize("bug, step", STEP_BUGS, ids=[b for b, _ in STEP_BUGS])
def test_each_history_step_is_the_first_to_catch_the_bug_it_exists_for(bug, step):
    assert first_failing_step(f"broken_backends:{bug}") == step


def test_the_history_of_a_correct_backend_passes():
    ok, findings = history_verdict(rig_for(load_backend_class(EXAMPLE)), 3)
    assert ok, findings


@pytest.mark.parametrize(
    "name, kind, spec",
    [
        ("flashinfer", "decode", CHAIN),
        ("flashinfer", "target_verify", TREE),
        gate("flashinfer", "target_verify", CHAIN),
        gate("flashinfer", "draft_extend", CHAIN),
        gate("flashinfer", "draft_decode", TREE),
    ],
)
def test_history_steps_vary_one_thing_at_a_time_in_every_mode(name, kind, spec):
    """Step 2 repeats A's lengths (and accept lengths) for other requests (with trees: other trees), chains included;
    step 3 keeps A's size with other lengths; the C steps replay every other captured graph but the smallest (the long
    run's), largest first."""
    rig = rig_for(find(name, "unified")[0], kind, spec)
    (_, a), (label, same), (_, b), *rest = history_steps(rig, 3)
    lens = lambda fb: fb.seq_lens_cpu.tolist()
    assert lens(same) == lens(a) and same.batch_size == b.batch_size == a.batch_size == 3
    assert not set(same.req_pool_indices.tolist()) & set(a.req_pool_indices.tolist())  # other requests
    assert lens(b) != lens(a)
    assert max(lens(a)) > 512 - spec.num_steps * spec.topk  # one request near the context (640)
    if kind.startswith("draft_extend"):
        assert same.meta["accept_length"] == a.meta["accept_length"]
    if kind == "target_verify" and spec.topk > 1:
        assert label.endswith("other trees") and same.spec_info.custom_mask.tolist() != a.spec_info.custom_mask.tolist()
    assert [fb.batch_size for _, fb in rest] == [2]


def test_the_long_run_replays_one_graph_twenty_times_never_one_batch_twice_in_a_row(monkeypatch):
    rig, seen = rig_for(load_backend_class(EXAMPLE)), []
    real = GraphRunner.replay_hook
    monkeypatch.setattr(GraphRunner, "replay_hook", lambda self, fb, bs: seen.append(fb) or real(self, fb, bs))
    bs, failures = long_run(rig)
    runs = [fb for k, fb in enumerate(seen) if k == 0 or fb is not seen[k - 1]]  # a first replay runs its hook twice
    assert (bs, failures) == (1, []) and len(runs) == LONG_RUN >= 20 and {fb.batch_size for fb in seen} == {1}
    assert len({id(fb) for fb in runs}) == 2  # two batches in turn


def test_the_default_check_replays_every_captured_graph_in_a_large_world():
    """The default settings: every captured graph size replays at least once; some positions pass 512 and some KV slots
    that a replay reads pass 65,535 (a pool of at least 100,000 slots, handed out in random page order)."""
    settings = CheckSettings()
    assert settings.max_context_len > 512 and settings.num_slots >= 100_000
    replayed, positions, slots = set(), [], []
    real = GraphRunner.replay

    def spy(self, fb):
        replayed.add(self.pick_bs(fb.batch_size))
        positions.append(int(fb.positions.max()))
        rows = fb.world.req_to_token[fb.req_pool_indices]
        slots.append(int(rows.max()))
        return real(self, fb)

    with pytest.MonkeyPatch.context() as mp:  # no fixture: tests/test_mutants.py calls this test directly
        mp.setattr(GraphRunner, "replay", spy)
        rows = check_entry_mode(load_backend_class(EXAMPLE), "decode", CPUEmulatorEngine(), settings)
    assert all(r.passed for r in rows), [r.findings for r in rows]
    assert replayed == set(settings.capture_bs)
    assert max(positions) > 512 and max(slots) > 65_535, (max(positions), max(slots))


def test_the_history_replays_every_captured_graph():
    """Captured for bs 1, 2 and 4, a history from a bs-3 batch replays all three: A and B the bs-4 graph, C the bs-2,
    the long run the bs-1."""
    rig, replayed, real = (rig_for(load_backend_class(EXAMPLE), max_context_len=64, num_slots=None), [], GraphRunner.replay)
    with pytest.MonkeyPatch.context() as mp:  # no fixture: tests/test_mutants.py calls this test directly
        mp.setattr(GraphRunner, "replay", lambda self, fb: replayed.append(self.pick_bs(fb.batch_size)) or real(self, fb))
        ok, findings = history_verdict(rig, 3)
    assert ok, findings
    assert sorted(set(replayed)) == [1, 2, 4] and replayed.index(2) < replayed.index(1)


def test_the_checker_shares_one_kv_cache_per_world_shape():
    """``run_checks`` draws each world's random KV once (a 100,000-slot MLA cache takes seconds on a CPU); every target
    gets fresh request and slot tables over it."""
    worlds, entry = {}, find("flashinfer", "unified")[0]
    r1 = Rig.build(
        entry,
        KINDS["decode"],
        CHAIN,
        CPUEmulatorEngine(),
        capture_bs=(1,),
        max_context_len=64,
        num_slots=4096,
        worlds=worlds,
        capture=False,
    )
    r1.gen.for_mode(r1.kind, 2)
    r2 = Rig.build(
        entry,
        KINDS["target_verify"],
        CHAIN,
        CPUEmulatorEngine(),
        capture_bs=(1,),
        max_context_len=64,
        num_slots=4096,
        worlds=worlds,
        capture=False,
    )
    assert len(worlds) == 1 and r2.world.kv_cache is r1.world.kv_cache
    assert r2.world.allocator is not r1.world.allocator and not bool(r2.world.req_to_token.any())
    assert torch.equal(r2.world.kv_cache.k[0][1:9], r1.world.kv_cache.k[0][1:9])


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--context", "32"], "argument --context: 32 is below the minimum 64"),
        (["--pool", "5000"], "argument --pool: 5000 slots cannot hold the checker's request pool at --context 640 (need"),
        (["--fuzz", "2", "--context", "900"], "argument --fuzz: not with --context"),
    ],
)
def test_the_world_flags_refuse_what_cannot_hold_the_pool(flags, message, capsys):
    from refimpl.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["check", "--backend", "torch_native", *flags])
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.gate  # a larger world: the GPU gate
def test_a_larger_world_on_the_command_line(monkeypatch, capsys):
    from refimpl import check
    from refimpl.__main__ import main

    seen = []
    real = check.check_entry_mode
    monkeypatch.setattr(check, "check_entry_mode", lambda e, c, eng, s, w=None: seen.append(s) or real(e, c, eng, s, w))
    argv = ["check", "--backend-class", EXAMPLE, "--mode", "decode", "--context", "1024", "--pool", "204800"]
    assert main([*argv, "--engine", "cpu-emulator"]) == 0, capsys.readouterr()
    assert [(s.max_context_len, s.num_slots) for s in seen] == [(1024, 204800)]


def test_a_seed_torch_cannot_take_is_refused_on_the_command_line(capsys):
    from refimpl.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["check", "--fuzz", "1", "--seed", str(2**70)])
    assert e.value.code == 2 and "is not a seed: an integer in [0, 2**63)" in capsys.readouterr().err


def test_only_an_index_error_gets_the_bounds_hint_and_a_refusal_after_the_draw_names_the_backend():
    from refimpl.rig import raised
    from refimpl.validate import BatchRefused

    hint = "(metadata pointing outside a buffer?)"
    assert raised(IndexError("index 70000 is out of bounds for dimension 0 with size 4096")).endswith(hint)
    assert hint not in raised(RuntimeError("Overflow when unpacking long"))
    assert hint not in raised(ValueError("bad shape"))
    refused = raised(BatchRefused("seq_lens[0]=9: disagrees with seq_lens_cpu"))
    assert refused.startswith("the runner refused a batch that was valid when drawn (did the backend change its input?)")


def test_a_reference_finding_names_a_padded_row():
    from refimpl.rig import diff_reference

    lens = torch.tensor([5, 7, 1, 1])  # 2 live requests, padded to 4
    found = diff_reference({"seq_lens": lens}, {"seq_lens": torch.tensor([5, 7, 1, 2])}, rows=(2, 4))
    assert found == ["reference: seq_lens: 1 of 4 elements differ ([3] (padded row 3) 1 vs 2; graph reads vs reference)"]


def test_worker_processes_give_the_rows_one_process_gives():
    """``run_checks(jobs=2)`` (the CLI's default on a 2-core CPU) checks each target whole in a worker and returns the
    rows in order, verdict for verdict what one process returns."""
    import dataclasses

    from refimpl.check import run_checks

    settings = CheckSettings(max_context_len=64, num_slots=None)
    kw = dict(backends=["torch_native"], modes=["decode", "idle", "target_verify"], engine="cpu-emulator")
    one, two = (run_checks(**kw, settings=settings, jobs=j) for j in (1, 2))
    strip = lambda r: {k: v for k, v in dataclasses.asdict(r).items() if k not in ("findings", "glue_findings")}
    assert [strip(r) for r in two] == [strip(r) for r in one] and len(one) == 3  # one row per kind (raw bs 3, idle)
