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
# # MLA backends and the redundant-copy removal
#
# Reading time: about 20 minutes. Run All takes about 20 s on a 2-core CPU.
#
# **The question:** what do the block-table MLA backends refill before each replay, and what did
# SGLang [#29077](https://github.com/sgl-project/sglang/pull/29077) save on each draft-extend replay?
#
# [MLA](../docs/glossary.md#mla) keeps one latent row per token. FlashInfer-MLA
# indexes it token by token (notebook 03); two of its subclasses
# index it through [block tables](../docs/glossary.md#block-table) of [pages](../docs/glossary.md#page):
# **Cutlass-MLA** (128-token pages, plain decode under graphs;
# [facts](../docs/sglang_facts.md#cutlass-mla)) and **TRTLLM-MLA** (32- or 64-token pages; decode,
# [target verify](../docs/glossary.md#target-verify), [draft extend](../docs/glossary.md#draft-extend)
# v2, [multi-step draft decode](../docs/glossary.md#multi-step-draft-decode);
# [facts](../docs/sglang_facts.md#trtllm-mla)). Their real kernels need Blackwell (SM100); refimpl
# calls its own Triton kernels with the same arguments
# ([differences](../docs/sglang_facts.md#where-refimpl-deliberately-differs-from-upstream)).

# %%
import torch

from refimpl import ForwardMode
from refimpl.backends import find
from refimpl.backends.cutlass_mla import CutlassMLAAttnBackend, CutlassMLAAttnBackendLegacy
from refimpl.backends.flashinfer_mla import FlashInferMLAAttnBackend
from refimpl.backends.trtllm_mla import TRTLLMMLAAttnBackend, TRTLLMMLAAttnBackendInGraph, TRTLLMMLAAttnBackendSimplified
from refimpl.bench import launches
from refimpl.check import CheckSettings, check_entry_mode
from refimpl.course import mla, show, show_code
from refimpl.graphs import CPUEmulatorEngine
from refimpl.graphs.runner import call_capture_hook, call_replay_hook
from refimpl.spec import DraftDecodeInput

CHAIN, device = mla.CHAIN, mla.DEVICE  # an EAGLE chain (S 3, N 4); the CPU here, CUDA on a GPU
ONE_GRAPH = CheckSettings(capture_bs=(4,), raw_bs=(3,), max_context_len=48, glue_replays=0, history=False)

# %% [markdown]
# ## 1. Block tables
#
# Position t of request i lives in [slot](../docs/glossary.md#slot) `table[i, t // P] * P + t % P`.
# Pages are aligned and contiguous ([facts](../docs/sglang_facts.md#memory-pools)), so an entry is a page's first
# slot in [`req_to_token`](../docs/glossary.md#req_to_token), divided by P:
# `table[i, p] = req_to_token[rpi[i], p * P] // P` for the `cdiv(len, P)` pages a request reads
# ([facts](../docs/sglang_facts.md#block-table-builder); Triton kernel `build_block_table`).
# Below, each backend's [capture hook](../docs/glossary.md#capture-hook) builds the table of requests of lengths
# P − 1, P and 2P + 1 (at most L = 160) into its [static buffer](../docs/glossary.md#static-buffer):

