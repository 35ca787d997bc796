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
# ## Before the modes: one EAGLE iteration
#
# One iteration, for one request, in four steps. Three of them are captured as CUDA graphs, each
# under its own **forward mode**, and each mode gives every request a different number of query
# rows. A fourth mode, **IDLE**, is for a data-parallel rank that has no requests this step: it
# still runs the step, so that the collective operations of all ranks line up.

# %%
import math
import re
from pathlib import Path

import torch

try:
    from IPython.display import Image, display
except ImportError:  # run as a plain script (the GPU check does): nothing to display
    Image = display = lambda *args, **kwargs: None  # noqa: E731

from refimpl import ForwardMode, GraphConfig, ModelConfig, layout, viz
from refimpl.backends import GraphModeNotSupported, find
from refimpl.backends.flashinfer import FlashInferAttnBackend, FlashInferMultiStepDraftBackend
from refimpl.backends.flashinfer_mla import FlashInferMLAAttnBackend, FlashInferMLAAttnBackendAsUpstream
from refimpl.backends.triton import TritonAttnBackend, TritonAttnBackendLegacy, TritonMultiStepDraftBackend
from refimpl.backends.wave import WaveAttnBackend, WaveAttnBackendLegacy, WaveMultiStepDraftBackend
from refimpl.batch import World
from refimpl.batchgen import BatchGenerator, draft_decode_step_view
from refimpl.check import CheckSettings, capture_vs_replay, check_entry_mode, diff_reference, diff_states
from refimpl.config import SpecConfig
from refimpl.flashinfer_wrappers import read_partition
from refimpl.graphs import CPUEmulatorEngine, make_engine
from refimpl.graphs.runner import GraphRunner, call_capture_hook, call_replay_hook
from refimpl.kernels import draft_decode_kv_indices_ref, get_num_kv_splits_ref
from refimpl.layout import GraphKind
from refimpl.model import MultiStepDraftProgram, TinyDecoder
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
# The rest of this notebook looks at the buffers each mode fills:
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
# refills before each replay. Sections 1-4 go through the modes on SGLang's **Triton** attention
# backend (refimpl's unified shape, [facts](../docs/sglang_facts.md#triton)): for each mode they
# capture graphs for batch sizes 1 and 4, replay a fresh batch of 3 (padded to 4), check
# graph == eager, and draw the buffers the replay left behind. Sections 5-7 draw the same
# buffers for **Wave**, **FlashInfer** and **FlashInfer-MLA** (the FlashInfer backend for models
# with **MLA**, DeepSeek's multi-head latent attention, [paper](https://arxiv.org/abs/2405.04434):
# one compressed KV row per token, shared by all query heads); section 8 points to notebook 03
# for the block tables of Cutlass-MLA and TRTLLM-MLA; section 9 shows two historical bugs cell
# by cell.
#
# **Colours mean the same thing in every figure**, and each figure has a legend: one light colour
# per live request (blue, green, purple), orange for the padded row, light grey for cells the
# graph does not read, cross-hatched grey for stale values left by an earlier batch, and a red
# frame (hatched) for a cell that differs from what it should hold. In an indptr (`[bs+1]`),
# entry i has request i's colour: it is where request i starts; the last entry, the total, is
# white.
#
# The kernels are refimpl's Triton kernels. Without a GPU they run in the Triton interpreter,
# and `make_engine("auto")` is the CPU graph emulator. That is slow, so the model is tiny (one
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
gen_chain = BatchGenerator(world, CHAIN, seed=2)  # chains: verify, draft extend v1, Wave's draft
print("engine:", engine.name, "| model:", cfg.kind, f"({cfg.num_heads} q heads, "
      f"{cfg.num_kv_heads} kv heads) | chain:", CHAIN, "| tree:", TREE)


# %% [markdown]
# Four helpers keep the sections short. `capture_replay` builds a `GraphRunner` for one mode,
# captures bs 1 and 4, makes a fresh raw batch of 3 with `BatchGenerator.for_mode`, replays it
# (the bs-4 graph, one padded row), and asserts graph == eager. It also returns the metadata the
# last capture froze. `hooks_only` runs just the metadata work of that capture and one replay,
# without the forward passes, for the backends whose buffers are drawn but whose graphs the
# checker and notebook 02 already exercise: it keeps what each capture froze, so
# `graph_state(bs, mode)` reads the bs-4 graph's view. `roles` gives the colour roles of a
# per-request buffer of the bs-4 graph replaying 3 live requests. `capture_vs_replay_state`
# computes what the checker's verdict (a) compares (`refimpl.check.capture_vs_replay`), but keeps
# both states instead of only their differences: P runs the *capture* hook on the padded batch;
# Q runs the capture hook on the runner's capture batch, then the *replay* hook on the padded
# batch.

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


