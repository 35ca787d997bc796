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
# # The graph runner and the checker
#
# Reading time: about 18 minutes. Run All takes about 15 s on a 2-core CPU.
#
# An engine's [graph runner](../docs/glossary.md#graph-runner) (SGLang's `CudaGraphRunner`,
# [facts](../docs/sglang_facts.md#the-graph-runner)) applies notebook 00's rules to a real decode step. Then the six
# questions refimpl's checker asks of a backend, which the rest of the course uses.
#
# ## 1. The runner, in its own code
#
# `GraphRunner.capture` runs once, before serving; `GraphRunner._replay` runs for every batch:
#
# * **Static inputs** are allocated once for the largest batch; at rest every row is a
#   [padded row](../docs/glossary.md#padded-row).
# * **Capture**, per [captured size](../docs/glossary.md#captured-size), **largest first** so smaller graphs reuse the
#   larger ones' scratch in the one pool (notebook 00): the backend's
#   [capture hook](../docs/glossary.md#capture-hook) outside the graph, the [warm-up](../docs/glossary.md#warm-up)
#   (on a side stream, on CUDA), then the step recorded. `self.outputs[bs]` keeps each graph's output alive.
# * **Replay**: validate the batch, pick the smallest captured size that fits, copy the batch into the
#   [static inputs](../docs/glossary.md#static-inputs) (`runner.inputs`) and [pad](../docs/glossary.md#padding) the
#   rest, run the backend's [replay hook](../docs/glossary.md#replay-hook) (it refills the
#   [metadata](../docs/glossary.md#metadata) buffers the graph reads), launch.

# %%
import torch

from refimpl import ForwardMode, GraphConfig, ModelConfig, course
from refimpl.backends import BackendEntry
from refimpl.backends.torch_native import TorchNativeBackend
from refimpl.batch import World
from refimpl.batchgen import BatchGenerator
from refimpl.check import CheckSettings, run_checks
from refimpl.course.runner import failing, padding_figure, verdicts
from refimpl.graphs import make_engine
from refimpl.graphs.runner import GraphRunner
from refimpl.model import TinyDecoder

course.show_code(GraphRunner.capture, GraphRunner._replay)

# %% [markdown]
# ## 2. A real step, captured per batch size
#
# A `World` holds the request table `req_to_token`, the token-slot allocator and the [KV cache](../docs/glossary.md#kv-cache)
# (request row 0 and slot 0 are [reserved](../docs/glossary.md#reserved-slot) for padded rows). `TinyDecoder` is the
# step, with `TorchNativeBackend` (`refimpl/backends/torch_native.py`), a hello-world
# [attention backend](../docs/glossary.md#attention-backend): its hook packs each request's slots into
# [`kv_indptr` / `kv_indices`](../docs/glossary.md#kv_indptr--kv_indices). Each graph holds the whole step, with one
# attention kernel (`refimpl.*`) per layer.

# %%
engine = make_engine("auto")  # the CPU emulator here, CUDA graphs on a GPU
cfg = ModelConfig()  # MHA: 2 layers, 4 query heads, 2 KV heads
world = World.create(cfg, max_context_len=48, pool_size=24, device=engine.device)
world.randomize_kv(0)
backend = TorchNativeBackend(world, None)
graphs = GraphConfig(max_bs=8, capture_bs=(1, 2, 4, 8), max_context_len=48)
runner = GraphRunner(TinyDecoder(cfg, engine.device), backend, engine, ForwardMode.DECODE, graphs)
records = runner.capture()
ops = runner.graphs[8].kernels()
print(f"{engine.name}: captured bs {[r.bs for r in records]}; the bs-8 graph replays {sum(ops.values())} ops:")
print({k: n for k, n in ops.items() if "mm" in k or k.startswith("refimpl")})
assert [r.bs for r in records] == [8, 4, 2, 1] and ops["refimpl.dense_paged_attention.default"] == cfg.num_layers

# %% [markdown]
# ## 3. Padding
#
# A decode batch of **3** requests has no graph of its own: the runner picks 4, copies the 3 rows in, and pads the
# fourth with the [fill value](../docs/glossary.md#fill-value) 1 as its length, request row 0 and cache slot 0. It
# attends over one reserved token, writes its KV into slot 0, and its logits are dropped. The returned logits view the
# graph's static output and equal an eager run. In the course's buffer figures, each live request has its own light
# colour, padded rows are orange, cells this graph size does not read light grey, stale values hatched grey; a red frame
# marks a wrong cell.

