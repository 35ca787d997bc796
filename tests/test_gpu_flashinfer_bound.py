"""GPU + real flashinfer: what a captured FlashInfer kernel reads at replay besides its plan (notebook 04, "Plan state").

A graph captured around ``wrapper.run`` replays after the bound ``kv_indptr`` was overwritten by hand, with no new
``plan()``: FlashInfer's decode and paged-prefill kernels read the bound indptr (``paged_kv_t::get_length``), so the
output changes; the MLA kernel takes its key ranges from the plan's work list, so it does not. The stand-ins
(``refimpl/flashinfer_wrappers/standin.py``) must behave the same: ``tests/test_flashinfer_wrappers.py`` checks them on
the CPU.
"""

import pytest
import torch

from refimpl.backends.flashinfer import FlashInferAttnBackend
from refimpl.backends.flashinfer_mla import FlashInferMLAAttnBackend
from refimpl.batch import World
from refimpl.batchgen import BatchGenerator
from refimpl.config import CHAIN, GraphConfig, ModelConfig
from refimpl.flashinfer_wrappers import flashinfer_available
from refimpl.graphs import make_engine
from refimpl.graphs.runner import GraphRunner
from refimpl.model import TinyDecoder
from refimpl.modes import ForwardMode

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(flashinfer_available() is not None, reason=f"{flashinfer_available()}")]
MHA = ModelConfig(num_heads=8, num_kv_heads=2, head_dim=64, v_head_dim=64, dtype=torch.bfloat16)
MLA = ModelConfig(kind="mla", num_heads=16, dtype=torch.bfloat16)
CASES = {  # backend, model, mode, the bound indptr's key in graph_state, whether the kernel reads it
    "flashinfer decode": (FlashInferAttnBackend, MHA, ForwardMode.DECODE, "paged_kv_indptr", True),
    "flashinfer verify": (FlashInferAttnBackend, MHA, ForwardMode.TARGET_VERIFY, "paged_kv_indptr", True),
    "flashinfer_mla decode": (FlashInferMLAAttnBackend, MLA, ForwardMode.DECODE, "kv_indptr", False),
}


def replay_with_a_stale_bound_indptr(case: str) -> tuple[bool, list[int], list[int]]:
    """Capture bs 4, replay a batch of 3, then overwrite the bound kv indptr (each request one key) and replay the graph
    again without re-planning: (output changed, indptr before, indptr after)."""
    cls, cfg, mode, key, _ = CASES[case]
    world = World.create(cfg, max_context_len=96, pool_size=12, device="cuda")
    world.randomize_kv(0)
    backend = cls(world, CHAIN, prefer_real=True)
    gcfg = GraphConfig(max_bs=4, capture_bs=(4,), max_context_len=96, speculative=True)
    runner = GraphRunner(TinyDecoder(cfg, world.device), backend, make_engine("cuda"), mode, gcfg, CHAIN)
    runner.capture()
    fb = BatchGenerator(world, CHAIN, seed=1).for_mode(mode, 3)
    before = runner.replay(fb).clone()
    indptr = backend.graph_state(4, mode)[key]
    was = indptr.tolist()
    indptr[1:] = torch.arange(1, indptr.numel(), device=indptr.device, dtype=indptr.dtype)  # by hand, no plan()
    runner.graphs[4].replay()
    torch.cuda.synchronize()
    after = runner.outputs[4][: fb.num_tokens]
    return not torch.equal(after, before), was, indptr.tolist()


@pytest.mark.parametrize("case", list(CASES))
def test_which_real_kernels_read_the_bound_kv_indptr(case):
    changed, was, now = replay_with_a_stale_bound_indptr(case)
    assert changed == CASES[case][-1], f"{case}: bound kv_indptr {was} -> {now}, output changed: {changed}"


if __name__ == "__main__":  # the probe, printed: python tests/test_gpu_flashinfer_bound.py
    for name in CASES:
        print(name, replay_with_a_stale_bound_indptr(name))
