"""The third stage of the hooks (``docs/sglang_facts.md#three-stages-of-the-hooks``): SGLang 0.5.23's one entry point,
``init_forward_metadata_out_graph(fb, in_capture)``. The runner calls only it; the base class maps it onto a classic
pair; ``triton/out_graph`` is written as 0.5.23's Triton and fills what the unified shape fills."""

import pytest
import torch
from helpers import CAPTURE_BS

from refimpl import ForwardMode
from refimpl.backends import REGISTRY, load_backend_class
from refimpl.backends.base import hook_interface
from refimpl.backends.triton import TritonAttnBackend, TritonAttnBackendOutGraph
from refimpl.check import CheckSettings, run_checks
from refimpl.course import backends as nb

FAST = CheckSettings(capture_bs=CAPTURE_BS, raw_bs=(1, 3), max_context_len=32, num_slots=None)


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


@pytest.mark.parametrize("mode", ["decode", "target_verify", "draft_extend", "draft_extend_v2"])
def test_stage_3_fills_what_the_unified_shape_fills(mode):
    s = nb.setting("cpu")
    spec = None if mode == "decode" else nb.CHAIN if mode.startswith("draft") else nb.TREE
    gen = s.gen_chain if mode.startswith("draft") else s.gen
    fb = {"decode": lambda: gen.decode(3), "target_verify": lambda: gen.target_verify(3)}.get(mode)
    fb = fb() if fb else gen.for_mode(ForwardMode[mode.upper()], 3)
    states = [
        nb.replay_hooks(cls(s.world, spec), ForwardMode[mode.upper()], fb, s)[0]
        for cls in (TritonAttnBackend, TritonAttnBackendOutGraph)
    ]
    assert states[0].keys() == states[1].keys()
    for k, v in states[0].items():
        assert torch.equal(torch.as_tensor(v), torch.as_tensor(states[1][k])), k


def test_the_checker_drives_a_stage_3_class_and_names_a_drift_inside_it():
    ok = run_checks(
        modes=("decode",),
        engine="cpu-emulator",
        settings=FAST,
        entries=[load_backend_class("refimpl.backends.triton:TritonAttnBackendOutGraph")],
    )
    assert ok and all(r.passed and not r.findings for r in ok), [r.findings for r in ok]
    bad = run_checks(
        modes=("decode",),
        engine="cpu-emulator",
        settings=FAST,
        entries=[load_backend_class("broken_backends:OutGraphSkipsSplitsAtCapture")],
    )
    assert all(r.capture_equals_replay is False and r.graph_equals_eager for r in bad)
    assert all(any(f.startswith("num_kv_splits:") for f in r.findings) for r in bad), [r.findings for r in bad]
