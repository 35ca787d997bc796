"""The graph runner: one graph per captured batch size, padding, eager fallback.

Follows SGLang's ``CudaGraphRunner`` (``python/sglang/srt/model_executor/cuda_graph_runner.py``;
``[facts#the-graph-runner]``). Static inputs are allocated once for the largest batch (at rest every row is a padded
row, ``refimpl.layout``); the backend allocates its graph buffers in ``init_cuda_graph_state``. Capture runs largest
batch first: the capture hook outside the graph, warm-up, then the step. Replay runs four phases (``validate``,
``load_inputs``, ``replay_hook``, ``launch``) on the smallest captured ``bs >= raw_bs``; a batch no graph can serve runs
eagerly. The checker reads ``capture_batch(bs)`` and ``padded_batch(fb)``: what each hook was fed. A backend serves one
live runner, built with the runner's ``SpecConfig``; a replay after the world's KV cache or request table was rebound
is refused (``validate``).

``glue=True``: SGLang 0.5.23's metadata glue graph (``SGLANG_ENABLE_METADATA_GLUE_GRAPH``, [facts#metadata-glue-graph]).
After each step graph, the replay hook fed the static inputs is captured into a small graph of its own
(``capture_glue``), which ``replay_hook`` replays instead of running the hook's Python. Whatever the hook computed on the
host (a Python scalar, a spec input's tensor) is frozen at that capture, so the backend says which modes may be glued
(``glue_refusal``; the checker's verdict (e) tests each claim). A hook it refuses (a FlashInfer ``plan()``) or that a
graph cannot record, or whose first warm-up writes otherwise than its capture (the capture order), stays eager for
that size (``glue_refused``); ``replays`` counts glued and eager hook replays. A
hook split in two (``splits_hook``: FlashInfer's and FlashInfer-MLA's unified ones, SGLang PR #39825's shape) runs its
host phase (the plan) eagerly before each glue replay; the glue graph holds its device phase (``glue_split``).
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import operator
import time
import warnings
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from .. import layout
from ..backends.base import AttentionBackend
from ..batch import ForwardBatch
from ..config import GraphConfig, SpecConfig
from ..kernels.validation import result_size
from ..modes import ForwardMode
from ..spec import dummy_spec_input
from ..validate import BatchRefused, check_batch, check_capture_config, refused_categories, validate_batch
from .engine import GraphCaptureError, GraphEngine, GraphReplayError
from .inputs import StaticInputs
from .recorder import record_ops


@dataclass
class CaptureRecord:
    bs: int
    seconds: float  # wall time of warm-up + capture for this batch size
    pool_bytes: int | None  # CUDA: reserved bytes after this capture; None on the emulator
    pool_growth: int | None  # CUDA: bytes this capture added to the shared pool
    kernels: dict = field(default_factory=dict)


@dataclass
class RunResult:
    logits: torch.Tensor  # [raw_num_tokens, vocab]
    used_graph: bool
    graph_bs: int | None  # the captured size that served the batch (None when eager)
    fallback_reason: str | None = None


# --- the backend hooks, called from a batch, as SGLang 0.5.23's runners call them --------------------
_PLAIN = (int, float, bool, str, type(None))


def freeze_metadata(backend) -> list[tuple[Any, type, dict[str, Any]]]:
    """The ``forward_metadata`` of ``backend`` (and of its step backends) as a graph just captured it, held by address
    as the graph holds it, never by reference (a reference would keep a buffer the backend let go alive: the liveness
    rule could not see it): each tensor field as ``(buffer name, storage address, offset, size, stride)`` into the
    backend's graph buffers, plain values as they are. A holder whose metadata holds anything else is left out."""
    bufs = {t.untyped_storage().data_ptr(): n for n, t in backend.graph_buffers().items()}
    out = []
    for h in (backend, *getattr(backend, "step_backends", ())):
        md, fields = getattr(h, "forward_metadata", None), {}
        for k, v in getattr(md, "__dict__", {"": object()}).items():
            if isinstance(v, torch.Tensor) and (name := bufs.get(ptr := v.untyped_storage().data_ptr())):
                fields[k] = (name, ptr, v.storage_offset(), tuple(v.shape), v.stride())
            elif isinstance(v, _PLAIN):
                fields[k] = v
            else:
                break
        else:
            out.append((h, type(md), fields))
    return out


