"""Notebook 01's helpers: the padding picture and a one-line view of the checker's records."""

from matplotlib.figure import Figure

from .. import viz
from ..check import CheckRecord, failing  # noqa: F401  (failing: notebook 01 imports it from here)
from ..graphs.runner import GraphRunner


def padding_figure(runner: GraphRunner, raw_bs: int) -> Figure:
    """The runner's static inputs after replaying ``raw_bs`` live requests: live rows, the padded rows (request 0,
    ``seq_len`` = the fill value, cache slot 0), and rows only larger graphs read."""
    bs, views = runner.pick_bs(raw_bs), runner.inputs.views()
    static = {k: views[k] for k in ("req_pool_indices", "seq_lens", "out_cache_loc")}
    roles = dict.fromkeys(static, viz.batch_roles(runner.max_bs, raw_bs, bs))
    title = f"raw bs {raw_bs} replayed by the bs-{bs} graph (fill value {runner.fill_value})"
    return viz.draw_buffers(static, title, roles=roles)


def verdicts(r: CheckRecord) -> str:
    """``decode bs 3: (a) ok (b) ok (c) ok (d) ok (e) yes (f) ok``: one record in one line (``-``: not asked)."""
    v, glue = {None: "-", True: "ok", False: "FAIL"}, {None: "-", True: "yes", False: "no"}
    cols = " ".join(f"({c}) {v[x]}" for c, x in zip("abcd", r.verdicts))  # r.verdicts: (a)-(d), then (f)
    return f"{r.mode} bs {r.bs}: {cols} (e) {glue[r.glue_equals_eager]} (f) {v[r.history_ok]}"
