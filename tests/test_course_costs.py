"""Notebook 06's helpers (``refimpl.course.costs``) and the measurement figures it and ``python -m refimpl bench`` draw
(``refimpl.viz.measure``): every figure readable (at most 6 series, each labelled on the figure), every number the
notebook's text states still what the committed results say."""

import pytest
from matplotlib.colors import to_hex

from refimpl import viz
from refimpl.course import costs


def bar_colors(ax) -> set[str]:
    return {to_hex(p.get_facecolor()) for p in ax.patches}


def test_launch_costs_read_both_rounds():
    unit = costs.launch_costs()
    assert all(lo <= hi for lo, hi in unit.values())
    assert unit[costs.REPLAY] == (unit["graph.replay(), 1 kernel"][0], unit["graph.replay(), 64 kernels"][1])
    # the notebook's sentences: an eager op 7.6-8.1 µs, the builder 33.6-33.8 µs, a replay 3.0-5.6 µs, the kernel 1.1 µs
    builder = unit["refimpl kernel, as a hook calls it"]
    assert [round(x, 1) for x in unit["eager op"] + builder] == [7.6, 8.1, 33.6, 33.8]
    assert [round(x, 1) for x in unit[costs.REPLAY]] == [3.0, 5.6] and round(unit["kernel on the GPU"][0], 1) == 1.1
    assert costs.priced_as("aten.cumsum") == "eager op" and costs.priced_as(costs.REPLAY) == costs.REPLAY
    assert costs.priced_as("refimpl.build_kv_indices") == "refimpl kernel, as a hook calls it"


def test_draw_launch_costs_one_labelled_bar_per_item():
    fig = costs.draw_launch_costs()
    (ax,) = fig.axes
    items = [t.get_text() for t in ax.get_yticklabels()]
    assert items[-1] == "kernel on the GPU" and costs.REPLAY not in items and len(ax.patches) == len(items) == 9
    assert len(ax.texts) == len(items) and all(t.get_text().endswith(" µs") for t in ax.texts)
    assert len(bar_colors(ax)) <= 6 and "1.1 µs on the GPU" in ax.get_title()


def test_the_hooks_the_notebook_adds_up():
    measured = costs.measured_hooks()
    assert list(measured) == list(costs.SHAPES)
    assert [round(x) for x in measured["faithful"]] == [152, 209] and [round(x) for x in measured["fused"]] == [38, 40]
    assert measured["glued"][1] < 5 and measured["in-graph"][1] < 3.1


def test_host_bound_sizes_and_the_step_is_the_sum():
    assert costs.host_bound("unified") == {1, 8, 64} and costs.host_bound("in_graph") == set()
    assert costs.host_bound("unified", "target_verify") == {1, 8}
    assert costs.host_bound("fused", "target_verify") == set()
    table = costs.step_table("unified").splitlines()
    assert len(table) == 5 and table[-1].endswith("GPU-bound") and table[1].endswith("host-bound")
    assert costs.gpu_line("unified", "target_verify") == "bs 1: 169, bs 8: 198, bs 64: 480, bs 256: 1455"


def test_breakdown_draws_host_parts_and_a_gpu_bar_per_row():
    fig = costs.draw_breakdown()
    (ax,) = fig.axes
    rows = len(costs.BREAKDOWN)
    assert [t.get_text() for t in ax.get_yticklabels()] == [b[0] for b in costs.BREAKDOWN]
    assert len(ax.patches) == rows * 4  # copies, hook, launch, and the GPU bar
    texts = [t.get_text() for t in ax.texts]
    assert sum(t.startswith(" host ") for t in texts) == rows and sum(t.startswith(" GPU ") for t in texts) == rows
    assert {"copies", "hook", "launch"} <= set(texts)  # the parts named on the figure, not in a legend
    assert " host 793" in texts and " GPU 133" in texts  # FlashInfer target verify, as the text says
    assert len(bar_colors(ax)) == 4 and not ax.get_legend() and "host-bound" in ax.get_title()


def test_host_vs_gpu_labels_each_line_at_its_end():
    fig = costs.draw_host_vs_gpu()
    (ax,) = fig.axes
    labels = [t.get_text() for t in ax.texts]
    assert len(ax.lines) == len(labels) == 5 <= 6
    assert set(labels) == {f"{s}: host" for s in costs.SHAPES} | {"GPU: the graph"} and not ax.get_legend()
    ys = sorted(t.xy[1] for t in ax.texts)
    assert all(b - a >= 0.06 * ax.get_ylim()[1] - 1e-6 for a, b in zip(ys, ys[1:]))  # nudged apart
    colors = [line.get_color() for line in ax.lines]
    assert len(set(colors)) == len(colors), colors  # one colour per line: read in one look
    with pytest.raises(ValueError, match="at most 5"):
        viz.draw_host_vs_bs([], {}, 512, [("x", "triton", "unified", "k")] * 6)


def test_bench_figures_are_bars_or_few_lines(tmp_path):
    env, rows = costs.sweep()
    mine = [r for r in rows if r["context"] == 512 and r["backend"] in ("triton", "trtllm_mla")]
    step = viz.draw_step_graph_vs_eager(mine, env, 512)
    capture = viz.draw_capture_cost(mine, env, 512)
    n = len({(r["backend"], r["variant"], r["mode"]) for r in mine})
    for fig in (step, capture):
        (ax,) = fig.axes
        assert len(ax.patches) == 2 * n and len(bar_colors(ax)) == 2 and len(ax.get_yticklabels()) == n
    assert "bs 1" in step.axes[0].get_title() and "bs 256" in capture.axes[0].get_title()
    assert "MiB" not in capture.axes[0].get_xlabel()  # no pool growth: a memory_reserved difference, not the pool
    paths = viz.draw_bench_figures(mine, env, tmp_path)
    names = {"breakdown", "step_graph_vs_eager", "capture_cost", "host_vs_bs_triton"}
    assert {p.name for p in paths} == {f"replay_{n}.png" for n in names}
    assert all(
        len(ax.lines) <= 6
        for ax in viz.draw_host_vs_bs(mine, env, 512, [(v, "triton", v, "k") for v in ("unified", "fused", "in_graph")]).axes
    )


def test_hook_parts_runs_here():
    """The notebook's GPU cell, run once wherever the tests run (on the emulator its numbers mean nothing)."""
    lines = costs.hook_parts(bs=2, ctx=64, calls=1, repeats=1).splitlines()
    assert len(lines) == 6 and lines[1].strip().startswith("the whole replay hook")
