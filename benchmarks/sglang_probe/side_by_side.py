"""SGLang 0.5.23's own ``TritonAttnBackend`` on a CPU (Triton interpreter) over a refimpl ``World``: its capture and
replay through 0.5.23's interface (``init_forward_metadata_out_graph(forward_batch, in_capture)``) beside refimpl's
unified Triton hooks on the same padded batch (raw bs 3 in the bs-4 graph), graph buffers compared. A probe, not a tool.

    bash scripts/fetch_sglang.sh /tmp/sgl
    python benchmarks/sglang_probe/side_by_side.py /tmp/sgl decode    # or target_verify, draft_extend_v2, draft_decode
    python benchmarks/sglang_probe/side_by_side.py /tmp/sgl decode wave    # Wave (the full tree: trim.py keeps Triton's)

Printed on the CPU machine, 2026-12-03: decode, ``kv_indptr``, ``kv_indices``, ``num_kv_splits`` equal; target verify
(``refimpl.config.TREE``), ``qo_indptr``, ``kv_indptr``, ``kv_indices``, ``mask_indptr``, ``custom_mask`` equal; draft
extend v2, ``qo_indptr``, ``kv_indptr``, ``kv_indices`` equal (SGLang's replay reads a padded ``extend_seq_lens_tensor``
of the graph's size; its padded rows are given N here, an assumption: with seq_len 1 they attend nothing either way).
SGLang 0.5.23 has no ``ForwardMode.DRAFT_EXTEND`` (v1): only ``DRAFT_EXTEND_V2``. Wave: decode equal; verify equal while
the tree mask fits ``PROBE_SEQ_LENS=3,4,2``, and at the default lengths SGLang's replay raises (its mask buffer is
``max_bs * max_context_len``: open PR sgl-project/sglang#29581); draft extend v2 is not captured by 0.5.23's Wave. SGLang's
``device_core_count`` is set to the 8 refimpl assumes on a CPU: SGLang sees no cores there and fills ``max_kv_splits``.
"""

from __future__ import annotations

import os
import sys
import types
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent


class NoneNS(types.SimpleNamespace):
    """A config whose unknown fields read as None (fields the tiny model does not set)."""

    def __getattr__(self, k):
        if k.startswith("__"):
            raise AttributeError(k)
        return None


def sglang_triton_backend(world, cfg, spec=None, cls=None):
    """SGLang's ``TritonAttnBackend`` over ``world`` on the adapter's stand-in model runner
    (``refimpl.adapters.sglang.model_runner``: the pools, a static-pool index translator, the model config, a published
    dummy-model ``ServerArgs``; ``spec``: EAGLE with its steps, topk and draft tokens; ``cls``: another backend class
    built the same way, e.g. ``WaveAttnBackend``, which reads its tensor-parallel rank: 0 here)."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    from refimpl.adapters.sglang import model_runner

    backend = (cls or TritonAttnBackend)(model_runner(world, spec))
    if world.device.type == "cpu":
        backend.device_core_count = 8  # refimpl on a CPU assumes 8 (SGLang sees none there and fills max_kv_splits)
    return backend


def setup(root: Path) -> None:
    """SGLang's trimmed or full tree and its two real dependencies on the path, the stand-ins installed (on a CPU,
    refimpl's import sets the Triton interpreter up before any @triton.jit)."""
    os.environ["REFIMPL_SGLANG"] = str(root)  # where refimpl.adapters.sglang looks, when imported
    sys.path[:0] = [str(HERE), str(root / "site"), str(root / "deps")]
    warnings.filterwarnings("ignore")
    import refimpl  # noqa: F401
    from refimpl.adapters import sglang_stubs as sgl_stubs

    # SGLANG_PROBE_FALLBACK=1: any module still missing becomes a stand-in (sgl_stubs.FALLBACK lists them)
    sgl_stubs.install(sgl_stubs.ROOTS, fallback=os.environ.get("SGLANG_PROBE_FALLBACK") == "1")


def sglang_wave_class():
    """SGLang's ``WaveAttnBackend`` class: its kernels need ``wave_lang`` (stand-ins here, like ``iree``), and its
    ``init_cuda_graph_state`` asks them for the split-KV scratch shapes, answered here as the Triton decode's."""
    from refimpl.adapters import sglang_stubs as sgl_stubs

    sgl_stubs.install(["wave_lang", "iree"])
    import sglang.srt.layers.attention.wave_ops.decode_attention as wave_decode
    from sglang.srt.layers.attention.wave_backend import WaveAttnBackend

    wave_decode.decode_attention_intermediate_arrays_shapes = lambda bs, dv, h, s: ((bs, h, s, dv), (bs, h, s))
    return WaveAttnBackend


