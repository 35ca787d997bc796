# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: jupyter,tags,-all
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
# # What a CUDA graph freezes
#
# Reading time: about 20 minutes. Run All takes about 15 s on a 2-core CPU.
#
# The course's foundations: what a CUDA graph records and freezes, warm-up, the shared memory pool, the emulator's
# limits, and piecewise graphs.
#
# ## 1. The contract
#
# A [CUDA graph](../docs/glossary.md#cuda-graph) is a recording of GPU work. A step runs once while the stream is in
# [capture](../docs/glossary.md#capture) mode: its kernels are recorded, not run. Then `graph.replay()` launches the
# whole recording with one call. A small decode batch is hundreds of small kernels, each costing µs of host time to
# launch (7.5 µs per eager PyTorch op on the H200: notebook 06), so serving engines capture a graph per decode batch
# size and [replay](../docs/glossary.md#replay) it
# ([PyTorch: CUDA Graphs](https://pytorch.org/docs/stable/notes/cuda.html#cuda-graphs)). The contract:
#
# * **Static buffers.** Replay reads and writes the memory it saw at capture: new inputs are copied **into** the
#   captured tensors ([static buffers](../docs/glossary.md#static-buffer)), outputs come back in the same tensors.
# * **No host syncs.** Nothing may read a GPU value on the CPU during capture
#   ([host synchronisation](../docs/glossary.md#host-synchronisation)).
# * **Python is frozen.** Scalars, shapes and branches stay as they were at capture
#   ([frozen value](../docs/glossary.md#frozen-value)).
#
# Sections 2-5 run on refimpl's [CPU graph emulator](../docs/glossary.md#cpu-graph-emulator)
# (`refimpl/graphs/emulator.py`), which keeps the contract and raises the same errors without a GPU.

# %%
import torch

from refimpl import course
from refimpl.course.foundations import draw_graph_kinds, output_after_other_replay, scratch_addresses
from refimpl.graphs import GraphCaptureError, make_engine

torch.manual_seed(0)
emu = make_engine("cpu-emulator")

# %% [markdown]
# ## 2. Capture once, replay many
#
# A tiny step reads a static buffer `x`. We capture it, then copy three new inputs *into* `x` and replay, counting how
# often its Python body runs.

# %%
x, w = torch.zeros(2, 3), torch.randn(3, 4)
python_calls = 0


def step():
    global python_calls
    python_calls += 1
    return torch.sin(x @ w) * 2 + 1


graph = emu.new_graph()
y = graph.capture(step)  # runs step() once, under the recorder
for _ in range(3):
    new_x = torch.randn(2, 3)
    x.copy_(new_x)  # copy INTO the captured buffer (never `x = new_x`)
    graph.replay()
    assert torch.equal(y, torch.sin(new_x @ w) * 2 + 1), "the output tensor holds the new result"
print("3 replays; the Python body ran", python_calls, "time; recorded:", dict(graph.kernels()))
assert python_calls == 1

# %% [markdown]
# ## 3. What is frozen
#
# Anything Python decides during capture is fixed for good. This step sums the first `n_valid` entries of a buffer,
# `n_valid` a plain Python `int` like a backend's `self.max_seq_len`: 3 at capture, 5 later, and replay still sums 3.
# The old TRTLLM-MLA `max_seq_len` bug was this: a bound read at capture truncated every longer sequence at replay
# ([facts](../docs/sglang_facts.md#trtllm-mla), notebook 05).

# %%
vals, knobs = torch.zeros(8), {"n_valid": 3, "scale": 1.0}  # plain Python values read by the step
g_frozen = emu.new_graph()
total = g_frozen.capture(lambda: vals[: knobs["n_valid"]].sum() * knobs["scale"])
vals.copy_(torch.tensor([1.0, 2, 3, 4, 5, 0, 0, 0]))
knobs.update(n_valid=5, scale=10.0)  # too late: the graph already froze 3 and 1.0
g_frozen.replay()
print(f"graph: {total.item():.0f}; eager with the new knobs: {vals[:5].sum().item() * 10:.0f}")
assert total.item() == 1 + 2 + 3

