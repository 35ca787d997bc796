"""refimpl.viz: every builder returns a Figure with the expected axes and annotations (tiny inputs)."""

import matplotlib
import matplotlib.colors

matplotlib.use("Agg")  # this module only: the builders never need a display

import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from refimpl import (
    layout,  # noqa: E402
    viz,  # noqa: E402
)
from refimpl.kernels import draft_decode_kv_indices_ref  # noqa: E402
from refimpl.spec import DraftTree, build_custom_mask  # noqa: E402


def _texts(ax, gid=None):
    return [t for t in ax.texts if gid is None or t.get_gid() == gid]


# --- draw_csr ----------------------------------------------------------------------------------
def _csr_inputs():
    r2t = torch.zeros(4, 6, dtype=torch.int32)  # [pool, L]; row 0 reserved
    r2t[1, :3] = torch.tensor([11, 12, 13])
    r2t[2, :4] = torch.tensor([21, 22, 23, 24])
    rpi = torch.tensor([1, 2, 0])  # two live requests and a padded row
    lens = torch.tensor([2, 4, 1], dtype=torch.int32)  # row 1 has a third, unused slot
    indptr = torch.tensor([0, 2, 6, 7], dtype=torch.int32)
    idx = torch.tensor([11, 12, 21, 22, 23, 24, 0, 99, 99])  # a longer graph buffer
    return r2t, rpi, lens, indptr, idx


def test_draw_csr_axes_and_annotations():
    r2t, rpi, lens, indptr, idx = _csr_inputs()
    fig = viz.draw_csr(r2t, rpi, lens, indptr, idx, title="tiny")
    assert isinstance(fig, Figure)
    top, bot = fig.axes
    assert len(fig.axes) == 2
    assert len(_texts(top)) == 3 * 4  # bs rows x shown columns (the last used column is 3)
    assert [t.get_text() for t in _texts(bot, "kv_indptr")] == ["0", "2", "6", "7"]
    cells = [t.get_text() for t in _texts(bot) if t.get_gid() is None]
    assert cells == ["11", "12", "21", "22", "23", "24", "0"]  # only kv_indptr[-1] entries
    assert "differ" not in bot.get_title()
    assert fig._suptitle.get_text() == "tiny"


def test_draw_csr_flags_a_wrong_entry_and_bad_shapes():
    r2t, rpi, lens, indptr, idx = _csr_inputs()
    idx[3] = 5  # not req_to_token[2, 1]
    fig = viz.draw_csr(r2t, rpi, lens, indptr, idx)
    assert "1 entries differ" in fig.axes[1].get_title()
    with pytest.raises(ValueError, match="kv_indptr entries"):
        viz.draw_csr(r2t, rpi, lens, indptr[:-1], idx)


def test_draw_csr_empty_request_labels_its_boundary_once():
    r2t, rpi, _, _, idx = _csr_inputs()
    lens = torch.tensor([2, 4, 0], dtype=torch.int32)  # a padded draft-extend row: no prefix
    indptr = torch.tensor([0, 2, 6, 6], dtype=torch.int32)
    fig = viz.draw_csr(r2t, rpi, lens, indptr, idx)
    assert [t.get_text() for t in _texts(fig.axes[1], "kv_indptr")] == ["0", "2", "6"]
    assert "differ" not in fig.axes[1].get_title()


# --- draw_tree_mask ------------------------------------------------------------------------------
def _verify_mask():
    trees = [DraftTree([-1, 0, 0]), DraftTree([-1, 0, 1])]
    seq = torch.tensor([2, 1], dtype=torch.int32)
    return trees, seq, build_custom_mask(seq, trees), layout.mask_indptr(seq.long(), 3)


