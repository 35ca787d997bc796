"""The graph runner: padding, fallbacks, bad input, and padded rows never touching live KV."""

import copy
import re

import pytest
import torch

from refimpl.backends.torch_native import TorchNativeBackend
from refimpl.batch import World
from refimpl.batchgen import BatchGenerator
from refimpl.config import TREE, GraphConfig, ModelConfig, SpecConfig
from refimpl.graphs import CPUEmulatorEngine, GraphReplayError
from refimpl.graphs.runner import GraphRunner
from refimpl.model import TinyDecoder
from refimpl.modes import ForwardMode

L = 40


def make(mode=ForwardMode.DECODE, spec=None, capture_bs=(1, 2, 4), capture=True, kind="mha"):
    cfg = ModelConfig(kind=kind, num_heads=2 if kind == "mla" else 4)
    world = World.create(cfg, max_context_len=L, pool_size=24)
    world.randomize_kv(0)
    backend = TorchNativeBackend(world, spec)
    gcfg = GraphConfig(max_bs=max(capture_bs), capture_bs=capture_bs, max_context_len=L)
    runner = GraphRunner(TinyDecoder(cfg), backend, CPUEmulatorEngine(), mode, gcfg, spec)
    if capture:
        runner.capture()
    return runner, BatchGenerator(world, spec, seed=3)


def test_captures_largest_first_and_reports():
    runner, _ = make()
    assert [r.bs for r in runner.capture_records] == [4, 2, 1]
    rec = runner.capture_records[0]
    assert rec.seconds > 0 and rec.pool_bytes is None
    assert rec.kernels == {"refimpl.dense_paged_attention.default": runner.model.cfg.num_layers}


def test_padding_uses_fill_value_slot_zero_and_matches_eager():
    runner, gen = make()
    fb = gen.decode(3)
    res = runner.run(fb)
    assert res.used_graph and res.graph_bs == 4
    assert runner.inputs.seq_lens[3].item() == 1 and runner.inputs.req_pool_indices[3].item() == 0
    assert runner.inputs.out_cache_loc[3].item() == 0
    assert torch.allclose(res.logits, runner.eager(fb), atol=1e-5, rtol=1e-5)


def test_padded_rows_never_write_live_kv():
    runner, gen = make()
    world = runner.world
    fb = gen.decode(3)
    # poison: every slot of every other live request, plus NaN in the unused slots
    own = set(fb.out_cache_loc.tolist())
    others = [s for s in world.live_slots().tolist() if s not in own]
    keep = [b[others].clone() for b in world.kv_cache.buffers()]
    runner.replay(fb)
    for b, old in zip(world.kv_cache.buffers(), keep):
        assert torch.equal(b[others], old), "a padded row wrote a live request's KV"
    # and the graph really wrote the batch's own slots
    k0 = world.kv_cache.k[0]
    snapshot = k0[fb.out_cache_loc].clone()
    k0[fb.out_cache_loc] = float("nan")
    runner.replay(fb)
    assert torch.equal(k0[fb.out_cache_loc], snapshot)


def test_fresh_batches_after_capture_match_eager():
    runner, gen = make()
    for bs in (1, 2, 3, 4):
        fb = gen.decode(bs)
        assert torch.allclose(runner.replay(fb), runner.eager(fb), atol=1e-5, rtol=1e-5)
        gen.release(fb)


def test_target_verify_graph_matches_eager_with_tree_masks():
    spec = TREE
    runner, gen = make(ForwardMode.TARGET_VERIFY, spec)
    fb = gen.target_verify(3)
    assert torch.allclose(runner.replay(fb), runner.eager(fb), atol=1e-5, rtol=1e-5)


def test_fallbacks_say_why():
    runner, gen = make()
    big = gen.decode(5)
    res = runner.run(big)
    assert not res.used_graph and "exceeds the largest captured size 4" in res.fallback_reason
    gen.release(big)
    spec = SpecConfig()
    vgen = BatchGenerator(runner.world, spec, seed=1)
    res = runner.run(vgen.target_verify(2))
    assert "target_verify was not captured" in res.fallback_reason


def test_no_padding_mode_runs_only_captured_sizes():
    spec = None
    cfg = ModelConfig()
    world = World.create(cfg, max_context_len=L, pool_size=16)
    gcfg = GraphConfig(max_bs=4, capture_bs=(2, 4), max_context_len=L, disable_padding=True)
    runner = GraphRunner(TinyDecoder(cfg), TorchNativeBackend(world, spec), CPUEmulatorEngine(), ForwardMode.DECODE, gcfg)
    runner.capture()
    res = runner.run(BatchGenerator(world, None).decode(3))
    assert not res.used_graph and "padding is disabled" in res.fallback_reason


def test_replay_before_capture_raises():
    runner, gen = make(capture=False)
    with pytest.raises(GraphReplayError, match="no graph captured"):
        runner.replay(gen.decode(1))


def test_bad_input_errors_name_value_and_limit():
    runner, gen = make()
    fb = gen.decode(2)
    with pytest.raises(ValueError, match="out_cache_loc.dtype=torch.int32: expected torch.int64"):
        runner.replay(fb.replace(out_cache_loc=fb.out_cache_loc.to(torch.int32)))
    long_cpu = torch.tensor([L + 1, 3], dtype=torch.int32)
    long = fb.replace(seq_lens_cpu=long_cpu, seq_lens=long_cpu.to(fb.device), seq_lens_sum=L + 4)
    with pytest.raises(ValueError, match=rf"seq_lens\[0\]={L + 1}: exceeds max_context_len={L}"):
        runner.replay(long)
    with pytest.raises(ValueError, match="disagrees with seq_lens_cpu"):  # host copy looks fine
        runner.replay(fb.replace(seq_lens=long_cpu.to(fb.device)))  # a device rule: raised at the next call
        runner.synchronize()
    with pytest.raises(ValueError, match="input_ids.device=meta: expected"):
        runner.replay(fb.replace(input_ids=fb.input_ids.to("meta")))
    wrong_tokens = fb.replace(input_ids=fb.input_ids.repeat(2), positions=fb.positions.repeat(2))
    with pytest.raises(GraphReplayError, match="1 per request"):
        runner.replay(wrong_tokens)
    with pytest.raises(ValueError, match="batch_size=5: exceeds the largest captured size 4"):
        runner.validate(gen.decode(5))  # a direct validate: before anything is staged for the device checks


