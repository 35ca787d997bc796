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
# # Reviewing a new backend
#
# Reading time: about 18 minutes. The CPU run takes about 20 s.
#
# A pull request adds an attention backend. It is small, it reads well, and its author's tests
# pass. This notebook is the reviewer's side: run refimpl's checker on the class, read what it
# reports, draw the buffers it names, fix the bug, run it again. The last section is a checklist.
#
# The backend is `examples/review_backend.py` (the checker loads any class that implements the
# contract of `refimpl/backends/base.py`; README, "Reviewing a new attention backend"). It is a
# paged (page size 1) backend for decode, idle and **target verify**: each request brings N
# draft tokens, one query row each; a row attends the request's prefix and the draft tokens
# that are its ancestors in the draft tree. The keys are `kv_len = seq_len + N` slots, read
# through `kv_indptr` / `kv_indices`, and the tree comes as a mask: one row-major
# `[N, kv_len]` block per request, blocks back to back, block i starting at `mask_indptr[i]`
# ([facts](../docs/sglang_facts.md#target-verify-custom-mask)). The kernel is refimpl's
# `dense_paged_attention`.
#
# The PR's description says: *"Pattern C: the capture hook sets the metadata up, the replay hook
# refreshes the buffers in place. Tested: decode graphs at batch sizes 1 to 4, and a verify step
# of one request, graph against eager."* Both tests pass. The class is `ReviewBackendBuggy`
# (the PR as submitted); `ReviewBackend` is the reviewed version.

# %%
import difflib
import inspect
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

try:
    from IPython.display import Image, Markdown, display
except ImportError:  # run as a plain script: nothing to display
    Image = Markdown = display = lambda *args, **kwargs: None  # noqa: E731

from refimpl import ForwardMode, GraphConfig, default_dtype, viz
from refimpl.backends import load_backend_class
from refimpl.batch import World
from refimpl.batchgen import BatchGenerator
from refimpl.check import CheckSettings, capture_vs_replay, run_checks
from refimpl.config import tiny_model_config
from refimpl.graphs import CPUEmulatorEngine
from refimpl.graphs.runner import GraphRunner, call_capture_hook, call_replay_hook
from refimpl.model import TinyDecoder

# the repository root, from this file's own location (a kernel runs in the notebook's folder)
ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd().parent
sys.path.insert(0, str(ROOT))  # the PR's module lives in examples/, outside the package
from examples.review_backend import ReviewBackend, ReviewBackendBuggy  # noqa: E402

FIGURES = ROOT / "figures"
BUGGY = "examples.review_backend:ReviewBackendBuggy"
FIXED = "examples.review_backend:ReviewBackend"
# the checker's settings, small: graphs for bs 1, 2, 4; batches of 1 (a captured size) and 3
# (padded to 4); context 32. The CLI below runs its defaults (context 48).
FAST = CheckSettings(capture_bs=(1, 2, 4), raw_bs=(1, 3), max_context_len=32)
N = FAST.spec.num_draft_tokens  # 4: an EAGLE chain of 3 steps verifies 4 tokens


def show(fig, name):
    path = viz.save(fig, FIGURES / f"06_{name}.png")
    display(Image(filename=str(path)))


def source(fn):
    return textwrap.dedent(inspect.getsource(fn))


# %% [markdown]
# ## 1. The diff under review
#
# The two graph hooks of the PR. Everything a captured `forward` reads must be a static buffer
# that the replay hook refills in place. Read them before running anything: the bug is in
# these lines.

# %%
capture_hook = ReviewBackendBuggy.init_forward_metadata_capture_cuda_graph
replay_hook = ReviewBackendBuggy.init_forward_metadata_replay_cuda_graph
print(source(capture_hook))
print(source(replay_hook))
# the two classes share everything but the replay hook
assert capture_hook is ReviewBackend.init_forward_metadata_capture_cuda_graph
assert replay_hook is not ReviewBackend.init_forward_metadata_replay_cuda_graph
assert [m for m in vars(ReviewBackendBuggy) if not m.startswith("_")] == [
    "variant", "init_forward_metadata_replay_cuda_graph"
]

# %% [markdown]
# ## 2. Run the checker
#
# First as a reviewer types it, from the repository root, on the mode the PR adds. Every row of
# an out-of-tree backend must pass for the command to exit 0.

