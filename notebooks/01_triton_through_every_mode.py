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
# # Triton through every forward mode
#
# Reading time: about 27 minutes. The CPU run takes about 35 s.
#
# Notebook 00 captured a plain decode step. A server that runs **speculative decoding** captures
# more than that. SGLang's main scheme is **EAGLE** ([paper](https://arxiv.org/abs/2401.15077),
# [SGLang's speculative-decoding docs](https://docs.sglang.io/advanced_features/speculative_decoding.html)):
# a small *draft head*, one layer that reads the big model's hidden states, proposes a few tokens
# cheaply, and the big *target* model checks them all in one forward pass and keeps the ones it
# agrees with. Three sizes describe a configuration: **S** = `num_steps` (how many tokens deep the
# draft goes), **topk** (branches the draft keeps per step; topk = 1 gives a chain, topk > 1 a
# tree) and **N** = `num_draft_tokens` (nodes of the tree the target checks, the last verified
# token included).
#
# This notebook takes one attention backend, SGLang's **Triton** backend (refimpl's unified
# shape, [facts](../docs/sglang_facts.md#triton)), through every graph mode of that scheme.
# Notebook 02 then does the same for the other backends.
#
# ## Before the modes: one EAGLE iteration
#
# One iteration, for one request, in four steps. Three of them are captured as CUDA graphs, each
# under its own **forward mode**, and each mode gives every request a different number of query
# rows. A fourth mode, **IDLE**, is for a data-parallel rank that has no requests this step: it
# still runs the step, so that the collective operations of all ranks line up.

# %%
import math
from pathlib import Path

import torch

try:
    from IPython.display import Image, display
except ImportError:  # run as a plain script (the GPU check does): nothing to display
    Image = display = lambda *args, **kwargs: None  # noqa: E731

from refimpl import ForwardMode, GraphConfig, ModelConfig, layout, viz
from refimpl.backends.triton import TritonAttnBackend, TritonMultiStepDraftBackend
from refimpl.batch import World
from refimpl.batchgen import BatchGenerator, draft_decode_step_view
from refimpl.check import diff_reference
from refimpl.config import SpecConfig
from refimpl.graphs import make_engine
from refimpl.graphs.runner import GraphRunner
from refimpl.kernels import draft_decode_kv_indices_ref, get_num_kv_splits_ref
from refimpl.layout import GraphKind
from refimpl.model import MultiStepDraftProgram, TinyDecoder
from refimpl.rig import state_after
from refimpl.spec import DraftTree

# the repository root, from this file's own location (a kernel runs in the notebook's folder)
ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd().parent
FIGURES = ROOT / "figures"


def show(fig, name):
    """Save ``fig`` as ``figures/01_<name>.png`` and display the saved file."""
    path = viz.save(fig, FIGURES / f"01_{name}.png")
    display(Image(filename=str(path)))


CHAIN = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)  # a chain: N = S + 1
TREE = SpecConfig(num_steps=3, topk=2, num_draft_tokens=6)  # a tree: N = 6 > S + 1 = 4

# %% [markdown]
# The figure uses the tree spec: S = 3 steps, topk = 2, N = 6. The tree below is fixed by hand
# (its node ids are the order in which the drafts are stored), and the target accepts the
# drafts 1 and 3.

# %%
EXAMPLE_TREE = DraftTree([-1, 0, 0, 1, 1, 3])  # node 0: the last verified token
ACCEPTED = [1, 3]  # a chain from the root: accept_length = 2
fig = viz.draw_eagle_iteration(EXAMPLE_TREE.parents, ACCEPTED, TREE.num_steps, TREE.topk)
show(fig, "eagle_iteration")

