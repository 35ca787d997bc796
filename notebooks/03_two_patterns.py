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
# Reading time: about 29 minutes. The CPU run takes about 15 s.
#
# Notebooks 01 and 02 showed how each backend lays out its static buffers in each forward mode,
# and notebook 02 ended with two legacy backends whose capture hook and replay hook left
# different state. This notebook is about *why* that happened and how SGLang's refactor made it
# structurally impossible. Two shapes came out of it: **Pattern A** for backends whose metadata
# is plain tensors (Triton, Wave), and **Pattern B** for backends whose kernels live inside
# library objects (FlashInfer). Every claim on this page is checked by an `assert` in the cell
# that shows it (the H200 timings of section 5 against the committed measurement).
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

from refimpl import ForwardMode, GraphConfig, ModelConfig, viz
from refimpl.backends import REGISTRY, find
from refimpl.backends.flashinfer import FlashInferAttnBackend, FlashInferAttnBackendLegacy
from refimpl.backends.triton import TritonAttnBackend, TritonAttnBackendLegacy
from refimpl.backends.wave import WaveAttnBackend, WaveAttnBackendLegacy
from refimpl.batch import World
from refimpl.batchgen import BatchGenerator
from refimpl.check import CheckSettings, check_entry_mode
from refimpl.flashinfer_wrappers import is_standin, read_partition
from refimpl.flashinfer_wrappers.fast_plan import fast_decode_plan, is_fast_plan_installed
from refimpl.graphs import CPUEmulatorEngine
from refimpl.graphs.runner import GraphRunner
from refimpl.model import TinyDecoder
from refimpl.viz.code import CodeGrid, SideBySideDiff, hook_code

try:
    from IPython import get_ipython
    from IPython.display import Image, display
except ImportError:  # no IPython at all
    get_ipython = lambda: None  # noqa: E731
IN_NOTEBOOK = get_ipython() is not None  # False when run as a plain script (the GPU check does)

NOTEBOOK_T0 = time.perf_counter()
# the repository root, wherever the notebook is run from
ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd().parent
FIGURES = ROOT / "figures"
PLAN_COST = ROOT / "benchmarks/results/plan_cost/plan_cost.json"

# %% [markdown]
# A few helpers. `hook_code` (from `refimpl.viz.code`) returns a method's body as source lines,
# comments removed unless asked for, so that an assert about a *call* is not fooled by a comment;
# `calls` counts the calls of a name in it; `mode_branches` pulls out the body of each
# `if/elif forward_mode.is_...():` branch. `check` runs the checker of notebook 00 for one
# backend, variant and mode: one raw batch of 3, padded to the one graph captured (bs 4), on the
# CPU graph emulator; `show_record` prints its verdicts (a), (b) and (c). `CodeGrid` and
# `SideBySideDiff` render source code: as HTML in a notebook, as plain text in a script.


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


CHECK = CheckSettings(capture_bs=(4,), raw_bs=(3,), max_context_len=40, glue_replays=0, history=False)  # one graph; no (e)


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
    path = viz.save(fig, FIGURES / f"03_{name}.png")
    if IN_NOTEBOOK:
        display(Image(filename=str(path)))


def render(obj) -> None:
    """Rich output (HTML) in a notebook, the plain-text form as a script."""
    display(obj) if IN_NOTEBOOK else print(obj)


# %% [markdown]
# Each class declares its pattern (`cls.pattern`), but the code decides: a capture hook that
# never calls the replay body is Pattern C (two bodies); one that calls it is Pattern A, or
# Pattern B when it first calls `_prepare_cuda_graph_metadata`. A capture hook that only adds
# checks and hands over to `super()`'s (Triton's `fused` shape) follows its parent's. Derived
# this way, the labels agree with the declared ones, and the table above holds (the `in-graph`
# shapes of notebooks 04 and 05 are none of the three).