def draft_decode() -> None:
    """Multi-step draft decode (Triton, ``TREE``): SGLang's ``TritonMultiStepDraftBackend`` replay beside refimpl's
    unified multi-step wrapper on the same padded batch (raw bs 3 in the bs-4 graph). SGLang writes each step's
    ``kv_indptr`` from the batch's ``positions`` and its ``kv_indices`` from ``seq_lens``; refimpl both from ``seq_lens``:
    the live rows agree, and the padded request's rows (position 0, ``seq_len`` the fill value 1) differ by one entry
    per branch in the indptr only (their output is dropped)."""
    import torch
    from sglang.srt.layers.attention.triton_backend import TritonMultiStepDraftBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode as SglMode

    from refimpl.backends import find
    from refimpl.batch import World
    from refimpl.batchgen import BatchGenerator
    from refimpl.config import TREE, GraphConfig, ModelConfig
    from refimpl.graphs import CPUEmulatorEngine
    from refimpl.graphs.runner import GraphRunner, call_capture_hook, call_replay_hook
    from refimpl.layout import GraphKind
    from refimpl.model import MultiStepDraftProgram, TinyDecoder

    spec, cfg, S = TREE, ModelConfig(), TREE.num_steps
    world = World.create(cfg, max_context_len=64, pool_size=8)
    theirs = sglang_triton_backend(world, cfg, spec, lambda r: TritonMultiStepDraftBackend(r, spec.topk, S))
    for step in theirs.attn_backends:
        step.device_core_count = 8  # as for one backend (sglang_triton_backend)
    ours = next(e for e in find("triton") if e.variant == "unified").load(True)(world, spec)
    gcfg = GraphConfig(max_bs=4, capture_bs=(1, 4), max_context_len=64, speculative=True)
    program = MultiStepDraftProgram(TinyDecoder(cfg), S)
    runner = GraphRunner(program, ours, CPUEmulatorEngine(), GraphKind.parse("draft_decode"), gcfg, spec)
    fb = BatchGenerator(world, spec, seed=3).for_mode("draft_decode", 3, seq_lens=[9, 40, 17])
    x = runner.padded_batch(fb)
    fields = dict(batch_size=4, req_pool_indices=x.req_pool_indices, seq_lens=x.seq_lens, seq_lens_cpu=x.seq_lens_cpu)
    fields.update(seq_lens_sum=x.seq_lens_sum, positions=x.positions, out_cache_loc=x.out_cache_loc)
    theirs_in = NoneNS(**fields, forward_mode=SglMode.DECODE, spec_info=NoneNS(), encoder_lens=None, kv_loc_plan=None)
    theirs.init_cuda_graph_state(4, 4 * spec.topk)
    theirs.init_forward_metadata_out_graph(theirs_in, in_capture=False)
    call_capture_hook(ours, runner.capture_batch(4))
    call_replay_hook(ours, x)
    live, rows = 3 * spec.topk, 4 * spec.topk
    same = lambda a, b: "equal" if torch.equal(a.to(b.dtype), b) else f"DIFFER sglang={a.tolist()} refimpl={b.tolist()}"  # noqa: E731
    for i in range(S - 1):
        a, b = theirs.kv_indptr[i, : rows + 1], ours.kv_indptr[i, : rows + 1]
        print(f"triton draft_decode step {i} kv_indptr, live rows", same(a[: live + 1], b[: live + 1]))
        print(f"triton draft_decode step {i} kv_indptr, the padded request's rows", same(a[live:], b[live:]))
        n = int(b[live])
        print(
            f"triton draft_decode step {i} kv_indices, live rows",
            same(theirs.cuda_graph_kv_indices[i, :n], ours.cuda_graph_kv_indices[i, :n]),
        )
    print("triton draft_decode num_kv_splits", same(theirs.cuda_graph_num_kv_splits[:rows], ours.cuda_graph_num_kv_splits[:rows]))


