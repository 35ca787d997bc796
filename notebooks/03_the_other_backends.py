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
# # The other backends, and two historical bugs
#
# Reading time: about 22 minutes. Run All takes about 15 s on a 2-core CPU.
#
# **The question:** do Wave, FlashInfer and FlashInfer-MLA lay out a graph's metadata as Triton does, and when a
# backend's capture and replay hooks drift apart, when is the answer wrong?
#
# Set-up as in [notebook 02](02_triton_through_every_mode.ipynb): a one-layer GQA model, a chain and a
# tree of N = 4 and 6 nodes, graphs of bs 1 and 4, batches of 3 padded to 4. Hatched grey: stale; red frame: differs.

# %%
import torch

from refimpl import ForwardMode
from refimpl.backends import find
from refimpl.backends.base import hook_interface
from refimpl.backends.flashinfer import FlashInferAttnBackend
from refimpl.backends.flashinfer_mla import FlashInferMLAAttnBackend, FlashInferMLAAttnBackendAsUpstream
from refimpl.backends.triton import TritonAttnBackend, TritonAttnBackendLegacy, TritonAttnBackendOutGraph
from refimpl.backends.wave import WaveAttnBackend, WaveAttnBackendLegacy, WaveMultiStepDraftBackend
from refimpl.check import CheckSettings, check_entry_mode
from refimpl.course import backends as nb
from refimpl.course import render, show, show_code
from refimpl.flashinfer_wrappers import read_partition
from refimpl.graphs.runner import GraphRunner
from refimpl.viz import draw_csr

s = nb.setting()  # the CPU graph emulator here, CUDA graphs on a GPU
CHAIN, TREE, N = nb.CHAIN, nb.TREE, nb.TREE.num_draft_tokens

# %% [markdown]
# ## 1. Wave: Triton's layout, sized by batch
#
# SGLang's Wave [attention backend](../docs/glossary.md#attention-backend) (AMD wave_lang kernels) keeps Triton's
# hooks and layout ([facts](../docs/sglang_facts.md#wave)); refimpl runs it on Triton's kernels.

# %%
fb_dec = s.gen.decode(3)
wave = GraphRunner(s.model, WaveAttnBackend(s.world, None), s.engine, ForwardMode.DECODE, s.graphs)
wave.capture()
triton = TritonAttnBackend(s.world, None)
triton.init_forward_metadata(fb_dec)  # Triton, eagerly, on the same batch
assert torch.allclose(wave.replay(fb_dec), s.model(fb_dec, triton), atol=1e-4)

fb_tv = s.gen.target_verify(3, seq_lens=[6, 17, 30])  # random trees
wave_tv, padded_tv = nb.replay_hooks(WaveAttnBackend(s.world, TREE), ForwardMode.TARGET_VERIFY, fb_tv, s)
tri_tv, _ = nb.replay_hooks(TritonAttnBackend(s.world, TREE), ForwardMode.TARGET_VERIFY, fb_tv, s)
for key in ("qo_indptr", "kv_indptr", "mask_indptr", "custom_mask"):
    assert wave_tv[key].tolist() == tri_tv[key].tolist(), key

# %% [markdown]
# For a target-verify runner of B = 4 requests, N = 6 rows each, Wave sizes its
# split-KV counts, decode scratch and kv indices by **B**, Triton by **T** = B·N rows. So multi-step draft decode,
# bs·topk rows, fits Wave's `[B]` split buffer for chains only.
# The mask is `[T*L]` in both; upstream Wave's `[B*L]` is too small for a verify batch ([why refimpl
# differs](../docs/sglang_facts.md#where-refimpl-deliberately-differs-from-upstream)).

# %%
render(nb.sizes_table(s.world, B=4, N=6))
print(nb.refused(WaveMultiStepDraftBackend(s.world, TREE), ForwardMode.DECODE))

# %% [markdown]
# ## 2. FlashInfer: buffers bound to wrappers
#
# SGLang's FlashInfer backend ([facts](../docs/sglang_facts.md#flashinfer)) is [Pattern
# B](../docs/glossary.md#pattern-b): its kernels live in [wrappers](../docs/glossary.md#wrapper) **bound** to their
# buffers when constructed, one per captured size. Before each replay the hook
# writes the batch's CSR (and verify's mask) into the bound buffers and calls [`plan()`](../docs/glossary.md#plan),
# which writes a work partition into the wrapper's workspace. The decode kernel takes each request's keys from the
# bound `kv_indptr` / `kv_indices` and splits the work as the partition says. refimpl's stand-in wrappers run without
# a GPU.
#
# In verify, FlashInfer's kv indices cover the prefix **and the N drafts**, written to the cache first.

