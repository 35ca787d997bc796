"""The capture/replay equivalence checker: four verdicts per backend x variant x mode x bs.

(a) ``capture_equals_replay`` — fed the same batch, do the capture path and the replay path
    leave identical graph-read state? Two fresh backend instances: P runs the *capture* hook on
    the batch padded to its captured size; Q runs the capture hook on the runner's capture batch
    (as the runner does) and then the *replay* hook on the padded batch. Their ``graph_state``
    (live buffer views + frozen scalars) must match element for element; each difference is
    reported by buffer and index.
(b) ``graph_equals_eager`` — after capture, a fresh batch replayed through the graph gives the
    eager output, and the replay wrote no live request's KV slot other than its own.
(c) ``matches_oracle`` — eager output equals the dense float64 oracle.
(d) ``replay_matches_reference`` — after the replay hook, the graph-read state equals a
    reference computed from first principles (the backend's ``reference_graph_state``: the
    ``*_ref`` builders and ``refimpl.layout``), so a bug inside a body that capture and replay
    share, invisible to (a), is named by buffer even when it does not change the output.

The checker is a client of the runner: the batches it feeds the hooks come from
``GraphRunner.capture_batch`` / ``padded_batch`` and the hooks are called through the runner's
``call_capture_hook`` / ``call_replay_hook``, so it checks exactly what a replay does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from ._env import default_dtype
from .backends import BackendEntry, find
from .backends.base import GraphModeNotSupported
from .backends.oracle import OracleBackend, OracleMultiStep
from .batch import ForwardBatch, World
from .batchgen import BatchGenerator
from .config import GraphConfig, SpecConfig, tiny_model_config
from .graphs import GraphEngine, make_engine
from .graphs.runner import GraphRunner, call_capture_hook, call_in_graph_hook, call_replay_hook
from .model import MultiStepDraftProgram, TinyDecoder
from .modes import ForwardMode


@dataclass
class CheckRecord:
    backend: str
    variant: str
    mode: str
    bs: int
    engine: str
    capture_equals_replay: bool | None
    graph_equals_eager: bool | None
    matches_oracle: bool | None
    findings: list[str] = field(default_factory=list)
    pattern: str = ""
    replay_matches_reference: bool | None = None

    @property
    def passed(self) -> bool:
        verdicts = (self.capture_equals_replay, self.graph_equals_eager, self.matches_oracle,
                    self.replay_matches_reference)  # fmt: skip
        return all(v is not False for v in verdicts)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class CheckSettings:
    capture_bs: tuple[int, ...] = (1, 2, 4)
    raw_bs: tuple[int, ...] = (1, 3)  # 3 is padded to the bs-4 graph; 1 is a captured size
    spec: SpecConfig = field(default_factory=SpecConfig)
    max_context_len: int = 48
    dtype: torch.dtype | None = None  # None: float32 on CPU, bfloat16 on CUDA
    seed: int = 0


def tolerances(dtype: torch.dtype) -> dict:
    if dtype == torch.float32:
        return dict(rtol=1e-4, atol=1e-4)
    return dict(rtol=3e-2, atol=3e-2)


# --- (a) comparing graph-read state ----------------------------------------------------------------
def _snapshot(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


def _tensor_diff(key: str, a: torch.Tensor, b: torch.Tensor, what: str, limit: int) -> list[str]:
    a_, b_ = a.to("cpu"), b.to("cpu")
    bad = (a_ != b_) & ~(a_.isnan() & b_.isnan()) if a_.is_floating_point() else a_ != b_
    idx = bad.flatten().nonzero().flatten()
    if not idx.numel():
        return []
    af, bf = a_.flatten(), b_.flatten()
    ex = ", ".join(f"[{i}] {af[i].item()} vs {bf[i].item()}" for i in idx[:limit].tolist())
    return [f"{key}: {idx.numel()} of {a_.numel()} elements differ ({ex}; {what})"]


def diff_states(capture: dict[str, Any], replay: dict[str, Any], limit: int = 4) -> list[str]:
    """Human-readable differences, one line per buffer or scalar."""
    out = []
    for key in sorted(set(capture) | set(replay)):
        if key not in capture or key not in replay:
            where = "capture" if key in capture else "replay"
            out.append(f"{key}: only the {where} path sets it")
            continue
        a, b = capture[key], replay[key]
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            if a.shape != b.shape:
                out.append(f"{key}: shape {tuple(a.shape)} after capture vs {tuple(b.shape)} after replay")
                continue
            out += _tensor_diff(key, a, b, "capture vs replay", limit)
        elif a != b:
            out.append(f"{key}: {a!r} frozen at capture vs {b!r} after replay")
    return out


def diff_reference(state: dict[str, Any], ref: dict[str, Any], limit: int = 4) -> list[str]:
    """Verdict (d): ``state`` against the reference, key by key, over the reference's region."""
    out = []
    for key in sorted(ref):
        want, got = ref[key], state.get(key)
        if got is None:
            out.append(f"reference: {key}: the graph reads no such state")
        elif isinstance(want, torch.Tensor):
            got = got.detach().flatten()
            n = want.numel()
            if got.numel() < n:
                out.append(f"reference: {key}: graph state has {got.numel()} entries, needs {n}")
                continue
            got = got[:n].to(want.dtype) if want.dtype != torch.bool else got[:n].bool()
            out += _tensor_diff(f"reference: {key}", got, want.flatten().to("cpu"),
                                "graph reads vs reference", limit)  # fmt: skip
        elif got != want:
            out.append(f"reference: {key}: graph reads {got!r}, reference {want!r}")
    return out


