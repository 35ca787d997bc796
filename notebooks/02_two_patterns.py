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
# # Two patterns
#
# Notebook 01 showed how each forward mode lays out its static buffers, and ended with two
# legacy backends whose capture hook and replay hook left different state. This notebook is
# about *why* that happened and how SGLang's refactor made it structurally impossible. Two
# shapes came out of it: **Pattern A** for backends whose metadata is plain tensors (Triton,
# Wave), and **Pattern B** for backends whose kernels live inside library objects (FlashInfer).
# As before, every claim on this page about the code's behaviour is checked by an `assert` in
# the cell that shows it. (The H200 timings of section 6 are a committed measurement: they are
# printed as recorded, not asserted.)
#
# ## 1. The story
#
# Every attention backend has two graph hooks ([facts](../docs/sglang_facts.md#the-graph-runner)).
# `init_forward_metadata_capture_cuda_graph` runs once per batch size, before capture.
# `init_forward_metadata_replay_cuda_graph` runs before every replay. Both must leave the
# buffers the graph reads in the *same layout*. Before the refactor each backend kept two
# independent copies of the buffer-filling code, and the copies drifted ([#26134](https://github.com/sgl-project/sglang/pull/26134)):
#
# * **Wave** skipped `get_num_kv_splits` at capture but called it at replay;
# * **Cutlass-MLA** asserted `seq_lens_cpu is not None` in replay, a parameter it never read;
# * **FlashInfer** carried about 240 lines of per-mode dispatch, written twice.
#
# PR [#26134](https://github.com/sgl-project/sglang/pull/26134) ("unify cuda-graph
# capture/replay across attention backends") fixed this. It was reverted a day later
# ([#26166](https://github.com/sgl-project/sglang/pull/26166), a conflict with an SWA fix) and
# relanded as **[#26665](https://github.com/sgl-project/sglang/pull/26665)** (19 files,
# +1066/−1575). The vocabulary it introduced
# ([facts](../docs/sglang_facts.md#pattern-vocabulary)):
#
# | pattern | capture hook                                                          | replay hook                      | backends (in refimpl)                                 |
# |---------|-----------------------------------------------------------------------|----------------------------------|-------------------------------------------------------|
# | **C** (old) | its own copy of the buffer filling, per mode                      | a second copy, per mode          | every `legacy` variant                                |
# | **A**   | calls the replay body, then *freezes* a metadata object whose tensors are views of the graph buffers (`_build_cuda_graph_forward_metadata`) | the one filling body | Triton, Wave (unified); torch_native                  |
# | **B**   | *prepares* graph-bound objects (wrappers bound to the static buffers, registered per batch size), then runs the replay body, then capture-only tail steps (install the fast plan) | the one update body: re-plan the registered wrapper | FlashInfer (unified); FlashInfer-MLA (unified: refimpl's shape, [not upstream's](../docs/sglang_facts.md#where-refimpl-deliberately-differs-from-upstream)) |
# | **C, merged branches** | two bodies, but the identical target-verify / draft-extend branches inside each are merged | its own body | FlashInfer-MLA (as-upstream: what [#26665](https://github.com/sgl-project/sglang/pull/26665) did) |
#
# With A or B the capture state is, by construction, what replay would produce for the same
# batch. With C nothing guarantees it, and the checker has to find out.

# %%
import ast
import inspect
import json
import re
import textwrap
import time
from pathlib import Path

import torch
from matplotlib.figure import Figure

from refimpl import ForwardMode, GraphConfig, ModelConfig, capabilities, viz
from refimpl.backends import REGISTRY, find
from refimpl.backends.flashinfer import FlashInferAttnBackend, FlashInferAttnBackendLegacy
from refimpl.backends.flashinfer_mla import (
    FlashInferMLAAttnBackend,
    FlashInferMLAAttnBackendAsUpstream,
    FlashInferMLAAttnBackendLegacy,
)
from refimpl.backends.triton import TritonAttnBackend, TritonAttnBackendLegacy
from refimpl.backends.wave import WaveAttnBackend, WaveAttnBackendLegacy
from refimpl.batch import World
from refimpl.batchgen import BatchGenerator
from refimpl.check import CheckSettings, check_entry_mode
from refimpl.config import tiny_model_config
from refimpl.flashinfer_wrappers import flashinfer_available, is_standin, read_partition
from refimpl.flashinfer_wrappers.fast_plan import fast_decode_plan, is_fast_plan_installed
from refimpl.graphs import CPUEmulatorEngine, make_engine
from refimpl.graphs.runner import GraphRunner
from refimpl.model import TinyDecoder
from refimpl.viz.code import CodeGrid, SideBySideDiff, hook_code

try:
    from IPython import get_ipython
    from IPython.display import Image, Markdown, display
except ImportError:  # no IPython at all
    get_ipython = lambda: None  # noqa: E731
IN_NOTEBOOK = get_ipython() is not None  # False when run as a plain script (the GPU check does)

NOTEBOOK_T0 = time.perf_counter()
# the repository root, wherever the notebook is run from
ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd().parent
FIGURES = ROOT / "figures"
PLAN_COST = ROOT / "benchmarks/results/plan_cost/plan_cost.json"

# one row per (backend, variant): the pattern each class declares (section 1 compares it with
# the pattern its capture hook's code follows)
classes = {(e.name, e.variant): e.load() for e in REGISTRY if e.name != "torch_native_mla"}
patterns = {key: cls.pattern for key, cls in classes.items()}
for (name, variant), p in patterns.items():
    print(f"{name:<15} {variant:<12} Pattern {p}")

# %% [markdown]
# A few helpers. `hook_code` (from `refimpl.viz.code`) returns a method's body as source lines (no `def` line, no
# docstring, comments removed unless asked for, so that an assert about a *call* is not fooled
# by a comment that mentions it); `calls` counts the calls of a name in it; `mode_branches`
# pulls out the body of each `if/elif forward_mode.is_...():` branch. `check` runs the
# capture/replay checker of `refimpl.check` for one backend, variant and mode, with small
# settings: one raw batch of 3, padded to the one graph captured, for batch size 4, on the CPU
# graph emulator. `show_record` prints the verdicts: (a) capture = replay, the graph-read state after
# the capture hook equals the state after the replay hook for the same batch; (b) graph =
# eager; (c) eager = the float64 oracle. `show` saves a figure under `figures/02_<name>.png`
# and displays it. `CodeGrid` and `SideBySideDiff` (`refimpl.viz.code` too) render source code:
# as HTML in a notebook, as plain text when the notebook runs as a script.


# %%
def calls(fn, name: str) -> int:
    """How many times `name(` is called in fn's body (comments excluded)."""
    return sum(line.count(f"{name}(") for line in hook_code(fn))


