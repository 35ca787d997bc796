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
# # The other backends, and two historical bugs
#
# Reading time: about 29 minutes. The CPU run takes about 20 s.
#
# Notebook 01 took SGLang's Triton backend through every graph mode of an EAGLE iteration. This
# notebook draws the same buffers for the other backends, each next to Triton's:
#
# 1. **Wave**: Triton's hooks with another buffer layout;
# 2. **FlashInfer** (Pattern B): kernels that live inside library *wrapper* objects, bound to the
#    graph's buffers, with a work partition written by each `plan()`;
# 3. **FlashInfer-MLA**: the FlashInfer backend for models with **MLA** (DeepSeek's multi-head
#    latent attention, [paper](https://arxiv.org/abs/2405.04434): one compressed KV row per
#    token, shared by all query heads), and a graph-bound buffer that goes stale upstream;
# 4. **Cutlass-MLA and TRTLLM-MLA**: a pointer to notebook 04;
# 5. **two historical bugs** of the old Wave and Triton code, cell by cell.
#
# The set-up is notebook 01's: the tiny one-layer GQA model, the chain spec (S = 3, topk = 1,
# N = 4), the tree spec (S = 3, topk = 2, N = 6), graphs for batch sizes 1 and 4, and raw
# batches of 3, padded to 4. So are the colours: one light colour per live request, orange for
# the padded row, light grey for cells the graph does not read, cross-hatched grey for stale
# values, and a red frame for a cell that differs from what it should hold.

# %%
import re
from pathlib import Path

import torch

try:
    from IPython.display import Image, display
except ImportError:  # run as a plain script (the GPU check does): nothing to display
    Image = display = lambda *args, **kwargs: None  # noqa: E731

from refimpl import ForwardMode, GraphConfig, ModelConfig, viz
from refimpl.backends import GraphModeNotSupported, find
from refimpl.backends.flashinfer import FlashInferAttnBackend, FlashInferMultiStepDraftBackend
from refimpl.backends.flashinfer_mla import FlashInferMLAAttnBackend, FlashInferMLAAttnBackendAsUpstream
from refimpl.backends.triton import TritonAttnBackend, TritonAttnBackendLegacy
from refimpl.backends.wave import WaveAttnBackend, WaveAttnBackendLegacy, WaveMultiStepDraftBackend
from refimpl.batch import World
from refimpl.batchgen import BatchGenerator
from refimpl.check import CheckSettings, capture_vs_replay, check_entry_mode, diff_reference, diff_states
from refimpl.config import SpecConfig
from refimpl.flashinfer_wrappers import read_partition
from refimpl.graphs import CPUEmulatorEngine, make_engine
from refimpl.graphs.runner import GraphRunner, call_capture_hook, call_replay_hook
from refimpl.kernels import draft_decode_kv_indices_ref, get_num_kv_splits_ref
from refimpl.layout import GraphKind
from refimpl.model import TinyDecoder
from refimpl.rig import state_after
from refimpl.spec import DraftTree

# the repository root, from this file's own location (a kernel runs in the notebook's folder)
ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd().parent
FIGURES = ROOT / "figures"


def show(fig, name):
    """Save ``fig`` as ``figures/02_<name>.png`` and display the saved file."""
    path = viz.save(fig, FIGURES / f"02_{name}.png")
    display(Image(filename=str(path)))


CHAIN = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)  # a chain: N = S + 1
TREE = SpecConfig(num_steps=3, topk=2, num_draft_tokens=6)  # a tree: N = 6 > S + 1 = 4
S, N, topk = TREE.num_steps, TREE.num_draft_tokens, TREE.topk

engine = make_engine("auto")  # the CPU emulator here, CUDA graphs on a GPU
device = engine.device
cfg = ModelConfig(num_layers=1)  # 4 query heads, 2 KV heads (GQA), head dim 16, fp32
L = 40  # max_context_len
world = World.create(cfg, max_context_len=L, pool_size=32, device=device)
world.randomize_kv(0)  # every prefix "already prefilled"
model = TinyDecoder(cfg, device)
GRAPHS = GraphConfig(max_bs=4, capture_bs=(1, 4), max_context_len=L, speculative=True)
gen = BatchGenerator(world, TREE, seed=1)  # decode, verify, draft extend, draft decode
gen_chain = BatchGenerator(world, CHAIN, seed=2)  # chains: Wave's draft decode, draft extend v1
bs = 4  # the graph that replays a raw batch of 3