def capture_vs_replay(
    new_backend: Callable[[], Any], runner: GraphRunner, fb: ForwardBatch
) -> tuple[list[str], list[str] | None]:
    """Verdicts (a) and (d) for one batch: P (capture hook fed the batch) vs Q (capture, then
    replay); Q's state against its reference (None when the backend gives none). Backends that
    rebuild metadata inside the graph get their in-graph hook after the last out-of-graph one."""
    padded = runner.padded_batch(fb)
    bs, mode = padded.batch_size, runner.mode

    P = new_backend()
    P.init_cuda_graph_state(runner.max_bs, runner.max_num_tokens)
    call_capture_hook(P, padded)
    call_in_graph_hook(P, padded)  # what a graph's own metadata nodes would do first
    state_p = _snapshot(P.graph_state(bs, mode))

    Q = new_backend()
    Q.init_cuda_graph_state(runner.max_bs, runner.max_num_tokens)
    call_capture_hook(Q, runner.capture_batch(bs))
    call_replay_hook(Q, padded)
    call_in_graph_hook(Q, padded)
    state_q = _snapshot(Q.graph_state(bs, mode))
    ref = Q.reference_graph_state(padded)
    live_p, live_q = _batch_defined(state_p, fb.batch_size), _batch_defined(state_q, fb.batch_size)
    return diff_states(live_p, live_q), None if ref is None else diff_reference(state_q, ref)


def _batch_defined(state: dict[str, Any], raw_bs: int) -> dict[str, Any]:
    """``state`` without what the batch does not define: the padded rows' tree-mask blocks. A
    replay copies the live requests' mask only (as SGLang does), so a padded row's block holds
    whatever the buffer held before (a capture's dummy mask, an older batch); its output is
    dropped. Capture and replay histories differ there, so comparing it would be noise."""
    if "custom_mask" not in state or "mask_indptr" not in state:
        return state
    end = int(state["mask_indptr"][raw_bs])
    return {**state, "custom_mask": state["custom_mask"][:end]}