def test_draw_tree_mask_with_and_without_parents():
    trees, seq, mask, mask_indptr = _verify_mask()
    fig = viz.draw_tree_mask(mask, mask_indptr, 3, request=1, parents=trees[1].parents)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    mask_ax, tree_ax = fig.axes
    assert len(_texts(mask_ax)) == 3 * 3  # the tree part's 0/1 cells
    assert [t.get_text() for t in _texts(tree_ax)] == ["0", "1", "2"]
    assert "custom_mask[15:27]" in mask_ax.get_title()
    assert "disagree" not in mask_ax.get_title()

    # a uint8 graph buffer longer than needed; seq_lens where mask_indptr belongs is refused
    buf = torch.zeros(64, dtype=torch.uint8)
    buf[: mask.numel()] = mask.to(torch.uint8)
    with pytest.raises(ValueError, match=r"mask_indptr=\[2, 1\] is not \[0, cumsum"):
        viz.draw_tree_mask(buf, seq, 3, request=0)
    fig2 = viz.draw_tree_mask(buf, layout.mask_indptr(seq.long(), 3), 3, request=0)
    assert len(fig2.axes) == 1 and len(_texts(fig2.axes[0])) == 9
    assert "custom_mask[0:15]" in fig2.axes[0].get_title()


def test_draw_tree_mask_flags_a_mask_that_is_not_the_tree():
    trees, seq, mask, mask_indptr = _verify_mask()
    fig = viz.draw_tree_mask(mask, mask_indptr, 3, request=0, parents=[-1, 0, 1])  # a chain
    assert "1 cells disagree" in fig.axes[0].get_title()  # node 2: ancestor 1 missing
    with pytest.raises(ValueError, match="outside"):
        viz.draw_tree_mask(mask, mask_indptr, 3, request=2)


# --- draw_buffers --------------------------------------------------------------------------------
def test_draw_buffers_rows_cells_and_scalars():
    state = {
        "qo_indptr": torch.tensor([0, 4, 8]),
        "kv_indptr": torch.arange(12, dtype=torch.int32),  # truncated: 9 cells + "+3"
        "steps": torch.zeros(2, 3, dtype=torch.int32),  # 2 rows
        "max_extend_len": 4,
        "ratio": torch.tensor(0.5),
    }
    fig = viz.draw_buffers(state, "buffers", max_cells=10)
    assert isinstance(fig, Figure) and len(fig.axes) == 1
    (ax,) = fig.axes
    texts = [t.get_text() for t in _texts(ax)]
    assert len(texts) == 3 + 10 + 2 * 3 + 2
    assert "+3" in texts and "max_extend_len = 4" in texts and "ratio = 0.5" in texts
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["qo_indptr  [3] int64", "kv_indptr  [12] int32", "steps[0]  [2, 3] int32", "steps[1]  [2, 3] int32"]
    assert ax.get_title() == "buffers"
    with pytest.raises(ValueError, match="1-D or 2-D"):
        viz.draw_buffers({"x": torch.zeros(1, 1, 1)})


# --- draw_draft_decode_indices -------------------------------------------------------------------
def test_draw_draft_decode_indices_one_axes_per_step():
    S, topk = 3, 2
    r2t = torch.arange(4 * 12, dtype=torch.int32).view(4, 12)  # [pool, L]
    rpi, seq = torch.tensor([1, 2]), torch.tensor([2, 3], dtype=torch.int32)
    indptrs, indices = draft_decode_kv_indices_ref(rpi, r2t, seq, topk=topk, num_steps=S)
    rows = 2 * topk
    kv_indptr = torch.zeros(S, 9, dtype=torch.int32)  # [S, pool*topk+1] as the wrapper's
    kv_indices = torch.zeros(S, 40, dtype=torch.int64)  # [S, W]
    for i in range(S):
        kv_indptr[i, : rows + 1] = indptrs[i]
        kv_indices[i, : indices[i].numel()] = indices[i]
    fig = viz.draw_draft_decode_indices(kv_indptr, kv_indices, seq, topk, S, used_steps=S - 1, live_seqs=1)
    assert isinstance(fig, Figure) and len(fig.axes) == S
    for i, ax in enumerate(fig.axes):
        assert len(_texts(ax)) == indices[i].numel()  # every used entry drawn once
        assert "wrong length" not in ax.get_title()
    assert "no step backend reads it" in fig.axes[-1].get_title()
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()][-1].startswith("pad 1 br 1")

    kv_indptr[0, 1] += 1  # row (0, 0) one entry too long
    fig = viz.draw_draft_decode_indices(kv_indptr, kv_indices, seq, topk, S)
    assert "wrong length" in fig.axes[0].get_title()