def mode_branches(fn) -> dict[str, list[str]]:
    """{predicate: body source} for every `if/elif forward_mode.<predicate>():` branch."""
    src = textwrap.dedent(inspect.getsource(fn))
    lines, out = src.splitlines(), {}
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.If):
            test = node.test
            if isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute):
                body = lines[node.body[0].lineno - 1 : node.body[-1].end_lineno]
                out[test.func.attr] = textwrap.dedent("\n".join(body)).splitlines()
    return out


CHECK = CheckSettings(capture_bs=(4,), raw_bs=(3,), max_context_len=40)  # one graph: fast


def check(name: str, variant: str, case: str):
    (rec,) = check_entry_mode(find(name, variant)[0], case, CPUEmulatorEngine(), CHECK)
    return rec


def show_record(r) -> None:
    print(
        f"{r.backend}/{r.variant} {r.mode}, raw bs {r.bs}: capture=replay "
        f"{r.capture_equals_replay}, graph=eager {r.graph_equals_eager}, "
        f"=oracle {r.matches_oracle} -> {'PASS' if r.passed else 'FAIL'}"
    )
    for f in r.findings:
        print("    finding:", f)


def show(fig, name):
    path = viz.save(fig, FIGURES / f"02_{name}.png")
    if IN_NOTEBOOK:
        display(Image(filename=str(path)))


def render(obj) -> None:
    """Rich output (HTML) in a notebook, the plain-text form as a script."""
    display(obj) if IN_NOTEBOOK else print(obj)


# %% [markdown]
# The labels printed at the top are what each class declares. The code decides which pattern a
# backend really follows: a capture hook that never calls the replay body is Pattern C (two
# bodies); one that calls it is Pattern A, or Pattern B when it first calls
# `_prepare_cuda_graph_metadata`. A capture hook that only adds checks and hands everything
# over to `super()`'s (Triton's `fused` shape) follows its parent's. Derived from each capture hook this
# way, the labels agree, and the table above holds (the `in-graph` shapes, notebook 03, are
# none of the three).

# %%
HOOK = "init_forward_metadata_capture_cuda_graph"


def pattern_from_code(cls) -> str:
    owners = [c for c in cls.__mro__ if HOOK in vars(c)]  # the classes that define the hook
    for owner in owners:  # skip hooks that only hand over to their parent's
        cap = vars(owner)[HOOK]
        if calls(cap, "self.init_forward_metadata_replay_cuda_graph") or not calls(cap, f"super().{HOOK}"):
            break
    if calls(cap, "self.init_forward_metadata_replay_cuda_graph") == 0:
        return "C"
    return "B" if calls(cap, "self._prepare_cuda_graph_metadata") else "A"


derived = {key: pattern_from_code(c) for key, c in classes.items() if patterns[key] != "in-graph"}
for (name, variant), p in derived.items():
    declared = patterns[name, variant]
    print(f"{name:<15} {variant:<12} capture hook -> Pattern {p}  (declared: {declared})")
assert all(patterns[key].split(",")[0] == p for key, p in derived.items())
assert {p for (_, v), p in derived.items() if v == "legacy"} == {"C"}
assert derived["triton", "unified"] == derived["wave", "unified"] == "A"
assert derived["flashinfer", "unified"] == derived["flashinfer_mla", "unified"] == "B"

# %% [markdown]
# ## 2. Side by side: Pattern A | Pattern B | Pattern C
#
# One backend of each shape, its two hooks in aligned columns: the capture hook (once per batch
# size, before the graph opens) on the top row, the replay hook (before every `graph.replay()`)
# below. The source is read from the classes now (`inspect`, comments kept, docstrings
# dropped); the tags on the right edge are this notebook's.
#
# * **A**, unified Triton: the capture hook *is* the replay body plus one line that freezes a
#   metadata object of views (`[:bs + 1]`) of the static buffers.
# * **B**, unified FlashInfer: the capture hook first *prepares* the graph-bound objects (the
#   prepare step is shown under it: create the wrappers bound to the static buffers, register
#   them per batch size), then runs the replay body, then a capture-only tail.
# * **C**, legacy Triton: two bodies. Nothing but care keeps them in step, and they are not:
#   two of the historical differences are tagged (the split counts, and the draft-extend
#   `qo_indptr` stride).
#
# Two conventions visible here are refimpl's, not upstream's
# ([the list](../docs/sglang_facts.md#where-refimpl-deliberately-differs-from-upstream)):
# A's draft extend v2 freezes the stride N as `max_extend_len` (`_build_cuda_graph_forward_metadata`);
# B's verify / draft-extend replay hands `plan` host indptrs computed from `seq_lens_cpu`
# (inside `_update_prefill`), where upstream builds device indptrs that `plan` copies back.

# %%
CAP, REP = HOOK, "init_forward_metadata_replay_cuda_graph"
A, B, C = TritonAttnBackend, FlashInferAttnBackend, TritonAttnBackendLegacy
shapes = CodeGrid(
    [
        "Pattern A: TritonAttnBackend (unified)",
        "Pattern B: FlashInferAttnBackend (unified)",
        "Pattern C: TritonAttnBackendLegacy",
    ],
    ["capture hook", "replay hook"],
    [
        [
            [(CAP, hook_code(getattr(A, CAP), comments=True))],
            [
                (CAP, hook_code(getattr(B, CAP), comments=True)),
                (
                    "... which first calls _prepare_cuda_graph_metadata:",
                    hook_code(B._prepare_cuda_graph_metadata, comments=True),
                ),
            ],
            [(CAP, hook_code(getattr(C, CAP), comments=True))],
        ],
        [
            [(REP, hook_code(getattr(A, REP), comments=True))],
            [(REP, hook_code(getattr(B, REP), comments=True))],
            [(REP, hook_code(getattr(C, REP), comments=True))],
        ],
    ],
    [
        [
            [
                ("self.init_forward_metadata_replay_cuda_graph(", "the replay body"),
                ("self._build_cuda_graph_forward_metadata(", "freeze views"),
            ],
            [
                ("self._prepare_cuda_graph_metadata(", "prepare graph-bound objects"),
                ("self.init_forward_metadata_replay_cuda_graph(", "the replay body"),
                ("install_fast_decode_plan(", "capture-only tail"),
                ("self._create_decode_wrappers(", "bound to the static buffers"),
                ("self.decode_cuda_graph_metadata[bs] = wrappers", "registered per bs"),
            ],
            [
                ("# (1) no get_num_kv_splits here", "(1) no split counts"),
                ("torch.arange(0, bs * stride + 1, stride", "(2) uniform stride"),
            ],
        ],
        [
            [
                ("self._update_decode_kv_buffers(", "fill the static buffers"),
                ("self._splits(", "split counts: capture runs them too"),
            ],
            [
                ("self._update_decode(", "re-plan the registered wrapper"),
                ("self._update_prefill(", "re-plan (host indptrs)"),
            ],
            [("self._splits(", "(1) split counts"), ("torch.cumsum(real, 0)", "(2) ragged stride")],
        ],
    ],
)
render(shapes)

