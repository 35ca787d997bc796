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
# # Forward modes and their buffers
#
# Notebook 00 captured a plain decode step. A speculative-decoding server (EAGLE) captures
# graphs for several **forward modes**, and each one lays out a different number of query rows
# per request (the rules live in `refimpl/layout.py`; upstream facts in
# [docs/sglang_facts.md](../docs/sglang_facts.md#tokens-per-request)):
#
# | mode                          | rows per request      | kv indexed through `kv_indices`      |
# |-------------------------------|-----------------------|--------------------------------------|
# | decode                        | 1                     | the whole sequence, `seq_lens`       |
# | target verify                 | N (the draft tokens)  | the prefix only (Triton / Wave)      |
# | draft extend v1               | S + 1                 | the prefix, `seq_lens - rows`        |
# | draft extend v2               | N                     | the prefix, `seq_lens - rows`        |
# | multi-step draft decode       | topk (one per branch) | prefix + that branch's draft slots   |
#
# (S = `num_steps`, topk = branches per step, N = `num_draft_tokens`.) A graph freezes
# addresses and Python values, so every mode gets static buffers that the backend's replay hook
# refills before each replay. This notebook goes through the modes on SGLang's **Triton**
# attention backend (refimpl's unified shape, [facts](../docs/sglang_facts.md#triton)). For each
# mode it captures graphs for
# batch sizes 1, 2 and 4, replays a fresh batch of 3 (padded to 4), checks graph == eager, and
# draws the buffers that replay left behind. It ends with the **Wave** backend, which
# sizes its buffers differently, and with two historical bugs that the checker finds.
#
# The kernels are refimpl's Triton kernels. Without a GPU they run in the Triton interpreter,
# and `make_engine("auto")` is the CPU graph emulator. That is slow, so the batches are small.

# %%
import math
import time
from pathlib import Path

import torch

try:
    from IPython.display import Image, display
except ImportError:  # run as a plain script (the GPU check does): nothing to display
    Image = display = lambda *args, **kwargs: None  # noqa: E731

from refimpl import ForwardMode, GraphConfig, ModelConfig, viz
from refimpl.backends import GraphModeNotSupported, find
from refimpl.backends.triton import (
    TritonAttnBackend,
    TritonAttnBackendLegacy,
    TritonMultiStepDraftBackend,
)
from refimpl.backends.wave import WaveAttnBackend, WaveAttnBackendLegacy
from refimpl.batch import World
from refimpl.batchgen import BatchGenerator, draft_decode_step_view
from refimpl.check import CheckSettings, check_entry_mode
from refimpl.config import SpecConfig
from refimpl.graphs import CPUEmulatorEngine, make_engine
from refimpl.graphs.runner import GraphRunner, call_capture_hook, call_replay_hook
from refimpl.kernels import draft_decode_kv_indices_ref, get_num_kv_splits_ref
from refimpl.model import MultiStepDraftProgram, TinyDecoder
from refimpl.spec import DraftTree

NOTEBOOK_T0 = time.perf_counter()
FIGURES = Path("../figures")

engine = make_engine("auto")  # the CPU emulator here, CUDA graphs on a GPU
device = engine.device
cfg = ModelConfig()  # MHA: 2 layers, 4 query heads, 2 KV heads (GQA), head dim 16, fp32
L = 40  # max_context_len
world = World.create(cfg, max_context_len=L, pool_size=24, device=device)
world.randomize_kv(0)  # every prefix "already prefilled"
model = TinyDecoder(cfg, device)

CHAIN = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)  # a chain: N = S + 1
TREE = SpecConfig(num_steps=3, topk=2, num_draft_tokens=6)  # a tree: N = 6 > S + 1 = 4
GRAPHS = GraphConfig(max_bs=4, capture_bs=(1, 2, 4), max_context_len=L, speculative=True)
gen = BatchGenerator(world, TREE, seed=1)  # decode, verify, draft extend v2, draft decode
gen_chain = BatchGenerator(world, CHAIN, seed=2)  # draft extend v1
print("engine:", engine.name, "| model:", cfg.kind, "| chain:", CHAIN, "| tree:", TREE)


# %% [markdown]
# Two helpers keep the sections short. `capture_replay` builds a `GraphRunner` for one mode,
# captures bs 1, 2 and 4, makes a fresh raw batch of 3 with `BatchGenerator.for_mode`, replays
# it (the bs-4 graph, one padded row), and asserts graph == eager. It also keeps the metadata
# that the capture froze. `show` saves a figure under `figures/01_<name>.png` and displays the
# saved file.

