"""The bad-input table: every row is a batch (or a runner configuration) a hostile or careless
caller can build through the public API, the exception it must raise, a fragment of the message,
and — for every row — proof that nothing was written: each static buffer of the runner and its
backend, the KV cache and the request table are bit-for-bit what they were before the call.

docs/reference.md's "Bad input" section lists this table; ``test_readme_lists_the_table`` keeps them in step.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from refimpl.backends import find
from refimpl.batch import ForwardBatch, World
from refimpl.batchgen import BatchGenerator
from refimpl.config import CHAIN, GraphConfig, ModelConfig, SpecConfig
from refimpl.graphs import CPUEmulatorEngine
from refimpl.graphs.runner import GraphRunner
from refimpl.layout import GraphKind
from refimpl.model import MultiStepDraftProgram, TinyDecoder
from refimpl.modes import ForwardMode
from refimpl.spec import DraftDecodeInput, VerifyInput, make_draft_extend_input
from refimpl.validate import BatchRefused, _tensor_fields

L, POOL = 40, 24
SPEC = CHAIN
TREE = SpecConfig(num_steps=2, topk=2, num_draft_tokens=5)


@dataclass
class Setup:
    runner: GraphRunner
    gen: BatchGenerator
    world: World
    undo: list[Callable[[], object]] = field(default_factory=list)  # a case's edits of the world, put back after it


def _setup(case: str, backend: str = "torch_native") -> Setup:
    mode, spec, multi = {
        "decode": (ForwardMode.DECODE, None, False),
        "verify": (ForwardMode.TARGET_VERIFY, SPEC, False),
        "draft_extend": (ForwardMode.DRAFT_EXTEND, SPEC, False),
        "draft_decode": (ForwardMode.DECODE, TREE, True),
    }[case]
    cfg = ModelConfig()
    world = World.create(cfg, max_context_len=L, pool_size=POOL, seed=0)
    world.randomize_kv(0)
    entry = next(e for e in find(backend) if e.variant == "unified")
    model = TinyDecoder(cfg)
    program = MultiStepDraftProgram(model, spec.num_steps) if multi else model
    gcfg = GraphConfig(max_bs=4, capture_bs=(1, 2, 4), max_context_len=L, speculative=True)
    kind = GraphKind.parse("draft_decode" if multi else mode)
    runner = GraphRunner(program, entry.load(multi)(world, spec), CPUEmulatorEngine(), kind, gcfg, spec)
    runner.capture()
    return Setup(runner, BatchGenerator(world, spec, seed=7), world)


_SETUPS: dict[tuple[str, str], Setup] = {}


def setup_for(case: str, backend: str = "torch_native") -> Setup:
    if (case, backend) not in _SETUPS:
        _SETUPS[(case, backend)] = _setup(case, backend)
    return _SETUPS[(case, backend)]


def _tensors(obj, seen: set[int], out: list[torch.Tensor]) -> None:
    """Every tensor reachable from ``obj``'s attributes (buffers, wrappers, step backends)."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        out.append(obj)
        return
    if isinstance(obj, dict):
        items = obj.values()
    elif isinstance(obj, list | tuple):
        items = obj
    elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("refimpl"):
        items = vars(obj).values()
    else:
        return
    for v in items:
        _tensors(v, seen, out)


# the runner's device-check scratch (the verdict, the staged host lengths, the load's record, and the views of them it
# keeps in _heads): written by every validation, read by no graph
CHECK_SCRATCH = ("_verdict", "_staged", "_record")


def snapshot(s: Setup) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out: list[torch.Tensor] = []
    seen: set[int] = {id(t) for t in (*(getattr(s.runner, k) for k in CHECK_SCRATCH), *s.runner._heads.values())}
    _tensors(s.runner, seen, out)
    _tensors(s.world, seen, out)
    return [(t, t.detach().clone()) for t in out if t.device.type != "meta"]


def unchanged(snap) -> list[int]:
    """Indices of the snapshot's tensors that changed (NaN equals NaN)."""
    bad = []
    for i, (t, old) in enumerate(snap):
        same = t.shape == old.shape and bool(
            ((t == old) | (t.isnan() & old.isnan()) if t.is_floating_point() else t == old).all()
        )
        if not same:
            bad.append(i)
    return bad


def _i32(v) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.int32)


# --- the cases: (setup, batch) -> the call that must refuse ----------------------------------------
Call = Callable[[], object]


def _with_seq(fb: ForwardBatch, host: list[int], device: list[int] | None = None) -> ForwardBatch:
    dev = _i32(device if device is not None else host).to(fb.device)
    return fb.replace(seq_lens_cpu=_i32(host), seq_lens=dev, seq_lens_sum=sum(host))


def _device_one_short(s: Setup, fb: ForwardBatch) -> ForwardBatch:
    """Device lengths one short and each row writing the slot of the device's last position: only the host / device
    comparison refuses it (a FlashInfer plan would follow the host lengths, the kernels the device's)."""
    seq = fb.seq_lens - 1
    loc = s.world.req_to_token[fb.req_pool_indices, (seq - 1).long()].long()
    return fb.replace(seq_lens=seq, out_cache_loc=loc, positions=(seq - 1).long())


