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
# # Reviewing a new backend
#
# Reading time: about 15 minutes. Run All takes about 20 s on a 2-core CPU.
#
# A pull request adds an [attention backend](../docs/glossary.md#attention-backend), `examples/review_backend.py`:
# decode, idle and [target verify](../docs/glossary.md#target-verify), where each request brings N = 4
# [draft tree](../docs/glossary.md#draft-tree) nodes and its
# [custom mask](../docs/glossary.md#custom-mask) is one `[N, seq_len + N]` block starting at `mask_indptr[i]`
# ([facts](../docs/sglang_facts.md#target-verify-custom-mask)). The PR says: *"[Pattern
# C](../docs/glossary.md#pattern-c): the replay hook refreshes the buffers the capture hook set up. Tested: decode
# graphs at batch sizes 1 to 4, and a verify step of one request, graph against eager."* Both tests pass. Review it
# with the six [verdicts](../docs/glossary.md#verdicts) of notebook 01.

# %%
import torch

from refimpl.course import review, show

ReviewBackend = review.entry(review.FIXED).load()
N = review.SETTINGS.spec.num_draft_tokens  # 4: an EAGLE chain of 3 steps verifies 4 tokens

# %% [markdown]
# ## 1. Run the checker
#
# On the mode the PR adds and one request, the case the author tested. Every row of a `--backend-class` must pass.

# %%
buggy = review.cli("--backend-class", review.BUGGY, "--mode", "target_verify", "--bs", "1")
assert buggy.returncode == 1 and "    - mask_indptr: 1 of 2 elements differ ([1] " in buggy.stdout
row = next(r.split() for r in buggy.stdout.splitlines() if r.startswith("review_"))
assert row[6:12] == ["FAIL", "ok", "ok", "FAIL", "no", "FAIL"]  # (a) (b) (c) (d) (e) (f)
assert "history replay 4 (C, the bs-4 graph, bs 4): graph vs eager" in buggy.stdout
assert "kv_indptr:" not in buggy.stdout and "kv_indices:" not in buggy.stdout

# %% [markdown]
# ### Reading the finding
#
# * **Which verdict.** (a) `cap=rep` fails: fed the same batch,
#   [path P and path Q](../docs/glossary.md#path-p-and-path-q) leave different state. (b) passes: one request's
#   output is right, as the author's test said; (c) passes: eager is right; (e) is information. (f) fails: the history
#   replays every captured graph, and with more requests the output is wrong.
# * **Which buffer.** `mask_indptr`, where each mask block starts. The `custom_mask` line follows: the mask is
#   compared up to the live blocks' end, a `mask_indptr` entry. `kv_indptr` is not named: the keys are right.
# * **Which side is wrong.** (d) `ref` compares path Q with a [reference state](../docs/glossary.md#reference-state)
#   built from the batch alone and finds the capture path's values: the [replay hook](../docs/glossary.md#replay-hook)
#   is wrong.
# * **By how much.** Entry 1 is off by 16 = N·N. On a batch of 3 requests
#   ([padded](../docs/glossary.md#padding) to the bs-4 graph), entry i is off by i·N·N; that batch through both paths
#   (`refimpl.rig.state_after`, as `refimpl.check.capture_vs_replay` runs them):

# %%
s = review.paths(review.BUGGY)  # a bs-3 batch, padded to 4, in a 48-position world (a mask you can read)
cap, rep = s.capture["mask_indptr"], s.replay["mask_indptr"]
assert (rep - cap).tolist() == [i * N * N for i in range(len(cap))]
assert torch.equal(cap, s.reference["mask_indptr"]) and torch.equal(s.capture["kv_indptr"], s.replay["kv_indptr"])
show(review.draw_paths(s, N), "07_capture_vs_replay_state")

# %% [markdown]
# Block i is `[N, kv_len_i]`, so `mask_indptr` must step by `N * kv_lens[i]`; the replay path steps by
# `N * (kv_lens[i] + N)`: the drafts counted twice. Block 0 starts at 0 either way, which is why one request's output
# is right. Request 1's block as the replay path's graph reads it (framed red: cells its tree disagrees with):

# %%
show(review.draw_mask_as_read(s.q, s.padded, 1, N, "replay path"), "07_mask_read_replay_path")
read, tree = review.mask_as_read(s.q, s.padded, 1, N)
assert (read != tree).any() and torch.equal(*review.mask_as_read(s.p, s.padded, 1, N))  # path P reads the tree

