"""Notebook 05's helpers: the MLA world and batches it builds, the block-table figure, the draft-extend runner whose
replay hook it counts, one line per checker record, the committed H200 results of SGLang #29077 (with a live sweep
on a GPU), and FlashInfer-MLA's split hook glued (its runner and the committed H200 cost)."""

import runpy
from collections.abc import Sequence

from matplotlib.figure import Figure

from .. import viz
from ..backends import find
from ..batch import ForwardBatch, World
from ..batchgen import BatchGenerator
from ..check import CheckRecord
from ..config import CHAIN, ModelConfig
from ..graphs import make_engine
from ..graphs.runner import GraphRunner
from ..layout import KINDS
from ..rig.core import Rig
from ..viz import cells as C
from . import ROOT, entry, results

ENGINE = make_engine("auto")  # the CPU emulator here, CUDA graphs on a GPU
DEVICE = ENGINE.device
CFG = ModelConfig(kind="mla", num_layers=1, hidden_size=32)  # latent 512 + rope 64
L = 160  # max_context_len
SHAPES = ("unified", "simplified", "in_graph")


def world(page_size: int) -> World:
    """An MLA world of ``L`` = 160 positions, 12 request rows, random KV."""
    w = World.create(CFG, max_context_len=L, pool_size=12, page_size=page_size, device=DEVICE)
    w.randomize_kv(0)
    return w


def three_requests(page_size: int) -> tuple[World, ForwardBatch]:
    """A decode batch of three requests of lengths P - 1, P and 2P + 1 (at most ``L``): below, at, past a page end."""
    w, P = world(page_size), page_size
    return w, BatchGenerator(w, CHAIN, seed=P).decode(3, seq_lens=[P - 1, P, min(2 * P + 1, L)])