# --- (b) no foreign KV written, (b)/(c) outputs agree -------------------------------------------
class KVGuard:
    """Catch any write into a live KV slot that the batch does not write itself.

    Two kinds of slots are guarded: those of live requests outside the batch, which are set to
    a sentinel for the replay (so that even a write of the very values a slot held is seen: a
    stale padded row recomputes its old request's K/V bit for bit on a GPU; a correct replay
    never reads them, so the sentinel cannot change its output), and the batch's own earlier
    slots, which it reads and must not write, compared with a snapshot. ``check()`` counts the
    writes and puts the foreign slots' values back.
    """

    SENTINEL = -1234.5

    def __init__(self, world: World, fb: ForwardBatch):
        writes = set(fb.out_cache_loc.tolist())
        rows = world.req_to_token[fb.req_pool_indices.to(world.req_to_token.device)]
        own = set(rows[rows > 0].tolist()) - writes  # the batch's own earlier tokens
        foreign = [s for s in world.live_slots().tolist() if s not in writes and s not in own]
        dev = world.device
        self.foreign = torch.tensor(foreign, dtype=torch.int64, device=dev)
        self.own = torch.tensor(sorted(own), dtype=torch.int64, device=dev)
        self.world = world
        bufs = world.kv_cache.buffers()
        self.saved = [b[self.foreign].clone() for b in bufs]
        for b in bufs:
            b[self.foreign] = self.SENTINEL
        self.poisoned = [b[self.foreign].clone() for b in bufs]
        self.own_before = [b[self.own].clone() for b in bufs]
        self.violations = 0

    def check(self) -> list[str]:
        """Count the guarded slots written since construction; restore the foreign ones."""
        bufs = self.world.kv_cache.buffers()
        hit_foreign = torch.zeros(len(self.foreign), dtype=torch.bool, device=self.foreign.device)
        hit_own = torch.zeros(len(self.own), dtype=torch.bool, device=self.own.device)
        for buf, poisoned, saved, before in zip(bufs, self.poisoned, self.saved, self.own_before):
            hit_foreign |= (buf[self.foreign] != poisoned).flatten(1).any(1)
            hit_own |= (buf[self.own] != before).flatten(1).any(1)
            buf[self.foreign] = saved
        foreign, own = int(hit_foreign.sum()), int(hit_own.sum())  # slots, over every layer
        self.violations += foreign + own
        problems = []
        if foreign:
            problems.append(f"padded or live rows wrote {foreign} KV slot(s) of other requests")
        if own:
            problems.append(f"the replay overwrote {own} earlier KV slot(s) of requests in this batch")
        return problems


def _close(out: torch.Tensor, ref: torch.Tensor, tol: dict, what: str, findings: list[str]) -> bool:
    if out.shape != ref.shape:
        findings.append(f"{what}: shape {tuple(out.shape)} vs {tuple(ref.shape)}")
        return False
    if out.numel() == 0:
        return True
    o, r = out.float(), ref.float()
    if torch.allclose(o, r, **tol) and not o.isnan().any():
        return True
    err = (o - r).abs().max().item()
    findings.append(f"{what}: max abs difference {err:.3g} (rtol {tol['rtol']}, atol {tol['atol']})")
    return False


# --- one backend entry x graph mode ------------------------------------------------------------
# A case is a captured graph kind: a forward mode, or multi-step draft decode (DECODE steps).
CASES: dict[str, tuple[ForwardMode, bool]] = {
    "decode": (ForwardMode.DECODE, False),
    "idle": (ForwardMode.IDLE, False),
    "target_verify": (ForwardMode.TARGET_VERIFY, False),
    "draft_extend": (ForwardMode.DRAFT_EXTEND, False),
    "draft_extend_v2": (ForwardMode.DRAFT_EXTEND_V2, False),
    "draft_decode": (ForwardMode.DECODE, True),
}


def parse_case(name: str) -> str:
    key = name.strip().lower().replace("-", "_")
    if key not in CASES:
        raise ValueError(f"unknown graph mode {name!r}; valid: {', '.join(CASES)}")
    return key