# %%
def cli(target, *args):
    cmd = [sys.executable, "-m", "refimpl", "check", *args, "--backend-class", target]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    print("$ python -m refimpl check", *args, "--backend-class", target)
    print(res.stdout + res.stderr + f"exit code {res.returncode}")
    return res


def verdict_columns(res):
    """(bs, [cap=rep, graph=eager, oracle, ref]) of each table row of a CLI run (the glue column after them)."""
    rows = [line.split() for line in res.stdout.splitlines() if line.startswith("review_backend")]
    return [(int(r[4]), r[6:10]) for r in rows]


buggy_cli = cli(BUGGY, "--mode", "target_verify")
assert buggy_cli.returncode == 1
assert "2 row(s) that must pass failed" in buggy_cli.stderr
assert verdict_columns(buggy_cli) == [(1, ["FAIL", "ok", "ok", "FAIL"]),
                                      (3, ["FAIL", "FAIL", "ok", "FAIL"])]
assert "    - mask_indptr: " in buggy_cli.stdout and "kv_indptr:" not in buggy_cli.stdout

# %% [markdown]
# Then through the Python API, which returns the records (and here also covers decode, with
# the small settings):

# %%
def check(target, modes):
    return run_checks(modes=modes, engine="cpu-emulator", settings=FAST,
                      entries=[load_backend_class(target)])


def verdict(x):
    return "-" if x is None else ("ok" if x else "FAIL")


def print_records(rows):
    print(f"{'mode':<14}{'bs':>3}  cap=rep  graph=eager  oracle  ref")
    for r in rows:
        v = [verdict(x) for x in (r.capture_equals_replay, r.graph_equals_eager,
                                  r.matches_oracle, r.replay_matches_reference)]
        print(f"{r.mode:<14}{r.bs:>3}  {v[0]:<7}  {v[1]:<11}  {v[2]:<6}  {v[3]}")
        for f in r.findings:
            print("      -", f)


buggy_rows = check(BUGGY, ["decode", "target_verify"])
print_records(buggy_rows)
decode = [r for r in buggy_rows if r.mode == "decode"]
verify = {r.bs: r for r in buggy_rows if r.mode == "target_verify"}
assert [r.bs for r in decode] == [1, 3] and all(r.passed and not r.findings for r in decode)
assert sorted(verify) == [1, 3]
for r in verify.values():
    assert r.capture_equals_replay is False and r.replay_matches_reference is False
    assert r.matches_oracle is True  # the eager path is right
    assert any(f.startswith("mask_indptr: ") for f in r.findings)
    assert any(f.startswith("reference: mask_indptr: ") for f in r.findings)
    assert not any("kv_ind" in f for f in r.findings)  # the kv side agrees
assert verify[1].graph_equals_eager is True  # one request: the output is right
assert verify[3].graph_equals_eager is False  # three requests: it is not

# %% [markdown]
# ### Reading the finding
#
# * **Which verdict.** (a) `capture_equals_replay` fails in both verify rows: fed the same
#   padded batch, the capture path (capture hook) and the replay path (capture hook on the
#   runner's dummy batch, then the replay hook) leave different graph-read state. Decode
#   passes everything, as the author said.
# * **Which buffer.** `mask_indptr`, the start of each request's mask block. The `custom_mask`
#   line follows from it: the checker compares the mask up to the end of the last live
#   request's block, and that end is a `mask_indptr` entry. `kv_indptr` and `kv_indices` are
#   not named: the keys are right.
# * **Which side is wrong.** (d) `replay_matches_reference` compares the replay path with a
#   reference built from first principles, and it names the same entries with the capture
#   path's values as the reference's. So the capture hook is right and the **replay hook** is
#   wrong.
# * **Which index, by how much.** Entry 0 agrees (block 0 always starts at 0); entry i is off by
#   a multiple of 16 = N·N:

# %%
def parse_diffs(finding):
    """``[i] a vs b`` pairs of a checker finding -> {i: (a, b)}."""
    return {int(i): (int(a), int(b)) for i, a, b in re.findall(r"\[(\d+)\] (\d+) vs (\d+)", finding)}


(finding,) = [f for f in verify[3].findings if f.startswith("mask_indptr: ")]
diffs = parse_diffs(finding)
for i, (cap, rep) in diffs.items():
    print(f"mask_indptr[{i}]: capture path {cap:>3}, replay path {rep:>3}, "
          f"replay - capture = {rep - cap:>2} = {i} * N*N")
