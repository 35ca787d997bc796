"""Notebook 00's helpers: two graphs in one CUDA memory pool (what they share, what must stay alive), and the picture
of whole, piecewise and breakable graphs.

The pool demos need a GPU: the CPU emulator keeps every tensor a graph allocated alive and has no pool, so neither the
sharing nor the bug exists there (``refimpl/graphs/emulator.py``).
"""

from itertools import groupby

import torch
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch


def scratch_addresses(shared_pool: bool) -> list[int]:
    """Capture a bs-8 step, then a bs-4 step, each ``relu(x).sum(1)``; return the address of each capture's scratch
    (``relu(x)``, freed when the step returns). Largest first into one pool, the bs-4 capture is handed the bs-8
    capture's freed scratch: only one of them replays at a time, so they may share it."""
    pool = torch.cuda.graph_pool_handle() if shared_pool else None
    seen, keep = [], []  # keep: graphs, inputs and outputs stay alive, they are read at replay

    def step(x):
        h = torch.relu(x)  # scratch
        seen.append(h.data_ptr())
        return h.sum(1)  # the static output

    for bs in (8, 4):
        x, g = torch.randn(bs, 1 << 22, device="cuda"), torch.cuda.CUDAGraph()  # 4 Mi floats per row
        step(x)  # warm-up, outside the pool
        with torch.cuda.graph(g, pool=pool):
            y = step(x)
        keep.append((g, x, y))
    return seen[1::2]  # the two captures' scratch (the warm-ups' come first)


def output_after_other_replay(keep_output: bool) -> float:
    """Graph A writes ``x * 2``, graph B ``x * 3``, both in one pool, A captured first. If nothing keeps A's output
    alive, B's capture may be handed its memory; replaying A then writes over B's output. Returns B's output after B,
    then A, replay: 3.0 when intact."""
    pool, x = torch.cuda.graph_pool_handle(), torch.ones(1 << 20, device="cuda")
    g_a, g_b = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g_a, pool=pool):
        out_a = x * 2
    kept = out_a if keep_output else None  # what SGLang's runner does with every graph's output  # noqa: F841
    del out_a
    with torch.cuda.graph(g_b, pool=pool):
        out_b = x * 3
    g_b.replay()
    g_a.replay()
    torch.cuda.synchronize()
    return out_b[0].item()


def draw_graph_kinds() -> Figure:
    """One two-layer step two ways: a whole graph, its attention metadata refilled by a hook before each replay (SGLang's
    decode graphs, this course); piecewise graphs with attention run eagerly between them (vLLM's PIECEWISE, SGLang's
    breakable graphs for prefill)."""
    fig = Figure(figsize=(8.4, 1.9))
    ax = fig.add_subplot()
    ops = "hook qkv attn mlp qkv attn mlp".split()
    rows = [  # per op: in a graph, eager, or not there
        ("whole graph\n(decode: this course)", "eager graph graph graph graph graph graph".split()),
        ("piecewise / breakable\n(vLLM PIECEWISE, SGLang BCG)", "none graph eager graph graph eager graph".split()),
    ]
    colors = {"graph": "#9ecae1", "eager": "#fdae6b"}
    for y, (label, kinds) in enumerate(rows):
        ax.text(-0.2, -y, label, ha="right", va="center", fontsize=8)
        i = 0
        for kind, run in groupby(kinds):  # a box per run of graph ops, one per eager op (never two in a row)
            start, i = i, i + len(list(run))
            if kind != "none":
                box = FancyBboxPatch(
                    (start + 0.05, -y - 0.22), i - start - 0.1, 0.44, "round,pad=0.02", fc=colors[kind], ec="0.4", lw=0.8
                )
                ax.add_patch(box)
                words = "one replay" if kind == "graph" else "Python"
                ax.text((start + i) / 2, -y + 0.28, words, ha="center", fontsize=6.5, color="0.3")
        for x, (op, kind) in enumerate(zip(ops, kinds)):
            if kind != "none":
                ax.text(x + 0.5, -y, op, ha="center", va="center", fontsize=7)
    ax.text(3.5, 0.75, "blue: captured, launched as one / orange: eager Python, every step", ha="center", fontsize=8)
    ax.set_xlim(-2.6, 7.1)
    ax.set_ylim(-1.5, 1.0)
    ax.axis("off")
    return fig
