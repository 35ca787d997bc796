# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: tags,-all
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # What a replay costs
#
# A CUDA graph makes the GPU side of a decoder step cheap: one launch replays every kernel.
# What is left runs on the host, before that launch, on **every** step
# (`GraphRunner._replay`, [facts](../docs/sglang_facts.md#the-graph-runner)):
#
# 1. **validation**: the batch checked before anything is written (`refimpl/validate.py`;
#    off with `GraphRunner(validate_inputs=False)`);
# 2. **input copies**: the batch into the static inputs, the padded rows reset;
# 3. **the replay hook**: the backend's `init_forward_metadata_replay_cuda_graph`, which fills
#    the metadata buffers the graph reads (kv indptr / indices, split counts, masks, plans);
# 4. **launch**: `graph.replay()`.
#
# This notebook reads those four parts from the measurements committed from an H200
# (`python -m refimpl bench`, results in `benchmarks/results/replay_cost/`), explains where
# the microseconds go, compares the faithful Triton hook with two shapes that move the
# metadata work out of Python (**fused**: one kernel instead of four launches; **in-graph**:
# that kernel recorded inside the graph), and shows why a serving engine wants the second.
# On this CPU the live cells run the emulator, whose timings say what the Python costs, not
# what a GPU launch costs; a `gpu` cell repeats a short sweep live on a GPU.

# %%
import json
import time
from pathlib import Path

import torch

try:
    from IPython.display import Image, display
except ImportError:  # run as a plain script: nothing to display
    Image = display = lambda *args, **kwargs: None  # noqa: E731

from refimpl import bench, viz
from refimpl.backends import find
from refimpl.config import SpecConfig
from refimpl.graphs import make_engine
from refimpl.layout import KINDS
from refimpl.rig import Rig

NOTEBOOK_T0 = time.perf_counter()
ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd().parent
FIGURES = ROOT / "figures"
RESULTS = ROOT / "benchmarks" / "results" / "replay_cost"

h200 = json.loads((RESULTS / "results.json").read_text())
env, rows = h200["environment"], h200["rows"]
print(f"{env['device']}, driver {env['driver']}, torch {env['torch']}, triton {env['triton']}, "
      f"flashinfer {env['flashinfer']}; {env['pinning']}; {len(rows)} points")


def show(fig, name):
    path = viz.save(fig, FIGURES / f"04_{name}.png")
    display(Image(filename=str(path)))


def point(backend, variant, mode, bs, ctx=512):
    return next(r for r in rows if (r["backend"], r["variant"], r["mode"], r["bs"],
                                    r["context"]) == (backend, variant, mode, bs, ctx))


# %% [markdown]
# ## 1. The four parts, per backend
#
# Stacked host time of each part at bs 8, context 512 (medians of 30 after warm-up, inputs
# rotated, pinned to one core); the black tick is the GPU time of the graph itself. Read it
# left to right: the copies, the hook, the launch, and (hatched) the validation a timing run
# switches off.

# %%
show(viz.draw_replay_breakdown(rows, env, 8, 512), "replay_breakdown_h200")
print(f"{'backend/variant mode':<38} {'copies':>7} {'hook':>7} {'launch':>7} {'valid.':>7} "
      f"{'GPU':>6}  hook launches")
for r in (r for r in rows if r["bs"] == 8 and r["context"] == 512):
    h = r["host_us"]
    print(f"{r['backend'] + '/' + r['variant'] + ' ' + r['mode']:<38} "
          f"{h['copies']['median']:7.0f} {h['hook']['median']:7.0f} {h['launch']['median']:7.0f} "
          f"{h['validate']['median']:7.0f} {r['gpu_us']['graph']['median']:6.0f}  "
          f"{sum(r['hook_launches'].values())}")