# %%
HOOK = "init_forward_metadata_capture_cuda_graph"
classes = {(e.name, e.variant): e.load() for e in REGISTRY if e.name != "torch_native_mla"}
patterns = {key: cls.pattern for key, cls in classes.items()}  # the declared labels


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
# Two details here are refimpl's, not upstream's
# ([the list](../docs/sglang_facts.md#where-refimpl-deliberately-differs-from-upstream)): A's
# draft extend v2 freezes the stride N as `max_extend_len`; B's verify / draft-extend replay
# hands `plan` host indptrs from `seq_lens_cpu`, where upstream builds device indptrs.

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
# Legacy Wave's capture hook was a copy of legacy Triton's (column C above), written as upstream
# looked before the refactor: each mode fills `kv_indptr` / `kv_indices` inline and freezes the
# metadata itself, and neither computes the split counts, which both replay hooks do. The
# unified capture hook is shared: Wave inherits Triton's, column A. Whatever replay fills,
# capture fills, split counts included. Wave's own replay hook only intercepts multi-step draft
# decode, then hands over to Triton's:

# %%
wave_legacy_cap = WaveAttnBackendLegacy.init_forward_metadata_capture_cuda_graph
assert calls(wave_legacy_cap, "build_kv_indices") == 2  # decode and verify, inline
assert calls(wave_legacy_cap, "_splits") == 0 and calls(wave_legacy_cap, "get_num_kv_splits") == 0
assert calls(WaveAttnBackendLegacy.init_forward_metadata_replay_cuda_graph, "self._splits") == 1
assert getattr(WaveAttnBackend, HOOK) is getattr(TritonAttnBackend, HOOK)  # inherited
wave_rep = WaveAttnBackend.init_forward_metadata_replay_cuda_graph
print(textwrap.dedent(inspect.getsource(wave_rep)))
assert calls(wave_rep, "super().init_forward_metadata_replay_cuda_graph") == 1

# %% [markdown]
# Source reading says *where* the copies differ; the checker says *whether it matters*. Notebook
# 02, section 5, ran it on both legacy shapes: legacy Wave's split counts differ after capture,
# but graph = eager, because every replay recomputes them before `graph.replay()` (benign);
# legacy Triton's draft-extend `qo_indptr` differs, and the graph's output is wrong. On the
# unified shapes the checker finds nothing:

# %%
for name, case in (("wave", "decode"), ("triton", "draft_extend")):
    r = check(name, "unified", case)
    show_record(r)
    assert r.passed and not r.findings

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
# capture-only tail installs the fast decode plan (section 5).

# %% [markdown]
# ### Live, with the stand-ins
#
# Without a GPU, `FlashInferAttnBackend` builds the stand-in wrappers of
# `refimpl.flashinfer_wrappers`: flashinfer 0.7.2's constructor / `plan` / `run` arguments, the
# same binding, the same partition-in-the-workspace behaviour (`standin.py`). One difference is
# refimpl's: the stand-in prefill wrapper keeps one byte per custom-mask entry where the real one
# packs bits ([the list](../docs/sglang_facts.md#where-refimpl-deliberately-differs-from-upstream)).
# `prefer_real=False` asks for them on every machine, so this section reads the same on a GPU
# (`tests/test_gpu_flashinfer.py` compares them with the real wrappers there). We capture decode
# graphs for batch sizes 1, 2 and 4: one wrapper per batch size, each with its own workspace
# (where its partition lives), bound to the backend's buffers (notebook 02 drew them).

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
wrappers = {bs: ws[0] for bs, ws in sorted(fi.decode_cuda_graph_metadata.items())}
assert sorted(wrappers) == [1, 2, 4] and all(w._fixed_batch_size == bs for bs, w in wrappers.items())
assert all(is_standin(w) and is_fast_plan_installed(w) for w in wrappers.values())
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
# The duplication, shown: the legacy hooks (left) against the unified ones (right), diffed line
# by line (red: only legacy, green: only unified, **bold**: a branch on the forward mode). Top:
# legacy's capture hook against the unified capture hook and its prepare step. Bottom: replay.
#
# Legacy dispatches on decode / target verify / draft extend in its capture hook and again in
# its replay hook, and each capture branch plans its wrapper (`_update_decode` /
# `_update_prefill`), as the replay branches do. The unified capture hook never plans itself:
# its prepare step only creates, binds and registers the wrappers, and the replay body, where
# target verify and draft extend share one branch, is the one place that plans. (Upstream each
# legacy branch also spelled out the plan arguments: about 240 lines.)

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
# the mode dispatch: three branches in each legacy hook; unified prepare and replay merge two
every_mode = ["is_decode_or_idle", "is_target_verify", "is_any_draft_extend"]
assert list(mode_branches(getattr(FL, CAP))) == list(mode_branches(getattr(FL, REP))) == every_mode
verify, extend = (mode_branches(getattr(FL, REP))[p] for p in every_mode[1:])
assert verify == extend  # legacy replay: two branches, one body
for fn in (FU._prepare_cuda_graph_metadata, getattr(FU, REP)):
    assert list(mode_branches(fn)) == ["is_decode_or_idle"]
