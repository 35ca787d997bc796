"""The verdicts, in one place: what the checker, the fuzzer, the bench and the review tools conclude from a rig.

(a) ``capture_vs_replay``: fed the same padded batch, a fresh backend's *capture* hook (P) and another's
    capture-then-*replay* hooks (Q) leave identical graph-read state (buffer views + frozen scalars), by buffer and index;
    a draft-extend replay leaves the same through SGLang 0.5.23's max-capacity views (``max_capacity_views``).
(b) / (c) ``Rig.run``: a batch replayed through the graph gives the eager output and writes no KV slot but its own;
    eager output equals the dense float64 oracle.
(d) ``capture_vs_replay`` too: after the replay hook the graph-read state keeps the padded-row invariants (every
    backend) and equals the backend's first-principles ``reference_graph_state``: a bug in a body both hooks share,
    invisible to (a).
(e) ``glue_vs_eager``: the replay hook captured once into a metadata glue graph (``graphs.runner.capture_glue``) and
    replayed for rotated batches in turn leaves, after each, the graph-read state the eager hook leaves: the proof that
    the shape may be glued (``None``: refused, e.g. a FlashInfer ``plan()`` in the part to glue; a split hook's device
    phase is glued with its host phase run eagerly first). Information, not a pass/fail verdict.
(f) ``history_verdict``: on the largest size, the same graphs replay a sequence, each replay held to (b) and (c): a
    replay that depends on the previous one fails there and nowhere else.

An (a) finding whose replay-side value is what the capture hook fed the runner's capture batch leaves says so: "stale
from capture". The hooks are fed what the runner feeds them (``capture_batch`` / ``padded_batch``, which run the
replay's own ``StaticInputs.load``) through the runner's ``call_*_hook``: the verdicts check a replay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..backends import BackendEntry
from ..backends.base import PLANS, GraphModeNotSupported
from ..batch import ForwardBatch
from ..config import SpecConfig
from ..graphs import GraphEngine, GraphReplayError
from ..graphs.runner import GraphRunner, call_capture_hook, call_in_graph_hook, call_replay_hook, capture_glue
from ..layout import GraphKind
from .core import KVGuard, Rig, Verdict, close, graph_buffers, live_masks, padded_row_invariants, raised, state_after


@dataclass
class CheckSettings:
    capture_bs: tuple[int, ...] = (1, 4)  # every captured graph replays: the row (3 padded to 4), the long run (1)
    raw_bs: tuple[int, ...] = (3,)  # padded to the bs-4 graph (the history replays every other); --all: (1, 2, 3, 4)
    glue_replays: int = 3  # verdict (e): rotated batches replayed in turn through one glue graph (0: no verdict)
    history: bool = True  # verdict (f): after the per-size rows, a sequence of replays through the same graphs
    arguments: bool = False  # per row, what the replay hook and the eager path do with each field (rig.arguments)
    spec: SpecConfig = field(default_factory=SpecConfig)
    max_context_len: int = 640  # L: room for lengths past 512 positions (each batch's first request near L)
    num_slots: int | None = 102_400  # KV slots (a multiple of every page size), in random page order: ids past 65,536;
    # None: just enough for the request pool (a small world, for tests)
    dtype: torch.dtype | None = None  # None: float32 on CPU, bfloat16 on CUDA
    seed: int = 0

    def rig_args(self) -> dict[str, Any]:
        """``Rig.build``'s sizes, dtype and seed (the world's slot count is the caller's: a glue rig builds a small one)."""
        return {k: getattr(self, k) for k in "capture_bs max_context_len dtype seed".split()}

    def slots_needed(self) -> int:
        """The fewest KV slots that hold the rig's request pool (``Rig.build``: 4 * max bs + 8 requests, slot 0 too),
        each at the longest context, in pages of up to 128."""
        return (4 * max(self.capture_bs) + 9) * -(-self.max_context_len // 128) * 128 + 128


# --- (a) comparing graph-read state ----------------------------------------------------------------
def _snapshot(state):
    return {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


def _where(i, shape, rows):
    """Flat index ``i`` as a reviewer reads it: ``[i]`` (kept), the row and column of a 2-D tensor, and whether the row is
    a padded request's (``rows``: live and padded batch size; a tensor's first dimension of the padded size is per
    request)."""
    parts, r = [], i
    if len(shape) == 2 and shape[1]:
        r, c = divmod(i, shape[1])
        parts.append(f"row {r}, col {c}")
    if rows is not None and shape and shape[0] == rows[1] and r >= rows[0]:
        parts.append("a padded row" if parts else f"padded row {r}")
    return f"[{i}]" + (f" ({', '.join(parts)})" if parts else "")


def _tensor_diff(key, a, b, what, rows=None):
    """One line naming how many elements differ and the first four (NaN where NaN is equal)."""
    shape, a, b = tuple(a.shape), a.cpu().flatten(), b.cpu().flatten()
    idx = ((a != b) & ~(a.isnan() & b.isnan())).nonzero().flatten()
    if not idx.numel():
        return []
    ex = ", ".join(f"{_where(i, shape, rows)} {a[i].item()} vs {b[i].item()}" for i in idx[:4].tolist())
    return [f"{key}: {idx.numel()} of {a.numel()} elements differ ({ex}; {what})"]


STALE = "stale from capture: the replay path kept the capture batch's {}"  # values (a tensor's), value (a scalar's)


def _stale(b, kept, differ=None):
    """Whether the replay-side ``b`` holds, wherever it differs from the capture path (``differ``), what the capture
    batch left (``kept``)."""
    if not isinstance(b, torch.Tensor):
        return not isinstance(kept, torch.Tensor) and b == kept
    return isinstance(kept, torch.Tensor) and kept.shape == b.shape and bool((b.cpu()[differ] == kept.cpu()[differ]).all())


def diff_states(
    capture: dict[str, Any], replay: dict[str, Any], paths=("capture", "replay"), rows=None, stale: dict[str, Any] | None = None
) -> list[str]:
    """Human-readable differences, one line per buffer or scalar (``paths``: what made each state; ``rows``: the live and
    padded batch sizes, to name padded rows; ``stale``: the state the capture hook leaves for the runner's capture batch:
    a replay-side value equal to it where the two paths differ is named "stale from capture")."""
    out, (p, q), stale = [], paths, stale or {}
    for key in sorted(set(capture) | set(replay)):
        if key not in capture or key not in replay:
            out.append(f"{key}: only the {p if key in capture else q} path sets it")
            continue
        a, b = capture[key], replay[key]
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            if a.shape != b.shape:
                out.append(f"{key}: shape {tuple(a.shape)} after {p} vs {tuple(b.shape)} after {q}")
                continue
            kept = key in stale and _stale(b, stale[key], a.cpu() != b.cpu())
            out += _tensor_diff(key, a, b, f"{p} vs {q}" + ("; " + STALE.format("values") if kept else ""), rows)
        elif a != b:
            kept = key in stale and _stale(b, stale[key])
            line = f"{key}: {a!r} {'frozen at' if p == 'capture' else 'after'} {p} vs {b!r} after {q}"
            out.append(line + (f" ({STALE.format('value')})" if kept else ""))
    return out


def diff_reference(state: dict[str, Any], ref: dict[str, Any], rows=None) -> list[str]:
    """Verdict (d): ``state`` against the reference, key by key, over the reference's region, in the reference's shape
    (``rows``: live and padded batch size, to name padded rows)."""
    out = []
    for key in sorted(ref):
        want, got = ref[key], state.get(key)
        if got is None:
            out.append(f"reference: {key}: the graph reads no such state")
        elif isinstance(want, torch.Tensor):
            got, n = got.flatten(), want.numel()
            if got.numel() < n:
                out.append(f"reference: {key}: graph state has {got.numel()} entries, needs {n}")
                continue
            got = got[:n].to(want.dtype).view_as(want)
            out += _tensor_diff(f"reference: {key}", got, want, "graph reads vs reference", rows)
        elif got != want:
            out.append(f"reference: {key}: graph reads {got!r}, reference {want!r}")
    return out


def max_capacity_views(new_backend: Callable[[], Any], runner: GraphRunner, fb: ForwardBatch) -> list[str]:
    """SGLang 0.5.23's draft-extend replay (``eagle_draft_extend_cuda_graph_runner``; open PR #36913): the views it hands
    a backend report the bucket as ``batch_size`` but keep ``req_pool_indices``, ``seq_lens`` and ``seq_lens_cpu`` at
    the buffers' full capacity (its decode and verify runner slices them to the bucket). A hook that slices by ``bs``
    leaves the same state (its FlashInfer plans included) through them as through views of the bucket; one that takes a
    count from a tensor's length may not. Rows past the bucket are at rest here (SGLang's may hold an earlier batch's).
    The two states' differences, named."""
    bs = runner.pick_bs(fb.batch_size)
    inputs = runner.inputs.at_rest(runner.max_bs)  # the runner's capacity, rows past bs at rest
    inputs.load(fb, bs)
    exact = runner._replay_batch(fb, bs, inputs)
    full = exact.replace(req_pool_indices=inputs.req_pool_indices, seq_lens=inputs.seq_lens, seq_lens_cpu=inputs.seq_lens_cpu)

    def state(batch):  # the graph-read state and the replay hook's plans
        return _batch_defined(_snapshot(state_after(new_backend, runner, batch, replay=True, plans=True)[1]), fb.batch_size)

    try:
        a, b = state(exact), state(full)
    except Exception as e:  # noqa: BLE001 - the hook fails on full-capacity views: a finding
        return [f"max-capacity views (SGLang #36913): {raised(e)}"]
    return [f"max-capacity views (SGLang #36913): {d}" for d in diff_states(a, b, paths=("bucket views", "max-capacity views"))]


def capture_vs_replay(
    new_backend: Callable[[], Any], runner: GraphRunner, fb: ForwardBatch
) -> tuple[list[str], list[str] | None]:
    """Verdicts (a) and (d) for one batch: P (capture hook fed the batch) vs Q (capture, then replay); Q's state against
    the padded-row invariants and its reference (None when the backend gives none and the invariants hold). Backends
    that rebuild metadata inside the graph get their in-graph hook after the last out-of-graph one."""
    padded = runner.padded_batch(fb)
    live_p = _batch_defined(_snapshot(state_after(new_backend, runner, padded, replay=False)[1]), fb.batch_size)  # before Q
    q, state_q = state_after(new_backend, runner, padded, replay=True)
    state_q = _snapshot(state_q)
    ref, live_q = q.reference_graph_state(padded), _batch_defined(state_q, fb.batch_size)
    rows = (fb.batch_size, padded.batch_size)
    diffs = diff_states(live_p, live_q, rows=rows)
    if diffs:  # which of them the replay path kept from the capture batch (Q's first step, on a fresh backend)
        kept = _snapshot(state_after(new_backend, runner, runner.capture_batch(padded.batch_size), replay=False)[1])
        diffs = diff_states(live_p, live_q, rows=rows, stale=kept)
    if padded.forward_mode.is_any_draft_extend():
        diffs += max_capacity_views(new_backend, runner, fb)
    per_request = runner.spec_cfg.topk if runner.kind.multi_step else 1  # multi-step draft decode: a row per branch
    found = padded_row_invariants(state_q, padded.batch_size * per_request)  # (Rig.run checks them after the graph's replay too)
    found += [] if ref is None else diff_reference(state_q, ref, rows=rows)
    return diffs, found or (None if ref is None else [])


def _batch_defined(state, raw_bs):
    """``state`` without what the batch does not define: the padded rows' tree-mask blocks. A replay copies the live
    requests' mask only (as SGLang does), so a padded row's block holds whatever the buffer held before (a capture's
    dummy mask, an older batch); its output is dropped. Capture and replay histories differ there, so comparing it would
    be noise."""
    if "custom_mask" not in state or "mask_indptr" not in state:
        return state
    end = int(state["mask_indptr"][raw_bs])
    return {**state, "custom_mask": state["custom_mask"][:end]}


GlueVerdict = tuple[bool | None, list[str]]  # verdict (e): True glue-safe, False not, None refused; the findings


def glue_vs_eager(rig: Rig, batches: list[ForwardBatch]) -> GlueVerdict:
    """Verdict (e) for ``batches`` of one raw size, replayed in turn: a fresh backend's replay hook captured once into a
    glue graph on static inputs at rest (as the runner does), then per batch the replay's ``load_inputs`` and the glue
    graph, against a twin backend with the same history run eagerly: its capture hook and the replay hook on the
    capture batch (the glue capture's warm-up), then the replay hook on each padded batch in turn; a split hook's host
    phase runs eagerly before each glue replay (only its device phase is glued) and its plans are compared too
    (``flashinfer_wrappers.plan_state``). Parts no kernel reads
    (a block table's columns past a request's pages) keep the same stale values on both sides. ``(None, [why])`` when
    the hook cannot be glued."""
    from ..flashinfer_wrappers import count_plans, plan_state

    runner, raw_bs = rig.runner, batches[0].batch_size
    bs, glued, twin = runner.pick_bs(raw_bs), rig.new_backend(), rig.new_backend()
    inputs = runner.inputs.at_rest(bs)  # the glue graph's own static inputs, every row padded
    static = runner.capture_batch(bs, inputs)
    for b in (glued, twin):
        b.init_cuda_graph_state(runner.max_bs, runner.max_num_tokens)
        call_capture_hook(b, static)

    split = glued.splits_hook(runner.mode)
    # both backends' plans counted and their inputs recorded (plan_state) from here on: the same history on each side
    with count_plans(glued) as plans, count_plans(twin):

        def planned(run):  # a whole hook: its plans in the warm-ups and this run; a split one's device phase: in the run
            before = plans[0] if split else 0
            run()
            return plans[0] > before and PLANS

        graph, why = capture_glue(runner.engine, glued, static, runner.graph_cfg.num_warmups, planned)
        if graph is None:
            return None, [f"glue refused: {why}"]
        call_replay_hook(twin, static)

        def state(b):  # a split hook's plan too: the bound buffers say nothing of it
            return b.graph_state(bs, runner.mode) | (plan_state(b) if split else {})

        failed, first = [], None  # the numbers of the replays that differ; the first one's lines
        for i, fb in enumerate(batches, 1):
            inputs.load(fb, bs)
            if split:  # the host phase, eager, as the runner runs it before each glue replay
                glued.prepare_host_metadata(runner._replay_batch(fb, bs, inputs))
            try:
                graph.replay()
            except GraphReplayError as e:  # the glued hook read memory it did not own and let go (liveness)
                return False, [f"not glue-safe: replay {i} of {len(batches)}: {e}"]
            call_in_graph_hook(glued, static)
            got = _batch_defined(_snapshot(state(glued)), raw_bs)
            call_replay_hook(twin, padded := runner.padded_batch(fb))
            call_in_graph_hook(twin, padded)
            want = _batch_defined(state(twin), raw_bs)
            if diffs := diff_states(want, got, paths=("the eager hook", "the glued hook")):
                failed.append(str(i))
                first = first or diffs
    what = f"not glue-safe: replays {', '.join(failed)} of {len(batches)} left other state than the eager hook; first"
    return not failed, [f"{what}: {d}" for d in first or ()]


def glue_per_size(rig: Rig, sizes, replays: int) -> list[GlueVerdict]:
    """Verdict (e) per raw size, each on ``replays`` fresh batches (drawn after every other verdict's)."""
    out = []
    for raw_bs in sizes:
        batches = [rig.gen.for_mode(rig.kind, raw_bs) for _ in range(max(replays, 1))]
        out.append(glue_vs_eager(rig, batches))
        for fb in batches:
            rig.gen.release(fb)
    return out


def glue_verdict(
    entry: BackendEntry, kind: str | GraphKind, engine: GraphEngine, settings: CheckSettings | None = None
) -> GlueVerdict:
    """Verdict (e) alone for one entry and graph kind, at every raw size of ``settings`` (no step graph is captured):
    True when the shape may be glued, None when the hook is refused (or the kind not captured), with the findings."""
    settings, kind = settings or CheckSettings(), GraphKind.parse(kind)
    try:
        rig = Rig.build(entry, kind, settings.spec, engine, capture=False, **settings.rig_args())
    except GraphModeNotSupported as e:
        return None, [f"skipped: {e}"]
    found = glue_per_size(rig, (0,) if kind.mode.is_idle() else settings.raw_bs, settings.glue_replays)
    verdicts = [ok for ok, _ in found]
    return (None if None in verdicts else all(verdicts)), [f for _, fs in found for f in fs]


def run_one(rig: Rig, fb: ForwardBatch) -> Verdict:
    """Verdicts (b) and (c) for one batch; a replay or eager run that raises (a kernel indexing past a buffer, on a CPU)
    is a failing verdict with the reason: the review tool survives the code it reviews."""
    try:
        return rig.run(fb)
    except Exception as e:  # noqa: BLE001 - a finding, not a crash
        return Verdict(None, None, False, None, [raised(e)])


# --- (f) a history of replays -------------------------------------------------------------------
LONG_RUN = 20  # replays through one graph in the history's last step: a bug every k-th call (k <= 20) shows


def _short(gen, kind, bs):
    """A batch whose requests are all short (``BatchGenerator.lengths``): the history's later steps, cheap to run."""
    kept, gen.lengths = gen.lengths, "short"
    try:
        return gen.for_mode(kind, bs)
    finally:
        gen.lengths = kept


def history_steps(rig: Rig, big: int, a: ForwardBatch | None = None) -> list[tuple[str, ForwardBatch]]:
    """Verdict (f)'s sequence before its long run, each step right after the one it varies: A (``a``, or a batch of raw
    size ``big`` with the generator's lengths); A's lengths for other requests (with trees, other trees: the same mask
    size); B, A's size with other (short) lengths; then one short batch of every other captured graph size but the
    smallest, largest first (C: with the long run through the smallest, every captured graph replays, smaller after
    larger)."""
    gen, kind = rig.gen, rig.kind
    a = a or gen.for_mode(kind, big)
    big = a.batch_size
    same = dict(seq_lens=a.seq_lens_cpu.tolist())
    if kind.mode.is_any_draft_extend():
        same["accept_length"] = a.meta["accept_length"]
    trees = ", other trees" if kind.mode.is_target_verify() and rig.spec.topk > 1 else ""
    steps = [("A", a), (f"A's lengths, other requests{trees}", gen.for_mode(kind, big, **same))]
    steps.append(("B, A's size, other lengths", _short(gen, kind, big)))
    sizes = rig.runner.capture_bs
    others = sorted(set(sizes) - {rig.runner.pick_bs(big), min(sizes)}, reverse=True)
    return steps + [(f"C, the bs-{n} graph", _short(gen, kind, n)) for n in others]


def _reads(backend, masks, batch):
    """What a graph replay reads besides the KV cache and frozen scalars: the live elements (``masks``) of each of
    ``backend``'s graph buffers, and ``batch``'s static inputs."""
    bufs = {f"{n} (live part)": b.reshape(-1)[m] for (n, b), m in zip(graph_buffers(backend), masks)}
    inputs = "input_ids positions req_pool_indices seq_lens seq_lens_cpu out_cache_loc".split()
    return _snapshot(bufs | {f"static input {k}": getattr(batch, k) for k in inputs})


def long_run(rig: Rig):
    """``LONG_RUN`` replays through the smallest graph, alternating two short batches, so no batch follows itself. A
    batch's first replay is held to (b) and (c). Every later one runs the replay path up to the launch (inputs, hook,
    the in-graph metadata) and compares what the graph would read with what a fresh backend's hooks
    leave for that batch (verdict (a)'s replay path), on the elements those hooks write (a second fresh backend, its
    buffers poisoned first, tells them apart: a block table's columns past a request's pages are left as they were, and
    no kernel reads them): a captured graph's output is a function of what it reads, so equal reads are an equal
    replay, at a hook's cost instead of a forward pass's. Where a read differs the graph runs and is held to (b)
    against the batch's eager output. ``(graph size, [(replay, findings)])``."""
    gen, runner, bs = rig.gen, rig.runner, rig.runner.capture_bs[0]
    batches = [_short(gen, rig.kind, bs) for _ in range(2)]
    first, out = {}, []
    for j in range(1, LONG_RUN + 1):
        i = (j - 1) % 2  # in turn: no batch follows itself
        fb, findings = batches[i], []
        try:
            if i not in first:  # the batch's first replay (or a retry of one that raised)
                v = run_one(rig, fb)
                findings = v.findings
                q, state = state_after(rig.new_backend, runner, padded := runner.padded_batch(fb), replay=True)
                masks = live_masks(q, state)
                try:  # live, and written by the hooks (a hook that reads what init_cuda_graph_state set raises here)
                    q2 = state_after(rig.new_backend, runner, padded, replay=True, poisoned=True)[0]
                    both = zip(masks, graph_buffers(q), graph_buffers(q2))
                    masks = [m & (a.reshape(-1) == b.reshape(-1)) for m, (_, a), (_, b) in both]
                except Exception:  # noqa: BLE001, S110 - then every live element counts
                    pass
                first[i] = v.eager, masks, _reads(q, masks, padded)
                continue
            eager, masks, want = first[i]
            runner.load_inputs(fb, bs)
            view = runner.replay_hook(fb, bs)
            call_in_graph_hook(runner.backend, view)
            findings += rig.invariants(fb.batch_size)
            if diff_states(want, _reads(runner.backend, masks, view)):
                guard = KVGuard(rig.world, fb)
                try:
                    graph = runner.launch(bs)[: fb.num_tokens]
                finally:
                    findings += guard.check(runner.inputs.out_cache_loc, None if rig.kind.multi_step else fb.num_tokens)
                close(graph, eager, rig.tol, f"graph vs eager (eager at replay {i + 1})", findings)
        except Exception as e:  # noqa: BLE001 - a finding, not a crash
            findings = [raised(e)]
        finally:
            if findings:
                out.append((j, findings))
    for fb in batches:
        gen.release(fb)
    return bs, out


def history_verdict(rig: Rig, big: int, a: ForwardBatch | None = None) -> tuple[bool, list[str]]:
    """Verdict (f): the captured graphs replay ``history_steps`` then a ``long_run``, each replay checked as (b) and (c)
    are. A backend whose replay depends on the previous replays (a buffer refreshed only when something changed, a
    counter) passes every per-size row and fails here. ``a``: step A, a batch the graphs have just replayed (its row's,
    held to (b) and (c) there; the caller releases it)."""
    steps, findings = history_steps(rig, big, a), []
    given = a is not None  # step A: replayed and released by the caller
    for i, (label, fb) in enumerate(steps[given:], 1 + given):
        findings += [f"history replay {i} ({label}, bs {fb.batch_size}): {f}" for f in run_one(rig, fb).findings]
    bs, runs = long_run(rig)
    if runs:  # the first wrong replay's findings; the others by number
        j, found = runs[0]
        where = f"history replay {len(steps) + j} (long run, replay {j} of {LONG_RUN} through the bs-{bs} graph)"
        findings += [f"{where}: {f}" for f in found]
    if more := [str(k) for k, _ in runs[1:]]:
        findings.append(f"history long run: also wrong at replays {', '.join(more)} of {LONG_RUN}")
    for _, fb in steps[given:]:
        rig.gen.release(fb)
    return not findings, findings


__all__ = [
    "run_one",
    "glue_per_size",
    "CheckSettings",
    "STALE",
    "diff_states",
    "diff_reference",
    "capture_vs_replay",
    "glue_vs_eager",
    "glue_verdict",
    "LONG_RUN",
    "history_steps",
    "long_run",
    "history_verdict",
]
