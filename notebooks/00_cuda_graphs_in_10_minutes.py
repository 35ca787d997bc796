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
# # CUDA graphs in 10 minutes
#
# Reading time: about 10 minutes. The CPU run takes under 10 s.
#
# What a CUDA graph freezes, how that breaks code, and a real decode step captured and replayed
# by `refimpl`'s `GraphRunner`, as SGLang's `CudaGraphRunner` does it. Every claim is checked by
# an `assert` in the cell that shows it.
#
# ## 1. What a graph is, and its contract
#
# A **CUDA graph** is a recording of GPU work. You run a step once while the stream is in
# *capture* mode: its kernels are recorded instead of run. Then `graph.replay()` launches the
# whole recording with one call. A decode step for a small batch is hundreds of tiny kernels,
# each costing several microseconds of host work to launch. Replay removes that cost, so
# serving engines capture one graph per decode batch size. The contract:
#
# * **Capture once, replay many.**
# * **Static buffers.** Replay reads and writes the *same memory* it saw at capture. New inputs
#   are **copied into** the captured tensors, and outputs come back in the same tensors.
# * **No host syncs.** Nothing may read a GPU value on the CPU during capture: no `.item()`,
#   `if tensor:`, `.tolist()`, `nonzero`.
# * **Python is frozen.** Scalars, shapes and branches stay as they were at capture.
#
# refimpl's CPU emulator of CUDA graphs (`refimpl/graphs/emulator.py`) keeps the same contract
# and raises the same errors, so this page runs without a GPU. Sections 2-4 use it; section 5
# uses `make_engine("auto")`, which is the real CUDA engine on a GPU.

# %%
from pathlib import Path

import torch

try:
    from IPython.display import Image, display
except ImportError:  # run as a plain script: nothing to display
    Image = display = lambda *args, **kwargs: None  # noqa: E731

from refimpl import ForwardMode, GraphConfig, ModelConfig, viz
from refimpl.backends.torch_native import TorchNativeBackend
from refimpl.batch import World
from refimpl.batchgen import BatchGenerator
from refimpl.check import CheckSettings, run_checks
from refimpl.graphs import GraphCaptureError, make_engine
from refimpl.graphs.runner import GraphRunner
from refimpl.model import TinyDecoder

# the repository root, wherever the notebook is run from; figures go to ROOT / "figures"
ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd().parent
torch.manual_seed(0)
emu = make_engine("cpu-emulator")  # sections 2-4: the emulator, on every machine

# %% [markdown]
# ## 2. Capture once, replay many
#
# A tiny step, `y = sin(x @ w) * 2 + 1`, whose input `x` is a **static buffer**: allocated once
# and kept. We count how often the step's Python body runs, capture it, then feed three new
# inputs by copying each *into* `static_x` and replaying.