merged = "forward_mode.is_target_verify() or forward_mode.is_any_draft_extend()"
assert any(merged in line for line in fi_diff.only_right(1))  # one merged branch in replay

# %% [markdown]
# ## 5. What the fast re-plan skips
#
# Pattern B re-plans on every replay, so `plan()` is paid on every decode step. A full `plan()`
# copies the indptr to the host, copies the batch into the bound buffers, selects the kernel
# module, then computes the partition on the host and writes it into the workspace. The fast
# decode plans of `refimpl/flashinfer_wrappers/fast_plan.py` (SGLang's `fast_decode_plan` /
# `fast_mla_decode_plan`, our way) keep only that last step, and never wait on the stream:
#
# | the full `plan()`... | why the fast plan may skip it on the graph path |
# |---|---|
# | copies the indptr **device → host** (MLA: also `kv_len_arr`, `qo_indptr`) | the caller passes the host indptr it built from `seq_lens_cpu`; if it disagrees with the device batch, the kernel silently reads the wrong keys. For MLA this copy made graph replay hang ([#3987](https://github.com/sgl-project/sglang/pull/3987)) |
# | copies the batch **into the bound buffers** | the caller hands over the bound buffers, already written in place: refimpl checks that by address and refuses anything else |
# | selects (first time: JIT-compiles) the **kernel module** | it comes from the full plan made at capture; the fast plan refuses a wrapper never planned, or another dtype, window or soft-cap |
# | **synchronises the stream** | the partition goes from pinned host memory to the workspace in stream order, before the replay that reads it |
#
# The guards, live on the bs-4 wrapper of section 4: three refusals, then an accepted call whose
# partition comes from the host indptr it was given.

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
    fi.workspace, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=fi.kv_indptr[:5],
    paged_kv_indices_buffer=fi.cuda_graph_kv_indices, paged_kv_last_page_len_buffer=fi.kv_last_page_len[:4])
args = (host_indptr, ones_cpu, H, Hkv, D, 1)
msgs = {
    "never planned": refusal(lambda: fast_decode_plan(never_planned, *args, q_data_type=cfg.dtype)),
    "not the bound buffer": refusal(
        lambda: fast_decode_plan(w4, *args, q_data_type=cfg.dtype, indptr=fi.kv_indptr[:5].clone())),
    "other dtype": refusal(lambda: fast_decode_plan(w4, *args, q_data_type=torch.float16)),
}
for what, msg in msgs.items():  # addresses change run to run: the message without them
    print(f"{what}:\n    {textwrap.shorten(re.sub(r' [(]data_ptr [^)]*[)]', '', msg), 160)}")
assert "_cached_module" in msgs["never planned"]
assert "not the wrapper's bound buffer" in msgs["not the bound buffer"]
assert "differs from the full plan's" in msgs["other dtype"]

