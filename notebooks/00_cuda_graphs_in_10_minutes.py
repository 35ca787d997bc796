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
# This first notebook covers what a CUDA graph is, what it freezes, and how it breaks. It ends
# with a real decode step captured and replayed by `refimpl`'s `GraphRunner`, in the way SGLang's
# `CudaGraphRunner` does it. Every claim on this page is checked by an `assert` in the cell that
# shows it. If a claim stops being true, the notebook fails.
#
# ## 1. Framing
#
# A **CUDA graph** is a recording of GPU work. You run a step once while the stream is in
# *capture* mode. The kernels it launches are stored instead of being executed one by one.
# After that, `graph.replay()` launches the whole recording with a single call.
#
# **Why serving engines use it.** A decode step for a small batch is made of hundreds of tiny
# kernels (norms, projections, attention, and so on for every layer). Each launch costs several
# microseconds of CPU-side Python and driver work. At batch size 1 to 32 that overhead can take
# longer than the math itself. Replaying a graph removes it. This is why SGLang, vLLM and
# TensorRT-LLM capture one graph per batch size for decode (and for speculative verify / draft
# steps), and run prefill eagerly.
#
# **The contract.** You get that speed-up only if you keep these rules:
#
# * **Capture once, replay many.** The step runs under capture one time; every later call is
#   `replay()`.
# * **Static buffers.** Replay reads and writes the *same memory* it saw at capture. New inputs
#   must be **copied into** the captured tensors (`copy_`), and outputs come back in the same
#   tensors every time.
# * **No host syncs.** Nothing may read a GPU value on the CPU during capture: no `.item()`,
#   `if tensor:`, `.tolist()`, `nonzero`...
# * **Python is frozen.** Scalars, shapes, slice lengths and branches stay as they were at
#   capture; no Python of the step runs at replay.
#
# **No GPU? No problem.** `refimpl` ships a CPU emulator of CUDA graphs
# (`refimpl/graphs/emulator.py`). It records the tensor ops of a step with a
# `TorchDispatchMode` and re-executes them on the captured tensors, with the same contract and
# the same errors. `make_engine("auto")` picks the real `torch.cuda.CUDAGraph` engine when a GPU
# is present and the emulator otherwise. Sections 2–4 use the emulator explicitly so the page is
# the same everywhere. Section 5 runs the same program on a GPU.

# %%
import io
import json
import time
from pathlib import Path

import torch
from matplotlib.figure import Figure

from refimpl import ForwardMode, GraphConfig, ModelConfig, viz
from refimpl.backends.torch_native import TorchNativeBackend
from refimpl.batch import World
from refimpl.batchgen import BatchGenerator
from refimpl.check import CheckSettings, run_checks
from refimpl.graphs import GraphCaptureError, make_engine
from refimpl.graphs.runner import GraphRunner
from refimpl.model import TinyDecoder
from refimpl.viz.code import CodeGrid, source_lines

try:
    from IPython import get_ipython
    from IPython.display import Image, display
except ImportError:  # no IPython at all
    get_ipython = lambda: None  # noqa: E731
IN_NOTEBOOK = get_ipython() is not None  # False when run as a plain script

NOTEBOOK_T0 = time.perf_counter()
torch.manual_seed(0)
# the repository root, wherever the notebook is run from; figures go to ROOT / "figures"
ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd().parent


def show_png(fig: Figure, path: Path | None = None) -> None:
    """Save ``fig`` under ``path`` (reproducibly) if given, and display it in a notebook."""
    if path is not None:
        viz.save(fig, path)
    if IN_NOTEBOOK:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
        display(Image(data=buf.getvalue()))


auto = make_engine("auto")
print("make_engine('auto') ->", auto.name, "on", auto.device)
assert auto.name == ("cuda" if torch.cuda.is_available() else "cpu-emulator")

emu = make_engine("cpu-emulator")  # sections 2-4: the emulator, on every machine
print("sections 2-4 use    ->", emu.name)

