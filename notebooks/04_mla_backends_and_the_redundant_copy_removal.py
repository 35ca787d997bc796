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
# # MLA backends and the redundant-copy removal
#
# Reading time: about 18 minutes. The CPU run takes about 25 s.
#
# DeepSeek-style models use **MLA** (multi-head latent attention): every token's KV is one
# compressed row, a 512-wide latent plus a 64-wide rope part, shared by all query heads
# ([facts](../docs/sglang_facts.md#memory-pools)). Notebook 02 showed FlashInfer-MLA, which
# indexes that cache token by token. SGLang has two more MLA backends, both subclasses of
# FlashInfer-MLA, that index it through **block tables** of pages instead:
#
# * **Cutlass-MLA** ([facts](../docs/sglang_facts.md#cutlass-mla)): 128-token pages, plain
#   decode under graphs;
# * **TRTLLM-MLA** ([facts](../docs/sglang_facts.md#trtllm-mla)): 32- or 64-token pages,
#   decode, target verify and draft extend v2 (the same kernel with N query rows), and
#   multi-step draft decode.
#
# Their real kernels need Blackwell (SM100). refimpl runs its own Triton kernel with the same
# arguments (`refimpl.kernels.cutlass_mla_decode`, `trtllm_batch_decode_with_kv_cache_mla`), on
# this CPU through the Triton interpreter and on an H200 compiled: the graph mechanics are the
# same, only the kernel body differs (a deliberate difference from upstream, listed with the
# others in [the differences table](../docs/sglang_facts.md#where-refimpl-deliberately-differs-from-upstream)).
#
# This notebook draws the block tables, shows Cutlass's two historical details live, puts
# TRTLLM-MLA's four shapes side by side, and measures what SGLang
# [#29077](https://github.com/sgl-project/sglang/pull/29077) saved on every draft-extend replay.
# It ends with the three shapes of their parent class, FlashInfer-MLA.

# %%
import ast
import difflib
import inspect
import json
import sys
import textwrap
import time
from pathlib import Path

import torch

try:
    from IPython.display import Image, display
except ImportError:  # run as a plain script: nothing to display
    Image = display = lambda *args, **kwargs: None  # noqa: E731

from refimpl import ForwardMode, GraphConfig, ModelConfig, viz
from refimpl.backends import find
from refimpl.backends.cutlass_mla import CutlassMLAAttnBackend, CutlassMLAAttnBackendLegacy
from refimpl.backends.flashinfer_mla import (
    FlashInferMLAAttnBackend,
    FlashInferMLAAttnBackendAsUpstream,
    FlashInferMLAAttnBackendLegacy,
)
from refimpl.backends.trtllm_mla import (
    TRTLLMMLAAttnBackend,
    TRTLLMMLAAttnBackendInGraph,
    TRTLLMMLAAttnBackendSimplified,
)
from refimpl.batch import World
from refimpl.batchgen import BatchGenerator
from refimpl.bench import launches
from refimpl.check import CheckSettings, check_entry_mode
from refimpl.config import SpecConfig
from refimpl.graphs import CPUEmulatorEngine, make_engine
from refimpl.graphs.runner import GraphRunner, call_replay_hook
from refimpl.model import TinyDecoder
from refimpl.spec import DraftDecodeInput
from refimpl.viz.code import hook_code

NOTEBOOK_T0 = time.perf_counter()
# the repository root, from this file's own location (a kernel runs in the notebook's folder)
ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd().parent
FIGURES = ROOT / "figures"
RESULTS = ROOT / "benchmarks" / "results" / "trtllm_mla_draft_extend"

engine = make_engine("auto")  # the CPU emulator here, CUDA graphs on a GPU
device = engine.device
cfg = ModelConfig(kind="mla", num_layers=1, hidden_size=32, num_heads=4)  # latent 512 + rope 64
CHAIN = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)  # EAGLE chain: N = S + 1 = 4
L = 160  # context length


def show(fig, name):
    path = viz.save(fig, FIGURES / f"04_{name}.png")
    display(Image(filename=str(path)))


def mla_world(page_size):
    w = World.create(cfg, max_context_len=L, pool_size=12, page_size=page_size, device=device)
    w.randomize_kv(0)
    return w


