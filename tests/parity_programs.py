"""Small programs that exercise the graph contract, for emulator / CUDA-graph parity tests.

Not collected by pytest (no ``test_`` prefix); ``test_emulator_parity.py`` drives them. Each
program is a ``Program`` with

- ``setup(device)``: the static tensors (a ``SimpleNamespace``); every value comes from a fixed
  seed on a CPU generator, so CPU and CUDA runs start from the same numbers;
- ``step(state, key)``: the body of the captured callable (``key`` names the graph when a program
  captures several; one-graph programs ignore it);
- ``mutate(state, k)``: new inputs, written in place (or, for a pitfall, rebound) before replay k;
- ``expected(state, key)``: optional, what replay k must give; stale pitfalls use it for the
  frozen result that differs from an eager re-execution of ``step``;
- ``capture_error``: the exception class capture must raise (pitfalls), else ``None``;
  ``stale``: the replay must equal ``expected`` and differ from eager re-execution at least once.

``run_program(program, engine)`` runs one program under one engine and returns a ``Trace``: the
capture outcome and, per replay, the graph's outputs (cloned right after that replay), an eager
re-execution of ``step`` on a deep copy of the state taken just before the replay, and
``expected``. Run as a script (``python tests/parity_programs.py NAME``) it runs one program under
``CPUEmulatorEngine()`` and then ``CUDAGraphEngine`` and prints one ``PARITY-RESULT <json>`` line:
the GPU tests use that for the programs whose capture fails, because a failed CUDA capture can
poison process-wide CUDA state (``tests/test_gpu.py`` isolates such captures the same way).
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

import refimpl  # noqa: F401  (switches the Triton interpreter on before any kernel is defined)
from refimpl.graphs import GraphCaptureError, GraphEngine
from refimpl.kernels import build_kv_indices, dense_paged_attention

WARMUP = 2  # eager runs before capture, as SGLang / GraphRunner ask (the CPU emulator runs one: nothing to initialise)


def _rand(seed: int, *shape: int, device, lo: float = -1.0, hi: float = 1.0) -> torch.Tensor:
    """float32 uniform in [lo, hi), from a seeded CPU generator: the same numbers on any device."""
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=g) * (hi - lo) + lo).to(device)


def _randint(seed: int, low: int, high: int, *shape: int, device, dtype=torch.int32):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, shape, generator=g).to(device=device, dtype=dtype)


def _perm(seed: int, n: int, *, device, dtype=torch.int32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=g).to(device=device, dtype=dtype)


def as_tuple(out) -> tuple[torch.Tensor, ...]:
    if out is None:
        return ()
    if isinstance(out, torch.Tensor):
        return (out,)
    return tuple(out)


class Program:
    name = "?"
    keys: tuple[str, ...] = ("main",)  # the graphs, in capture order
    replays = 4
    capture_error: type[Exception] | None = None
    stale = False

    def setup(self, device) -> SimpleNamespace:
        raise NotImplementedError

    def step(self, state: SimpleNamespace, key: str = "main"):
        raise NotImplementedError

    def mutate(self, state: SimpleNamespace, k: int) -> None:
        pass

    def expected(self, state: SimpleNamespace, key: str = "main"):
        return None

    def schedule(self, k: int) -> str:
        """Which graph replay k replays."""
        return self.keys[k % len(self.keys)]

    def __repr__(self) -> str:
        return self.name


# ----------------------------------------------------------------------------------------------
# 1. plain pointwise + matmul + in-place copies into static outputs


class PointwiseMatmul(Program):
    """sin(x @ w) * 2 + b, written into static outputs with ``copy_`` and ``out=``, plus a fresh
    reduction; every replay must give the result for the inputs copied in just before it."""

    name = "pointwise_matmul"

    def setup(self, device):
        return SimpleNamespace(
            x=_rand(1, 4, 8, device=device),
            w=_rand(2, 8, 6, device=device),
            b=_rand(3, 6, device=device),
            y=torch.zeros(4, 6, device=device),  # static outputs, allocated before capture
            z=torch.zeros(4, 8, device=device),
            h=torch.zeros(4, 6, device=device),
        )

    def step(self, s, key="main"):
        pre = torch.sin(s.x @ s.w) * 2 + s.b
        s.y.copy_(pre)
        s.z.copy_(torch.relu(s.x) - 0.25)
        torch.mul(pre, 0.5, out=s.h)
        return s.y, s.z, s.h, pre.sum(0)  # the last one is a fresh tensor (the graph's own)

    def mutate(self, s, k):
        s.x.copy_(_rand(100 + k, 4, 8, device=s.x.device))
        if k == 2:
            s.w.copy_(_rand(200 + k, 8, 6, device=s.w.device))  # weights updated in place


# ----------------------------------------------------------------------------------------------
# 2. registered refimpl kernels inside the step


class PagedAttentionKernels(Program):
    """kv_indptr = [0, cumsum(seq_lens)], ``refimpl.build_kv_indices`` (Triton) and
    ``refimpl.dense_paged_attention``; replays change seq_lens, request rows, q and one KV slot."""

    name = "kernels_paged_attention"
    BS, POOL, L, SLOTS, H, HKV, D = 3, 4, 16, 80, 4, 2, 8

    def setup(self, device):
        bs, pool, L, slots = self.BS, self.POOL, self.L, self.SLOTS
        # token slots 1..slots-1 (0 reserved), each used once across the request rows
        r2t = (_perm(10, slots - 1, device=device)[: pool * L] + 1).reshape(pool, L)
        return SimpleNamespace(
            req_to_token=r2t.contiguous(),
            req_pool_indices=torch.tensor([2, 0, 3], dtype=torch.int32, device=device),
            seq_lens=torch.tensor([5, 16, 1], dtype=torch.int32, device=device),
            kv_indptr=torch.zeros(bs + 1, dtype=torch.int32, device=device),
            kv_indices=torch.zeros(bs * L, dtype=torch.int32, device=device),
            q=_rand(11, bs, self.H, self.D, device=device),
            k_cache=_rand(12, slots, self.HKV, self.D, device=device),
            v_cache=_rand(13, slots, self.HKV, self.D, device=device),
            out=torch.zeros(bs, self.H, self.D, device=device),
        )

    def step(self, s, key="main"):
        s.kv_indptr[1:].copy_(torch.cumsum(s.seq_lens, 0))
        build_kv_indices(s.req_to_token, s.req_pool_indices, s.seq_lens, s.kv_indptr, s.kv_indices)
        dense_paged_attention(
            s.q,
            s.k_cache,
            s.v_cache,
            s.kv_indptr,
            s.kv_indices,
            s.out,
            sm_scale=self.D**-0.5,
            max_kv_len=self.L,  # a bound that holds for every replay: fine to freeze
            q_per_req=1,
        )
        return s.out, s.kv_indptr, s.kv_indices

    def mutate(self, s, k):
        dev = s.q.device
        s.seq_lens.copy_(_randint(300 + k, 1, self.L + 1, self.BS, device=dev))
        s.req_pool_indices.copy_(_perm(400 + k, self.POOL, device=dev)[: self.BS])
        s.q.copy_(_rand(500 + k, self.BS, self.H, self.D, device=dev))
        slot = 1 + (7 * k) % (self.SLOTS - 1)  # "a new token's KV" written into the cache
        s.k_cache[slot].copy_(_rand(600 + k, self.HKV, self.D, device=dev))
        s.v_cache[slot].copy_(_rand(700 + k, self.HKV, self.D, device=dev))


# ----------------------------------------------------------------------------------------------
# 3. pitfall: host synchronisation during capture


def _sync_item(s):
    n = s.x.abs().sum().item()
    return s.x * n


def _sync_branch(s):
    if (s.x > 0).any():  # bool(tensor): the branch needs the value on the host
        return s.x + 1
    return s.x - 1


def _sync_tolist(s):
    return s.x * len([v for v in s.x.tolist() if v > 0])


def _sync_nonzero(s):
    return torch.nonzero(s.x > 0).float().sum(0)


class HostSync(Program):
    """A host read inside the step: capture raises GraphCaptureError on every engine."""

    capture_error = GraphCaptureError
    KINDS: dict[str, Callable] = {"item": _sync_item, "branch": _sync_branch, "tolist": _sync_tolist, "nonzero": _sync_nonzero}

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.name = f"host_sync_{kind}"

    def setup(self, device):
        return SimpleNamespace(x=_rand(20, 8, device=device))

    def step(self, s, key="main"):
        return self.KINDS[self.kind](s)


# ----------------------------------------------------------------------------------------------
# 4. pitfall: a Python scalar (and a slice length) frozen at capture


class FrozenScalar(Program):
    """``scale`` and ``n`` are read from tensors *before* capture and passed as Python numbers;
    ``mutate`` updates both tensors and re-reads the Python values, but replay keeps the old
    ones: the output keeps the captured shape and the captured scale."""

    name = "frozen_python_scalar"
    stale = True

    def setup(self, device):
        s = SimpleNamespace(
            x=_rand(30, 8, device=device), scale_t=torch.tensor([1.5], device=device), n_t=torch.tensor([3], device=device)
        )
        s.scale, s.n = float(s.scale_t), int(s.n_t)  # host reads, outside capture: allowed
        s.scale0, s.n0 = s.scale, s.n  # what the graph freezes
        return s

    def step(self, s, key="main"):
        return s.x[: s.n] * s.scale + 1.0

    def mutate(self, s, k):
        s.x.copy_(_rand(800 + k, 8, device=s.x.device))
        s.scale_t.fill_(2.0 + k)
        s.n_t.fill_(4 + k)
        s.scale, s.n = float(s.scale_t), int(s.n_t)  # too late: the graph froze scale0, n0

    def expected(self, s, key="main"):
        return (s.x[: s.n0] * s.scale0 + 1.0,)


# ----------------------------------------------------------------------------------------------
# 5. pitfall: a fresh tensor rebound after capture


class RebindBuffer(Program):
    """``state.buf = new_tensor`` after capture: replay keeps reading the captured buffer (only an
    in-place write into that buffer is seen). The captured buffer is kept alive in
    ``state.captured``: on CUDA, freeing it would let the caching allocator hand its block to
    the new tensor, and the graph would then read whatever lands there (see the test module)."""

    name = "rebind_fresh_buffer"
    stale = True

    def setup(self, device):
        s = SimpleNamespace(x=_rand(40, 6, device=device), buf=_rand(41, 6, device=device))
        s.captured = s.buf
        return s

    def step(self, s, key="main"):
        return s.x * s.buf + 1.0

    def mutate(self, s, k):
        dev = s.x.device
        s.x.copy_(_rand(900 + k, 6, device=dev))
        s.buf = _rand(1000 + k, 6, device=dev)  # the bug: a fresh tensor, invisible to the graph
        if k == 2:
            s.captured.mul_(-2.0)  # writing the captured buffer in place is seen

    def expected(self, s, key="main"):
        return (s.x * s.captured + 1.0,)


# ----------------------------------------------------------------------------------------------
# 6. pitfall: data-dependent output shape


def _shape_static_mask(s):
    return s.x[s.mask] * 2  # boolean-mask indexing with a static mask input


def _shape_value_mask(s):
    return s.x[s.x > 0].sum()  # a mask computed from the values


class DataDependentShape(Program):
    """An op whose output shape depends on tensor values: GraphCaptureError on every engine."""

    capture_error = GraphCaptureError
    KINDS: dict[str, Callable] = {"static_mask": _shape_static_mask, "value_mask": _shape_value_mask}

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.name = f"data_dependent_shape_{kind}"

    def setup(self, device):
        x = _rand(50, 8, device=device)
        return SimpleNamespace(x=x, mask=_rand(51, 8, device=device) > 0)

    def step(self, s, key="main"):
        return self.KINDS[self.kind](s)


# ----------------------------------------------------------------------------------------------
# 7. accumulation: an in-place update of an input, replayed every time


class Accumulate(Program):
    """``acc.add_(x)`` inside the graph: every replay applies it again, so the outputs form a
    running sum (x changes only every other replay). ``mutate(state, 0)`` resets ``acc``: the
    warm-up runs and the capture itself leave engine-specific state behind (the emulator runs
    the step at capture, CUDA capture only records it), so the sequence starts after capture."""

    name = "accumulate_in_place"
    replays = 6

    def setup(self, device):
        return SimpleNamespace(
            acc0=_rand(60, 4, 4, device=device),
            acc=_rand(60, 4, 4, device=device),
            x=_rand(61, 4, 4, device=device),
            w=_rand(62, 4, 4, device=device),
            ref=torch.zeros(4, 4, device=device),  # the running sum the graph must reproduce
        )

    def step(self, s, key="main"):
        s.acc.add_(s.x)
        return s.acc, torch.tanh(s.acc @ s.w)

    def mutate(self, s, k):
        if k == 0:
            s.acc.copy_(s.acc0)
            s.ref.copy_(s.acc0)
        if k % 2 == 0:
            s.x.copy_(_rand(1100 + k, 4, 4, device=s.x.device))
        s.ref.add_(s.x)  # not read by the step

    def expected(self, s, key="main"):
        return (s.ref.clone(), torch.tanh(s.ref @ s.w))


# ----------------------------------------------------------------------------------------------
# 8. several graphs on one engine, captured largest first, replayed interleaved


class MultiGraph(Program):
    """One graph per batch size (4, 2, 1) over shared static inputs, captured largest first on
    one engine (the CUDA engine shares its memory pool), replayed in an interleaved order.
    Each graph's output is read right after its own replay: with a shared pool, a later replay
    of another graph may reuse that memory (CUDA), which the emulator does not model."""

    name = "multi_graph_shared_engine"
    keys = ("bs4", "bs2", "bs1")
    ORDER = ("bs2", "bs4", "bs1", "bs1", "bs4", "bs2", "bs4", "bs1")
    replays = len(ORDER)

    def setup(self, device):
        return SimpleNamespace(
            x=_rand(70, 4, 8, device=device), w=_rand(71, 8, 8, device=device), bias=_rand(72, 8, device=device)
        )

    def step(self, s, key="main"):
        bs = int(key[2:])
        h = s.x[:bs] @ s.w
        return torch.relu(h) + s.bias, h.square().sum(1)

    def mutate(self, s, k):
        s.x.copy_(_rand(1200 + k, 4, 8, device=s.x.device))

    def schedule(self, k):
        return self.ORDER[k]


PROGRAMS: list[Program] = [
    PointwiseMatmul(),
    PagedAttentionKernels(),
    *(HostSync(kind) for kind in HostSync.KINDS),
    FrozenScalar(),
    RebindBuffer(),
    *(DataDependentShape(kind) for kind in DataDependentShape.KINDS),
    Accumulate(),
    MultiGraph(),
]


class DeviceToHostCopy(Program):
    """``.to("cpu")`` of a device tensor inside the step: CUDA stream capture refuses the
    synchronous device-to-host copy. Not in ``PROGRAMS``: on CPU it is no copy at all, and the
    emulator on CUDA tensors does not refuse it (only ``tolist/cpu/numpy`` are patched), a known
    divergence pinned by an xfail GPU test."""

    name = "device_to_host_copy"
    capture_error = GraphCaptureError

    def setup(self, device):
        return SimpleNamespace(x=_rand(80, 8, device=device))

    def step(self, s, key="main"):
        return s.x * 2, s.x.to("cpu")


KNOWN_DIVERGENCES: list[Program] = [DeviceToHostCopy()]


def by_name(name: str) -> Program:
    for p in PROGRAMS + KNOWN_DIVERGENCES:
        if p.name == name:
            return p
    raise KeyError(name)


# ----------------------------------------------------------------------------------------------
# the harness


@dataclass
class ReplayRecord:
    key: str
    graph: tuple[torch.Tensor, ...]  # the graph's outputs, cloned right after this replay
    eager: tuple[torch.Tensor, ...]  # step() re-executed on a copy of the pre-replay state
    expected: tuple[torch.Tensor, ...] | None


@dataclass
class Trace:
    engine: str
    error: type[BaseException] | None = None
    message: str = ""
    captured: dict[str, bool] = field(default_factory=dict)
    kernels: dict[str, dict[str, int]] = field(default_factory=dict)
    addresses_stable: bool = True  # every output kept its captured data_ptr
    replays: list[ReplayRecord] = field(default_factory=list)


def run_program(program: Program, engine: GraphEngine, warmup: int = WARMUP) -> Trace:
    """Set up, warm up, capture every graph (in ``program.keys`` order), then for each replay k:
    ``mutate(state, k)``, record eager / expected, replay, synchronize, clone the outputs."""
    trace = Trace(engine=engine.name)
    state = program.setup(engine.device)
    graphs, outs = {}, {}
    for key in program.keys:

        def fn(key=key):
            return program.step(state, key)

        engine.warmup(fn, warmup)
        g = engine.new_graph()
        try:
            outs[key] = as_tuple(g.capture(fn))
        except Exception as e:  # the pitfall programs: the class is what the tests compare
            trace.error, trace.message = type(e), str(e)
            trace.captured[key] = g.captured
            return trace
        trace.captured[key] = g.captured
        trace.kernels[key] = dict(g.kernels())
        graphs[key] = g
    ptrs = {key: [t.data_ptr() for t in out] for key, out in outs.items()}
    for k in range(program.replays):
        key = program.schedule(k)
        program.mutate(state, k)
        eager = tuple(t.clone() for t in as_tuple(program.step(copy.deepcopy(state), key)))
        exp = program.expected(state, key)
        exp = None if exp is None else tuple(t.clone() for t in as_tuple(exp))
        engine.synchronize()
        graphs[key].replay()
        engine.synchronize()
        got = tuple(t.clone() for t in outs[key])
        trace.replays.append(ReplayRecord(key, got, eager, exp))
    trace.addresses_stable = all([t.data_ptr() for t in out] == ptrs[key] for key, out in outs.items())
    return trace


def _summary(trace: Trace) -> dict:
    return {
        "engine": trace.engine,
        "error": None if trace.error is None else trace.error.__name__,
        "message": trace.message.splitlines()[0] if trace.message else "",
        "captured": trace.captured,
        "replays": len(trace.replays),
    }


def main(argv: list[str]) -> None:
    """``python tests/parity_programs.py NAME``: the emulator (on CUDA tensors), then CUDA graphs."""
    from refimpl.graphs import CPUEmulatorEngine
    from refimpl.graphs.cuda import CUDAGraphEngine

    program = by_name(argv[0])
    result = {}
    for engine in (CPUEmulatorEngine(), CUDAGraphEngine()):  # the CUDA capture last: it may poison
        result[engine.name] = _summary(run_program(program, engine))
    print("PARITY-RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