# A: the replay body, then the views; B: prepare, the replay body, the tail; C: no shared body
assert shapes.position(0, 0, "the replay body") < shapes.position(0, 0, "freeze views")
assert (
    shapes.position(0, 1, "prepare graph-bound objects")
    < shapes.position(0, 1, "the replay body")
    < shapes.position(0, 1, "capture-only tail")
)
for cls in (A, B):
    assert calls(getattr(cls, CAP), f"self.{REP}") == 1
assert calls(getattr(C, CAP), f"self.{REP}") == 0  # two bodies
assert calls(getattr(C, CAP), "self._splits") == 0 and calls(getattr(C, REP), "self._splits") == 1
assert calls(B._prepare_cuda_graph_metadata, "self._create_decode_wrappers") == 1
assert calls(B._prepare_cuda_graph_metadata, "self._create_prefill_wrappers") == 1

# %% [markdown]
# ## 3. Pattern C vs Pattern A: Triton and Wave
#
# ### The source
#
# Here is legacy Wave's capture hook, all of it, written as upstream looked before the
# refactor: each mode fills `kv_indptr` / `kv_indices` inline and freezes the metadata itself.
# What it does *not* do is compute the split counts.

# %%
wave_legacy_cap = WaveAttnBackendLegacy.init_forward_metadata_capture_cuda_graph
wave_legacy_rep = WaveAttnBackendLegacy.init_forward_metadata_replay_cuda_graph
print(textwrap.dedent(inspect.getsource(wave_legacy_cap)))
split_lines = [line.strip() for line in hook_code(wave_legacy_rep) if "_splits(" in line]
print("... while the legacy replay hook computes them:", *split_lines)

assert calls(wave_legacy_cap, "build_kv_indices") == 2  # decode and verify, inline
assert calls(wave_legacy_cap, "_update_decode_kv_buffers") == 0  # no helper of the refactor
assert calls(wave_legacy_cap, "_splits") == 0 and calls(wave_legacy_cap, "get_num_kv_splits") == 0
assert calls(wave_legacy_rep, "self._splits") == 1 and len(split_lines) == 1

# %% [markdown]
# The unified capture hook is shared: Wave inherits Triton's, column A of section 2. Apart
# from multi-step draft decode (whose kv buffers the multi-step wrapper owns and fills), it is
# two calls: run the replay body on the capture batch, then build the metadata from views of
# the graph buffers. Whatever replay fills, capture fills, split counts included. Wave's own
# replay hook only intercepts multi-step draft decode, then hands over to Triton's:

# %%
unified_cap = TritonAttnBackend.init_forward_metadata_capture_cuda_graph
wave_cap = WaveAttnBackend.init_forward_metadata_capture_cuda_graph
print("Wave's capture hook is Triton's unified one:", wave_cap is unified_cap)
print(textwrap.dedent(inspect.getsource(WaveAttnBackend.init_forward_metadata_replay_cuda_graph)))

assert wave_cap is unified_cap  # inherited
assert (
    calls(WaveAttnBackend.init_forward_metadata_replay_cuda_graph, "super().init_forward_metadata_replay_cuda_graph")
    == 1
)

# %% [markdown]
# Legacy Triton keeps two full bodies (column C). Its capture body diffed against its replay
# body, line by line (red: only in capture, green: only in replay), shows every place the two
# copies disagree. Two of them are the historical bugs: capture has no split-count call where
# replay has one, and in draft extend capture lays `qo_indptr` out with the uniform stride
# while replay writes a ragged `cumsum(accept_length + 1)`.

# %%
legacy_cap = TritonAttnBackendLegacy.init_forward_metadata_capture_cuda_graph
legacy_rep = TritonAttnBackendLegacy.init_forward_metadata_replay_cuda_graph
tri_diff = SideBySideDiff(
    [
        (
            "legacy Triton: capture body vs replay body",
            "legacy capture",
            hook_code(legacy_cap, comments=True),
            "legacy replay",
            hook_code(legacy_rep, comments=True),
        )
    ]
)
render(tri_diff)

removed, added = tri_diff.only_left(0), tri_diff.only_right(0)
assert any("self._splits(" in line for line in added)  # replay computes the splits ...
assert not any("self._splits(" in line for line in removed)  # ... capture never did
assert any("torch.arange(0, bs * stride + 1, stride" in line for line in removed)  # uniform
assert any("torch.cumsum(real, 0)" in line for line in added)  # ragged stride

# %% [markdown]
# ### The checker on both shapes
#
# Source reading says *where* the copies differ; the checker says *whether it matters*. It
# runs the capture hook on a batch in one fresh backend, the capture hook on the dummy batch
# followed by the replay hook on the same batch in another, and compares what the graph would
# read. Then it captures graphs, replays the batch and compares with eager and with the oracle.
#
# **Wave, decode.** Legacy: the split counts differ (capture left `max_kv_splits` = 8 from the
# buffer's `torch.full`), but graph = eager, because every replay recomputes them before
# `graph.replay()` and the kernel reads the buffer at run time (notebook 01, section 5). Unified: no
# findings.

# %%
wave_rows = {v: check("wave", v, "decode") for v in ("legacy", "unified")}
for r in wave_rows.values():
    show_record(r)

old = wave_rows["legacy"]
assert old.capture_equals_replay is False and len(old.findings) == 1
assert old.findings[0].startswith("num_kv_splits:")
assert re.search(r"\] 8 vs [1-7]\b", old.findings[0])  # capture: max_kv_splits; replay: computed
assert old.graph_equals_eager is True and old.matches_oracle is True  # benign
assert wave_rows["unified"].passed and not wave_rows["unified"].findings

# %% [markdown]
# **Triton, draft extend (v1).** Legacy: `qo_indptr` differs, and this time the graph's
# output is wrong. The rows in the static inputs sit at stride S + 1 = 4, but the replayed
# `qo_indptr` says request 1 starts at row 2, so every request after the first reads the wrong
# rows. Eager builds `qo_indptr` from the batch's own `extend_seq_lens` and still matches the
# oracle, so only a graph-vs-eager comparison can catch it. Unified: no findings. (Two
# conventions here are refimpl's, [not upstream's](../docs/sglang_facts.md#where-refimpl-deliberately-differs-from-upstream):
# a v1 draft-extend batch always has the graph layout, S + 1 rows per request of which the
# first `accept_length + 1` are real, eager included; and a request's new rows count in its
# `seq_lens` in every extend mode, so the prefix is `seq_lens - rows`.)

# %%
tri_rows = {v: check("triton", v, "draft_extend") for v in ("legacy", "unified")}
for r in tri_rows.values():
    show_record(r)

old = tri_rows["legacy"]
assert old.capture_equals_replay is False and old.findings[0].startswith("qo_indptr:")
assert "[1] 4 vs 2" in old.findings[0]  # capture: stride S+1 = 4; replay: accept_length + 1
assert old.graph_equals_eager is False and old.matches_oracle is True  # a wrong answer
assert any(f.startswith("graph vs eager:") for f in old.findings)
assert tri_rows["unified"].passed and not tri_rows["unified"].findings

