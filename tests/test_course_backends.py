"""Notebook 03's helpers (``refimpl/course/backends.py``): what its table and figures show is what the backends hold."""

import re

import pytest
import torch

from refimpl import ForwardMode, viz
from refimpl.backends.flashinfer import FlashInferAttnBackend
from refimpl.backends.flashinfer_mla import FlashInferMLAAttnBackend, FlashInferMLAAttnBackendAsUpstream
from refimpl.backends.triton import TritonAttnBackendLegacy
from refimpl.backends.wave import WaveAttnBackendLegacy, WaveMultiStepDraftBackend
from refimpl.course import backends as nb
from refimpl.rig import diff_states

N = nb.TREE.num_draft_tokens


@pytest.fixture(scope="module")
def s():
    return nb.setting("cpu-emulator")


def _marked(fig) -> int:
    return len([p for p in fig.axes[0].patches if p.get_gid() == "differs"])


def test_wave_sizes_its_buffers_by_batch_and_triton_by_tokens(s):
    bufs = nb.graph_buffers(s.world, B=4, N=6)
    T, L = 24, s.world.max_context_len
    shapes = {name: (list(t.shape), list(w.shape)) for name, (t, w) in bufs.items()}
    assert shapes["cuda_graph_num_kv_splits"] == ([T], [4])
    assert shapes["cuda_graph_attn_lse"][0][0] == T and shapes["cuda_graph_attn_lse"][1][0] == 4
    assert shapes["cuda_graph_kv_indices"] == ([T * L], [4 * L])
    assert shapes["cuda_graph_custom_mask"] == ([T * L], [T * L])
    assert [w.dtype for _, w in bufs.values()][2:] == [torch.int32, torch.uint8, torch.int32]
    table = nb.sizes_table(s.world, B=4, N=6)
    assert len(table.rows) == 5 and table.rows[0][1:] == ["[T] = 24 int32", "[B] = 4 int32"]
    assert table._repr_markdown_().count("\n") == 6 and "[B*L] = 160 int32" in str(table)


def test_refused_names_why(s):
    assert "chains only" in nb.refused(WaveMultiStepDraftBackend(s.world, nb.TREE), ForwardMode.DECODE)
    assert nb.refused(WaveMultiStepDraftBackend(s.world, nb.CHAIN), ForwardMode.DECODE).endswith("captures decode")


def test_flashinfer_rows_are_the_wrappers_bound_buffers_and_plans(s):
    fi_dec, fi_tv = FlashInferAttnBackend(s.world, nb.TREE), FlashInferAttnBackend(s.world, nb.TREE)
    _, padded = nb.replay_hooks(fi_dec, ForwardMode.DECODE, s.gen.decode(3), s)
    _, padded_tv = nb.replay_hooks(fi_tv, ForwardMode.TARGET_VERIFY, s.gen.target_verify(3), s)
    rows, roles = nb.flashinfer_rows(fi_dec, fi_tv)
    seq, prefix = padded.seq_lens.tolist(), padded_tv.seq_lens
    got = {k: t.tolist() for k, t in rows.items()}
    assert got["decode, bs-4 wrapper: bound kv_indptr"] == [0] + padded.seq_lens.cumsum(0).tolist()
    assert got["decode, bs-4 wrapper: plan's kv_len"] == seq
    assert got["decode, bs-1 wrapper: plan's kv_len"] == [1]  # the capture batch: one padded row
    assert got["verify, bs-4 wrapper: bound qo_indptr"] == list(range(0, 4 * N + 1, N))
    assert got["verify, bs-4 wrapper: bound kv_indptr"] == [0] + (prefix + N).cumsum(0).tolist()
    assert got["verify, bs-4 wrapper: bound mask_indptr"] == [0] + (N * (prefix + N)).cumsum(0).tolist()
    assert roles["decode, bs-4 wrapper: bound kv_indptr"] == [0, 1, 2, "pad", "value"]
    assert roles["decode, bs-1 wrapper: plan's kv_len"] == ["pad"]
    fig = nb.draw_flashinfer_wrappers(fi_dec, fi_tv)
    assert len(fig.axes[0].get_yticklabels()) == 6 and not fig.legends and _marked(fig) == 0
    s.gen.release_all()


def test_mla_figure_marks_exactly_as_upstreams_stale_bound_cells(s):
    fb = s.gen_mla.decode(3, seq_lens=[7, 31, 18])
    up, uni = FlashInferMLAAttnBackendAsUpstream(s.world_mla, nb.CHAIN), FlashInferMLAAttnBackend(s.world_mla, nb.CHAIN)
    (_, padded), _ = (nb.replay_hooks(b, ForwardMode.DECODE, fb, s) for b in (up, uni))
    rows, differs = nb.mla_rows(up, uni, padded)
    count = {k: int(d.sum()) for k, d in differs.items()}
    assert count["as-upstream, bound: kv_indptr"] == 4 and count["as-upstream, bound: kv_len_arr"] == 3
    assert sum(count.values()) == 7  # the batch, the plan and the unified buffers are all right
    assert rows["as-upstream, plan's kv_len"].tolist() == [7, 31, 18, 1]
    assert _marked(nb.draw_mla_stale(up, uni, padded)) == 7
    stale = nb.verdict_a(FlashInferMLAAttnBackendAsUpstream, nb.CHAIN, ForwardMode.DECODE, fb, s, world=s.world_mla)
    assert any(line.startswith("kv_indptr") and "stale from capture" in line for line in stale)
    assert not nb.verdict_a(FlashInferMLAAttnBackend, nb.CHAIN, ForwardMode.DECODE, fb, s, world=s.world_mla)
    s.gen_mla.release_all()


def test_legacy_figure_frames_every_cell_the_checker_reports(s):
    fb_dec, fb_v1 = s.gen.decode(3), s.gen_chain.draft_extend(3, 1, accept_length=[2, 0, 3])
    wave = nb.both_paths(WaveAttnBackendLegacy, None, ForwardMode.DECODE, fb_dec, s)
    tri = nb.both_paths(TritonAttnBackendLegacy, nb.CHAIN, ForwardMode.DRAFT_EXTEND, fb_v1, s)
    for cls, spec, mode, fb, (p, q) in (
        (WaveAttnBackendLegacy, None, ForwardMode.DECODE, fb_dec, wave),
        (TritonAttnBackendLegacy, nb.CHAIN, ForwardMode.DRAFT_EXTEND, fb_v1, tri),
    ):
        assert nb.verdict_a(cls, spec, mode, fb, s) == diff_states(p, q, rows=(3, 4))  # the checker's own lines
    reported = sum(int(re.match(r"\S+: (\d+) of", line).group(1)) for line in diff_states(*wave) + diff_states(*tri))
    fig = nb.draw_legacy_paths(wave, tri)
    assert reported == 7 and _marked(fig) == 2 * reported  # both rows of a pair framed
    assert not fig.legends and len(fig.axes[0].get_yticklabels()) == 6
    _, _, roles = nb.legacy_states(wave, tri)
    assert roles == {
        "Wave decode: num_kv_splits": [0, 1, 2, "pad"],
        "Triton draft extend v1: qo_indptr": [0, 1, 2, "pad", "value"],
        "Triton draft extend v1: kv_indptr": [0, 1, 2, "pad", "value"],
    }
    s.gen.release_all()
    s.gen_chain.release_all()


def test_draw_state_diff_legend_is_optional():
    a, b = {"x": torch.tensor([1, 2])}, {"x": torch.tensor([1, 3])}
    assert viz.draw_state_diff(a, b).legends and not viz.draw_state_diff(a, b, legend=False).legends
