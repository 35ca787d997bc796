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
# # Triton through every graph mode
#
# Reading time: about 23 minutes. Run All takes about 25 s on a 2-core CPU.
#
# **The question:** in each graph mode of a speculative-decoding iteration, which buffers does SGLang's Triton backend
# refill before a replay, and what does the graph freeze?
#
# A server running [EAGLE](../docs/glossary.md#eagle) ([paper](https://arxiv.org/abs/2401.15077)) captures more
# graphs: a one-layer draft head proposes tokens and the target model checks them in one pass. [Three
# sizes](../docs/glossary.md#s-topk-n) describe it: **S** draft steps, **topk** branches kept per step, **N** nodes of
# the [draft tree](../docs/glossary.md#draft-tree) the target checks (the last verified token included). topk = 1
# gives a chain, N = S + 1.

# %%
import torch

from refimpl import ForwardMode, viz
from refimpl.backends.triton import TritonAttnBackend, TritonMultiStepDraftBackend
from refimpl.config import SpecConfig
from refimpl.course import show, triton_modes
from refimpl.graphs import make_engine
from refimpl.kernels import draft_decode_kv_indices_ref, get_num_kv_splits_ref
from refimpl.spec import DraftTree

CHAIN = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)  # N = S + 1
TREE = SpecConfig(num_steps=3, topk=2, num_draft_tokens=6)  # N = 6 > S + 1
S, N = TREE.num_steps, TREE.num_draft_tokens

title = "One EAGLE iteration (S 3, topk 2, N 6): each step's graph mode and rows per request"
fig = viz.draw_eagle_iteration([-1, 0, 0, 1, 1, 3], [1, 3], S, TREE.topk, title=title)
show(fig, "02_eagle_iteration")

# %% [markdown]
# Three steps run as graphs, each under its own [forward mode](../docs/glossary.md#forward-mode), which fixes the
# query rows per request ([facts](../docs/sglang_facts.md#tokens-per-request)):
#
# 1. **Draft**, the [multi-step draft decode](../docs/glossary.md#multi-step-draft-decode): S - 1 decode steps over
#    `bs * topk` rows in one graph.
# 2. **[Target verify](../docs/glossary.md#target-verify)**: N rows, one per tree node, under a [custom
#    mask](../docs/glossary.md#custom-mask).
# 3. **Accept**: the longest chain the target agrees with. refimpl's [accept
#    length](../docs/glossary.md#accept-length) counts those drafts (0..S), not the target's *bonus* token.
# 4. **[Draft extend](../docs/glossary.md#draft-extend)**: the draft head runs over the new tokens, S + 1 rows per
#    request in v1, N in v2; rows past them hold rejected drafts, outputs dropped.
#
# [IDLE](../docs/glossary.md#idle): a data-parallel rank with no requests still runs the step.
#
# Each section captures graphs of bs 1 and 4, replays a batch of 3 (one [padded row](../docs/glossary.md#padded-row),
# orange) and asserts graph == [eager](../docs/glossary.md#eager). Without a GPU, Triton's kernels run in its
# interpreter under the [CPU graph emulator](../docs/glossary.md#cpu-graph-emulator), so the model is one tiny
# [GQA](../docs/glossary.md#gqa) layer.

# %%
lab = triton_modes.Lab.create(make_engine("auto"))  # the CPU emulator here, CUDA graphs on a GPU
world, cfg = lab.world, lab.world.cfg
print(lab.engine.name, "|", cfg.num_heads, "query heads,", cfg.num_kv_heads, "KV heads | graphs", lab.graphs.capture_bs)

# %% [markdown]
# ## 1. Decode and idle
#
# One row per request; the graph holds two attention kernels per layer ([split-KV](../docs/glossary.md#split-kv):
# stage 1 per chunk of keys, stage 2 the merge). The [replay hook](../docs/glossary.md#replay-hook) fills `kv_indptr`
# and `cuda_graph_kv_indices` outside the graph: a CSR packing the first `seq_lens[i]` slots of each request's
# `req_to_token` row.