# %% [markdown]
# ## 1. Block tables
#
# A block table maps a request's positions to pages: position t of request i lives in slot
# `table[i, t // P] * P + t % P`. The slot allocator hands out whole, aligned pages (page 0 is
# reserved for padded rows), so a page's id is its first slot divided by P:
# `table[i, p] = req_to_token[rpi[i], p * P] // P` for every page the request uses, and entries
# past them are never read. The builder is one Triton kernel (`build_block_table`). Below, the
# same three requests at the three page sizes: the top row of each pair is what the page should
# hold, derived from `req_to_token`; the bottom row is the table a capture-time replay body wrote.

# %%
for P, cls in ((32, TRTLLMMLAAttnBackend), (64, TRTLLMMLAAttnBackend),
               (128, CutlassMLAAttnBackend)):
    w = mla_world(P)
    gen = BatchGenerator(w, CHAIN, seed=P)
    fb = gen.decode(3, seq_lens=[P - 1, P, min(2 * P + 1, L)])  # below, at, past a page boundary
    b = cls(w, CHAIN)
    b.init_cuda_graph_state(4, 4)
    b.init_forward_metadata_capture_cuda_graph(3, 3, fb.req_pool_indices, fb.seq_lens, None,
                                               ForwardMode.DECODE, None)
    table = b.forward_metadata.block_kv_indices
    pages = [-(-s // P) for s in fb.seq_lens.tolist()]
    want = [[int(w.req_to_token[r, p * P]) // P for p in range(n)]
            for r, n in zip(fb.req_pool_indices.tolist(), pages)]
    got = [table[i, :n].tolist() for i, n in enumerate(pages)]
    print(f"P={P:>3} ({cls.name}): table {tuple(table.shape)}, pages used {pages}, read entries {got}")
    assert got == want
    fill = 1 if cls is CutlassMLAAttnBackend else -1  # Cutlass's graph table starts at 1
    assert all((table[i, n:] == fill).all() for i, n in enumerate(pages))
    show(viz.draw_block_table(w.req_to_token, fb.req_pool_indices, fb.seq_lens, table, P,
                              max_pages=8, title=f"{cls.name}: block table, page size {P}"),
         f"block_table_p{P}")

# %% [markdown]
# The table widths are upstream's: Cutlass `L // 128 + 1` pages (here 2), TRTLLM the page count
# rounded up to `lcm(128 // P, 4096 // P)` pages (64 at P = 64, 128 at P = 32), so the table
# always covers a multiple of 4096 positions. Entries never read keep their initial value:
# 1 in Cutlass's graph table, -1 elsewhere.
#
# ## 2. Cutlass-MLA: two details the refactor removed
#
# Before #26134 Cutlass kept two bodies. Both differences below are benign in the output, which
# is exactly why they could linger; the checker passes the legacy shape. But they cost the
# refactor something, and here they are live. (1) The legacy replay asserts
# `seq_lens_cpu is not None` and never reads it. A Pattern-A capture calls the replay body
# with `seq_lens_cpu=None`, so reusing this replay as it was trips the assert:

# %%
w128 = mla_world(128)
legacy = CutlassMLAAttnBackendLegacy(w128, CHAIN)
legacy.init_cuda_graph_state(4, 4)
rpi = torch.zeros(4, dtype=torch.int64, device=device)
one = torch.ones(4, dtype=torch.int32, device=device)
try:
    legacy.init_forward_metadata_replay_cuda_graph(4, rpi, one, None, None, ForwardMode.DECODE,
                                                   None, None)
except AssertionError:
    print("legacy replay with seq_lens_cpu=None: AssertionError (the unused assert)")
else:
    raise AssertionError("expected the legacy replay's assert to fire")
print(textwrap.indent("\n".join(
    line for line in inspect.getsource(CutlassMLAAttnBackendLegacy.init_forward_metadata_replay_cuda_graph).splitlines()
    if "assert" in line), "   "))

# %% [markdown]
# (2) The legacy capture handles decode only when `spec_info is None`, with no `else`, while its
# replay handles every decode. A decode capture *with* a spec input (a multi-step draft step)
# therefore leaves the metadata unset: the captured graph would read whatever a previous capture
# left behind. The unified shape routes such a call to its parent instead.

# %%
legacy.init_forward_metadata_capture_cuda_graph(4, 4, rpi, one, None, ForwardMode.DECODE,
                                                DraftDecodeInput(topk=1, num_steps=3))
print("legacy capture, decode with a spec input -> forward_metadata =", legacy.forward_metadata)
assert legacy.forward_metadata is None

settings = CheckSettings(capture_bs=(4,), raw_bs=(3,), max_context_len=48, glue_replays=0, history=False)  # one graph
for variant in ("legacy", "unified"):
    (rec,) = check_entry_mode(find("cutlass_mla", variant)[0], "decode", CPUEmulatorEngine(), settings)
    print(f"checker, cutlass_mla/{variant} ({rec.pattern}) decode: passed={rec.passed}, findings={rec.findings}")
    assert rec.passed and not rec.findings  # both details are invisible in the output

# %% [markdown]
# ## 3. TRTLLM-MLA: four shapes
#
# TRTLLM-MLA's kernel takes `seq_lens` as device data and `max_seq_len` as a Python int, which a
# graph freezes. Its graph metadata went through four shapes; each is a small subclass of the one
# before it in `refimpl/backends/trtllm_mla.py`:
#
# | shape | what changed | upstream |
# |---|---|---|
# | `legacy` (C) | two bodies; capture freezes `max_seq_len = seq_lens.max()`; draft-extend replay lays `cu_seqlens_q` out by accept lengths | before [#21987](https://github.com/sgl-project/sglang/pull/21987) |
# | `unified` (A) | `_init_cuda_graph_metadata` + the shared `_apply_cuda_graph_metadata`; `max_seq_len_k = L`; draft extend re-copies `cu_seqlens_q` / `seq_lens_q` every replay | [#26665](https://github.com/sgl-project/sglang/pull/26665) |
# | `simplified` (A) | those per-replay copies and the identity arithmetic gone; rows per request = `num_draft_tokens` at init | [#29077](https://github.com/sgl-project/sglang/pull/29077) |
# | `in_graph` (in-graph) | one fused Triton kernel rebuilds the block table and `seq_lens_k` *inside* the graph; the replay hook only re-points | [#30807](https://github.com/sgl-project/sglang/pull/30807), [#31628](https://github.com/sgl-project/sglang/pull/31628) |
#
# ### The legacy shape's frozen `max_seq_len`
#
# The capture batch has every row at the fill value (1), so the legacy capture freezes 1. The
# legacy replay later writes the new maximum into the same Python attribute, but the captured
# kernel call already holds the old value: every replayed sequence is cut to one key. The
# checker reports it twice over.

# %%
trt = {v: find("trtllm_mla", v)[0] for v in ("legacy", "unified", "simplified", "in_graph")}
(dec,) = check_entry_mode(trt["legacy"], "decode", CPUEmulatorEngine(), settings)
(de,) = check_entry_mode(trt["legacy"], "draft_extend_v2", CPUEmulatorEngine(), settings)
for r in (dec, de):
    print(f"trtllm_mla/legacy {r.mode}: capture=replay {r.capture_equals_replay}, "
          f"graph=eager {r.graph_equals_eager}, =oracle {r.matches_oracle}")
    for f in r.findings:
        print("    finding:", f)
assert any(f.startswith("max_seq_len_k:") and "frozen at capture" in f for f in dec.findings)
assert dec.graph_equals_eager is False and dec.matches_oracle is True
assert any(f.startswith("cu_seqlens_q:") for f in de.findings) and de.graph_equals_eager is False
for v in ("unified", "simplified", "in_graph"):
    for mode in ("decode", "draft_extend_v2"):
        (r,) = check_entry_mode(trt[v], mode, CPUEmulatorEngine(), settings)
        assert r.passed and not r.findings, (v, mode, r.findings)
print("unified, simplified, in_graph: decode and draft extend v2 pass every verdict")

# %% [markdown]
# ### The code deltas, side by side
#
# `simplified` overrides only the two draft-extend pieces of `unified`. The diff is the whole of
# #29077's effect on the replay path:

# %%
def body(fn):
    return textwrap.dedent(inspect.getsource(fn)).splitlines()


for piece in ("_init_draft_extend", "_apply_draft_extend"):
    diff = difflib.unified_diff(body(getattr(TRTLLMMLAAttnBackend, piece)),
                                body(getattr(TRTLLMMLAAttnBackendSimplified, piece)),
                                "unified", "simplified", n=1, lineterm="")
    print("\n".join(diff), "\n")
apply_unified = "\n".join(body(TRTLLMMLAAttnBackend._apply_draft_extend))
apply_simplified = "\n".join(body(TRTLLMMLAAttnBackendSimplified._apply_draft_extend))
assert "cu_seqlens_q" in apply_unified and "cu_seqlens_q" not in apply_simplified
assert "seq_lens_q[:bs].fill_" in apply_unified and "fill_" not in apply_simplified

# %% [markdown]
# And what each shape's draft-extend replay hook launches, counted by the op recorder on a
# captured runner (one eager op or Triton launch each):

# %%
def runner_for(cls, mode=ForwardMode.DRAFT_EXTEND_V2):
    w = mla_world(64)
    gcfg = GraphConfig(max_bs=4, capture_bs=(1, 2, 4), max_context_len=L)
    r = GraphRunner(TinyDecoder(cfg, device), cls(w, CHAIN), engine, mode, gcfg, CHAIN)
    r.capture()
    return r, BatchGenerator(w, CHAIN, seed=7)


hook_launches, graph_kernels = {}, {}
for name, cls in (("unified", TRTLLMMLAAttnBackend), ("simplified", TRTLLMMLAAttnBackendSimplified),
                  ("in_graph", TRTLLMMLAAttnBackendInGraph)):
    runner, gen = runner_for(cls)
    fb = gen.draft_extend(3, 2)
    padded = runner.padded_batch(fb)
    hook_launches[name] = launches(lambda r=runner, p=padded: call_replay_hook(r.backend, p))
    graph_kernels[name] = dict(runner.graphs[4].custom_kernels())
    out = runner.replay(fb).clone()
    assert torch.allclose(out, runner.eager(fb), atol=1e-4)
    print(f"{name:<10} hook launches {sum(hook_launches[name].values())}: {hook_launches[name]}")
    print(f"{'':<10} graph's refimpl kernels: {graph_kernels[name]}")
assert sum(hook_launches["unified"].values()) == 7
assert sum(hook_launches["simplified"].values()) == 2 and hook_launches["in_graph"] == {}
assert graph_kernels["in_graph"]["refimpl.trtllm_mla_graph_metadata.default"] == 1

# %% [markdown]
# ### The static q-metadata #29077 pins
#
# Draft extend v2 gives every request the same N rows, so its query metadata is a constant of
# the captured batch size, set once at init: SGLang's unit test pins it for bs 2, N 4. Before
# #29077 the rows per request came from `num_tokens // bs`, which a runner that pads its token
# count (data-parallel attention) could make disagree with N.

# %%
pinned = {}
for cls in (TRTLLMMLAAttnBackendSimplified, TRTLLMMLAAttnBackendInGraph):
    b = cls(mla_world(64), CHAIN)
    b.init_cuda_graph_state(4, 16)
    md = b._init_cuda_graph_metadata(2, 8, ForwardMode.DRAFT_EXTEND_V2, None)
    pinned[cls.variant] = (md.max_seq_len_q, md.sum_seq_lens_q, md.cu_seqlens_q.tolist(),
                           md.seq_lens_q.tolist())
    print(f"{cls.variant:<10} bs 2, N 4: max_seq_len_q {pinned[cls.variant][0]}, sum_seq_lens_q "
          f"{pinned[cls.variant][1]}, cu_seqlens_q {pinned[cls.variant][2]}, seq_lens_q {pinned[cls.variant][3]}")
    assert pinned[cls.variant] == (4, 8, [0, 4, 8], [4, 4])
b = TRTLLMMLAAttnBackend(mla_world(64), CHAIN)
b.init_cuda_graph_state(4, 20)
md = b._init_cuda_graph_metadata(2, 10, ForwardMode.DRAFT_EXTEND_V2, None)  # 10 padded tokens
print("unified with 10 tokens for bs 2: max_seq_len_q", md.max_seq_len_q, "(num_tokens // bs)")
assert md.max_seq_len_q == 5

# %% [markdown]
# ## 4. What #29077 saved: replay latency before and after, on an H200
#
# The measurement (`benchmarks/trtllm_mla_draft_extend.py`, method in `refimpl/bench.py`): host
# time of the replay path (the metadata hook plus `graph.replay()`; input copies reported apart)
# and GPU time (CUDA events), draft extend v2, bs 1 to 256, 50 repeats after warm-up, inputs
# rotated, pinned to one core, run twice. On this machine the committed H200 results are drawn;
# on a GPU the cell after them runs a short live sweep.

# %%
runs = [json.loads((RESULTS / f"run{k}_results.json").read_text()) for k in (2, 1)]
env = runs[0]["environment"]
print(f"{env['device']}, driver {env['driver']}, torch {env['torch']}, triton {env['triton']}; "
      f"{env['pinning']}")
table = {(r["shape"], r["bs"]): r["host_us"]["hook+launch"]["median"] for r in runs[0]["rows"]}
for bs in (1, 16, 256):
    print(f"bs {bs:>3}: " + ", ".join(f"{s} {table[s, bs]:.0f} us"
                                       for s in ("unified", "simplified", "in_graph")))
panels = [("host_us", "hook+launch", "host µs: replay hook + graph.replay()"),
          ("gpu_us", "graph", "GPU µs: the graph")]
show(viz.draw_latency_vs_bs(runs[0]["rows"], panels,
                            f"TRTLLM-MLA draft extend v2 replay path — {env['device']} "
                            "(run 2; dotted: run 1)", second_run=runs[1]["rows"]),
     "trtllm_draft_extend_replay_h200")

# %% [markdown]
# Reading it from what each hook launches (the numbers are in
# `benchmarks/results/trtllm_mla_draft_extend/README.md`): #29077 took five eager ops off every
# draft-extend replay, about 60 µs of host time on that machine; moving the rebuild into the
# graph takes the last two (the block-table launch and one copy), about 100 µs more. The GPU
# time of the graph does not move: it is the model step, and the in-graph rebuild is one tiny
# node. What the in-graph shape still spends on the host is the runner's own work around a
# replay, the subject of notebook 05.

# %% tags=["gpu"]
if torch.cuda.is_available():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the #29077 sweep lives with its benchmark
    from trtllm_mla_draft_extend import sweep

    live = sweep(batch_sizes=(1, 16, 64), repeats=20, warmup=5, rotate=2)
    for r in live:
        print(f"{r['shape']:<10} bs {r['bs']:>3}: host hook+launch "
              f"{r['host_us']['hook+launch']['median']:.0f} us, GPU graph "
              f"{r['gpu_us']['graph']['median']:.0f} us")
    live_hook = {(r["shape"], r["bs"]): sum(r["hook_launches"].values()) for r in live}
    assert all(live_hook["unified", bs] == 7 and live_hook["simplified", bs] == 2
               and live_hook["in_graph", bs] == 0 for bs in (1, 16, 64))

# %% [markdown]
# ## 5. FlashInfer-MLA, the parent class: legacy, as-upstream, unified
#
# FlashInfer-MLA indexes the latent cache token by token (notebook 02, section 3, drew its
# buffers), with one wrapper kind for every mode (`BatchMLAPagedAttentionWrapper`). Decode
# replays with the fast MLA plan ([#3987](https://github.com/sgl-project/sglang/pull/3987)),
# which takes *host* indptrs and copies nothing into the bound buffers. refimpl keeps three
# shapes ([facts](../docs/sglang_facts.md#flashinfer-mla)):
#
# * **legacy** (C): target verify and draft extend are two textually identical branches, in
#   capture and again in replay; decode replay rebuilds `kv_indptr` in the backend's *eager*
#   buffer;
# * **as-upstream** (C, merged branches: what
#   [#26665](https://github.com/sgl-project/sglang/pull/26665) did): the identical branches are
#   merged, but capture and replay stay two bodies, and decode replay still writes the eager
#   `kv_indptr` (open upstream: [#37975](https://github.com/sgl-project/sglang/pull/37975)), so
#   the graph-bound `kv_indptr` and `kv_len_arr` keep the capture-time batch;
# * **unified** (B, refimpl's shape): prepare the wrapper, run the replay body, install the fast
#   plan; decode replay writes the bound buffers (a fix upstream has not made:
#   [not upstream's](../docs/sglang_facts.md#where-refimpl-deliberately-differs-from-upstream)).
#
# The checker on decode (the MLA model: 16 heads, latent 512 + rope 64). Graph = eager even with
# the stale buffers, because the decode kernel reads the plan's partition, which is current.

# %%
fast = CheckSettings(capture_bs=(4,), raw_bs=(3,), max_context_len=40, glue_replays=0, history=False)  # one graph; no (e)
mla_rows = {}
for v in ("legacy", "as-upstream", "unified"):
    (r,) = check_entry_mode(find("flashinfer_mla", v)[0], "decode", CPUEmulatorEngine(), fast)
    mla_rows[v] = r
    print(f"flashinfer_mla/{v} ({r.pattern}) decode: capture=replay {r.capture_equals_replay}, "
          f"graph=eager {r.graph_equals_eager}, =oracle {r.matches_oracle}")
    for f in r.findings:
        print("    finding:", f)
for v in ("legacy", "as-upstream"):
    stale = [f.split(":")[0] for f in mla_rows[v].findings]
    assert mla_rows[v].capture_equals_replay is False and {"kv_indptr", "kv_len_arr"} <= set(stale), stale
    assert mla_rows[v].graph_equals_eager is True and mla_rows[v].matches_oracle is True  # hidden
assert mla_rows["unified"].passed and not mla_rows["unified"].findings

# %% [markdown]
# (The `kv_indices` line is a consequence: the checker reads the live part of the indices as
# `kv_indices[:kv_indptr[bs]]`, and with a stale `kv_indptr` that cut is the capture batch's.)
#
# **The merged branch.** The MLA part of the refactor was small: in both hooks the
# target-verify branch and the draft-extend branch were the same code, so they became one. We
# pull the two branch bodies out of each legacy hook with `ast` and compare them as text.


# %%
def mode_branches(fn) -> dict[str, str]:
    """{predicate: body source} for every `if/elif forward_mode.<predicate>():` branch."""
    src = textwrap.dedent(inspect.getsource(fn))
    lines, out = src.splitlines(), {}
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Call) and isinstance(node.test.func, ast.Attribute):
            body = lines[node.body[0].lineno - 1 : node.body[-1].end_lineno]
            out[node.test.func.attr] = textwrap.dedent("\n".join(body))
    return out


def calls(fn, name: str) -> int:  # calls of `name(` in fn's body, comments excluded
    return sum(line.count(f"{name}(") for line in hook_code(fn))


CAP, REP = "init_forward_metadata_capture_cuda_graph", "init_forward_metadata_replay_cuda_graph"
for hook in (CAP, REP):
    branches = mode_branches(getattr(FlashInferMLAAttnBackendLegacy, hook))
    print(f"legacy {hook}: both branch bodies read")
    print(textwrap.indent(branches["is_target_verify"], "    "))
    assert branches["is_target_verify"] == branches["is_any_draft_extend"]  # identical apart from the condition
    assert calls(getattr(FlashInferMLAAttnBackendLegacy, hook), "self._prefill_plan") == 2
    as_upstream = getattr(FlashInferMLAAttnBackendAsUpstream, hook)  # two bodies, one merged branch each
    assert "is_any_draft_extend" not in mode_branches(as_upstream) and calls(as_upstream, "self._prefill_plan") == 1
merged = "forward_mode.is_target_verify() or forward_mode.is_any_draft_extend()"
assert merged in "\n".join(hook_code(getattr(FlashInferMLAAttnBackend, REP)))
# as-upstream's capture never runs the replay body ("C, merged branches"); unified's is Pattern B
assert calls(getattr(FlashInferMLAAttnBackendAsUpstream, CAP), f"self.{REP}") == 0
assert calls(getattr(FlashInferMLAAttnBackend, CAP), "self._prepare_cuda_graph_metadata") == 1
assert calls(getattr(FlashInferMLAAttnBackend, CAP), f"self.{REP}") == 1

# %%
elapsed = time.perf_counter() - NOTEBOOK_T0
print(f"notebook ran in {elapsed:.1f} s")