# %% [markdown]
# The rule the whole course rests on: **whatever changes from batch to batch must be tensor data in a static buffer that
# a hook refills before each replay.** A Python value is fine only as a bound that holds for every future batch.
#
# ## 4. Two more ways it breaks
#
# **A host sync during capture.** Reading a device value on the host (`.item()`, `if t.any():`) is illegal under CUDA
# stream capture; the emulator raises `GraphCaptureError`.

# %%
g = emu.new_graph()
try:
    g.capture(lambda: x + 1 if (x > 0).any() else x - 1)  # bool(tensor): the host waits for the device
except GraphCaptureError as e:
    print("GraphCaptureError:", e)
assert not g.captured

# %% [markdown]
# **A stale bound buffer.** A backend updates metadata the captured step reads (`meta.scale`) between steps. The buggy
# update **rebinds the attribute to a fresh tensor**: the graph reads the *old* one (kept, as SGLang's per-size metadata
# does; freed, the emulator refuses it: [liveness](../docs/glossary.md#liveness)). Fix: `copy_`.


# %%
class Meta:
    def __init__(self):
        self.scale = torch.ones(4)  # allocated once, before capture


x4 = torch.arange(4.0)
for how in ("rebind", "copy_"):
    meta = Meta()
    g = emu.new_graph()
    out = g.capture(lambda meta=meta: x4 * meta.scale)  # captured with scale = 1
    if how == "rebind":
        kept, meta.scale = meta.scale, torch.full((4,), 3.0)  # a fresh tensor: invisible to the graph
    else:
        meta.scale.copy_(torch.full((4,), 3.0))  # in place: the graph reads it
    g.replay()
    print(f"{how:>6}: eager would give {(x4 * meta.scale).tolist()}, the graph gives {out.tolist()}")
    assert torch.equal(out, x4 * meta.scale) == (how == "copy_")

# %% [markdown]
# ## 5. Warm-up: what runs only once must run before capture
#
# Engines run each step eagerly before capturing it ([warm-up](../docs/glossary.md#warm-up); SGLang twice per batch
# size, [facts](../docs/sglang_facts.md#capture)). Lazy first-call work (cuBLAS handles, Triton compiling and
# autotuning, workspace growth) must happen there: under capture its syncs and allocations are refused (vLLM
# [#46523](https://github.com/vllm-project/vllm/pull/46523): autotuning inside capture), and a workspace grown *after*
# capture frees memory the graphs baked in (vLLM [#55341](https://github.com/vllm-project/vllm/pull/55341): an illegal
# address at the next replay). But a branch taken in warm-up is frozen too: below, a step plans on its first call only,
# so capture records the fast path and the plan never follows a new batch.


# %%
class PlanOnce:
    def __init__(self):
        self.plan, self.planned = torch.zeros(3), False

    def step(self, lens):
        if not self.planned:  # lazy: plan on the first call only
            self.plan.copy_(lens.cumsum(0))
            self.planned = True
        return self.plan * 1.0


p, lens = PlanOnce(), torch.tensor([1.0, 2.0, 3.0])
emu.warmup(lambda: p.step(lens), 1)  # the first call plans
g = emu.new_graph()
out = g.capture(lambda: p.step(lens))  # records only `plan * 1.0`
lens.copy_(torch.tensor([5.0, 5.0, 5.0]))
g.replay()
print("graph:", out.tolist(), "| eager would plan:", lens.cumsum(0).tolist())
assert out.tolist() == [1.0, 3.0, 6.0]

# %% [markdown]
# On a GPU, `torch.cuda.graph` captures on a [side stream](../docs/glossary.md#side-stream) of its own and PyTorch's
# notes warm up on one too; refimpl's CUDA engine does both (`refimpl/graphs/cuda.py`).
#
# ## 6. One memory pool, and what must stay alive
#
# A graph's own allocations (intermediates, its output) come from a [memory pool](../docs/glossary.md#memory-pool).
# Engines capture every batch size into **one** pool, largest first, so a later capture can reuse an earlier graph's
# scratch: graphs replay one at a time. Two rules come with it:
#
# * **Scratch is shared.** `scratch_addresses` (`refimpl/course/foundations.py`) captures a bs-8 then a bs-4 step: in
#   one pool the bs-4 intermediate gets the bs-8 one's freed address; in two pools it does not.
# * **What a graph reads or returns must stay alive** ([liveness](../docs/glossary.md#liveness)). A graph holds
#   addresses, not references: `output_after_other_replay` captures graph A (`x * 2`) then B (`x * 3`) in one pool; if
#   nothing references A's output, B's capture is handed its memory and replaying A overwrites B's output. SGLang's
#   runner keeps every graph's output (refimpl: `GraphRunner.outputs`); SGLang
#   [#37606](https://github.com/sgl-project/sglang/issues/37606) (open) is this bug in breakable prefill graphs, whose
#   break inputs were only weakly referenced.
#
# The emulator has neither effect, so the cell below runs on a GPU only. On the H200 it printed equal scratch addresses
# in one pool, different in two, and B's output `3.0` with A's output kept, `2.0` without
# (`benchmarks/results/launch_cost/pool_h200.txt`).