def test_missing_spec_input_is_an_error():
    spec = SpecConfig()
    runner, gen = make(ForwardMode.TARGET_VERIFY, spec)
    fb = gen.target_verify(2)
    with pytest.raises(ValueError, match="needs a VerifyInput"):
        runner.replay(fb.replace(spec_info=None))
    with pytest.raises(ValueError, match="needs a SpecConfig"):
        make(ForwardMode.TARGET_VERIFY, None, capture=False)


def test_request_pool_must_hold_the_largest_graph():
    cfg = ModelConfig()
    world = World.create(cfg, max_context_len=L, pool_size=4)
    with pytest.raises(ValueError, match="request pool larger than 4"):
        GraphRunner(
            TinyDecoder(cfg),
            TorchNativeBackend(world),
            CPUEmulatorEngine(),
            ForwardMode.DECODE,
            GraphConfig(max_bs=4, capture_bs=(1, 4)),
        )


def test_mla_runner_matches_eager():
    runner, gen = make(kind="mla")
    fb = gen.decode(3)
    assert torch.allclose(runner.replay(fb), runner.eager(fb), atol=1e-4, rtol=1e-4)


def test_runner_and_backend_must_share_one_spec_config():
    """A runner sized for one SpecConfig over a backend built for another gave NaN: refused at construction."""
    cfg, tree, chain = ModelConfig(), SpecConfig(num_steps=2, topk=2, num_draft_tokens=5), SpecConfig()
    world = World.create(cfg, max_context_len=L, pool_size=24)
    gcfg = GraphConfig(max_bs=2, capture_bs=(1, 2), max_context_len=L)
    for built, asked in ((tree, chain), (None, chain), (chain, None)):
        mode = ForwardMode.TARGET_VERIFY if asked else ForwardMode.DECODE
        why = rf"runner spec_cfg={re.escape(str(asked))} differs from the backend's spec={re.escape(str(built))}"
        with pytest.raises(ValueError, match=why):
            GraphRunner(TinyDecoder(cfg), TorchNativeBackend(world, built), CPUEmulatorEngine(), mode, gcfg, asked)


def test_world_objects_rebound_after_capture_are_refused_at_replay():
    """The graphs write the KV cache and read the request table bound at capture: a replay after either was rebound
    (its KV would go to the orphaned cache) is refused, naming what moved; eager reads the world as it is."""
    runner, gen = make()
    fb = gen.decode(2)
    world, pool = runner.world, runner.world.req_to_token_pool
    for obj, name, moved in (
        (world, "kv_cache", "world.kv_cache, world.kv_cache.buffers()[0]"),
        (pool, "req_to_token", "world.req_to_token_pool.req_to_token"),
        (world, "req_to_token_pool", "world.req_to_token_pool, world.req_to_token_pool.req_to_token"),
    ):
        old = getattr(obj, name)
        setattr(obj, name, copy.deepcopy(old))
        with pytest.raises(ValueError, match=rf"^{re.escape(moved)}[, ].*rebound after capture"):
            runner.replay(fb)
        runner.eager(fb)
        setattr(obj, name, old)
        runner.replay(fb)  # bound back: served


def test_a_backend_serves_one_live_runner():
    """A second runner's init_cuda_graph_state would rebind the buffers the first one's graphs read: refused while the
    first lives; once it is gone, the backend may serve a new runner."""
    runner, gen = make()
    backend, model, gcfg = runner.backend, runner.model, runner.graph_cfg
    again = lambda: GraphRunner(model, backend, CPUEmulatorEngine(), ForwardMode.DECODE, gcfg)
    buffers = dict(backend.graph_buffers())
    with pytest.raises(ValueError, match="backend TorchNativeBackend is owned by a live decode GraphRunner"):
        again()
    assert all(t is buffers[k] for k, t in backend.graph_buffers().items())  # nothing rebound
    fb = gen.decode(3)
    assert torch.allclose(runner.replay(fb), runner.eager(fb), atol=1e-5, rtol=1e-5)
    del runner
    again().capture()


def test_the_capture_order_counts_writes_and_an_unknown_op_as_one():
    """``capture_glue``'s capture order compares writes: in place, ``out=``, a custom op's mutated arguments; a fresh
    result is not one; an op whose schema cannot be found (a name of another form) counts as one (the glue refused,
    never a crash)."""
    from refimpl.graphs.runner import _writes

    log = [
        ("aten.copy_.default", True),
        ("aten.cumsum.default", True),
        ("aten.ones.default", True),
        ("refimpl.build_kv_indices.default", True),
        ("aten.copy_.default", False),  # launches nothing at replay: not counted
        ("somelib.op_without_an_overload", True),
        ("nosuchns.nosuchop.default", True),
    ]
    assert _writes(log) == {
        "aten.copy_.default": 1,
        "refimpl.build_kv_indices.default": 1,
        "somelib.op_without_an_overload": 1,
        "nosuchns.nosuchop.default": 1,
    }
