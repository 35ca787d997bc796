"""GPU + real flashinfer: the stand-ins compute what the real wrappers compute, in every mode."""

import pytest
import torch

from refimpl.backends.flashinfer import FlashInferAttnBackend
from refimpl.backends.flashinfer_mla import FlashInferMLAAttnBackend
from refimpl.batch import World
from refimpl.batchgen import BatchGenerator
from refimpl.check import CheckSettings, run_checks
from refimpl.config import ModelConfig, SpecConfig
from refimpl.flashinfer_wrappers import flashinfer_available
from refimpl.model import TinyDecoder
from refimpl.modes import ForwardMode

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(flashinfer_available() is not None, reason=f"{flashinfer_available()}"),
]
CHAIN = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)
TREE = SpecConfig(num_steps=3, topk=2, num_draft_tokens=6)
MODES = [ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND,
         ForwardMode.DRAFT_EXTEND_V2]  # fmt: skip


def _outputs(backend_cls, cfg, spec, mode, seed):
    world = World.create(cfg, max_context_len=96, pool_size=24, device="cuda")
    world.randomize_kv(seed)
    model = TinyDecoder(cfg, world.device)
    fb = BatchGenerator(world, spec, seed=seed).for_mode(mode, 5)
    outs = []
    for prefer_real in (True, False):
        b = backend_cls(world, spec, prefer_real=prefer_real)
        assert getattr(b.fi.BatchDecodeWithPagedKVCacheWrapper, "IS_STANDIN", False) is not prefer_real
        b.init_forward_metadata(fb)
        outs.append(model(fb, b).float())
    return outs


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.label)
@pytest.mark.parametrize("spec", [CHAIN, TREE], ids=["chain", "tree"])
def test_standin_matches_real_flashinfer_mha(mode, spec):
    cfg = ModelConfig(num_heads=8, num_kv_heads=2, head_dim=64, v_head_dim=64, dtype=torch.bfloat16)
    real, stand_in = _outputs(FlashInferAttnBackend, cfg, spec, mode, seed=3)
    torch.testing.assert_close(stand_in, real, rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.label)
def test_standin_matches_real_flashinfer_mla(mode):
    cfg = ModelConfig(kind="mla", num_heads=16, dtype=torch.bfloat16)
    real, stand_in = _outputs(FlashInferMLAAttnBackend, cfg, CHAIN, mode, seed=4)
    torch.testing.assert_close(stand_in, real, rtol=3e-2, atol=3e-2)


def test_checker_with_real_flashinfer_on_cuda():
    rows = run_checks(["flashinfer", "flashinfer_mla"], None, None, "cuda", CheckSettings())
    unified = [r for r in rows if r.variant == "unified"]
    assert unified and all(r.passed for r in unified), [
        (r.backend, r.mode, r.bs, r.findings) for r in unified if not r.passed
    ]
    stale = [r for r in rows if r.backend == "flashinfer_mla" and r.variant == "as-upstream" and r.mode == "decode"]
    assert stale and all(any(f.startswith("kv_indptr:") for f in r.findings) for r in stale)
