"""Notebook 05's helpers (``refimpl.course.mla``): the block-table figure, the checker line, the H200 results; and the
FlashInfer-MLA merged-branch claim the notebook states in one sentence."""

import ast
import inspect
import textwrap

import pytest
from matplotlib.patches import Rectangle

from refimpl.backends.cutlass_mla import CutlassMLAAttnBackend
from refimpl.backends.flashinfer_mla import (
    FlashInferMLAAttnBackend,
    FlashInferMLAAttnBackendAsUpstream,
    FlashInferMLAAttnBackendLegacy,
)
from refimpl.backends.trtllm_mla import TRTLLMMLAAttnBackend
from refimpl.check import CheckRecord
from refimpl.course import mla
from refimpl.graphs.runner import call_capture_hook

CAPTURE, REPLAY = "init_forward_metadata_capture_cuda_graph", "init_forward_metadata_replay_cuda_graph"


def panel(P, cls):
    world, fb = mla.three_requests(P)
    backend = cls(world, mla.CHAIN)
    backend.init_cuda_graph_state(4, 4)
    call_capture_hook(backend, fb)
    return (cls.name, P, world.req_to_token, fb.req_pool_indices, fb.seq_lens, backend.forward_metadata.block_kv_indices)


def marks(fig):
    return [p for ax in fig.axes for p in ax.patches if isinstance(p, Rectangle) and p.get_gid() == "differs"]


@pytest.fixture(scope="module")
def panels():
    return [panel(32, TRTLLMMLAAttnBackend), panel(64, TRTLLMMLAAttnBackend), panel(128, CutlassMLAAttnBackend)]


def test_block_tables_widths_and_unread_entries(panels):
    widths = {P: table.shape[1] for _, P, *_, table in panels}
    assert widths == {32: 128, 64: 64, 128: 2}  # lcm(128 // P, 4096 // P) pages; Cutlass L // 128 + 1
    for _, P, _, _, lens, table in panels:
        fill = 1 if P == 128 else -1  # Cutlass's graph table starts at 1, TRTLLM's at -1
        for i, n in enumerate(lens.tolist()):
            assert (table[i, -(-n // P) :] == fill).all()


def test_draw_block_tables_marks_only_wrong_read_entries(panels):
    fig = mla.draw_block_tables(panels)
    assert len(fig.axes) == 3 and not marks(fig)
    name, P, r2t, rpi, lens, table = panels[0]
    wrong = table.clone()
    wrong[2, 1] += 1  # request 2 (length 2P + 1) reads page 1
    wrong[0, 5] = 7  # request 0 (length P - 1) never reads page 5: not a mistake
    assert len(marks(mla.draw_block_tables([(name, P, r2t, rpi, lens, wrong)]))) == 1


def branches(fn) -> dict[str, str]:
    """{predicate: ast dump of the body} for each ``if/elif forward_mode.<predicate>():`` of ``fn``."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Call) and isinstance(node.test.func, ast.Attribute):
            out[node.test.func.attr] = "\n".join(ast.dump(stmt) for stmt in node.body)
    return out


def test_flashinfer_mla_legacy_branches_are_identical_and_merged_after():
    for hook in (CAPTURE, REPLAY):  # legacy: two textually identical branches in each hook
        legacy = branches(getattr(FlashInferMLAAttnBackendLegacy, hook))
        assert legacy["is_target_verify"] == legacy["is_any_draft_extend"]
    assert "is_any_draft_extend" not in branches(getattr(FlashInferMLAAttnBackendAsUpstream, CAPTURE))  # merged
    replay = textwrap.dedent(inspect.getsource(FlashInferMLAAttnBackend._host_phase))  # (the replay hook's first phase)
    assert "mode.is_target_verify() or mode.is_any_draft_extend()" in replay  # one merged branch
    assert (
        FlashInferMLAAttnBackendAsUpstream.init_forward_metadata_replay_cuda_graph
        is FlashInferMLAAttnBackend.init_forward_metadata_replay_cuda_graph
    )


def test_verdict_line_names_each_finding_once():
    findings = ["max_seq_len_k: 48 frozen", "reference: max_seq_len_k: graph reads 1", "graph vs eager: 2.28"]
    rec = CheckRecord("trtllm_mla", "legacy", "decode", 3, "cpu", False, False, True, findings, "C", False)
    line = mla.verdict_line(rec)
    assert (
        line == "trtllm_mla/legacy decode bs 3: (a) False (b) False (c) True (d) False; findings: max_seq_len_k, graph vs eager"
    )


def test_op_names():
    counts = {"aten.arange.start_step": 1, "aten.copy_.default": 2, "refimpl.build_block_table.default": 1}
    assert mla.op_names(counts) == "arange, 2 copy_, build_block_table" and mla.op_names({}) == "nothing"


def test_h200_results_figure_and_medians():
    rows = mla.h200_results()["rows"]
    assert mla.medians(rows).splitlines()[0] == "bs   1: unified 220 µs, simplified 160 µs, in_graph 79 µs"  # the README's
    (lo, hi), (lo2, hi2) = mla.savings(rows).values()
    assert 55 < lo < hi < 100 and 80 < lo2 < hi2 < 180
    assert mla.hook_launches(rows) == {"unified": {7}, "simplified": {2}, "in_graph": {0}}
    fig = mla.draw_h200_replay()
    assert len(fig.axes) == 2 and all(len(ax.lines) == 3 for ax in fig.axes)  # one line per shape, no second run
    assert f"saves {lo:.0f}-{hi:.0f} µs" in fig._suptitle.get_text()