# %%
panels = []
for P, cls in ((32, TRTLLMMLAAttnBackend), (64, TRTLLMMLAAttnBackend), (128, CutlassMLAAttnBackend)):
    world, fb = mla.three_requests(P)
    backend = cls(world, CHAIN)
    backend.init_cuda_graph_state(4, 4)
    call_capture_hook(backend, fb)  # runs the replay body: the table is built in the static buffer
    table = backend.forward_metadata.block_kv_indices
    for i, (row, n) in enumerate(zip(fb.req_pool_indices.tolist(), fb.seq_lens.tolist())):
        pages = range(-(-n // P))
        assert table[i, : len(pages)].tolist() == [int(world.req_to_token[row, p * P]) // P for p in pages]
    panels.append((cls.name, P, world.req_to_token, fb.req_pool_indices, fb.seq_lens, table))
show(mla.draw_block_tables(panels), "05_block_tables")

# %% [markdown]
# The widths are upstream's, frozen: Cutlass `L // 128 + 1` pages; TRTLLM a multiple
# of `lcm(128 // P, 4096 // P)` pages (64 at P = 64, 128 at P = 32). Unread entries keep the
# initial value: 1 in Cutlass's graph table, −1 in TRTLLM's.
#
# ## 2. Cutlass-MLA: two details the refactor removed
#
# Before [#26665](https://github.com/sgl-project/sglang/pull/26665) Cutlass's two bodies
# ([Pattern C](../docs/glossary.md#pattern-c)) differed, invisibly in the output: (1) the replay asserts
# `seq_lens_cpu is not None`, never read, so a [Pattern A](../docs/glossary.md#pattern-a) capture, passing
# `seq_lens_cpu=None`, trips it; (2) the capture handles decode only when `spec_info is None`, the replay every
# decode.

# %%
legacy = CutlassMLAAttnBackendLegacy(mla.world(128), CHAIN)
legacy.init_cuda_graph_state(4, 4)
rpi, ones = torch.zeros(4, dtype=torch.int64, device=device), torch.ones(4, dtype=torch.int32, device=device)
try:  # (1) the replay body as a Pattern-A capture calls it
    legacy.init_forward_metadata_replay_cuda_graph(4, rpi, ones, None, None, ForwardMode.DECODE, None, None)
except AssertionError:
    print("(1) legacy replay with seq_lens_cpu=None: AssertionError")
else:
    raise RuntimeError("expected the unused assert to fire")
spec = DraftDecodeInput(topk=1, num_steps=3)  # (2) a decode capture with a spec input sets nothing
legacy.init_forward_metadata_capture_cuda_graph(4, 4, rpi, ones, None, ForwardMode.DECODE, spec)
assert legacy.forward_metadata is None
for variant in ("legacy", "unified"):  # neither detail changes what a decode graph reads
    (rec,) = check_entry_mode(find("cutlass_mla", variant)[0], "decode", CPUEmulatorEngine(), ONE_GRAPH)
    print(mla.verdict_line(rec))
    assert rec.passed

# %% [markdown]
# ## 3. TRTLLM-MLA: four shapes
#
# Its kernel takes `seq_lens` as device data and `max_seq_len` as a Python int, a
# [frozen value](../docs/glossary.md#frozen-value). Each shape subclasses the previous one
# ([facts](../docs/sglang_facts.md#trtllm-mla-before-26665-pattern-c)):
#
# * `legacy` (C, before [#21987](https://github.com/sgl-project/sglang/pull/21987)): capture freezes
#   `max_seq_len = seq_lens.max()`; draft-extend replay lays `cu_seqlens_q` out by accept lengths;
# * `unified` (A, after #26665): `max_seq_len_k = L`;
# * `simplified` (A, #29077): draft extend's redundant re-writes gone (section 4);
# * [`in_graph`](../docs/glossary.md#in-graph) ([#31628](https://github.com/sgl-project/sglang/pull/31628), open):
#   one fused kernel rebuilds the table and `seq_lens_k` inside the graph.
#
# The legacy capture batch has every row at the [fill value](../docs/glossary.md#fill-value) 1, so 1 is frozen;
# replay's new maximum goes to a Python attribute the recorded call never reads. refimpl's kernel reads no key past
# `max_seq_len`, so the graph reads one key per request:

# %%
for mode in ("decode", "draft_extend_v2"):
    (rec,) = check_entry_mode(find("trtllm_mla", "legacy")[0], mode, CPUEmulatorEngine(), ONE_GRAPH)
    print(mla.verdict_line(rec))
    assert any(f.startswith("max_seq_len_k:") and "frozen at capture" in f for f in rec.findings)
    assert rec.graph_equals_eager is False and rec.matches_oracle is True  # eager is right, the graph is not

# %% [markdown]
# The later shapes pass every [verdict](../docs/glossary.md#verdicts) (`tests/test_mla_backends.py`).
#
# ## 4. What #29077 removed
#
# #29077 changed draft extend v2 ([facts](../docs/sglang_facts.md#trtllm-mla-after-26665-and-after-29077)). There
# every request has N rows, so `cu_seqlens_q` and `seq_lens_q` are per-size constants written at init; the unified
# [replay hook](../docs/glossary.md#replay-hook) re-wrote them every replay and computed an identity,
# `seq - seq_lens_q + max_seq_len_q`. Before and after:

# %%
show_code(TRTLLMMLAAttnBackend._apply_draft_extend, TRTLLMMLAAttnBackendSimplified._apply_draft_extend)

# %% [markdown]
# Each eager op or Triton call on the hook is one host-side [launch](../docs/glossary.md#launch-cost); `launches`
# counts them, for a batch of 3 [padded](../docs/glossary.md#padding) to the bs-4 graph:

# %%
hook = {}
for cls in (TRTLLMMLAAttnBackend, TRTLLMMLAAttnBackendSimplified, TRTLLMMLAAttnBackendInGraph):
    runner, fb = mla.draft_extend_runner(cls)
    padded = runner.padded_batch(fb)
    counts = launches(lambda r=runner, p=padded: call_replay_hook(r.backend, p))
    hook[cls.variant] = sum(counts.values())
    print(f"{cls.variant:<10} {hook[cls.variant]} launches: {mla.op_names(counts)}")
assert hook == {"unified": 7, "simplified": 2, "in_graph": 0}

# %% [markdown]
# The in-graph shape moves the last two into the graph as one fused node; its hook only re-points the metadata.
#
# ## 5. What that saves on an H200
#
# `benchmarks/trtllm_mla_draft_extend.py` timed the replay path (hook plus `graph.replay()`: host time, and GPU time
# by CUDA events) for draft extend v2, bs 1 to 256. Run 2 of two (run 1 has host-noise spikes;
# `benchmarks/results/trtllm_mla_draft_extend/README.md`):

# %%
show(mla.draw_h200_replay(), "05_trtllm_draft_extend_replay_h200")
print(mla.medians(mla.h200_results()["rows"]))

# %% [markdown]
# The five ops cost about 60 to 100 µs of host time per replay; the GPU time is the model step. The in-graph shape
# still spends Python around `graph.replay()` and the call itself (notebook 06).

# %% tags=["gpu"]
if torch.cuda.is_available():
    live = mla.live_sweep(batch_sizes=(1, 16, 64))
    print(mla.medians(live, batch_sizes=(1, 16, 64)))
    assert mla.hook_launches(live) == {"unified": {7}, "simplified": {2}, "in_graph": {0}}

# %% [markdown]
# ## 6. The parent class, FlashInfer-MLA
#
# In it, #26665 merged the identical target-verify and draft-extend branches, in capture and in replay
# ([facts](../docs/sglang_facts.md#what-26665-changed)). Its decode replay's stale bound `kv_indptr` (#37975):
# notebooks 03 and 04.
#
# ### Exercise (about 5 minutes): predict the launches of half of #29077
#
# The class below drops only the identity arithmetic from the unified draft-extend body, keeping the re-writes
# of `cu_seqlens_q` and `seq_lens_q`. How many launches does its replay hook make?


# %%
class IdentityRemoved(TRTLLMMLAAttnBackend):
    def _apply_draft_extend(self, md, bs, seq):
        n = self.spec.num_draft_tokens
        md.max_seq_len_q, md.sum_seq_lens_q = n, n * bs
        md.cu_seqlens_q[: bs + 1].copy_(torch.arange(0, bs * n + 1, n, device=self.device))
        md.seq_lens_q[:bs].fill_(n)
        md.seq_lens_k.copy_(seq)
        return seq


predicted_launches = 7  # <- change this

# %% jupyter={"source_hidden": true}
# Solution (expand to read)
runner, fb = mla.draft_extend_runner(IdentityRemoved)
padded = runner.padded_batch(fb)
counts = launches(lambda: call_replay_hook(runner.backend, padded))
print(f"you predicted {predicted_launches}; the recorder counts {sum(counts.values())}: {mla.op_names(counts)}")
assert sum(counts.values()) == 5  # 7 minus sub and add; arange + copy_ and fill_ stay: #29077 removed those too
out = runner.replay(fb).clone()
assert torch.allclose(out, runner.eager(fb), atol=1e-4)  # the identity was one: the graph still equals eager

# %% [markdown]
# ## 7. Gluing a hook that plans: the host/device split
#
# A glue graph (notebook 06) cannot hold FlashInfer's `plan()`, host work. SGLang's open
# [#39825](https://github.com/sgl-project/sglang/pull/39825) splits the hook: the plan runs eagerly, the device
# phase is glued ([facts](../docs/sglang_facts.md#host-device-split)). FlashInfer-MLA's unified hook:

# %%
show_code(FlashInferMLAAttnBackend.init_forward_metadata_replay_cuda_graph)
rig = mla.glued_rig()  # FlashInfer-MLA unified, decode, captured at bs 4 with a glue graph
fb = rig.gen.for_mode(rig.kind, 3)
torch.testing.assert_close(rig.runner.replay(fb), rig.runner.eager(fb), **rig.tol)  # (bf16 on a GPU: 3e-2)
print(rig.runner.glue_split, dict(rig.runner.replays), dict(rig.runner.glue_graphs[4].kernels()))

# %% [markdown]
# The glue graph holds no plan. A device phase that reads a host value keeps the capture's: #39825's failure
# (accept length near 1), which verdict (e) names (`tests/broken_backends.py`). H200, run 3 of nine
# (`benchmarks/results/split_hook/`):

# %%
print(mla.split_hook_table())

# %% [markdown]
# Glued, the metadata costs its plan plus 5 to 14 µs, or up to 20 on a slow host.
