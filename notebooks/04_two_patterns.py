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
# # Two patterns: one code path for capture and replay
#
# Reading time: about 20 minutes. Run All takes about 15 s on a 2-core CPU.
#
# **The question:** how did SGLang's refactor make a backend's capture and replay paths one code path, and what must
# a FlashInfer replay still do, every time?
#
# An [attention backend](../docs/glossary.md#attention-backend) fills the graph's
# [metadata](../docs/glossary.md#metadata) in a [capture hook](../docs/glossary.md#capture-hook) once per [captured
# size](../docs/glossary.md#captured-size) and a [replay hook](../docs/glossary.md#replay-hook) before every replay.
# Before [#26665](https://github.com/sgl-project/sglang/pull/26665) these were two copies, and they drifted (notebook
# 03). The shapes, before and after ([facts](../docs/sglang_facts.md#pattern-vocabulary)):
#
# | pattern | capture hook | replay hook | in refimpl |
# |---|---|---|---|
# | [**C**](../docs/glossary.md#pattern-c) (before) | its own filling | a second copy | `legacy` variants |
# | [**A**](../docs/glossary.md#pattern-a) | the replay body, then *freeze* views of the [static buffers](../docs/glossary.md#static-buffer) | the one body | Triton, Wave, torch_native |
# | [**B**](../docs/glossary.md#pattern-b) | *prepare* [wrappers](../docs/glossary.md#wrapper) bound to the static buffers, the replay body, a capture-only tail | the one body: write the buffers, re-plan | FlashInfer; FlashInfer-MLA `unified` (refimpl's) |
# | **C, merged branches** | two bodies, each merging identical verify and draft-extend branches | its own body | FlashInfer-MLA `as-upstream` |
#
# With A or B, capture leaves by construction what replay leaves. Helpers: `refimpl/course/patterns.py`.

# %%
import re

import torch

from refimpl import ForwardMode, GraphConfig, ModelConfig
from refimpl.backends import find
from refimpl.backends.flashinfer import FlashInferAttnBackend
from refimpl.batch import World
from refimpl.batchgen import BatchGenerator
from refimpl.check import CheckSettings, check_entry_mode
from refimpl.course import patterns, render, show
from refimpl.flashinfer_wrappers import read_partition
from refimpl.flashinfer_wrappers.fast_plan import fast_decode_plan
from refimpl.graphs import CPUEmulatorEngine
from refimpl.graphs.runner import GraphRunner
from refimpl.model import TinyDecoder

# %% [markdown]
# ## 1. The three shapes, side by side
#
# Capture hooks above replay hooks, read from the classes now (B's tail: section 4; C's tags: notebook 03's drifts).
# [refimpl's own](../docs/sglang_facts.md#where-refimpl-deliberately-differs-from-upstream): A's v2
# `max_extend_len` (N), B's host indptrs for verify and draft extend.

# %%
render(patterns.side_by_side())

# %% [markdown]
# ## 2. FlashInfer before and after: duplication, not divergence
#
# Legacy FlashInfer dispatched on the modes in both hooks: upstream, about 240 duplicated lines
# ([facts](../docs/sglang_facts.md#what-26665-changed)). In refimpl:

# %%
print(patterns.dispatch_table())

# %% [markdown]
# The legacy copies agree: the checker ([verdicts](../docs/glossary.md#verdicts)) finds nothing for a batch of 3
# [padded](../docs/glossary.md#padding) to 4:

# %%
one_graph = CheckSettings(capture_bs=(4,), raw_bs=(3,), max_context_len=40, glue_replays=0, history=False)
for mode in ("decode", "target_verify", "draft_extend"):
    (rec,) = check_entry_mode(find("flashinfer", "legacy")[0], mode, CPUEmulatorEngine(), one_graph)
    print(f"flashinfer legacy {mode}: {rec.status}, findings {rec.findings}")
    assert rec.passed and not rec.findings

