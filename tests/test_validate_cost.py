"""Validation costs what the batch costs: the same ops on the same shapes whether the KV pool
holds a thousand slots or a million, and at most one device-to-host read per batch.

(The H200 showed why: with a 197k-slot pool, validating one TRTLLM-MLA batch took 127 ms,
because the ownership rule built a slot -> request map the size of the whole pool.) The device
rules run as one kernel over the batch's own entries (``refimpl.kernels.validation``); what
that kernel touches follows from its arguments, which hold no pool size but the request
table's shape. On the CPU the same rules run as their Python definition (``batch_check_ref``),
which reads the batch's own ``req_to_token`` rows and, for the rule that no other live request holds a new slot, the
live rows of the request table (pool x context entries, never the KV pool). Counted, not timed."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from refimpl._env import default_device
from refimpl.batch import World
from refimpl.batchgen import BatchGenerator
from refimpl.config import TREE, ModelConfig
from refimpl.kernels.validation import NCAT, PROGRAMS
from refimpl.modes import ForwardMode
from refimpl.validate import validate_batch

DEVICE = default_device()
SPEC = TREE
CFG = ModelConfig(num_layers=1, num_heads=1, num_kv_heads=1, head_dim=4, v_head_dim=4)


class OpLog(TorchDispatchMode):
    """Every dispatched op with its outputs' shapes and devices, and the device-to-host reads."""

    def __init__(self):
        super().__init__()
        self.ops, self.reads = [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else [out]
        shapes = [tuple(o.shape) for o in outs if isinstance(o, torch.Tensor)]
        self.ops.append((str(func), shapes))
        ins = [a for a in args if isinstance(a, torch.Tensor)]
        if any(a.device.type != "cpu" for a in ins) and (
            isinstance(out, (int, float, bool)) or (isinstance(out, torch.Tensor) and out.device.type == "cpu")
        ):
            self.reads += 1
        return out


def validation_ops(num_slots: int, mode: ForwardMode, multi: bool):
    world = World.create(CFG, max_context_len=64, pool_size=24, num_slots=num_slots, device=DEVICE, seed=0)
    gen = BatchGenerator(world, SPEC, seed=1)
    fb = gen.for_mode("draft_decode" if multi else mode, 8)
    validate_batch(fb, SPEC, fb.kind, for_graph=True)  # warm: the result buffer exists
    with OpLog() as log:
        validate_batch(fb, SPEC, fb.kind, for_graph=True)
    return log


@pytest.mark.parametrize(
    "mode, multi",
    [
        (ForwardMode.DECODE, False),
        (ForwardMode.TARGET_VERIFY, False),
        (ForwardMode.DRAFT_EXTEND_V2, False),
        (ForwardMode.DECODE, True),
    ],
    ids=["decode", "target_verify", "draft_extend_v2", "draft_decode"],
)
def test_validation_work_does_not_follow_the_pool(mode, multi):
    small = validation_ops(1_000 + 7, mode, multi)
    large = validation_ops(1_000_000 + 7, mode, multi)
    assert small.ops == large.ops  # same ops, same shapes: nothing sized by the pool
    # small shapes only: the batch's entries, and the verdict's per-program minima (about PROGRAMS programs: a fixed size)
    assert all(max(s, default=1) < 1_000 + PROGRAMS * NCAT for _, shapes in small.ops for s in shapes)
    assert large.reads <= 1  # on a GPU: the one read of the kernel's result
    if DEVICE.type == "cuda":  # one launch, the view of its result, and the read's copy
        names = [name for name, _ in small.ops]
        assert names == ["refimpl.batch_check.default", "aten.slice.Tensor", "aten._to_copy.default"]
    else:  # the rules' Python definition reads request-table rows (the batch's, the live ones), nothing else
        assert {name for name, _ in small.ops} <= {"aten.select.int"}