# %% [markdown]
# ## 2. Capture once, replay many
#
# Below is a tiny "step": `y = sin(x @ w) * 2 + 1`. Its input `x` is a **static buffer**: a
# tensor we allocate once and keep. The step also counts how many times its Python body runs.


# %%
def program(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The step we capture (reused on the GPU in section 5)."""
    return torch.sin(x @ w) * 2 + 1


static_x = torch.zeros(2, 3)  # the static input buffer: allocated once, never replaced
w = torch.randn(3, 4)
python_calls = 0


def step():
    global python_calls
    python_calls += 1
    return program(static_x, w)


graph = emu.new_graph()
static_y = graph.capture(step)  # runs step() once, under the recorder
y_ptr = static_y.data_ptr()
print("after capture: Python body ran", python_calls, "time(s)")
assert python_calls == 1

# %% [markdown]
# To feed new data we **copy it into the static input** and replay. The output appears in the
# *same* tensor `static_y` (same address) each time, and the Python body never runs again.

# %%
same_address = []
for _ in range(3):
    new_x = torch.randn(2, 3)
    static_x.copy_(new_x)  # copy INTO the captured buffer (never `static_x = new_x`)
    graph.replay()
    assert torch.equal(static_y, program(new_x, w)), "replay recomputes the step on new data"
    same_address.append(static_y.data_ptr() == y_ptr)

print("3 replays done; Python body ran", python_calls, "time(s) in total")
print("static_y at the address it had at capture, after each replay:", same_address)
assert python_calls == 1
assert all(same_address), "the output lives at the captured address"

# %% [markdown]
# The graph can be inspected. `ops()` lists everything that was recorded. `kernels()` counts the
# ops that launch work at replay; views and allocations launch nothing, so they are left out.

# %%
print("ops:    ", graph.ops())
print("kernels:", dict(graph.kernels()))
assert graph.kernels() == {"aten.mm.default": 1, "aten.sin.default": 1, "aten.mul.Tensor": 1, "aten.add.Tensor": 1}

# %% [markdown]
# ## 3. What is frozen
#
# Anything Python decides during capture is fixed for good. Here is a step that sums "the valid
# entries" of a buffer. The count is a plain Python `int`, the way a backend might keep
# `self.max_seq_len`. It is 3 at capture. Later the batch has 5 valid entries and we update the
# Python value, but replay still sums 3. This is how the old TRT-LLM `max_seq_len` bug worked: a
# Python bound baked in at capture silently truncates longer sequences at replay.

# %%
vals = torch.zeros(8)
knobs = {"n_valid": 3, "scale": 1.0}  # plain Python values read by the step

g_frozen = emu.new_graph()
total = g_frozen.capture(lambda: vals[: knobs["n_valid"]].sum() * knobs["scale"])

vals.copy_(torch.tensor([1.0, 2, 3, 4, 5, 0, 0, 0]))
knobs.update(n_valid=5, scale=10.0)  # too late: the graph already froze 3 and 1.0
g_frozen.replay()

print(
    f"graph says {total.item():.0f};  eager with the new knobs says "
    f"{(vals[: knobs['n_valid']].sum() * knobs['scale']).item():.0f}"
)
assert total.item() == 1 + 2 + 3, "slice length 3 and scale 1.0 were frozen at capture"

# %% [markdown]
# How to fix it: anything that changes from batch to batch must be **tensor data in a static
# buffer**, for example a `kv_indptr` that the replay hook refills. A Python value is fine only
# as a *bound* that holds for every future batch, for example `max_kv_len = max_context_len` in
# `TorchNativeBackend`.
#
# ## 4. Classic pitfalls, live
#
# ### 4a. Host synchronisation during capture
# Under CUDA stream capture, reading a device value on the host is illegal. That includes
# `.item()`, `int(t)`, `if t.any():`, `.tolist()`, `nonzero`, and boolean indexing. The emulator
# refuses the same things and raises `GraphCaptureError`. It is stricter than a real capture,
# which fails only on device-to-host reads: on a CPU it cannot tell host tensors from device
# tensors, so it refuses `.tolist()`, `.cpu()` and `.numpy()` on *every* tensor during capture
# (refimpl's convention, [not upstream's](../docs/sglang_facts.md#where-refimpl-deliberately-differs-from-upstream)).


# %%
def capture_error(fn) -> str:
    """Capture fn on a fresh emulator graph; return the GraphCaptureError message."""
    g = emu.new_graph()
    try:
        g.capture(fn)
    except GraphCaptureError as e:
        assert not g.captured
        return str(e)
    raise AssertionError("capture should have failed")


def uses_item():
    n = int(static_x.abs().sum().item())  # host read of a device value
    return static_x * n


def data_dependent_if():
    if (static_x > 0).any():  # bool(tensor): the branch needs the value on the host
        return static_x + 1
    return static_x - 1


def uses_nonzero():
    return static_x.nonzero()  # output shape depends on the values


for fn in (uses_item, data_dependent_if, uses_nonzero):
    msg = capture_error(fn)
    print(f"{fn.__name__}:\n    GraphCaptureError: {msg}")
    assert "host synchronisation" in msg or "data-dependent" in msg

# %% [markdown]
# ### 4b. The "stale bound buffer" bug
# A backend keeps metadata that the captured step reads, here `meta.scale`. Between steps it
# must update that metadata. The buggy update **rebinds the attribute to a fresh tensor**.
# Eagerly this works fine. The graph, though, recorded the *old* tensor object, so it never
# sees the new one. No error is raised; the answer is just wrong. The fix is to write into the
# captured buffer with `copy_`.


# %%
class Meta:
    def __init__(self):
        self.scale = torch.ones(4)  # allocated once, before capture

    def update_buggy(self, s):
        self.scale = torch.full((4,), s)  # fresh tensor: invisible to the graph

    def update_fixed(self, s):
        self.scale.copy_(torch.full((4,), s))  # in place: the graph reads it


x4 = torch.arange(4.0)
results = {}
for how in ("buggy", "fixed"):
    meta = Meta()
    g = emu.new_graph()
    out = g.capture(lambda meta=meta: x4 * meta.scale)  # captured with scale = 1
    getattr(meta, f"update_{how}")(3.0)
    g.replay()
    results[how] = out.clone()
    print(f"{how:>5}: eager would give {(x4 * meta.scale).tolist()}, graph gives {out.tolist()}")

assert torch.equal(results["buggy"], x4 * 1.0), "the rebound tensor is invisible: stale scale 1"
assert torch.equal(results["fixed"], x4 * 3.0), "copy_ into the captured buffer is seen"

# %% [markdown]
# ## 5. The same on a GPU
#
# The next two cells are tagged `gpu`. They run only when CUDA is present: the test run skips
# them on CPU, and their bodies are guarded as well. They capture `program` from section 2 with
# the real `torch.cuda.CUDAGraph` engine and with the emulator, feed both the same new data, and
# check that they agree. Then they show that `.item()` during *CUDA* stream capture is refused
# with the same `GraphCaptureError`. No later cell uses anything defined here.

# %% tags=["gpu"]
if torch.cuda.is_available():
    gpu_engine = make_engine("cuda")
    gpu_w = w.cuda()
    gpu_x, cpu_x = torch.zeros(2, 3, device="cuda"), torch.zeros(2, 3)

    gpu_graph, cpu_graph = gpu_engine.new_graph(), emu.new_graph()
    gpu_engine.warmup(lambda: program(gpu_x, gpu_w), 2)  # side-stream warm-up, as SGLang does
    gpu_y = gpu_graph.capture(lambda: program(gpu_x, gpu_w))
    cpu_y = cpu_graph.capture(lambda: program(cpu_x, w))

    for _ in range(3):
        new_x = torch.randn(2, 3)
        gpu_x.copy_(new_x)
        cpu_x.copy_(new_x)
        gpu_graph.replay()
        cpu_graph.replay()
        torch.cuda.synchronize()
        assert torch.allclose(gpu_y.cpu(), cpu_y, atol=1e-5), (gpu_y.cpu() - cpu_y).abs().max()
    gpu_kernels = dict(gpu_graph.kernels())
    print("cuda kernels:    ", gpu_kernels)
    print("emulator kernels:", dict(cpu_graph.kernels()))
    assert gpu_kernels == dict(cpu_graph.kernels())
    print("CUDA graph and emulator agree on 3 replays")

# %% tags=["gpu"]
if torch.cuda.is_available():
    gpu_bad_graph = gpu_engine.new_graph()
    try:
        gpu_bad_graph.capture(lambda: gpu_x * gpu_x.sum().item())
    except GraphCaptureError as e:
        gpu_msg = str(e)
    else:
        raise AssertionError(".item() during CUDA capture must raise")
    print("GraphCaptureError:", gpu_msg)
    assert not gpu_bad_graph.captured

# %% [markdown]
# ## 6. A real step: the graph runner
#
# Now for the real thing. We build:
#
# * a `World`, which holds the request table `req_to_token`, the token-slot allocator and the KV
#   cache. Request row 0 and token slot 0 are reserved for padded rows. `randomize_kv` fills
#   the cache as if every prefix had already been prefilled;
# * a `TinyDecoder`: two layers of projections + attention. This is the program that gets
#   captured;
# * `TorchNativeBackend`, the "hello world" attention backend with page-size-1 CSR metadata;
# * a `GraphRunner` for DECODE that captures graphs for batch sizes 1, 2, 4 and 8.
#
# `make_engine("auto")` is the emulator here and CUDA on a GPU; the whole section runs on either.
#
# ### The runner's two loops, as code
#
# First the code itself. On the left, `GraphRunner.capture`: it runs once, before serving, and
# loops over the batch sizes largest first. On the right, what runs on *every* step:
# `GraphRunner._replay` and the input copy it calls, `load_inputs`. This is the source of
# `refimpl/graphs/runner.py` as it is now (read with `inspect`, docstrings trimmed); the tags on
# the right edge are this notebook's. Read the right column top to bottom: **copy inputs → pad →
# backend hook → `graph.replay()`**.
#
# Three things in this code are refimpl's own, not upstream's
# ([the list](../docs/sglang_facts.md#where-refimpl-deliberately-differs-from-upstream)):
# the live rows and the padded rows' values go into the static inputs in one
# `torch._foreach_copy_` (upstream: one `copy_` per input, plus `fill_` of whole buffers when
# padding), from a copy plan `_copy_plan` builds once per (raw bs, graph bs); a padded row's
# `req_pool_indices` is reset to the reserved row 0 on every padded replay (the mid-2025
# upstream runner resets only `seq_lens` and `out_cache_loc`); and `validate` refuses a bad
# batch before anything is written (README, "Bad input").

# %%
runner_code = CodeGrid(
    ["capture: once per batch size, largest first", "replay: every step"],
    [""],
    [
        [
            [("GraphRunner.capture", source_lines(GraphRunner.capture))],
            [
                ("GraphRunner._replay", source_lines(GraphRunner._replay)),
                ("GraphRunner.load_inputs (called by _replay)", source_lines(GraphRunner.load_inputs)),
            ],
        ]
    ],
    [
        [
            [
                ("sorted(self.capture_bs, reverse=True)", "largest first"),
                ("layout.reset_padded_rows(", "every row a padded row"),
                ("call_capture_hook(", "backend capture hook (outside the graph)"),
                ("self.engine.warmup(", "warm-up"),
                ("graph.capture(run_once)", "record the step"),
                ("CaptureRecord(", "seconds, pool bytes: capture_records"),
            ],
            [
                ("self.validate(fb)", "refuse a bad batch (refimpl)"),
                ("self.pick_bs(", "smallest captured bs >= raw bs"),
                ("self.load_inputs(fb, bs)", "1. copy inputs, 2. pad"),
                ("self.replay_hook(fb, bs)", "3. backend replay hook"),
                ("self.launch(bs)", "4. graph.replay()"),
                ("return out[", "5. the live rows of the static output"),
                ("torch._foreach_copy_(", "1+2. live rows and padded rows' values, one launch"),
                ("host_live.copy_(", "1. host mirror of seq_lens"),
                ("host_pad.fill_(", "2. pad the host mirror"),
            ],
        ]
    ],
)
display(runner_code) if IN_NOTEBOOK else print(runner_code)

# the order the tags describe is the order of the code shown
cap = [
    runner_code.position(0, 0, t)
    for t in (
        "largest first",
        "every row a padded row",
        "backend capture hook (outside the graph)",
        "warm-up",
        "record the step",
    )
]
rep = [
    runner_code.position(0, 1, t)
    for t in (
        "smallest captured bs >= raw bs",
        "1. copy inputs, 2. pad",
        "3. backend replay hook",
        "4. graph.replay()",
        "5. the live rows of the static output",
    )
]
assert cap == sorted(cap) and rep == sorted(rep)

# %% [markdown]
# Now build it and run the left column: capture graphs for batch sizes 8, 4, 2 and 1.

# %%
engine = make_engine("auto")
device = engine.device
cfg = ModelConfig()  # MHA: 2 layers, 4 query heads, 2 KV heads, fp32
world = World.create(cfg, max_context_len=48, pool_size=24, device=device)
world.randomize_kv(0)
model = TinyDecoder(cfg, device)
backend = TorchNativeBackend(world, None)
runner = GraphRunner(
    model, backend, engine, ForwardMode.DECODE, GraphConfig(max_bs=8, capture_bs=(1, 2, 4, 8), max_context_len=48)
)

records = runner.capture()  # largest first: smaller graphs reuse the bigger one's memory
assert records is runner.capture_records
print(
    f"engine: {engine.name}"
    + ("  (emulator timings: they say nothing about a GPU)" if engine.name == "cpu-emulator" else "")
)
print(f"{'bs':>3} {'capture ms':>10} {'reserved MiB':>12} {'pool growth MiB':>15}  kernels (refimpl custom ops)")
for r in records:
    mib = ["-" if b is None else f"{b / 2**20:.1f}" for b in (r.pool_bytes, r.pool_growth)]
    print(f"{r.bs:>3} {r.seconds * 1e3:10.1f} {mib[0]:>12} {mib[1]:>15}  {r.kernels}")
assert [r.bs for r in records] == [8, 4, 2, 1]
assert all(r.kernels == {"refimpl.dense_paged_attention.default": cfg.num_layers} for r in records)
assert all((r.pool_bytes is None) == (engine.name == "cpu-emulator") for r in records)

# %% [markdown]
# `capture ms` is the wall time of warm-up and capture for one batch size. On this CPU the
# numbers are the **emulator's**: it runs the step eagerly to record it, so they grow with the
# work of the step and say nothing about a GPU. On a GPU, `reserved MiB` is the CUDA caching
# allocator's reserved memory after each capture and `pool growth` what that capture added:
# the graphs share one memory pool, so the first (largest) capture takes the most and the
# smaller ones reuse its blocks. The emulator has no pool, so those columns are empty here.
# Each kernel is a `torch.library` custom op so that the emulator can record it (refimpl's
# convention; SGLang launches its Triton kernels directly). Drawn:

# %%
has_pool = records[0].pool_growth is not None
fig = Figure(figsize=(8.4 if has_pool else 4.4, 3.0))
axes = fig.subplots(1, 2 if has_pool else 1, squeeze=False)[0]
by_bs = sorted(records, key=lambda r: r.bs)
bs_axis = [r.bs for r in by_bs]
axes[0].plot(bs_axis, [r.seconds * 1e3 for r in by_bs], "o-", color="C0")
axes[0].set(xlabel="batch size", ylabel="capture ms (warm-up + capture)", ylim=(0, None))
if has_pool:
    axes[1].bar([str(b) for b in bs_axis], [r.pool_growth / 2**20 for r in by_bs], color="C1")
    axes[1].set(xlabel="batch size", ylabel="graph pool growth MiB")
for ax in axes:
    ax.grid(alpha=0.3)
axes[0].set_xscale("log", base=2)
axes[0].set_xticks(bs_axis, [str(b) for b in bs_axis])
axes[0].minorticks_off()
where = "CPU emulator timings, not a GPU's" if engine.name == "cpu-emulator" else torch.cuda.get_device_name()
fig.suptitle(f"capture cost per batch size ({where}; captured 8, 4, 2, 1)", fontsize=9)
fig.tight_layout()
show_png(fig)  # shown, not saved: timings differ run to run, figures/ holds reproducible pictures

# %% [markdown]
# Each graph contains one attention kernel per layer. The attention *metadata* (`kv_indptr`,
# `kv_indices`) is **not** in the graph: the backend's replay hook rebuilds it before each
# replay, outside the graph, into buffers that the graph reads.
#
# Next, a decode batch of **3** requests. No graph has batch size 3, so the runner picks the
# smallest captured size that fits, 4, and **pads** one row.

# %%
gen = BatchGenerator(world, None, seed=1)
fb = gen.decode(3)
print(
    "live batch: req_pool_indices",
    fb.req_pool_indices.tolist(),
    " seq_lens",
    fb.seq_lens.tolist(),
    " out_cache_loc",
    fb.out_cache_loc.tolist(),
)

res = runner.run(fb)
print(f"used_graph={res.used_graph}  graph_bs={res.graph_bs}  logits {tuple(res.logits.shape)}")
same = res.logits.data_ptr() == runner.outputs[4].data_ptr()
print("logits at the address of the bs-4 graph's static output:", same)
assert res.used_graph and res.graph_bs == 4
assert same, "logits view the static output"
graph_logits = res.logits.clone()  # clone: the next replay overwrites the static output

# %% [markdown]
# The runner's static inputs after this replay are shown below. The graph for bs 4 reads rows
# 0–3. Rows 0–2 hold the live batch. Row 3 is padding: `seq_len` = the backend's fill value (1),
# request row 0, cache slot 0. So the padded row attends over one reserved token (the backend's
# `kv_indptr` gives it a range of length 1, holding slot 0) and writes its KV into the reserved
# slot 0, and its logits are thrown away. (Resetting the padded row's `req_pool_indices` to row 0
# on every padded replay is refimpl's convention: the mid-2025 upstream runner resets only
# `seq_lens` and `out_cache_loc`, so a padded row can keep a request slot left by an earlier,
# larger batch; [the list](../docs/sglang_facts.md#where-refimpl-deliberately-differs-from-upstream).)

# %%
raw_bs, bs = fb.batch_size, res.graph_bs
fill = backend.get_cuda_graph_seq_len_fill_value()
print(f"{'row':>3}  {'kind':<7} {'req_pool_idx':>12} {'seq_len':>8} {'out_cache_loc':>13}")
for i in range(runner.max_bs):
    kind = "live" if i < raw_bs else ("padded" if i < bs else "unread")
    print(
        f"{i:>3}  {kind:<7} {int(runner.req_pool_indices[i]):>12} {int(runner.seq_lens[i]):>8} "
        f"{int(runner.out_cache_loc[i]):>13}"
    )

assert torch.equal(runner.req_pool_indices[:raw_bs], fb.req_pool_indices)
assert torch.equal(runner.seq_lens[:raw_bs], fb.seq_lens)
assert torch.equal(runner.out_cache_loc[:raw_bs], fb.out_cache_loc)
assert (runner.seq_lens[raw_bs:bs] == fill).all()
assert (runner.req_pool_indices[raw_bs:bs] == 0).all()
assert (runner.out_cache_loc[raw_bs:bs] == 0).all()
# what the replay hook built from that row: a kv range of one token, the reserved slot 0
kv_indptr = backend.cuda_graph_kv_indptr[: bs + 1].tolist()
padded_kv = backend.cuda_graph_kv_indices[kv_indptr[raw_bs] : kv_indptr[bs]].tolist()
print(f"padded row's kv range (fill value {fill}): kv_indices {padded_kv}")
assert padded_kv == [0]

# %% [markdown]
# **Correctness.** The replayed graph gives the same logits as running the step eagerly, where
# Python runs, fresh metadata is built, and there is no padding.

# %%
eager_logits = runner.eager(fb)
max_diff = (graph_logits - eager_logits).abs().max().item()
print(f"graph vs eager: max |diff| = {max_diff:.2e}")
assert torch.allclose(graph_logits, eager_logits, atol=1e-4)

# %% [markdown]
# **Poison check.** Padding is only safe if padded rows never write into a live request's KV.
# We snapshot every live KV slot except the ones this batch is supposed to write. We clear the
# reserved slot 0, replay, and compare. The live slots are unchanged, and slot 0 now holds what
# the padded row wrote. (A snapshot cannot see a write of the very values a slot already held,
# which is what a stale padded row does on a GPU, bit for bit; the checker's `KVGuard` therefore
# fills the slots of requests outside the batch with a sentinel for the replay, then restores
# them.)

# %%
own = set(fb.out_cache_loc.tolist())
guarded = torch.tensor([s for s in world.live_slots().tolist() if s not in own], device=device)
bufs = world.kv_cache.buffers()  # k and v of every layer
before = [b[guarded].clone() for b in bufs]
for b in bufs:
    b[0].zero_()  # clear the reserved slot so we can see the padded row write it

runner.replay(fb)

assert all(torch.equal(b[guarded], old) for b, old in zip(bufs, before)), "a live KV slot changed"
assert all(b[0].abs().sum() > 0 for b in bufs), "the padded row writes its KV into slot 0"
print(f"{guarded.numel()} live slots untouched; the padded row wrote slot 0 in all {len(bufs)} K/V buffers")

# %% [markdown]
# **Fallback.** A batch larger than the largest captured size cannot be replayed. The runner
# runs it eagerly and reports the reason.

# %%
big = gen.decode(9)
res_big = runner.run(big)
print(f"used_graph={res_big.used_graph}  fallback_reason={res_big.fallback_reason!r}")
assert not res_big.used_graph and res_big.graph_bs is None
assert "exceeds the largest captured size 8" in res_big.fallback_reason
assert res_big.logits.shape == (9, cfg.vocab_size)  # still served, eagerly

# %% [markdown]
# ## 7. Picture: the padded replay's static buffers
#
# Below is the same table as a picture. Live rows are blue, the padded row is orange, and rows
# the bs-4 graph never reads are grey.

# %%
names = ["req_pool_indices", "seq_lens", "out_cache_loc"]
table = torch.stack([runner.req_pool_indices, runner.seq_lens.long(), runner.out_cache_loc], 1)
row_kind = torch.tensor([0 if i < raw_bs else 1 if i < bs else 2 for i in range(runner.max_bs)])
colors = torch.tensor([[0.62, 0.79, 0.96], [1.0, 0.73, 0.45], [0.88, 0.88, 0.88]])

fig = Figure(figsize=(5.2, 3.6))
ax = fig.subplots()
ax.imshow(colors[row_kind][:, None, :].expand(-1, len(names), -1).numpy(), aspect="auto")
for i in range(runner.max_bs):
    for j in range(len(names)):
        ax.text(j, i, int(table[i, j].cpu()), ha="center", va="center", fontsize=10)
ax.set_xticks(range(len(names)), names)
labels = ["live", "padded", "unread"]
ax.set_yticks(range(runner.max_bs), [f"{i} {labels[int(k)]}" for i, k in enumerate(row_kind)])
ax.hlines([i + 0.5 for i in range(runner.max_bs - 1)], -0.5, len(names) - 0.5, colors="white")
ax.xaxis.tick_top()
ax.set_title(f"raw bs {raw_bs} replayed by the bs-{bs} graph (fill value {fill})", fontsize=10, pad=28)
fig.tight_layout()

show_png(fig, ROOT / "figures" / "00_runner_padding.png")

# %% [markdown]
# **What the graph buys.** The whole decoder step, synchronised, replayed as a graph against
# the same step run eagerly (fresh metadata, every kernel launched from Python). The numbers
# below were measured on an H200 (`python -m refimpl bench`, committed in
# `benchmarks/results/replay_cost/`; notebook 04 reads them part by part). On a GPU the cell
# after them measures this notebook's own runner live; on this CPU the emulator's timings
# would say nothing about a GPU, so it skips.

# %%
_bench = json.loads((ROOT / "benchmarks/results/replay_cost/results.json").read_text())
print(f"{_bench['environment']['device']}, context 512, bs 1:")
for r in _bench["rows"]:
    if r["bs"] == 1 and r["context"] == 512 and r["mode"] == "decode" and r["variant"] == "unified":
        st = r["step_us"]
        print(
            f"  {r['backend']:<17} graph {st['graph']['median']:5.0f} us, eager "
            f"{st['eager']['median']:5.0f} us: {st['eager_over_graph']:.1f}x faster as a graph"
        )

# %% tags=["gpu"]
if torch.cuda.is_available():
    from refimpl.bench import time_steps

    live_fb = [gen.decode(1) for _ in range(3)]
    steps = time_steps(runner, live_fb, repeats=50, warmup=10)
    print(
        f"live, this notebook's runner, bs 1: graph {steps['graph']['median']:.0f} us, eager "
        f"{steps['eager']['median']:.0f} us ({steps['eager_over_graph']:.1f}x)"
    )
    for f in live_fb:
        gen.release(f)

# %% [markdown]
# ## 8. Wrap-up: the checker
#
# `refimpl.check.run_checks` runs this whole section as an automated test, for every backend and
# mode. For each raw batch size it asks four questions:
# (a) do the capture path and the replay path leave identical graph-read state?
# (b) does the graph replay equal eager execution, without touching another request's KV?
# (c) does eager execution match a dense float64 oracle?
# (d) does the replayed state match a reference built from first principles (where the backend
#     gives one)?
# A fifth, (e), is not pass/fail: whether the replay hook itself may be replayed from a small
# graph of its own (notebook 04). Here it runs on the hello-world backend, for plain decode and
# for speculative *target verify* (N = 4 draft tokens per request).

# %%
checks = run_checks(backends=["torch_native"], modes=["decode", "target_verify"], settings=CheckSettings(raw_bs=(1, 3)))
print(f"{'backend':<13} {'mode':<14} {'raw bs':>6}  capture=replay  graph=eager  =oracle  =reference  passed")
for r in checks:
    print(
        f"{r.backend:<13} {r.mode:<14} {r.bs:>6}  {r.capture_equals_replay!s:>14}  "
        f"{r.graph_equals_eager!s:>11}  {r.matches_oracle!s:>7}  {r.replay_matches_reference!s:>10}  {r.passed}"
    )
    for f in r.findings:
        print("    finding:", f)
assert len(checks) == 4 and all(r.passed for r in checks)

gen.release_all()
print(f"notebook ran in {time.perf_counter() - NOTEBOOK_T0:.1f} s")

# %% [markdown]
# **Summary.** A graph freezes *addresses* and *Python*. Inputs therefore travel through static
# buffers filled in place, metadata is rebuilt outside the graph into buffers the graph reads,
# Python values may only be bounds that hold for every batch, and padded rows are sent to a
# reserved request row and KV slot.
#
# **Next:**
# * **01: forward modes and their buffers.** Decode, target verify, draft extend (v1/v2) and
#   multi-step draft decode: how many tokens each request takes up in a graph, and which static
#   buffers each attention backend needs.
# * **02: two patterns.** How a backend can keep its capture and replay paths in agreement:
#   "capture = replay body + freeze views" (Pattern A, as in `TorchNativeBackend`) versus
#   "prepare graph-bound objects, then replay" (Pattern B), and the drift that follows when the
#   two paths are written separately (Pattern C).
# * **03: MLA backends and the redundant-copy removal.** FlashInfer-MLA, Cutlass-MLA and
#   TRTLLM-MLA over one latent cache, and what removing TRTLLM-MLA's per-replay copies bought.
# * **04: what a replay costs.** The host work left around `graph.replay()` (copies, the replay
#   hook, the launch), measured on an H200, and the shapes that move the hook out of Python.
# * **05: reviewing a new backend.** Run the checker on a backend of your own and read its
#   findings.