# %% [markdown]
# ## 3. Plan state: what the captured run reads
#
# A graph captured around `wrapper.run()` freezes one wrapper: its bound buffers' addresses, its workspace, its kernel
# module. The next batch reaches it two ways ([facts](../docs/sglang_facts.md#flashinfer)):
#
# * [`plan()`](../docs/glossary.md#plan) writes host-computed tiles (`request_indices`, `kv_tile_indices`,
#   `kv_chunk_size`; `scheduler.cuh`) into the workspace.
# * The kernel runs those tiles but takes each request's key range from the bound `kv_indptr` and last-page length
#   (`paged_kv_t::get_length`, `page.cuh`; paged prefill its query rows from the bound `qo_indptr` too). With
#   [split-KV](../docs/glossary.md#split-kv), which graph mode uses (CUDA-core decode: unless the batch alone fills
#   the GPU), it reads no further than the tiles reach: the planned length rounded up to a kv chunk, by default at
#   least 128 keys at page size 1.
#
# refimpl's stand-ins (`refimpl/flashinfer_wrappers/standin.py`) do the same, with 128-key chunks. Live, on the
# [CPU graph emulator](../docs/glossary.md#cpu-graph-emulator): decode graphs for bs 4, contexts up to 160.

# %%
emu, cfg, L = CPUEmulatorEngine(), ModelConfig(), 160  # 2 layers, 4 query and 2 KV heads
world = World.create(cfg, max_context_len=L, pool_size=16, device=emu.device)
world.randomize_kv(0)
fi = FlashInferAttnBackend(world, None, prefer_real=False)  # the stand-ins, on any machine
graphs = GraphConfig(max_bs=4, capture_bs=(4,), max_context_len=L)
runner = GraphRunner(TinyDecoder(cfg, emu.device), fi, emu, ForwardMode.DECODE, graphs)
runner.capture()
w4, gen = fi.decode_cuda_graph_metadata[4][0], BatchGenerator(world, None, seed=1)

fb = gen.decode(3, seq_lens=[30, 5, 17])
graph_out = runner.replay(fb).clone()  # the replay hook writes the bound buffers and re-plans
assert torch.allclose(graph_out, runner.eager(fb), atol=1e-4)
print("bound kv_indptr", fi.kv_indptr[:5].tolist(), "| planned kv_len", read_partition(w4)[1].tolist())
panels = [("1. bound buffers and plan current: right", *patterns.key_spans(w4, fb))]

# %% [markdown]
# **A stale bound indptr.** Overwrite it by hand and replay, no new plan:

# %%
fi.kv_indptr[1:5] = torch.arange(1, 5, dtype=torch.int32)  # by hand; the plan still says [30, 5, 17, 1]
runner.graphs[4].replay()
assert not torch.allclose(runner.outputs[4][:3], graph_out, atol=1e-4)  # the kernel read the bound indptr
panels.append(("2. bound kv_indptr overwritten by hand, no plan(): the kernel follows it", *patterns.key_spans(w4, fb)))

# %% [markdown]
# **A skipped plan.** The replay hook writes the bound buffers, but `plan()` does nothing: the partition stays one
# 128-key tile per request.

# %%
fast_plan = w4.plan
w4.plan = lambda *args, **kwargs: None  # a replay hook that forgot to re-plan
for lens in ([100, 5, 17], [150, 5, 17]):
    fb2 = gen.decode(3, seq_lens=lens)
    right = torch.allclose(runner.replay(fb2), runner.eager(fb2), atol=1e-4)
    print(f"seq_lens {lens}, planned kv_len {read_partition(w4)[1].tolist()}: graph == eager {right}")
    panels.append(
        (
            f"{len(panels) + 1}. plan() skipped, seq_lens {lens}: "
            + ("right, by luck" if right else "request 0's keys past the 128-key tile are not read"),
            *patterns.key_spans(w4, fb2),
        )
    )
w4.plan = fast_plan
assert torch.allclose(runner.replay(fb2), runner.eager(fb2), atol=1e-4)  # re-planned: right again
show(patterns.draw_plan_state(panels), "04_plan_state")