# %% [markdown]
# ## 4. Pattern B: FlashInfer
#
# ### Why a *prepare* step
#
# Triton's graph reads plain tensors, so "capture = replay body + freeze views" is enough.
# FlashInfer's kernels live inside **wrapper objects**. A wrapper built with
# `use_cuda_graph=True` is bound, at construction, to the buffers it is given (indptr,
# indices, last-page lengths; prefill also qo_indptr and the mask), and to a fixed batch size.
# `plan()` copies the batch into those buffers and writes a **work partition**, computed on
# the host, into the wrapper's own int workspace; `run()` reads only the bound buffers and that
# partition. A graph captured around `run()` therefore captures *one specific wrapper*: its
# bound addresses, its workspace and the kernel module its first plan selected.
#
# So before capture can run the shared replay body (which re-plans the wrapper registered for
# this batch size), something must create the wrapper, bind it and register it. That is
# `_prepare_cuda_graph_metadata`, column B of section 2; the wrapper factories are
# `_create_decode_wrappers` and `_create_prefill_wrappers`. After the replay body, a
# capture-only tail installs the fast decode plan (section 6).

# %% [markdown]
# ### Live, with the stand-ins
#
# Without a GPU, `FlashInferAttnBackend` builds the stand-in wrappers of
# `refimpl.flashinfer_wrappers`: flashinfer 0.6.0's constructor / `plan` / `run` arguments, the
# same binding, the same partition-in-the-workspace behaviour (`standin.py`). One difference is
# refimpl's: the stand-in prefill wrapper keeps one byte per custom-mask entry where the real one
# packs bits ([the list](../docs/sglang_facts.md#where-refimpl-deliberately-differs-from-upstream)).
# `prefer_real=False` asks for them on every machine, so this section reads the same on a GPU.
# We capture decode graphs for batch sizes 1, 2 and 4.

# %%
emu = CPUEmulatorEngine()
device = emu.device
cfg = ModelConfig()  # MHA: 2 layers, 4 query heads, 2 KV heads, head dim 16, fp32
L = 40
world = World.create(cfg, max_context_len=L, pool_size=24, device=device)
world.randomize_kv(0)
model = TinyDecoder(cfg, device)
GRAPHS = GraphConfig(max_bs=4, capture_bs=(1, 2, 4), max_context_len=L)

fi = FlashInferAttnBackend(world, None, prefer_real=False)
assert fi.fi.real is False and fi.fi.BatchDecodeWithPagedKVCacheWrapper.IS_STANDIN
fi_runner = GraphRunner(model, fi, emu, ForwardMode.DECODE, GRAPHS)
records = fi_runner.capture()
for r in records:
    print(f"bs {r.bs}: graph kernels {r.kernels}")
# every wrapper.run is one `refimpl.fi_run` op (flashinfer_wrappers/ops.py): the real kernels
# bypass PyTorch's dispatcher, so the op is what lets both engines see (and replay) them
assert all(r.kernels == {"refimpl.fi_run.default": cfg.num_layers} for r in records)

# %% [markdown]
# `decode_cuda_graph_metadata` now holds one wrapper per batch size. Each is a different
# object with its own int workspace (where its partition lives), bound to the `[:bs+1]` prefix
# of the backend's one `kv_indptr` tensor (same storage, same start address) and to the
# backend's `cuda_graph_kv_indices` (the very tensor). Its `plan` is the fast decode plan.

# %%
wrappers = {bs: ws[0] for bs, ws in sorted(fi.decode_cuda_graph_metadata.items())}
print(f"{'bs':>2}  {'wrapper':<35} {'indptr buf':<11} {'same storage':<13} {'indices buf':<12} fast plan")
for bs, w in wrappers.items():
    same = w._paged_kv_indptr_buf.untyped_storage().data_ptr() == fi.kv_indptr.untyped_storage().data_ptr()
    print(
        f"{bs:>2}  {type(w).__name__:<35} "
        f"{str(list(w._paged_kv_indptr_buf.shape)):<11} {str(same):<13} "
        f"{'the tensor' if w._paged_kv_indices_buf is fi.cuda_graph_kv_indices else 'other':<12} "
        f"{is_fast_plan_installed(w)}"
    )
    assert is_standin(w) and w.is_cuda_graph_enabled and w._fixed_batch_size == bs
    assert w._paged_kv_indptr_buf.shape == (bs + 1,)
    assert w._paged_kv_indptr_buf.data_ptr() == fi.kv_indptr.data_ptr()  # a view of kv_indptr
    assert w._paged_kv_indices_buf is fi.cuda_graph_kv_indices
    assert is_fast_plan_installed(w)
assert sorted(wrappers) == [1, 2, 4]
assert len({id(w) for w in wrappers.values()}) == 3  # three distinct wrappers
assert len({w._int_workspace_buffer.data_ptr() for w in wrappers.values()}) == 3  # 3 partitions

# %% [markdown]
# A fresh decode batch of 3 is replayed by the bs-4 graph (one padded row); the replay hook
# re-plans the bs-4 wrapper. Graph = eager.

# %%
gen = BatchGenerator(world, None, seed=1)
fb = gen.decode(3)
graph_out = fi_runner.replay(fb).clone()
eager_out = fi_runner.eager(fb)
w4 = wrappers[4]
q_len, kv_len = read_partition(w4)
print(
    "seq_lens",
    fb.seq_lens.tolist(),
    "| bound kv_indptr",
    fi.kv_indptr[:5].tolist(),
    "| planned partition kv_len",
    kv_len.tolist(),
)
print(f"graph vs eager: max |diff| = {(graph_out - eager_out).abs().max():.1e}")
assert torch.allclose(graph_out, eager_out, atol=1e-4)
assert kv_len.tolist() == fb.seq_lens.tolist() + [1]  # + the padded row (fill value 1)
assert fi.kv_indptr[:5].tolist() == [0] + torch.cumsum(kv_len, 0).tolist()

# %% [markdown]
# ### Plan state: why every replay must re-plan
#
# What does the captured `run()` read to find each request's keys? Not the bound indptr. Below
# we overwrite the bound `kv_indptr` by hand (every request now "has" one key) and replay the
# graph again *without* re-planning. The output does not change by a single bit: the kernel
# takes its per-request ranges from the partition that the last `plan()` wrote, which still
# describes the real batch.

# %%
saved_indptr = fi.kv_indptr[:5].clone()
fi.kv_indptr[1:5] = torch.arange(1, 5, dtype=torch.int32)  # by hand, no plan()
fi_runner.graphs[4].replay()
print("bound kv_indptr now", fi.kv_indptr[:5].tolist(), "| partition kv_len", read_partition(w4)[1].tolist())
assert torch.equal(fi_runner.outputs[4][:3], graph_out)  # unchanged: the partition is stale
assert read_partition(w4)[1].tolist() == kv_len.tolist()
fi.kv_indptr[:5] = saved_indptr  # put the replayed batch's indptr back