def hooks_only(backend, mode, spec, fb, *, multi_step=False):
    """The capture hooks (bs 4, then 1, as a runner captures) and one replay hook for ``fb``,
    no forward pass. Afterwards the backend's metadata is what the bs-4 capture froze."""
    runner = GraphRunner(None, backend, engine, GraphKind.of(mode, multi_step), GRAPHS, spec)
    owners = getattr(backend, "step_backends", [backend])  # multi-step: one per step
    frozen = {}
    for bs in sorted(runner.capture_bs, reverse=True):
        call_capture_hook(backend, runner.capture_batch(bs))
        frozen[bs] = [getattr(b, "forward_metadata", None) for b in owners]
    padded = runner.padded_batch(fb)
    call_replay_hook(backend, padded)
    for b, md in zip(owners, frozen[padded.batch_size]):
        b.forward_metadata = md  # the graph of this bs reads what its capture froze
    return runner, padded


def roles(n, *, indptr=False, live=3, bs=4):
    return viz.batch_roles(n, live, bs, indptr=indptr)


def capture_vs_replay_state(cls, runner, fb):
    """The graph-read state after the capture path (P) and after the replay path (Q) for ``fb``
    (padded by the runner): what the checker's verdict (a) compares."""
    padded, bs = runner.padded_batch(fb), runner.pick_bs(fb.batch_size)
    out = []
    for first in (padded, runner.capture_batch(bs)):
        b = cls(runner.world, runner.spec_cfg)
        b.init_cuda_graph_state(runner.max_bs, runner.max_num_tokens)
        call_capture_hook(b, first)
        if first is not padded:
            call_replay_hook(b, padded)
        out.append({k: v.clone() if isinstance(v, torch.Tensor) else v
                    for k, v in b.graph_state(bs, runner.mode).items()})
    return out


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
kv_indptr_dec, packed_dec = kv_indptr.clone(), packed.clone()  # for Wave in section 5

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
# section 6).

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
# draft q sees drafts 0..q. Below, the chain spec's verify through the same hooks (no forward
# pass: `hooks_only`), on a batch of three chains.

# %%
tri_tc = TritonAttnBackend(world, CHAIN)
fb_tc = gen_chain.target_verify(3, seq_lens=[9, 3, 21])
run_tc, padded_tc = hooks_only(tri_tc, ForwardMode.TARGET_VERIFY, CHAIN, fb_tc)
Nc = CHAIN.num_draft_tokens
state_tc = tri_tc.graph_state(bs, ForwardMode.TARGET_VERIFY)
assert not diff_reference(state_tc, tri_tc.reference_graph_state(padded_tc))  # as the rules say
chain_block = state_tc["custom_mask"][: int(state_tc["mask_indptr"][1])].view(Nc, 9 + Nc)
assert torch.equal(chain_block[:, 9:].bool().cpu(), torch.ones(Nc, Nc, dtype=torch.bool).tril())
print("chain: qo_indptr", state_tc["qo_indptr"].tolist(), "| mask_indptr",
      state_tc["mask_indptr"].tolist())

show(viz.draw_tree_mask(state_tc["custom_mask"], state_tc["mask_indptr"], Nc, 0,
                        parents=fb_tc.spec_info.parents[0],
                        title="target verify, a chain (topk 1, N 4): request 0's mask block"),
     "verify_chain_mask")

# %%
fig = viz.draw_buffers({
    "tree: qo_indptr (stride N = 6)": qo_indptr,
    "tree: kv_indptr (prefix only)": kv_indptr,
    "tree: mask_indptr": mask_indptr,
    "chain: qo_indptr (stride N = 4)": state_tc["qo_indptr"],
    "chain: kv_indptr": state_tc["kv_indptr"],
    "chain: mask_indptr": state_tc["mask_indptr"],
    "max_extend_len (frozen) tree / chain": f"{frozen_tv.max_extend_len} / "
                                            f"{state_tc['max_extend_len']}",
    "custom_mask buffer": f"[T*L = {tri_tv.cuda_graph_custom_mask.numel()}] uint8",
}, "target verify (Triton): graph buffers after the replay of a batch of 3",
    roles={k: roles(5, indptr=True) for k in ("tree: qo_indptr (stride N = 6)",
           "tree: kv_indptr (prefix only)", "tree: mask_indptr", "chain: qo_indptr (stride N = 4)",
           "chain: kv_indptr", "chain: mask_indptr")})
show(fig, "verify_buffers")

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
# ## 5. Wave
#
# SGLang's Wave backend (AMD) has the same hooks as Triton, with a different buffer layout
# ([facts](../docs/sglang_facts.md#wave)). refimpl runs Wave's layout and hooks on the same
# Triton kernels. Wave captures decode, idle, target verify and multi-step draft decode (chains
# only), not draft extend. First, the decode batch of section 1 replayed on Wave: the same
# answer, and the same kv indices, stored as **int32**.

# %%
wave_dec = WaveAttnBackend(world, None)
run_wave = GraphRunner(model, wave_dec, engine, ForwardMode.DECODE, GRAPHS)
run_wave.capture()
wave_logits = run_wave.replay(fb_dec).clone()
assert torch.allclose(wave_logits, run_wave.eager(fb_dec), atol=1e-4)
assert torch.allclose(wave_logits, logits_dec, atol=1e-4)  # = Triton's graph output

total = int(wave_dec.kv_indptr[bs])
assert wave_dec.kv_indptr[: bs + 1].tolist() == kv_indptr_dec.tolist()  # as in section 1
assert torch.equal(wave_dec.cuda_graph_kv_indices[:total], packed_dec)
print("wave kv_indices", wave_dec.cuda_graph_kv_indices[:total].tolist())

