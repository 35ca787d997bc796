"""Fuzzing (``refimpl.fuzz``) under hypothesis: every backend x unified variant x graph mode x
spec it captures, a bounded profile for CI.

Each target captures one graph size (3: batches of 1 and 2 pad to it) with a one-layer model and
checks ``REFIMPL_FUZZ_EXAMPLES`` random batches (default 2; derandomized, so CI sees the same
batches every run): graph == eager == oracle, no foreign KV slot written, and the output
unchanged after every static buffer's tail is poisoned. The long profile is
``python -m refimpl check --fuzz N [--seed S]``.
"""

from __future__ import annotations

import os
from dataclasses import asdict

import pytest
from helpers import gate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refimpl.backends import GraphModeNotSupported
from refimpl.fuzz import FuzzTarget, targets
from refimpl.graphs import make_engine

EXAMPLES = int(os.environ.get("REFIMPL_FUZZ_EXAMPLES", "2"))


def ci_profile(entry) -> dict:
    """One graph size, one layer, a small world (the default world, 640 positions and 100,000 slots: its own test)."""
    return dict(capture_bs=(3,), num_layers=1, max_context_len=160 if entry.page_size > 1 else 72, num_slots=None)


def _id(t) -> str:
    entry, case, spec = t
    return f"{entry.name}-{entry.variant}-{case}-{'tree' if spec.topk > 1 else 'chain'}"


SMALL = ("-decode-chain", "flashinfer-unified-target_verify-tree")  # CPU CI: each entry's decode, one tree
TARGETS = [(pytest.param if _id(t).endswith(SMALL) else gate)(*t, id=_id(t)) for t in targets()]


@pytest.mark.parametrize("entry, case, spec", TARGETS)
def test_fuzz(entry, case, spec):
    try:
        target = FuzzTarget(entry, case, spec, make_engine("auto"), **ci_profile(entry))
    except GraphModeNotSupported as e:
        pytest.skip(str(e))

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(st.randoms(use_true_random=False))
    def one_batch(rng):
        params = target.draw(rng)
        problems = target.check(params)
        assert not problems, f"{target.label} {asdict(params)}: {problems}"

    one_batch()


def test_poisoning_catches_a_read_past_the_live_region(monkeypatch):
    """The poison check can fail: a kernel that reads one key index past the live region (the
    last request's ``kv_indptr`` end moved by one inside the graph) sees the poison."""
    import torch

    from refimpl.backends import find, torch_native
    from refimpl.fuzz import CHAIN, FuzzParams

    real = torch_native.dense_paged_attention

    def one_past(q, k, v, kv_indptr, kv_indices, out, **kw):
        end = torch.zeros_like(kv_indptr)
        end[-1:] = 1  # a recorded op: the graph reads one index further every replay
        return real(q, k, v, kv_indptr + end, kv_indices, out, **kw)

    entry = next(e for e in find("torch_native") if e.variant == "unified")
    target = FuzzTarget(entry, "decode", CHAIN, make_engine("auto"), **ci_profile(entry))
    fb = target.batch(FuzzParams(raw_bs=3, seq_lens=[20, 31, 9]))  # no padded row: all read
    monkeypatch.setattr(torch_native, "dense_paged_attention", one_past)
    target.runner.capture()  # re-capture with the planted kernel
    graph = target.runner.replay(fb).clone()
    assert target.poison_and_replay(fb, graph)
    monkeypatch.undo()
    target.runner.capture()
    graph = target.runner.replay(fb).clone()
    assert target.poison_and_replay(fb, graph) == []  # the real kernel does not


def test_the_multi_step_oracle_takes_the_picks_of_the_run_it_checks():
    """Each draft step feeds its ``argmax`` to the next. A near tie in bf16 logits can rank the other way in the float64
    oracle, and one flipped pick changes every later step of that branch (the H200 fuzz met one). The oracle therefore
    takes eager's picks (``follow``): an oracle that picks other tokens on its own must still pass."""
    import torch

    from refimpl.backends import find
    from refimpl.fuzz import TREE, FuzzParams
    from refimpl.model import MultiStepDraftProgram

    class PicksOtherTokens(MultiStepDraftProgram):  # the oracle's own picks all differ: the argmin, not the argmax
        def __call__(self, fb, backend, follow=None):
            if follow is None and backend is target.rig.oracle:
                return super().__call__(fb, backend, follow=-super().__call__(fb, backend))
            return super().__call__(fb, backend, follow)

    entry = next(e for e in find("flashinfer") if e.variant == "unified")
    target = FuzzTarget(entry, "draft_decode", TREE, make_engine("auto"), **ci_profile(entry))
    rig = target.rig
    params = FuzzParams(raw_bs=2, seq_lens=[9, 30])
    assert target.check(params) == []
    own_picks = PicksOtherTokens(rig.program.model, rig.program.num_steps)
    rig.program = own_picks
    assert target.check(params) == []  # the oracle follows eager's picks
    fb = target.batch(params)
    eager = rig.runner.eager(fb).clone()
    rig.oracle.init_forward_metadata(fb)
    alone = own_picks(fb, rig.oracle)  # without them, every branch's later steps differ
    assert not torch.allclose(alone[:, 1:].float(), eager[:, 1:].float(), **rig.tol)
    target.gen.release(fb)


def test_fuzz_over_a_selection_with_nothing_to_fuzz_fails_like_check(capsys):
    """Wave captures no draft extend: every selected target is skipped, 0 batches, exit 1 (not 0) with the reason."""
    from refimpl.__main__ import main

    assert main(["check", "--fuzz", "1", "--backend", "wave", "--mode", "draft_extend", "--engine", "cpu-emulator"]) == 1
    assert "nothing fuzzed: every selected target was skipped" in capsys.readouterr().err


def test_the_fuzzers_draws_cover_every_dimension_of_its_diversity():
    """What ``check --fuzz N`` draws (its own seeds, its default world): padded batches and every captured size, lengths
    past 512 positions, KV slots past 65,535, and (a tree spec) trees that are not chains. A fuzzer that drew less (raw
    bs 1 only, short contexts, a small pool, chains only) fails here."""
    import random

    from refimpl.backends import find, load_backend_class
    from refimpl.fuzz import CAPTURE_BS, CHAIN, TREE
    from refimpl.spec import DraftTree

    target = FuzzTarget(
        load_backend_class("examples.paged_decode_backend:PagedDecodeBackend"), "decode", CHAIN, make_engine("auto")
    )
    draws = [target.draw(random.Random(f"0:{target.label}:{i}")) for i in range(32)]  # fuzz()'s seeds
    sizes = {p.raw_bs for p in draws}
    assert set(CAPTURE_BS) <= sizes and sizes - set(CAPTURE_BS), sizes  # every graph, and padded batches
    assert max(max(p.seq_lens) for p in draws) > 512
    slots = []
    for p in draws[:8]:
        fb = target.batch(p)
        slots.append(int(fb.world.req_to_token[fb.req_pool_indices].max()))
        target.gen.release(fb)
    assert max(slots) > 65_535, slots
    tree = FuzzTarget(
        find("flashinfer", "unified")[0],
        "target_verify",
        TREE,
        make_engine("auto"),
        capture_bs=(3,),
        num_layers=1,
        max_context_len=72,
        num_slots=None,
    )
    chain = DraftTree.chain(TREE.num_draft_tokens).parents
    parents = [t for i in range(8) for t in tree.draw(random.Random(f"0:{tree.label}:{i}")).trees]
    assert any(t != chain for t in parents), parents