# %% [markdown]
# The flip side: a replay hook that writes the bound buffers for a *new* batch but skips
# `plan()` gives a wrong answer, silently. We switch the bs-4 wrapper's `plan` off, replay a
# batch with other lengths, and compare with eager; then switch it back and replay again.

# %%
fb2 = gen.decode(3, seq_lens=[30, 5, 17])
fast_plan = w4.plan
w4.plan = lambda *args, **kwargs: None  # a replay hook that forgot to re-plan
skipped = fi_runner.replay(fb2).clone()
w4.plan = fast_plan
eager2 = fi_runner.eager(fb2)
print(
    "bound kv_indptr",
    fi.kv_indptr[:5].tolist(),
    "(new batch) | partition kv_len",
    read_partition(w4)[1].tolist(),
    "(old batch)",
)
print(f"no re-plan: graph vs eager max |diff| = {(skipped - eager2).abs().max():.2f}")
assert read_partition(w4)[1].tolist() == kv_len.tolist()  # still the previous batch
assert not torch.allclose(skipped, eager2, atol=1e-2)

replanned = fi_runner.replay(fb2).clone()
print(f"re-planned: graph vs eager max |diff| = {(replanned - eager2).abs().max():.1e}")
assert read_partition(w4)[1].tolist() == [30, 5, 17, 1]
assert torch.allclose(replanned, eager2, atol=1e-4)

# %% [markdown]
# ### Legacy FlashInfer: the same behaviour, written twice
#
# In Pattern C, FlashInfer's capture hook created the wrappers and planned them inline, mode by
# mode, and the replay hook repeated the per-mode dispatch. The two copies happen to agree, so
# the checker finds nothing on the legacy shape: the PR's motivation here was the duplicated
# dispatch (about 240 lines upstream), not a divergence.

# %%
fi_rows = [check("flashinfer", "legacy", m) for m in ("decode", "target_verify", "draft_extend")]
for r in fi_rows:
    show_record(r)
assert all(r.passed and not r.findings for r in fi_rows)

# %% [markdown]
# The duplication, shown. Below, the legacy hooks (left) against the unified ones (right),
# diffed line by line: red lines only legacy has, green lines only unified has; lines that
# branch on the forward mode are in **bold**. Top: legacy's capture hook against the unified
# capture hook followed by its prepare step. Bottom: replay against replay.
#
# Read the bold lines. Legacy dispatches on decode / target verify / draft extend in its capture
# hook, and again in its replay hook; each capture branch builds its wrapper inline *and* plans
# it (`_update_decode` / `_update_prefill`), which the replay branches repeat. In the unified
# shape the capture hook does not dispatch on the mode to plan at all (its one mode check
# installs the fast plan): it calls `_prepare_cuda_graph_metadata`, whose dispatch only creates,
# binds and registers the wrappers, and then the replay body, the one place that plans, where
# target verify and draft extend share one branch. (refimpl's legacy shape already calls the
# shared update bodies; upstream, where each legacy branch spelled out the plan arguments too,
# the duplication was about 240 lines.)

# %%
MODE_BRANCH = r"^\s*(if|elif)\b.*\b(forward_)?mode\.is_"
FL, FU = FlashInferAttnBackendLegacy, FlashInferAttnBackend
fi_diff = SideBySideDiff(
    [
        (
            "capture: legacy hook vs unified hook + its prepare step",
            "FlashInferAttnBackendLegacy." + CAP,
            hook_code(getattr(FL, CAP), comments=True),
            f"FlashInferAttnBackend.{CAP} + _prepare_cuda_graph_metadata",
            hook_code(getattr(FU, CAP), comments=True)
            + ["# --- _prepare_cuda_graph_metadata:"]
            + hook_code(FU._prepare_cuda_graph_metadata, comments=True),
        ),
        (
            "replay: legacy hook vs unified hook",
            "FlashInferAttnBackendLegacy." + REP,
            hook_code(getattr(FL, REP), comments=True),
            "FlashInferAttnBackend." + REP,
            hook_code(getattr(FU, REP), comments=True),
        ),
    ],
    emphasis=MODE_BRANCH,
)
render(fi_diff)

PLANS = ("self._update_decode(", "self._update_prefill(")
legacy_plans = [line for line in fi_diff.sections[0][2] if line.strip().startswith(PLANS)]
assert len(legacy_plans) == 3  # legacy capture plans in every mode branch ...
assert all(line in fi_diff.only_left(0) for line in legacy_plans)  # ... unified capture never
assert not any(line.strip().startswith(PLANS) for line in fi_diff.sections[0][4])
# the mode dispatch: three branches in each legacy hook; unified prepare and replay merge two
branches = {
    k: list(mode_branches(fn))
    for k, fn in {
        "legacy capture": getattr(FL, CAP),
        "legacy replay": getattr(FL, REP),
        "unified prepare": FU._prepare_cuda_graph_metadata,
        "unified replay": getattr(FU, REP),
    }.items()
}
print("\nmode branches (the bold lines):")
for k, v in branches.items():
    print(f"  {k:<16} {v}")
every_mode = ["is_decode_or_idle", "is_target_verify", "is_any_draft_extend"]
assert branches["legacy capture"] == branches["legacy replay"] == every_mode
verify, extend = (mode_branches(getattr(FL, REP))[p] for p in every_mode[1:])
assert verify == extend  # legacy replay: two branches, one body
assert branches["unified prepare"] == branches["unified replay"] == ["is_decode_or_idle"]
merged = "forward_mode.is_target_verify() or forward_mode.is_any_draft_extend()"
assert any(merged in line for line in fi_diff.only_right(1))  # one merged branch in replay

# %% [markdown]
# ## 5. FlashInfer-MLA: legacy, as-upstream, unified
#
# FlashInfer-MLA has one wrapper kind for every mode (`BatchMLAPagedAttentionWrapper`), bound
# to `cuda_graph_qo_indptr`, `cuda_graph_kv_indptr`, `cuda_graph_kv_indices` and
# `cuda_graph_kv_lens` (`kv_len_arr`). Decode replays with the fast MLA plan ([#3987](https://github.com/sgl-project/sglang/pull/3987)), which
# takes *host* indptrs and copies nothing into the bound buffers. refimpl keeps three shapes
# ([facts](../docs/sglang_facts.md#flashinfer-mla)):
#
# * **legacy** (C): target verify and draft extend are two textually identical branches, in
#   capture and again in replay; decode replay rebuilds `kv_indptr` in the backend's *eager*
#   buffer;
# * **as-upstream** (C, merged branches: what [#26665](https://github.com/sgl-project/sglang/pull/26665) did): the identical branches are merged,
#   but capture and replay stay two bodies, and decode replay still
#   writes the eager `kv_indptr` (open upstream: **[#37975](https://github.com/sgl-project/sglang/pull/37975)**): the graph-bound `kv_indptr` and
#   `kv_len_arr` keep the capture-time batch;
# * **unified** (B, refimpl's shape): prepare the wrapper, run the replay body, install the fast
#   plan; and decode replay writes the bound buffers (a fix upstream has not made: refimpl's,
#   [not upstream's](../docs/sglang_facts.md#where-refimpl-deliberately-differs-from-upstream)).
#
# The checker on decode (the MLA model: 16 heads, latent 512 + rope 64):