@contextlib.contextmanager
def thawed(backend, frozen):
    """``backend``'s holders with the metadata ``frozen`` describes (views of the same buffers, when each still has
    the storage the graph captured), restored after."""
    bufs, kept = backend.graph_buffers(), []
    for h, cls, fields in frozen:
        md = object.__new__(cls)
        for k, v in fields.items():
            if isinstance(v, tuple):
                if (buf := bufs.get(v[0])) is None or buf.untyped_storage().data_ptr() != v[1]:
                    break  # the buffer was replaced: the graph reads memory nobody holds (the liveness rule's finding)
                v = buf.as_strided(v[3], v[4], v[2])
            md.__dict__[k] = v
        else:
            kept.append((h, h.forward_metadata))
            h.forward_metadata = md
    try:
        yield
    finally:
        for h, md in kept:
            h.forward_metadata = md


def call_capture_hook(backend, fb: ForwardBatch):
    """Before capturing ``fb``'s size: ``init_forward_metadata_out_graph(fb, in_capture=True)`` (a classic backend's
    capture hook through the base class's default)."""
    _out_graph(backend)(fb, in_capture=True)


def call_replay_hook(backend, fb: ForwardBatch):
    """Before a replay, on the static batch: ``init_forward_metadata_out_graph(fb)`` (a classic backend's replay hook)."""
    _out_graph(backend)(fb)


def _out_graph(backend):  # a duck-typed --backend-class class may implement only the classic pair
    own = getattr(backend, "init_forward_metadata_out_graph", None)
    return own or partial(AttentionBackend.init_forward_metadata_out_graph, backend)


def call_in_graph_hook(backend, fb: ForwardBatch):
    """The metadata a backend rebuilds *inside* the graph (``AttentionBackend.init_forward_metadata_in_graph``, a no-op
    for most), first thing in the captured step."""
    backend.init_forward_metadata_in_graph(fb)


def capture_glue(engine: GraphEngine, backend, fb: ForwardBatch, warmups: int, refusal=None) -> tuple[Any, str | None]:
    """The replay hook fed ``fb`` (views of static inputs) captured into a graph of its own, after ``warmups`` eager
    calls: ``(graph, None)``, or ``(None, why)`` when it may not be or cannot be (a failed capture, contained). A hook
    split in two (``splits_hook``) has its host phase run (as before every glued replay) and only its device phase
    captured. ``refusal(run)``: why the part to glue may not be, given a callable that runs it once (the checker's
    verdict (e) counts the plans it makes); default: the backend's ``glue_refusal`` for a whole hook, none for a device
    phase. With warm-ups, the capture order too: the part to glue writes in the graph what it wrote in its first warm-up
    (a write a first call alone makes, a lazily run plan's, would never replay: vLLM PR #42444's class; ops counted by
    name, so a branch inside one op is not seen)."""
    split = backend.splits_hook(fb.forward_mode)
    glued = (lambda: backend.apply_device_metadata(fb)) if split else (lambda: call_replay_hook(backend, fb))
    first = None  # the first warm-up's writes
    for i in range(warmups):  # each the whole replay hook: a split one's host phase, then the part to glue
        if split:
            backend.prepare_host_metadata(fb)
        if i:
            glued()
            continue
        with record_ops(None, refuse=False) as rec:
            glued()
        first = _writes(rec.names)
    if split:
        backend.prepare_host_metadata(fb)
    if why := refusal(glued) if refusal else None if split else backend.glue_refusal(fb.forward_mode):
        return None, why
    graph = engine.new_graph()
    try:
        with warnings.catch_warnings():  # a hook that launches nothing (in-graph shapes) makes an empty graph: fine
            warnings.filterwarnings("ignore", "The CUDA Graph is empty")
            graph.capture(glued)
    except GraphCaptureError as e:
        return None, f"the replay hook cannot be captured: {e}"
    if first is not None and (lost := first - (got := _writes(graph._op_log))) | (extra := got - first):
        what = [f"{n} x{k} in the first warm-up, not in the graph" for n, k in lost.items()]
        what += [f"{n} x{k} in the graph, not in the first warm-up" for n, k in extra.items()]
        return None, f"capture order: the hook wrote otherwise in its first warm-up than in its capture: {'; '.join(what)}"
    return graph, None