# %%
fi_dec, fi_tv = FlashInferAttnBackend(s.world, TREE), FlashInferAttnBackend(s.world, TREE)
nb.replay_hooks(fi_dec, ForwardMode.DECODE, fb_dec, s)
fi_state, _ = nb.replay_hooks(fi_tv, ForwardMode.TARGET_VERIFY, fb_tv, s)
prefix = padded_tv.seq_lens
assert torch.diff(fi_state["paged_kv_indptr"]).tolist() == (prefix + N).tolist()  # FlashInfer: prefix + N
assert torch.diff(tri_tv["kv_indptr"]).tolist() == prefix.tolist()  # Triton: the prefix
show(
    draw_csr(
        s.world.req_to_token,
        padded_tv.req_pool_indices,
        prefix + N,
        fi_state["paged_kv_indptr"],
        fi_state["paged_kv_indices"],
        legend=False,
        title="target verify (FlashInfer): each kv range is the prefix + N = 6 drafts (Triton: the prefix)",
    ),
    "03_flashinfer_verify_csr",
)

# %% [markdown]
# The bs-4 and bs-1 decode wrappers share one `kv_indptr` buffer. The bs-4 plan holds this batch; the bs-1 plan still
# holds the capture batch until a batch of one re-plans it. Verify also binds mask buffers: FlashInfer picks its mask
# mode from whether one is bound.

# %%
w1, w4 = (fi_dec.decode_cuda_graph_metadata[b][0] for b in (1, 4))
assert w1._paged_kv_indptr_buf.data_ptr() == w4._paged_kv_indptr_buf.data_ptr()  # one buffer, [:bs+1] each
assert read_partition(w1)[1].tolist() == [1]  # the capture batch's plan
show(nb.draw_flashinfer_wrappers(fi_dec, fi_tv), "03_flashinfer_wrappers")

# %% [markdown]
# ## 3. FlashInfer-MLA: a stale buffer nobody reads
#
# FlashInfer-MLA's `BatchMLAPagedAttentionWrapper` for [MLA](../docs/glossary.md#mla) models is bound to `kv_indptr`,
# `kv_indices` and `kv_len_arr` ([facts](../docs/sglang_facts.md#flashinfer-mla)). Upstream's decode replay writes the
# new `kv_indptr` into the backend's *eager* buffer and re-plans with `fast_mla_decode_plan`, which passes host
# indptrs to the plan module and copies nothing into the bound buffers: they keep the capture batch's values
# ([#37975](https://github.com/sgl-project/sglang/pull/37975), open). The output stays right: FlashInfer 0.7.2's fa2 /
# fa3 kernel (SM80 / SM90: `mla/_batch_mla/_auto_policy.py`) reads only `kv_indices` of the bound CSR, and each work
# item's `kv_indptr` and `kv_len` from `MLAPlan`'s partition (`csrc/batch_mla_run.cu`). refimpl's `as-upstream` keeps
# this; `unified` writes the bound buffers. [Verdict (a)](../docs/glossary.md#verdicts) ([paths P and
# Q](../docs/glossary.md#path-p-and-path-q)) sees it:

# %%
fb_mla = s.gen_mla.decode(3, seq_lens=[7, 31, 18])
for cls in (FlashInferMLAAttnBackendAsUpstream, FlashInferMLAAttnBackend):
    found = nb.verdict_a(cls, CHAIN, ForwardMode.DECODE, fb_mla, s, world=s.world_mla)
    print(f"{cls.variant}, verdict (a):", *(found or ["no difference"]), sep="\n  ")

up, uni = FlashInferMLAAttnBackendAsUpstream(s.world_mla, CHAIN), FlashInferMLAAttnBackend(s.world_mla, CHAIN)
(st_up, padded_mla), (st_uni, _) = (nb.replay_hooks(b, ForwardMode.DECODE, fb_mla, s) for b in (up, uni))
assert st_up["kv_indptr"].tolist() == [0, 1, 2, 3, 4]  # bound: the capture batch's (lengths 1)
assert read_partition(up.decode_cuda_graph_metadata[4])[1].tolist() == padded_mla.seq_lens.tolist()  # the plan
assert st_uni["kv_indptr"].tolist() == [0] + padded_mla.seq_lens.cumsum(0).tolist()
show(nb.draw_mla_stale(up, uni, padded_mla), "03_flashinfer_mla_stale_indptr")

# %% [markdown]
# Verify and draft extend re-plan in full, so their bound buffers are current; with no custom mask upstream, verify
# takes chains only:

# %%
print(nb.refused(FlashInferMLAAttnBackend(s.world_mla, TREE), ForwardMode.TARGET_VERIFY))

