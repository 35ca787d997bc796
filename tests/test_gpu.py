"""GPU only: the CUDA engine honours the same contract as the emulator, on the same programs."""

import pytest
import torch

from refimpl.backends.torch_native import TorchNativeBackend
from refimpl.batch import World
from refimpl.batchgen import BatchGenerator
from refimpl.check import CheckSettings, run_checks
from refimpl.config import CHAIN, TREE, GraphConfig, ModelConfig
from refimpl.graphs import CPUEmulatorEngine, make_engine
from refimpl.graphs.runner import GraphRunner
from refimpl.model import TinyDecoder
from refimpl.modes import ForwardMode

pytestmark = pytest.mark.gpu


def test_cuda_engine_replays_on_captured_storage():
    eng = make_engine("cuda")
    x = torch.ones(8, device="cuda")
    g = eng.new_graph()
    eng.warmup(lambda: x * 2, 2)
    y = g.capture(lambda: x * 2 + 1)
    x.fill_(5.0)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, torch.full_like(y, 11.0))
    assert g.kernels() == {"aten.mul.Tensor": 1, "aten.add.Tensor": 1}, g.ops()


def test_dropped_graphs_leave_the_engines_live_graphs_intact():
    """Graphs captured on one stream share PyTorch's cuBLAS workspace for it, and destroying any of them freed it
    (pytorch#193402): the checker's dropped glue graphs and refused captures made a live step graph's split-K GEMM
    write to freed memory (cudaErrorIllegalAddress on the H200, at 757ed71). The engine now keeps every graph it began,
    so a live graph replays right after others are dropped, the cache is emptied and the memory reused."""
    import gc

    from refimpl.graphs import GraphCaptureError

    eng = make_engine("cuda")
    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)  # a long K: cuBLAS splits it, with a workspace
    w = torch.randn(4096, 64, device="cuda", dtype=torch.bfloat16)
    eng.warmup(lambda: x @ w, 2)
    live = eng.new_graph()
    y = live.capture(lambda: x @ w)
    for _ in range(3):
        eng.new_graph().capture(lambda: x @ w)  # a glue graph, dropped at once
        with pytest.raises(GraphCaptureError):
            eng.new_graph().capture(lambda: (x @ w).sum().item())  # a refused capture
    gc.collect()
    torch.cuda.empty_cache()
    junk = [torch.full((1 << 20,), 3.0, device="cuda") for _ in range(32)]  # freed memory taken by others
    x.copy_(torch.randn_like(x))
    live.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, x @ w)
    assert all(torch.all(j == 3.0) for j in junk)  # and nothing written into them


@pytest.mark.parametrize("kind", ["mha", "mla"])
@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.TARGET_VERIFY])
def test_same_program_same_output_on_cuda_and_emulator(kind, mode):
    spec = TREE
    cfg = ModelConfig(kind=kind, num_heads=2 if kind == "mla" else 4, dtype=torch.float32)
    L = 48
    # On a CUDA machine the emulator runs on CUDA tensors (Triton cannot run on CPU tensors
    # there); both engines replay the same program on twin worlds.
    emu_world = World.create(cfg, max_context_len=L, pool_size=24, device="cuda")
    emu_world.randomize_kv(0)
    gcfg = GraphConfig(max_bs=4, capture_bs=(1, 2, 4), max_context_len=L)
    gen = BatchGenerator(emu_world, spec, seed=5)
    batches = [gen.for_mode(mode, bs) for bs in (1, 3, 4)]
    cuda_world = emu_world.clone_to("cuda")  # after allocation: identical tables and cache
    outs = {}
    for world, eng in ((emu_world, CPUEmulatorEngine("cuda")), (cuda_world, make_engine("cuda"))):
        runner = GraphRunner(TinyDecoder(cfg, world.device), TorchNativeBackend(world, spec), eng, mode, gcfg, spec)
        runner.capture()
        outs[eng.name] = [runner.replay(fb.to_world(world)).clone().cpu() for fb in batches]
        if eng.name == "cuda":
            assert runner.capture_records[0].pool_bytes > 0
    for a, b in zip(outs["emulator-cuda"], outs["cuda"]):
        torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-4)