def _writes(names) -> Counter:
    """The ops of an op log (``(name, launches)`` pairs) that launch work and write a tensor they were given (in place,
    ``out=``, a custom op's mutated arguments), counted: what a hook leaves in the buffers. A fresh tensor (a cache a
    first call makes and later calls reuse) writes nothing that existed."""

    def writes(name):  # an op whose schema cannot be found counts as a write (a refusal errs on the eager side)
        try:
            ns, op, overload = name.split(".")
            schema = getattr(getattr(getattr(torch.ops, ns), op), overload)._schema
        except (ValueError, AttributeError, RuntimeError):
            return True
        return any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)

    return Counter(name for name, launches in names if launches and writes(name))


class GraphRunner:
    def __init__(
        self,
        model: Callable[[ForwardBatch, Any], torch.Tensor],
        backend,
        engine: GraphEngine,
        kind: ForwardMode | layout.GraphKind,
        graph_cfg: GraphConfig,
        spec_cfg: SpecConfig | None = None,
        validate_inputs: bool = True,
        glue: bool = False,
    ):
        """``kind``: what the graphs run, a forward mode or a ``layout.GraphKind`` (multi-step draft decode:
        ``layout.KINDS["draft_decode"]``, with a multi-step program and backend)."""
        self.kind = layout.GraphKind.parse(kind)
        mode = self.kind.mode
        if not mode.is_graph_mode():
            raise ValueError(f"{mode.label} is never captured; run it eagerly")
        self.model, self.backend, self.engine = model, backend, engine
        self.mode, self.graph_cfg, self.spec_cfg = mode, graph_cfg, spec_cfg
        self.world = backend.world
        if (built := getattr(backend, "spec", None)) != spec_cfg:  # its buffers are sized by its own spec
            raise BatchRefused(f"runner spec_cfg={spec_cfg} differs from the backend's spec={built}: build both with one")
        if (owner := self._owner(backend)) is not None:  # init_cuda_graph_state would rebind that runner's buffers
            raise BatchRefused(
                f"backend {type(backend).__name__} is owned by a live {owner.kind.label} GraphRunner: a second "
                "init_cuda_graph_state would rebind the buffers its graphs read: build a backend per runner"
            )
        self.device = self.world.device
        self.tokens_per_req = self.kind.rows(spec_cfg)
        self.locs_per_req = self.tokens_per_req * self.kind.cache_writes(spec_cfg)
        self.capture_bs = graph_cfg.batch_sizes()
        self.max_bs = max(self.capture_bs)
        if (pool := self.world.req_to_token_pool.size) <= self.max_bs:
            raise ValueError(f"largest capture bs {self.max_bs} needs a request pool larger than {pool} (slot 0 is reserved)")
        self.max_num_tokens = self.max_bs * self.tokens_per_req
        self.fill_value = backend.get_cuda_graph_seq_len_fill_value()
        self.validate_inputs = validate_inputs  # False: timing runs (refimpl.validate's cost)
        check_capture_config(self)  # before any allocation
        self.inputs = StaticInputs(self.kind, spec_cfg, self.max_bs, self.fill_value, self.device)
        # a replay's device checks, acted on by the load and read at the next call (``validate``, ``synchronize``): the
        # verdict buffer; seq_lens_cpu staged for the device checks and the load's record (1: refused), both in pinned
        # host memory on CUDA, which the kernels read and write in place (no copies); an event after the last kernel
        # that reads or writes them; the pending (batch, verdict entries, loaded)
        pin, i32 = self.device.type == "cuda", torch.int32
        n, m = self.inputs.input_ids.numel(), self.inputs.out_cache_loc.numel()
        self._verdict = torch.empty(result_size(self.max_bs, n, m), dtype=torch.int64, device=self.device)
        # device="cpu" explicit: a torch.set_default_device never moves them
        self._staged = torch.empty(self.max_bs, dtype=i32, device="cpu", pin_memory=pin)
        self._record = torch.zeros(1, dtype=i32, device="cpu", pin_memory=pin)
        self._staged_np = self._staged.numpy() if pin else None
        self._record_np = self._record.numpy()  # read as numpy: about 2 µs of host less than int(self._record[0])
        self._done = torch.cuda.Event() if pin else None
        self._pending, self._heads, self._streams = None, {}, {}  # _streams: _mark_done's, by raw handle
        backend._graph_runner = weakref.ref(self)
        backend.init_cuda_graph_state(self.max_bs, self.max_num_tokens)
        self.graphs, self.outputs = {}, {}  # bs -> its graph / the graph's static output (logits)
        self.frozen = {}  # bs -> the backend's metadata as that graph captured it, by address (freeze_metadata)
        self.glue, self.glue_graphs, self.glue_refused = glue, {}, {}  # bs -> glue graph / why the hook stays eager
        self.glue_split = glue and backend.splits_hook(self.mode)  # the glue graphs hold the device phase only
        self.replays = Counter()  # "glue" / "hook": how each replay's metadata was made
        self.capture_records = []  # a CaptureRecord per captured size
        self._captured_with = ()  # the world objects the graphs write and read (``_bound``), set by capture

    @staticmethod
    def _owner(backend):
        """The live runner ``backend`` serves, if any (one unreachable but not yet collected does not count)."""
        ref = getattr(backend, "_graph_runner", lambda: None)
        if ref() is not None:
            gc.collect()  # a dropped runner in a reference cycle (its graphs' closures) is not live
        return ref()

    def _bound(self):
        """What the graphs write and read in the world: its KV cache (and its layers' tensors), request pool and table."""
        w = self.world
        return (w.kv_cache, w.req_to_token_pool, w.req_to_token, *w.kv_cache.buffers())

    # --- inputs -------------------------------------------------------------------------------
    def capture_batch(self, bs: int, inputs: StaticInputs | None = None) -> ForwardBatch:
        """The batch the capture hook of size ``bs`` sees: all padded rows (views of ``inputs``, default fresh ones at
        rest) + a dummy spec input."""
        spec = dummy_spec_input(self.kind, bs, self.spec_cfg, self.fill_value, self.device)
        return (inputs or self.inputs.at_rest(bs)).batch(bs, self.mode, bs * self.fill_value, spec, self.world)

    def padded_batch(self, fb: ForwardBatch) -> ForwardBatch:
        """What a replay of ``fb`` feeds the backend: ``fb`` padded to its captured size."""
        bs = self.pick_bs(fb.batch_size)
        inputs = self.inputs.at_rest(bs)
        inputs.load(fb, bs)  # the replay's own writer, into fresh inputs
        return self._replay_batch(fb, bs, inputs)

    # --- capture ------------------------------------------------------------------------------
    def capture(self, progress: bool = False) -> list[CaptureRecord]:
        self.backend.check_graph_mode(self.mode)
        order = sorted(self.capture_bs, reverse=True)  # largest first: memory reuse
        if progress:
            from tqdm import tqdm

            order = tqdm(order, desc=f"capture {self.mode.label}")
        self._captured_with, self._heads = self._bound(), {}
        for bs in order:
            t0, mem0 = time.perf_counter(), self.engine.memory_in_use()
            self.inputs.rest()
            fb = self.capture_batch(bs, self.inputs)
            call_capture_hook(self.backend, fb)

            def run_once(fb=fb):
                call_in_graph_hook(self.backend, fb)  # recorded: it replays with the graph
                return self.model(fb, self.backend)

            self.engine.warmup(run_once, self.graph_cfg.num_warmups)
            graph = self.engine.new_graph()
            self.outputs[bs] = graph.capture(run_once)
            self.frozen[bs] = freeze_metadata(self.backend)
            self.graphs[bs] = graph
            if self.glue:
                self.glue_graphs[bs], why = capture_glue(self.engine, self.backend, fb, self.graph_cfg.num_warmups)
                if why:
                    self.glue_refused[bs] = why
            self.engine.synchronize()
            mem1 = self.engine.memory_in_use()
            growth = None if mem1 is None else mem1 - mem0
            record = CaptureRecord(bs, time.perf_counter() - t0, mem1, growth, dict(graph.custom_kernels()))
            self.capture_records.append(record)
        return self.capture_records

    # --- replay -------------------------------------------------------------------------------
    def can_run(self, fb: ForwardBatch) -> tuple[bool, str | None]:
        """Whether ``fb`` can be served by a captured graph, and if not, why."""
        if not self.graphs:
            return False, "no graph captured yet (call capture() first)"
        mode = fb.forward_mode
        if mode != self.mode and not (self.mode.is_decode_or_idle() and mode.is_decode_or_idle()):
            return False, f"mode {mode.label} was not captured (runner: {self.mode.label})"
        raw_bs = fb.batch_size
        if raw_bs > self.max_bs:
            return False, f"batch size {raw_bs} exceeds the largest captured size {self.max_bs}"
        if self.graph_cfg.disable_padding and raw_bs not in self.graphs:
            return False, f"batch size {raw_bs} not captured and padding is disabled"
        expected = raw_bs * self.tokens_per_req
        if fb.num_tokens != expected:
            return False, (
                f"{fb.num_tokens} tokens for {raw_bs} requests; the graph lays out {self.tokens_per_req} per request ({expected})"
            )
        if fb.out_cache_loc.numel() != raw_bs * self.locs_per_req:
            return False, (
                f"out_cache_loc has {fb.out_cache_loc.numel()} entries, the graph expects {raw_bs * self.locs_per_req}"
            )
        return True, None

    def pick_bs(self, raw_bs: int) -> int:
        """The smallest captured batch size >= ``raw_bs`` (an idle batch uses the smallest)."""
        if raw_bs > self.max_bs:
            raise ValueError(f"batch size {raw_bs} exceeds the largest captured size {self.max_bs}")
        return self.capture_bs[bisect.bisect_left(self.capture_bs, max(raw_bs, 1))]

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        """Serve ``fb`` with a graph; raises ``GraphReplayError`` when it cannot."""
        ok, why = self.can_run(fb)
        if not ok:
            raise GraphReplayError(why)
        return self._replay(fb)

    def load_inputs(self, fb: ForwardBatch, bs: int):
        """Replay phase 2: the batch into the static inputs (``StaticInputs.load``, one launch on CUDA), the padded rows reset to
        padded rows. ``padded_batch`` (what the checker feeds the hooks) runs the same writer into fresh inputs. A batch
        whose device checks ``validate`` left pending is loaded under their verdict: refused, as padded rows only."""
        if (p := self._pending) is None or p[0] is not fb:
            return self.inputs.load(fb, bs)
        self.inputs.load(fb, bs, self._head("_verdict", p[1]), self._record, self._head("_staged", fb.batch_size))
        self._mark_done()
        p[2] = True

    def _stage(self, seq_lens_cpu: torch.Tensor) -> torch.Tensor:
        """``seq_lens_cpu`` where the device checks read it, without a sync: on CUDA the pinned buffer the kernels read
        in place (rewritten once the last kernel that reads it has run: ``_done``)."""
        k = seq_lens_cpu.numel()
        if self._done is None:
            return self._head("_staged", k).copy_(seq_lens_cpu)
        self._done.synchronize()  # usually complete: validate's synchronize() waited for the last load
        self._staged_np[:k] = seq_lens_cpu.numpy()  # numpy: a few µs less than torch's copy_
        return self._head("_staged", k)

    def _head(self, name: str, k: int, bs: int | None = None) -> torch.Tensor:
        """``getattr(self, name)[:k]`` (a staging buffer: ``_staged``, ``_verdict``) or ``self.outputs[bs][:k]``, made once
        per key (``capture`` forgets them): a slice costs about 1 µs of host a call (``benchmarks/host_python.py``)."""
        if (view := self._heads.get((name, k, bs))) is None:
            whole = getattr(self, name) if bs is None else getattr(self, name)[bs]
            view = self._heads[name, k, bs] = whole[:k]
        return view

    def _mark_done(self):
        """Record ``_done`` after the kernels just launched (the device checks, the load) on the current stream: its
        ``torch.cuda.Stream`` made once per raw handle (``current_stream`` parses the device and builds one in Python each
        call: its ``_get_device_index`` took 15 µs a call, profiler included, in the H200 profile of
        ``benchmarks/results/default_path/verdict_step/``; two calls a replay)."""
        if self._done is not None:
            raw = torch._C._cuda_getCurrentRawStream(self._verdict.device.index)  # as _op.direct_launch reads it
            if (stream := self._streams.get(raw)) is None:
                stream = self._streams[raw] = torch.cuda.current_stream(self._verdict.device)
            self._done.record(stream)

    def synchronize(self):
        """Raise the refusal the last replay's device checks found (``refimpl.validate``), if any: the message
        ``validate_batch`` gives that batch, plus where it was found. Every ``validate`` calls it first; call it after a
        replay to know at once (it waits for that replay's input load, not for its graph)."""
        if (p := self._pending) is None:
            return
        self._pending = None
        fb, entries, loaded = p
        if loaded:
            if self._done is not None:
                self._done.synchronize()  # the load has written the record
            if not self._record_np[0]:
                return
        if not (found := refused_categories(self._verdict, entries)):
            return
        where = (
            "(found by the device checks of the last replay, which ran as padded rows only: no KV slot of a request was written)"
            if loaded
            else "(found by the device checks of the last validate; that batch was never loaded)"
        )
        try:
            validate_batch(fb, self.spec_cfg, self.kind, True, world=self.world)
        except BatchRefused as e:
            raise BatchRefused(f"{e} {where}") from None
        raise BatchRefused(
            f"a replayed batch broke the device rules {found} {where}; its tensors changed before they could be named"
        )

    def _replay_batch(self, fb: ForwardBatch, bs: int, inputs: StaticInputs | None = None) -> ForwardBatch:
        """The static batch of size ``bs`` the replay hook sees after ``load_inputs(fb)`` (into ``inputs``, default the
        runner's)."""
        total = layout.padded_seq_lens_sum(fb.seq_lens_sum, fb.batch_size, bs, self.fill_value)
        return (inputs or self.inputs).batch(bs, self.mode, total, fb.spec_info, self.world)

    # --- the replay's phases: replay() runs them in order, the bench times each -------------------
    def validate(self, fb: ForwardBatch, for_graph: bool = True) -> ForwardBatch:
        """Phase 1: refuse ``fb`` before anything is written (``refimpl.validate``), and a graph replay after the world's
        KV cache or request table was rebound (identity checks); returns ``fb`` with any non-contiguous tensor copied.
        A graph replay's device rules are not waited for: ``load_inputs`` acts on them, ``synchronize`` (the next call's
        first step) raises what they found."""
        self.synchronize()
        # every replay: identity checks over a tuple; the names are built only for a refusal
        if for_graph and self._captured_with and any(map(operator.is_not, bound := self._bound(), self._captured_with)):
            names = "world.kv_cache world.req_to_token_pool world.req_to_token_pool.req_to_token".split()
            names += [f"world.kv_cache.buffers()[{i}]" for i in range(len(bound) - 3)]
            moved = [k for k, a, b in zip(names, bound, self._captured_with) if a is not b]
            why = "the graphs write and read the objects bound at capture: restore them or build and capture a new runner"
            raise BatchRefused(f"{', '.join(moved)} rebound after capture: {why}")
        if not for_graph:
            return validate_batch(fb, self.spec_cfg, self.kind, False, world=self.world)
        if type(raw_bs := fb.batch_size) is int and raw_bs > self.max_bs:  # (replay's can_run says so first)
            raise BatchRefused(f"ForwardBatch.batch_size={raw_bs}: exceeds the largest captured size {self.max_bs}")
        try:
            fb, entries = check_batch(fb, self.spec_cfg, self.kind, True, self.world, self._verdict, self._stage)
        finally:  # the device checks read the staged lengths, also when a host rule refused the batch after their launch
            self._mark_done()
        self._pending = None if entries is None else [fb, entries, False]
        return fb

    def replay_hook(self, fb: ForwardBatch, bs: int) -> ForwardBatch:
        """Phase 3: the backend's replay hook on the static batch (after ``load_inputs``), or its glue graph."""
        view, glue = self._replay_batch(fb, bs), self.glue_graphs.get(bs)
        if glue is None:
            call_replay_hook(self.backend, view)
        else:
            if self.glue_split:  # a split hook: its host phase eagerly, then the glued device phase
                self.backend.prepare_host_metadata(view)
            glue.replay()
        self.replays["hook" if glue is None else "glue"] += 1
        return view

    def launch(self, bs: int) -> torch.Tensor:
        """Phase 4: ``graph.replay()``; the ``bs`` graph's whole static output."""
        self.graphs[bs].replay()
        return self.outputs[bs]

    def _replay(self, fb: ForwardBatch) -> torch.Tensor:
        """The replay path proper (``can_run`` already said yes): the four phases."""
        if self.validate_inputs:
            fb = self.validate(fb)
        bs = self.pick_bs(fb.batch_size)
        self.load_inputs(fb, bs)
        self.replay_hook(fb, bs)
        self.launch(bs)
        return self._head("outputs", fb.num_tokens, bs)  # a view of the graph's static output

    def eager(self, fb: ForwardBatch) -> torch.Tensor:
        if self.validate_inputs:
            fb = self.validate(fb, for_graph=False)
        self.backend.init_forward_metadata(fb)
        return self.model(fb, self.backend)

    def run(self, fb: ForwardBatch) -> RunResult:
        """Replay when possible, else run eagerly and report the reason."""
        ok, why = self.can_run(fb)
        if ok:
            return RunResult(self._replay(fb), True, self.pick_bs(fb.batch_size))
        return RunResult(self.eager(fb), False, None, why)