try:
    wave_dec.check_graph_mode(ForwardMode.DRAFT_EXTEND)
except GraphModeNotSupported as e:
    print("draft extend on Wave:", e)
else:
    raise AssertionError("Wave does not capture draft extend")

# %% [markdown]
# ### Buffer sizes: B rows, not T
#
# In decode T (tokens) = B (batch size), so only the dtypes differ. The difference in *sizes*
# shows for a runner with several rows per request. Below are both backends' buffers as a
# target-verify runner (B = 4, T = B·N = 24) allocates them. Wave sizes its split buffer, its
# decode scratch and its kv indices by **B**; Triton by **T**. That is why Wave's multi-step draft
# decode supports chains only: a tree's `bs * topk` = 8 draft rows do not fit in a `[B]` split
# buffer. The custom mask is `[T*L]` in both: upstream sizes Wave's `[B*L]`, too small for B
# requests of `N*(seq+N)` entries each, so refimpl deviates on purpose
# ([differences](../docs/sglang_facts.md#where-refimpl-deliberately-differs-from-upstream)).

# %%
B, T, POOL = 4, 4 * N, world.req_to_token_pool.size
tri_b, wave_b = TritonAttnBackend(world, TREE), WaveAttnBackend(world, TREE)
tri_b.init_cuda_graph_state(B, T)
wave_b.init_cuda_graph_state(B, T)
H, Dv = cfg.num_heads, cfg.v_head_dim
expected = {  # buffer: (Triton shape, dtype), (Wave shape, dtype)
    "cuda_graph_num_kv_splits": (([T], torch.int32), ([B], torch.int32)),
    "cuda_graph_attn_lse": (([T, H, S_MAX], torch.float32), ([B, H, S_MAX], torch.float32)),
    "cuda_graph_kv_indices": (([T * L], torch.int64), ([B * L], torch.int32)),
    "cuda_graph_custom_mask": (([T * L], torch.uint8), ([T * L], torch.uint8)),
    "qo_indptr": (([POOL + 1], torch.int64), ([POOL + 1], torch.int32)),
}
for name, want in expected.items():
    got = [(list(getattr(b, name).shape), getattr(b, name).dtype) for b in (tri_b, wave_b)]
    assert got == list(want), (name, got)

sym = {"cuda_graph_num_kv_splits": ("[T]", "[B]"), "cuda_graph_attn_lse": ("[T, H, S]", "[B, H, S]"),
       "cuda_graph_kv_indices": ("[T*L]", "[B*L]"), "cuda_graph_custom_mask": ("[T*L]", "[T*L]"),
       "qo_indptr": ("[pool+1]", "[pool+1]")}
sizes, notes = {}, {}
for name in expected:
    t_, w_ = getattr(tri_b, name), getattr(wave_b, name)
    sizes[name] = {"Triton": t_.numel(), "Wave": w_.numel()}
    notes[name] = {"Triton": f"{sym[name][0]} = {t_.numel()} {str(t_.dtype)[6:]}",
                   "Wave": f"{sym[name][1]} = {w_.numel()} {str(w_.dtype)[6:]}"}
sizes["cuda_graph_custom_mask"]["Wave upstream (not allocated)"] = B * L
notes["cuda_graph_custom_mask"]["Wave upstream (not allocated)"] = f"[B*L] = {B * L} uint8"
verify_mask = int(tri_tv.mask_indptr[fb_tv.batch_size])  # section 2's 3 requests: sum N*(seq+N)
needed = {
    "cuda_graph_num_kv_splits": (B * TREE.topk, "multi-step draft decode, bs 4 x topk 2: rows"),
    "cuda_graph_custom_mask": (verify_mask, "section 2's verify batch: sum N*(seq+N)"),
}
fig = viz.draw_buffer_sizes(sizes, notes=notes, needed=needed,
                            title=f"Triton vs Wave buffers of a target-verify runner "
                                  f"(B = {B}, T = B*N = {T}, L = {L})")
short = sorted(t.get_text().split()[0] for a in fig.axes for t in a.texts
               if t.get_gid() == "too_small")
assert short == ["[B*L]", "[B]"], short  # Wave's split buffer, upstream's Wave mask
assert verify_mask > B * L
show(fig, "wave_vs_triton_sizes")

# %% [markdown]
# ### Wave's verify and draft-decode buffers
#
# Verify on Wave fills the same CSR and mask layout as Triton, with an int32 `qo_indptr`, here on
# section 2's tree batch. Multi-step draft decode on Wave needs a chain: the wrapper's per-step
# rows (one per sequence) are copied into each step's Wave buffers, and each step computes its
# own split counts into its `[B]` buffer.

# %%
wave_tv = WaveAttnBackend(world, TREE)
_, padded_wtv = hooks_only(wave_tv, ForwardMode.TARGET_VERIFY, TREE, fb_tv)
state_wtv = wave_tv.graph_state(bs, ForwardMode.TARGET_VERIFY)
assert not diff_reference(state_wtv, wave_tv.reference_graph_state(padded_wtv))
assert state_wtv["qo_indptr"].tolist() == qo_indptr.tolist()  # = Triton's, section 2
assert state_wtv["mask_indptr"].tolist() == mask_indptr.tolist()