# %%
def capture_replay(mode, backend, spec=None, *, program=model, multi_step=False, generator=gen,
                   **batch_kw):
    """Capture bs 1/2/4, replay a fresh raw batch of 3, assert graph == eager."""
    runner = GraphRunner(program, backend, engine, mode, GRAPHS, spec, multi_step)
    records = runner.capture()
    frozen = getattr(backend, "forward_metadata", None)  # what the captured graphs read
    fb = generator.for_mode(mode, 3, multi_step_draft=multi_step, **batch_kw)
    graph_out = runner.replay(fb).clone()  # clone: the next replay overwrites the output
    eager_out = runner.eager(fb)
    diff = (graph_out - eager_out).abs().max().item()
    kernels = dict(records[-1].kernels)
    print(f"{mode.label}: captured bs {[r.bs for r in records]}, {kernels}")
    print(f"  raw bs 3 -> graph bs {runner.pick_bs(3)};  graph vs eager max |diff| = {diff:.1e}")
    assert runner.pick_bs(fb.batch_size) == 4
    assert torch.allclose(graph_out, eager_out, atol=1e-4)
    return runner, fb, frozen, graph_out


def show(fig, name):
    path = viz.save(fig, FIGURES / f"01_{name}.png")
    display(Image(filename=str(path)))


# %% [markdown]
# ## 1. Decode
#
# One row per request. In decode the Triton backend's graph reads `kv_indptr`,
# `cuda_graph_kv_indices`, `cuda_graph_num_kv_splits`, and the split-KV scratch
# `cuda_graph_attn_logits` / `cuda_graph_attn_lse`. The replay hook fills the first three
# outside the graph (the CSR kv-index kernel and the split heuristic). The graph holds
# only the attention kernels: two per layer, stage 1 (per split) and stage 2 (the merge).

# %%
tri_dec = TritonAttnBackend(world, None)
run_dec, fb_dec, frozen_dec, logits_dec = capture_replay(ForwardMode.DECODE, tri_dec)

assert run_dec.tokens_per_req == 1
graph_kernels = dict(run_dec.graphs[4].custom_kernels())
assert graph_kernels == {"refimpl.decode_attention_stage1.default": cfg.num_layers,
                         "refimpl.decode_attention_stage2.default": cfg.num_layers}
assert not any("kv_indices" in k or "num_kv_splits" in k for k in graph_kernels)

# %% [markdown]
# ### kv_indptr / kv_indices: a CSR over `req_to_token`
#
# `req_to_token[r, j]` is the KV slot of position j of the request in row r. For a batch, the
# CSR builder packs the first `seq_lens[i]` entries of every request's row, one after the other,
# into `kv_indices`. `kv_indptr = [0, cumsum(seq_lens)]` says where each request starts. The
# padded row (request row 0, `seq_len` 1) packs the reserved slot 0.

# %%
bs = run_dec.pick_bs(fb_dec.batch_size)
rpi, seq = run_dec.req_pool_indices[:bs].clone(), run_dec.seq_lens[:bs].clone()  # the live rows
kv_indptr = tri_dec.kv_indptr[: bs + 1]
total = int(kv_indptr[-1])
packed = torch.cat([world.req_to_token[r, :n] for r, n in zip(rpi.tolist(), seq.tolist())])
print("seq_lens  ", seq.tolist(), " (the last row is padding)")
print("kv_indptr ", kv_indptr.tolist())
print("kv_indices", tri_dec.cuda_graph_kv_indices[:total].tolist())

assert kv_indptr.tolist() == [0] + torch.cumsum(seq, 0).tolist()
assert torch.equal(tri_dec.cuda_graph_kv_indices[:total], packed.long())  # the concatenation
kv_indptr_dec, packed_dec = kv_indptr.clone(), packed.clone()  # for Wave in section 5
assert tri_dec.cuda_graph_kv_indices.dtype == torch.int64
assert tri_dec.cuda_graph_kv_indices.numel() == run_dec.max_num_tokens * L  # [T*L]

show(viz.draw_csr(world.req_to_token, rpi, seq, kv_indptr, tri_dec.cuda_graph_kv_indices,
                  title="decode: kv_indices = the req_to_token prefixes, packed"), "decode_csr")

