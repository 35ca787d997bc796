"""Notebook 04's helpers (two patterns): the three hook shapes side by side, FlashInfer's mode dispatch counted per
hook, what a captured FlashInfer ``run`` reads (the plan-state figure), the committed H200 plan-cost measurement, and
the checker's failing verdicts for a class a notebook defines. ``tests/test_course_patterns.py`` checks them."""

import re
from itertools import accumulate

import torch
from matplotlib.figure import Figure

from ..backends.flashinfer import FlashInferAttnBackend, FlashInferAttnBackendLegacy
from ..backends.triton import TritonAttnBackend, TritonAttnBackendLegacy
from ..batch import ForwardBatch
from ..check import CheckSettings, check_entry_mode, failing
from ..flashinfer_wrappers.standin import keys_read
from ..graphs import CPUEmulatorEngine
from ..viz.code import CodeGrid, hook_code
from . import entry, results

CAP, REP = "init_forward_metadata_capture_cuda_graph", "init_forward_metadata_replay_cuda_graph"
BRANCH = re.compile(r"^\s*(if|elif)\b.*\b(forward_)?mode\.is_")
PLANS = ("self._update_decode(", "self._update_prefill(", "self._plan_decode", "self._plan_prefill")


def calls(fn, name: str) -> int:
    """How many times ``name(`` is called in ``fn``'s body (comments excluded)."""
    return sum(line.count(f"{name}(") for line in hook_code(fn))


def side_by_side() -> CodeGrid:
    """Pattern A (unified Triton) | Pattern B (unified FlashInfer, with its prepare step) | Pattern C (legacy Triton):
    capture hooks above, replay hooks below, read from the classes now; the tags name what each line does."""
    code = lambda fn: hook_code(fn, comments=True)  # noqa: E731
    cells = [
        [[(h, code(getattr(cls, h)))] for cls in (TritonAttnBackend, FlashInferAttnBackend, TritonAttnBackendLegacy)]
        for h in (CAP, REP)
    ]
    cells[0][1].append(
        ("... which first calls _prepare_cuda_graph_metadata:", code(FlashInferAttnBackend._prepare_cuda_graph_metadata))
    )
    cells[1][0].append(("... whose body is _apply_cuda_graph_metadata:", code(TritonAttnBackend._apply_cuda_graph_metadata)))
    replay_body = ("self.init_forward_metadata_replay_cuda_graph(", "the replay body")
    tags = [
        [
            [replay_body, ("self._build_cuda_graph_forward_metadata(", "freeze views")],
            [
                ("self._prepare_cuda_graph_metadata(", "prepare graph-bound objects"),
                replay_body,
                ("install_fast_decode_plan(", "capture-only tail"),
                ("self._create_decode_wrappers(", "bound to the static buffers"),
                ("self.decode_cuda_graph_metadata[bs] = wrappers", "registered per bs"),
            ],
            [
                ("# (1) no get_num_kv_splits here", "(1) no split counts"),
                ("torch.arange(0, bs * stride + 1, stride", "(2) uniform stride"),
            ],
        ],
        [
            [
                ("self._update_decode_kv_buffers(", "fill the static buffers"),
                ("self.get_num_kv_splits(", "split counts: capture runs them too"),
            ],
            [("plan(bs,", "host phase: re-plan the registered wrapper"), ("write(bs,", "device phase: fill its bound buffers")],
            [("self.get_num_kv_splits(", "(1) split counts"), ("torch.cumsum(real, 0)", "(2) ragged stride")],
        ],
    ]
    titles = [
        "Pattern A: TritonAttnBackend (unified)",
        "Pattern B: FlashInferAttnBackend (unified)",
        "Pattern C: TritonAttnBackendLegacy",
    ]
    return CodeGrid(titles, ["capture hook", "replay hook"], cells, tags)


def dispatch_counts() -> dict[str, dict]:
    """Per FlashInfer hook (legacy and unified; unified capture with its prepare step): code lines (no comments or
    blanks), ``if/elif forward_mode.is_...`` branches, direct plan calls (``_update_decode`` / ``_update_prefill``; the
    unified replay picks ``_plan_decode`` / ``_plan_prefill`` in ``_phases``) and calls of the replay body."""
    L, U = FlashInferAttnBackendLegacy, FlashInferAttnBackend
    hooks = {  # name: the code lines of the hook
        "legacy capture": hook_code(getattr(L, CAP)),
        "legacy replay": hook_code(getattr(L, REP)),
        "unified capture + prepare": hook_code(getattr(U, CAP)) + hook_code(U._prepare_cuda_graph_metadata),
        "unified replay": hook_code(getattr(U, REP)) + hook_code(U._phases),
    }
    return {
        name: {
            "lines": len(lines),
            "mode branches": sum(bool(BRANCH.match(line)) for line in lines),
            "plan calls": sum(line.count(p) for line in lines for p in PLANS),
            "replay-body calls": sum(line.count(f"self.{REP}(") for line in lines),
        }
        for name, lines in hooks.items()
    }


def dispatch_table() -> str:
    """``dispatch_counts`` as a text table."""
    counts = dispatch_counts()
    header = {c: c for c in counts["legacy capture"]}  # the column names, as a row
    rows = {"FlashInfer hook": header, **counts}
    return "\n".join(f"{name:<26}" + "".join(f"{v[c]:>{len(c) + 3}}" for c in header) for name, v in rows.items())