wave_ms = WaveMultiStepDraftBackend(world, CHAIN)
fb_wdd = gen_chain.draft_decode(3, seq_lens=[12, 5, 26])
_, padded_wdd = hooks_only(wave_ms, ForwardMode.DECODE, CHAIN, fb_wdd, multi_step=True)
state_wdd = wave_ms.graph_state(bs, ForwardMode.DECODE)
assert not diff_reference(state_wdd, wave_ms.reference_graph_state(padded_wdd))
for i in range(CHAIN.num_steps - 1):  # step i: prefix + i + 1 draft slots, one row per sequence
    assert torch.diff(state_wdd[f"step{i}.kv_indptr"]).tolist() == (
        padded_wdd.seq_lens + i + 1).tolist()
print("wave draft decode (chain):", {k: v.tolist() for k, v in state_wdd.items()
                                     if "kv_indptr" in k or "num_kv_splits" in k})

wave_rows = {
    "decode: num_kv_splits [B]": wave_dec.cuda_graph_num_kv_splits[:bs],
    "verify: qo_indptr (int32)": state_wtv["qo_indptr"],
    "verify: kv_indptr": state_wtv["kv_indptr"],
    "verify: mask_indptr": state_wtv["mask_indptr"],
}
wave_roles = {"decode: num_kv_splits [B]": roles(4), "verify: qo_indptr (int32)": roles(5, indptr=True),
              "verify: kv_indptr": roles(5, indptr=True), "verify: mask_indptr": roles(5, indptr=True)}
for i in range(CHAIN.num_steps - 1):
    wave_rows[f"draft step {i}: kv_indptr"] = state_wdd[f"step{i}.kv_indptr"]
    wave_rows[f"draft step {i}: num_kv_splits"] = state_wdd[f"step{i}.num_kv_splits"]
    wave_roles[f"draft step {i}: kv_indptr"] = roles(5, indptr=True)
    wave_roles[f"draft step {i}: num_kv_splits"] = roles(4)
show(viz.draw_buffers(wave_rows, "Wave: what its graphs read (decode bs 4, tree verify, chain "
                      "draft decode)", roles=wave_roles), "wave_buffers")

# %% [markdown]
# ## 6. FlashInfer (Pattern B)
#
# SGLang's FlashInfer backend ([facts](../docs/sglang_facts.md#flashinfer)) keeps its kernels
# inside FlashInfer *wrapper* objects. A wrapper built for graphs is **bound** to buffers at
# construction: `_paged_kv_indptr_buf`, `_paged_kv_indices_buf`, `_paged_kv_last_page_len_buf`,
# and for prefill wrappers (verify, draft extend) `_qo_indptr_buf` and, only when the spec has a
# mask, `_custom_mask_buf` / `_mask_indptr_buf`. Capture creates one wrapper per batch size and
# registers it; `plan()` copies the batch into the bound buffers and writes a **work partition**
# into the wrapper's workspace, and `run()` reads only those. Notebook 02 shows why every replay
# must re-plan. Here: what the bound buffers hold for each mode it captures, on the stand-in
# wrappers that run without a GPU (`refimpl/flashinfer_wrappers/standin.py`).

# %%
fi_state, fi_wrappers, fi_padded = {}, {}, {}
for mode, fb in ((ForwardMode.DECODE, fb_dec), (ForwardMode.TARGET_VERIFY, fb_tv),
                 (ForwardMode.DRAFT_EXTEND, gen.draft_extend(3, 1, accept_length=[1, 3, 0])),
                 (ForwardMode.DRAFT_EXTEND_V2, fb_v2)):
    fi = FlashInferAttnBackend(world, TREE)
    _, padded = hooks_only(fi, mode, TREE, fb)
    state = fi.graph_state(bs, mode)
    assert not diff_reference(state, fi.reference_graph_state(padded)), mode  # as the rules say
    registry = fi.decode_cuda_graph_metadata if mode.is_decode() else fi.prefill_cuda_graph_metadata
    fi_state[mode], fi_padded[mode] = state, padded
    fi_wrappers[mode] = {b: registry[b][0] for b in sorted(registry)}  # one wrapper per bs
    print(f"{mode.label:>16}: wrappers for bs {sorted(registry)};",
          {k: v.tolist() for k, v in state.items() if "indptr" in k})

# verify indexes prefix + N (the drafts' KV is written first), under the bound tree mask
tv_kv = fi_padded[ForwardMode.TARGET_VERIFY].seq_lens + N
assert torch.diff(fi_state[ForwardMode.TARGET_VERIFY]["paged_kv_indptr"]).tolist() == tv_kv.tolist()
w_tv = fi_wrappers[ForwardMode.TARGET_VERIFY][4]
assert w_tv._custom_mask_buf is not None  # verify: mask buffers bound
assert all(fi_wrappers[m][4]._custom_mask_buf is None  # draft extend: no mask, causal plans
           for m in (ForwardMode.DRAFT_EXTEND, ForwardMode.DRAFT_EXTEND_V2))

show(viz.draw_csr(world.req_to_token, fi_padded[ForwardMode.TARGET_VERIFY].req_pool_indices,
                  tv_kv, w_tv._paged_kv_indptr_buf, w_tv._paged_kv_indices_buf,
                  title="target verify (FlashInfer): the bound kv indices cover the prefix AND "
                        "the N drafts"), "flashinfer_verify_csr")