fast_decode_plan(w4, *args, q_data_type=cfg.dtype)  # accepted
assert read_partition(w4)[1].tolist() == [30, 5, 17, 1]  # the partition follows the host indptr

# %% [markdown]
# ### What it saves on an H200
#
# `benchmarks/plan_cost.py` timed both plans on an H200 with the real flashinfer, twice: host
# time per call (median of 300), context 4096, a Llama-3-8B-like decode shape (32 / 8 heads,
# dim 128) and a DeepSeek-like MLA shape (16 heads, 512 + 64). The cells below read the
# committed results (`benchmarks/results/plan_cost/plan_cost.json`); nothing is measured here.
# The grey band is the published `plan()` cost of 75–110 µs
# ([flashinfer #5043](https://github.com/flashinfer-ai/flashinfer/pull/5043), on another host CPU).

# %%
bench = json.loads(PLAN_COST.read_text())
versions = bench["versions"]
print("measured with:", ", ".join(f"{k} {v}" for k, v in versions.items()))
print(f"context {bench['ctx']}, {bench['reps']} reps per point, decode heads {bench['heads']}, MLA {bench['mla']}\n")


def series(run, kind):
    rows = [r for r in run if r["kind"] == kind]
    return ([r["bs"] for r in rows], [r["full_plan_us"] for r in rows], [r["fast_plan_us"] for r in rows])


for i, run in enumerate(bench["runs"]):  # the ranges the text below quotes
    _, full, fast = series(run, "decode")
    _, mla_full, mla_fast = series(run, "mla_decode")
    ratio = [f / p for f, p in zip(fast, full)]
    mla_ratio = [f / p for f, p in zip(mla_fast, mla_full)]
    print(f"run {i + 1}: decode plan() {min(full):.0f}-{max(full):.0f} us, fast / full "
          f"{min(ratio):.0%}-{max(ratio):.0%}; MLA fast / full {min(mla_ratio):.0%}-{max(mla_ratio):.0%}")
    assert f"{min(full):.0f}-{max(full):.0f}" == ("129-145", "85-138")[i]
    assert 0.23 <= min(ratio) and max(ratio) < 0.295 and 0.32 < min(mla_ratio) and max(mla_ratio) < 0.615

# %% [markdown]
# The two runs disagree on the level (decode `plan()` takes 129–145 µs in run 1 and 85–138 µs
# in run 2: host timings move with the host CPU's state) but agree on the ratio: the fast
# decode plan costs about a quarter of the full one (23–29 %) at every batch size, the MLA fast
# plan 33–61 %, since its host work grows with the batch.

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
# ## Summary
#
# | pattern | capture | what keeps capture = replay | failure mode when it is missing |
# |---|---|---|---|
# | **C** | its own copy of the filling | nothing: two copies, kept in sync by hand | drift. Benign when the kernel re-reads a buffer that replay refills (Wave's split counts); a wrong answer when the graph bakes the layout in (legacy Triton's draft-extend `qo_indptr`) |
# | **A** | replay body + freeze views | one filling body | – |
# | **B** | prepare (create, bind, register) + replay body + fast-plan tail | one update body, which **re-plans** the registered wrapper | a replay that skips the plan runs on a stale partition; a replay that writes an unbound buffer leaves the bound one stale (FlashInfer-MLA, [#37975](https://github.com/sgl-project/sglang/pull/37975): hidden, because its decode kernel reads only the partition) |
#
# The fast decode plan keeps Pattern B's per-replay `plan()` affordable. Every backend's pattern
# and graph modes side by side: the capability matrix in the README (`python -m refimpl matrix`).
#
# **Next: 04, MLA backends and the redundant-copy removal.** Cutlass-MLA and TRTLLM-MLA index
# the latent cache through block tables; what SGLang #29077 saved on every draft-extend replay;
# and FlashInfer-MLA's three shapes, including the "C, merged branches" one.

# %%
gen.release_all()
print(f"notebook ran in {time.perf_counter() - NOTEBOOK_T0:.1f} s")
