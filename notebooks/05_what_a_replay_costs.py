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
# Reading time: about 20 minutes. The CPU run takes about 20 s.
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
# that kernel recorded inside the graph; **glue**: the unchanged hook replayed from a small
# graph of its own), and shows which hooks may be glued and how the checker proves it.
# On this CPU the live cells run the emulator, whose timings say what the Python costs, not
# what a GPU launch costs; a `gpu` cell repeats a short sweep live on a GPU.

# %%
import inspect
import json
import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch

try:
    from IPython.display import Image, display
except ImportError:  # run as a plain script: nothing to display
    Image = display = lambda *args, **kwargs: None  # noqa: E731

from refimpl import bench, viz
from refimpl.backends import find, load_backend_class
from refimpl.check import CheckSettings, run_checks
from refimpl.config import SpecConfig
from refimpl.graphs import make_engine
from refimpl.graphs.runner import GraphRunner
from refimpl.layout import KINDS
from refimpl.rig import Rig
from refimpl.viz.code import CodeGrid, source_lines

NOTEBOOK_T0 = time.perf_counter()
ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd().parent
FIGURES = ROOT / "figures"
RESULTS = ROOT / "benchmarks" / "results" / "replay_cost"
PATH_RESULTS = ROOT / "benchmarks" / "results" / "replay_path"

h200 = json.loads((RESULTS / "results.json").read_text())
env, rows = h200["environment"], h200["rows"]
print(f"{env['device']}, driver {env['driver']}, torch {env['torch']}, triton {env['triton']}, "
      f"flashinfer {env['flashinfer']}; {env['pinning']}; {len(rows)} points")


def show(fig, name):
    path = viz.save(fig, FIGURES / f"05_{name}.png")
    display(Image(filename=str(path)))


def point(backend, variant, mode, bs, ctx=512):
    return next(r for r in rows if (r["backend"], r["variant"], r["mode"], r["bs"],
                                    r["context"]) == (backend, variant, mode, bs, ctx))


# %% [markdown]
# ### The runner's two loops, as code
#
# On the left, `GraphRunner.capture`: it runs once, before serving, over the batch sizes largest
# first. On the right, what runs on *every* step: `GraphRunner._replay` and the input copy it
# calls, `load_inputs`. This is the source of `refimpl/graphs/runner.py` as it is now (read with
# `inspect`, docstrings trimmed); the tags on the right edge are this notebook's, numbered as
# the four parts above.
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
                ("self.validate(fb)", "1. validation"),
                ("self.pick_bs(", "smallest captured bs >= raw bs"),
                ("self.load_inputs(fb, bs)", "2. input copies, padded rows reset"),
                ("self.replay_hook(fb, bs)", "3. the replay hook"),
                ("self.launch(bs)", "4. launch: graph.replay()"),
                ("return out[", "the live rows of the static output"),
                ("torch._foreach_copy_(", "2. live rows and padded rows' values, one launch"),
                ("host_live.copy_(", "2. host mirror of seq_lens"),
                ("host_pad.fill_(", "2. pad the host mirror"),
            ],
        ]
    ],
)
display(runner_code)

# the order the tags describe is the order of the code shown
cap = [runner_code.position(0, 0, t) for t in ("largest first", "every row a padded row",
                                               "backend capture hook (outside the graph)", "warm-up",
                                               "record the step")]
rep = [runner_code.position(0, 1, t) for t in ("1. validation", "smallest captured bs >= raw bs",
                                               "2. input copies, padded rows reset", "3. the replay hook",
                                               "4. launch: graph.replay()", "the live rows of the static output")]