# --- save ----------------------------------------------------------------------------------------
def test_save_creates_dirs_and_is_reproducible(tmp_path):
    r2t, rpi, lens, indptr, idx = _csr_inputs()
    a = viz.save(viz.draw_csr(r2t, rpi, lens, indptr, idx), tmp_path / "x" / "a.png")
    b = viz.save(viz.draw_csr(r2t, rpi, lens, indptr, idx), tmp_path / "y" / "b.png")
    data = a.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"Software" not in data and b"matplotlib" not in data
    assert data == b.read_bytes()


# --- colour roles, legends ---------------------------------------------------------------------
def _legend_texts(fig):
    return [t.get_text() for leg in fig.legends for t in leg.get_texts()]


def _differs(ax):
    return [p for p in ax.patches if p.get_gid() == "differs"]


def test_batch_and_segment_roles():
    assert viz.batch_roles(5, 2, 3) == [0, 1, "pad", "unread", "unread"]
    assert viz.batch_roles(5, 2, 3, indptr=True) == [0, 1, "pad", "value", "unread"]
    assert viz.batch_roles(2, 0, 1) == ["pad", "unread"]  # an idle batch: every row padded
    with pytest.raises(ValueError, match="live"):
        viz.batch_roles(3, 4, 2)
    indptr = torch.tensor([0, 2, 2, 5, 6])  # request 1 is empty, request 3 padded
    assert viz.segment_roles(indptr, 3, 8) == [0, 0, 2, 2, 2, "pad", "unread", "unread"]


def test_draw_buffers_roles_differs_and_legend():
    state = {"qo_indptr": torch.tensor([0, 4, 8, 12]), "seq_lens": torch.tensor([5, 1]), "n": 3}
    fig = viz.draw_buffers(
        state,
        roles={"qo_indptr": viz.batch_roles(4, 2, 3, indptr=True), "seq_lens": [0, "stale"]},
        differs={"seq_lens": [False, True], "n": True},
        differs_label="differs from the reference",
    )
    (ax,) = fig.axes
    assert len(_differs(ax)) == 1  # one framed cell; the scalar turns red instead
    labels = _legend_texts(fig)
    assert labels == [
        "live request 0",
        "live request 1",
        viz.ROLE_LABELS["pad"],
        viz.ROLE_LABELS["value"],
        viz.ROLE_LABELS["stale"],
        "differs from the reference",
    ]
    assert [t for t in ax.texts if t.get_text() == "n = 3"][0].get_color() == viz.BAD_COLOR
    # cell colours follow the roles: live request 0 blue, the padded row orange
    faces = [matplotlib.colors.to_hex(p.get_facecolor()) for p in ax.patches if p.get_gid() is None]
    assert faces[0] == viz.REQ_COLORS[0] and faces[2] == viz.PAD_COLOR
    # without roles or differs: plain values, no legend (as before)
    assert not viz.draw_buffers({"x": torch.arange(3)}).legends
    with pytest.raises(ValueError, match="unknown cell role"):
        viz.draw_buffers({"x": torch.arange(2)}, roles={"x": ["nope", 0]})


def test_draw_state_diff_marks_every_differing_cell_in_both_rows():
    cap = {"splits": torch.tensor([8, 8, 8, 8]), "qo": torch.tensor([0, 4, 8]), "max_len": 4}
    rep = {"splits": torch.tensor([1, 8, 7, 1]), "qo": torch.tensor([0, 4, 8]), "max_len": 5}
    fig = viz.draw_state_diff(cap, rep, roles={"splits": viz.batch_roles(4, 3, 4)}, title="t")
    (ax,) = fig.axes
    assert len(_differs(ax)) == 2 * 3  # entries 0, 2, 3 of splits, in both rows
    assert ax.get_title() == "t\n4 cell(s) differ"  # 3 cells + the scalar
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[:2] == ["qo: after the capture path  [3] int64", "qo: after the replay path  [3] int64"]
    assert "differs: after the capture path vs after the replay path" in _legend_texts(fig)
    same = viz.draw_state_diff(cap, cap)
    assert not _differs(same.axes[0]) and same.axes[0].get_title() == "no cell differs"
    # a shape mismatch marks every cell; a key one side lacks is marked too
    odd = viz.draw_state_diff({"a": torch.zeros(2)}, {"a": torch.zeros(3), "b": 1}, keys=["a", "b"])
    assert len(_differs(odd.axes[0])) == 2 + 3