# the figure's rows per request are the runner's layout rules (refimpl/layout.py)
texts = [t.get_text() for t in fig.axes[0].texts]
for claim, mode, multi in (
    ("topk = {} rows per request per step", ForwardMode.DECODE, True),
    ("N = {} rows per request (one per tree node)", ForwardMode.TARGET_VERIFY, False),
    ("v1: S + 1 = {} rows per request", ForwardMode.DRAFT_EXTEND, False),
    ("v2: N = {} rows per request", ForwardMode.DRAFT_EXTEND_V2, False),
):
    rows = layout.rows_per_request(mode, TREE, multi_step_draft=multi)
    assert any(claim.format(rows) in t for t in texts), (claim, rows)
badges = " ".join(t.get_text() for t in fig.axes[0].texts if t.get_gid() == "mode")
for mode in (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND,
             ForwardMode.DRAFT_EXTEND_V2, ForwardMode.IDLE):
    assert mode.name in badges, mode

# %% [markdown]
# Reading the figure:
#
# 1. **Draft** (graph mode DECODE, the *multi-step draft decode*): the draft head extends each of
#    the `topk` branches by one token per step. The first step's drafts come out of the previous
#    iteration's draft extend; the other S - 1 steps run as decode steps over `bs * topk` rows,
#    all captured in **one** graph. The best N - 1 drafts and the verified token form the tree.
# 2. **Target verify** (TARGET_VERIFY): the target model runs N rows per request, one per tree
#    node, under a custom mask: node q sees the prefix and its own ancestors.
# 3. **Accept**: the longest chain of drafts that the target agrees with. refimpl's
#    `accept_length` counts those accepted drafts (0..S); the target's own next token, the
#    *bonus* token, comes on top, so a request gains `accept_length + 1` tokens. (Upstream's
#    names and counts vary by version and path; this is refimpl's convention,
#    [differences](../docs/sglang_facts.md#where-refimpl-deliberately-differs-from-upstream).)
# 4. **Draft extend** (DRAFT_EXTEND v1 or DRAFT_EXTEND_V2): the draft head runs over the new
#    tokens, to refresh its hidden states and propose the next step-0 drafts. A graph needs the
#    same number of rows for every request: S + 1 in v1, N in v2. Rows past a request's new
#    tokens carry rejected drafts, and their outputs are dropped.
#
# The rest of this notebook looks at the buffers each mode fills on Triton:
#
# | mode                          | rows per request      | kv indexed through `kv_indices` (Triton) |
# |-------------------------------|-----------------------|------------------------------------------|
# | decode / idle                 | 1                     | the whole sequence, `seq_lens`           |
# | target verify                 | N (the draft tokens)  | the prefix only                          |
# | draft extend v1               | S + 1                 | the prefix, `seq_lens - rows`            |
# | draft extend v2               | N                     | the prefix, `seq_lens - rows`            |
# | multi-step draft decode       | topk (one per branch) | prefix + that branch's draft slots       |
#
# (The rules live in `refimpl/layout.py`; upstream facts in
# [docs/sglang_facts.md](../docs/sglang_facts.md#tokens-per-request).) A graph freezes
# addresses and Python values, so every mode gets static buffers that the backend's replay hook
# refills before each replay. For each mode, sections 1-4 capture graphs for batch sizes 1 and
# 4, replay a fresh batch of 3 (padded to 4), check graph == eager, and draw the buffers the
# replay left behind.
#
# **Colours mean the same thing in every figure**, and each figure has a legend: one light colour
# per live request (blue, green, purple), orange for the padded row, light grey for cells the
# graph does not read, cross-hatched grey for stale values left by an earlier batch, and a red
# frame (hatched) for a cell that differs from what it should hold. In an indptr (`[bs+1]`),
# entry i has request i's colour: it is where request i starts; the last entry, the total, is
# white.
#
# Without a GPU, refimpl's Triton kernels run in the Triton interpreter, and
# `make_engine("auto")` is the CPU graph emulator. That is slow, so the model is tiny (one
# layer) and the batches are small. It uses **GQA** (grouped-query attention,
# [paper](https://arxiv.org/abs/2305.13245)): its 4 query heads share 2 KV heads, two query
# heads per KV head, which is why the split heuristic below counts head *groups*.