# %% [markdown]
# ## 4. Two historical bugs, cell by cell
#
# Before [#26665](https://github.com/sgl-project/sglang/pull/26665) each backend wrote its two hooks separately
# ([Pattern C](../docs/glossary.md#pattern-c)), and they drifted
# ([facts](../docs/sglang_facts.md#triton-historical-bugs)):
#
# * **Wave, decode**: capture filled the CSR but never called `get_num_kv_splits`, so the split buffer kept its
#   initial `max_kv_splits`.
# * **Triton, draft extend v1**: capture laid the rows out at the uniform stride S + 1 = 4; replay wrote `qo_indptr`
#   as the eager path's ragged cumsum of accepted rows.
#
# Both paths, on refimpl's `legacy` shapes:

# %%
fb_v1 = s.gen_chain.draft_extend(3, 1, accept_length=[2, 0, 3])
wave_p, wave_q = nb.both_paths(WaveAttnBackendLegacy, None, ForwardMode.DECODE, fb_dec, s)
tri_p, tri_q = nb.both_paths(TritonAttnBackendLegacy, CHAIN, ForwardMode.DRAFT_EXTEND, fb_v1, s)
assert (wave_p["num_kv_splits"] == wave.backend.max_kv_splits).all()  # capture never computed them
assert tri_p["qo_indptr"].tolist() == [0, 4, 8, 12, 16]  # capture: stride S + 1
assert tri_q["qo_indptr"].tolist() == [0, 3, 4, 8, 9]  # replay: accepted rows 3, 1, 4, and 1 for the padded row
show(nb.draw_legacy_paths((wave_p, wave_q), (tri_p, tri_q)), "03_legacy_findings")

# %% [markdown]
# ### Exercise (about 6 minutes): benign drift or a wrong answer?
#
# Verdict (a) fails for both. But the kernel reads `num_kv_splits[b]` when it runs, and the graph runner copies each
# request's rows into its static inputs at the stride captured. Predict verdict (b), graph == eager, for each.

# %%
predict = {"wave decode": None, "triton draft_extend": None}  # <- change this: True (graph == eager) or False

# %% jupyter={"source_hidden": true}
# Solution (expand to read)
settings = CheckSettings(capture_bs=(4,), raw_bs=(3,), glue_replays=0, history=False)
verdict_b = {}
for name, mode in (("wave", "decode"), ("triton", "draft_extend")):
    (rec,) = check_entry_mode(find(name, "legacy")[0], mode, s.engine, settings)
    verdict_b[f"{name} {mode}"] = rec.graph_equals_eager
    print(
        f"{name} legacy {mode}: (a) {rec.capture_equals_replay}, (b) {rec.graph_equals_eager}, "
        f"(c) {rec.matches_oracle}\n   {rec.findings[0]}"
    )
assert verdict_b == {"wave decode": True, "triton draft_extend": False}
assert all(p is None or p == verdict_b[k] for k, p in predict.items()), f"the checker says {verdict_b}"

# %% [markdown]
# **Why.** Wave's drift is benign: the graph freezes the split buffer's address, not its counts, and every replay's
# hook writes the counts first. Any count in `[1, max_kv_splits]` gives the same attention up to rounding (stage 2
# merges the splits by log-sum-exp). Triton's is a wrong answer: the static inputs hold each request's rows at stride
# S + 1, so with a ragged `qo_indptr` every request after the first reads other rows, while eager, and verdict (c),
# stay right. A drift in a buffer the kernel re-reads is benign; a drift against a layout the graph baked in is not.
#
# ## 5. Three stages of one hook
#
# Upstream rewrote the hooks twice ([facts](../docs/sglang_facts.md#three-stages-of-the-hooks)): two bodies
# (`legacy`), then one body behind the pair (`unified`), then one
# [`init_forward_metadata_out_graph(fb, in_capture)`](../docs/glossary.md#out-graph-hook). refimpl's runner calls that;
# the base class maps it onto a pair. Open #28765 merges the eager body too.

# %%
show_code(TritonAttnBackendOutGraph.init_forward_metadata_out_graph)
stages = (TritonAttnBackendLegacy, TritonAttnBackend, TritonAttnBackendOutGraph)
states = [nb.replay_hooks(cls(s.world, None), ForwardMode.DECODE, fb_dec, s)[0] for cls in stages]
for cls, st in zip(stages, states):
    print(f"{cls.variant:>9} ({hook_interface(cls)}): num_kv_splits {st['num_kv_splits'].tolist()}")
assert all(torch.equal(st[k], states[0][k]) for st in states for k in ("kv_indptr", "kv_indices", "num_kv_splits"))

# %% [markdown]
# ## Summary
#
# * **Wave**: Triton's layout, buffers sized by B; chains only in multi-step draft decode.
# * **FlashInfer**: one bound wrapper per captured size, re-planned per replay; verify indexes prefix + N.
# * **FlashInfer-MLA**: upstream's bound `kv_indptr` / `kv_len_arr` go stale; its fa2 / fa3 kernel reads neither.
#
# **Next, notebook 04:** how Pattern A and Pattern B keep the two paths equal by construction.
