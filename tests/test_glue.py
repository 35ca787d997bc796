"""The metadata glue graph (issue 16): the runner replays a backend's replay hook from a small graph of its own, and the
checker's verdict (e) proves which shapes may be glued, naming the frozen buffer of those that may not."""

from unittest import mock

import pytest
import torch
from helpers import CAPTURE_BS, gate

from refimpl.backends import REGISTRY, find, load_backend_class
from refimpl.capabilities import capability
from refimpl.check import CheckSettings, glue_verdict, run_checks
from refimpl.config import CHAIN
from refimpl.graphs import CPUEmulatorEngine, make_engine
from refimpl.layout import KINDS
from refimpl.rig import Rig

SPEC = CHAIN
FAST = CheckSettings(
    capture_bs=CAPTURE_BS, raw_bs=(1, 3), max_context_len=32, num_slots=None, history=False
)  # (f): its own tests


def glued_rig(entry, case="decode", max_context_len=32, **kw):
    return Rig.build(
        entry, KINDS[case], SPEC, CPUEmulatorEngine(), capture_bs=CAPTURE_BS, max_context_len=max_context_len, glue=True, **kw
    )


def test_planted_host_value_passes_four_verdicts_and_fails_the_glue_verdict_naming_the_buffer():
    """SGLang's failure mode: a hook reading a value the host wrote is right eagerly and frozen once glued."""
    rows = run_checks(
        modes=["decode"], engine="cpu-emulator", settings=FAST, entries=[load_backend_class("broken_backends:HostValueInHook")]
    )
    assert [r.bs for r in rows] == [1, 3]
    for r in rows:
        assert r.passed and r.replay_matches_reference and not r.findings, r.findings  # (a)-(d): nothing wrong unglued
        assert r.glue_equals_eager is False
        glue = r.glue_findings
        assert all(f.startswith("not glue-safe: replays ") for f in glue), glue
        assert any(f.split("; first: ", 1)[1].startswith("kv_indptr:") for f in glue), glue  # kv_indices' view follows


def test_glued_runner_matches_eager_and_counts_its_replays():
    rig = glued_rig(find("triton", "unified")[0])
    runner = rig.runner
    assert set(runner.glue_graphs) == set(runner.capture_bs) and not runner.glue_refused
    for raw_bs in (1, 3, 4, 2):
        fb = rig.gen.for_mode(KINDS["decode"], raw_bs)
        torch.testing.assert_close(runner.replay(fb), runner.eager(fb))
        rig.gen.release(fb)
    assert runner.replays == {"glue": 4}


def test_glued_planted_backend_keeps_live_outputs_but_not_its_state():
    """Padded to a bigger graph, the frozen entry ends the padded row's range: the live rows' outputs are right, the
    state the graph reads is not (what notebook 05 shows)."""
    rig = glued_rig(load_backend_class("broken_backends:HostValueInHook"))
    fb = rig.gen.for_mode(KINDS["decode"], 3, seq_lens=[5, 9, 7])  # replayed by the bs-4 graph
    graph = rig.runner.replay(fb).clone()
    glued_indptr = rig.backend.cuda_graph_kv_indptr[:5].clone()
    torch.testing.assert_close(graph, rig.runner.eager(fb))
    assert glued_indptr.tolist() == [0, 5, 14, 21, 4]  # eager: [0, 5, 14, 21, 22]; 4 = bs * fill, frozen at capture


def test_a_hook_that_cannot_be_captured_stays_eager_and_says_why():
    rig = glued_rig(load_backend_class("broken_backends:HostReadInHook"))
    runner = rig.runner
    assert not any(runner.glue_graphs.values()) and set(runner.glue_refused) == set(runner.capture_bs)
    assert all("host synchronisation" in why for why in runner.glue_refused.values())
    fb = rig.gen.for_mode(KINDS["decode"], 3)
    torch.testing.assert_close(runner.replay(fb), runner.eager(fb))
    assert runner.replays == {"hook": 1}