# %% [markdown]
# ## 2. The fix
#
# `layout.mask_indptr(seq_lens, N)` takes *prefix* lengths and adds the N drafts itself. The capture hook passes
# `seq_lens`; the replay hook passed `kv_lens`, which already hold them, under a true comment. The review's diff:
#
# ```diff
# -        # request i's mask block is [N, kv_lens[i]]
# -        layout.mask_indptr(kv_lens, n, out=self.cuda_graph_mask_indptr)
# +        # request i's mask block is [N, kv_lens[i]]; mask_indptr adds the N drafts itself
# +        layout.mask_indptr(seq_lens[:bs], n, out=self.cuda_graph_mask_indptr)
# ```
#
# Checked again:

# %%
fixed = review.cli("--backend-class", review.FIXED, "--mode", "decode", "--mode", "target_verify")
assert fixed.returncode == 0 and "2 ok" in fixed.stdout and "(e) not glue-safe (information" in fixed.stdout
assert [r.split()[10] for r in fixed.stdout.splitlines() if r.startswith("review_")] == ["yes", "no"]

# %% [markdown]
# Approve, with one request: the duplicated hook bodies can drift again. [Pattern A](../docs/glossary.md#pattern-a)
# (notebook 04; the template `examples/paged_decode_backend.py`) makes (a) hold by construction; (d) then guards the
# shared body.
#
# ## 3. The two other columns: glue and history
#
# **(e) glue** asks whether the replay hook may be replayed from a [glue graph](../docs/glossary.md#glue-graph)
# (notebook 06). Decode: `yes`. Verify: `no`, because the hook copies `spec_info.custom_mask`, a tensor each batch
# brings, not one of the runner's [static inputs](../docs/glossary.md#static-inputs): a glue graph keeps copying the
# capture batch's mask. The hook is correct unglued, so the row stays `ok`.
#
# **(f) history** asks whether a replay depends on the ones before: after A (the row's own replay) the same graphs
# replay A's lengths for other requests; B, A's size with other lengths; the other graphs; a long run through the
# smallest (notebook 01), each held to (b) and (c).
#
# ## 4. A reviewer's checklist
#
# | verdict | catches | blind to |
# |---|---|---|
# | (a) `cap=rep` | drifted bodies (this PR), a frozen value, a buffer [stale from capture](../docs/glossary.md#stale-from-capture) | a shared body's bug |
# | (b) `graph=eager` | a wrong output; a KV write outside the batch ([KV guard](../docs/glossary.md#kv-guard)) | a right output from wrong state |
# | (c) `oracle` | wrong kernel math or eager metadata | anything about graphs |
# | (d) `ref` | a shared body's bug; which side of (a) is wrong | everything, without a reference (`-`) |
# | (e) `glue` | information: a hook that copies a spec input, reads the host or plans | nothing: not pass/fail |
# | (f) `history` | a replay that depends on the last one | orders it does not replay |
#
# **The checker cannot see** state `graph_state` leaves out (review it against `forward`); sizes, specs and modes it
# does not run (`--bs`, `--topk 2`); on a CPU, what only a GPU shows (stream ordering, real kernels); cost
# (notebook 06).
#
# **Add a `reference_graph_state`** for Pattern A, where (a) compares a body with itself. Build it from the batch
# alone: this class's writes `mask_indptr` as `cumsum(N * kv_lens)`, not through the helper the bug misused.

# %% [markdown]
# ### Exercise (about 6 minutes): plant a "nothing changed" shortcut
#
# The cell plants a bug in the reviewed backend: its replay hook returns early when the graph size is the one it
# refreshed last. Predict which verdict catches it, then run it.


# %%
class Planted(ReviewBackend):
    def init_forward_metadata_replay_cuda_graph(self, bs, *args):
        if bs == getattr(self, "last_bs", None):  # <- change this: the planted shortcut
            return  # "nothing changed": the buffers keep the last batch's metadata
        self.last_bs = bs
        super().init_forward_metadata_replay_cuda_graph(bs, *args)


planted = review.check(Planted, ["decode"], glue=False)

# %% jupyter={"source_hidden": true}
# Solution (expand to read)
# (f), and only (f). Paths P and Q are fresh backends that run each hook once, and the row replays its graph once
# (3 padded to 4): the shortcut never fires there. That replay is the history's A; the next two steps follow it on
# the same bs-4 graph: each keeps the previous batch's metadata and (b) fails. The long run's first replay of the
# bs-1 graph refreshes (a new size); from then on the buffers keep its batch's metadata: right for that batch (replays
# 3, 5, ...), wrong for the other of the two it alternates with (replays 2, 4, ...).
(row,) = planted
assert row.capture_equals_replay and row.replay_matches_reference and row.matches_oracle and row.graph_equals_eager
assert row.history_ok is False
assert [f.split(" (")[0] for f in row.findings[:3]] == [f"history replay {i}" for i in (2, 3, 5)]
assert row.findings[3] == "history long run: also wrong at replays " + ", ".join(map(str, range(4, 21, 2))) + " of 20"
