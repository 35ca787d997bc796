"""Notebook 02's helpers and figures (``refimpl.course.triton_modes``, ``refimpl.viz.speculative``): what the notebook
shows is checked here, on the functions that draw it."""

import pytest
import torch

from refimpl import ForwardMode, layout, viz
from refimpl.backends.triton import TritonAttnBackend
from refimpl.config import CHAIN, TREE
from refimpl.course import triton_modes
from refimpl.graphs import make_engine


def test_the_eagle_iteration_states_the_runners_rows_per_request():
    fig = viz.draw_eagle_iteration([-1, 0, 0, 1, 1, 3], [1, 3], TREE.num_steps, TREE.topk, title="t")
    texts = [t.get_text() for t in fig.axes[0].texts]
    for claim, mode, multi in (
        ("topk = {} rows per request per step", ForwardMode.DECODE, True),
        ("N = {} rows per request (one per tree node)", ForwardMode.TARGET_VERIFY, False),
        ("v1: S + 1 = {} rows per request", ForwardMode.DRAFT_EXTEND, False),
        ("v2: N = {} rows per request", ForwardMode.DRAFT_EXTEND_V2, False),
    ):
        rows = layout.GraphKind.parse("draft_decode" if multi else mode).rows(TREE)
        assert any(claim.format(rows) in t for t in texts), (claim, rows)
    badges = " ".join(t.get_text() for t in fig.axes[0].texts if t.get_gid() == "mode")
    for mode in ("DECODE", "TARGET_VERIFY", "DRAFT_EXTEND", "DRAFT_EXTEND_V2", "IDLE"):
        assert mode in badges
    assert fig._suptitle.get_text() == "t"


@pytest.fixture(scope="module")
def lab():
    return triton_modes.Lab.create(make_engine("cpu-emulator"))


def test_the_strides_figure_marks_every_entry_the_old_stride_moves(lab):
    v1 = lab.replay(ForwardMode.DRAFT_EXTEND, TritonAttnBackend(lab.world, CHAIN), CHAIN, accept_length=[2, 0, 3])
    v2 = lab.replay(ForwardMode.DRAFT_EXTEND_V2, TritonAttnBackend(lab.world, TREE), TREE)
    assert v1.bs == v2.bs == 4 and torch.allclose(v2.graph, v2.eager, atol=1e-4)
    fig = triton_modes.draw_draft_extend_strides(v1, v2)
    marked = [p for p in fig.axes[0].patches if p.get_gid() == "differs"]
    assert len(marked) == v2.bs  # entries 1..bs of [0, 4, 8, 12, 16] against [0, 6, 12, 18, 24]
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels[1].startswith("v1 qo_indptr (S+1 = 4)") and labels[3].startswith("v2 qo_indptr (N = 6)")
    for gen in lab.gens.values():
        gen.release_all()


def test_check_sees_a_planted_stride_through_b_and_d_but_not_a(lab):
    stride = {"rows": TREE.num_steps + 1}

    class Planted(TritonAttnBackend):
        def _update_draft_extend_buffers(self, bs, seq_lens, rpi, mode, spec_info):
            super()._update_draft_extend_buffers(bs, seq_lens, rpi, mode, spec_info)
            s = stride["rows"]
            self.qo_indptr[: bs + 1].copy_(torch.arange(0, bs * s + 1, s))

    v = lab.check(Planted, ForwardMode.DRAFT_EXTEND_V2, TREE)
    assert v.capture_equals_replay and not v.graph_equals_eager and not v.replay_matches_reference
    assert v.wrong_rows == [[4, 5], list(range(6)), list(range(6))]
    assert any("qo_indptr" in f for f in v.findings) and len(str(v).splitlines()) <= 8
    stride["rows"] = TREE.num_draft_tokens  # the stride #27545 set: every verdict passes
    ok = lab.check(Planted, ForwardMode.DRAFT_EXTEND_V2, TREE)
    assert ok.capture_equals_replay and ok.graph_equals_eager and ok.replay_matches_reference
    assert ok.wrong_rows == [[], [], []] and not lab.gen(TREE).live_requests