# %%
gen = BatchGenerator(world, None, seed=1)
fb = gen.decode(3)
res = runner.run(fb)
print(f"used_graph={res.used_graph}, graph_bs={res.graph_bs}, seq_lens {fb.seq_lens.tolist()}")
assert res.used_graph and res.graph_bs == 4
assert res.logits.data_ptr() == runner.outputs[4].data_ptr(), "the logits view the static output"
assert torch.allclose(res.logits, runner.eager(fb), atol=1e-4)
static = runner.inputs  # row 3 is the padded row: seq_len 1 (the fill value), request slot 0, cache slot 0
assert static.seq_lens[3] == 1 and static.req_pool_indices[3] == 0 and static.out_cache_loc[3] == 0
course.show(padding_figure(runner, 3), "01_runner_padding")

# %% [markdown]
# **Is padding safe?** Only if the padded row never writes a live request's KV. The checker's
# [KV guard](../docs/glossary.md#kv-guard) checks it on every replay: snapshot the live slots the batch must not write,
# replay, compare.

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
# ## 4. The six questions the checker asks
#
# `python -m refimpl check` (`refimpl/check.py`) asks, per backend, [graph kind](../docs/glossary.md#graph-kind) and
# raw batch size (default 3, padded to 4; `--all`: 1 to 4):
#
# | verdict | compares | catches |
# |---|---|---|
# | **(a)** capture path = replay path | two fresh backends, one padded batch: **P** runs the capture hook on it; **Q** runs the capture hook on the runner's all-padded capture batch, then the replay hook on it. Their graph-read state (`graph_state`), buffer by buffer | two hook bodies that drifted; a value only one path fills; a value [stale from capture](../docs/glossary.md#stale-from-capture) |
# | **(b)** graph = eager | the replayed graph's output against an eager run, plus the KV guard | anything that changes a live request's output; writes into another request's KV |
# | **(c)** eager = oracle | eager against a dense float64 [oracle](../docs/glossary.md#oracle) | wrong kernel math or eager metadata |
# | **(d)** replay = reference | Q's state against the backend's [reference state](../docs/glossary.md#reference-state), built from the batch alone | a bug in a body both paths share (Pattern A: notebook 04) |
# | **(e)** glue | the replay hook captured into a [glue graph](../docs/glossary.md#glue-graph) and replayed for new batches, against the eager hook | *informational*: whether the hook may be replayed from a graph (notebook 06) |
# | **(f)** history | A, the largest size's replay, then: A's lengths, other requests (and trees); B, A's size, other lengths; C, the other graphs; 20 replays through the smallest. Each held to (b) and (c) | a replay that depends on the ones before (a refresh skipped when "nothing changed": notebook 07) |
#
# On the hello-world backend, in decode and speculative target verify:

# %%
rows = run_checks(backends=["torch_native"], modes=["decode", "target_verify"], settings=CheckSettings())
for r in rows:
    print(verdicts(r))
assert all(r.passed for r in rows) and not failing(rows)
gen.release_all()

# %% [markdown]
# Target verify shows `(e) no`: its hook copies each batch's tree mask, which a glue graph would freeze. Both rows pass.
#
# ### Exercise (about 6 minutes): predict which verdicts catch a rebound buffer
#
# `Rebinds` plants notebook 00's stale-buffer bug in the hello-world backend: its replay hook makes `cuda_graph_kv_indptr`
# a fresh tensor before filling it, so the captured graph keeps reading the old one. Which of (a)-(d) and (f) fail? Set
# `prediction` to your letters, then open the solution.


# %%
class Rebinds(TorchNativeBackend):
    name = "rebinds"

    def init_forward_metadata_replay_cuda_graph(self, bs, *args):
        self.cuda_graph_kv_indptr = torch.zeros_like(self.cuda_graph_kv_indptr)  # a fresh tensor every replay
        super().init_forward_metadata_replay_cuda_graph(bs, *args)


prediction = {"b"}  # <- change this

# %% jupyter={"source_hidden": true}
# Solution (expand to read)
found = run_checks(
    modes=["decode"], entries=[BackendEntry.from_class(Rebinds, "__main__:Rebinds")], settings=CheckSettings(glue_replays=0)
)
for r in found:
    print(verdicts(r), *[f for f in r.findings if f.startswith("kv_indptr:")][:1], sep="\n    ")
print("failing:", sorted(failing(found)), "| your prediction:", sorted(prediction))
# (a): Q's graph reads the tensor its capture froze, which still holds the capture batch: stale from capture.
# (d): the same state against the reference. (b): rebinding freed the tensor the graph reads, and the checker's engine
# (CPU emulator or CUDA, `make_engine(liveness=True)`) refuses that replay (liveness, notebook 00): (b) fails and (c),
# eager against the oracle, is not asked ("-"). Without the rule the graph would compute with the stale kv_indptr.
assert {"a", "b", "d"} <= failing(found) and "c" not in failing(found)

# %% [markdown]
# **Next: 02, Triton through every mode**: speculative decoding's graph modes on one real backend, and the buffers its
# hook refills in each.
