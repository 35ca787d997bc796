"""GPU + real flashinfer: the stand-ins compute what the real wrappers compute, in every mode."""

import pytest
import torch

from refimpl.backends.flashinfer import FlashInferAttnBackend
from refimpl.backends.flashinfer_mla import FlashInferMLAAttnBackend
from refimpl.batch import World
from refimpl.batchgen import BatchGenerator
from refimpl.check import CheckSettings, run_checks
from refimpl.config import CHAIN, TREE, ModelConfig
from refimpl.flashinfer_wrappers import flashinfer_available
from refimpl.model import TinyDecoder
from refimpl.modes import ForwardMode

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(flashinfer_available() is not None, reason=f"{flashinfer_available()}")]
MODES = [ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND, ForwardMode.DRAFT_EXTEND_V2]


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
    assert unified and all(r.passed for r in unified), [(r.backend, r.mode, r.bs, r.findings) for r in unified if not r.passed]
    stale = [r for r in rows if r.backend == "flashinfer_mla" and r.variant == "as-upstream" and r.mode == "decode"]
    assert stale and all(any(f.startswith("kv_indptr:") for f in r.findings) for r in stale)


@pytest.mark.parametrize("with_mask", [True, False], ids=["tree mask", "causal"])
def test_fast_prefill_plan_fills_what_the_real_full_plan_fills(with_mask):
    """On real wrappers: the mask packed into bits as flashinfer's own ``plan`` packs it (byte offsets, whole bytes per
    request), the partition scheduled from host indptrs, and the same attention output."""
    import flashinfer

    from refimpl.flashinfer_wrappers import make_workspace
    from refimpl.flashinfer_wrappers.fast_plan import fast_prefill_plan

    H, HKV, D, dev, g = 8, 2, 64, "cuda", torch.Generator(device="cuda").manual_seed(5)
    k, v = (torch.randn(512, HKV, D, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(2))

    def bound():
        i32 = dict(dtype=torch.int32, device=dev)
        bufs = dict(
            qo_indptr_buf=torch.zeros(4, **i32),
            paged_kv_indptr_buf=torch.zeros(4, **i32),
            paged_kv_indices_buf=torch.zeros(512, **i32),
            paged_kv_last_page_len_buf=torch.ones(3, **i32),
        )
        if with_mask:
            bufs.update(custom_mask_buf=torch.zeros(4096, dtype=torch.uint8, device=dev), mask_indptr_buf=torch.zeros(4, **i32))
        return flashinfer.BatchPrefillWithPagedKVCacheWrapper(make_workspace(dev, real=True), "NHD", use_cuda_graph=True, **bufs)

    def batch(kv_lens):
        kv_lens = torch.tensor(kv_lens, dtype=torch.int32)
        indptr = torch.zeros(4, dtype=torch.int32)
        indptr[1:] = torch.cumsum(kv_lens, 0)
        indices = torch.randperm(512, device=dev, generator=g)[: int(indptr[-1])].to(torch.int32)
        mask = torch.rand(int(4 * kv_lens.sum()), device=dev, generator=g) < 0.7 if with_mask else None
        return kv_lens, indptr, indices, mask

    qo = torch.arange(0, 16, 4, dtype=torch.int32)
    kw = dict(q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    fast, full = bound(), bound()
    first = batch([40, 9, 70])
    for w in (fast, full):
        w.plan(
            qo.to(dev),
            first[1].to(dev),
            first[2],
            torch.ones(3, dtype=torch.int32, device=dev),
            H,
            HKV,
            D,
            1,
            custom_mask=first[3],
            causal=not with_mask,
            **kw,
        )
    kv_lens, indptr, indices, mask = batch([33, 101, 5])
    fast._paged_kv_indptr_buf.copy_(indptr)  # the caller's part: the bound kv buffers, written in place
    fast._paged_kv_indices_buf[: len(indices)].copy_(indices)
    fast_prefill_plan(fast, qo, indptr, kv_lens, H, HKV, D, 1, causal=not with_mask, custom_mask=mask, **kw)
    full.plan(
        qo.to(dev),
        indptr.to(dev),
        indices,
        torch.ones(3, dtype=torch.int32, device=dev),
        H,
        HKV,
        D,
        1,
        custom_mask=mask,
        causal=not with_mask,
        **kw,
    )
    if with_mask:
        used = int(full._mask_indptr_buf[-1])
        assert torch.equal(fast._mask_indptr_buf, full._mask_indptr_buf)
        assert torch.equal(fast._custom_mask_buf[:used], full._custom_mask_buf[:used])
    assert torch.equal(fast._qo_indptr_buf, full._qo_indptr_buf)
    q = torch.randn(12, H, D, device=dev, dtype=torch.bfloat16, generator=g)
    torch.testing.assert_close(fast.run(q, (k, v)), full.run(q, (k, v)), rtol=0, atol=0)