# %%
mla_rows = {v: check("flashinfer_mla", v, "decode") for v in ("legacy", "as-upstream", "unified")}
for r in mla_rows.values():
    show_record(r)

for v in ("legacy", "as-upstream"):
    r = mla_rows[v]
    stale = [f.split(":")[0] for f in r.findings]
    assert r.capture_equals_replay is False and {"kv_indptr", "kv_len_arr"} <= set(stale), stale
    assert r.graph_equals_eager is True and r.matches_oracle is True  # hidden
assert mla_rows["unified"].passed and not mla_rows["unified"].findings

# %% [markdown]
# (The `kv_indices` line is a consequence: the checker reads the live part of the indices as
# `kv_indices[:kv_indptr[bs]]`, and with a stale `kv_indptr` that cut is the capture batch's.)
#
# **Why graph = eager anyway.** The decode kernel never reads the bound `kv_indptr`: it reads
# the plan's partition, and the fast plan builds that from the host indptr, which *is* current.
# Live, on the as-upstream shape, after replaying a batch of 3:

# %%
mla_cfg = tiny_model_config("mla", torch.float32)
mla_world = World.create(mla_cfg, max_context_len=L, pool_size=24, device=device)
mla_world.randomize_kv(0)
mla_model = TinyDecoder(mla_cfg, device)
mla = FlashInferMLAAttnBackendAsUpstream(mla_world, None, prefer_real=False)
mla_runner = GraphRunner(mla_model, mla, emu, ForwardMode.DECODE, GRAPHS)
mla_runner.capture()
mla_gen = BatchGenerator(mla_world, None, seed=1)
mfb = mla_gen.decode(3)
m_graph = mla_runner.replay(mfb).clone()
m_eager = mla_runner.eager(mfb)
live = [0] + torch.cumsum(mla_runner.seq_lens[:4], 0).tolist()  # the padded batch's indptr
print("live batch indptr         ", live)
print("bound cuda_graph_kv_indptr", mla.cuda_graph_kv_indptr[:5].tolist(), " <- capture's dummy batch")
print("bound kv_len_arr          ", mla.cuda_graph_kv_lens.tolist())
print("eager buffer kv_indptr    ", mla.kv_indptr[:5].tolist(), " <- what replay wrote")
print("planned partition kv_len  ", read_partition(mla.decode_cuda_graph_metadata[4])[1].tolist())
print(f"graph vs eager: max |diff| = {(m_graph - m_eager).abs().max():.1e}")

assert mla.cuda_graph_kv_indptr[:5].tolist() == [0, 1, 2, 3, 4]  # stale: 4 rows of seq_len 1
assert mla.cuda_graph_kv_lens.tolist() == [1, 1, 1, 1]
assert mla.kv_indptr[:5].tolist() == live
assert read_partition(mla.decode_cuda_graph_metadata[4])[1].tolist() == mla_runner.seq_lens[:4].tolist()
assert torch.allclose(m_graph, m_eager, atol=1e-4)

# %% [markdown]
# Any other consumer of the bound `kv_indptr` (a different kernel, a debugging hook, a later
# library version that reads it) would see the capture-time boundaries. The unified shape
# removes the trap by writing the bound buffers; the only code difference is where
# `_fast_decode_replay` writes. The same batch replayed on the unified shape leaves the live
# batch in its bound `kv_indptr` and `kv_len_arr` (legacy decodes as upstream: the checker above
# reports the same stale buffers for it):

# %%
print(textwrap.dedent(inspect.getsource(FlashInferMLAAttnBackend._fast_decode_replay)))
mla_unified = FlashInferMLAAttnBackend(mla_world, None, prefer_real=False)
mla_unified_runner = GraphRunner(mla_model, mla_unified, emu, ForwardMode.DECODE, GRAPHS)
mla_unified_runner.capture()
u_graph = mla_unified_runner.replay(mfb).clone()
u_indptr, u_lens = mla_unified.cuda_graph_kv_indptr[:5].tolist(), mla_unified.cuda_graph_kv_lens
print("unified: bound cuda_graph_kv_indptr", u_indptr, "| bound kv_len_arr", u_lens.tolist())
assert u_indptr == live
assert u_lens.tolist() == mla_unified_runner.seq_lens[:4].tolist()
assert torch.allclose(u_graph, m_graph, atol=1e-4)  # the same answer as as-upstream

# %% [markdown]
# ### The merged branch
#
# The MLA part of the refactor was small: in both hooks the target-verify branch and the
# draft-extend branch were the same code, so they became one. We pull the two branch bodies out
# of each legacy hook with `ast` and compare them as text.

# %%
for hook in ("init_forward_metadata_capture_cuda_graph", "init_forward_metadata_replay_cuda_graph"):
    branches = mode_branches(getattr(FlashInferMLAAttnBackendLegacy, hook))
    verify, extend = branches["is_target_verify"], branches["is_any_draft_extend"]
    print(f"legacy {hook}: both branch bodies read")
    print(textwrap.indent("\n".join(verify), "    "))
    assert verify == extend  # textually identical apart from the condition

unified_src = "\n".join(hook_code(FlashInferMLAAttnBackend.init_forward_metadata_replay_cuda_graph))
assert "forward_mode.is_target_verify() or forward_mode.is_any_draft_extend()" in unified_src
merged = {  # as-upstream: two bodies, each with one merged verify / draft-extend branch
    "capture": FlashInferMLAAttnBackendAsUpstream.init_forward_metadata_capture_cuda_graph,
    "replay": FlashInferMLAAttnBackendAsUpstream.init_forward_metadata_replay_cuda_graph,
}
for hook in merged.values():
    assert "is_any_draft_extend" not in mode_branches(hook)  # no separate draft-extend branch
    assert calls(hook, "self._prefill_plan") == 1
for hook in ("init_forward_metadata_capture_cuda_graph", "init_forward_metadata_replay_cuda_graph"):
    assert calls(getattr(FlashInferMLAAttnBackendLegacy, hook), "self._prefill_plan") == 2
# ... and capture never runs the replay body: "C, merged branches", not A or B
assert calls(merged["capture"], "self.init_forward_metadata_replay_cuda_graph") == 0
# refimpl's unified shape is a real Pattern B: prepare the wrapper, then the replay body
unified_cap = FlashInferMLAAttnBackend.init_forward_metadata_capture_cuda_graph
assert calls(unified_cap, "self._prepare_cuda_graph_metadata") == 1
assert calls(unified_cap, "self.init_forward_metadata_replay_cuda_graph") == 1