def _other_world(s: Setup, fb: ForwardBatch) -> ForwardBatch:
    """The same batch against another World of the same sizes (its requests and slots mean nothing here)."""
    twin = World.create(s.world.cfg, max_context_len=L, pool_size=POOL, seed=0)
    return fb.replace(world=twin)


def _foreign_slot(s: Setup, fb: ForwardBatch) -> ForwardBatch:
    other = s.gen.decode(1)  # a live request outside the batch
    loc = fb.out_cache_loc.clone()
    loc[0] = other.out_cache_loc[0]
    return fb.replace(out_cache_loc=loc)


def _swap_slots(fb: ForwardBatch) -> ForwardBatch:
    return fb.replace(out_cache_loc=fb.out_cache_loc.flip(0))


def _set(t: torch.Tensor, i: int, v: int) -> torch.Tensor:
    t = t.clone()
    t[i] = v
    return t


def _verify_with(fb: ForwardBatch, **kw) -> ForwardBatch:
    return fb.replace(spec_info=dataclasses.replace(fb.spec_info, **kw))


def _blind_draft_1(fb: ForwardBatch) -> ForwardBatch:
    """Request 0's draft 1 no longer sees itself (its diagonal entry of the tree mask, row-major [N, seq + N])."""
    s, n = int(fb.seq_lens_cpu[0]), fb.spec_info.draft_token_num
    return _verify_with(fb, custom_mask=_set(fb.spec_info.custom_mask, (s + n) + s + 1, False))


def _accept(fb: ForwardBatch, acc: list[int], host: list[int] | None = None) -> ForwardBatch:
    dev = torch.tensor(acc, dtype=torch.int32, device=fb.device)
    return _verify_with(fb, accept_length=dev, accept_length_cpu=host if host else acc)


def _edit_table(s: Setup, row: int, col: int, value: int) -> None:
    """One request-table entry set (the test puts it back)."""
    old = int(s.world.req_to_token[row, col])
    s.world.req_to_token[row, col] = value
    s.undo.append(lambda: s.world.req_to_token[row, col].fill_(old))


def _held_outside(s: Setup, fb: ForwardBatch) -> ForwardBatch:
    """A live request outside the batch holds row 0's new slot too, as its position 3."""
    _edit_table(s, int(s.gen.decode(1).req_pool_indices[0]), 3, int(fb.out_cache_loc[0]))
    return fb


def _rebind(s: Setup, fb: ForwardBatch, obj, name: str) -> ForwardBatch:
    """``obj.name`` replaced by a copy after capture (the test binds the original back)."""
    old = getattr(obj, name)
    setattr(obj, name, old.clone() if isinstance(old, torch.Tensor) else copy.deepcopy(old))
    s.undo.append(lambda: setattr(obj, name, old))
    return fb