# %% [markdown]
# Two helpers. `hooks_only` runs the metadata work of a runner's captures (bs 4, then bs 1) and
# of one replay, without the forward passes. It keeps what each capture froze, so
# `graph_state(bs, mode)` reads the bs-4 graph's view. (The checker, `python -m refimpl check`,
# replays these backends' graphs in every mode.) `roles` gives the colour roles of a
# per-request buffer of the bs-4 graph replaying 3 live requests.


# %%
def hooks_only(backend, mode, spec, fb, *, multi_step=False):
    """The capture hooks (bs 4, then 1, as a runner captures) and one replay hook for ``fb``,
    no forward pass. Afterwards the backend's metadata is what the bs-4 capture froze."""
    runner = GraphRunner(None, backend, engine, GraphKind.of(mode, multi_step), GRAPHS, spec)
    owners = getattr(backend, "step_backends", [backend])  # multi-step: one per step
    frozen = {}
    for b in sorted(runner.capture_bs, reverse=True):
        call_capture_hook(backend, runner.capture_batch(b))
        frozen[b] = [getattr(o, "forward_metadata", None) for o in owners]
    padded = runner.padded_batch(fb)
    call_replay_hook(backend, padded)
    for o, md in zip(owners, frozen[padded.batch_size]):
        o.forward_metadata = md  # the graph of this bs reads what its capture froze
    return runner, padded


def roles(n, *, indptr=False, live=3, bs=4):
    return viz.batch_roles(n, live, bs, indptr=indptr)


# %% [markdown]
# ## 1. Wave
#
# SGLang's Wave backend (AMD) has the same hooks as Triton, with a different buffer layout
# ([facts](../docs/sglang_facts.md#wave)). refimpl runs Wave's layout and hooks on the same
# Triton kernels. Wave captures decode, idle, target verify and multi-step draft decode (chains
# only), not draft extend. First, a decode batch of 3 replayed on Wave's graphs: the same answer
# as Triton's, and the same kv indices (notebook 01, section 1), stored as **int32**.

# %%
fb_dec = gen.decode(3)
wave_dec = WaveAttnBackend(world, None)
run_wave = GraphRunner(model, wave_dec, engine, ForwardMode.DECODE, GRAPHS)
run_wave.capture()
wave_logits = run_wave.replay(fb_dec).clone()
assert torch.allclose(wave_logits, run_wave.eager(fb_dec), atol=1e-4)
tri_dec = TritonAttnBackend(world, None)
tri_dec.init_forward_metadata(fb_dec)  # Triton, eagerly, on the same batch
assert torch.allclose(wave_logits, model(fb_dec, tri_dec), atol=1e-4)  # = Triton's answer

rpi, seq = run_wave.req_pool_indices[:bs], run_wave.seq_lens[:bs]  # the padded batch
packed = torch.cat([world.req_to_token[r, :n] for r, n in zip(rpi.tolist(), seq.tolist())])
total = int(wave_dec.kv_indptr[bs])
assert wave_dec.kv_indptr[: bs + 1].tolist() == [0] + torch.cumsum(seq, 0).tolist()
assert torch.equal(wave_dec.cuda_graph_kv_indices[:total].long(), packed.long())
assert wave_dec.cuda_graph_kv_indices.dtype == torch.int32
print("wave kv_indices", wave_dec.cuda_graph_kv_indices[:total].tolist())

try:
    wave_dec.check_graph_mode(ForwardMode.DRAFT_EXTEND)
except GraphModeNotSupported as e:
    print("draft extend on Wave:", e)
else:
    raise AssertionError("Wave does not capture draft extend")

# %% [markdown]
# ### Wave's verify and draft-decode buffers
#
# Verify on Wave fills Triton's CSR and mask layout, with an int32 `qo_indptr`: below, a tree
# batch through Wave's hooks, compared with Triton's hooks on the same batch. Multi-step draft
# decode on Wave needs a chain: the wrapper's per-step rows (one per sequence) are copied into
# each step's Wave buffers, and each step computes its own split counts into its `[B]` buffer.