def main(root: Path, mode: str, name: str = "triton") -> None:
    os.environ["TRITON_INTERPRET"] = "1"
    setup(root)
    if mode == "draft_decode":
        return draft_decode()
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode as SglMode

    from refimpl.backends import find
    from refimpl.batch import World
    from refimpl.batchgen import BatchGenerator
    from refimpl.config import TREE, GraphConfig, ModelConfig
    from refimpl.graphs import CPUEmulatorEngine
    from refimpl.graphs.runner import GraphRunner, call_capture_hook, call_replay_hook
    from refimpl.layout import GraphKind
    from refimpl.model import TinyDecoder

    verify, dev2 = mode == "target_verify", mode == "draft_extend_v2"
    spec, cfg = TREE if (verify or dev2) else None, ModelConfig()
    rows = spec.num_draft_tokens if (verify or dev2) else 1
    world = World.create(cfg, max_context_len=64, pool_size=8)
    theirs = sglang_triton_backend(world, cfg, spec, sglang_wave_class() if name == "wave" else None)
    ours = next(e for e in find(name) if e.variant == "unified").load(False)(world, spec)
    gcfg = GraphConfig(max_bs=4, capture_bs=(1, 4), max_context_len=64, speculative=verify or dev2)
    runner = GraphRunner(TinyDecoder(cfg), ours, CPUEmulatorEngine(), GraphKind.parse(mode), gcfg, spec)
    lens = [int(x) for x in os.environ.get("PROBE_SEQ_LENS", "9,40,17").split(",")]  # raw bs 3
    fb = BatchGenerator(world, spec, seed=3).for_mode(mode, 3, seq_lens=lens)
    padded, cap = runner.padded_batch(fb), runner.capture_batch(4)

    def sglang_batch(x):
        fields = dict(batch_size=x.batch_size, req_pool_indices=x.req_pool_indices, seq_lens=x.seq_lens)
        fields.update(seq_lens_cpu=x.seq_lens_cpu, seq_lens_sum=x.seq_lens_sum, out_cache_loc=x.out_cache_loc)
        info = NoneNS(custom_mask=x.spec_info.custom_mask, num_tokens_per_req=rows) if verify else None
        if dev2:
            ext = torch.full((x.batch_size,), rows, dtype=torch.int32)  # the runner's static copy: padded rows N (assumed)
            ext[: x.spec_info.extend_seq_lens.numel()] = x.spec_info.extend_seq_lens
            info = NoneNS(extend_seq_lens_tensor=ext, accept_length=x.spec_info.accept_length)
        sgl_mode = SglMode.TARGET_VERIFY if verify else SglMode.DRAFT_EXTEND_V2 if dev2 else SglMode.DECODE
        return NoneNS(**fields, forward_mode=sgl_mode, spec_info=info, encoder_lens=None, kv_loc_plan=None)

    theirs.init_cuda_graph_state(4, 4 * rows)
    theirs.init_forward_metadata_out_graph(sglang_batch(cap), in_capture=True)
    theirs.init_forward_metadata_out_graph(sglang_batch(padded), in_capture=False)
    call_capture_hook(ours, cap)
    call_replay_hook(ours, padded)
    n = int(padded.seq_lens.sum())
    pairs = [("kv_indptr", theirs.kv_indptr[:5], ours.kv_indptr[:5])]
    pairs.append(("kv_indices", theirs.cuda_graph_kv_indices[:n], ours.cuda_graph_kv_indices[:n]))
    if dev2:
        n = int(ours.kv_indptr[4])
        pairs = [("kv_indptr", theirs.kv_indptr[:5], ours.kv_indptr[:5]), ("qo_indptr", theirs.qo_indptr[:5], ours.qo_indptr[:5])]
        pairs.append(("kv_indices", theirs.cuda_graph_kv_indices[:n], ours.cuda_graph_kv_indices[:n]))
        print(
            "accept_length",
            fb.spec_info.accept_length.tolist(),
            "extend_seq_lens",
            fb.spec_info.extend_seq_lens.tolist(),
            "seq",
            fb.seq_lens.tolist(),
        )
    elif verify:
        m = int(ours.mask_indptr[4])
        vm = getattr(theirs, "_verify_mask", None)  # Triton's tree-mask scratch; Wave's own buffer otherwise
        their_mask = vm.buffer if vm is not None else theirs.cuda_graph_custom_mask
        pairs += [("qo_indptr", theirs.qo_indptr[:5], ours.qo_indptr[:5])]
        pairs += [("mask_indptr", theirs.mask_indptr[:5], ours.mask_indptr[:5])]
        pairs += [("custom_mask", their_mask[:m], ours.cuda_graph_custom_mask[:m])]
    else:
        pairs.append(("num_kv_splits", theirs.cuda_graph_num_kv_splits[:4], ours.cuda_graph_num_kv_splits[:4]))
    for buf, a, b in pairs:
        same = "equal" if torch.equal(a.to(b.dtype), b) else f"DIFFER sglang={a.tolist()[:12]} refimpl={b.tolist()[:12]}"
        print(name, mode, buf, same)


if __name__ == "__main__":
    args = sys.argv[1:] + [None] * 3
    main(Path(args[0] or ".sgl/0.5.23"), args[1] or "decode", args[2] or "triton")
