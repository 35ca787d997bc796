"""The third stage of the hooks (``docs/sglang_facts.md#three-stages-of-the-hooks``): SGLang 0.5.23's one entry point,
``init_forward_metadata_out_graph(fb, in_capture)``. The runner calls it before capture and replay; the base class
maps it onto a classic pair; ``triton/out_graph`` is written as 0.5.23's Triton and fills what the unified shape fills."""

import pytest
import torch
from helpers import check_class as check

from refimpl import ForwardMode
from refimpl.backends import REGISTRY
from refimpl.backends.base import GraphModeNotSupported, hook_interface
from refimpl.backends.triton import TritonAttnBackend, TritonAttnBackendOutGraph
from refimpl.course import backends as nb
from refimpl.graphs.runner import call_capture_hook


def test_every_registry_shape_says_which_interface_it_implements():
    kinds = {(e.name, e.variant): hook_interface(e.load()) for e in REGISTRY}
    assert kinds.pop(("triton", "out_graph")) == "out_graph"
    assert set(kinds.values()) == {"classic"}, kinds  # every other shape: the pair, driven through the base default


def test_the_stage_3_shape_has_no_classic_pair():
    b = TritonAttnBackendOutGraph(nb.setting("cpu").world, None)
    with pytest.raises(
        NotImplementedError, match="has no capture / replay pair .SGLang 0.5.23 removed it.: call init_forward_metadata_out_graph"
    ):
        b.init_forward_metadata_capture_cuda_graph(1, 1, None, None, None, ForwardMode.DECODE, None)


@pytest.mark.parametrize("mode", ["decode", "target_verify", "draft_extend_v2"])
def test_stage_3_fills_what_the_unified_shape_fills(mode):
    """After capture (the frozen views) and after a replay of the same padded batch, both shapes hold the same."""
    s, m = nb.setting("cpu"), ForwardMode[mode.upper()]
    spec = None if mode == "decode" else nb.CHAIN if mode.startswith("draft") else nb.TREE
    gen = s.gen_chain if mode.startswith("draft") else s.gen
    fb = gen.decode(3) if mode == "decode" else gen.target_verify(3) if mode == "target_verify" else gen.for_mode(m, 3)
    captured, replayed = [], []
    for cls in (TritonAttnBackend, TritonAttnBackendOutGraph):
        b = cls(s.world, spec)
        run = nb.runner(b, m, s)
        call_capture_hook(b, run.capture_batch(4))
        captured.append(b.graph_state(4, m))
        replayed.append(nb.replay_hooks(cls(s.world, spec), m, fb, s)[0])
    for unified, stage_3 in (captured, replayed):
        assert unified.keys() == stage_3.keys()
        for k, v in unified.items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(stage_3[k])), k


def test_stage_3_refuses_draft_extend_v1_as_sglang_0_5_23_has_none():
    with pytest.raises(GraphModeNotSupported):
        TritonAttnBackendOutGraph(nb.setting("cpu").world, nb.CHAIN).check_graph_mode(ForwardMode.DRAFT_EXTEND)


def test_the_checker_drives_a_stage_3_class_and_names_a_drift_inside_it():
    ok = check("refimpl.backends.triton:TritonAttnBackendOutGraph", modes=None)
    ran = [r for r in ok if not any(f.startswith("skipped") for f in r.findings)]
    assert {r.mode for r in ran} == {"decode", "idle", "target_verify", "draft_extend_v2"}
    assert all(r.passed and not r.findings for r in ran), [r.findings for r in ran]
    bad = check("broken_backends:OutGraphSkipsSplitsAtCapture", modes=("decode",))
    assert bad and all(r.capture_equals_replay is False and r.graph_equals_eager for r in bad)
    assert all(any(f.startswith("num_kv_splits:") for f in r.findings) for r in bad), [r.findings for r in bad]


def test_a_duck_typed_class_with_the_classic_pair_is_driven_through_the_base_default():
    rows = check("broken_backends:DuckClassicPair")
    assert rows and all(r.passed and not r.findings for r in rows), [r.findings for r in rows]
