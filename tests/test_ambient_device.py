"""Library code names the device of every tensor it makes, so an ambient default device (a
``with torch.device(...)`` block or ``torch.set_default_device``, common in GPU notebooks and
test fixtures) changes nothing. On the H200 such a fixture turned host tensors (``seq_lens_cpu``,
plan indptrs, reference states) into CUDA tensors and 20 tests failed.

Here the ambient device is ``meta``: a tensor the library makes without naming its device lands
on ``meta``, has no data, and the first time it meets real data the run fails. Every backend's
must-pass shape runs its graph modes through the checker, the fuzzer and the capability matrix
inside the block, on this machine's device, and must give the verdicts it gives outside."""

import random

import pytest
import torch
from helpers import gate

from refimpl import capabilities
from refimpl.backends import REGISTRY, must_pass
from refimpl.check import CheckSettings, run_checks
from refimpl.flashinfer_wrappers import flashinfer_available
from refimpl.fuzz import CHAIN, TREE, FuzzParams, FuzzTarget
from refimpl.graphs import make_engine

SETTINGS = CheckSettings(capture_bs=(4,), raw_bs=(3,), max_context_len=40, num_slots=None, history=False)
ENTRIES = [e for e in REGISTRY if must_pass(e.variant) and e.variant in ("unified", "in_graph")]
LARGER = {"wave", "trtllm_mla", "triton", "flashinfer_mla", "torch_native_mla"}  # CPU CI: 3 (an MLA one); the gate: all
ENTRIES = [(gate if e.name in LARGER else pytest.param)(e, id=f"{e.name}-{e.variant}") for e in ENTRIES]


@pytest.mark.parametrize("entry", ENTRIES)
def test_checker_under_a_meta_default_device(entry):
    if entry.name in ("flashinfer", "flashinfer_mla") and flashinfer_available() is None:
        pytest.skip(
            "the real flashinfer wrappers serve this backend here, and flashinfer's own "
            "plan() makes host tensors without naming a device (0.7.2: MLA's staged workspace "
            "copy too): not refimpl's code (the stand-in path runs this test where flashinfer's "
            "kernels do not)"
        )
    modes = ["idle", "target_verify", "draft_extend_v2", "draft_decode"]
    if entry.name in ("wave", "triton"):  # Triton kernels run interpreted on CPU: keep it short
        modes = modes[:2] if entry.name == "wave" else modes[:3]  # (draft decode: the others)
    with torch.device("meta"):
        rows = run_checks(entries=[entry], settings=SETTINGS, modes=modes)
    ran = [r for r in rows if not r.findings or not r.findings[0].startswith("skipped")]
    assert ran, rows
    for r in ran:
        assert r.passed and not r.findings, (r.mode, r.bs, r.findings)


SMALL = dict(capture_bs=(3,), num_layers=1, max_context_len=72, num_slots=None)


def test_fuzz_and_matrix_under_a_meta_default_device():
    entry = next(e for e in REGISTRY if (e.name, e.variant) == ("triton", "unified"))
    with torch.device("meta"):
        target = FuzzTarget(entry, "target_verify", TREE, make_engine("auto"), **SMALL)
        params = target.draw(random.Random(0))
        assert target.check(params) == []
        target = FuzzTarget(entry, "draft_decode", CHAIN, make_engine("auto"), **SMALL)
        assert target.check(FuzzParams(raw_bs=2, seq_lens=[5, 17])) == []
        rows = capabilities.matrix([e for e in REGISTRY if e.name == MATRIX_BACKEND])
    assert rows == capabilities.matrix([e for e in REGISTRY if e.name == MATRIX_BACKEND])


# the stand-ins where they serve FlashInfer-MLA; where the real wrappers do, flashinfer's own plan() makes host tensors
# without naming a device (see above), so the matrix runs the MLA hello world instead
MATRIX_BACKEND = "flashinfer_mla" if flashinfer_available() is not None else "torch_native_mla"