# %%
engine = make_engine("auto")  # the CPU emulator here, CUDA graphs on a GPU
device = engine.device
cfg = ModelConfig(num_layers=1)  # 4 query heads, 2 KV heads (GQA), head dim 16, fp32
L = 40  # max_context_len
world = World.create(cfg, max_context_len=L, pool_size=32, device=device)
world.randomize_kv(0)  # every prefix "already prefilled"
model = TinyDecoder(cfg, device)

GRAPHS = GraphConfig(max_bs=4, capture_bs=(1, 4), max_context_len=L, speculative=True)
gen = BatchGenerator(world, TREE, seed=1)  # decode, verify, draft extend v2, draft decode
gen_chain = BatchGenerator(world, CHAIN, seed=2)  # chains: verify, draft extend v1
print("engine:", engine.name, "| model:", cfg.kind, f"({cfg.num_heads} q heads, "
      f"{cfg.num_kv_heads} kv heads) | chain:", CHAIN, "| tree:", TREE)


# %% [markdown]
# Two helpers keep the sections short. `capture_replay` builds a `GraphRunner` for one mode,
# captures bs 1 and 4, makes a fresh raw batch of 3 with `BatchGenerator.for_mode`, replays it
# (the bs-4 graph, one padded row), and asserts graph == eager. It also returns the metadata the
# last capture froze. `roles` gives the colour roles of a per-request buffer of the bs-4 graph
# replaying 3 live requests.

# %%
def capture_replay(mode, backend, spec=None, *, program=model, multi_step=False, generator=gen,
                   **batch_kw):
    """Capture bs 1 and 4, replay a fresh raw batch of 3, assert graph == eager."""
    runner = GraphRunner(program, backend, engine, GraphKind.of(mode, multi_step), GRAPHS, spec)
    records = runner.capture()
    frozen = getattr(backend, "forward_metadata", None)  # the last capture's (bs 1) metadata
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


def roles(n, *, indptr=False, live=3, bs=4):
    return viz.batch_roles(n, live, bs, indptr=indptr)


# %% [markdown]
# ## 1. Decode (Triton)
#
# One row per request. In decode the Triton backend's graph reads `kv_indptr`,
# `cuda_graph_kv_indices`, `cuda_graph_num_kv_splits`, and the split-KV scratch
# `cuda_graph_attn_logits` / `cuda_graph_attn_lse`. The replay hook fills the first three
# outside the graph (the CSR kv-index kernel and the split heuristic). The graph holds
# only the attention kernels: two per layer, stage 1 (per split) and stage 2 (the merge).

# %%
tri_dec = TritonAttnBackend(world, None)
run_dec, fb_dec, frozen_dec, logits_dec = capture_replay(ForwardMode.DECODE, tri_dec)

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
assert tri_dec.cuda_graph_kv_indices[total - 1] == 0  # the padded row reads the reserved slot

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
# The heuristic `get_num_kv_splits` runs as one kernel on the device, with no host sync.
# `splits_by_hand` below is the same rule in Python: one chunk size from the batch's longest
# and shortest lengths (the padded row counts, so here the shortest is 1), one from the number
# of cores, and each request takes the larger count. `core_count` is the GPU's SM count;
# refimpl uses a fixed 8 on CPU so runs are reproducible.