assert sorted(diffs) == [1, 2, 3, 4]
assert all(rep - cap == i * N * N for i, (cap, rep) in diffs.items())

# %% [markdown]
# Each block of the replay path is N·N entries longer than it should be: `N * (kv_len + N)`
# instead of `N * kv_len`, the N draft tokens counted twice. Only the *starts* of blocks 1 and
# on move, which is why the author's one-request verify test passed: block 0 starts at 0 whatever
# the lengths, so the graph's output was right (the bs-1 row: graph = eager ok). With three
# requests (padded to four) requests 1 and 2 read their masks from the wrong place.

# %% [markdown]
# ## 3. The picture
#
# The same batch the checker's bs-3 row used (same world, seed and batch generator), padded to
# the bs-4 graph, through both paths as `refimpl.check.capture_vs_replay` runs them: P gets the
# capture hook on the padded batch; Q gets the capture hook on the runner's capture batch
# (every row a padded row), then the replay hook on the padded batch.

# %%
mode = ForwardMode.TARGET_VERIFY
engine = CPUEmulatorEngine()  # the checker's engine above: on a GPU it runs on CUDA tensors
cfg = tiny_model_config("mha", default_dtype(engine.device), engine.device.type)
world = World.create(cfg, max_context_len=FAST.max_context_len,
                     pool_size=4 * max(FAST.capture_bs) + 8, page_size=1, device=engine.device,
                     seed=FAST.seed)
world.randomize_kv(FAST.seed)
gcfg = GraphConfig(max_bs=max(FAST.capture_bs), capture_bs=FAST.capture_bs,
                   max_context_len=FAST.max_context_len, speculative=True)


def new_backend(cls=ReviewBackendBuggy):
    return cls(world, FAST.spec)


runner = GraphRunner(TinyDecoder(cfg, world.device), new_backend(), engine, mode,
                     gcfg, FAST.spec)
gen = BatchGenerator(world, FAST.spec, seed=FAST.seed + 1)
gen.release(gen.for_mode(mode, 1))  # the checker's bs-1 batch came first
fb = gen.for_mode(mode, 3)
padded = runner.padded_batch(fb)
bs = padded.batch_size

P = new_backend()
P.init_cuda_graph_state(runner.max_bs, runner.max_num_tokens)
call_capture_hook(P, padded)
Q = new_backend()
Q.init_cuda_graph_state(runner.max_bs, runner.max_num_tokens)
call_capture_hook(Q, runner.capture_batch(bs))
call_replay_hook(Q, padded)
cap, rep, ref = (
    {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in state.items()}  # host copies
    for state in (P.graph_state(bs, mode), Q.graph_state(bs, mode), Q.reference_graph_state(padded))
)

# the states drawn below are the ones the checker compared: same differences, same words
assert capture_vs_replay(new_backend, runner, fb)[0] == verify[3].findings[:2]
assert parse_diffs(finding) == {
    i: (int(cap["mask_indptr"][i]), int(rep["mask_indptr"][i]))
    for i in range(bs + 1) if cap["mask_indptr"][i] != rep["mask_indptr"][i]
}
assert torch.equal(cap["kv_indptr"], rep["kv_indptr"])
assert torch.equal(cap["mask_indptr"], ref["mask_indptr"])
seq = padded.seq_lens_cpu
print("padded batch: seq_lens", seq.tolist(), "(row 3 is the padded row), N =", N)

# %%
rows = {
    "seq_lens (prefix)": seq,
    "kv_lens = seq_lens + N": seq + N,
    "kv_indptr: capture path": cap["kv_indptr"],
    "kv_indptr: replay path": rep["kv_indptr"],
    "mask_indptr: capture path": cap["mask_indptr"],
    "mask_indptr: replay path": rep["mask_indptr"],
    "mask_indptr: reference": ref["mask_indptr"],
    "replay - capture": rep["mask_indptr"] - cap["mask_indptr"],
}
fig = viz.draw_buffers(rows, "target verify, 3 requests padded to the bs-4 graph: what the "
                       "captured forward reads", max_cells=8)