def key_spans(wrapper, fb: ForwardBatch) -> tuple[list, list]:
    """For ``fb``'s live requests: the keys each needs (start, count in the kv indices: the batch's own CSR) and the
    keys the stand-in ``wrapper``'s captured ``run`` reads now (``keys_read``: the bound buffers within the plan's
    tiles)."""
    lens = fb.seq_lens_cpu[: fb.batch_size].tolist()
    start, count = (t[: len(lens)].tolist() for t in keys_read(wrapper))
    return list(zip(accumulate(lens, initial=0), lens)), list(zip(start, count))


def draw_plan_state(panels: list[tuple]) -> Figure:
    """One panel per ``(title, needed, read)``: per request, the kv-index range it needs (grey) and the one ``run``
    reads (blue where it is the needed one, red where not)."""
    fig = Figure(figsize=(9, 1.25 + 1.15 * len(panels)))
    axes = fig.subplots(len(panels), sharex=True, squeeze=False)[:, 0]
    end = max(s + n for _, needed, read in panels for s, n in needed + read)
    for ax, (title, needed, read) in zip(axes, panels):
        for i, ((s, n), (rs, rn)) in enumerate(zip(needed, read)):
            right = (s, n) == (rs, rn)
            ax.barh(i, n, left=s, color="#d9d9d9", label="keys the request needs")  # the legend: one per label
            ax.barh(
                i,
                rn,
                left=rs,
                height=0.34,
                color="#3182bd" if right else "#d62728",
                label=f"keys run reads: {'the' if right else 'not the'} needed ones",
            )
            ax.text(end * 1.05, i, f"needs [{s}, {s + n}), reads [{rs}, {rs + rn})", va="center", fontsize=7.5)
        ax.set_yticks(range(len(needed)), [f"request {i}" for i in range(len(needed))], fontsize=8)
        ax.set(ylim=(len(needed) - 0.4, -0.6), xlim=(0, end * 1.5))
        ax.set_title(title, fontsize=9, loc="left")
        ax.spines[["top", "right"]].set_visible(False)
    axes[-1].set_xlabel("position in the bound kv_indices")
    handles = {h.get_label(): h for ax in axes for h in ax.get_legend_handles_labels()[0]}
    fig.legend(handles.values(), handles, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle("What the captured FlashInfer decode run reads, per request: red = a wrong answer", fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def plan_cost() -> dict:
    """``benchmarks/results/plan_cost/plan_cost.json`` (``benchmarks/plan_cost.py`` on an H200: the full ``plan()`` and
    the fast plan, host µs per call, two runs)."""
    return results("plan_cost/plan_cost.json")


def _series(run, kind):
    """The batch sizes, full ``plan()`` µs and fast plan µs of ``run``'s rows of ``kind``: three lists."""
    return [[r[k] for r in run if r["kind"] == kind] for k in ("bs", "full_plan_us", "fast_plan_us")]


def plan_cost_summary(bench: dict) -> list[str]:
    """Per run: the decode ``plan()`` range (µs) and the fast / full ratios, decode and MLA."""
    out = []
    for i, run in enumerate(bench["runs"], 1):
        full = _series(run, "decode")[1]
        ratio, mla = ([f / p for _, p, f in zip(*_series(run, kind))] for kind in ("decode", "mla_decode"))  # fast / full
        out.append(
            f"run {i}: decode plan() {min(full):.0f}-{max(full):.0f} us, fast/full {min(ratio):.0%}-"
            f"{max(ratio):.0%}; MLA fast/full {min(mla):.0%}-{max(mla):.0%}"
        )
    return out


def draw_plan_cost(bench: dict) -> Figure:
    """Host µs per plan call against batch size, decode and MLA decode: both runs, full (red) and fast (blue)."""
    fig = Figure(figsize=(10, 3.8))
    axes = fig.subplots(1, 2, sharey=True)
    titles = {"decode": "decode (32/8 heads, dim 128)", "mla_decode": "MLA decode (16 heads, 512+64)"}
    for ax, (kind, title) in zip(axes, titles.items()):
        for i, run in enumerate(bench["runs"]):
            bs, full, fast = _series(run, kind)
            style = "-" if i == 0 else "--"
            ax.plot(bs, full, "o" + style, color="C3", label=f"plan(), run {i + 1}")
            ax.plot(bs, fast, "s" + style, color="C0", label=f"fast plan, run {i + 1}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(bs, bs)
        ax.minorticks_off()
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("batch size")
        ax.grid(alpha=0.3)
    axes[0].set(ylabel="host time per plan call, median (us)", ylim=(0, None))
    axes[0].legend(fontsize=7, loc="upper left", ncol=2)
    v = bench["versions"]
    fig.suptitle(
        f"The fast plan costs about a quarter of plan() in decode, a third to three fifths in MLA decode\n"
        f"{v['gpu']}, flashinfer {v['flashinfer']}, torch {v['torch']}, context {bench['ctx']} "
        "(committed measurement)",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def failed_verdicts(backend_cls: type, mode: str, max_context_len: int) -> set[str]:
    """The checker on a class a notebook defines (CPU emulator, glue verdict off): the letters of the verdicts that
    failed on any row (a, b, c, d, f). float32 on every device, so FlashInfer's backends run the stand-ins, whose
    kernel reads at most the planned keys rounded up to a 128-key tile (``flashinfer_wrappers/standin.py``)."""
    settings = CheckSettings(max_context_len=max_context_len, glue_replays=0, dtype=torch.float32)
    return failing(check_entry_mode(entry(backend_cls), mode, CPUEmulatorEngine(), settings))