def _draft_indices(s: Setup, fb: ForwardBatch, slots: list[int], per_row: int = 3, **kw) -> ForwardBatch:
    """The batch's DraftDecodeInput carrying its own kv indices: ``per_row`` entries a row."""
    spec, dev = fb.spec_info or DraftDecodeInput(TREE.topk, TREE.num_steps), fb.device
    ptr = torch.arange(len(slots) // per_row + 1, dtype=torch.int32, device=dev) * per_row
    idx = torch.tensor(slots, dtype=torch.int64, device=dev)
    return fb.replace(spec_info=dataclasses.replace(spec, **{"kv_indptr": ptr, "kv_indices": idx, **kw}))


def _own_slots(s: Setup, fb: ForwardBatch, r: int) -> list[int]:
    return s.world.req_to_token[int(fb.req_pool_indices[r]), :3].tolist()


def _runner_on(s: Setup, backend, spec) -> Callable[[], GraphRunner]:
    r = s.runner
    return lambda: GraphRunner(r.model, backend, CPUEmulatorEngine(), r.kind, r.graph_cfg, spec)


def _last_step_out_of_range(s: Setup, fb: ForwardBatch) -> ForwardBatch:
    loc = fb.out_cache_loc.clone()
    loc[-1] = s.world.kv_cache.num_slots + 3  # the last step's last row: found before step 0
    return fb.replace(out_cache_loc=loc)


@dataclass
class Case:
    id: str
    setup: str  # decode | verify | draft_extend | draft_decode
    bad: Callable[[Setup, ForwardBatch], ForwardBatch]  # build: a call that builds a runner
    fragment: str  # a regex the message must contain
    call: str = "replay"  # replay | eager | build
    exc: type[Exception] = BatchRefused
    on: str = ""  # the backend, when not the setup's own

    @property
    def backend(self) -> str:  # torch_native has no draft-extend graph nor multi-step backend
        return self.on or ("triton" if self.setup in ("draft_extend", "draft_decode") else "torch_native")


CASES = [
    Case(
        "device seq_lens past the context, host copy fine",
        "decode",
        lambda s, fb: _with_seq(fb, fb.seq_lens_cpu.tolist(), [L + 50, 3]),
        r"seq_lens \(device\)=\[90, 3\]: disagrees with seq_lens_cpu",
    ),
    Case(
        "device seq_lens one short of the host copy, its write consistent with the device's",
        "decode",
        lambda s, fb: _device_one_short(s, fb),
        r"seq_lens \(device\)=\[8, 16\]: disagrees with seq_lens_cpu=\[9, 17\]",
    ),
    Case(
        "same, eager path",
        "decode",
        lambda s, fb: _with_seq(fb, fb.seq_lens_cpu.tolist(), [L + 50, 3]),
        r"disagrees with seq_lens_cpu",
        call="eager",
    ),
    Case(
        "seq_len past the context",
        "decode",
        lambda s, fb: _with_seq(fb, [L + 1, 3]),
        rf"seq_lens\[0\]={L + 1}: exceeds max_context_len={L}",
    ),
    Case("seq_len 0", "decode", lambda s, fb: _with_seq(fb, [0, 3]), r"seq_lens\[0\]=0: must be >= 1"),
    Case(
        "seq_lens_sum understates the lengths (a kernel would read past its index buffer)",
        "decode",
        lambda s, fb: fb.replace(seq_lens_sum=fb.seq_lens_sum - 5),
        r"seq_lens_sum=21: expected sum\(seq_lens_cpu\) = 26",
    ),
    Case(
        "same, eager Triton draft extend",
        "draft_extend",
        lambda s, fb: fb.replace(seq_lens_sum=1),
        r"seq_lens_sum=1: expected sum\(seq_lens_cpu\) = 26",
        call="eager",
    ),
    Case(
        "seq_lens_sum absurdly large (would allocate terabytes)",
        "decode",
        lambda s, fb: fb.replace(seq_lens_sum=10**13),
        r"seq_lens_sum=10000000000000: expected",
    ),
    Case(
        "seq_lens_sum not an int",
        "decode",
        lambda s, fb: fb.replace(seq_lens_sum=torch.tensor(26)),
        r"seq_lens_sum=Tensor 26: must be a Python int",
    ),
    Case(
        "a batch built against another World of the same sizes",
        "decode",
        _other_world,
        r"ForwardBatch.world is another World \(id 0x[0-9a-f]+\) than the runner's",
    ),
    Case("same, eager path", "decode", _other_world, r"another World", call="eager"),
    Case(
        "verify: prefix + N past the context",
        "verify",
        lambda s, fb: _with_seq(fb, [L - 2, 3]),
        rf"seq_lens\[0\] \+ 4={L + 2}: exceeds max_context_len={L}",
    ),
    Case(
        "out_cache_loc of a request outside the batch",
        "decode",
        _foreign_slot,
        r"out_cache_loc\[0\]=\d+: is the slot of no position of this batch's requests; row 0 must write request 0's",
    ),
    Case(
        "out_cache_loc of another request in the batch",
        "decode",
        lambda s, fb: _swap_slots(fb),
        r"out_cache_loc\[0\]=\d+: is the slot of request 1's position \d+; row 0 must write request 0's new position",
    ),
    Case(
        "out_cache_loc of an earlier position of the row's own request (its KV would be destroyed)",
        "verify",
        lambda s, fb: fb.replace(
            out_cache_loc=_set(
                fb.out_cache_loc, 0, int(s.world.req_to_token[int(fb.req_pool_indices[0]), int(fb.seq_lens_cpu[0]) - 1])
            )
        ),
        r"out_cache_loc\[0\]=\d+: is the slot of request 0's position (\d+); row 0 must write request 0's new "
        r"position \d+ \(slot \d+\)",
    ),
    Case(
        "out_cache_loc of another row's position of the same request",
        "verify",
        lambda s, fb: fb.replace(out_cache_loc=torch.cat([fb.out_cache_loc[:2].flip(0), fb.out_cache_loc[2:]])),
        r"out_cache_loc\[0\]=\d+: is the slot of request 0's position (\d+); row 0 must write request 0's new "
        r"position \d+",
    ),
    Case(
        "out_cache_loc at the reserved slot 0",
        "decode",
        lambda s, fb: fb.replace(out_cache_loc=_set(fb.out_cache_loc, 1, 0)),
        r"out_cache_loc\[1\]=0: slot 0 is reserved for padded rows",
    ),
    Case(
        "out_cache_loc past the cache",
        "decode",
        lambda s, fb: fb.replace(out_cache_loc=_set(fb.out_cache_loc, 1, 10**6)),
        r"out_cache_loc\[1\]=1000000: outside \[1, \d+\)",
    ),
    Case(
        "same, FlashInfer decode (its plan follows the host lengths)",
        "decode",
        lambda s, fb: fb.replace(out_cache_loc=_set(fb.out_cache_loc, 1, 10**6)),
        r"out_cache_loc\[1\]=1000000: outside \[1, \d+\)",
        on="flashinfer",
    ),
    Case(
        "two rows write one slot",
        "decode",
        lambda s, fb: fb.replace(out_cache_loc=fb.out_cache_loc[:1].repeat(2)),
        r"two rows would write the same KV slot",
    ),
    Case(
        "multi-step: last step's slot past the cache (no step half-replayed)",
        "draft_decode",
        _last_step_out_of_range,
        r"out_cache_loc\[\d+\]=\d+: outside \[1, \d+\)",
    ),
    Case(
        "req_pool_indices past the request table",
        "decode",
        lambda s, fb: fb.replace(req_pool_indices=_set(fb.req_pool_indices, 1, POOL + 3)),
        rf"req_pool_indices\[1\]={POOL + 3}: outside \[1, pool={POOL}\)",
    ),
    Case(
        "req_pool_indices at the reserved row 0",
        "decode",
        lambda s, fb: fb.replace(req_pool_indices=_set(fb.req_pool_indices, 0, 0)),
        r"req_pool_indices\[0\]=0: row 0 is reserved for padded rows",
    ),
    Case(
        "a request twice in the batch",
        "decode",
        lambda s, fb: fb.replace(req_pool_indices=fb.req_pool_indices[:1].repeat(2)),
        r"a request appears twice in the batch",
    ),
    Case(
        "input_ids past the vocabulary",
        "decode",
        lambda s, fb: fb.replace(input_ids=_set(fb.input_ids, 0, 10**6)),
        r"input_ids\[0\]=1000000: outside \[0, \d+\)",
    ),
    Case(
        "negative position",
        "decode",
        lambda s, fb: fb.replace(positions=_set(fb.positions, 1, -1)),
        rf"positions\[1\]=-1: outside \[0, {L}\)",
    ),
    Case(
        "out_cache_loc of dtype int32",
        "decode",
        lambda s, fb: fb.replace(out_cache_loc=fb.out_cache_loc.to(torch.int32)),
        r"out_cache_loc.dtype=torch.int32: expected torch.int64",
    ),
    Case(
        "input_ids on another device",
        "decode",
        lambda s, fb: fb.replace(input_ids=fb.input_ids.to("meta")),
        r"input_ids.device=meta: expected",
    ),
    Case(
        "verify: custom mask of dtype uint8",
        "verify",
        lambda s, fb: _verify_with(fb, custom_mask=fb.spec_info.custom_mask.to(torch.uint8)),
        r"custom_mask.dtype=torch.uint8: expected torch.bool",
    ),
    Case(
        "verify: custom mask of the wrong size",
        "verify",
        lambda s, fb: _verify_with(fb, custom_mask=fb.spec_info.custom_mask[:-1]),
        r"custom_mask entries=\d+: expected sum over requests of N\*\(seq_len\+N\)",
    ),
    Case(
        "verify: an all-False mask (every draft row attends to nothing)",
        "verify",
        lambda s, fb: _verify_with(fb, custom_mask=torch.zeros_like(fb.spec_info.custom_mask)),
        r"spec_info.custom_mask=row 0 \(request 0, draft 0\): does not see itself: an all-False or self-blind",
    ),
    Case(
        "verify: a draft row that does not see itself",
        "verify",
        lambda s, fb: _blind_draft_1(fb),
        r"spec_info.custom_mask=row 1 \(request 0, draft 1\): does not see itself",
    ),
    Case(
        "verify: no mask after a masked batch (the graph would read the last batch's)",
        "verify",
        lambda s, fb: _verify_with(fb, custom_mask=None),
        r"spec_info.custom_mask=None: a verify graph reads its mask",
    ),
    Case(
        "verify: N other than captured",
        "verify",
        lambda s, fb: _verify_with(fb, draft_token_num=5),
        r"draft_token_num=5: captured N is 4",
    ),
    Case(
        "verify: no spec input",
        "verify",
        lambda s, fb: fb.replace(spec_info=None),
        r"spec_info=NoneType: TARGET_VERIFY needs a VerifyInput",
    ),
    Case(
        "draft extend: accept length past num_steps (built by hand)",
        "draft_extend",
        lambda s, fb: _accept(fb, [7, 0]),
        r"accept_length\[0\]=7: outside \[0, num_steps=3\]",
    ),
    Case(
        "draft extend: accept length S+1 (one past the bound)",
        "draft_extend",
        lambda s, fb: _accept(fb, [4, 0]),
        r"accept_length\[0\]=4: outside \[0, num_steps=3\]",
    ),
    Case(
        "draft extend: negative accept length",
        "draft_extend",
        lambda s, fb: _accept(fb, [1, -1]),
        r"accept_length\[1\]=-1: outside",
    ),
    Case(
        "draft extend: host and device accept lengths disagree",
        "draft_extend",
        lambda s, fb: _accept(fb, [1, 2], host=[2, 2]),
        r"disagrees with accept_length_cpu",
    ),
    Case(
        "draft extend: v2 input into the v1 graph",
        "draft_extend",
        lambda s, fb: fb.replace(spec_info=make_draft_extend_input(2, [1, 1], SPEC, fb.device)),
        r"spec_info.version=2: DRAFT_EXTEND is version 1",
    ),
    Case(
        "Triton draft extend: graph replay with no spec input",
        "draft_extend",
        lambda s, fb: fb.replace(spec_info=None),
        r"spec_info=NoneType: DRAFT_EXTEND needs a DraftExtendInput",
    ),
    Case(
        "multi-step: topk other than captured",
        "draft_decode",
        lambda s, fb: fb.replace(spec_info=DraftDecodeInput(topk=1, num_steps=2)),
        r"\(topk, num_steps\)=\(1, 2\): captured for \(2, 2\)",
    ),
    Case(
        "multi-step: the spec input's kv_indices past the cache (a SIGSEGV on a GPU)",
        "draft_decode",
        lambda s, fb: _draft_indices(s, fb, [10**7] * 12),
        r"spec_info.kv_indices\[0\]=10000000: outside \[1, \d+\)",
    ),
    Case(
        "same, eager multi-step",
        "draft_decode",
        lambda s, fb: _draft_indices(s, fb, [10**7] * 12),
        r"spec_info.kv_indices\[0\]=10000000: outside \[1, \d+\)",
        call="eager",
    ),
    Case(
        "multi-step: the spec input's kv_indices name another request's slots (its KV read)",
        "draft_decode",
        lambda s, fb: _draft_indices(s, fb, _own_slots(s, fb, 0) * 4),  # rows 2, 3: request 1's
        r"spec_info.kv_indices\[6\]=\d+: not a slot of request 1's \d+ positions",
        call="eager",
    ),
    Case(
        "multi-step: the spec input's kv_indptr past its kv_indices",
        "draft_decode",
        lambda s, fb: _draft_indices(
            s, fb, _own_slots(s, fb, 0) * 3, kv_indptr=torch.arange(5, dtype=torch.int32, device=fb.device) * 3
        ),
        r"spec_info.kv_indptr=\[0, 3, 6, 9, 12\]: must start at 0, never decrease, end within kv_indices \(9\)",
    ),
    Case(
        "multi-step: the spec input's kv_indptr of dtype float32",
        "draft_decode",
        lambda s, fb: _draft_indices(s, fb, [1] * 12, kv_indptr=torch.zeros(5, device=fb.device)),
        r"spec_info.kv_indptr=torch.float32\[5\] on \S+: expected a 1-D torch.int32 tensor",
    ),
    Case(
        "a runner whose SpecConfig differs from its backend's (NaN before)",
        "verify",
        lambda s, fb: _runner_on(s, type(s.runner.backend)(s.world, TREE), SPEC),
        r"runner spec_cfg=SpecConfig\(num_steps=3, topk=1, num_draft_tokens=4\) differs from the backend's "
        r"spec=SpecConfig\(num_steps=2, topk=2, num_draft_tokens=5\)",
        call="build",
    ),
    Case(
        "world.kv_cache rebound after capture (the step's KV would go to the orphaned cache)",
        "decode",
        lambda s, fb: _rebind(s, fb, s.world, "kv_cache"),
        r"world.kv_cache, .* rebound after capture",
    ),
    Case(
        "the request table rebound after capture",
        "decode",
        lambda s, fb: _rebind(s, fb, s.world.req_to_token_pool, "req_to_token"),
        r"^world.req_to_token_pool.req_to_token rebound after capture",
    ),
    Case(
        "a second runner on a live runner's backend (its buffers rebound)",
        "decode",
        lambda s, fb: _runner_on(s, s.runner.backend, None),
        r"backend TorchNativeBackend is owned by a live decode GraphRunner",
        call="build",
    ),
    Case(
        "out_cache_loc held by a live request outside the batch too (its KV overwritten)",
        "decode",
        _held_outside,
        r"out_cache_loc\[0\]=\d+: is also held by the live request in pool row \d+, outside the batch, at position 3",
    ),
    Case(
        "out_cache_loc held by another request of the batch too (as a prefix slot)",
        "verify",
        lambda s, fb: _edit_table(s, int(fb.req_pool_indices[1]), 2, int(fb.out_cache_loc[0])) or fb,
        r"out_cache_loc\[0\]=\d+: is also held by request 1 at position 2: row 0 would overwrite that KV",
    ),
    Case(
        "batch_size a float",
        "decode",
        lambda s, fb: fb.replace(batch_size=2.0),
        r"ForwardBatch.batch_size=float 2.0: must be a Python int",
    ),
    Case(
        "req_pool_indices a list",
        "decode",
        lambda s, fb: fb.replace(req_pool_indices=[1, 2]),
        r"ForwardBatch.req_pool_indices=list: expected a torch.int64 tensor",
    ),
    Case(
        "verify: draft_token_num a float",
        "verify",
        lambda s, fb: _verify_with(fb, draft_token_num=4.0),
        r"spec_info.draft_token_num=float 4.0: must be a Python int",
    ),
    Case(
        "verify: custom mask a list",
        "verify",
        lambda s, fb: _verify_with(fb, custom_mask=fb.spec_info.custom_mask.tolist()),
        r"spec_info.custom_mask=list: expected a torch.bool tensor",
    ),
    Case(
        "plain decode: a DraftDecodeInput on the Triton decode runner (33 tensors written before)",
        "decode",
        lambda s, fb: fb.replace(spec_info=DraftDecodeInput(TREE.topk, TREE.num_steps)),
        r"spec_info=DraftDecodeInput: DECODE on a single-step runner takes no spec input",
        on="triton",
    ),
    Case(
        "same, eager, its kv indices past the cache (a SIGSEGV on a GPU)",
        "decode",
        lambda s, fb: _draft_indices(s, fb, [10**7] * 6, per_row=3, topk=1),
        r"spec_info=DraftDecodeInput: DECODE on a single-step runner",
        call="eager",
        on="triton",
    ),
    Case(
        "plain decode: a VerifyInput",
        "decode",
        lambda s, fb: fb.replace(spec_info=VerifyInput(1, None)),
        r"spec_info=VerifyInput: DECODE on a single-step runner takes no spec input",
    ),
    Case(
        "multi-step: a plain decode batch (no spec input)",
        "draft_decode",
        lambda s, fb: fb.replace(spec_info=None),
        r"spec_info=NoneType: draft decode needs a DraftDecodeInput",
    ),
    Case(
        "verify: a 2-D custom mask",
        "verify",
        lambda s, fb: _verify_with(fb, custom_mask=fb.spec_info.custom_mask.view(1, -1)),
        r"spec_info.custom_mask.shape=\[1, (\d+)\]: expected 1-D \[\1\]: sum over requests of N\*\(seq_len\+N\)",
    ),
]


def _batch(s: Setup, case: str) -> ForwardBatch:
    if case == "decode":
        return s.gen.decode(2, seq_lens=[9, 17])
    if case == "verify":
        return s.gen.target_verify(2, seq_lens=[9, 17])
    if case == "draft_extend":
        return s.gen.draft_extend(2, 1, seq_lens=[9, 17], accept_length=[1, 3])
    return s.gen.draft_decode(2, seq_lens=[9, 17])


# the device rules a graph replay does not wait for (refimpl.validate): the replay runs the batch as padded rows only and
# the runner raises at its next call (``synchronize``)
DEFERRED = {
    "device seq_lens past the context, host copy fine",
    "device seq_lens one short of the host copy, its write consistent with the device's",
    "out_cache_loc of a request outside the batch",
    "out_cache_loc of another request in the batch",
    "out_cache_loc of an earlier position of the row's own request (its KV would be destroyed)",
    "out_cache_loc of another row's position of the same request",
    "out_cache_loc at the reserved slot 0",
    "out_cache_loc past the cache",
    "same, FlashInfer decode (its plan follows the host lengths)",
    "two rows write one slot",
    "multi-step: last step's slot past the cache (no step half-replayed)",
    "req_pool_indices past the request table",
    "req_pool_indices at the reserved row 0",
    "a request twice in the batch",
    "input_ids past the vocabulary",
    "negative position",
    "verify: an all-False mask (every draft row attends to nothing)",
    "verify: a draft row that does not see itself",
    "out_cache_loc held by a live request outside the batch too (its KV overwritten)",
    "out_cache_loc held by another request of the batch too (as a prefix slot)",
}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_before_any_write(case: Case):
    s = setup_for(case.setup, case.backend)
    good = _batch(s, case.setup)
    s.runner.replay(good)  # the buffers hold a real batch, not just the capture's
    bad = case.bad(s, good)
    snap = snapshot(s)
    call = bad if case.call == "build" else lambda: getattr(s.runner, case.call)(bad)
    try:
        if case.id in DEFERRED:
            call()
            kv = [(t, old) for t, old in snap if any(t is b for b in s.world.kv_cache.buffers())]
            assert all(torch.equal(t[1:], old[1:]) for t, old in kv), "a refused batch wrote a KV slot other than slot 0"
            assert torch.equal(s.world.req_to_token, next(old for t, old in snap if t is s.world.req_to_token))
            inputs = s.runner.inputs
            assert (inputs.req_pool_indices == 0).all() and (inputs.out_cache_loc == 0).all()
            # each request at its host length, as the host mirror says (a plan made from it agrees with the device)
            assert torch.equal(inputs.seq_lens.cpu(), inputs.seq_lens_cpu), "device and host lengths of a refused batch differ"
            with pytest.raises(case.exc, match=case.fragment + ".*found by the device checks of the last replay"):
                s.runner.synchronize()
            s.runner.synchronize()  # raised once
            return
        with pytest.raises(case.exc, match=case.fragment):
            call()
        changed = unchanged(snap)
        assert not changed, f"a refused batch changed {len(changed)} tensor(s)"
    finally:
        while s.undo:
            s.undo.pop()()
        s.gen.release_all()


@pytest.mark.parametrize("case", ["verify", "draft_decode"])
def test_non_contiguous_tensors_are_copied_not_refused(case: str):
    """Strided index tensors (and a strided tree mask) are served as their contiguous copies: the same output, graph and
    eager (``load_inputs`` viewed them as bytes: a view error before)."""
    s = setup_for(case, "triton" if case == "draft_decode" else "torch_native")
    fb = _batch(s, case)
    strided = lambda t: torch.stack([t, t], -1)[..., 0]  # the same values, stride 2
    names = ("input_ids", "positions", "req_pool_indices", "seq_lens", "out_cache_loc")
    odd = fb.replace(**{k: strided(getattr(fb, k)) for k in names})
    if case == "verify":
        odd = _verify_with(odd, custom_mask=strided(fb.spec_info.custom_mask))
    assert not odd.out_cache_loc.is_contiguous()
    want = s.runner.replay(fb).clone(), s.runner.eager(fb).clone()
    assert torch.equal(s.runner.replay(odd), want[0]) and torch.equal(s.runner.eager(odd), want[1])
    s.gen.release_all()


@pytest.mark.parametrize("case", ["decode", "verify", "draft_extend", "draft_decode"])
def test_every_tensor_a_batch_carries_is_one_the_contiguity_pass_reads(case: str):
    """``refimpl.validate._contiguous`` reads only the fields annotated as tensors (named once per class): every tensor a
    batch of each mode, or its spec input, holds is one of them (a tensor in another field would reach the kernels
    strided)."""
    s = setup_for(case, "torch_native" if case in ("decode", "verify") else "triton")
    fb = _batch(s, case)
    assert fb.spec_info is not None or case == "decode"
    for obj in (fb, fb.spec_info) if fb.spec_info is not None else (fb,):
        held = {k for k, v in vars(obj).items() if isinstance(v, torch.Tensor)}
        assert _tensor_fields(type(obj)) and held <= set(_tensor_fields(type(obj))), (type(obj).__name__, held)
    s.gen.release_all()


def test_the_held_rule_reads_the_pools_allocation_state():
    """A stale entry in a free request row holds nothing; once that row is allocated, it holds the slot."""
    s = setup_for("decode")
    fb, pool = _batch(s, "decode"), s.world.req_to_token_pool
    row = pool._free[0]  # the next row alloc hands out
    s.world.req_to_token[row, 0] = fb.out_cache_loc[0]
    s.runner.replay(fb)
    assert pool.alloc(1) == [row]
    try:
        with pytest.raises(BatchRefused, match=rf"is also held by the live request in pool row {row}, outside"):
            s.runner.replay(fb)
            s.runner.synchronize()  # a device rule: raised at the runner's next call
    finally:
        pool.free([row])  # zeroes the row
        s.gen.release_all()


def test_the_snapshot_sees_a_write():
    """The no-write check above can fail: a replay that does write is caught by it."""
    s = setup_for("decode")
    fb = _batch(s, "decode")
    snap = snapshot(s)
    s.runner.world.kv_cache.buffers()[0][fb.out_cache_loc] = float("nan")  # KV
    assert unchanged(snap)
    snap = snapshot(s)
    s.runner.replay(fb)  # static inputs change
    assert unchanged(snap)
    s.gen.release_all()


@pytest.mark.parametrize(
    "kwargs, fragment",
    [(dict(topk=44), r"capture batch span 49 .* exceeds max_context_len=48"), (dict(topk=10**6), r"exceeds max_context_len=48")],
    ids=["topk 44", "topk 10^6"],
)
def test_capture_config_refused_up_front(kwargs, fragment):
    """The runner refuses a spec the static buffers cannot hold before allocating anything."""
    cfg = ModelConfig()
    world = World.create(cfg, max_context_len=48, pool_size=8)
    spec = SpecConfig(num_steps=3, topk=kwargs["topk"], num_draft_tokens=3 + kwargs["topk"] + 1)
    backend = next(e for e in find("torch_native") if e.variant == "unified").load(False)(world, spec)
    gcfg = GraphConfig(max_bs=4, capture_bs=(1, 4), max_context_len=48, speculative=True)
    with pytest.raises(BatchRefused, match=fragment):
        GraphRunner(TinyDecoder(cfg), backend, CPUEmulatorEngine(), ForwardMode.TARGET_VERIFY, gcfg, spec)


CLI_CASES = [  # (argv, fragment of the one error line); every case fails before anything is measured or checked
    (["check", "--variant", "nosuch"], r"argument --variant: unknown \['nosuch'\]; known: "),
    (["check", "--backend", "nosuch"], r"argument --backend: unknown \['nosuch'\]"),
    (["check", "--mode", "nosuch"], r"argument --mode: unknown \['nosuch'\]"),
    (["check", "--bs", "abc"], r"argument --bs: 'abc' is not a comma-separated list of batch sizes"),
    (["check", "--bs", "0,2"], r"argument --bs: batch sizes must be >= 1"),
    (["check", "--topk", "0"], r"argument --topk: topk=0 outside \[1, 8\]"),
    (["check", "--topk", "44"], r"argument --topk: topk=44 outside \[1, 8\]"),
    (["check", "--topk", "x"], r"argument --topk: 'x' is not an integer"),
    (["check", "--fuzz", "-3"], r"argument --fuzz: -3 is not a count >= 1"),
    (["check", "--fuzz", "2", "--bs", "1,3"], r"argument --fuzz: not with --bs: the fuzzer draws batch sizes 1..8"),
    (["check", "--fuzz", "2", "--topk", "2"], r"argument --fuzz: not with --topk"),
    (["check", "--bogus"], r"unrecognized arguments: --bogus"),
    (["check", "--backend", "torch_native", "--variant", "legacy"], r"nothing to check: no variant \['legacy'\]"),
    (
        ["check", "--backend-class", "refimpl.backends.triton:TritonAttnBackend", "--backend", "wave"],
        r"argument --backend-class: not with --backend: it checks the given classes, not registered backends",
    ),
    (
        ["check", "--backend-class", "refimpl.backends.base:AttentionBackend"],
        r"AttentionBackend is abstract: it leaves forward, .* unimplemented",
    ),
    (["bench", "--pin", "9999"], r"argument --pin: core 9999 is not one this process may run on"),
    (["bench", "--out", "/proc/refimpl-nope"], r"argument --out: cannot write to /proc/refimpl-nope"),
    (["bench", "--figures", "/proc/refimpl-nope"], r"argument --figures: cannot write to /proc/refimpl-nope"),
    (
        ["bench", "--ctx", "100000", "--bs", "64", "--token-budget", "1024"],
        r"argument --token-budget: every \(bs, context\) pair has bs \* context above the token budget 1024",
    ),
    (["bench", "--repeats", "0"], r"argument --repeats: 0 is not a count >= 1"),
]
if not torch.cuda.is_available():
    CLI_CASES.append((["check", "--engine", "cuda"], r"argument --engine: cuda needs a CUDA device"))


@pytest.mark.parametrize("argv, fragment", CLI_CASES, ids=[" ".join(a) for a, _ in CLI_CASES])
def test_cli_refuses_with_one_line(argv, fragment, capsys):
    from refimpl.__main__ import main

    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and re.search(fragment, err[0]), err


def test_readme_lists_the_table():
    readme = (Path(__file__).resolve().parent.parent / "docs" / "reference.md").read_text()
    section = readme.split("## Bad input", 1)[1].split("\n## ", 1)[0]
    missing = [c.id for c in CASES if f"| {c.id} |" not in section]
    missing += [" ".join(a) for a, _ in CLI_CASES if f"`{' '.join(a)}`" not in section]
    assert not missing, f"docs/reference.md's bad-input table lacks: {missing}"
    marked = {
        c.id for c in CASES if f"| {c.id} |" in section and section.split(f"| {c.id} |")[1].split("|")[0].endswith("*next call* ")
    }
    assert marked == DEFERRED, f"rows marked *next call* in docs/reference.md differ from DEFERRED: {marked ^ DEFERRED}"


def _no_graph_backend():
    from refimpl.backends.torch_native import TorchNativeBackend

    class NoGraphModes(TorchNativeBackend):  # declares no graph mode: every row is skipped
        name, graph_modes = "no_graph_modes", frozenset()

    return NoGraphModes


NoGraphModes = _no_graph_backend()


def test_review_of_a_backend_with_no_graph_mode_fails(capsys):
    """A class under review that captures nothing is not a pass: exit 1 and one line saying nothing was checked."""
    from refimpl.__main__ import main

    code = main(["check", "--backend-class", f"{__name__}:NoGraphModes", "--mode", "decode", "--bs", "1"])
    out, err = capsys.readouterr()
    assert code == 1 and "skipped" in out
    assert err.strip().splitlines()[-1] == "error: nothing was checked: every selected row was skipped (the reasons are above)"


def test_a_blind_mask_passes_when_the_batch_opts_in():
    """``VerifyInput.allow_blind_rows=True``: the batch is replayed (a test that wants such rows says so)."""
    s = setup_for("verify")
    fb = _verify_with(_blind_draft_1(s.gen.for_mode(s.runner.kind, 2)), allow_blind_rows=True)
    assert torch.isfinite(s.runner.replay(fb)).all()
    s.gen.release(fb)


def test_a_deferred_refusal_raises_at_the_next_replay_which_serves_nothing():
    """A replay does not wait for its device checks: the next call raises their refusal before it writes anything."""
    s = setup_for("decode")
    good = _batch(s, "decode")
    s.runner.replay(good)
    s.runner.replay(good.replace(out_cache_loc=torch.full_like(good.out_cache_loc, 10**6)))
    snap = snapshot(s)
    try:
        with pytest.raises(BatchRefused, match=r"out_cache_loc\[0\]=1000000: outside .*found by the device checks"):
            s.runner.replay(good)
        assert not unchanged(snap), "the call that raised wrote"
        s.runner.replay(good)  # raised once; the runner serves again
        s.runner.synchronize()
    finally:
        s.gen.release_all()


def test_a_refused_batch_changed_before_it_is_named_still_raises():
    """The refusal is named by re-reading the batch; a caller that rewrote its tensors meanwhile still gets one, naming
    the device rules that failed."""
    s = setup_for("decode")
    good = _batch(s, "decode")
    bad = good.replace(out_cache_loc=good.out_cache_loc.clone())
    bad.out_cache_loc[1] = 10**6
    s.runner.replay(bad)
    bad.out_cache_loc.copy_(good.out_cache_loc)  # the caller reuses its buffer
    try:
        with pytest.raises(BatchRefused, match=r"broke the device rules \['out_cache_loc range'.*changed before"):
            s.runner.synchronize()
    finally:
        s.gen.release_all()