def test_checker_passes_unified_rows_on_cuda():
    rows = run_checks(
        ["torch_native", "torch_native_mla"], ["decode", "target_verify", "idle"], None, "cuda", CheckSettings(raw_bs=(1, 3, 4))
    )
    assert rows and all(r.engine == "cuda" for r in rows)
    assert all(r.passed for r in rows), [(r.backend, r.mode, r.bs, r.findings) for r in rows]


def test_cuda_liveness_names_a_freed_input_and_costs_nothing_when_off():
    """The checker's CUDA engine (``liveness=True``): a graph whose input is freed after capture refuses to replay,
    naming the op's argument, where a plain CUDA graph would read the freed block; the input kept alive, it replays
    right. The plain engine (the bench's) keeps no record."""
    from refimpl.graphs import GraphReplayError

    eng = make_engine("cuda", liveness=True)
    xs, keep = [torch.ones(8, device="cuda")], torch.ones(8, device="cuda")
    g, h = eng.new_graph(), eng.new_graph()
    y = g.capture(lambda: xs[0] * 2)
    z = h.capture(lambda: keep * 3)
    xs.clear()  # its only owner: the graph read it and did not allocate it
    with pytest.raises(GraphReplayError, match=r"aten.mul.Tensor's self \(\(8,\) float32, .*\) was freed after capture"):
        g.replay()
    h.replay()
    torch.cuda.synchronize()
    assert torch.equal(z, torch.full_like(z, 3.0)) and y.shape == (8,)
    plain = make_engine("cuda").new_graph()
    plain.capture(lambda: keep * 4)
    assert plain._borrowed == []


def test_checker_on_cuda_names_a_scratch_reallocated_at_replay():
    """vLLM #55341's class on the CUDA engine: the replay hook re-allocates the split-KV scratch the graph baked in; the
    checker's engine refuses the replay, naming ``attn_logits``, as the emulator does; Triton's own passes."""
    from refimpl.backends import load_backend_class

    settings = CheckSettings(raw_bs=(3,), max_context_len=64, num_slots=None)
    entry = [load_backend_class("broken_backends:ScratchReallocatedAtReplay")]
    rows = run_checks(None, ["decode"], None, "cuda", settings, entries=entry)
    assert rows and all(r.status == "FAIL" for r in rows)
    assert all(any("attn_logits" in f and "was freed after capture" in f for f in r.findings) for r in rows), [
        r.findings for r in rows
    ]
    good = run_checks(["triton"], ["decode"], ["unified"], "cuda", settings)
    assert all(r.passed for r in good), [r.findings for r in good]


@pytest.mark.parametrize(
    "row",
    ["triton/unified/decode", "trtllm_mla/in_graph/draft_extend_v2", "flashinfer/unified/decode", "flashinfer/legacy/decode"],
)
def test_glue_graph_on_cuda(row):
    """On real CUDA graphs: a glue-safe hook replayed from its glue graph gives the eager output on fresh batches, one
    glue replay each; FlashInfer's unified hook (real wrappers: bf16) glues its device phase, its plan run eagerly
    first (the split); the legacy hook, one phase that plans, is refused for its plan() and stays eager."""
    from refimpl.backends import find
    from refimpl.layout import KINDS
    from refimpl.rig import Rig

    name, variant, mode = row.split("/")
    spec = CHAIN
    rig = Rig.build(
        find(name, variant)[0], KINDS[mode], spec, make_engine("cuda"), capture_bs=(1, 2, 4), max_context_len=64, glue=True
    )
    runner, planned = rig.runner, variant == "legacy"
    assert bool(runner.glue_refused) == planned, runner.glue_refused
    assert all("plan()" in why for why in runner.glue_refused.values())
    assert runner.glue_split == (row == "flashinfer/unified/decode")
    for raw_bs in (1, 3, 4):
        fb = rig.gen.for_mode(KINDS[mode], raw_bs)
        torch.testing.assert_close(runner.replay(fb).float(), runner.eager(fb).float(), **rig.tol)
        rig.gen.release(fb)
    assert runner.replays == ({"hook": 3} if planned else {"glue": 3})
