"""The batch-check kernel (``refimpl.kernels.validation``) against its definition in host
Python (``batch_check_ref``): random batches of every graph layout, corrupted at random, give
the same first bad index in every category, and the copies it hands back are the device values.
Tiny shapes: on CPU the kernel runs in the Triton interpreter."""

import random

import pytest
import torch

from refimpl._env import default_device
from refimpl.batch import World
from refimpl.batchgen import BatchGenerator
from refimpl.config import ModelConfig, SpecConfig
from refimpl.kernels.validation import batch_check, batch_check_ref, read_result, result_size
from refimpl.modes import ForwardMode

DEVICE = default_device()
SPEC = SpecConfig(num_steps=2, topk=2, num_draft_tokens=3)
CFG = ModelConfig(num_layers=1, num_heads=1, num_kv_heads=1, head_dim=4, v_head_dim=4)
LAYOUTS = {  # case: (mode, multi-step, rows per request, extra columns past seq_lens)
    "decode": (ForwardMode.DECODE, False, 1, 0),
    "target_verify": (ForwardMode.TARGET_VERIFY, False, 3, 3),
    "draft_extend_v2": (ForwardMode.DRAFT_EXTEND_V2, False, 3, 0),
    "draft_decode": (ForwardMode.DECODE, True, 2, 4),
}


def corrupt(fb, rnd: random.Random, world) -> None:
    """Overwrite a few entries in place with values each rule should catch (or should not)."""
    slots, pool = world.kv_cache.num_slots, world.req_to_token_pool.size
    targets = {
        "req_pool_indices": [0, -1, pool, pool + 5, None],  # None: a duplicate of entry 0
        "input_ids": [-1, world.cfg.vocab_size, 0],
        "positions": [-1, world.max_context_len, 0],
        "out_cache_loc": [0, -3, slots, None, "other"],  # "other": another live slot
    }
    for _ in range(rnd.randint(0, 3)):
        name = rnd.choice(list(targets))
        t = getattr(fb, name)
        if t.numel() == 0:
            continue
        i = rnd.randrange(t.numel())
        v = rnd.choice(targets[name])
        if v is None:  # a duplicate: entry i repeats an earlier entry
            if t.numel() < 2:
                continue
            i = rnd.randrange(1, t.numel())
            v = int(t[rnd.randrange(i)])
        elif v == "other":
            v = int(world.live_slots()[rnd.randrange(world.live_slots().numel())])
        t[i] = v


@pytest.mark.parametrize("case", list(LAYOUTS))
def test_kernel_matches_its_definition(case):
    mode, multi, per, extra = LAYOUTS[case]
    rnd = random.Random(case)
    world = World.create(CFG, max_context_len=20, pool_size=12, device=DEVICE, seed=0)
    gen = BatchGenerator(world, SPEC, seed=3)
    out = torch.full((result_size(6, 6 * per, 6 * per * 2),), -9, dtype=torch.int64, device=DEVICE)
    for trial in range(12):
        fb = gen.for_mode("draft_decode" if multi else mode, rnd.randint(1, 4))
        if trial:
            corrupt(fb, rnd, world)
        args = (world.req_to_token, fb.seq_lens, fb.req_pool_indices, fb.input_ids, fb.positions, fb.out_cache_loc)
        kw = dict(rows_per_req=per, extra=extra, vocab=world.cfg.vocab_size, num_slots=world.kv_cache.num_slots)
        spec = fb.spec_info if mode.is_any_draft_extend() else None
        mask = fb.spec_info.custom_mask.clone() if mode.is_target_verify() else None
        if mask is not None and trial:  # a few entries switched off: a diagonal one makes a self-blind row
            mask[torch.tensor([rnd.randrange(mask.numel()) for _ in range(rnd.randint(0, 6))], dtype=torch.long)] = False
        kw["custom_mask"] = mask
        if trial % 2:  # a deferred replay's host lengths, as staged for the kernel: one of them off by one at times
            host = fb.seq_lens.clone()
            host[rnd.randrange(host.numel())] += rnd.choice([0, 1])
            kw["host_seq_lens"] = host
        batch_check(
            out,
            *args,
            **kw,
            accept_length=getattr(spec, "accept_length", None),
            extend_seq_lens=getattr(spec, "extend_seq_lens", None),
        )
        got = read_result(out, fb.batch_size, fb.num_tokens, fb.out_cache_loc.numel())
        assert got["first"] == batch_check_ref(*args, **kw), (case, trial)
        assert got["seq_lens"] == fb.seq_lens.tolist()
        if spec is not None:
            assert got["accept_length"] == spec.accept_length.tolist()
            assert got["extend_seq_lens"] == spec.extend_seq_lens.tolist()
        gen.release_all()


def test_a_ragged_batch_maps_rows_by_row_req():
    """An eager extend with 2 + 1 new rows: row_req holds each row's request and its column past seq_lens (j - rows).
    A row must write exactly its own new position: not another request's slot, not an earlier one of its own."""
    world = World.create(CFG, max_context_len=20, pool_size=8, device=DEVICE, seed=0)
    a, b = world.new_request(9), world.new_request(5)
    r2t = world.req_to_token
    # request a writes its positions 7, 8 (two rows), request b its position 4 (one row)
    args = lambda loc: (
        r2t,
        torch.tensor([9, 5], dtype=torch.int32, device=DEVICE),
        torch.tensor([a, b], device=DEVICE),
        torch.zeros(3, dtype=torch.int64, device=DEVICE),
        torch.tensor([7, 8, 4], device=DEVICE),
        torch.stack(loc).long(),
    )
    kw = dict(rows_per_req=1, extra=0, vocab=96, num_slots=world.kv_cache.num_slots)
    out = torch.empty(result_size(2, 3, 3), dtype=torch.int64, device=DEVICE)
    right = [r2t[a, 7], r2t[a, 8], r2t[b, 4]]
    for owner, loc, bad in (
        ([0, 0, 1], right, None),
        ([0, 1, 1], right, 1),  # row 1 is a's, not b's
        ([0, 0, 1], [r2t[a, 7], r2t[a, 3], r2t[b, 4]], 1),  # an earlier position of its own request: its KV destroyed
    ):
        row_req = torch.tensor([owner, [-2, -1, -1]], dtype=torch.int32, device=DEVICE)
        batch_check(out, *args(loc), **kw, row_req=row_req)
        got = read_result(out, 2, 3, 3)["first"]
        assert got == batch_check_ref(*args(loc), **kw, row_req=row_req)
        assert got["out_cache_loc slot"] == bad


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE.type != "cuda", reason="a compiled kernel needs CUDA (the CPU runs the interpreter)")
def test_launches_after_the_first_skip_triton_binding():
    """The compiled kernel is kept and launched directly (``refimpl.kernels._op.direct_launch``): what
    ``test_kernel_matches_its_definition`` checks from its second trial on is that path."""
    from refimpl.kernels import _op, validation

    _op._COMPILED.clear()
    test_a_ragged_batch_maps_rows_by_row_req()
    kept = [k for k in _op._COMPILED if k[0] is validation._batch_check_kernel]
    assert kept, "the compiled kernel was not kept: every launch binds in Python"