assert cap == sorted(cap) and rep == sorted(rep)

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
#   kernel, and a `copy_`), FlashInfer's decode hook 9 ops plus its fast re-plan on the host,
#   FlashInfer's verify hook over 30 small ops around its fast re-plan (section 4). The GPU
#   runs each of these in a few µs; the host spends far longer issuing them.
# * **The launch** is one `graph.replay()`, whatever the graph holds: the same for every
#   backend.
# * **The copies** were one `torch._foreach_copy_` over int64 and int32 tensors plus the host
#   mirror of `seq_lens`; a list of mixed dtypes is not PyTorch's fast path, so it launched one
#   copy per tensor (5-8). They are now one launch over byte views. SGLang's runner
#   issues one `copy_` per input (newer upstream registers its input buffers);
#   this, the kernel ops called directly outside any dispatch mode and the host indptrs fed to
#   FlashInfer's draft-extend plans are refimpl's choices, listed in
#   [the differences table](../docs/sglang_facts.md#where-refimpl-deliberately-differs-from-upstream).
# * **Validation** reads device tensors back to check them (request indices, cache-slot
#   ownership, host/device agreement): each read is a synchronisation, which is why it is
#   off in timing runs and reported apart.
#
# The absolute numbers belong to that machine: on it `graph.replay()` alone took 4–59 µs of
# host time (median 7 µs; 2.4 µs was measured on an earlier H200 lease), and one small eager
# op about 3–5 µs. Compare parts and shapes with each other, not with another machine. With
# 30 repeats per point the sweep is noisy (the same hook can read 1.5x apart at neighbouring
# batch sizes); the tables in sections 3 and 4 repeat 300–600 times.

# %% [markdown]
# ## 2. Faithful, fused, in-graph
#
# The faithful Triton hook (`unified`) is SGLang's: a `cumsum` into `kv_indptr`, then the
# indices kernel, then the split-count heuristic, each a launch. `fused` does the same work
# in **one** Triton kernel (`refimpl/kernels/fused_metadata.py`): every program reads all the
# batch's lengths, computes its own offset, copies its request's slots and writes its split
# count. `in_graph` records that kernel **inside** the graph, reading the runner's static
# inputs, so its replay hook only re-points to the captured views
# ([facts](../docs/sglang_facts.md#fused-and-in-graph-metadata)).

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
# ## 3. Glue: the hook replayed from a graph of its own
#
# SGLang 0.5.23 can do without a new kernel: it captures the faithful replay hook, unchanged,
# into a small **metadata glue graph** per batch size and replays that before the step graph
# ([facts](../docs/sglang_facts.md#metadata-glue-graph)). refimpl's runner does the same with
# `GraphRunner(glue=True)`. The four shapes side by side, measured on the H200 at context 4096
# (`benchmarks/replay_table.py`, medians of 600, pinned; `benchmarks/results/replay_path/`):

# %%
table = json.loads((PATH_RESULTS / "replay_table.json").read_text())
t_env, t_rows = table["environment"], table["rows"]
shapes = {"faithful": "triton/unified/decode", "fused": "triton/fused/decode",
          "in-graph": "triton/in_graph/decode", "glue": "triton/unified+glue/decode"}
print(f"{t_env['device']}, driver {t_env['driver']}, torch {t_env['torch']}; context {t_env['context']}; "
      f"{t_env['pinning']}; host µs")
print(f"{'decode':<10} {'hook bs 1 / 8 / 64':>22} {'copies':>7} {'launch':>7} {'whole path bs 1 / 8 / 64':>26}")
for label, key in shapes.items():
    r = t_rows[key]
    hook = " / ".join(f"{r[b]['hook']:.1f}" for b in ("1", "8", "64"))
    path = " / ".join(f"{r[b]['path']:.1f}" for b in ("1", "8", "64"))
    print(f"{label:<10} {hook:>22} {r['8']['copies']:7.1f} {r['8']['launch']:7.1f} {path:>26}")

fig, ax = plt.subplots(figsize=(7.5, 2.8))
for i, key in enumerate(shapes.values()):
    left = 0
    for part, colour in (("copies", "#9ecae1"), ("hook", "#fd8d3c"), ("launch", "#74c476")):
        width = t_rows[key]["8"][part]
        ax.barh(i, width, left=left, color=colour, label=part if i == 0 else None)
        left += width
    ax.text(left + 3, i, f"{left:.0f} µs", va="center", fontsize=8)
