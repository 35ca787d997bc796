"""Notebook 07's helpers (``refimpl/course/review.py``): the states it draws are the ones the checker compared, the
figures mark what differs, and the diff the notebook shows is the code's."""

import difflib
import re
from pathlib import Path

import torch

from refimpl.check import capture_vs_replay
from refimpl.course import review
from refimpl.graphs import CPUEmulatorEngine
from refimpl.layout import GraphKind
from refimpl.rig import Rig
from refimpl.viz.code import source_lines

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "07_reviewing_a_new_backend.py"
N = review.SETTINGS.spec.num_draft_tokens


def test_paths_are_the_checkers_batch_and_states():
    s = review.paths(review.BUGGY)
    assert (s.batch.batch_size, s.padded.batch_size) == (3, 4)
    settings = review.SMALL  # the world paths() draws in
    rig = Rig.build(
        review.entry(review.BUGGY),
        GraphKind.parse("target_verify"),
        settings.spec,
        CPUEmulatorEngine(),
        capture_bs=settings.capture_bs,
        max_context_len=settings.max_context_len,
        capture=False,
    )
    assert settings.raw_bs == (3,)  # the checker's only row: nothing drawn before it
    rig.gen.lengths = "one long"  # as the checker draws a row of 3 (check.row_lengths)
    fb = rig.gen.for_mode(rig.kind, 3)
    assert torch.equal(fb.seq_lens_cpu, s.batch.seq_lens_cpu)
    diffs, ref = capture_vs_replay(rig.new_backend, rig.runner, fb)
    (line,) = [d for d in diffs if d.startswith("mask_indptr: ")]
    pairs = [(int(a), int(b)) for a, b in re.findall(r"\] (\d+) vs (\d+)", line)]
    cap, rep = s.capture["mask_indptr"], s.replay["mask_indptr"]
    assert pairs == [(int(cap[i]), int(rep[i])) for i in range(1, 5)]
    assert any(r.startswith("reference: mask_indptr: ") for r in ref)


def test_draw_paths_marks_the_differing_block_starts():
    s = review.paths(review.BUGGY)
    fig = review.draw_paths(s, N)
    ax = fig.axes[0]
    labels = [t.get_text().split("  ")[0] for t in ax.get_yticklabels()]
    assert labels[2] == "kv_indptr: both paths" and "mask_indptr: replay path (Q)" in labels
    marks = [p for p in ax.patches if p.get_gid() == "differs"]
    assert len(marks) == 2 * 4  # entries 1..4 of both mask_indptr rows
    assert ax.get_title().endswith("the replay path's mask_indptr is not the reference's")


def test_mask_as_read_through_each_path():
    s = review.paths(review.BUGGY)
    read, tree = review.mask_as_read(s.q, s.padded, 1, N)
    assert read.shape == tree.shape == (N, int(s.padded.seq_lens_cpu[1]) + N)
    assert (read != tree).sum() > 0
    assert torch.equal(*review.mask_as_read(s.p, s.padded, 1, N))
    fig = review.draw_mask_as_read(s.q, s.padded, 1, N, "replay path")
    start = int(s.replay["mask_indptr"][1])
    assert f"mask_indptr[1] = {start}" in fig._suptitle.get_text()
    assert f"custom_mask[{start}:{start + read.numel()}]" in fig.axes[0].get_title()


def test_the_notebooks_diff_is_the_replay_hooks():
    ReviewBackend = review.entry(review.FIXED).load()
    Buggy = review.entry(review.BUGGY).load()
    src = lambda cls: source_lines(cls.init_forward_metadata_replay_cuda_graph)  # noqa: E731
    diff = difflib.unified_diff(src(Buggy), src(ReviewBackend), n=0, lineterm="")
    changed = [d for d in diff if d[:1] in "-+" and d[:3] not in ("---", "+++")]
    block = NOTEBOOK.read_text().split("# ```diff\n", 1)[1].split("# ```\n", 1)[0]
    assert [line[2:] for line in block.splitlines()] == changed


def test_cli_prints_the_table_without_the_legend(capsys):
    res = review.cli("--backend-class", review.FIXED, "--mode", "idle")
    out = capsys.readouterr().out
    assert res.returncode == 0 and "legend:" in res.stdout and "legend:" not in out
    assert out.splitlines()[1].startswith("review_backend") and out.rstrip().endswith("exit code 0")


class Local(review.entry(review.FIXED).load()):
    """A backend class defined outside any ``--backend-class`` module, as the notebook's exercise defines one."""


def test_check_prints_rows_of_a_class_defined_anywhere(capsys):
    (row,) = review.check(Local, ["idle"], glue=False)
    assert row.passed and row.glue_equals_eager is None
    assert capsys.readouterr().out.splitlines()[2].startswith("review_backend")