@pytest.mark.parametrize(
    "entry, case",
    [
        (("flashinfer", "legacy"), "decode"),
        (("flashinfer_mla", "as-upstream"), "decode"),
        (("flashinfer", "legacy"), "draft_extend"),
        (("flashinfer", "unified"), "draft_decode"),
    ],
)
def test_flashinfer_plan_in_the_hook_is_refused_with_the_reason(entry, case):
    """Every FlashInfer re-plan in a hook glued whole, fast ones included (draft extend's calls only the kernel
    module's scheduling), and the step backends' wrappers of multi-step draft decode, five levels down (on the H200 a
    walk that stopped at four let that glue graph through once its capture stopped reading the host)."""
    ok, findings = glue_verdict(find(*entry)[0], case, CPUEmulatorEngine(), FAST)
    assert ok is None and findings and all("plan()" in f for f in findings), findings


@pytest.mark.parametrize("name", ["flashinfer", "flashinfer_mla"])
@pytest.mark.parametrize("case", ["decode", "idle", "target_verify", "draft_extend", "draft_extend_v2"])
def test_flashinfer_split_hook_glues_its_device_phase(name, case):
    """The unified FlashInfer hooks in two phases (SGLang PR #39825's shape): the plan (and FlashInfer's tree mask) stay
    eager, the kv indices and lengths are glued; verdict (e) finds the glued replays' state equal to the eager hook's."""
    ok, findings = glue_verdict(find(name, "unified")[0], case, CPUEmulatorEngine(), FAST)
    assert ok is True and not findings, findings


@pytest.mark.parametrize("name, case", [("flashinfer", "decode"), ("flashinfer", "target_verify"), ("flashinfer_mla", "decode")])
def test_glued_flashinfer_runner_plans_eagerly_and_matches_eager(name, case):
    """Lengths past one 128-key tile (a replay that kept the capture's plan reads too few keys), a plan per replay."""
    from refimpl.flashinfer_wrappers import count_plans

    rig = glued_rig(find(name, "unified")[0], case, max_context_len=400)
    runner = rig.runner
    assert runner.glue_split and set(runner.glue_graphs) == set(runner.capture_bs) and not runner.glue_refused
    for raw_bs, lens in ((1, [390]), (3, [300, 20, 350]), (4, [200, 390, 20, 300]), (2, [150, 5])):
        fb = rig.gen.for_mode(KINDS[case], raw_bs, seq_lens=lens)
        with count_plans(runner.backend) as plans:
            out = runner.replay(fb)
        assert plans[0] >= 1, "a glued replay that did not re-plan"
        # the rig's tolerance: on the GPU the eager prefill wrapper splits the keys otherwise (bf16 rounding); a replay
        # on the capture's plan is off by 0.14-1.56
        torch.testing.assert_close(out, runner.eager(fb), **rig.tol)
        rig.gen.release(fb)
    assert runner.replays == {"glue": 4}


def test_planted_split_that_skips_its_host_phase_fails_the_glue_verdict_naming_the_plan():
    ok, findings = glue_verdict(load_backend_class("broken_backends:SplitHostPhaseSkipped"), "decode", CPUEmulatorEngine(), FAST)
    assert ok is False and any(f.split("; first: ", 1)[1].startswith("plan[") for f in findings), findings


def test_a_hook_whose_first_warm_up_writes_otherwise_than_its_capture_is_refused():
    """vLLM PR #42444's class (a lazily run plan: the warm-up ran it, the capture recorded the "already planned" branch,
    no replay planned again): these hooks rebuild only when the size changes, so the glue capture's first warm-up
    writes the buffers and its capture does not. Verdict (e) refuses them, naming the writes. A hook that only makes a
    constant on its first call (a fresh tensor, reused) writes the same in both and glues."""
    for name in ("RefreshOnlyWhenSizeChanges", "IndptrOnlyWhenSizeChanges"):
        ok, findings = glue_verdict(load_backend_class(f"broken_backends:{name}"), "decode", CPUEmulatorEngine(), FAST)
        assert ok is None and findings, findings
        for f in findings:
            assert f.startswith("glue refused: capture order: ") and "aten.copy_.default x1 in the first warm-up, not in" in f
    ok, findings = glue_verdict(load_backend_class("broken_backends:CachesAConstant"), "decode", CPUEmulatorEngine(), FAST)
    assert ok is True and not findings, findings


