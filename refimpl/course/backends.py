"""Notebook 03's helpers (the other backends): notebook 02's set-up, a backend's hooks run as a runner runs them, the
Wave-vs-Triton size table and the notebook's figures. ``tests/test_course_backends.py`` checks what the figures draw."""

from dataclasses import dataclass
from functools import partial

from matplotlib.figure import Figure

from .. import viz
from ..backends.base import GraphModeNotSupported
from ..backends.triton import TritonAttnBackend
from ..backends.wave import WaveAttnBackend
from ..batch import ForwardBatch, World
from ..batchgen import BatchGenerator
from ..config import CHAIN, TREE, GraphConfig, ModelConfig, SpecConfig
from ..flashinfer_wrappers import read_partition
from ..graphs import GraphEngine, make_engine
from ..graphs.runner import GraphRunner, call_capture_hook, call_replay_hook
from ..model import TinyDecoder
from ..modes import ForwardMode
from ..rig.core import state_after
from ..rig.verdicts import capture_vs_replay
from .triton_modes import L, Lab

BS, LIVE = 4, 3  # the bs-4 graph replays a raw batch of 3


@dataclass
class Setting:
    """Notebook 02's set-up: a one-layer GQA world and model, an MLA world, graphs for bs 1 and 4, batch generators."""

    engine: GraphEngine
    world: World
    model: TinyDecoder
    graphs: GraphConfig
    gen: BatchGenerator  # tree spec: decode, verify
    gen_chain: BatchGenerator  # chains: draft extend v1
    world_mla: World
    gen_mla: BatchGenerator


def setting(engine: str = "auto") -> Setting:
    lab = Lab.create(make_engine(engine))  # the CPU emulator here, CUDA graphs on a GPU; graphs for bs 1 and BS
    cfg_mla = ModelConfig(kind="mla", num_layers=1, hidden_size=32)  # latent 512 + rope 64
    world_mla = World.create(cfg_mla, max_context_len=L, pool_size=16, device=lab.engine.device)
    world_mla.randomize_kv(0)
    gen_mla = BatchGenerator(world_mla, CHAIN, seed=3)  # the Lab's generators: seeds 1 (TREE), 2 (CHAIN)
    return Setting(lab.engine, lab.world, lab.model, lab.graphs, lab.gen(TREE), lab.gen(CHAIN), world_mla, gen_mla)


def runner(backend, mode: ForwardMode, s: Setting) -> GraphRunner:
    """A runner for ``backend``'s hooks only (no model): its capture batches, padding and static buffers."""
    return GraphRunner(None, backend, s.engine, mode, s.graphs, backend.spec)


def replay_hooks(backend, mode: ForwardMode, fb: ForwardBatch, s: Setting) -> tuple[dict, ForwardBatch]:
    """The capture hooks as a runner calls them (bs 4, then 1), then the replay hook on ``fb`` padded to 4; returns what
    the bs-4 graph reads (``graph_state``) and the padded batch."""
    run = runner(backend, mode, s)
    frozen = {}
    for b in sorted(run.capture_bs, reverse=True):
        call_capture_hook(backend, run.capture_batch(b))
        frozen[b] = backend.forward_metadata
    padded = run.padded_batch(fb)
    call_replay_hook(backend, padded)
    backend.forward_metadata = frozen[padded.batch_size]  # the graph of this size reads what its capture froze
    return backend.graph_state(padded.batch_size, mode), padded


def both_paths(cls: type, spec: SpecConfig | None, mode: ForwardMode, fb: ForwardBatch, s: Setting) -> tuple[dict, dict]:
    """Verdict (a)'s two states for ``fb`` on fresh ``cls`` backends (the GQA world): path P (the capture hook on the
    padded batch) and path Q (the capture hook on the runner's capture batch, then the replay hook), as
    ``refimpl.check`` builds them."""
    new = partial(cls, s.world, spec)
    run = runner(new(), mode, s)
    return tuple(state_after(new, run, run.padded_batch(fb), replay=r)[1] for r in (False, True))