# %%
dec = lab.replay(ForwardMode.DECODE, TritonAttnBackend(world))
assert torch.allclose(dec.graph, dec.eager, atol=1e-4)  # (b) graph == eager
assert dict(dec.runner.graphs[4].custom_kernels()) == {
    "refimpl.decode_attention_stage1.default": 1,
    "refimpl.decode_attention_stage2.default": 1,
}
tri, bs = dec.runner.backend, dec.bs
rpi, seq = dec.runner.inputs.req_pool_indices[:bs].clone(), dec.runner.inputs.seq_lens[:bs].clone()
show(
    viz.draw_csr(
        world.req_to_token,
        rpi,
        seq,
        tri.kv_indptr[: bs + 1],
        tri.cuda_graph_kv_indices,
        title="decode: kv_indices packs each request's req_to_token prefix; the padded row reads slot 0",
    ),
    "02_decode_csr",
)

# %% [markdown]
# **Split counts: data beside a frozen grid.** Stage 1's grid has `max_kv_splits` programs per (row, head group) and
# its scratch is `[T, H, max_kv_splits, Dv]`: both are [frozen](../docs/glossary.md#frozen-value). The per-request
# count `cuda_graph_num_kv_splits[b]` is data, refilled at every replay by one device kernel, `get_num_kv_splits`,
# from the batch's lengths and the core count (8 in refimpl on CPU)
# ([facts](../docs/sglang_facts.md#split-count-heuristic)).

# %%
splits = tri.cuda_graph_num_kv_splits[:bs].tolist()
dec2 = lab.gen(None).decode(3, seq_lens=[40, 36, 30])
assert torch.allclose(dec.runner.replay(dec2), dec.runner.eager(dec2), atol=1e-4)  # the same graph
seq2, splits2 = dec.runner.inputs.seq_lens[:bs].tolist(), tri.cuda_graph_num_kv_splits[:bs].tolist()
kw = dict(num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, max_kv_splits=tri.max_kv_splits, core_count=tri.core_count)
assert splits == get_num_kv_splits_ref(seq.tolist(), **kw) and splits2 == get_num_kv_splits_ref(seq2, **kw)
print(f"seq_lens {seq.tolist()} -> num_kv_splits {splits};  seq_lens {seq2} -> {splits2}")

idle = dec.runner.replay(lab.gen(None).idle())  # no request: the bs-1 graph, its one row padded
assert idle.shape[0] == 0 and tri.kv_indptr[:2].tolist() == [0, 1] and tri.cuda_graph_kv_indices[0] == 0

# %% [markdown]
# ## 2. Target verify
#
# Each request takes N = 6 rows, so `qo_indptr = [0, N, 2N, ...]` and the graph freezes `max_extend_len = N`.
# `seq_lens` and `kv_indptr` count the verified prefix only: Triton's extend kernel takes the drafts' k/v straight
# from the forward pass. Request i's mask is a row-major `[N, seq_i + N]` block: prefix columns all 1, then the tree's
# ancestry; `mask_indptr` says where each block starts ([facts](../docs/sglang_facts.md#target-verify-custom-mask)).

# %%
tv = lab.replay(ForwardMode.TARGET_VERIFY, TritonAttnBackend(world, TREE), TREE, seq_lens=[6, 17, 30])
assert torch.allclose(tv.graph, tv.eager, atol=1e-4)
tri, seq = tv.runner.backend, tv.runner.inputs.seq_lens[:bs]
assert tv.frozen.max_extend_len == N and tri.qo_indptr[: bs + 1].tolist() == [0, 6, 12, 18, 24]
assert tri.kv_indptr[: bs + 1].tolist() == [0] + seq.cumsum(0).tolist()  # the prefix: no "+ N"
parents = tv.batch.spec_info.parents[0]
block = tri.cuda_graph_custom_mask[: N * (6 + N)].view(N, 6 + N)  # request 0, prefix 6
assert block[:, :6].all() and torch.equal(block[:, 6:].bool().cpu(), DraftTree(parents).ancestry_mask())
show(
    viz.draw_tree_mask(
        tri.cuda_graph_custom_mask,
        tri.mask_indptr[: bs + 1],
        N,
        0,
        parents=parents,
        title="target verify: draft q sees the whole prefix and its own ancestors",
    ),
    "02_verify_tree_mask",
)