# %% [markdown]
# ### num_kv_splits: data, next to a frozen grid dimension
#
# Split-KV decode cuts each request's KV range into `num_kv_splits[b]` chunks. Stage 1
# runs one program per (row, head group, split) and stage 2 merges the splits with their
# log-sum-exp. The stage-1 grid has `max_kv_splits` programs along its third axis, and
# `attn_logits` is `[T, H, max_kv_splits, Dv]`. Both are frozen in the graph. The *per-row*
# count is data in `cuda_graph_num_kv_splits`: programs with `s >= num_kv_splits[b]` do nothing,
# so the hook can change the counts on every replay.
#
# The heuristic `get_num_kv_splits` runs as one kernel on the device, with no host sync:
# 1. take the max and min length of the batch (the padded row counts, so here min = 1);
#    `splits_1 = min(cdiv(max, min), max_kv_splits)`, `chunk_1 = cdiv(max, splits_1)`;
# 2. `ext_cores = core_count * max(log2(max / 64), 1)` and `token_grid` = stage-1 programs per
#    split; `splits_2 = min(cdiv(ext_cores, token_grid), max_kv_splits)`,
#    `chunk_2 = cdiv(max, splits_2)`;
# 3. per request: `max(cdiv(len, chunk_1), cdiv(len, chunk_2))`.
#
# `core_count` is the GPU's SM count; refimpl uses a fixed 8 on CPU so runs are reproducible.