def test_draw_eagle_iteration_names_every_graph_mode():
    fig = viz.draw_eagle_iteration([-1, 0, 0, 1, 1, 3], [1, 3], num_steps=3, topk=2)
    (ax,) = fig.axes
    modes = " ".join(t.get_text() for t in ax.texts if t.get_gid() == "mode")
    for m in ("DECODE", "TARGET_VERIFY", "DRAFT_EXTEND (v1)", "DRAFT_EXTEND_V2", "IDLE"):
        assert m in modes
    texts = " ".join(t.get_text() for t in ax.texts)
    assert "N = 6 rows per request" in texts and "S + 1 = 4 rows per request" in texts
    assert "accept_length = 2" in texts
    assert "accept_length = 2" in fig._suptitle.get_text()
    with pytest.raises(ValueError, match="not a chain"):
        viz.draw_eagle_iteration([-1, 0, 0], [2, 1], num_steps=2, topk=2)
    with pytest.raises(ValueError, match="depth"):
        viz.draw_eagle_iteration([-1, 0, 1, 2], [], num_steps=2, topk=1)


def test_grid_builders_have_legends():
    r2t, rpi, lens, indptr, idx = _csr_inputs()
    csr = _legend_texts(viz.draw_csr(r2t, rpi, lens, indptr, idx))
    assert csr[:3] == ["request 0", "request 1", viz.ROLE_LABELS["pad"]]
    assert "kv_indptr boundary" in csr
    assert not viz.draw_csr(r2t, rpi, lens, indptr, idx, legend=False).legends
    trees, seq, mask, mask_indptr = _verify_mask()
    tm = _legend_texts(viz.draw_tree_mask(mask, mask_indptr, 3, request=0, parents=[-1, 0, 1]))
    assert "disagrees with the tree" in tm  # the chain is not request 0's tree
    S, topk = 2, 2
    r2t = torch.arange(3 * 8, dtype=torch.int32).view(3, 8)
    seq = torch.tensor([2, 1], dtype=torch.int32)
    indptrs, indices = draft_decode_kv_indices_ref(torch.tensor([1, 2]), r2t, seq, topk=topk, num_steps=S)
    dd = viz.draw_draft_decode_indices(
        torch.stack(indptrs),
        torch.stack([torch.nn.functional.pad(x, (0, 20 - x.numel())) for x in indices]),
        seq,
        topk,
        S,
        live_seqs=1,
    )
    assert _legend_texts(dd)[:2] == ["seq 0: prefix slots", "padded seq: prefix slot 0"]


def test_figure_titles_say_emulator_only_for_emulator_timings():
    """The bench notes every run; only the CPU's note means emulator timings (an H200 sweep was once titled so)."""
    from refimpl.viz.measure import _where

    assert _where({"device": "NVIDIA H200", "note": "NVIDIA H200: CUDA graph timings"}) == "NVIDIA H200"
    assert _where({"device": "CPU (x86_64)", "note": "CPU: emulator timings (what the Python costs)"}).endswith(
        "(emulator timings)"
    )


def test_code_grid_tags_one_line_each_and_renders_both_ways():
    """The notebooks' code views: a tag that matches no line, or two, is an error (a claim about moved code fails)."""
    from refimpl.viz.code import CodeGrid, hook_code, source_lines

    def f(x):
        """doc"""
        y = x + 1  # a comment naming g(
        return g(y)

    def g(y):
        return y

    assert source_lines(f)[0].startswith("def f(x):") and '"""doc"""' not in "".join(source_lines(f))
    assert hook_code(f) == ["    y = x + 1", "    return g(y)"] and "# a comment" in hook_code(f, comments=True)[0]
    grid = CodeGrid(["f", "g"], [""], [[[("f", hook_code(f))], [("g", hook_code(g))]]], [[[("g(y)", "the call")], []]])
    assert grid.position(0, 0, "the call") == (0, 1)
    assert "<-- the call" in str(grid) and "\u25c0 the call" in grid._repr_html_()
    for needle in ("nowhere", "y"):  # no line, two lines
        with pytest.raises(ValueError, match="lines of cell"):
            CodeGrid(["f"], [""], [[[("f", hook_code(f))]]], [[[(needle, "t")]]])
