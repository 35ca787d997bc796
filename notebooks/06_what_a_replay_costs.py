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
# # What a replay costs
#
# Reading time: about 17 minutes. Run All takes about 15 s on a 2-core CPU.
#
# **When is a replay's host time on the critical path?** A [replay](../docs/glossary.md#replay) first works on the
# host: it validates the batch, copies it into the [static inputs](../docs/glossary.md#static-inputs), runs the
# [replay hook](../docs/glossary.md#replay-hook) that refills the [metadata](../docs/glossary.md#metadata), and calls
# `graph.replay()` (`GraphRunner._replay`, notebook 01). A step is [host-bound](../docs/glossary.md#host-bound) when
# that host work outlasts the GPU work it launches: the GPU waits. It is [GPU-bound](../docs/glossary.md#gpu-bound)
# when the GPU work is longer, and the host time hides only **if the host runs ahead**, preparing step N+1 while the
# GPU runs step N, as SGLang's overlap scheduler does
# ([SGLang v0.4](https://lmsys.org/blog/2024-12-04-sglang-v0-4/#zero-overhead-batch-scheduler)). A step costs
# host + GPU, or max(host, GPU) when the host runs ahead. So replay host time matters when the GPU step is short (a
# small model, the one-layer [EAGLE](../docs/glossary.md#eagle) draft head, a small batch) or nothing runs ahead.
#
# The refimpl numbers below were measured on an H200 (`benchmarks/results/`). The live cells run on the
# [CPU graph emulator](../docs/glossary.md#cpu-graph-emulator): it counts launches; its timings mean nothing for a GPU.

# %%
import torch

from refimpl import course
from refimpl.check import CheckSettings, run_checks
from refimpl.course import costs

# %% [markdown]
# ## 1. What one launch costs
#
# The [launch cost](../docs/glossary.md#launch-cost) of each item, from `launch_cost/launch_cost.json`
# (`benchmarks/launch_cost.py`, pinned to one core):

# %%
course.show(costs.draw_launch_costs(), "06_launch_costs_h200")

# %% [markdown]
# Each kernel launch costs the host several times the 1.1 µs the tiny kernel runs on the GPU: small kernels launched
# one by one make a host-bound step. About 20 µs of refimpl's kv-index builder, as a hook calls it, is its own
# argument checks (`build_kv_indices`; the folder's README), not the launch. `graph.replay()` costs about the same for
# 1 kernel or 64.
#
# ## 2. A replay hook, added up
#
# Four shapes of the Triton decode hook ([facts](../docs/sglang_facts.md#fused-and-in-graph-metadata)): **faithful**
# (SGLang's: a `cumsum` into [`kv_indptr`](../docs/glossary.md#kv_indptr--kv_indices), the index builder, the
# split-count kernel); **fused** (refimpl's: one Triton kernel does all three);
# **[in-graph](../docs/glossary.md#in-graph)** (refimpl's: that kernel recorded in the step graph, the hook only
# re-points views); **glued** (the faithful hook replayed from a [glue graph](../docs/glossary.md#glue-graph)). Each
# hook's launches, priced with the costs above, against its measured time (`replay_path/replay_table.json`, context
# 4096, bs 1 / 8 / 64, medians of 600):

# %%
unit = costs.launch_costs()  # item -> (lowest, highest) host µs per call
measured = costs.measured_hooks()  # shape -> (lowest, highest) median host µs of the hook
for shape, ops in costs.hook_launches().items():  # counted here, on the emulator
    low, high = (sum(n * unit[costs.priced_as(op)][k] for op, n in ops.items()) for k in (0, 1))
    print(f"{shape:<9} {', '.join(ops) or 'nothing'}")
    print(f"{'':<9} priced {costs.span(low, high)} µs, measured {costs.span(*measured[shape])} µs")

# %% [markdown]
# Three shapes add up; the in-graph hook's 3 µs is the Python of calling a hook. The faithful hook does not. Taken
# apart (`launch_cost/hook_parts_h200.txt`, bs 8, on two cores), its pieces each cost more than one op:
# `kv_indptr[1:] = cumsum(...)` 30–44 µs (`cumsum` allocates an int64 result, then a converting copy fills the int32
# slice), the index builder 32–56 µs, the split counts 29–53 µs (a Triton launch behind its wrapper's checks); of the
# hook's 129–199 µs, the `[:bs]` views take 5–10 µs and 33–36 µs stay unattributed. The two cores read 1.5x apart.
#
# ## 3. Host-bound or GPU-bound
#
# Each shape's host path (copies + hook + launch) against the GPU time of the step graph (CUDA events), from
# `replay_cost/results.json` (context 512, refimpl's tiny 2-layer model, medians of 30):

# %%
course.show(costs.draw_host_vs_gpu(), "06_host_vs_gpu_h200")

# %% [markdown]
# The faithful path outlasts the tiny model's graph up to bs 64: host-bound. The fused path runs even with the GPU up
# to bs 8; the glued and in-graph paths are shorter at every size. The bench synchronises after every step, so the
# measured step is the sum:

# %%
print(costs.step_table("unified"))
for variant in costs.SHAPES.values():  # every Triton decode shape, every bs
    for p in costs.host_gpu(variant).values():
        assert 0.95 < p["step"] / (p["host"] + p["gpu"]) < 1.15  # nothing runs ahead: host + GPU

# %% [markdown]
# Running ahead would leave the faithful step host-bound up to bs 64 (`max`). A large model changes the picture: SGLang
# measured Llama-3-8B at bs 1 with the Triton backend at 7.06 ms per decode step with graphs, 9.28 ms without
# ([#1401](https://github.com/sgl-project/sglang/pull/1401)). A 240 µs host path adds about 3 % to a 7 ms step, or
# nothing once the host runs ahead.
#
# ## 4. Every backend, part by part
#
# One replay at bs 8, same file; the black bar is the graph's GPU time.

# %%
course.show(costs.draw_breakdown(), "06_replay_breakdown_h200")

# %% [markdown]
# The hook is long wherever a backend computes metadata on the host: FlashInfer re-plans every replay
# ([facts](../docs/sglang_facts.md#flashinfer-wrappers-and-update-path)): a 793 µs host path against 133 µs of GPU
# work for target verify. TRTLLM-MLA's decode is GPU-bound (72 against 141 µs). refimpl's batch validation, off here
# (`validate_inputs=False`), added 66–87 µs of host per replay (`fbe232b`, `3fb0c22`), never waiting for its device
# checks ([docs/reference.md](../docs/reference.md#bad-input)).
#
# Capture is paid once per batch size: 6–26 ms when warm at context 512 (`capture_s`). The memory column is not
# drawn: a `torch.cuda.memory_reserved` difference (`refimpl/graphs/cuda.py`) counts all the process's cached blocks
# (one capture: −27,918 MiB).
#
# ## 5. Glue: cheap, unless the hook computes on the host
#
# A glue graph freezes every value the hook computed in Python: capture succeeds, outputs stay correct, only the
# accept length collapses, as upstream's comment warns ([facts](../docs/sglang_facts.md#metadata-glue-graph)).
# Planted (`tests/broken_backends.py:HostValueInHook`): the replay hook writes the last `kv_indptr` entry from
# `seq_lens_sum`, a Python int.

# %%
planted = costs.planted_backend()
rig = costs.glued_rig(planted)  # graphs of bs 1, 2, 4 on the emulator, each hook in a glue graph
fb = rig.gen.decode(3, seq_lens=[5, 9, 7])  # replayed by the bs-4 graph
out = rig.runner.replay(fb).clone()
assert torch.allclose(out, rig.runner.eager(fb), atol=1e-4, rtol=1e-4)  # outputs equal
read = rig.backend.cuda_graph_kv_indptr[:5].tolist()
print(f"the graph reads kv_indptr {read}; the eager hook writes [0, 5, 14, 21, 22]")
assert read == [0, 5, 14, 21, 4]  # state wrong: the capture's sum, frozen
records = run_checks(
    modes=["decode"], engine="cpu-emulator", entries=[planted], settings=CheckSettings(max_context_len=32, history=False)
)
assert all(r.passed and r.glue_equals_eager is False for r in records)  # (a)-(d) pass, (e) refuses glue
print(next(f for f in records[-1].glue_findings if "kv_indptr:" in f))

# %% [markdown]
# The frozen entry ends the [padded row](../docs/glossary.md#padded-row)'s range, so live outputs stay right; verdict
# (e) compares the state and names the buffer.
#
# ### Exercise (about 6 minutes): predict which verify steps are host-bound
#
# A target-verify graph checks N = 4 draft tokens per request; the cell prints its GPU time. The faithful verify hook
# makes 11 launches (ten eager ops and the index builder), the fused hook one. From sections 1 and 2, predict at which
# of bs 1, 8, 64, 256 each step is host-bound.

# %%
print("GPU µs of the verify graph:", costs.gpu_line("unified", "target_verify"))
host_bound = {"faithful": None, "fused": None}  # <- change this: e.g. {"faithful": {1, 8, 64}, "fused": set()}

# %% jupyter={"source_hidden": true}
# Solution (expand to read)
# Faithful: ten eager ops (about 8 µs each) and the builder (34) price at about 115 µs; like the decode hook it
# measures about twice that (239-333 µs at context 512). With copies and the launch the path is 274-377 µs: longer
# than the GPU's 169 and 198 µs at bs 1 and 8, shorter than its 480 at bs 64. Fused: one kernel, a path of
# 104-123 µs, shorter than the GPU's 180 µs or more at every size.
answer = {"faithful": costs.host_bound("unified", "target_verify"), "fused": costs.host_bound("fused", "target_verify")}
print(costs.step_table("unified", "target_verify"))
print(f"fused: host-bound at {answer['fused'] or 'no size'}")
assert answer == {"faithful": {1, 8}, "fused": set()}
assert all(p is None or p == answer[k] for k, p in host_bound.items()), f"measured: {answer}"

# %% [markdown]
# ## Live, on a GPU
#
# This cell times the faithful decode hook's pieces one by one.

# %% tags=["gpu"]
if torch.cuda.is_available():
    print(costs.hook_parts())