# %%
def splits_by_hand(lens, core_count, max_kv_splits, H=cfg.num_heads, Hkv=cfg.num_kv_heads):
    cdiv = lambda a, b: -(-a // b)
    hi, lo = max(lens), min(lens)
    lo = hi if hi * 8 < lo * 10 else lo  # within 25%: treat as uniform
    chunk_1 = cdiv(hi, min(cdiv(hi, lo), max_kv_splits))
    ext_cores = int(core_count * max(math.log2(hi / 64), 1))
    token_grid = len(lens) * cdiv(H, min(16, H // Hkv))  # GQA: H/Hkv heads per program
    chunk_2 = cdiv(hi, min(cdiv(ext_cores, token_grid), max_kv_splits))
    return [max(cdiv(n, chunk_1), cdiv(n, chunk_2)) for n in lens]


S_MAX, cores = tri_dec.max_kv_splits, tri_dec.core_count
splits_1 = tri_dec.cuda_graph_num_kv_splits[:bs].tolist()
print(f"batch 1: seq_lens {seq.tolist()} -> num_kv_splits {splits_1}  (max_kv_splits {S_MAX})")
assert splits_1 == splits_by_hand(seq.tolist(), cores, S_MAX)
assert splits_1 == get_num_kv_splits_ref(seq.tolist(), num_heads=cfg.num_heads,
                                         num_kv_heads=cfg.num_kv_heads,
                                         max_kv_splits=S_MAX, core_count=cores)
# what the graphs froze: the scratch's split axis, and the split buffer itself (by address)
assert frozen_dec.attn_logits.shape[2] == S_MAX
assert frozen_dec.num_kv_splits is tri_dec.cuda_graph_num_kv_splits

# %% [markdown]
# A second batch with other lengths goes through the **same** bs-4 graph. The split counts
# change, because they are data. The graph still equals eager.

# %%
fb_dec2 = gen.decode(3, seq_lens=[40, 36, 30])
out2 = run_dec.replay(fb_dec2).clone()
assert torch.allclose(out2, run_dec.eager(fb_dec2), atol=1e-4)
seq2 = run_dec.seq_lens[:bs].tolist()
splits_2 = tri_dec.cuda_graph_num_kv_splits[:bs].tolist()
print(f"batch 2: seq_lens {seq2} -> num_kv_splits {splits_2}")
assert splits_2 == splits_by_hand(seq2, cores, S_MAX) and splits_2 != splits_1

show(viz.draw_buffers({
    "batch 1 seq_lens": seq,
    "batch 1 num_kv_splits": torch.tensor(splits_1, dtype=torch.int32),
    "batch 2 seq_lens": torch.tensor(seq2, dtype=torch.int32),
    "batch 2 num_kv_splits": torch.tensor(splits_2, dtype=torch.int32),
    "max_kv_splits (frozen: stage-1 grid dim 3)": S_MAX,
    "cuda_graph_attn_logits": f"{list(tri_dec.cuda_graph_attn_logits.shape)} float32",
    "core_count (CPU: fixed)": cores,
}, "decode: one bs-4 graph, two batches, two sets of split counts"), "decode_splits")
gen.release(fb_dec2)

# %% [markdown]
# ## 2. Target verify with a draft tree
#
# In target verify the target model checks the N draft tokens of every request in one forward
# pass. With `topk = 2` the drafts form a tree. Each request takes **N = 6 rows**, so
# `qo_indptr = [0, N, 2N, ...]`. Here `seq_lens` counts only the verified **prefix**. The Triton
# kernel reads the prefix through `kv_indices` and gets the drafts' own k/v directly from the
# forward pass, so `kv_indptr` covers the prefix only (FlashInfer instead indexes prefix + N).

# %%
tri_tv = TritonAttnBackend(world, TREE)
run_tv, fb_tv, frozen_tv, _ = capture_replay(ForwardMode.TARGET_VERIFY, tri_tv, TREE,
                                             seq_lens=[6, 17, 30])  # prefixes; trees random
N = TREE.num_draft_tokens
rpi, seq = run_tv.req_pool_indices[:bs].clone(), run_tv.seq_lens[:bs].clone()
qo_indptr, kv_indptr = tri_tv.qo_indptr[: bs + 1], tri_tv.kv_indptr[: bs + 1]
print("seq_lens (prefix)", seq.tolist(), "| qo_indptr", qo_indptr.tolist(),
      "| kv_indptr", kv_indptr.tolist())

assert run_tv.tokens_per_req == N and frozen_tv.max_extend_len == N
assert qo_indptr.tolist() == list(range(0, (bs + 1) * N, N))  # stride N, padded row included
assert kv_indptr.tolist() == [0] + torch.cumsum(seq, 0).tolist()  # prefix only: no "+ N"
# the drafts' KV still lands in the cache: request i's N rows write r2t columns seq_i .. seq_i+N-1
for i in range(fb_tv.batch_size):
    cols = world.req_to_token[rpi[i], seq[i] : seq[i] + N].long()
    assert torch.equal(fb_tv.out_cache_loc[i * N : (i + 1) * N], cols)

show(viz.draw_csr(world.req_to_token, rpi, seq, kv_indptr, tri_tv.cuda_graph_kv_indices,
                  title="target verify: kv over the prefix; the N draft slots (grey, after "
                        "the frame) come as k/v"), "verify_csr")

# %% [markdown]
# ### The custom mask
#
# Draft token q may attend the whole prefix and its own ancestors in the tree. Per request the
# mask is a row-major block `[N, seq + N]`: prefix columns all 1, then the tree's ancestry
# matrix. The blocks are flattened and concatenated, and `mask_indptr =
# [0, cumsum(N * (seq + N))]` says where each starts. Draft q sits at position
# `seq + depth(q)` but writes its KV at `req_to_token` column `seq + q`.

# %%
req = 0
parents = fb_tv.spec_info.parents[req]
mask_indptr = tri_tv.mask_indptr[: bs + 1]
s = int(seq[req])
block = tri_tv.cuda_graph_custom_mask[mask_indptr[req] : mask_indptr[req + 1]].view(N, s + N)
print(f"request {req}: prefix {s}, parents {parents}")
print("mask_indptr", mask_indptr.tolist())

assert mask_indptr.tolist() == [0] + torch.cumsum(N * (seq.long() + N), 0).tolist()
assert block[:, :s].all()  # the prefix: all 1
assert torch.equal(block[:, s:].bool().cpu(), DraftTree(parents).ancestry_mask())  # the tree
depths = torch.tensor(DraftTree(parents).depths())
assert torch.equal(run_tv.positions[req * N : (req + 1) * N].cpu(), s + depths)

show(viz.draw_tree_mask(tri_tv.cuda_graph_custom_mask, mask_indptr, N, req, parents=parents),
     "verify_tree_mask")

# %%
show(viz.draw_buffers({
    "qo_indptr (stride N)": qo_indptr,
    "kv_indptr (prefix only)": kv_indptr,
    "mask_indptr": mask_indptr,
    "max_extend_len (frozen)": frozen_tv.max_extend_len,
    "custom_mask buffer": f"[T*L = {tri_tv.cuda_graph_custom_mask.numel()}] uint8",
}, "target verify (tree, N = 6): graph buffers after the replay"), "verify_buffers")

# %% [markdown]
# ## 3. Draft extend, v1 and v2
#
# After verification the draft model runs once more over the accepted tokens. In a graph every
# request gets the same number of rows (a uniform stride): **S + 1** in v1 (the verified chain;
# the first `accept_length + 1` rows are real) and **N** in v2. refimpl's `seq_lens` include
# the new rows, so the kv prefix is `seq_lens - rows`. Padded rows have `seq_len` 1 < rows, and
# `clamp(min=0)` gives them an empty prefix.
#
# **v1**, with the chain spec (S + 1 = 4 rows per request):

# %%
tri_v1 = TritonAttnBackend(world, CHAIN)
run_v1, fb_v1, frozen_v1, _ = capture_replay(ForwardMode.DRAFT_EXTEND, tri_v1, CHAIN,
                                             generator=gen_chain, accept_length=[2, 0, 3])
tpr1 = CHAIN.num_steps + 1
seq_v1 = run_v1.seq_lens[:bs]
kv_lens_v1 = torch.clamp(seq_v1 - tpr1, min=0)
print("accept_length", fb_v1.spec_info.accept_length.tolist(), "| seq_lens", seq_v1.tolist(),
      "| kv prefix", kv_lens_v1.tolist())
print("qo_indptr", tri_v1.qo_indptr[: bs + 1].tolist(),
      "| kv_indptr", tri_v1.kv_indptr[: bs + 1].tolist())

assert run_v1.tokens_per_req == tpr1 == frozen_v1.max_extend_len
assert tri_v1.qo_indptr[: bs + 1].tolist() == list(range(0, bs * tpr1 + 1, tpr1))
assert tri_v1.kv_indptr[: bs + 1].tolist() == [0] + torch.cumsum(kv_lens_v1, 0).tolist()
assert kv_lens_v1[-1] == 0  # the padded row: seq_len 1 - 4 rows, clamped

show(viz.draw_csr(world.req_to_token, run_v1.req_pool_indices[:bs], kv_lens_v1,
                  tri_v1.kv_indptr[: bs + 1], tri_v1.cuda_graph_kv_indices,
                  title="draft extend v1: kv = seq_lens - (S+1); the new rows' slots are "
                        "grey"), "draft_extend_v1_csr")

# %% [markdown]
# **v2**, with the tree spec: **N = 6** rows per request. The stride must be N. Before #27545 it
# was S + 1 = 4 for v2 as well, so request 1's "rows" started at row 4, which is in the middle of
# request 0, and the outputs were NaN at bs > 1 ([#27545](https://github.com/sgl-project/sglang/pull/27545)). Below, `positions` shows which
# tokens sit where: with stride N each request's slice is exactly its N new positions; with
# stride S + 1 it is not.

# %%
tri_v2 = TritonAttnBackend(world, TREE)
run_v2, fb_v2, frozen_v2, _ = capture_replay(ForwardMode.DRAFT_EXTEND_V2, tri_v2, TREE)
S = TREE.num_steps
seq_v2 = run_v2.seq_lens[:bs]
kv_lens_v2 = torch.clamp(seq_v2 - N, min=0)
qo_v2 = tri_v2.qo_indptr[: bs + 1]
wrong = list(range(0, bs * (S + 1) + 1, S + 1))  # the pre-#27545 stride
pos = run_v2.positions.cpu()
for i in range(fb_v2.batch_size):
    mine = list(range(int(seq_v2[i]) - N, int(seq_v2[i])))  # request i's new positions
    good = pos[qo_v2[i] : qo_v2[i + 1]].tolist()
    bad = pos[wrong[i] : wrong[i] + N].tolist()
    print(f"req {i}: its positions {mine}\n   stride N   reads {good}\n   stride S+1 reads {bad}")
    assert good == mine
    assert (bad == mine) == (i == 0)  # only request 0 is right with stride S+1

assert run_v2.tokens_per_req == N == frozen_v2.max_extend_len  # current upstream freezes N too
assert qo_v2.tolist() == list(range(0, bs * N + 1, N))
assert tri_v2.kv_indptr[: bs + 1].tolist() == [0] + torch.cumsum(kv_lens_v2, 0).tolist()

show(viz.draw_csr(world.req_to_token, run_v2.req_pool_indices[:bs], kv_lens_v2,
                  tri_v2.kv_indptr[: bs + 1], tri_v2.cuda_graph_kv_indices,
                  title="draft extend v2: kv = seq_lens - N"), "draft_extend_v2_csr")

# %%
show(viz.draw_buffers({
    "v1 qo_indptr (S+1 = 4)": tri_v1.qo_indptr[: bs + 1],
    "v1 kv_indptr": tri_v1.kv_indptr[: bs + 1],
    "v2 qo_indptr (N = 6)": qo_v2,
    "v2 kv_indptr": tri_v2.kv_indptr[: bs + 1],
    "v2 qo_indptr before #27545": torch.tensor(wrong),
    "max_extend_len v1 / v2 (frozen)": f"{frozen_v1.max_extend_len} / {frozen_v2.max_extend_len}",
}, "draft extend: uniform strides"), "draft_extend_buffers")

# %% [markdown]
# ## 4. Multi-step draft decode
#
# The draft model drafts `S` tokens per branch: the first comes from draft extend, the next
# `S - 1` from decode steps over `bs * topk` rows (one per branch), all captured in **one**
# graph (`MultiStepDraftProgram`). The wrapper `TritonMultiStepDraftBackend` owns, per step i,
# a `kv_indptr` row and a `kv_indices` row, and lends them to `S - 1` step backends. One kernel
# fills every step: row (seq r, branch k) of step i = the `seq_lens[r]` prefix slots
# followed by the `i + 1` draft slots of branch k (`req_to_token` columns `seq + k*S + j`).
# The kernel fills all S steps, but only the first S - 1 are read.

# %%
ms = TritonMultiStepDraftBackend(world, TREE)
run_dd, fb_dd, _, _ = capture_replay(ForwardMode.DECODE, ms, TREE, multi_step=True,
                                     program=MultiStepDraftProgram(model, TREE.num_steps))
topk = TREE.topk
rows = bs * topk
rpi, seq = run_dd.req_pool_indices[:bs].clone(), run_dd.seq_lens[:bs].clone()
print("seq_lens", seq.tolist(), "| rows per request", run_dd.tokens_per_req,
      "| KV slots written per request", run_dd.locs_per_req)
print("out_cache_loc [step, seq*branch] of the live batch:\n", draft_decode_step_view(fb_dd))

assert run_dd.tokens_per_req == topk and run_dd.locs_per_req == topk * S
assert len(ms.step_backends) == S - 1  # ... and all of them run inside the one graph:
assert dict(run_dd.graphs[4].custom_kernels()) == {
    "refimpl.decode_attention_stage1.default": (S - 1) * cfg.num_layers,
    "refimpl.decode_attention_stage2.default": (S - 1) * cfg.num_layers}
ref_indptr, ref_indices = draft_decode_kv_indices_ref(rpi, world.req_to_token, seq,
                                                      topk=topk, num_steps=S)
for i in range(S):
    assert ms.kv_indptr[i, : rows + 1].tolist() == ref_indptr[i].tolist()
    used = ref_indices[i].numel()  # seq_lens_sum * topk + rows * (i + 1)
    assert used == int(seq.sum()) * topk + rows * (i + 1)
    assert torch.equal(ms.cuda_graph_kv_indices[i, :used], ref_indices[i])
for i, b in enumerate(ms.step_backends):  # step i's buffers are views of the wrapper's row i
    assert b.kv_indptr.data_ptr() == ms.kv_indptr[i].data_ptr()
    assert b.cuda_graph_kv_indices.data_ptr() == ms.cuda_graph_kv_indices[i].data_ptr()

show(viz.draw_draft_decode_indices(ms.kv_indptr, ms.cuda_graph_kv_indices, seq, topk, S,
                                   used_steps=S - 1, live_seqs=fb_dd.batch_size,
                                   title="multi-step draft decode (topk 2, S 3): per-step kv"),
     "draft_decode_indices")

# %% [markdown]
# **One split buffer for all steps.** The step backends share the wrapper's
# `cuda_graph_num_kv_splits`. Replay fills it **once**, from the prefix lengths, with
# `num_group = topk`: both branches of a sequence get that sequence's count, at every step.

# %%
assert all(b.cuda_graph_num_kv_splits is ms.cuda_graph_num_kv_splits for b in ms.step_backends)
splits_dd = ms.cuda_graph_num_kv_splits[:rows].tolist()
print("num_kv_splits [seq][branch]:", splits_dd)
assert splits_dd == get_num_kv_splits_ref(seq.tolist(), num_group=topk, num_heads=cfg.num_heads,
                                          num_kv_heads=cfg.num_kv_heads,
                                          max_kv_splits=S_MAX, core_count=cores)

# %% [markdown]
# ## 5. Wave
#
# SGLang's Wave backend (AMD) has the same hooks as Triton, with a different buffer layout
# ([facts](../docs/sglang_facts.md#wave)). refimpl runs Wave's layout and hooks on the same
# Triton kernels. First, the decode
# batch of section 1 replayed on Wave: the same answer, and the same kv indices, stored as
# **int32**.

# %%
wave_dec = WaveAttnBackend(world, None)
run_wave = GraphRunner(model, wave_dec, engine, ForwardMode.DECODE, GRAPHS)
run_wave.capture()
wave_logits = run_wave.replay(fb_dec).clone()
assert torch.allclose(wave_logits, run_wave.eager(fb_dec), atol=1e-4)
assert torch.allclose(wave_logits, logits_dec, atol=1e-4)  # = Triton's graph output
assert run_wave.max_num_tokens == run_wave.max_bs  # decode: T = B, so the sizes agree here
assert wave_dec.cuda_graph_attn_logits.shape == tri_dec.cuda_graph_attn_logits.shape

total = int(wave_dec.kv_indptr[bs])
assert wave_dec.cuda_graph_kv_indices.dtype == torch.int32
assert wave_dec.kv_indptr[: bs + 1].tolist() == kv_indptr_dec.tolist()  # as in section 1
assert torch.equal(wave_dec.cuda_graph_kv_indices[:total], packed_dec)
print("wave kv_indices", wave_dec.cuda_graph_kv_indices[:total].tolist())

# %% [markdown]
# In decode T (tokens) = B (batch size), so only the dtypes differ. The difference in *sizes*
# shows for a runner with several rows per request. Below are both backends' buffers as a
# target-verify runner (B = 4, T = B·N = 24) allocates them. Wave sizes its decode scratch and
# its kv indices by **B**. That is why Wave's multi-step draft decode supports chains only:
# `bs*topk` rows do not fit in B-sized buffers.

# %%
B, T, POOL = 4, 4 * N, world.req_to_token_pool.size
tri_b, wave_b = TritonAttnBackend(world, TREE), WaveAttnBackend(world, TREE)
tri_b.init_cuda_graph_state(B, T)
wave_b.init_cuda_graph_state(B, T)
H, Dv = cfg.num_heads, cfg.v_head_dim
expected = {  # buffer: (Triton shape, dtype), (Wave shape, dtype)
    "cuda_graph_kv_indices": (([T * L], torch.int64), ([B * L], torch.int32)),
    "qo_indptr": (([POOL + 1], torch.int64), ([POOL + 1], torch.int32)),
    "cuda_graph_attn_logits": (([T, H, S_MAX, Dv], torch.float32), ([B, H, S_MAX, Dv], torch.float32)),
    "cuda_graph_attn_lse": (([T, H, S_MAX], torch.float32), ([B, H, S_MAX], torch.float32)),
    "cuda_graph_num_kv_splits": (([T], torch.int32), ([B], torch.int32)),
    "cuda_graph_custom_mask": (([T * L], torch.uint8), ([T * L], torch.uint8)),
}
print(f"{'buffer':<26} {'Triton':<26} {'Wave':<26}")
for name, want in expected.items():
    got = [(list(getattr(b, name).shape), getattr(b, name).dtype) for b in (tri_b, wave_b)]
    cells = [f"{shape} {str(dt).replace('torch.', '')}" for shape, dt in got]
    print(f"{name:<26} {cells[0]:<26} {cells[1]:<26}")
    assert got == list(want), (name, got)

try:
    wave_b.check_graph_mode(ForwardMode.DRAFT_EXTEND)
except GraphModeNotSupported as e:
    print("\ndraft extend on Wave:", e)
else:
    raise AssertionError("Wave does not capture draft extend")

# %% [markdown]
# (`qo_indptr` has `pool + 1` = 25 entries: one per request row of the pool (24, row 0 being
# the reserved one) plus one, whatever the batch size. refimpl sizes Wave's custom-mask buffer
# by tokens on purpose: upstream's `[B*L]` is too small for `B` requests of `N*(seq+N)` entries
# each ([differences](../docs/sglang_facts.md#where-refimpl-deliberately-differs-from-upstream)).)
#
# ### The legacy Wave bug: capture skipped the split counts (#26134)
#
# Before the refactor, Wave's capture hook filled the kv buffers but never called
# `get_num_kv_splits`, so after capture the split buffer still held `max_kv_splits` from its
# `torch.full`. Replay did compute the counts. The checker feeds the same batch to both paths
# and compares the graph-read state.

# %%
settings = CheckSettings(capture_bs=(1, 2, 4), raw_bs=(3,))
(wave_rec,) = check_entry_mode(find("wave", "legacy")[0], "decode", CPUEmulatorEngine(), settings)
print(wave_rec)
assert wave_rec.capture_equals_replay is False
assert wave_rec.findings[0].startswith("num_kv_splits")
assert wave_rec.graph_equals_eager is True and wave_rec.matches_oracle is True

# %% [markdown]
# **Why is the output still right?** The graph does not freeze the counts, only the buffer's
# address. The kernel reads `num_kv_splits[b]` when it runs, and every replay calls the hook,
# which computes the counts *before* `graph.replay()`. The stale `max_kv_splits` values are
# seen only by the warm-up and capture runs, whose outputs are thrown away. Any count in
# `[1, max_kv_splits]` gives the same attention up to rounding, since stage 2 merges the splits
# with their log-sum-exp. So the drift is benign. The checker still reports it, because the two
# paths should leave the same state. Here are the same two paths on section 1's decode batch:

# %%
def capture_vs_replay_state(cls, runner, fb, key):
    """`key` of the graph-read state after the capture hook fed `fb` (padded by the runner), and
    after the runner's capture batch + the replay hook fed `fb`: the checker's verdict (a)."""
    padded, bs = runner.padded_batch(fb), runner.pick_bs(fb.batch_size)
    out = []
    for first in (padded, runner.capture_batch(bs)):
        b = cls(runner.world, runner.spec_cfg)
        b.init_cuda_graph_state(runner.max_bs, runner.max_num_tokens)
        call_capture_hook(b, first)
        if first is not padded:
            call_replay_hook(b, padded)
        out.append(b.graph_state(bs, runner.mode)[key].clone())
    return out


wave_cap, wave_rep = capture_vs_replay_state(WaveAttnBackendLegacy, run_dec, fb_dec,
                                             "num_kv_splits")
print("legacy Wave num_kv_splits after capture:", wave_cap.tolist(), " after replay:",
      wave_rep.tolist())
assert (wave_cap == S_MAX).all() and wave_rep.tolist() == splits_1

# %% [markdown]
# ### The legacy Triton draft-extend bug: a ragged `qo_indptr` at replay
#
# Legacy Triton's capture laid the draft-extend rows out with the uniform stride S + 1, but its
# replay wrote `qo_indptr = cumsum(accept_length + 1)`, the ragged layout of the old eager
# path. The rows in the static inputs are still at stride S + 1, so every request after the
# first reads the wrong rows. This one is **not** benign: the graph's output is wrong, while
# eager (and therefore the oracle check) is right.

# %%
(tri_rec,) = check_entry_mode(find("triton", "legacy")[0], "draft_extend", CPUEmulatorEngine(),
                              settings)
print(tri_rec)
assert tri_rec.capture_equals_replay is False and tri_rec.findings[0].startswith("qo_indptr")
assert tri_rec.graph_equals_eager is False and tri_rec.matches_oracle is True

qo_cap, qo_rep = capture_vs_replay_state(TritonAttnBackendLegacy, run_v1, fb_v1, "qo_indptr")
acc = fb_v1.spec_info.accept_length.tolist() + [0]  # + the padded row: 1 row
assert qo_cap.tolist() == list(range(0, bs * tpr1 + 1, tpr1))
assert qo_rep.tolist() == [0] + torch.cumsum(torch.tensor(acc) + 1, 0).tolist()
# request 0 starts right; every later live request starts at the wrong row
assert qo_rep[0] == qo_cap[0] and all(qo_rep[i] != qo_cap[i] for i in range(1, fb_v1.batch_size))

show(viz.draw_buffers({
    "Wave legacy, decode: num_kv_splits after capture": wave_cap,
    "... after replay": wave_rep,
    "Triton legacy, draft extend v1: qo_indptr after capture": qo_cap,
    "... after replay (cumsum(accept + 1))": qo_rep,
    "accept_length (+ padded row)": torch.tensor(acc),
}, "legacy capture vs replay on this notebook's batches (benign / wrong output)"),
    "legacy_findings")

# %% [markdown]
# ## Summary
#
# | mode (Triton)           | rows / request | `qo_indptr`   | kv through `kv_indices` | also read              |
# |-------------------------|----------------|---------------|-------------------------|------------------------|
# | decode                  | 1              | –             | `seq_lens`              | `num_kv_splits` (data), `max_kv_splits` (frozen) |
# | target verify           | N              | stride N      | prefix `seq_lens`       | `custom_mask`, `mask_indptr` |
# | draft extend v1         | S + 1          | stride S + 1  | `seq_lens - (S+1)`      | –                      |
# | draft extend v2         | N              | stride N      | `seq_lens - N`          | –                      |
# | multi-step draft decode | topk           | –             | per step: prefix + i+1 drafts | one shared `num_kv_splits` |
#
# The layout at capture must equal the layout at replay (`refimpl/layout.py`). The two legacy findings
# show both kinds of drift: state that the kernel re-reads at run time (benign) and a layout
# that the graph has already baked in (a wrong answer).
#
# **Next: 02, two patterns.** How a backend keeps its capture and replay paths in agreement by
# construction (Pattern A: capture = the replay body + freeze views; Pattern B: prepare
# graph-bound objects, then replay), and what drifts when the two paths are written separately
# (Pattern C).

# %%
for g in (gen, gen_chain):
    g.release_all()
elapsed = time.perf_counter() - NOTEBOOK_T0
print(f"notebook ran in {elapsed:.1f} s")