# %%
def splits_by_hand(lens, core_count, max_kv_splits, H=cfg.num_heads, Hkv=cfg.num_kv_heads):
    cdiv = lambda a, b: -(-a // b)
    hi, lo = max(lens), min(lens)
    lo = hi if hi * 8 < lo * 10 else lo  # within 25%: treat as uniform
    chunk_1 = cdiv(hi, min(cdiv(hi, lo), max_kv_splits))  # from the lengths
    ext_cores = int(core_count * max(math.log2(hi / 64), 1))
    token_grid = len(lens) * cdiv(H, min(16, H // Hkv))  # GQA: H/Hkv heads per program
    chunk_2 = cdiv(hi, min(cdiv(ext_cores, token_grid), max_kv_splits))  # from the cores
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
# change, because they are data. The graph still equals eager. Then an **IDLE** batch: a rank
# with no requests (bs 0) replays the smallest graph, bs 1, with its one row padded: `seq_len`
# 1, request row 0, so it reads the reserved KV slot 0 and its output is dropped.

# %%
fb_dec2 = gen.decode(3, seq_lens=[40, 36, 30])
out2 = run_dec.replay(fb_dec2).clone()
assert torch.allclose(out2, run_dec.eager(fb_dec2), atol=1e-4)
seq2 = run_dec.seq_lens[:bs].clone()
splits_2 = tri_dec.cuda_graph_num_kv_splits[:bs].tolist()
print(f"batch 2: seq_lens {seq2.tolist()} -> num_kv_splits {splits_2}")
assert splits_2 == splits_by_hand(seq2.tolist(), cores, S_MAX) and splits_2 != splits_1

fb_idle = gen.idle()
idle_out = run_dec.replay(fb_idle)
idle_bs = run_dec.pick_bs(fb_idle.batch_size)
idle_state = {"seq_lens": run_dec.seq_lens[:idle_bs].clone(),
              "kv_indptr": tri_dec.kv_indptr[: idle_bs + 1].clone(),
              "kv_indices": tri_dec.cuda_graph_kv_indices[:1].clone(),
              "num_kv_splits": tri_dec.cuda_graph_num_kv_splits[:idle_bs].clone()}
print("idle: graph bs", idle_bs, {k: v.tolist() for k, v in idle_state.items()},
      "| output rows", idle_out.shape[0])
assert idle_bs == 1 and idle_out.shape[0] == 0
assert idle_state["kv_indptr"].tolist() == [0, 1] and idle_state["kv_indices"].tolist() == [0]
assert idle_state["num_kv_splits"].tolist() == splits_by_hand([1], cores, S_MAX)

show(viz.draw_buffers({
    "batch 1 seq_lens": seq,
    "batch 1 num_kv_splits": torch.tensor(splits_1, dtype=torch.int32),
    "batch 2 seq_lens": seq2,
    "batch 2 num_kv_splits": torch.tensor(splits_2, dtype=torch.int32),
    "IDLE seq_lens (graph bs 1)": idle_state["seq_lens"],
    "IDLE num_kv_splits": idle_state["num_kv_splits"],
    "max_kv_splits (frozen: stage-1 grid dim 3)": S_MAX,
    "cuda_graph_attn_logits": f"{list(tri_dec.cuda_graph_attn_logits.shape)} float32",
    "core_count (CPU: fixed)": cores,
}, "decode: the bs-4 graph with two batches, the bs-1 graph with an IDLE batch",
    roles={"batch 1 seq_lens": roles(4), "batch 1 num_kv_splits": roles(4),
           "batch 2 seq_lens": roles(4), "batch 2 num_kv_splits": roles(4),
           "IDLE seq_lens (graph bs 1)": roles(1, live=0, bs=1),
           "IDLE num_kv_splits": roles(1, live=0, bs=1)}), "decode_splits")
gen.release(fb_dec2)

# %% [markdown]
# ## 2. Target verify (Triton): trees and chains
#
# In target verify the target model checks the N draft tokens of every request in one forward
# pass. With `topk = 2` the drafts form a tree. Each request takes **N = 6 rows**, so
# `qo_indptr = [0, N, 2N, ...]`. Here `seq_lens` counts only the verified **prefix**. The Triton
# kernel reads the prefix through `kv_indices` and gets the drafts' own k/v directly from the
# forward pass, so `kv_indptr` covers the prefix only (FlashInfer instead indexes prefix + N,
# notebook 02).

# %%
tri_tv = TritonAttnBackend(world, TREE)
run_tv, fb_tv, frozen_tv, _ = capture_replay(ForwardMode.TARGET_VERIFY, tri_tv, TREE,
                                             seq_lens=[6, 17, 30])  # prefixes; trees random
N = TREE.num_draft_tokens
rpi, seq = run_tv.req_pool_indices[:bs].clone(), run_tv.seq_lens[:bs].clone()
qo_indptr, kv_indptr = tri_tv.qo_indptr[: bs + 1].clone(), tri_tv.kv_indptr[: bs + 1].clone()
print("seq_lens (prefix)", seq.tolist(), "| qo_indptr", qo_indptr.tolist(),
      "| kv_indptr", kv_indptr.tolist())

assert frozen_tv.max_extend_len == N
assert qo_indptr.tolist() == list(range(0, (bs + 1) * N, N))  # stride N, padded row included
assert kv_indptr.tolist() == [0] + torch.cumsum(seq, 0).tolist()  # prefix only: no "+ N"
# the drafts' KV still lands in the cache: request i's N rows write r2t columns seq_i .. seq_i+N-1
for i in range(fb_tv.batch_size):
    cols = world.req_to_token[rpi[i], seq[i] : seq[i] + N].long()
    assert torch.equal(fb_tv.out_cache_loc[i * N : (i + 1) * N], cols)

show(viz.draw_csr(world.req_to_token, rpi, seq, kv_indptr, tri_tv.cuda_graph_kv_indices,
                  title="target verify (Triton): kv over the prefix; the N draft slots after "
                        "the frame come as k/v"), "verify_csr")

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
mask_indptr = tri_tv.mask_indptr[: bs + 1].clone()
s = int(seq[req])
block = tri_tv.cuda_graph_custom_mask[mask_indptr[req] : mask_indptr[req + 1]].view(N, s + N)
print(f"request {req}: prefix {s}, parents {parents}")
print("mask_indptr", mask_indptr.tolist())

assert mask_indptr.tolist() == [0] + torch.cumsum(N * (seq.long() + N), 0).tolist()
assert block[:, :s].all()  # the prefix: all 1
assert torch.equal(block[:, s:].bool().cpu(), DraftTree(parents).ancestry_mask())  # the tree
depths = torch.tensor(DraftTree(parents).depths())
assert torch.equal(run_tv.positions[req * N : (req + 1) * N].cpu(), s + depths)

show(viz.draw_tree_mask(tri_tv.cuda_graph_custom_mask, mask_indptr, N, req, parents=parents,
                        title="target verify, a tree (topk 2, N 6): request 0's mask block"),
     "verify_tree_mask")

# %% [markdown]
# **A chain** (topk = 1, N = S + 1 = 4) is the same layout with a lower-triangular tree part:
# draft q sees drafts 0..q. Below, the chain spec's verify on a batch of three chains, through
# the hooks only, with no forward pass: `state_after` (from `refimpl.rig`, what the checker uses)
# runs a fresh backend's capture hook and then its replay hook, as a replay would.

# %%
fb_tc = gen_chain.target_verify(3, seq_lens=[9, 3, 21])
run_tc = GraphRunner(None, TritonAttnBackend(world, CHAIN), engine, ForwardMode.TARGET_VERIFY, GRAPHS, CHAIN)
padded_tc = run_tc.padded_batch(fb_tc)
tri_tc, state_tc = state_after(lambda: TritonAttnBackend(world, CHAIN), run_tc, padded_tc, replay=True)
Nc = CHAIN.num_draft_tokens
assert not diff_reference(state_tc, tri_tc.reference_graph_state(padded_tc))  # as the rules say
chain_block = state_tc["custom_mask"][: int(state_tc["mask_indptr"][1])].view(Nc, 9 + Nc)
assert torch.equal(chain_block[:, 9:].bool().cpu(), torch.ones(Nc, Nc, dtype=torch.bool).tril())
print("chain: qo_indptr", state_tc["qo_indptr"].tolist(), "| mask_indptr",
      state_tc["mask_indptr"].tolist())

show(viz.draw_tree_mask(state_tc["custom_mask"], state_tc["mask_indptr"], Nc, 0,
                        parents=fb_tc.spec_info.parents[0],
                        title="target verify, a chain (topk 1, N 4): request 0's mask block"),
     "verify_chain_mask")

# %% [markdown]
# ## 3. Draft extend, v1 and v2 (Triton)
#
# After verification the draft model runs once more over the new tokens. In a graph every
# request gets the same number of rows (a uniform stride): **S + 1** in v1 (the verified chain;
# the first `accept_length + 1` rows are real: the accepted drafts and the bonus token) and
# **N** in v2. Two of refimpl's conventions show here
# ([differences](../docs/sglang_facts.md#where-refimpl-deliberately-differs-from-upstream)):
# `accept_length` counts the accepted drafts (0..S), without the bonus token; and `seq_lens`
# include the new rows in **every** extend mode (upstream's v1 passes them without, v2 with), so
# the kv prefix is `seq_lens - rows`. Padded rows have `seq_len` 1 < rows, and `clamp(min=0)`
# gives them an empty prefix.
#
# **v1**, with the chain spec (S + 1 = 4 rows per request):

# %%
tri_v1 = TritonAttnBackend(world, CHAIN)
run_v1, fb_v1, frozen_v1, _ = capture_replay(ForwardMode.DRAFT_EXTEND, tri_v1, CHAIN,
                                             generator=gen_chain, accept_length=[2, 0, 3])
tpr1 = CHAIN.num_steps + 1
seq_v1 = run_v1.seq_lens[:bs].clone()
kv_lens_v1 = torch.clamp(seq_v1 - tpr1, min=0)
print("accept_length", fb_v1.spec_info.accept_length.tolist(), "| seq_lens", seq_v1.tolist(),
      "| kv prefix", kv_lens_v1.tolist())
print("qo_indptr", tri_v1.qo_indptr[: bs + 1].tolist(),
      "| kv_indptr", tri_v1.kv_indptr[: bs + 1].tolist())

assert frozen_v1.max_extend_len == tpr1
assert tri_v1.qo_indptr[: bs + 1].tolist() == list(range(0, bs * tpr1 + 1, tpr1))
assert tri_v1.kv_indptr[: bs + 1].tolist() == [0] + torch.cumsum(kv_lens_v1, 0).tolist()
assert kv_lens_v1[-1] == 0  # the padded row: seq_len 1 - 4 rows, clamped

show(viz.draw_csr(world.req_to_token, run_v1.req_pool_indices[:bs], kv_lens_v1,
                  tri_v1.kv_indptr[: bs + 1], tri_v1.cuda_graph_kv_indices,
                  title="draft extend v1: kv = seq_lens - (S+1); the new rows' slots are "
                        "not packed"), "draft_extend_v1_csr")

# %% [markdown]
# **v2**, with the tree spec: **N = 6** rows per request. The stride must be N. Before
# [#27545](https://github.com/sgl-project/sglang/pull/27545) it was S + 1 = 4 for v2 as well, so
# request 1's "rows" started at row 4, which is in the middle of request 0, and the outputs were
# NaN at bs > 1. Below, `positions` shows which tokens sit where: with stride N each request's
# slice is exactly its N new positions; with stride S + 1 it is not. refimpl's v2 freezes
# `max_extend_len = N`, the stride, so the kernel's query-block grid covers every row (current
# upstream does too; the code right after
# [#26665](https://github.com/sgl-project/sglang/pull/26665) froze S + 1,
# [differences](../docs/sglang_facts.md#where-refimpl-deliberately-differs-from-upstream)).

# %%
tri_v2 = TritonAttnBackend(world, TREE)
run_v2, fb_v2, frozen_v2, _ = capture_replay(ForwardMode.DRAFT_EXTEND_V2, tri_v2, TREE)
S = TREE.num_steps
seq_v2 = run_v2.seq_lens[:bs].cpu()
kv_lens_v2 = torch.clamp(seq_v2 - N, min=0)
qo_v2 = tri_v2.qo_indptr[: bs + 1].cpu()  # host copies: `wrong` below is built on the host
wrong = torch.arange(0, bs * (S + 1) + 1, S + 1)  # the pre-#27545 stride
pos = run_v2.positions.cpu()
for i in range(fb_v2.batch_size):
    mine = list(range(int(seq_v2[i]) - N, int(seq_v2[i])))  # request i's new positions
    good = pos[qo_v2[i] : qo_v2[i + 1]].tolist()
    bad = pos[wrong[i] : wrong[i] + N].tolist()
    print(f"req {i}: its positions {mine}\n   stride N   reads {good}\n   stride S+1 reads {bad}")
    assert good == mine
    assert (bad == mine) == (i == 0)  # only request 0 is right with stride S+1

assert frozen_v2.max_extend_len == N
assert qo_v2.tolist() == list(range(0, bs * N + 1, N))
assert tri_v2.kv_indptr[: bs + 1].tolist() == [0] + torch.cumsum(kv_lens_v2, 0).tolist()

show(viz.draw_csr(world.req_to_token, run_v2.req_pool_indices[:bs], kv_lens_v2,
                  tri_v2.kv_indptr[: bs + 1], tri_v2.cuda_graph_kv_indices,
                  title="draft extend v2: kv = seq_lens - N"), "draft_extend_v2_csr")

# %%
acc = fb_v1.spec_info.accept_length.tolist()
fig = viz.draw_buffers({
    "v1 accept_length (live)": fb_v1.spec_info.accept_length,
    "v1 qo_indptr (S+1 = 4)": tri_v1.qo_indptr[: bs + 1],
    "v1 kv_indptr": tri_v1.kv_indptr[: bs + 1],
    "v2 qo_indptr (N = 6)": qo_v2,
    "v2 kv_indptr": tri_v2.kv_indptr[: bs + 1],
    "v2 qo_indptr before #27545": wrong,
    "max_extend_len v1 / v2 (frozen)": f"{frozen_v1.max_extend_len} / {frozen_v2.max_extend_len}",
}, "draft extend (Triton): uniform strides",
    roles={"v1 accept_length (live)": roles(3), "v1 qo_indptr (S+1 = 4)": roles(5, indptr=True),
           "v1 kv_indptr": roles(5, indptr=True), "v2 qo_indptr (N = 6)": roles(5, indptr=True),
           "v2 kv_indptr": roles(5, indptr=True),
           "v2 qo_indptr before #27545": roles(5, indptr=True)},
    differs={"v2 qo_indptr before #27545": wrong != qo_v2},
    differs_label="differs from the stride-N layout")
assert len([p for p in fig.axes[0].patches if p.get_gid() == "differs"]) == bs  # entries 1..4
show(fig, "draft_extend_buffers")

# %% [markdown]
# ## 4. Multi-step draft decode (Triton)
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

# S - 1 decode steps, all of them inside the one graph:
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
# ## Summary
#
# | mode (Triton)           | rows / request | `qo_indptr`   | kv through `kv_indices` | also read              |
# |-------------------------|----------------|---------------|-------------------------|------------------------|
# | decode / idle           | 1              | –             | `seq_lens`              | `num_kv_splits` (data), `max_kv_splits` (frozen) |
# | target verify           | N              | stride N      | prefix `seq_lens`       | `custom_mask`, `mask_indptr` |
# | draft extend v1         | S + 1          | stride S + 1  | `seq_lens - (S+1)`      | –                      |
# | draft extend v2         | N              | stride N      | `seq_lens - N`          | –                      |
# | multi-step draft decode | topk           | –             | per step: prefix + i+1 drafts | one shared `num_kv_splits` |
#
# The layout at capture must equal the layout at replay (`refimpl/layout.py`): the graph bakes
# in the rows' stride in the static inputs and the frozen `max_extend_len`, so every replay
# must refill the buffers in place with that same layout.
#
# **Next: 02, the other backends.** The same buffers for Wave, FlashInfer and FlashInfer-MLA,
# and two historical bugs of the old Wave and Triton code, cell by cell.

# %%
for g in (gen, gen_chain):
    g.release_all()
assert not gen.live_requests and not gen_chain.live_requests