def verdict_a(
    cls: type, spec: SpecConfig | None, mode: ForwardMode, fb: ForwardBatch, s: Setting, world: World | None = None
) -> list[str]:
    """The checker's verdict (a) for ``fb`` on fresh ``cls`` backends (``refimpl.check.capture_vs_replay``'s lines)."""
    new = partial(cls, world or s.world, spec)
    return capture_vs_replay(new, runner(new(), mode, s), fb)[0]


def refused(backend, mode: ForwardMode) -> str:
    """Why ``backend`` does not capture ``mode`` (``GraphModeNotSupported``'s message), or that it does."""
    try:
        backend.check_graph_mode(mode)
    except GraphModeNotSupported as e:
        return f"refused: {e}"
    return f"{backend.name} captures {mode.label}"


@dataclass
class Table:
    """A small table: markdown in a notebook, aligned text in a script."""

    header: list[str]
    rows: list[list[str]]

    def _repr_markdown_(self) -> str:
        lines = [self.header, ["---"] * len(self.header), *self.rows]
        return "\n".join(f"| {' | '.join(r)} |" for r in lines)

    def __str__(self) -> str:
        lines = [self.header, *self.rows]
        widths = [max(map(len, column)) for column in zip(*lines)]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in lines)

    __repr__ = __str__  # a notebook's text/plain copy of the table


SIZES = {  # buffer: its shape in Triton, in Wave (splits: max_kv_splits)
    "cuda_graph_num_kv_splits": ("[T]", "[B]"),
    "cuda_graph_attn_lse": ("[T, H, splits]", "[B, H, splits]"),
    "cuda_graph_kv_indices": ("[T*L]", "[B*L]"),
    "cuda_graph_custom_mask": ("[T*L]", "[T*L]"),
    "qo_indptr": ("[pool+1]", "[pool+1]"),
}


def graph_buffers(world: World, B: int, N: int) -> dict[str, tuple]:
    """``SIZES``' buffers (Triton's, Wave's) as each allocates them for a target-verify runner: B requests, N rows."""
    spec = SpecConfig(num_steps=N - 1, topk=1, num_draft_tokens=N)
    backends = [cls(world, spec) for cls in (TritonAttnBackend, WaveAttnBackend)]
    for b in backends:
        b.init_cuda_graph_state(B, B * N)
    return {name: tuple(getattr(b, name) for b in backends) for name in SIZES}


def sizes_table(world: World, B: int, N: int) -> Table:
    """``graph_buffers`` as a table: each cell the symbolic shape, its number of entries and its dtype."""
    rows = [
        [f"`{n}`", *(f"{sym} = {t.numel()} {str(t.dtype).removeprefix('torch.')}" for sym, t in zip(SIZES[n], ts))]
        for n, ts in graph_buffers(world, B, N).items()
    ]
    return Table([f"buffer (B = {B}, T = B*N = {B * N}, L = {world.max_context_len})", "Triton", "Wave"], rows)


def _roles(name, t):
    """The colour roles of a bs-4 graph's buffer ``name`` (per request, or an ``[bs+1]`` indptr) for ``LIVE`` requests."""
    return viz.batch_roles(t.numel(), LIVE, BS, indptr="indptr" in name)