# %% [markdown]
# ## 6. What the fast re-plan skips
#
# Pattern B's replay body re-plans on every replay, so the cost of `plan()` is paid on every
# decode step. A full `plan()` copies the indptr to the host, copies the batch into the bound
# buffers, selects the kernel module, and computes the partition on the host and writes it
# into the workspace. The fast decode plans of `refimpl/flashinfer_wrappers/fast_plan.py` (SGLang's
# `fast_decode_plan` / `fast_mla_decode_plan`, our way) keep only that last step, and never
# wait on the stream:
#
# | what the full `plan()` does | skipped | why that is safe on the graph path |
# |---|---|---|
# | copies the indptr (MLA: also `kv_len_arr`, `qo_indptr`) **device → host** | yes | the caller passes a host indptr it already has (built from `seq_lens_cpu`) that describes the batch it wrote on the device. The caller owns this invariant: if the two disagree, the kernel silently reads the wrong keys. For MLA this copy made graph replay hang ([#3987](https://github.com/sgl-project/sglang/pull/3987)). |
# | copies indptr / indices / last-page lengths **into the bound buffers** | yes | the caller hands over the bound buffers themselves, already written in place, so the copy would be a self-copy. refimpl checks this by address (no sync) and refuses anything else. MLA's bound `kv_indptr` / `kv_len_arr` stay stale: its decode reads only the partition and `kv_indices` ([#37975](https://github.com/sgl-project/sglang/pull/37975) hides behind this). |
# | selects (and on first use JIT-compiles) the **kernel module** | yes | `_cached_module` comes from the first full plan, made at capture. The fast plan refuses a wrapper that was never planned, and a q/kv dtype, sliding-window or soft-cap setting other than that plan's (they select another module). |
# | **stream synchronisation** | yes | nothing waits on the device. The partition is staged in the pinned host buffer and copied to the int workspace in stream order, before the replay that reads it. |
#
# The fast plan's guards, live on the bs-4 wrapper of section 4: three refusals, then an
# accepted call whose partition comes from the host indptr it was given.

# %%
H, Hkv, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
ones_cpu = torch.ones(4, dtype=torch.int32)
host_indptr = torch.tensor([0, 30, 35, 52, 53], dtype=torch.int32)  # fb2, as replay left it