# %% [markdown]
# ## 3. Draft extend, v1 and v2
#
# A graph gives every request the same number of rows, so `qo_indptr` has one stride: S + 1 in v1 (the first
# `accept_length + 1` rows real), N in v2. refimpl's `seq_lens` include the new rows in every extend mode, so the KV
# prefix is `seq_lens - rows`, clamped at 0 for the padded row (upstream's v1 differs:
# [facts](../docs/sglang_facts.md#where-refimpl-deliberately-differs-from-upstream)).

# %%
v1 = lab.replay(ForwardMode.DRAFT_EXTEND, TritonAttnBackend(world, CHAIN), CHAIN, accept_length=[2, 0, 3])
v2 = lab.replay(ForwardMode.DRAFT_EXTEND_V2, TritonAttnBackend(world, TREE), TREE)
for r, rows in ((v1, S + 1), (v2, N)):
    tri, seq = r.runner.backend, r.runner.inputs.seq_lens[:bs]
    assert torch.allclose(r.graph, r.eager, atol=1e-4) and r.frozen.max_extend_len == rows
    assert tri.qo_indptr[: bs + 1].tolist() == list(range(0, bs * rows + 1, rows))
    assert tri.kv_indptr[: bs + 1].tolist() == [0] + (seq - rows).clamp(min=0).cumsum(0).tolist()
show(
    triton_modes.draw_draft_extend_strides(
        v1, v2, "draft extend: v1 strides S + 1, v2 strides N; the stride before #27545 (red) split v2's requests"
    ),
    "02_draft_extend_buffers",
)

# %% [markdown]
# **The stride is the layout.** Before [#27545](https://github.com/sgl-project/sglang/pull/27545), v2 also used stride
# S + 1 = 4 although each request has N = 6 rows: request 1's slice began inside request 0, and the PR reports NaN at
# bs > 1 (bs 1 and eager were unaffected).
#
# **What the graph freezes.** The extend kernel's grid of query-row blocks comes from `max_extend_len`, a Python int
# frozen at capture: N, the stride, in refimpl's v2. Upstream's `_build_cuda_graph_forward_metadata` freezes S + 1, in
# code that already has #27545's stride ([`triton_backend.py` at 0085842][tb]). When N > S + 1 crosses a `BLOCK_M`
# boundary, a request's trailing rows are then never computed (inferred, not run:
# [facts](../docs/sglang_facts.md#triton-historical-bugs)).
#
# [tb]: https://github.com/sgl-project/sglang/blob/0085842/python/sglang/srt/layers/attention/triton_backend.py
#
# ## 4. Multi-step draft decode
#
# `TritonMultiStepDraftBackend` owns one row of `kv_indptr` and of `cuda_graph_kv_indices` per step and lends row i to
# step backend i. One kernel fills every row ([facts](../docs/sglang_facts.md#multi-step-draft-decode-indices)). The
# steps share one split-count buffer, filled once per replay from the prefix lengths.