def test_a_skipped_host_phase_is_named_by_its_plan_inputs_alone():
    """Real FlashInfer wrappers in CUDA-graph mode keep a plan info of offsets fixed by the batch size and no planned
    lengths (the H200 gate at d9938fa passed the skipped host phase on them): with only the recorded plan inputs left
    to compare, verdict (e) still names the plan."""
    import refimpl.flashinfer_wrappers as fw

    full = fw.plan_state
    inputs_only = lambda b: {k: v for k, v in full(b).items() if not k.endswith((".info", "_len"))}  # noqa: E731
    with mock.patch.object(fw, "plan_state", inputs_only):  # (no fixture: the mutant list calls this test too)
        ok, findings = glue_verdict(
            load_backend_class("broken_backends:SplitHostPhaseSkipped"), "decode", CPUEmulatorEngine(), FAST
        )
    assert ok is False and findings, findings
    assert all(f.split("; first: ", 1)[1].startswith(("plan[0].plan:", "plan[0].module.plan")) for f in findings), findings


def test_planted_split_reading_a_host_array_passes_four_verdicts_and_fails_the_glue_verdict_naming_the_buffer():
    """DFlash's failure (#39825): a device phase fed by a host array is right eagerly and frozen once glued."""
    rows = run_checks(
        modes=["decode"],
        engine="cpu-emulator",
        settings=FAST,
        entries=[load_backend_class("broken_backends:SplitDevicePhaseReadsHostArray")],
    )
    assert [r.bs for r in rows] == [1, 3]
    for r in rows:
        assert r.passed and r.replay_matches_reference and not r.findings, r.findings  # (a)-(d): nothing wrong unglued
        assert r.glue_equals_eager is False
        assert any(f.split("; first: ", 1)[1].startswith("paged_kv_indptr:") for f in r.glue_findings), r.glue_findings


@pytest.mark.parametrize(
    "entry, case, safe",
    [
        (("triton", "unified"), "draft_extend", True),
        (("triton", "unified"), "target_verify", False),
        (("triton", "legacy"), "draft_extend_v2", False),
        (("trtllm_mla", "unified"), "target_verify", True),
    ],
)
def test_glue_verdict_follows_what_the_hook_reads(entry, case, safe):
    """Triton's verify hook copies the batch's custom mask (a spec input the glue graph froze); its legacy draft extend
    lays qo_indptr out by accept lengths; TRTLLM-MLA's verify hook reads only static inputs."""
    ok, findings = glue_verdict(find(*entry)[0], case, CPUEmulatorEngine(), CheckSettings(spec=SPEC, raw_bs=(3,)))
    assert ok is safe, findings
    if not safe:
        assert any(("custom_mask:" if case == "target_verify" else "qo_indptr:") in f for f in findings), findings


def test_plan_counting_finds_the_wrappers_and_never_walks_the_world():
    """``count_plans`` looks for wrappers in the backend, not in the world's allocator lists (millions of ints at a long
    context: walking them made every glue capture take seconds on the H200)."""
    from refimpl.flashinfer_wrappers import _wrappers

    rig = Rig.build(
        find("flashinfer", "unified")[0], KINDS["decode"], SPEC, CPUEmulatorEngine(), capture_bs=(1, 2), max_context_len=32
    )
    found = list(_wrappers(rig.backend, set()))
    assert found and all(hasattr(w, "plan") for w in found)
    bare = type("Bare", (), {})()
    bare.world, rig.world.planted = rig.world, found[0]  # a wrapper reachable only through the world
    assert list(_wrappers(bare, set())) == []


SMALL = CheckSettings(spec=SPEC, raw_bs=(3,), glue_replays=2, max_context_len=64, num_slots=None)
INTERPRETED = ("triton", "wave", "trtllm_mla")  # Triton kernels: interpreted on a CPU, so the GPU gate runs these


@pytest.mark.parametrize(
    "entry", [(gate if e.name in INTERPRETED else pytest.param)(e, id=f"{e.name}-{e.variant}") for e in REGISTRY]
)
def test_each_backend_declares_what_the_glue_verdict_finds(entry):
    """``glue_refusal`` (what the runner and the capability matrix read) says a kind may be glued exactly when verdict
    (e), which captures the hook and replays it, finds it glue-safe."""
    for case in KINDS:
        seen = capability(entry, case)
        if seen[0] != "graph":
            continue
        ok, findings = glue_verdict(entry, case, make_engine("auto"), SMALL)
        assert (ok is True) == (seen[1] is None), (case, seen[1], findings)