def flashinfer_rows(fi_decode, fi_verify) -> tuple[dict, dict]:
    """The rows of ``draw_flashinfer_wrappers`` and their colour roles: the decode wrappers' plans (bs 4 and bs 1) and
    the bs-4 verify wrapper's bound buffers, after ``replay_hooks``."""
    w4, w1 = (fi_decode.decode_cuda_graph_metadata[b][0] for b in (BS, 1))
    v4 = fi_verify.prefill_cuda_graph_metadata[BS][0]
    rows = {
        "decode, bs-4 wrapper: bound kv_indptr": w4._paged_kv_indptr_buf,
        "decode, bs-4 wrapper: plan's kv_len": read_partition(w4)[1],
        "decode, bs-1 wrapper: plan's kv_len": read_partition(w1)[1],
        "verify, bs-4 wrapper: bound qo_indptr": v4._qo_indptr_buf,
        "verify, bs-4 wrapper: bound kv_indptr": v4._paged_kv_indptr_buf,
        "verify, bs-4 wrapper: bound mask_indptr": v4._mask_indptr_buf,
    }
    roles = {k: _roles(k, t) for k, t in rows.items()}
    roles["decode, bs-1 wrapper: plan's kv_len"] = ["pad"]  # its last plan: the capture batch, one padded row
    return rows, roles


def draw_flashinfer_wrappers(fi_decode, fi_verify) -> Figure:
    rows, roles = flashinfer_rows(fi_decode, fi_verify)
    title = "FlashInfer: one wrapper per captured size; the bs-1 wrapper's plan is still the capture batch's"
    return viz.draw_buffers(rows, title, roles=roles, legend=False)


def mla_rows(up, uni, padded: ForwardBatch) -> tuple[dict, dict]:
    """The rows of ``draw_mla_stale`` after ``replay_hooks`` on the as-upstream (``up``) and unified (``uni``) backends,
    and per row the cells that differ from what ``padded`` needs."""
    ref = up.reference_graph_state(padded)
    st_up, st_uni = (b.graph_state(padded.batch_size, ForwardMode.DECODE) for b in (up, uni))
    rows = {
        "the batch needs: kv_indptr": ref["kv_indptr"],
        "as-upstream, bound: kv_indptr": st_up["kv_indptr"],
        "as-upstream, bound: kv_len_arr": st_up["kv_len_arr"],
        "as-upstream, plan's kv_len": read_partition(up.decode_cuda_graph_metadata[padded.batch_size])[1],
        "unified, bound: kv_indptr": st_uni["kv_indptr"],
        "unified, bound: kv_len_arr": st_uni["kv_len_arr"],
    }
    want = lambda k: ref["kv_indptr" if k.endswith("kv_indptr") else "kv_len_arr"].cpu().long()
    return rows, {k: t.cpu().long() != want(k) for k, t in rows.items()}


def draw_mla_stale(up, uni, padded: ForwardBatch) -> Figure:
    rows, differs = mla_rows(up, uni, padded)
    roles = {k: ["stale" if bad else r for r, bad in zip(_roles(k, t), differs[k].tolist())] for k, t in rows.items()}
    title = "FlashInfer-MLA decode, 3 requests on the bs-4 graph: as-upstream's bound buffers keep the capture batch's"
    return viz.draw_buffers(rows, title, roles=roles, differs=differs, legend=False)


LEGACY_KEYS = {"Wave decode": ("num_kv_splits",), "Triton draft extend v1": ("qo_indptr", "kv_indptr")}


def legacy_states(wave: tuple[dict, dict], triton: tuple[dict, dict]) -> tuple[dict, dict, dict]:
    """The path-P and path-Q rows of ``draw_legacy_paths`` (``LEGACY_KEYS`` of each pair of states) and their roles."""
    p, q, roles = {}, {}, {}
    for (name, keys), (sp, sq) in zip(LEGACY_KEYS.items(), (wave, triton)):
        for k in keys:
            p[f"{name}: {k}"], q[f"{name}: {k}"], roles[f"{name}: {k}"] = sp[k], sq[k], _roles(k, sp[k])
    return p, q, roles


def draw_legacy_paths(wave: tuple[dict, dict], triton: tuple[dict, dict]) -> Figure:
    p, q, roles = legacy_states(wave, triton)
    title = "legacy Wave decode and legacy Triton draft extend v1: path P vs path Q, cell by cell"
    labels = ("P (capture hook)", "Q (capture, then replay hook)")
    return viz.draw_state_diff(p, q, keys=list(p), labels=labels, roles=roles, title=title, legend=False)