ax.set_yticks(range(len(shapes)), list(shapes))
ax.invert_yaxis()
ax.set_xlabel("host µs, Triton decode, bs 8, context 4096")
ax.set_title(f"Four shapes of one replay hook ({t_env['device']})", fontsize=10)
ax.legend(loc="lower right", fontsize=8)
show(fig, "glue_shapes_h200")
assert set(t_rows["triton/unified+glue/decode"]["replays"]) == {"glue"}  # every timed replay went through it

# %% [markdown]
# The glued hook costs one small graph launch (about 4 µs) whatever it does inside, and it runs
# SGLang's own code unchanged. The catch is what a graph freezes: every value the hook computes
# in Python, and every tensor it reads that is not one of the runner's static inputs. Upstream
# asks each backend to declare itself safe (`supports_metadata_glue`), because of a failure its
# own comment describes: a host-written value frozen into the glue graph, capture succeeds,
# the outputs stay correct, only the accept length collapses.
#
# refimpl does not take a declaration. The checker's verdict (e) captures the hook into a glue
# graph once, replays rotated batches through it in turn, and compares the state the graph
# reads with what the eager hook leaves after each. Here is the upstream failure, planted in the
# example backend (`tests/broken_backends.py`): the replay hook writes the last `kv_indptr`
# entry from `seq_lens_sum`, a Python int the host wrote.

# %%
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the example backend, and the planted one beside the tests
planted = load_backend_class("broken_backends:HostValueInHook")
print(inspect.getsource(planted.load().init_forward_metadata_replay_cuda_graph))
rig = Rig.build(planted, KINDS["decode"], SpecConfig(num_steps=3, topk=1, num_draft_tokens=4),
                make_engine("cpu-emulator"), capture_bs=(1, 2, 4), max_context_len=32, glue=True)
fb = rig.gen.for_mode(KINDS["decode"], 3, seq_lens=[5, 9, 7])  # replayed by the bs-4 graph
graph_out = rig.runner.replay(fb).clone()
read = rig.backend.cuda_graph_kv_indptr[:5].tolist()
outputs_equal = torch.allclose(graph_out, rig.runner.eager(fb), atol=1e-4, rtol=1e-4)
print(f"glued replay of 3 requests in the bs-4 graph: outputs equal eager: {outputs_equal}")
print(f"kv_indptr the graph reads: {read}  (the eager hook writes [0, 5, 14, 21, 22])")
assert outputs_equal and read == [0, 5, 14, 21, 4]
checked = run_checks(modes=["decode"], engine="cpu-emulator", entries=[planted],
                     settings=CheckSettings(max_context_len=32, history=False))
for r in checked:
    print(f"bs {r.bs}: verdicts (a)-(d) pass: {r.passed}; glue verdict: {r.glue_equals_eager}")
    print("\n".join(f"    {f}" for f in r.glue_findings))
assert all(r.passed and r.glue_equals_eager is False for r in checked)
assert all(any("): kv_indptr:" in f for f in r.glue_findings) for r in checked)

# %% [markdown]
# Outputs equal, state wrong, caught: the frozen entry ends the *padded* row's range, so the
# live rows' outputs are right, and only the state comparison sees it, naming the buffer. The
# same verdict passes Triton's faithful decode hook and fails its target-verify hook (which
# copies the batch's tree mask: the glue graph would replay the capture's mask); it refuses
# FlashInfer's hooks outright, because `plan()` computes the work partition on the host. The
# capability matrix in the README has a glue column filled from this verdict.

