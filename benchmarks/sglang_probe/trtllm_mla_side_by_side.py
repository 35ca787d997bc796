"""SGLang 0.5.23's own ``TRTLLMMLABackend`` on a CPU over a refimpl MLA ``World`` (page 64): its decode capture and replay
through ``init_forward_metadata_out_graph`` beside refimpl's unified TRTLLM-MLA on the same padded batch (raw bs 3 in the
bs-4 graph), the block table and lengths compared. A probe, not a tool.

    python benchmarks/sglang_probe/trtllm_mla_side_by_side.py /tmp/sgl [decode|target_verify|draft_extend_v2]  # full tree

Draft extend v2 (a chain, N = 4) is compared with refimpl's ``simplified`` variant, #29077's shape, which 0.5.23 runs.

What it stands in for, on a CPU only: FlashInfer's wrappers (the parent ``FlashInferMLAAttnBackend`` builds them; the
graph-metadata path does not use them), the fix-up module TRTLLM-MLA JIT-compiles at construction, the multi-CTA
kernel scratch (sized from the GPU's SM count), pinned host memory, and the ``device="cuda"`` that
``FlashInferMLAAttnBackend.init_cuda_graph_state`` hardcodes (tensor factories patched in this process).

Printed on the CPU machine, 2026-12-03: ``block_kv_indices`` (each row's live pages) equal, shapes (4, 64) both,
``max_seq_len_k`` 256 both; SGLang keeps a static int32 ``seq_lens_k`` for plain decode ([9, 200, 70, 1] after this
replay), which refimpl's unified shape does not (None). Draft extend v2: the block table equal, and ``max_seq_len_k``
256, ``seq_lens_k`` [9, 200, 70, 1], ``max_seq_len_q`` 4, ``sum_seq_lens_q`` 16, ``cu_seqlens_q`` [0, 4, 8, 12, 16],
``seq_lens_q`` [4, 4, 4, 4] on both sides. Target verify (a chain, N = 4): the block table over seq + N equal, and
``seq_lens_k`` [13, 204, 74, 5] on both sides (SGLang also keeps the same values in ``global_seq_lens_k``, for DCP).
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import side_by_side  # noqa: E402
from side_by_side import NoneNS  # noqa: E402


def _host_only_factories(torch) -> None:
    """Tensor factories that drop ``pin_memory`` and map ``device="cuda"`` to the CPU (this process only)."""
    for name in ("zeros", "empty", "ones", "full", "tensor"):
        real = getattr(torch, name)

        def host(*args, _real=real, **kwargs):
            kwargs.pop("pin_memory", None)
            if str(kwargs.get("device", "")) == "cuda":
                kwargs["device"] = "cpu"
            return _real(*args, **kwargs)

        setattr(torch, name, host)


def sglang_trtllm_mla_backend(world, cfg, spec=None):
    import torch
    from sglang.srt import runtime_context
    from sglang.srt.configs.model_config import AttentionArch
    from sglang.srt.layers.attention import flashinfer_mla_backend, trtllm_mla_backend
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
    from sglang.srt.server_args import ServerArgs

    from refimpl.adapters import sglang_stubs as sgl_stubs

    _host_only_factories(torch)
    trtllm_mla_backend._jit_fixup_module = lambda *a, **k: None
    trtllm_mla_backend.make_persistent_multi_ctas_kv_counter_buffer = lambda *a, **k: torch.zeros(1, dtype=torch.uint8)
    for name in ("BatchMLAPagedAttentionWrapper", "BatchPrefillWithRaggedKVCacheWrapper"):
        setattr(flashinfer_mla_backend, name, sgl_stubs._Stub())
    kw = {} if spec is None else dict(speculative_algorithm="EAGLE", speculative_num_steps=spec.num_steps)
    kw.update({} if spec is None else dict(speculative_eagle_topk=spec.topk, speculative_num_draft_tokens=spec.num_draft_tokens))
    args = ServerArgs(model_path="dummy", device="cpu", attention_backend="trtllm_mla", **kw)
    runtime_context.publish(args, role="test")
    runtime_context.get_parallel().override_permanently(tp_rank=0)
    P, heads = world.page_size, cfg.num_heads
    model_config = NoneNS(
        attention_arch=AttentionArch.MLA,
        num_attention_heads=heads,
        get_num_kv_heads=lambda *a: 1,
        get_max_num_attention_heads=lambda: heads,
        kv_lora_rank=cfg.kv_lora_rank,
        qk_nope_head_dim=cfg.qk_nope_head_dim,
        qk_rope_head_dim=cfg.qk_rope_head_dim,
        v_head_dim=cfg.kv_lora_rank,
        head_dim=cfg.kv_lora_rank + cfg.qk_rope_head_dim,
        context_len=world.max_context_len,
        scaling=1.0,
        is_encoder_decoder=False,
        hf_config=NoneNS(get_text_config=lambda: NoneNS()),
    )
    kv = NoneNS(start_layer=0, get_key_buffer=lambda i: world.kv_cache.kv[i], get_value_buffer=lambda i: world.kv_cache.kv[i])
    pool = types.SimpleNamespace(size=world.req_to_token_pool.size, req_to_token=world.req_to_token)
    translator = KVIndexTranslator(
        req_to_token=world.req_to_token, token_to_kv_pool_allocator=None, token_to_kv_pool=kv, page_size=P, device="cpu"
    )
    runner = NoneNS(
        req_to_token_pool=pool,
        token_to_kv_pool=kv,
        page_size=P,
        kv_index_translator=translator,
        model_config=model_config,
        device="cpu",
        gpu_id=0,
        is_draft_worker=False,
        kv_cache_dtype=torch.float32,
        dtype=torch.float32,
        max_running_requests=world.req_to_token_pool.size,
        spec_algorithm=NoneNS(is_none=lambda: spec is None, is_eagle=lambda: spec is not None, is_dspark=lambda: False),
        decode_num_tokens_per_req=lambda: 1,
        server_args=NoneNS(),
    )
    return trtllm_mla_backend.TRTLLMMLABackend(runner)


def main(root: Path, mode: str) -> None:
    os.environ["TRITON_INTERPRET"] = "1"
    side_by_side.setup(root)
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode as SglMode

    from refimpl.backends import find
    from refimpl.batch import World
    from refimpl.batchgen import BatchGenerator
    from refimpl.config import CHAIN, GraphConfig, tiny_model_config
    from refimpl.graphs import CPUEmulatorEngine
    from refimpl.graphs.runner import GraphRunner, call_capture_hook, call_replay_hook
    from refimpl.layout import GraphKind
    from refimpl.model import TinyDecoder

    dev2, verify = mode == "draft_extend_v2", mode == "target_verify"
    spec = CHAIN if (dev2 or verify) else None  # a chain: N = S + 1 rows per request
    variant = "simplified" if dev2 else "unified"  # draft extend: #29077's shape, what 0.5.23 runs
    entry = next(e for e in find("trtllm_mla") if e.variant == variant)
    cfg, L = tiny_model_config("mla", torch.float32, "cpu"), 256
    world = World.create(cfg, max_context_len=L, pool_size=8, page_size=entry.page_size)
    theirs, ours = sglang_trtllm_mla_backend(world, cfg, spec), entry.load(False)(world, spec)
    gcfg = GraphConfig(max_bs=4, capture_bs=(1, 4), max_context_len=L, speculative=dev2 or verify)
    runner = GraphRunner(TinyDecoder(cfg), ours, CPUEmulatorEngine(), GraphKind.parse(mode), gcfg, spec)
    fb = BatchGenerator(world, spec, seed=3).for_mode(mode, 3, seq_lens=[9, 200, 70])
    padded, cap = runner.padded_batch(fb), runner.capture_batch(4)

    def sglang_batch(x):
        fields = dict(batch_size=x.batch_size, req_pool_indices=x.req_pool_indices, seq_lens=x.seq_lens)
        fields.update(seq_lens_cpu=x.seq_lens_cpu, seq_lens_sum=x.seq_lens_sum, out_cache_loc=x.out_cache_loc)
        fields.update(positions=x.positions, input_ids=x.input_ids)
        sgl_mode, info = SglMode.DECODE, None
        if dev2:
            sgl_mode, info = SglMode.DRAFT_EXTEND_V2, NoneNS(accept_length=x.spec_info.accept_length)
        if verify:
            sgl_mode, info = SglMode.TARGET_VERIFY, NoneNS(custom_mask=x.spec_info.custom_mask, num_tokens_per_req=rows)
        return NoneNS(**fields, forward_mode=sgl_mode, spec_info=info, encoder_lens=None, kv_loc_plan=None)

    rows = spec.num_draft_tokens if (dev2 or verify) else 1
    theirs.init_cuda_graph_state(4, 4 * rows)
    theirs.init_forward_metadata_out_graph(sglang_batch(cap), in_capture=True)
    theirs.init_forward_metadata_out_graph(sglang_batch(padded), in_capture=False)
    call_capture_hook(ours, cap)
    call_replay_hook(ours, padded)
    a, b = theirs.decode_cuda_graph_metadata[4], ours.decode_cuda_graph_metadata[4]
    span = rows if verify else 0  # verify: the block table covers the N drafts too
    pages = [-(-(int(s) + span) // world.page_size) for s in padded.seq_lens.tolist()]
    rows = [
        torch.equal(a.block_kv_indices[r, :p].to(b.block_kv_indices.dtype), b.block_kv_indices[r, :p])
        for r, p in enumerate(pages)
    ]
    print(f"trtllm_mla {mode} (refimpl {variant}) block_kv_indices (live pages)", "equal" if all(rows) else "DIFFER")
    print("block table shapes", tuple(a.block_kv_indices.shape), tuple(b.block_kv_indices.shape))
    show = lambda v: v.tolist() if isinstance(v, torch.Tensor) else v  # noqa: E731
    names = ("max_seq_len_k", "seq_lens_k", "max_seq_len_q", "sum_seq_lens_q", "cu_seqlens_q", "seq_lens_q")
    for name in names + (("global_seq_lens_k",) if verify else ()):
        print(name, "sglang", show(getattr(a, name, None)), "refimpl", show(getattr(b, name, None)))


if __name__ == "__main__":
    args = sys.argv[1:] + [None] * 2
    main(Path(args[0] or ".sgl/0.5.23"), args[1] or "decode")