def check_entry_mode(
    entry: BackendEntry, case: str | ForwardMode, engine: GraphEngine, settings: CheckSettings
) -> list[CheckRecord]:
    label = case.label if isinstance(case, ForwardMode) else parse_case(case)
    mode, multi_step = CASES[label]
    dev = engine.device
    dtype = settings.dtype or default_dtype(dev)
    cfg = tiny_model_config(entry.model_kind, dtype, dev.type)
    L, spec = settings.max_context_len, settings.spec
    world = World.create(cfg, max_context_len=L, pool_size=4 * max(settings.capture_bs) + 8,
                         page_size=entry.page_size, device=dev, seed=settings.seed)  # fmt: skip
    world.randomize_kv(settings.seed)
    rows: list[CheckRecord] = []
    backend_cls = None

    def new_backend():
        return backend_cls(world, spec)

    def record(bs, *v, findings, ref=None):
        pattern = getattr(backend_cls or entry.load(), "pattern", "")
        rows.append(CheckRecord(entry.name, entry.variant, label, bs, engine.name, *v, findings,
                                pattern, ref))  # fmt: skip

    try:
        backend_cls = entry.load(multi_step)
        backend = new_backend()
        backend.check_graph_mode(mode)
    except GraphModeNotSupported as e:
        record(0, None, None, None, findings=[f"skipped: {e}"])
        return rows
    model = TinyDecoder(cfg, dev)
    if multi_step:
        program, oracle = MultiStepDraftProgram(model, spec.num_steps), OracleMultiStep(world, spec)
    else:
        program, oracle = model, OracleBackend(world, spec)
    gcfg = GraphConfig(max_bs=max(settings.capture_bs), capture_bs=settings.capture_bs,
                       max_context_len=L, speculative=True)  # fmt: skip
    runner = GraphRunner(program, backend, engine, mode, gcfg, spec, multi_step)
    runner.capture()
    gen = BatchGenerator(world, spec, seed=settings.seed + 1)
    tol = tolerances(dtype)
    for raw_bs in (0,) if mode.is_idle() else settings.raw_bs:
        findings: list[str] = []
        fb = gen.for_mode(mode, raw_bs, multi_step_draft=multi_step)
        # (a) capture path vs replay path, (d) replay state vs the first-principles reference
        diffs, ref_diffs = capture_vs_replay(new_backend, runner, fb)
        findings += diffs + (ref_diffs or [])
        cap_eq, ref_eq = not diffs, None if ref_diffs is None else not ref_diffs
        # (b) graph replay vs eager, and no write into another request's KV
        guard = KVGuard(world, fb)
        graph_out = runner.replay(fb).clone()
        findings += guard.check()
        eager_out = runner.eager(fb).clone()
        g_eq = _close(graph_out, eager_out, tol, "graph vs eager", findings)
        g_eq = g_eq and not guard.violations
        # (c) eager vs the dense oracle
        oracle.init_forward_metadata(fb)
        o_eq = _close(eager_out, program(fb, oracle), tol, "eager vs oracle", findings)
        record(raw_bs, cap_eq, g_eq, o_eq, findings=findings, ref=ref_eq)
        gen.release(fb)
    return rows


def run_checks(
    backends: Iterable[str] | None = None,
    modes: Iterable[str] | None = None,
    variants: Iterable[str] | None = None,
    engine: str = "auto",
    settings: CheckSettings | None = None,
    entries: Iterable[BackendEntry] | None = None,
) -> list[CheckRecord]:
    """Check the registered backends (``backends`` / ``variants`` filter them) or ``entries``."""
    settings = settings or CheckSettings()
    eng = make_engine(engine)
    if entries is None:
        entries = [e for n in (backends or [None]) for e in find(n)]
        if variants:
            entries = [e for e in entries if e.variant in set(variants)]
    case_list = [parse_case(m) for m in modes] if modes else list(CASES)
    rows: list[CheckRecord] = []
    for entry in entries:
        why = entry.why_unavailable()
        if why:
            rows.append(CheckRecord(entry.name, entry.variant, "-", 0, eng.name, None, None, None,
                                    [f"unavailable: {why}"]))  # fmt: skip
            continue
        for case in case_list:
            rows.extend(check_entry_mode(entry, case, eng, settings))
    return rows