# %% [markdown]
# What the microseconds are, on that host:
#
# * **The hook is the big part**, and it is roughly *launches x per-launch host cost*: the
#   Triton decode hook makes 4 device launches (`cumsum`, the indices kernel, the split-count
#   kernel, and a `copy_`), FlashInfer's decode hook 9 plus its fast re-plan on the host,
#   FlashInfer's verify hook a full `plan()` (which reads the indptrs back from the device
#   and packs the tree mask into bits) and over 40 small ops. The GPU runs each of these in a
#   few µs; the host spends far longer issuing them.
# * **The launch** is one `graph.replay()`, whatever the graph holds: the same for every
#   backend.
# * **The copies** are one `torch._foreach_copy_` for every static input (one launch per
#   dtype) plus the host mirror of `seq_lens`. SGLang's runner issues one `copy_` per input;
#   this, the kernel ops called directly outside any dispatch mode and the host indptrs fed to
#   FlashInfer's draft-extend plans are refimpl's choices, listed in
#   [the differences table](../docs/sglang_facts.md#where-refimpl-deliberately-differs-from-upstream).
# * **Validation** reads device tensors back to check them (request indices, cache-slot
#   ownership, host/device agreement): each read is a synchronisation, which is why it is
#   off in timing runs and reported apart.
#
# The absolute numbers belong to that machine: on it `graph.replay()` alone took
# 26–55 µs of host time, about ten times what the same call costs on a lightly loaded host
# (2.4 µs was measured on an earlier H200 lease). Compare parts and shapes with each other,
# not with another machine.

# %% [markdown]
# ## 2. Faithful, fused, in-graph
#
# The faithful Triton hook (`unified`) is SGLang's: a `cumsum` into `kv_indptr`, then the
# indices kernel, then the split-count heuristic, each a launch. `fused` does the same work
# in **one** Triton kernel (`refimpl/kernels/fused_metadata.py`): every program reads all the
# batch's lengths, computes its own offset, copies its request's slots and writes its split
# count. `in_graph` records that kernel **inside** the graph, reading the runner's static
# inputs, so its replay hook only re-points to the captured views (SGLang 0.5.23 offers the
# same idea as an opt-in "metadata glue graph", [facts](../docs/sglang_facts.md#fused-and-in-graph-metadata)).

# %%
show(viz.draw_host_vs_bs(rows, env, 512, "triton"), "triton_shapes_h200")
for mode in ("decode", "target_verify"):
    for variant in ("unified", "fused", "in_graph"):
        hooks = [point("triton", variant, mode, bs)["host_us"]["hook"]["median"]
                 for bs in (1, 8, 64, 256)]
        n = sum(point("triton", variant, mode, 8)["hook_launches"].values())
        print(f"triton/{variant:<9} {mode:<14} hook at bs 1/8/64/256: "
              + " / ".join(f"{h:.0f}" for h in hooks) + f" us  ({n} launches)")

# %% [markdown]
# The in-graph shape's hook launches nothing for decode; what it still costs is the Python of
# calling a hook at all (building the call, re-pointing the metadata). For target verify it
# copies the tree mask into the graph's buffer (the mask is a spec input of varying size, like
# the token ids). The same three shapes run here, live, under the CPU emulator: the launch
# counts below are computed, not read from a file.

# %%
engine = make_engine("auto")
spec = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)
L = 64
world, gen, live = None, None, {}
for variant in ("unified", "fused", "in_graph"):  # the rig: world, backend, model, runner (one world)
    rig = Rig.build(find("triton", variant)[0], KINDS["decode"], spec, engine, capture_bs=(1, 2),
                    max_context_len=L, pool_size=16, world=world, gen_seed=1)
    world, gen, runner = rig.world, gen or rig.gen, rig.runner
    fb = gen.decode(2)
    runner.load_inputs(fb, 2)  # the replay's own phases, one at a time
    hook = bench.launches(lambda r=runner, f=fb: r.replay_hook(f, 2))
    in_graph = bench.launches(lambda r=runner, f=fb: r.backend.init_forward_metadata_in_graph(r._replay_batch(f, 2)))
    graph = dict(runner.graphs[2].kernels())
    live[variant] = (hook, in_graph, graph)
    out = runner.replay(fb).clone()
    assert torch.allclose(out, runner.eager(fb), atol=1e-4, rtol=1e-4), variant
    print(f"{variant:<9} replay hook launches {hook or '{}'}; recorded in the graph: "
          f"{ {k: v for k, v in graph.items() if k.startswith('refimpl')} }")
    gen.release(fb)