# %%
fb_tv = gen.target_verify(3, seq_lens=[6, 17, 30])  # prefixes; trees random
wave_tv = WaveAttnBackend(world, TREE)
run_wtv, padded_wtv = hooks_only(wave_tv, ForwardMode.TARGET_VERIFY, TREE, fb_tv)
state_wtv = wave_tv.graph_state(bs, ForwardMode.TARGET_VERIFY)
assert not diff_reference(state_wtv, wave_tv.reference_graph_state(padded_wtv))
_, state_ttv = state_after(lambda: TritonAttnBackend(world, TREE), run_wtv, padded_wtv, replay=True)
for key in ("qo_indptr", "kv_indptr", "mask_indptr"):  # Triton's layout, Wave's dtype
    assert state_wtv[key].tolist() == state_ttv[key].tolist(), key
assert state_wtv["qo_indptr"].dtype == torch.int32

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
B, T, POOL, S_MAX = 4, 4 * N, world.req_to_token_pool.size, wave_dec.max_kv_splits
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
verify_mask = int(state_wtv["mask_indptr"][fb_tv.batch_size])  # the verify batch: sum N*(seq+N)
needed = {
    "cuda_graph_num_kv_splits": (B * TREE.topk, "multi-step draft decode, bs 4 x topk 2: rows"),
    "cuda_graph_custom_mask": (verify_mask, "the verify batch above: sum N*(seq+N)"),
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
# ## 2. FlashInfer (Pattern B)
#
# SGLang's FlashInfer backend ([facts](../docs/sglang_facts.md#flashinfer)) keeps its kernels
# inside FlashInfer *wrapper* objects. A wrapper built for graphs is **bound** to buffers at
# construction: `_paged_kv_indptr_buf`, `_paged_kv_indices_buf`, `_paged_kv_last_page_len_buf`,
# and for prefill wrappers (verify, draft extend) `_qo_indptr_buf` and, only when the spec has a
# mask, `_custom_mask_buf` / `_mask_indptr_buf`. Capture creates one wrapper per batch size and
# registers it; `plan()` copies the batch into the bound buffers and writes a **work partition**
# into the wrapper's workspace, and `run()` reads only those. Notebook 03 shows why every replay
# must re-plan. Here: what the bound buffers hold for each mode it captures, on the stand-in
# wrappers that run without a GPU (`refimpl/flashinfer_wrappers/standin.py`).

# %%
fb_v2 = gen.draft_extend(3, 2)
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
# bound to the `[:bs+1]` prefix of its indptr buffers. The bound mask buffer holds the verify
# batch's tree blocks (the stand-in stores one byte per entry; real FlashInfer packs them into
# bits).

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

# the bound mask holds the verify batch's blocks: request 0's [N, prefix + N] block, its tree part
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
fb_dd = gen.draft_decode(3)
fi_ms = FlashInferMultiStepDraftBackend(world, TREE)
_, padded_fdd = hooks_only(fi_ms, ForwardMode.DECODE, TREE, fb_dd, multi_step=True)
rows = bs * topk
ref_indptr, _ = draft_decode_kv_indices_ref(padded_fdd.req_pool_indices, world.req_to_token,
                                            padded_fdd.seq_lens, topk=topk, num_steps=S)
for i in range(S):  # the rows Triton's draft-decode buffers hold (notebook 01), in int32
    assert fi_ms.kv_indptr[i, : rows + 1].tolist() == ref_indptr[i].tolist()

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
# ## 3. FlashInfer-MLA: graph-bound vs eager `kv_indptr`
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
# buffers. Below, both after the same replay. The checker's verdict (a) compares two paths on
# fresh backends: P runs the *capture* hook on the padded batch; Q runs the capture hook on the
# runner's capture batch and then the *replay* hook on the padded batch (`state_after`).

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
p_up, q_up = (state_after(lambda: FlashInferMLAAttnBackendAsUpstream(world_mla, CHAIN), runner_mla,
                          padded_mla, replay=r)[1] for r in (False, True))
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
# ## 4. Cutlass-MLA and TRTLLM-MLA
#
# The two block-table MLA backends index the latent cache through pages of 128 (Cutlass) or
# 32 / 64 (TRTLLM) tokens instead of a token-by-token CSR. Their block tables, page by page, are
# drawn in [notebook 04](04_mla_backends_and_the_redundant_copy_removal.ipynb), section 1
# ("Block tables"); TRTLLM-MLA's verify and draft-extend metadata follow in its section 3.
#
# ## 5. Two historical bugs, cell by cell
#
# Before the refactor ([#26134](https://github.com/sgl-project/sglang/pull/26134), relanded
# as [#26665](https://github.com/sgl-project/sglang/pull/26665)) each backend had two hooks
# written separately, and they drifted. The checker's verdict (a) feeds the same batch to both
# paths, P and Q of section 3, and their graph-read states must agree cell by cell. First, the
# checker on both legacy shapes:
#
# * **Wave, decode**: capture filled the kv buffers but never called `get_num_kv_splits`, so
#   after capture the split buffer still held `max_kv_splits` from its `torch.full`.
# * **Triton, draft extend v1**: capture laid the rows out with the uniform stride S + 1, but
#   replay wrote `qo_indptr = cumsum(accept_length + 1)`, the ragged layout of the old eager path.

# %%
settings = CheckSettings(capture_bs=(4,), raw_bs=(3,), glue_replays=0, history=False)  # verdict (e): not read here
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
# Here are the two paths on this notebook's own batches (section 1's decode batch and a draft
# extend v1 batch of three chains), every differing cell framed.

# %%
fb_v1 = gen_chain.draft_extend(3, 1, accept_length=[2, 0, 3])
run_v1 = GraphRunner(None, TritonAttnBackendLegacy(world, CHAIN), engine, ForwardMode.DRAFT_EXTEND, GRAPHS, CHAIN)
states = {}
for cls, runner, fb in ((WaveAttnBackendLegacy, run_wave, fb_dec), (TritonAttnBackendLegacy, run_v1, fb_v1)):
    new = lambda cls=cls, r=runner: cls(r.world, r.spec_cfg)  # noqa: E731
    padded = runner.padded_batch(fb)
    cap, rep = (state_after(new, runner, padded, replay=r)[1] for r in (False, True))
    checker, _ = capture_vs_replay(new, runner, fb)
    rows = (fb.batch_size, padded.batch_size)  # live and padded batch sizes: findings name padded rows
    assert checker == diff_states(cap, rep, rows=rows)  # the same verdict as refimpl.check's
    print(f"{cls.__name__}:", checker)
    states[cls] = cap, rep
(wave_cap, wave_rep), (tri_cap, tri_rep) = states.values()

splits = get_num_kv_splits_ref(run_wave.seq_lens[:bs].tolist(), num_heads=cfg.num_heads,
                               num_kv_heads=cfg.num_kv_heads, max_kv_splits=S_MAX,
                               core_count=wave_dec.core_count)
assert (wave_cap["num_kv_splits"] == S_MAX).all() and wave_rep["num_kv_splits"].tolist() == splits
tpr1 = CHAIN.num_steps + 1
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
# | backend        | graph modes drawn here | what differs from Triton |
# |----------------|------------------------|--------------------------|
# | Wave           | decode, verify, multi-step draft decode (chains) | buffers sized by B, int32 indices; no draft extend |
# | FlashInfer     | decode, verify, draft extend v1 / v2, multi-step draft decode | wrappers bound per bs; verify indexes prefix + N; a partition per plan |
# | FlashInfer-MLA | decode, verify (chains), draft extend v1 / v2 | as-upstream's bound `kv_indptr` / `kv_len_arr` go stale ([#37975](https://github.com/sgl-project/sglang/pull/37975)) |
# | Cutlass-MLA, TRTLLM-MLA | block tables: notebook 04 | pages instead of a token CSR |
#
# The layout at capture must equal the layout at replay. The legacy findings show both kinds of
# drift: state that the kernel re-reads at run time (benign) and a layout that the graph has
# already baked in (a wrong answer).
#
# **Next: 03, two patterns.** How a backend keeps its capture and replay paths in agreement by
# construction (Pattern A: capture = the replay body + freeze views; Pattern B: prepare
# graph-bound objects, then replay), and what drifts when the two paths are written separately
# (Pattern C).

# %%
for g in (gen, gen_chain, gen_mla):
    g.release_all()
assert not gen.live_requests and not gen_chain.live_requests