def draw_block_tables(panels: Sequence[tuple]) -> Figure:
    """One panel per ``(backend, P, req_to_token, req_pool_indices, seq_lens, table)``, one row per request, at most 8
    pages: the entries it reads (``cdiv(len, P)``) in its colour, the others grey; a read entry that is not
    ``req_to_token[rpi[i], p * P] // P`` is marked (gid ``"differs"``)."""
    fig = Figure(figsize=(8 * C.CELL_IN * 1.6 + 3.0, len(panels) * 1.25 + 0.8), layout="constrained")
    for k, (name, P, r2t, rpi, lens, table) in enumerate(panels):
        r2t, rpi, lens, table = map(C.to_numpy, (r2t, rpi, lens, table))
        ax, bs, pages = fig.add_subplot(len(panels), 1, k + 1), len(rpi), min(table.shape[1], 8)
        C.grid_axes(ax, pages, bs)
        for i in range(bs):
            read = -(-int(lens[i]) // P)
            for p in range(pages):
                C.role_cell(ax, p, i, i if p < read else "unread", C.fmt(table[i, p]), fontsize=7)  # request i's colour, or grey
                if p < read and int(table[i, p]) != int(r2t[rpi[i], p * P]) // P:
                    C.differs_mark(ax, p, i)
        ax.set_yticks(range(bs), [f"req {i}: len {int(n)}, reads {-(-int(n) // P)}" for i, n in enumerate(lens)], fontsize=7)
        ax.set_xticks(range(pages), [f"p{p}" for p in range(pages)], fontsize=6)
        ax.xaxis.tick_top()
        ax.set_title(f"{name}, page size {P}: table [{bs}, {table.shape[1]}], first {pages} pages shown", fontsize=8)
    C.suptitle(
        fig,
        "Block tables: a request reads cdiv(len, P) entries, each req_to_token[row, p·P] // P;\n"
        "grey entries are never read and keep the buffer's initial value",
    )
    return fig


def draft_extend_runner(cls: type) -> tuple[GraphRunner, ForwardBatch]:
    """A runner of ``cls`` (page 64) captured for draft extend v2 at bs 4, and a batch of 3 that it pads to 4."""
    rig = Rig.build(
        entry(cls), KINDS["draft_extend_v2"], CHAIN, ENGINE, capture_bs=(4,), max_context_len=L, world=world(64), gen_seed=7
    )
    return rig.runner, rig.gen.draft_extend(3, 2)


def op_names(counts: dict[str, int]) -> str:
    """``{"aten.copy_.default": 2, ...}`` as ``"2 copy_, ..."``."""
    return ", ".join((f"{n} " if n > 1 else "") + op.split(".")[1] for op, n in counts.items()) or "nothing"


def verdict_line(rec: CheckRecord) -> str:
    """A checker record in one line: verdicts (a)-(d) and what its findings are about, each named once."""
    parts = (f.partition(": ") for f in rec.findings)  # what each finding is about: a buffer, or "graph vs eager"
    about = dict.fromkeys(rest.split(":")[0] if head == "reference" else head for head, _, rest in parts)
    shown = " ".join(f"({c}) {v}" for c, v in zip("abcd", rec.verdicts))  # rec.verdicts: (a)-(d), then (f)
    return f"{rec.backend}/{rec.variant} {rec.mode} bs {rec.bs}: {shown}; findings: {', '.join(about) or 'none'}"


def h200_results() -> dict:
    """The committed H200 results of ``benchmarks/trtllm_mla_draft_extend.py``, run 2 (run 1 has host-noise spikes,
    ``benchmarks/results/trtllm_mla_draft_extend/README.md``)."""
    return results("trtllm_mla_draft_extend/run2_results.json")


def _host_us(rows):
    """``(shape, bs)`` -> median host µs of the hook + ``graph.replay()``."""
    return {(r["shape"], r["bs"]): r["host_us"]["hook+launch"]["median"] for r in rows}


def savings(rows: Sequence[dict]) -> dict[str, tuple]:
    """The least and most median host µs each step saves over the batch sizes: ``"#29077"`` (unified -> simplified),
    ``"in-graph"`` (simplified -> in_graph)."""
    host = _host_us(rows)
    saved = [[host[a, bs] - host[b, bs] for s, bs in host if s == a] for a, b in zip(SHAPES, SHAPES[1:])]
    return {step: (min(d), max(d)) for step, d in zip(("#29077", "in-graph"), saved)}


def draw_h200_replay() -> Figure:
    """Host µs of the hook + ``graph.replay()`` and GPU µs of the graph against bs, per shape (run 2, p25-p75 shaded)."""
    res = h200_results()
    (a, b), (c, d) = savings(res["rows"]).values()
    panels = [("host_us", "hook+launch", "host µs: replay hook + graph.replay()"), ("gpu_us", "graph", "GPU µs: graph")]
    title = (
        f"TRTLLM-MLA draft extend v2 replay, {res['environment']['device']}: #29077 (unified → simplified) saves "
        f"{a:.0f}-{b:.0f} µs of host time,\nthe in-graph rebuild {c:.0f}-{d:.0f} µs more (left); "
        "the graph's GPU time does not move (right)"
    )
    return viz.draw_latency_vs_bs(res["rows"], panels, title)


def medians(rows: Sequence[dict], batch_sizes: Sequence[int] = (1, 16, 256)) -> str:
    """Median host µs of the hook + ``graph.replay()``, one line per batch size."""
    host = _host_us(rows)
    return "\n".join(f"bs {bs:>3}: " + ", ".join(f"{s} {host[s, bs]:.0f} µs" for s in SHAPES) for bs in batch_sizes)


def live_sweep(batch_sizes: Sequence[int] = (1, 16, 64)) -> list[dict]:
    """A short run of the #29077 benchmark's ``sweep`` on this machine (a GPU: the emulator's timings mean little)."""
    sweep = runpy.run_path(str(ROOT / "benchmarks" / "trtllm_mla_draft_extend.py"))["sweep"]
    return sweep(batch_sizes=tuple(batch_sizes), repeats=20, warmup=5, rotate=2)


def hook_launches(rows: Sequence[dict]) -> dict[str, set[int]]:
    """Per shape, the launch counts of its replay hook over the sweep's rows (one count: the same at every bs)."""
    out = {}
    for r in rows:
        out.setdefault(r["shape"], set()).add(sum(r["hook_launches"].values()))
    return out


def glued_rig(name: str = "flashinfer_mla") -> Rig:
    """``name``'s unified backend captured for decode at bs 4 with a glue graph per size (``GraphRunner(glue=True)``)."""
    return Rig.build(find(name, "unified")[0], KINDS["decode"], CHAIN, ENGINE, capture_bs=(4,), max_context_len=L, glue=True)


def split_hook_table(run: str = "run3.json") -> str:
    """The committed H200 cost of the split hooks (``benchmarks/split_hook.py``; run 3 of nine, on a quiet host:
    ``benchmarks/results/split_hook/README.md``): host µs at bs 1 / 8 / 64 of the eager hook (before), the host phase
    (the plan) and the glued hook (after: host phase + glue replay)."""
    rows, parts = results(f"split_hook/{run}")["rows"], ("eager hook", "host phase", "glued hook")
    lines = [f"{'host µs, bs 1 / 8 / 64':<30}" + "".join(f"{p:>20}" for p in parts)]
    for row, r in rows.items():
        lines.append(f"{row:<30}" + "".join(f"{' / '.join(f'{r[bs][p]:.0f}' for bs in ('1', '8', '64')):>20}" for p in parts))
    return "\n".join(lines)
