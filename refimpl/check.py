"""The capture/replay equivalence checker.

For one backend x variant x mode x batch size it answers three questions:

(a) ``capture_equals_replay`` — fed the same batch, do the capture path and the replay path
    leave identical graph-read state? Two fresh backend instances: P runs the *capture* hook on
    the batch; Q runs the capture hook on the runner's dummy batch (as a real runner does) and
    then the *replay* hook on the batch. Their ``graph_state`` (live buffer views + frozen
    scalars) must match element for element; each difference is reported by buffer and index.
(b) ``graph_equals_eager`` — after capture, a fresh batch replayed through the graph gives the
    eager output, and the replay wrote no live request's KV slot other than its own.
(c) ``matches_oracle`` — eager output equals the dense float64 oracle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from .backends import BackendEntry, find
from .backends.base import GraphModeNotSupported
from .backends.oracle import OracleBackend, OracleMultiStep
from .batch import ForwardBatch, World
from .batchgen import BatchGenerator
from .config import GraphConfig, ModelConfig, SpecConfig
from .graphs import GraphEngine, make_engine
from .graphs.runner import GraphRunner, capture_spec_input
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

    @property
    def passed(self) -> bool:
        verdicts = (self.capture_equals_replay, self.graph_equals_eager, self.matches_oracle)
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


def default_model_config(kind: str, dtype: torch.dtype, device_type: str = "cpu") -> ModelConfig:
    """Tiny on CPU (the Triton interpreter is slow); on a GPU, head dims FlashInfer compiles."""
    if kind == "mha" and device_type == "cuda":
        return ModelConfig(kind="mha", num_layers=2, num_heads=8, num_kv_heads=2, head_dim=64,
                           v_head_dim=64, dtype=dtype)  # fmt: skip
    if kind == "mla":
        # 16 heads: the real FlashInfer MLA kernels' smallest supported head count
        return ModelConfig(kind="mla", num_layers=2, hidden_size=64, num_heads=16, dtype=dtype)
    return ModelConfig(kind="mha", num_layers=2, num_heads=4, num_kv_heads=2, dtype=dtype)


def tolerances(dtype: torch.dtype) -> dict:
    if dtype == torch.float32:
        return dict(rtol=1e-4, atol=1e-4)
    return dict(rtol=3e-2, atol=3e-2)


# --- comparing graph-read state ----------------------------------------------------------------
def _snapshot(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


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
                out.append(
                    f"{key}: shape {tuple(a.shape)} after capture vs {tuple(b.shape)} after replay"
                )
                continue
            a_, b_ = a.to("cpu"), b.to("cpu")
            bad = (a_ != b_) & ~(a_.isnan() & b_.isnan()) if a_.is_floating_point() else a_ != b_
            idx = bad.flatten().nonzero().flatten()
            if idx.numel():
                af, bf = a_.flatten(), b_.flatten()
                ex = ", ".join(
                    f"[{i}] {af[i].item()} vs {bf[i].item()}" for i in idx[:limit].tolist()
                )
                out.append(
                    f"{key}: {idx.numel()} of {a_.numel()} elements differ ({ex}; capture vs replay)"
                )
        elif a != b:
            out.append(f"{key}: {a!r} frozen at capture vs {b!r} after replay")
    return out


def _padded_inputs(fb: ForwardBatch, bs: int, fill: int):
    dev, raw = fb.device, fb.batch_size
    rpi = torch.zeros(bs, dtype=torch.int64, device=dev)
    seq = torch.full((bs,), fill, dtype=torch.int32, device=dev)
    seq_cpu = torch.full((bs,), fill, dtype=torch.int32)
    rpi[:raw], seq[:raw], seq_cpu[:raw] = fb.req_pool_indices, fb.seq_lens, fb.seq_lens_cpu
    return rpi, seq, seq_cpu, fb.seq_lens_sum + (bs - raw) * fill


def capture_vs_replay(
    entry: BackendEntry, runner: GraphRunner, fb: ForwardBatch, bs: int
) -> list[str]:
    cls = entry.load(runner.multi_step_draft)
    world, spec, mode = runner.world, runner.spec_cfg, runner.mode
    fill = runner.fill_value
    rpi, seq, seq_cpu, seq_sum = _padded_inputs(fb, bs, fill)
    num_tokens = bs * runner.tokens_per_req

    P = cls(world, spec)  # the capture path, fed the batch
    P.init_cuda_graph_state(runner.max_bs, runner.max_num_tokens)
    P.init_forward_metadata_capture_cuda_graph(bs, num_tokens, rpi, seq, None, mode, fb.spec_info)
    state_p = _snapshot(P.graph_state(bs, mode))

    Q = cls(world, spec)  # the replay path: captured on the dummy batch, replayed with the batch
    Q.init_cuda_graph_state(runner.max_bs, runner.max_num_tokens)
    d_rpi = torch.zeros(bs, dtype=torch.int64, device=world.device)
    d_seq = torch.full((bs,), fill, dtype=torch.int32, device=world.device)
    dummy_spec = capture_spec_input(mode, bs, runner)
    Q.init_forward_metadata_capture_cuda_graph(bs, num_tokens, d_rpi, d_seq, None, mode, dummy_spec)
    Q.init_forward_metadata_replay_cuda_graph(
        bs, rpi, seq, seq_sum, None, mode, fb.spec_info, seq_cpu
    )
    state_q = _snapshot(Q.graph_state(bs, mode))
    return diff_states(state_p, state_q)


# --- the whole check for one backend entry and case ----------------------------------------------
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
    dtype = settings.dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    cfg = default_model_config(entry.model_kind, dtype, dev.type)
    L = settings.max_context_len
    world = World.create(
        cfg,
        max_context_len=L,
        pool_size=4 * max(settings.capture_bs) + 8,
        page_size=entry.page_size,
        device=dev,
        seed=settings.seed,
    )
    world.randomize_kv(settings.seed)
    spec = settings.spec
    rows: list[CheckRecord] = []

    def record(bs, *v, findings):
        rows.append(CheckRecord(entry.name, entry.variant, label, bs, engine.name, *v, findings))

    model = TinyDecoder(cfg, dev)
    try:
        backend = entry.load(multi_step)(world, spec)
        backend.check_graph_mode(mode)
    except GraphModeNotSupported as e:
        record(0, None, None, None, findings=[f"skipped: {e}"])
        return rows
    if multi_step:
        program, oracle = MultiStepDraftProgram(model, spec.num_steps), OracleMultiStep(world, spec)
    else:
        program, oracle = model, OracleBackend(world, spec)
    gcfg = GraphConfig(
        max_bs=max(settings.capture_bs),
        capture_bs=settings.capture_bs,
        max_context_len=L,
        speculative=True,
    )
    runner = GraphRunner(program, backend, engine, mode, gcfg, spec, multi_step)
    runner.capture()
    gen = BatchGenerator(world, spec, seed=settings.seed + 1)
    tol = tolerances(dtype)
    raw_sizes = (0,) if mode.is_idle() else settings.raw_bs
    for raw_bs in raw_sizes:
        findings: list[str] = []
        fb = gen.for_mode(mode, raw_bs, multi_step_draft=multi_step)
        bs = runner.pick_bs(raw_bs)
        # (a) capture path vs replay path
        diffs = capture_vs_replay(entry, runner, fb, bs)
        findings += diffs
        cap_eq = not diffs
        # (b) graph replay vs eager, and no write into another request's KV
        guard = _KVGuard(world, fb)
        graph_out = runner.replay(fb).clone()
        findings += guard.check()
        eager_out = runner.eager(fb).clone()
        g_eq = (
            _close(graph_out, eager_out, tol, "graph vs eager", findings) and not guard.violations
        )
        # (c) eager vs the dense oracle
        oracle.init_forward_metadata(fb)
        ref = program(fb, oracle)
        o_eq = _close(eager_out, ref, tol, "eager vs oracle", findings)
        record(raw_bs, cap_eq, g_eq, o_eq, findings=findings)
        gen.release(fb)
    return rows


class _KVGuard:
    """Snapshot every live KV slot the batch must not write; compare after the replay."""

    def __init__(self, world: World, fb: ForwardBatch):
        own = set(fb.out_cache_loc.tolist())
        live = [s for s in world.live_slots().tolist() if s not in own]
        self.slots = torch.tensor(live, dtype=torch.int64, device=world.device)
        self.world = world
        self.before = [b[self.slots].clone() for b in world.kv_cache.buffers()]
        self.violations = 0

    def check(self) -> list[str]:
        for buf, old in zip(self.world.kv_cache.buffers(), self.before):
            changed = (buf[self.slots] != old).flatten(1).any(1)
            self.violations += int(changed.sum())
        if self.violations:
            return [f"padded or live rows wrote {self.violations} KV slot(s) of other requests"]
        return []


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
    findings.append(
        f"{what}: max abs difference {err:.3g} (rtol {tol['rtol']}, atol {tol['atol']})"
    )
    return False


def run_checks(
    backends: Iterable[str] | None = None,
    modes: Iterable[str] | None = None,
    variants: Iterable[str] | None = None,
    engine: str = "auto",
    settings: CheckSettings | None = None,
) -> list[CheckRecord]:
    settings = settings or CheckSettings()
    eng = make_engine(engine)
    entries = [e for n in (backends or [None]) for e in find(n)]
    if variants:
        entries = [e for e in entries if e.variant in set(variants)]
    case_list = [parse_case(m) for m in modes] if modes else list(CASES)
    rows: list[CheckRecord] = []
    for entry in entries:
        why = entry.why_unavailable()
        if why:
            rows.append(
                CheckRecord(
                    entry.name,
                    entry.variant,
                    "-",
                    0,
                    eng.name,
                    None,
                    None,
                    None,
                    [f"unavailable: {why}"],
                )
            )
            continue
        for case in case_list:
            rows.extend(check_entry_mode(entry, case, eng, settings))
    return rows