# %% [markdown]
# So Pattern B's replay must do both: write the bound buffers **and** re-plan. A skipped plan hides while requests
# are short; until [#18769](https://github.com/NVIDIA/TensorRT-LLM/pull/18769), TensorRT-LLM's replays with several
# decode wrappers reused a warm-up batch's plan. FlashInfer's MLA kernels (fa2, fa3) differ (notebook 03): they take
# key ranges from the plan's work list and, of the bound buffers, only `kv_indices`, so FlashInfer-MLA's stale bound
# `kv_indptr` (#37975) is harmless to them; a skipped plan is not.
#
# ## 4. What the fast re-plan skips
#
# Every replay pays a `plan()`. refimpl's fast decode plans (`fast_plan.py`, after SGLang's `fast_decode_plan` /
# `fast_mla_decode_plan`) keep only its last step:
#
# | the full `plan()`... | why the [fast plan](../docs/glossary.md#fast-plan) may skip it |
# |---|---|
# | copies the indptr device → host | the caller passes a host indptr from `seq_lens_cpu`; for MLA the copy hung replay ([#3987](https://github.com/sgl-project/sglang/pull/3987)) |
# | copies the batch into the bound buffers | the caller wrote them in place: checked by address |
# | selects (first time: compiles) the kernel module | the capture's full plan did |
# | synchronises the stream | the partition reaches the workspace in stream order |
#
# The address check, live:

# %%
host_indptr = torch.tensor([0, 150, 155, 172, 173], dtype=torch.int32)  # the last batch, as the hook built it
try:
    fast_decode_plan(
        w4,
        host_indptr,
        torch.ones(4, dtype=torch.int32),
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        1,
        q_data_type=cfg.dtype,
        indptr=fi.kv_indptr[:5].clone(),
    )
except ValueError as e:
    print(re.sub(r" \(data_ptr[^)]*\)", "", str(e)))  # addresses change run to run

# %% [markdown]
# ### What it saves on an H200
#
# `benchmarks/plan_cost.py` timed both decode plans with the real FlashInfer in two runs (host µs per call, median of
# 300, context 4096):

# %%
bench = patterns.plan_cost()
print(*patterns.plan_cost_summary(bench), sep="\n")
show(patterns.draw_plan_cost(bench), "04_plan_cost_h200")

# %% [markdown]
# In both runs the fast decode plan costs about a quarter of the full one, the MLA one a third to three fifths.
#
# ### Exercise (about 6 minutes): which verdict catches a replay that never re-plans?
#
# `PlansOnce` is unified FlashInfer whose wrappers stop planning after capture; its replay hook still writes the
# bound buffers. Predict the failing verdicts with contexts up to 48 keys (the default) and up to 200.


# %%
class PlansOnce(FlashInferAttnBackend):
    variant = "plans-once"

    def init_forward_metadata_capture_cuda_graph(self, bs, *args):
        super().init_forward_metadata_capture_cuda_graph(bs, *args)  # plans the capture batch
        for w in self.decode_cuda_graph_metadata[bs]:
            w.plan = w.begin_forward = lambda *args, **kwargs: None  # later replays: buffers written, no plan


predict = {48: None, 200: None}  # <- change this: the failing verdicts at each context, e.g. {"b"} or set()

# %% jupyter={"source_hidden": true}
# Solution (expand to read)
# (a) and (d) compare the bound buffers, which the hook still writes; the partition is not among them. The stale
# plan is the capture batch's (short requests: one 128-key tile each), so at 48 keys every request fits and every
# verdict passes. At 200 a request outgrows its tile: graph != eager, (b), and in the history of replays, (f).
failed = {ctx: patterns.failed_verdicts(PlansOnce, "decode", ctx) for ctx in (48, 200)}
print({ctx: sorted(v) for ctx, v in failed.items()})
assert failed == {48: set(), 200: {"b", "f"}}
assert all(p is None or p == failed[ctx] for ctx, p in predict.items()), f"the checker says {failed}"

# %% [markdown]
# Test a Pattern B backend with requests longer than a kv chunk.
#
# ## Summary
#
# | pattern | what keeps capture = replay | failure mode when it is missing |
# |---|---|---|
# | **C** | nothing: two copies kept in step by hand | drift: benign if the kernel re-reads a buffer replay refills (Wave's split counts), wrong if the graph baked a layout in (Triton's draft-extend `qo_indptr`) |
# | **A** | one filling body | – |
# | **B**, FlashInfer | one body that writes the bound buffers and re-plans | a stale bound indptr: other keys read; a skipped plan: right while requests fit the last plan's tiles, wrong after |
# | **B**, FlashInfer-MLA (refimpl's) | the same | a skipped plan: the stale work list's key ranges; a stale bound `kv_indptr` is unread by the MLA kernel, seen only by verdict (a) (#37975) |
#
# **Next, notebook 05:** block-table MLA backends, and what SGLang #29077 saved on every draft-extend replay.
