"""Notebook 04's helpers (``refimpl/course/patterns.py``): the three shapes' tags, FlashInfer's dispatch counts, the
pattern labels against the code, the plan-state figure and the committed plan-cost measurement."""

from refimpl.backends import REGISTRY
from refimpl.backends.base import hook_interface
from refimpl.backends.flashinfer import FlashInferAttnBackend, FlashInferAttnBackendLegacy
from refimpl.backends.triton import TritonAttnBackend, TritonAttnBackendLegacy
from refimpl.backends.wave import WaveAttnBackend
from refimpl.course import patterns
from refimpl.course.patterns import CAP, REP, calls, hook_code


def test_side_by_side_tags_each_shape_in_order():
    grid = patterns.side_by_side()
    assert grid.position(0, 0, "the replay body") < grid.position(0, 0, "freeze views")  # A: fill, then freeze
    prepare, body = grid.position(0, 1, "prepare graph-bound objects"), grid.position(0, 1, "the replay body")
    assert prepare < body < grid.position(0, 1, "capture-only tail")  # B: prepare, the body, the tail
    for cls in (TritonAttnBackend, FlashInferAttnBackend):
        assert calls(getattr(cls, CAP), f"self.{REP}") == 1
    C = TritonAttnBackendLegacy
    assert calls(getattr(C, CAP), f"self.{REP}") == 0  # C: two bodies ...
    assert (
        calls(getattr(C, CAP), "self.get_num_kv_splits") == 0 and calls(getattr(C, REP), "self.get_num_kv_splits") == 1
    )  # ... drifted
    assert getattr(WaveAttnBackend, CAP) is getattr(TritonAttnBackend, CAP)  # unified Wave inherits A's capture hook
    prep = FlashInferAttnBackend._prepare_cuda_graph_metadata
    assert calls(prep, "self._create_decode_wrappers") == calls(prep, "self._create_prefill_wrappers") == 1
    assert "Pattern B" in str(grid) and "<table" in grid._repr_html_()


def _pattern_from_code(cls) -> str:
    """A capture hook that never calls the replay body is C; one that does is A, or B when it first prepares graph-bound
    objects. A hook that only adds checks and hands over to ``super()``'s follows its parent's. One entry point
    (``init_forward_metadata_out_graph``, SGLang 0.5.23) that calls its body once for capture and replay alike is A."""
    if hook_interface(cls) == "out_graph":  # A: the body once, unindented (capture and replay alike), then the views
        hook = hook_code(cls.init_forward_metadata_out_graph)
        body = [line for line in hook if line.startswith("    self._apply_cuda_graph_metadata(")]
        return (
            "A"
            if len(body) == 1 and calls(cls.init_forward_metadata_out_graph, "self._build_cuda_graph_forward_metadata") == 1
            else "C"
        )
    for owner in [c for c in cls.__mro__ if CAP in vars(c)]:
        cap = vars(owner)[CAP]
        if calls(cap, f"self.{REP}") or not calls(cap, f"super().{CAP}"):
            break
    if calls(cap, f"self.{REP}") == 0:
        return "C"
    return "B" if calls(cap, "self._prepare_cuda_graph_metadata") else "A"


def test_the_checkers_pattern_labels_agree_with_the_code():
    classes = {(e.name, e.variant): e.load() for e in REGISTRY if e.name != "torch_native_mla"}
    derived = {k: _pattern_from_code(c) for k, c in classes.items() if c.pattern != "in-graph"}
    assert {k: classes[k].pattern.split(",")[0] for k in derived} == derived
    assert {p for (_, variant), p in derived.items() if variant == "legacy"} == {"C"}
    assert derived["triton", "unified"] == derived["wave", "unified"] == "A"
    assert derived["flashinfer", "unified"] == derived["flashinfer_mla", "unified"] == "B"


def test_flashinfer_dispatch_counts():
    c = patterns.dispatch_counts()
    for hook in ("legacy capture", "legacy replay"):  # the dispatch, and the plans, written twice
        assert c[hook]["mode branches"] == 3 and c[hook]["plan calls"] == 3 and c[hook]["replay-body calls"] == 0
    cap, rep = c["unified capture + prepare"], c["unified replay"]
    assert cap["plan calls"] == 0 and cap["replay-body calls"] == 1  # capture plans through the replay body only
    assert rep["mode branches"] == 2 and rep["plan calls"] == 2  # verify and draft extend merged
    assert c["legacy capture"]["lines"] > 2 * cap["lines"]
    merged = "mode.is_target_verify() or mode.is_any_draft_extend()"  # in _phases, the unified replay's one dispatch
    assert any(merged in line for line in patterns.hook_code(FlashInferAttnBackend._phases))
    legacy_replay = patterns.hook_code(getattr(FlashInferAttnBackendLegacy, REP))
    assert sum("self._update_prefill(" in line for line in legacy_replay) == 2  # two branches, one body
    table = patterns.dispatch_table().splitlines()
    assert len(table) == 5 and table[1].startswith("legacy capture")


def test_plan_state_figure_marks_every_wrong_read_red():
    needed = [(0, 30), (30, 5), (35, 17)]
    panels = [
        ("right", needed, needed),
        ("stale", needed, [(0, 1), (1, 1), (2, 1)]),
        ("cut", needed, [(0, 28), (30, 5), (35, 17)]),
    ]
    fig = patterns.draw_plan_state(panels)
    axes = fig.axes
    assert [ax.get_title(loc="left") for ax in axes] == ["right", "stale", "cut"]
    for ax, wrong in zip(axes, (0, 3, 1)):
        colors = [tuple(round(x, 3) for x in p.get_facecolor()[:3]) for p in ax.patches]
        red = (round(0xD6 / 255, 3), round(0x27 / 255, 3), round(0x28 / 255, 3))
        assert len(colors) == 6 and colors.count(red) == wrong  # a grey and a read bar per request
    assert fig.texts and "red = a wrong answer" in fig.texts[0].get_text()


def test_plan_cost_is_read_from_the_committed_measurement():
    bench = patterns.plan_cost()
    assert bench["versions"]["gpu"] == "NVIDIA H200" and len(bench["runs"]) == 2
    run1, run2 = patterns.plan_cost_summary(bench)
    assert "decode plan() 129-145 us" in run1 and "decode plan() 85-138 us" in run2
    for run in bench["runs"]:  # the ratios the notebook quotes: a quarter (decode), a third to three fifths (MLA)
        dec = [r["fast_plan_us"] / r["full_plan_us"] for r in run if r["kind"] == "decode"]
        mla = [r["fast_plan_us"] / r["full_plan_us"] for r in run if r["kind"] == "mla_decode"]
        assert 0.23 <= min(dec) and max(dec) < 0.295 and 0.32 < min(mla) and max(mla) < 0.615
    fig = patterns.draw_plan_cost(bench)
    assert len(fig.axes) == 2 and all(len(ax.lines) == 4 for ax in fig.axes)  # two runs x full / fast