# %% [markdown]
# The bound buffers per mode, after the replay of a batch of 3 through the bs-4 wrapper. The
# wrappers of one backend (one per captured bs) share its kv-indices buffer `[T*L]`, and each is
# bound to the `[:bs+1]` prefix of its indptr buffers. The bound mask buffer holds section 2's
# tree blocks (the stand-in stores one byte per entry; real FlashInfer packs them into bits).

# %%
fi_rows, fi_roles = {}, {}
for mode, short_name in ((ForwardMode.DECODE, "decode"), (ForwardMode.TARGET_VERIFY, "verify"),
                         (ForwardMode.DRAFT_EXTEND, "draft extend v1"),
                         (ForwardMode.DRAFT_EXTEND_V2, "draft extend v2")):
    w = fi_wrappers[mode][4]
    bufs = {"_paged_kv_indptr_buf": w._paged_kv_indptr_buf}
    if mode.is_decode():
        bufs["_paged_kv_last_page_len_buf"] = w._paged_kv_last_page_len_buf
    else:
        bufs["_qo_indptr_buf"] = w._qo_indptr_buf
    if getattr(w, "_mask_indptr_buf", None) is not None:
        bufs["_mask_indptr_buf"] = w._mask_indptr_buf
    for attr, t in bufs.items():
        fi_rows[f"{short_name}: {attr}"] = t
        fi_roles[f"{short_name}: {attr}"] = roles(t.numel(), indptr="indptr" in attr)
w_dec = fi_wrappers[ForwardMode.DECODE][4]
fi_rows["_paged_kv_indices_buf (shared)"] = (
    f"[T*L = {w_dec._paged_kv_indices_buf.numel()}] int32; verify uses "
    f"{int(w_tv._paged_kv_indptr_buf[-1])}")
fi_rows["_custom_mask_buf (verify only)"] = (
    f"[T*L = {w_tv._custom_mask_buf.numel()}] uint8; verify uses "
    f"{int(w_tv._mask_indptr_buf[-1])}")
fi_rows["causal (verify / draft extend)"] = (
    f"{w_tv._causal} / {fi_wrappers[ForwardMode.DRAFT_EXTEND][4]._causal}")
for mode in fi_wrappers:  # every bs's wrapper is bound to the backend's one indices buffer
    w1, w4 = fi_wrappers[mode][1], fi_wrappers[mode][4]
    assert w1._paged_kv_indices_buf.data_ptr() == w4._paged_kv_indices_buf.data_ptr()
    assert w1._paged_kv_indptr_buf.data_ptr() == w4._paged_kv_indptr_buf.data_ptr()  # [:bs+1]
show(viz.draw_buffers(fi_rows, "FlashInfer: the bs-4 wrappers' bound buffers after the replay",
                      roles=fi_roles), "flashinfer_bound_buffers")

# the bound mask holds section 2's blocks: request 0's [N, prefix + N] block, its tree part
block_fi = w_tv._custom_mask_buf[: int(w_tv._mask_indptr_buf[1])].view(N, -1)
assert torch.equal(block_fi[:, -N:].bool().cpu(), DraftTree(fb_tv.spec_info.parents[0]).ancestry_mask())

# %% [markdown]
# ### The plan's work partition, per captured batch size
#
# Each captured bs has its own wrapper, and each wrapper its own workspace with the partition
# its last `plan()` wrote: the stand-in stores it as int32 `q_len[bs]` then `kv_len[bs]`
# (`read_partition`). The bs-1 wrappers still hold the capture batch's plan (one padded row); a
# batch of one would re-plan them. The bs-4 wrappers hold the replayed batch. In multi-step
# draft decode each step has its own decode wrappers, bound to the wrapper's step row, and a
# row of step i plans `seq_len + i + 1` keys.

# %%
fi_ms = FlashInferMultiStepDraftBackend(world, TREE)
_, padded_fdd = hooks_only(fi_ms, ForwardMode.DECODE, TREE, fb_dd, multi_step=True)
for i in range(S):  # the same rows as Triton's draft-decode buffers of section 4 (int32 here)
    assert fi_ms.kv_indptr[i, : rows + 1].tolist() == ms.kv_indptr[i, : rows + 1].tolist()

part_rows, part_roles = {}, {}
for mode, short_name in ((ForwardMode.DECODE, "decode"), (ForwardMode.TARGET_VERIFY, "verify"),
                         (ForwardMode.DRAFT_EXTEND_V2, "draft extend v2")):
    for b, w in fi_wrappers[mode].items():
        q_len, kv_len = read_partition(w)
        live = 0 if b == 1 else 3  # bs 1: the capture batch, one padded row
        for what, t in (("q_len", q_len), ("kv_len", kv_len)):
            name = f"{short_name}, bs {b} wrapper: {what}"
            part_rows[name], part_roles[name] = t.clone(), roles(b, live=live, bs=b)