w, h = fig.get_size_inches()
fig.set_size_inches(w + 2.4, h)  # room for the legend on the right
ax = fig.axes[0]
y_of = {name: y for y, name in enumerate(rows)}
differ = (cap["mask_indptr"] != rep["mask_indptr"]).nonzero().flatten().tolist()
off_ref = (rep["mask_indptr"] != ref["mask_indptr"]).nonzero().flatten().tolist()
for i in differ:
    for name in ("mask_indptr: capture path", "mask_indptr: replay path"):
        ax.add_patch(Rectangle((i - 0.5, y_of[name] - 0.5), 1, 1, fill=False,
                               edgecolor=viz.BAD_COLOR, lw=2.2, zorder=4))
for i in off_ref:
    ax.add_patch(Rectangle((i - 0.36, y_of["mask_indptr: replay path"] - 0.36), 0.72, 0.72,
                           fill=False, edgecolor="black", lw=1.0, ls="--", zorder=5))
for y in (0, 1):  # the padded row of the per-request rows
    ax.add_patch(Rectangle((bs - 1 - 0.5, y - 0.5), 1, 1, fill=False, edgecolor=viz.PAD_COLOR,
                           lw=2.2, zorder=4))
ax.legend(
    handles=[
        Line2D([], [], color=viz.BAD_COLOR, lw=2.2,
               label="(a) capture path ≠ replay path"),
        Line2D([], [], color="black", lw=1.0, ls="--", label="(d) replay path ≠ reference"),
        Line2D([], [], color=viz.PAD_COLOR, lw=2.2, label="the padded row"),
    ],
    loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False,
)
show(fig, "capture_vs_replay_state")
assert differ == off_ref == [1, 2, 3, 4]

# %% [markdown]
# Read down the columns: `mask_indptr[i+1] - mask_indptr[i]` must be `N * kv_lens[i]` (block i
# is `[N, kv_len_i]`). The capture path and the reference satisfy it; the replay path's steps
# are `N * (kv_lens[i] + N)`. The kv rows agree cell for cell.
#
# What the kernel does with the wrong starts: it reads request i's block from
# `mask_indptr[i] + j * kv_len_i + t` (row j, key t). Request 1's block as each path's graph
# would read it, against its draft tree (a chain here: draft j sees drafts 0..j). A red frame is
# a draft that would see a *later* draft; a grey prefix cell is a prefix key it would not see:

# %%
def block_as_read(backend, i):
    """Request i's [N, kv_len] mask block, read the way dense_paged_attention reads it."""
    md = backend.forward_metadata
    kv_len = int(md.kv_indptr[i + 1] - md.kv_indptr[i])
    flat = int(md.mask_indptr[i]) + torch.arange(N)[:, None] * kv_len + torch.arange(kv_len)
    mask = md.custom_mask.cpu()
    return mask[flat.clamp(0, mask.numel() - 1)].bool(), kv_len


def expected_block(i, kv_len):
    s, parents = kv_len - N, padded.spec_info.parents[i]
    tree = torch.eye(N, dtype=torch.bool)
    for q in range(1, N):
        tree[q] |= tree[parents[q]]
    return torch.cat([torch.ones(N, s, dtype=torch.bool), tree], 1)


wrong = {}
for name, backend in (("capture_path", P), ("replay_path", Q)):
    block, kv_len = block_as_read(backend, 1)
    wrong[name] = int((block != expected_block(1, kv_len)).sum())
    fig = viz.draw_tree_mask(block.flatten(), torch.tensor([0, N * kv_len]), N, 0,
                             parents=padded.spec_info.parents[1])
    start = int(backend.forward_metadata.mask_indptr[1])
    fig.axes[0].set_title(f"request 1 ({name.replace('_', ' ')}): custom_mask read from "
                          f"mask_indptr[1] = {start}\n{wrong[name]} cells disagree with the "
                          "tree", fontsize=8)
    show(fig, f"mask_read_{name}")
print("request 1's mask cells that disagree with its tree:", wrong)
assert wrong["capture_path"] == 0 and wrong["replay_path"] > 0

# %% [markdown]
# ## 4. The fix
#
# The layout helper `layout.mask_indptr(seq_lens, N)` takes the *prefix* lengths and adds the
# N drafts itself (`[0, cumsum(N * (seq_lens + N))]`). The capture hook passes `seq_lens`; the
# replay hook passed `kv_lens`, which already include the drafts. The comment above the call
# (`request i's mask block is [N, kv_lens[i]]`) is true, which is what makes the line read
# right. The reviewed replay hook against the submitted one:

# %%
diff = list(difflib.unified_diff(source(replay_hook).splitlines(),
                                 source(ReviewBackend.init_forward_metadata_replay_cuda_graph).splitlines(),
                                 "ReviewBackendBuggy (submitted)", "ReviewBackend (reviewed)",
                                 n=2, lineterm=""))
print("\n".join(diff))
display(Markdown("```diff\n" + "\n".join(diff) + "\n```"))
removed = [d for d in diff[2:] if d.startswith("-")]
added = [d for d in diff[2:] if d.startswith("+")]
assert len(removed) == len(added) == 2  # the call and its comment
assert "layout.mask_indptr(kv_lens, n" in removed[-1]
assert "layout.mask_indptr(seq_lens[:bs], n" in added[-1]

# %% [markdown]
# The checker again, the CLI on target verify and the API on every mode the class captures:

# %%
fixed_cli = cli(FIXED, "--mode", "target_verify")
assert fixed_cli.returncode == 0 and "FAIL" not in fixed_cli.stdout
assert verdict_columns(fixed_cli) == [(1, ["ok"] * 4), (3, ["ok"] * 4)]

fixed_rows = check(FIXED, ["decode", "idle", "target_verify"])
print_records(fixed_rows)
assert [(r.mode, r.bs) for r in fixed_rows] == [("decode", 1), ("decode", 3), ("idle", 0),
                                                ("target_verify", 1), ("target_verify", 3)]
assert all(r.passed and not r.findings for r in fixed_rows)
assert all(r.capture_equals_replay and r.graph_equals_eager and r.matches_oracle
           and r.replay_matches_reference for r in fixed_rows)

# %% [markdown]
# Approve with one request: the two hooks duplicate the metadata build, so the next edit to one
# of them can drift the same way. Pattern A (the capture hook *runs* the replay hook, then
# freezes views, as `examples/paged_decode_backend.py` does) makes verdict (a) hold by
# construction; then (d), the reference, is what guards the shared body.
#
# ## 5. A reviewer's checklist
#
# **What each verdict catches** (`refimpl/check.py`):
#
# | verdict | compares | catches | blind to |
# |---|---|---|---|
# | (a) `capture_equals_replay` | capture path vs replay path, fed the same padded batch; every buffer and scalar of `graph_state`, by index | two bodies that drifted (this PR), a fill that only capture does, a Python value frozen at capture | a bug in a body both paths share (Pattern A), since it compares that body with itself |
# | (b) `graph_equals_eager` | the replayed graph's output vs eager, plus a KV guard on other requests' slots | anything that changes a live request's output; writes into another request's KV | wrong state that happens not to change the output: the bs-1 row above, padded rows, stale tails |
# | (c) `matches_oracle` | eager vs a dense float64 oracle | wrong kernel math, a wrong eager metadata path | anything about graphs |
# | (d) `replay_matches_reference` | the replay path's state vs the backend's `reference_graph_state` | a shared body's bug, named by buffer; which side of an (a) finding is wrong | nothing when the backend gives no reference (`ref` prints `-`) |
#
# **What the checker cannot see:**
#
# * State that `graph_state` does not return. A buffer the kernel reads but `graph_state` leaves
#   out is never compared, so review `graph_state` against `forward` line by line.
# * Cases it does not run: only the modes in `graph_modes` (others print `skipped`), batch sizes
#   `--bs` (default 1 and 3, so one batch pads), the spec's shape (default a chain; `--topk 2`
#   gives real trees), the default context length.
# * Entries it excludes on purpose: a buffer's tail past the live part, the padded rows' mask
#   blocks (no batch defines them).
# * What only a GPU shows: stream and async-copy ordering, a kernel's own preconditions beyond
#   refimpl's dense kernel (which tolerates an empty or odd range in a padded row), the real
#   libraries' planning; and cost: what a replay hook spends is notebook 05's subject.
#
# **When to add a `reference_graph_state`:**
#
# * always for Pattern A (capture runs the replay body) or an in-graph rebuild: (a) compares a
#   body with itself there, and only (d) looks at the state;
# * when a wrong state need not change the output (one request, padded rows, a split count), as
#   here at bs 1;
# * write it from the batch alone, from host lengths, the `*_ref` builders of `refimpl.kernels`
#   and the rules of `refimpl.layout`, never through the hook's own helpers. This class's
#   reference writes `mask_indptr` out as `cumsum(N * kv_lens)` rather than calling
#   `layout.mask_indptr`, the helper the bug misused.