def refusal(fn) -> str:
    try:
        fn()
    except (RuntimeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    raise AssertionError("the fast plan should have refused")


never_planned = fi.fi.BatchDecodeWithPagedKVCacheWrapper(
    fi.workspace,
    "NHD",
    use_cuda_graph=True,
    paged_kv_indptr_buffer=fi.kv_indptr[:5],
    paged_kv_indices_buffer=fi.cuda_graph_kv_indices,
    paged_kv_last_page_len_buffer=fi.kv_last_page_len[:4],
)
msgs = {
    "never planned": refusal(
        lambda: fast_decode_plan(never_planned, host_indptr, ones_cpu, H, Hkv, D, 1, q_data_type=cfg.dtype)
    ),
    "not the bound buffer": refusal(
        lambda: fast_decode_plan(
            w4, host_indptr, ones_cpu, H, Hkv, D, 1, q_data_type=cfg.dtype, indptr=fi.kv_indptr[:5].clone()
        )
    ),
    "other dtype": refusal(
        lambda: fast_decode_plan(w4, host_indptr, ones_cpu, H, Hkv, D, 1, q_data_type=torch.float16)
    ),
}
for what, msg in msgs.items():  # addresses change run to run: the message without them
    print(f"{what}:\n    {textwrap.shorten(re.sub(r' [(]data_ptr [^)]*[)]', '', msg), 160)}")
print(
    "the clone at the bound buffer's address:",
    fi.kv_indptr[:5].clone().data_ptr() == w4._paged_kv_indptr_buf.data_ptr(),
)
assert "_cached_module" in msgs["never planned"]
assert "not the wrapper's bound buffer" in msgs["not the bound buffer"]
assert "differs from the full plan's" in msgs["other dtype"]

fast_decode_plan(w4, host_indptr, ones_cpu, H, Hkv, D, 1, q_data_type=cfg.dtype)  # accepted
assert read_partition(w4)[1].tolist() == [30, 5, 17, 1]  # the partition follows the host indptr

# %% [markdown]
# ### What it saves on an H200
#
# `benchmarks/plan_cost.py` timed both plans on an H200 with the real flashinfer: host time per
# call (median of 300, `torch.cuda.synchronize()` before each call), context 4096, a
# Llama-3-8B-like decode shape (32 / 8 heads, dim 128) and a DeepSeek-like MLA shape (16 heads,
# 512 + 64), the whole sweep run twice. The results are committed in
# `benchmarks/results/plan_cost/plan_cost.json`; the table and the plot below read that file
# (nothing here is measured on this machine, so nothing here is asserted: the numbers are shown
# as recorded). The grey band is the published `plan()` cost of 75–110 µs
# ([flashinfer #5043](https://github.com/flashinfer-ai/flashinfer/pull/5043), measured on an RTX 4090 with a Ryzen 9 5950X: another host CPU).

# %%
bench = json.loads(PLAN_COST.read_text())
versions = bench["versions"]
print("measured with:", ", ".join(f"{k} {v}" for k, v in versions.items()))
print(f"context {bench['ctx']}, {bench['reps']} reps per point, decode heads {bench['heads']}, MLA {bench['mla']}\n")


def series(run, kind):
    rows = [r for r in run if r["kind"] == kind]
    return ([r["bs"] for r in rows], [r["full_plan_us"] for r in rows], [r["fast_plan_us"] for r in rows])


print(f"{'kind':<11} {'bs':>4}  {'plan() run1/run2 (us)':>22}  {'fast run1/run2 (us)':>20}  ratio")
for kind in ("decode", "mla_decode"):
    (bs1, full1, fast1), (bs2, full2, fast2) = (series(run, kind) for run in bench["runs"])
    for i, b in enumerate(bs1):
        print(
            f"{kind:<11} {b:>4}  {full1[i]:>10.1f} / {full2[i]:<9.1f}  {fast1[i]:>9.1f} / "
            f"{fast2[i]:<8.1f}  {full1[i] / fast1[i]:.1f}x / {full2[i] / fast2[i]:.1f}x"
        )

print()
for i, run in enumerate(bench["runs"]):  # the ranges the text below quotes
    _, full, fast = series(run, "decode")
    _, mla_full, mla_fast = series(run, "mla_decode")
    ratio = [f / p for f, p in zip(fast, full)]
    mla_ratio = [f / p for f, p in zip(mla_fast, mla_full)]
    print(
        f"run {i + 1}: decode plan() {min(full):.0f}-{max(full):.0f} us, fast / full "
        f"{min(ratio):.0%}-{max(ratio):.0%}; MLA fast / full "
        f"{min(mla_ratio):.0%}-{max(mla_ratio):.0%}"
    )

# %% [markdown]
# The two runs disagree on the absolute level (decode `plan()` takes 129–145 µs in run 1 and
# 85–138 µs in run 2: host timings move with the state of the host CPU), but they agree on the
# ratio. The fast decode plan costs about a quarter of the full one (23–29 %) at every batch
# size. The MLA fast plan costs a third of the full one at small batches and about 60 % at
# large ones: its host work grows with the batch. The H200 host's full decode plan sits at or
# above the published band, which was measured on a different CPU.

# %%
fig = Figure(figsize=(10, 3.8))
axes = fig.subplots(1, 2, sharey=True)
for ax, kind in zip(axes, ("decode", "mla_decode")):
    for i, run in enumerate(bench["runs"]):
        bs, full, fast = series(run, kind)
        style = "-" if i == 0 else "--"
        ax.plot(bs, full, "o" + style, color="C3", label=f"plan(), run {i + 1}")
        ax.plot(bs, fast, "s" + style, color="C0", label=f"fast plan, run {i + 1}")
    ax.axhspan(75, 110, color="0.85", zorder=0, label="published plan(): 75-110 us")
    ax.set_xscale("log", base=2)
    ax.set_xticks(bs, [str(b) for b in bs])
    ax.minorticks_off()
    ax.set_title("decode (32/8 heads, dim 128)" if kind == "decode" else "MLA decode (16 heads, 512+64)")
    ax.set_xlabel("batch size")
    ax.grid(alpha=0.3)
axes[0].set_ylabel("host time per plan call, median (us)")
axes[0].set_ylim(bottom=0)
axes[0].legend(fontsize=7, loc="upper left", ncol=2)
fig.suptitle(
    f"{versions['gpu']}, flashinfer {versions['flashinfer']}, torch {versions['torch']}, "
    f"CUDA {versions['cuda']} (committed measurement, context {bench['ctx']})",
    fontsize=9,
)
fig.tight_layout()
show(fig, "plan_cost_h200")

# %% [markdown]
# ## 7. On a GPU: the real flashinfer
#
# The next cell is tagged `gpu`: the test run skips it on CPU, and its body is guarded as well.
# With flashinfer importable it builds the same decode runner on the real wrappers and real CUDA
# graphs, in bf16 with head dim 64 (a size flashinfer compiles), replays a batch of 3, and
# compares with the *stand-in* backend's eager output on the same batch. Nothing later uses it.

# %% tags=["gpu"]
if torch.cuda.is_available():
    why = flashinfer_available()
    if why is not None:
        print("skipping the real-flashinfer replay:", why)
    else:
        import flashinfer

        gpu_engine = make_engine("cuda")
        gpu_cfg = tiny_model_config("mha", torch.bfloat16, "cuda")
        gpu_world = World.create(gpu_cfg, max_context_len=96, pool_size=24, device=gpu_engine.device)
        gpu_world.randomize_kv(0)
        gpu_model = TinyDecoder(gpu_cfg, gpu_world.device)
        real_fi = FlashInferAttnBackend(gpu_world, None)  # prefer_real: flashinfer's wrappers
        assert real_fi.fi.real and not is_standin(real_fi.fi.BatchDecodeWithPagedKVCacheWrapper)
        gpu_runner = GraphRunner(
            gpu_model,
            real_fi,
            gpu_engine,
            ForwardMode.DECODE,
            GraphConfig(max_bs=4, capture_bs=(1, 2, 4), max_context_len=96),
        )
        gpu_runner.capture()
        assert sorted(real_fi.decode_cuda_graph_metadata) == [1, 2, 4]
        assert not any(is_standin(ws[0]) for ws in real_fi.decode_cuda_graph_metadata.values())

        gpu_fb = BatchGenerator(gpu_world, None, seed=1).decode(3)
        real_graph = gpu_runner.replay(gpu_fb).float().clone()
        torch.cuda.synchronize()
        standin_fi = FlashInferAttnBackend(gpu_world, None, prefer_real=False)
        assert standin_fi.fi.real is False
        standin_fi.init_forward_metadata(gpu_fb)
        standin_eager = gpu_model(gpu_fb, standin_fi).float()
        gpu_diff = (real_graph - standin_eager).abs().max().item()
        print(
            f"flashinfer {flashinfer.__version__}: real wrappers under a CUDA graph vs stand-in "
            f"eager, max |diff| = {gpu_diff:.2e} (bf16)"
        )
        torch.testing.assert_close(real_graph, standin_eager, rtol=3e-2, atol=3e-2)

# %% [markdown]
# ## 8. The capability matrix
#
# Every registered backend x variant, every graph mode (chains, topk 1), and the pattern each
# declares (section 1 derived the same labels from the capture hooks). `graph`: the backend
# captures the mode; `eager`: it refuses to capture it but serves it eagerly; `—`: neither.
# `refimpl/capabilities.py` builds it by asking each backend (`check_graph_mode`, then one eager
# batch), so it cannot drift from the code; `python -m refimpl matrix` prints it, and the
# README's copy is checked against it by `tests/test_capabilities.py`.

# %%
matrix = capabilities.matrix()
table = capabilities.markdown(matrix)
readme = (ROOT / "README.md").read_text()
start, end = "<!-- capability-matrix:start -->", "<!-- capability-matrix:end -->"
assert table in readme[readme.index(start) : readme.index(end)], "README copy is out of date"
if IN_NOTEBOOK:
    display(Markdown(table))
else:
    print(table)
rows = {(r["backend"], r["variant"]): r for r in matrix}
# Wave serves draft extend only eagerly; Cutlass-MLA captures decode and idle only
assert rows["wave", "unified"]["draft_extend"] == "eager"
assert [m for m in capabilities.MODES if rows["cutlass_mla", "unified"][m] == "graph"] == ["decode", "idle"]

# %% [markdown]
# ## Summary
#
# | pattern | capture | what keeps capture = replay | failure mode when it is missing |
# |---|---|---|---|
# | **C** | its own copy of the filling | nothing: two copies, kept in sync by hand | drift. Benign when the kernel re-reads a buffer that replay refills (Wave's split counts); a wrong answer when the graph bakes the layout in (legacy Triton's draft-extend `qo_indptr`) |
# | **A** | replay body + freeze views | one filling body | – |
# | **B** | prepare (create, bind, register) + replay body + fast-plan tail | one update body, which **re-plans** the registered wrapper | a replay that skips the plan runs on a stale partition; a replay that writes an unbound buffer leaves the bound one stale (FlashInfer-MLA, [#37975](https://github.com/sgl-project/sglang/pull/37975): hidden, because its decode kernel reads only the partition) |
#
# The fast decode plan keeps Pattern B's per-replay `plan()` affordable: on the H200 it costs
# about a quarter of the full plan for decode, because it skips the device-to-host indptr copy,
# the copies into the bound buffers, the module selection and the stream synchronisation, all
# of which are redundant on the graph path as long as the caller keeps the host indptr and the
# bound buffers in agreement.

# %%
for g in (gen, mla_gen):
    g.release_all()
print(f"notebook ran in {time.perf_counter() - NOTEBOOK_T0:.1f} s")