for i, step in enumerate(fi_ms.step_backends):
    q_len, kv_len = read_partition(step.decode_cuda_graph_metadata[4][0])
    name = f"draft step {i}, bs 4 wrapper: kv_len [seq][branch]"
    part_rows[name] = kv_len.clone()
    part_roles[name] = [r // topk if r // topk < 3 else "pad" for r in range(rows)]
    want = (padded_fdd.seq_lens + i + 1).repeat_interleave(topk)
    assert kv_len.tolist() == want.tolist()  # prefix + the i + 1 drafts of the row's branch

dec = read_partition(fi_wrappers[ForwardMode.DECODE][4])[1]
assert dec.tolist() == fi_padded[ForwardMode.DECODE].seq_lens.tolist()
assert read_partition(fi_wrappers[ForwardMode.DECODE][1])[1].tolist() == [1]  # capture batch
assert read_partition(fi_wrappers[ForwardMode.TARGET_VERIFY][4])[0].tolist() == [N] * bs
show(viz.draw_buffers(part_rows, "FlashInfer: the work partition each wrapper's last plan wrote "
                      "(stand-in format)", roles=part_roles), "flashinfer_partitions")

# %% [markdown]
# ## 7. FlashInfer-MLA: graph-bound vs eager `kv_indptr`
#
# FlashInfer-MLA serves models with MLA: every token's KV is one compressed row, a 512-wide
# latent plus a 64-wide rope part, shared by all query heads
# ([facts](../docs/sglang_facts.md#flashinfer-mla)). One wrapper kind,
# `BatchMLAPagedAttentionWrapper`, serves every mode; graph wrappers are bound to
# `cuda_graph_qo_indptr`, `cuda_graph_kv_indptr`, `cuda_graph_kv_indices` and
# `cuda_graph_kv_lens` (`kv_len_arr`).
#
# Upstream's decode replay rebuilds `kv_indptr` in the backend's **eager** buffer and re-plans
# with the fast plan, which copies nothing into the bound buffers. So the graph-bound
# `kv_indptr` and `kv_len_arr` keep the capture batch's values
# ([#37975](https://github.com/sgl-project/sglang/pull/37975), an open PR). The decode kernel
# reads the plan's partition, which is current, so the output is right and the stale buffers
# stay hidden. refimpl's `as-upstream` variant keeps that behaviour; `unified` writes the bound
# buffers. Below, both after the same replay.

# %%
cfg_mla = ModelConfig(kind="mla", num_layers=1, hidden_size=32, num_heads=4)  # latent 512 + 64
world_mla = World.create(cfg_mla, max_context_len=L, pool_size=16, device=device)
gen_mla = BatchGenerator(world_mla, CHAIN, seed=3)
fb_mla = gen_mla.decode(3, seq_lens=[7, 31, 18])

mla_state = {}
for cls in (FlashInferMLAAttnBackendAsUpstream, FlashInferMLAAttnBackend):
    mla = cls(world_mla, CHAIN)
    runner_mla, padded_mla = hooks_only(mla, ForwardMode.DECODE, CHAIN, fb_mla)
    mla_state[cls.variant] = {**mla.graph_state(bs, ForwardMode.DECODE),
                              "eager kv_indptr": mla.kv_indptr[: bs + 1].clone(),
                              "partition kv_len": read_partition(mla.decode_cuda_graph_metadata[4])[1]}
    ref_mla = mla.reference_graph_state(padded_mla)
    cvr, _ = capture_vs_replay(lambda cls=cls: cls(world_mla, CHAIN), runner_mla, fb_mla)
    print(f"{cls.variant}: checker (a) capture vs replay:", *(cvr or ["no difference"]),
          sep="\n    ")
    assert (not cvr) == (cls is FlashInferMLAAttnBackend)

up, uni = mla_state["as-upstream"], mla_state["unified"]
# the capture path (P) would have left exactly the batch's values: the marks below are also the
# checker's capture-vs-replay differences
p_up, q_up = capture_vs_replay_state(FlashInferMLAAttnBackendAsUpstream, runner_mla, fb_mla)
assert p_up["kv_indptr"].tolist() == ref_mla["kv_indptr"].tolist()
assert q_up["kv_indptr"].tolist() == up["kv_indptr"].tolist()
assert up["eager kv_indptr"].tolist() == ref_mla["kv_indptr"].tolist()  # replay wrote this one
assert up["kv_indptr"].tolist() == list(range(bs + 1))  # bound: the capture batch (all 1s)
assert up["partition kv_len"].tolist() == ref_mla["kv_len_arr"].tolist()  # what the kernel reads
assert uni["kv_indptr"].tolist() == ref_mla["kv_indptr"].tolist()

want = {"kv_indptr": ref_mla["kv_indptr"], "kv_len_arr": ref_mla["kv_len_arr"]}
rows_mla = {"the batch: kv_indptr": ref_mla["kv_indptr"],
            "as-upstream: eager kv_indptr": up["eager kv_indptr"],
            "as-upstream: bound kv_indptr": up["kv_indptr"],
            "the batch: kv_len_arr": ref_mla["kv_len_arr"],
            "as-upstream: bound kv_len_arr": up["kv_len_arr"],
            "as-upstream: partition kv_len": up["partition kv_len"],
            "unified: bound kv_indptr": uni["kv_indptr"],
            "unified: bound kv_len_arr": uni["kv_len_arr"]}
marks, mla_roles = {}, {}
for name, t in rows_mla.items():
    key = "kv_indptr" if "indptr" in name else "kv_len_arr"
    bad = t.cpu().long() != want[key].cpu().long()
    marks[name] = bad
    base = roles(t.numel(), indptr=key == "kv_indptr")
    mla_roles[name] = ["stale" if b else r for r, b in zip(base, bad.tolist())]
fig = viz.draw_buffers(rows_mla, "FlashInfer-MLA decode after the replay of a batch of 3 "
                       "(bs-4 wrapper): as-upstream vs unified", roles=mla_roles, differs=marks,
                       differs_label="differs from what the batch needs")
n_marked = len([p for p in fig.axes[0].patches if p.get_gid() == "differs"])
assert n_marked == int(marks["as-upstream: bound kv_indptr"].sum() + marks["as-upstream: bound kv_len_arr"].sum())
assert n_marked > 0 and not marks["unified: bound kv_indptr"].any()
show(fig, "flashinfer_mla_stale_indptr")

# %% [markdown]
# FlashInfer-MLA also captures target verify and draft extend v1 / v2, with full re-plans
# (`causal=True`), so their bound buffers are current in every variant. Verify plans have no
# custom mask upstream ("TODO: support custom mask when topk > 1"), so refimpl refuses trees
# and verifies **chains** only: the KV covers prefix + N, and causal order is the chain's mask.

# %%
try:
    FlashInferMLAAttnBackend(world_mla, TREE).check_graph_mode(ForwardMode.TARGET_VERIFY)
except GraphModeNotSupported as e:
    print("FlashInfer-MLA, tree verify:", e)
else:
    raise AssertionError("FlashInfer-MLA refuses trees")

mla_rows, mla_roles2 = {}, {}
for mode, fb, short_name in (
    (ForwardMode.TARGET_VERIFY, gen_mla.target_verify(3, seq_lens=[5, 20, 11]), "verify (chain)"),
    (ForwardMode.DRAFT_EXTEND, gen_mla.draft_extend(3, 1, accept_length=[3, 1, 0]), "draft extend v1"),
    (ForwardMode.DRAFT_EXTEND_V2, gen_mla.draft_extend(3, 2, accept_length=[0, 2, 1]), "draft extend v2"),
):
    mla = FlashInferMLAAttnBackend(world_mla, CHAIN)
    _, padded = hooks_only(mla, mode, CHAIN, fb)
    st = mla.graph_state(bs, mode)
    assert not diff_reference(st, mla.reference_graph_state(padded)), mode
    for key in ("qo_indptr", "kv_indptr", "kv_len_arr"):
        mla_rows[f"{short_name}: {key}"] = st[key]
        mla_roles2[f"{short_name}: {key}"] = roles(st[key].numel(), indptr="indptr" in key)
show(viz.draw_buffers(mla_rows, "FlashInfer-MLA: bound buffers of the bs-4 prefill wrappers "
                      "after the replay", roles=mla_roles2), "flashinfer_mla_buffers")

# %% [markdown]
# ## 8. Cutlass-MLA and TRTLLM-MLA
#
# The two block-table MLA backends index the latent cache through pages of 128 (Cutlass) or
# 32 / 64 (TRTLLM) tokens instead of a token-by-token CSR. Their block tables, page by page, are
# drawn in [notebook 03](03_mla_backends_and_the_redundant_copy_removal.ipynb), section 1
# ("Block tables"); TRTLLM-MLA's verify and draft-extend metadata follow in its section 3.
#
# ## 9. Two historical bugs, cell by cell
#
# Before the refactor ([#26134](https://github.com/sgl-project/sglang/pull/26134), relanded
# as [#26665](https://github.com/sgl-project/sglang/pull/26665)) each backend had two hooks
# written separately, and they drifted. The checker's verdict (a) feeds the same batch to both
# paths, on two fresh backends: P runs the *capture* hook on the padded batch; Q runs the capture
# hook on the runner's capture batch and then the *replay* hook on the padded batch. Their
# graph-read states must agree cell by cell (`capture_vs_replay_state` above). First, the
# checker on both legacy shapes:
#
# * **Wave, decode**: capture filled the kv buffers but never called `get_num_kv_splits`, so
#   after capture the split buffer still held `max_kv_splits` from its `torch.full`.
# * **Triton, draft extend v1**: capture laid the rows out with the uniform stride S + 1, but
#   replay wrote `qo_indptr = cumsum(accept_length + 1)`, the ragged layout of the old eager path.

# %%
settings = CheckSettings(capture_bs=(4,), raw_bs=(3,))
(wave_rec,) = check_entry_mode(find("wave", "legacy")[0], "decode", CPUEmulatorEngine(), settings)
(tri_rec,) = check_entry_mode(find("triton", "legacy")[0], "draft_extend", CPUEmulatorEngine(),
                              settings)
for rec in (wave_rec, tri_rec):
    print(f"{rec.backend}/{rec.variant} {rec.mode}: capture == replay {rec.capture_equals_replay}, "
          f"graph == eager {rec.graph_equals_eager}, eager == oracle {rec.matches_oracle}")
    print("   ", rec.findings[0])
assert wave_rec.capture_equals_replay is False and wave_rec.findings[0].startswith("num_kv_splits")
assert wave_rec.graph_equals_eager is True and wave_rec.matches_oracle is True
assert tri_rec.capture_equals_replay is False and tri_rec.findings[0].startswith("qo_indptr")
assert tri_rec.graph_equals_eager is False and tri_rec.matches_oracle is True

# %% [markdown]
# **Wave's drift is benign.** The graph does not freeze the counts, only the buffer's address.
# The kernel reads `num_kv_splits[b]` when it runs, and every replay calls the hook, which
# computes the counts *before* `graph.replay()`. The stale `max_kv_splits` values are seen only
# by the warm-up and capture runs, whose outputs are thrown away. Any count in
# `[1, max_kv_splits]` gives the same attention up to rounding, since stage 2 merges the splits
# with their log-sum-exp. **Triton's is not**: the rows in the static inputs are still at
# stride S + 1, so every request after the first reads the wrong rows. The graph's output is
# wrong, while eager (and therefore the oracle check) is right.
#
# Here are the two paths on this notebook's own batches (section 1's decode batch and section
# 3's v1 batch), every differing cell framed.

# %%
wave_cap, wave_rep = capture_vs_replay_state(WaveAttnBackendLegacy, run_dec, fb_dec)
tri_cap, tri_rep = capture_vs_replay_state(TritonAttnBackendLegacy, run_v1, fb_v1)
for cls, runner, fb, cap, rep in ((WaveAttnBackendLegacy, run_dec, fb_dec, wave_cap, wave_rep),
                                  (TritonAttnBackendLegacy, run_v1, fb_v1, tri_cap, tri_rep)):
    checker, _ = capture_vs_replay(lambda cls=cls, r=runner: cls(r.world, r.spec_cfg), runner, fb)
    assert checker == diff_states(cap, rep)  # the same verdict as refimpl.check's
    print(f"{cls.__name__}:", checker)

assert (wave_cap["num_kv_splits"] == S_MAX).all() and wave_rep["num_kv_splits"].tolist() == splits_1
acc1 = fb_v1.spec_info.accept_length.tolist() + [0]  # + the padded row: 1 row
assert tri_cap["qo_indptr"].tolist() == list(range(0, bs * tpr1 + 1, tpr1))
assert tri_rep["qo_indptr"].tolist() == [0] + torch.cumsum(torch.tensor(acc1) + 1, 0).tolist()

first = {"Wave decode: num_kv_splits": wave_cap["num_kv_splits"],
         "Triton draft extend v1: qo_indptr": tri_cap["qo_indptr"],
         "Triton draft extend v1: kv_indptr": tri_cap["kv_indptr"],
         "Triton draft extend v1: max_extend_len": tri_cap["max_extend_len"]}
second = {"Wave decode: num_kv_splits": wave_rep["num_kv_splits"],
          "Triton draft extend v1: qo_indptr": tri_rep["qo_indptr"],
          "Triton draft extend v1: kv_indptr": tri_rep["kv_indptr"],
          "Triton draft extend v1: max_extend_len": tri_rep["max_extend_len"]}
fig = viz.draw_state_diff(
    first, second, keys=list(first),
    labels=("capture path", "replay path"),
    roles={"Wave decode: num_kv_splits": roles(4),
           "Triton draft extend v1: qo_indptr": roles(5, indptr=True),
           "Triton draft extend v1: kv_indptr": roles(5, indptr=True)},
    title="legacy Wave decode (benign) and legacy Triton draft extend v1 (wrong output): "
          "capture path vs replay path",
)
# every differing element the checker reports is framed, in both rows
reported = sum(int(re.match(r"\S+: (\d+) of", line).group(1))
               for line in diff_states(wave_cap, wave_rep) + diff_states(tri_cap, tri_rep))
assert len([p for p in fig.axes[0].patches if p.get_gid() == "differs"]) == 2 * reported
show(fig, "legacy_findings")

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
# | backend        | graph modes drawn here | what differs from Triton |
# |----------------|------------------------|--------------------------|
# | Wave           | decode, verify, multi-step draft decode (chains) | buffers sized by B, int32 indices; no draft extend |
# | FlashInfer     | decode, verify, draft extend v1 / v2, multi-step draft decode | wrappers bound per bs; verify indexes prefix + N; a partition per plan |
# | FlashInfer-MLA | decode, verify (chains), draft extend v1 / v2 | as-upstream's bound `kv_indptr` / `kv_len_arr` go stale ([#37975](https://github.com/sgl-project/sglang/pull/37975)) |
# | Cutlass-MLA, TRTLLM-MLA | block tables: notebook 03 | pages instead of a token CSR |
#
# The layout at capture must equal the layout at replay (`refimpl/layout.py`). The legacy
# findings show both kinds of drift: state that the kernel re-reads at run time (benign) and a
# layout that the graph has already baked in (a wrong answer).
#
# **Next: 02, two patterns.** How a backend keeps its capture and replay paths in agreement by
# construction (Pattern A: capture = the replay body + freeze views; Pattern B: prepare
# graph-bound objects, then replay), and what drifts when the two paths are written separately
# (Pattern C).

# %%
for g in (gen, gen_chain, gen_mla):
    g.release_all()
assert not gen.live_requests and not gen_chain.live_requests