# %%
ms = TritonMultiStepDraftBackend(world, TREE)
dd = lab.replay("draft_decode", ms, TREE, seq_lens=[2, 9, 5])
assert torch.allclose(dd.graph, dd.eager, atol=1e-4)
assert dict(dd.runner.graphs[4].custom_kernels()) == {
    "refimpl.decode_attention_stage1.default": S - 1,
    "refimpl.decode_attention_stage2.default": S - 1,
}
seq = dd.runner.inputs.seq_lens[:bs]
ref_indptr, ref_indices = draft_decode_kv_indices_ref(
    dd.runner.inputs.req_pool_indices[:bs], world.req_to_token, seq, topk=TREE.topk, num_steps=S
)
for i, b in enumerate(ms.step_backends):  # step i reads row i of the wrapper's buffers
    assert b.kv_indptr.data_ptr() == ms.kv_indptr[i].data_ptr()
    assert b.cuda_graph_num_kv_splits is ms.cuda_graph_num_kv_splits
    assert ms.kv_indptr[i, : bs * TREE.topk + 1].tolist() == ref_indptr[i].tolist()
    assert torch.equal(ms.cuda_graph_kv_indices[i, : ref_indices[i].numel()], ref_indices[i])
title = "multi-step draft decode: at step i, each branch's row is its prefix + i + 1 draft slots"
show(
    viz.draw_draft_decode_indices(
        ms.kv_indptr, ms.cuda_graph_kv_indices, seq, TREE.topk, S, used_steps=S - 1, live_seqs=3, title=title
    ),
    "02_draft_decode_indices",
)

# %% [markdown]
# ### Exercise (about 6 minutes): plant the stride #27545 removed
#
# `PlantedStride` is refimpl's Triton backend whose draft-extend hook writes `qo_indptr` at stride `STRIDE`
# (`max_extend_len` stays N). `lab.check` replays a batch of 3 through the bs-4 graph and prints
# [verdicts](../docs/glossary.md#verdicts) (a), (b) and (d) and, per request, the rows that differ from eager. Set
# `STRIDE` to S + 1 and predict first: which verdicts fail, which rows of which request go wrong, and why can (a) not
# see it?

# %%
STRIDE = N  # <- change this to S + 1


class PlantedStride(TritonAttnBackend):
    def _update_draft_extend_buffers(self, bs, seq_lens, rpi, mode, spec_info):
        super()._update_draft_extend_buffers(bs, seq_lens, rpi, mode, spec_info)
        self.qo_indptr[: bs + 1].copy_(torch.arange(0, bs * STRIDE + 1, STRIDE))


print(lab.check(PlantedStride, ForwardMode.DRAFT_EXTEND_V2, TREE))

# %% jupyter={"source_hidden": true}
# Solution (expand to read)
# Request i's slice now starts at row 4i, its rows at 6i. Request 0 reads its own rows 0-3 right; its rows 4-5 are
# read as request 1's, against request 1's prefix. Requests 1 and 2 read rows that are not theirs (request 2's last
# two rows are never computed). (a) passes: the capture and replay paths run the same planted body. (d) sees
# qo_indptr differ from the stride-N reference; (b) sees the outputs differ.
STRIDE = S + 1
verdicts = lab.check(PlantedStride, ForwardMode.DRAFT_EXTEND_V2, TREE)
print(verdicts)
assert verdicts.capture_equals_replay and not verdicts.replay_matches_reference and not verdicts.graph_equals_eager
assert verdicts.wrong_rows == [[4, 5], list(range(N)), list(range(N))]

# %% [markdown]
# ## Summary
#
# | mode (Triton) | rows / request | `qo_indptr` stride | keys through `kv_indices` | frozen values |
# |---|---|---|---|---|
# | decode / idle | 1 | none | `seq_lens` | `max_kv_splits` |
# | target verify | N | N | the prefix, `seq_lens` | `max_extend_len` = N |
# | draft extend v1 | S + 1 | S + 1 | `seq_lens - (S + 1)` | `max_extend_len` = S + 1 |
# | draft extend v2 | N | N | `seq_lens - N` | `max_extend_len` = N (upstream: S + 1) |
# | multi-step draft decode | topk | none | step i: prefix + i + 1 drafts | `max_kv_splits` |
#
# Capture and replay must lay the rows out alike: the stride sits in `qo_indptr` (data) and in the frozen
# `max_extend_len`. **Next, notebook 03:** the same buffers on Wave, FlashInfer and FlashInfer-MLA.