assert sum(live["unified"][0].values()) == 4 and live["fused"][0] == {
    "refimpl.fused_graph_metadata.default": 1} and live["in_graph"][0] == {}
assert "refimpl.fused_graph_metadata.default" in live["in_graph"][2]
assert "refimpl.fused_graph_metadata.default" not in live["fused"][2]

# %% [markdown]
# ## 3. Graph vs eager, the whole step
#
# The reason for graphs at all: the whole decoder step, synchronised, as a graph (copies +
# hook + launch + the GPU work) and eagerly (fresh metadata, every kernel launched from
# Python). Solid lines are graphs, dashed eager.

# %%
show(viz.draw_step_graph_vs_eager(rows, env, 512), "graph_vs_eager_h200")
print("eager / graph at bs 1, context 512:")
for r in (r for r in rows if r["bs"] == 1 and r["context"] == 512):
    st = r["step_us"]
    print(f"  {r['backend'] + '/' + r['variant']:<26} {r['mode']:<14} "
          f"graph {st['graph']['median']:6.0f} us, eager {st['eager']['median']:6.0f} us: "
          f"{st['eager_over_graph']:.1f}x")

# %% [markdown]
# Where the ratio is small, the profile says why: FlashInfer's target-verify hook *is* a full
# `plan()` (device indptrs read back to the host, the tree mask packed into bits, Python's
# `max` over the host lengths one element at a time), so the graph step keeps most of the
# eager step's host work; the ratio also shrinks at large batch sizes, where the GPU work
# grows and the host part does not. The in-graph shape is the largest win because it leaves
# the host nothing but the copies and one launch.

# %% [markdown]
# ## 4. Capture: time and memory
#
# A graph per batch size costs capture time (the first capture in a process includes the JIT
# compilation of every kernel) and memory: the static buffers (sized once for the largest
# batch) and the graph pool's growth per captured size.

# %%
show(viz.draw_capture_cost(rows, env, 512), "capture_cost_h200")

# %% [markdown]
# ## 5. Before and after the replay-path work
#
# The same table measured on the same H200 lease for the tree before this work (the
# robustness commit) and after it (`benchmarks/replay_table.py`: context 256, medians of 400,
# pinned): the custom-op dispatcher skipped when nothing records, cheaper argument checks,
# one foreach copy for the inputs, cached replay views, host indptrs for FlashInfer's
# draft-extend plans and FlashInfer-MLA's prefill plans.

# %%
before = json.loads((RESULTS / "table_before.json").read_text())["rows"]
after = json.loads((RESULTS / "table_after.json").read_text())["rows"]
print(f"{'row':<38} {'hook bs 1/8/64 before':>24} {'after':>18}")
for row in before:
    b = " / ".join(f"{before[row][bs]['hook']:.0f}" for bs in ("1", "8", "64"))
    a = " / ".join(f"{after[row][bs]['hook']:.0f}" for bs in ("1", "8", "64"))
    print(f"{row:<38} {b:>24} {a:>18}")

# %% [markdown]
# ## 6. Live, on a GPU
#
# On a GPU this cell runs a short sweep of the three Triton shapes (decode, context 512).

# %% tags=["gpu"]
if torch.cuda.is_available():
    settings = bench.BenchSettings.for_device(
        True, backends=["triton"], modes=["decode"], batch_sizes=(1, 8, 64), contexts=(512,),
        repeats=20, warmup=5, rotate=2)
    for r in bench.sweep(settings):
        print(f"triton/{r['variant']:<9} bs {r['bs']:>3}: hook {r['host_us']['hook']['median']:.0f}"
              f" us, copies {r['host_us']['copies']['median']:.0f} us, graph step "
              f"{r['step_us']['graph']['median']:.0f} us vs eager "
              f"{r['step_us']['eager']['median']:.0f} us")

# %%
elapsed = time.perf_counter() - NOTEBOOK_T0
print(f"notebook ran in {elapsed:.1f} s")