# %% tags=["gpu"]
if torch.cuda.is_available():
    shared, separate = scratch_addresses(shared_pool=True), scratch_addresses(shared_pool=False)
    print("one pool:", [hex(a) for a in shared], "| two pools:", [hex(a) for a in separate])
    print("B's output, A's output kept:", output_after_other_replay(True), "| dropped:", output_after_other_replay(False))
    assert shared[0] == shared[1] and separate[0] != separate[1]
    assert output_after_other_replay(keep_output=True) == 3.0

# %% [markdown]
# ## 7. What the emulator does not model
#
# Sections 2-5 hold on both engines (`tests/test_emulator_parity.py` runs programs under both). Only a GPU shows:
#
# | on a GPU | in the emulator |
# |---|---|
# | capture records without running; replay runs kernels | capture *runs* the step; replay re-runs its ops in Python |
# | memory pools, shared scratch, illegal addresses | own tensors alive, no pool; freed inputs refused |
# | host and device memory; a host read syncs | all tensors on the CPU; every `.tolist()` / `.cpu()` refused in capture ([why](../docs/sglang_facts.md#where-refimpl-deliberately-differs-from-upstream)) |
# | streams, async copies, their ordering | one thread, in order |
# | launch costs | meaningless timings: notebook 06 uses the H200's |
# | real FlashInfer kernels, compiled Triton, bf16 | stand-ins (`refimpl/flashinfer_wrappers`), the Triton interpreter, fp32 |
#
# ## 8. Whole graphs, piecewise graphs
#
# This course follows SGLang's decode graphs: the *whole* step is one graph, its per-batch attention metadata refilled
# by a hook before each replay. The other design runs attention eagerly between captured pieces: vLLM's `PIECEWISE`
# mode captures everything but attention ([vLLM: CUDA Graphs](https://docs.vllm.ai/en/latest/design/cuda_graphs/)), and
# SGLang's [piecewise graph](../docs/glossary.md#piecewise-graph) for prefill ends a captured segment at each declared
# break ([#19102](https://github.com/sgl-project/sglang/pull/19102)). Piecewise needs no metadata hook but pays Python
# for attention every step, and the data crossing each break must stay alive (section 6).

# %%
course.show(draw_graph_kinds(), "00_whole_vs_piecewise")

# %% [markdown]
# ### Exercise (about 5 minutes): make the graph follow a changing scale
#
# The step below multiplies by the Python float `knobs["scale"]`, so the graph freezes 1.0. Change `step` to read the
# static buffer `scale` instead, which the last lines refill before the replay; then the graph prints what eager prints.

# %%
scale = torch.ones(1)  # a static buffer for the scale
knobs = {"scale": 1.0}


def step():
    return vals.sum() * knobs["scale"]  # <- change this to read the buffer `scale`


g_ex = emu.new_graph()
out_ex = g_ex.capture(step)
knobs["scale"] = 10.0
scale.fill_(10.0)  # the "hook": refill the buffer before the replay
g_ex.replay()
print(f"graph {out_ex.item():.0f}, eager {vals.sum().item() * 10:.0f}")

# %% jupyter={"source_hidden": true}
# Solution (expand to read)
g_fixed = emu.new_graph()
out_fixed = g_fixed.capture(lambda: vals.sum() * scale)  # tensor data, read at every replay
scale.fill_(7.0)
g_fixed.replay()
assert out_fixed.item() == vals.sum().item() * 7
print(f"fixed: graph {out_fixed.item():.0f} = eager {vals.sum().item() * 7:.0f}")

# %% [markdown]
# **Next: 01, the graph runner and the checker**: an engine's runner on a real decode step, and the six questions the
# checker asks of a backend.