# %% [markdown]
# ## 4. Graph vs eager, the whole step
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
# Where the ratio is small, the hook says why: FlashInfer's hooks re-plan on the host every
# replay, so the graph step keeps much of the eager step's host work; the ratio also shrinks
# at large batch sizes and long contexts, where the GPU work grows and the host part does not.
# The in-graph shape is the largest win because it leaves the host nothing but the copies and
# one launch.
#
# SGLang's FlashInfer verify and draft-extend hooks are a full `plan()` every replay (device
# indptrs read back to the host, the tree mask packed into bits behind a device read of its
# size). refimpl's `unified` shape re-plans them fast instead
# ([facts](../docs/sglang_facts.md#flashinfer-wrappers-and-update-path)): the kernels write the
# bound kv buffers, the mask is packed on the device with offsets computed on the host, and
# only the kernel module's scheduling call is left (`fast_prefill_plan`). `legacy` keeps the
# full plan. Both, with each hook's parts timed alone, from `benchmarks/flashinfer_replan.py`
# on the H200 (300 repeats per point, pinned; two runs in one lease):

# %%
replan_dir = ROOT / "benchmarks" / "results" / "flashinfer_replan"
replan = [json.loads((replan_dir / f"replan_{k}.json").read_text())["rows"] for k in ("A", "B")]
print(f"{'row':<38} {'hook bs 1/8/64, run A':>22} {'run B':>18} {'plan alone (B)':>16} {'eager/graph bs 1':>17}")
for row in replan[0]:
    each = lambda run, k, row=row: " / ".join(f"{run[row][bs][k]:.0f}" for bs in ("1", "8", "64"))
    ratio = " / ".join(f"{run[row]['1']['eager_over_graph']:.1f}x" for run in replan)
    print(f"{row:<38} {each(replan[0], 'hook'):>22} {each(replan[1], 'hook'):>18} "
          f"{each(replan[1], 'plan'):>16} {ratio:>17}")
# what the text below says, in both runs: the fast verify hook beats the full plan at every bs, and its step gains
for run in replan:
    fast, full = run["flashinfer/unified/target_verify"], run["flashinfer/legacy/target_verify"]
    assert all(fast[bs]["hook"] < full[bs]["hook"] for bs in ("1", "8", "64"))
    assert fast["1"]["eager_over_graph"] > full["1"]["eager_over_graph"]

# %% [markdown]
# The fast re-plan cuts FlashInfer's verify hook to 0.2–0.55 of the full plan's time, and the
# graph step gains with it (2.9x and 3.2x over eager at bs 1, from 1.9x and 1.3x);
# FlashInfer-MLA's prefill plan had little to cut (its full plan already got host indptrs). What
# is left is host work: 80–89 µs for the two kernels that fill the kv buffers (`cumsum` and the
# indices kernel, launched from Python), 119–157 µs for the fast verify plan (the mask's packing
# and offsets, one host-to-device copy each, and the scheduling call), and the Python around
# them.

# %% [markdown]
# ## 5. Capture: time and memory
#
# A graph per batch size costs capture time (the first capture in a process includes the JIT
# compilation of every kernel) and memory: the static buffers (sized once for the largest
# batch) and the graph pool's growth per captured size.

# %%
show(viz.draw_capture_cost(rows, env, 512), "capture_cost_h200")

# %% [markdown]
# ## 6. Before and after the replay-path work
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
# ## 7. Live, on a GPU
#
# On a GPU this cell runs a short sweep of the three Triton shapes and every one the checker
# proves glue-safe, glued (decode, context 512).

# %% tags=["gpu"]
if torch.cuda.is_available():
    settings = bench.BenchSettings.for_device(
        True, backends=["triton"], modes=["decode"], batch_sizes=(1, 8, 64), contexts=(512,),
        repeats=20, warmup=5, rotate=2, glue=True)
    for r in bench.sweep(settings):
        print(f"triton/{r['variant']:<14} bs {r['bs']:>3}: hook {r['host_us']['hook']['median']:.0f}"
              f" us, copies {r['host_us']['copies']['median']:.0f} us, graph step "
              f"{r['step_us']['graph']['median']:.0f} us vs eager "
              f"{r['step_us']['eager']['median']:.0f} us")

# %%
elapsed = time.perf_counter() - NOTEBOOK_T0
print(f"notebook ran in {elapsed:.1f} s")