# %%
def program(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.sin(x @ w) * 2 + 1


static_x, w = torch.zeros(2, 3), torch.randn(3, 4)
python_calls = 0


def step():
    global python_calls
    python_calls += 1
    return program(static_x, w)


graph = emu.new_graph()
static_y = graph.capture(step)  # runs step() once, under the recorder
for _ in range(3):
    new_x = torch.randn(2, 3)
    static_x.copy_(new_x)  # copy INTO the captured buffer (never `static_x = new_x`)
    graph.replay()
    assert torch.equal(static_y, program(new_x, w)), "the output tensor holds the new result"
print("3 replays; the Python body ran", python_calls, "time(s); kernels:", dict(graph.kernels()))
assert python_calls == 1
assert graph.kernels() == {"aten.mm.default": 1, "aten.sin.default": 1, "aten.mul.Tensor": 1, "aten.add.Tensor": 1}

# %% [markdown]
# ## 3. What is frozen
#
# Anything Python decides during capture is fixed for good. This step sums "the valid entries"
# of a buffer, their count kept as a plain Python `int`, the way a backend might keep
# `self.max_seq_len`. It is 3 at capture; later it is 5, but replay still sums 3. The old
# TRT-LLM `max_seq_len` bug worked this way: a bound baked in at capture silently truncated
# longer sequences at replay.

# %%
vals = torch.zeros(8)
knobs = {"n_valid": 3, "scale": 1.0}  # plain Python values read by the step

g_frozen = emu.new_graph()
total = g_frozen.capture(lambda: vals[: knobs["n_valid"]].sum() * knobs["scale"])
vals.copy_(torch.tensor([1.0, 2, 3, 4, 5, 0, 0, 0]))
knobs.update(n_valid=5, scale=10.0)  # too late: the graph already froze 3 and 1.0
g_frozen.replay()
print(f"graph says {total.item():.0f}; eager with the new knobs says "
      f"{(vals[: knobs['n_valid']].sum() * knobs['scale']).item():.0f}")
assert total.item() == 1 + 2 + 3, "slice length 3 and scale 1.0 were frozen at capture"

# %% [markdown]
# The fix: whatever changes from batch to batch must be **tensor data in a static buffer** that
# a hook refills before each replay. A Python value is fine only as a bound that holds for every
# future batch.
#
# ## 4. Two more ways it breaks
#
# **A host sync during capture.** Reading a device value on the host (`.item()`, `if t.any():`,
# `nonzero`, ...) is illegal under CUDA stream capture, and the emulator refuses it with
# `GraphCaptureError`. (On a CPU it cannot tell host tensors from device ones, so it also
# refuses `.tolist()` and `.cpu()` on every tensor:
# [refimpl's convention](../docs/sglang_facts.md#where-refimpl-deliberately-differs-from-upstream).)


# %%
def uses_item():
    return static_x * static_x.abs().sum().item()  # host read of a device value


def data_dependent_if():
    return static_x + 1 if (static_x > 0).any() else static_x - 1  # bool(tensor) on the host


for fn in (uses_item, data_dependent_if):
    g = emu.new_graph()
    try:
        g.capture(fn)
    except GraphCaptureError as e:
        print(f"{fn.__name__}: GraphCaptureError: {e}")
        assert ("host synchronisation" in str(e) or "data-dependent" in str(e)) and not g.captured
    else:
        raise AssertionError("capture should have failed")

# %% [markdown]
# **A stale bound buffer.** A backend keeps metadata the captured step reads, here
# `meta.scale`, and updates it between steps. The buggy update **rebinds the attribute to a
# fresh tensor**. Eagerly that works. The graph recorded the *old* tensor, so it never sees the
# new one: no error, just a wrong answer. The fix writes into the captured buffer with `copy_`.


# %%
class Meta:
    def __init__(self):
        self.scale = torch.ones(4)  # allocated once, before capture

    def update_buggy(self, s):
        self.scale = torch.full((4,), s)  # fresh tensor: invisible to the graph

    def update_fixed(self, s):
        self.scale.copy_(torch.full((4,), s))  # in place: the graph reads it


x4 = torch.arange(4.0)
for how, scale_seen in (("buggy", 1.0), ("fixed", 3.0)):
    meta = Meta()
    g = emu.new_graph()
    out = g.capture(lambda meta=meta: x4 * meta.scale)  # captured with scale = 1
    getattr(meta, f"update_{how}")(3.0)
    g.replay()
    print(f"{how:>5}: eager would give {(x4 * meta.scale).tolist()}, graph gives {out.tolist()}")
    assert torch.equal(out, x4 * scale_seen)

# %% [markdown]
# ## 5. A real step: the graph runner
#
# A `World` holds the request table `req_to_token`, the token-slot allocator and the KV cache
# (request row 0 and token slot 0 are reserved for padded rows). `TinyDecoder` (two layers) is
# the program we capture, with `TorchNativeBackend`, a "hello world" attention backend. The
# `GraphRunner` captures DECODE graphs for batch sizes 8, 4, 2 and 1, largest first, so smaller
# graphs reuse the larger one's memory. Each graph holds one attention kernel per layer. The
# attention *metadata* (which KV slots each request reads) is not in the graph: the backend's
# hook rebuilds it before each replay, into buffers the graph reads.

# %%
engine = make_engine("auto")  # the emulator here, CUDA graphs on a GPU
cfg = ModelConfig()  # MHA: 2 layers, 4 query heads, 2 KV heads, fp32
world = World.create(cfg, max_context_len=48, pool_size=24, device=engine.device)
world.randomize_kv(0)
backend = TorchNativeBackend(world, None)
graphs = GraphConfig(max_bs=8, capture_bs=(1, 2, 4, 8), max_context_len=48)
runner = GraphRunner(TinyDecoder(cfg, engine.device), backend, engine, ForwardMode.DECODE, graphs)
records = runner.capture()
print(f"{engine.name}: captured bs", [r.bs for r in records], "| kernels per graph:", records[0].kernels)
assert [r.bs for r in records] == [8, 4, 2, 1]
assert all(r.kernels == {"refimpl.dense_paged_attention.default": cfg.num_layers} for r in records)

# %% [markdown]
# A decode batch of **3** requests has no graph of its own. The runner picks the smallest
# captured size that fits, 4, copies the batch into the static inputs, **pads** the fourth row,
# runs the backend's replay hook, and replays. The logits are a view of the graph's static
# output, and they equal an eager run of the same batch.

# %%
gen = BatchGenerator(world, None, seed=1)
fb = gen.decode(3)
res = runner.run(fb)
print(f"used_graph={res.used_graph}, graph_bs={res.graph_bs}, seq_lens {fb.seq_lens.tolist()}")
assert res.used_graph and res.graph_bs == 4
assert res.logits.data_ptr() == runner.outputs[4].data_ptr(), "logits view the static output"
graph_logits = res.logits.clone()  # clone: the next replay overwrites the static output
assert torch.allclose(graph_logits, runner.eager(fb), atol=1e-4)

# %% [markdown]
# The static inputs after this replay: rows 0-2 hold the live batch; row 3, the padded row, has
# `seq_len` = the backend's fill value (1), request row 0 and cache slot 0. So it attends over
# one reserved token, writes its KV into the reserved slot 0, and its logits are thrown away.
# Rows 4-7 belong to the bs-8 graph and are not read. This picture heads the README.

# %%
raw_bs, bs, fill = fb.batch_size, res.graph_bs, backend.get_cuda_graph_seq_len_fill_value()
static = {"req_pool_indices": runner.req_pool_indices, "seq_lens": runner.seq_lens,
          "out_cache_loc": runner.out_cache_loc}
for name, t in static.items():
    assert torch.equal(t[:raw_bs], getattr(fb, name)), name  # the live rows
assert (runner.seq_lens[raw_bs:bs] == fill).all() and (runner.req_pool_indices[raw_bs:bs] == 0).all()
assert (runner.out_cache_loc[raw_bs:bs] == 0).all()
fig = viz.draw_buffers(static, f"raw bs {raw_bs} replayed by the bs-{bs} graph (fill value {fill})",
                       roles={name: viz.batch_roles(runner.max_bs, raw_bs, bs) for name in static})
display(Image(filename=str(viz.save(fig, ROOT / "figures" / "00_runner_padding.png"))))

# %% [markdown]
# **Is padding safe?** Only if the padded row never writes a live request's KV: we snapshot the
# live KV slots this batch must not write, clear slot 0, replay, and compare.

# %%
own = set(fb.out_cache_loc.tolist())
guarded = torch.tensor([s for s in world.live_slots().tolist() if s not in own], device=engine.device)
before = [b[guarded].clone() for b in world.kv_cache.buffers()]  # k and v of every layer
for b in world.kv_cache.buffers():
    b[0].zero_()
runner.replay(fb)
assert all(torch.equal(b[guarded], old) for b, old in zip(world.kv_cache.buffers(), before))
assert all(b[0].abs().sum() > 0 for b in world.kv_cache.buffers()), "the padded row wrote slot 0"
print(f"{guarded.numel()} live KV slots untouched; the padded row wrote slot 0")

# %% [markdown]
# ## 6. The checker
#
# `refimpl.check.run_checks` turns section 5 into a test, for every backend and mode. For each
# raw batch size it asks four questions:
# (a) do the capture path and the replay path leave identical graph-read state?
# (b) does the graph replay equal eager execution, without touching another request's KV?
# (c) does eager execution match a dense float64 oracle?
# (d) does the replayed state match a reference built from first principles (where the backend
#     gives one)?
# A fifth, (e), is not pass/fail: whether the replay hook itself may be replayed from a small
# graph of its own (notebook 05). A sixth, (f), replays a history of batches through the same
# graphs (notebook 06). Here: the hello-world backend, in decode and in speculative
# *target verify* (N = 4 draft tokens per request).

# %%
checks = run_checks(backends=["torch_native"], modes=["decode", "target_verify"], settings=CheckSettings(raw_bs=(1, 3)))
for r in checks:
    print(f"{r.mode:<14} raw bs {r.bs}: (a) {r.capture_equals_replay}  (b) {r.graph_equals_eager}  "
          f"(c) {r.matches_oracle}  (d) {r.replay_matches_reference}  passed {r.passed}")
assert len(checks) == 4 and all(r.passed and not r.findings for r in checks)
gen.release_all()

# %% [markdown]
# **Next:**
# * **01: Triton through every forward mode**: speculative decoding's graph modes on one
#   backend, and the static buffers each mode refills.
# * **02: the other backends**: the same buffers on Wave, FlashInfer and FlashInfer-MLA; two
#   historical bugs, cell by cell.
# * **03: two patterns**: how capture and replay are kept in agreement (Pattern A, as in
#   `TorchNativeBackend`, and Pattern B), and how two separate paths drift (Pattern C).
# * **04: MLA backends and the redundant-copy removal**: Cutlass-MLA and TRTLLM-MLA's block
#   tables, and what removing TRTLLM-MLA's per-replay copies bought.
# * **05: what a replay costs**: the runner's replay code, its host work measured on an H200,
#   and the shapes that move the hook out of Python.
# * **06: reviewing a new backend**: the checker on a backend of your own, and its findings.
