"""Where the faithful Triton decode hook's host time goes, refimpl's beside SGLang 0.5.23's, part by part (issue 32
part 3: the profile before any optimisation). Host µs, medians of alternating rounds, the GPU synchronised, untimed,
before each call; one padded decode batch per size.

    python benchmarks/sglang_probe/hook_parts.py ROOT [--sizes 1,8,64] [--ctx 4096] [--pin 3]

Parts: the whole replay hook; the kv buffers (refimpl ``_update_decode_kv_buffers``, SGLang
``_update_decode_kv_buffers(plan, ...)``); ``get_num_kv_splits`` on the same buffer slice; and the bare operations
under them on refimpl's side (the ``cumsum`` into ``kv_indptr``, ``build_kv_indices``).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hook_timing import build, parse  # noqa: E402


def main() -> int:
    a = parse(__doc__, mode=False)
    import torch

    from refimpl import bench
    from refimpl.graphs.runner import call_capture_hook, call_replay_hook
    from refimpl.kernels import build_kv_indices

    sizes = tuple(int(x) for x in a.sizes.split(","))
    pinned = bench.pin_to_core(a.pin)
    s = build("decode", sizes, a.ctx)
    ours, theirs, runner = s["ours"], s["theirs"], s["runner"]
    sync = torch.cuda.synchronize if s["world"].device.type == "cuda" else (lambda: None)
    print(f"{bench.environment().get('device')}; {pinned}; context {a.ctx}; host µs, medians of {a.rounds} rounds")
    print("| bs | part | refimpl | SGLang 0.5.23 |")
    print("|---|---|---|---|")
    for bs in sizes:
        fb = s["gen"].for_mode("decode", bs, seq_lens=[a.ctx - 1 - (i * 7) % 50 for i in range(bs)])
        pb = runner.padded_batch(fb)
        sb = s["sglang_batch"](pb)
        cap = runner.capture_batch(bs)
        call_capture_hook(ours, cap)
        theirs.init_forward_metadata_out_graph(s["sglang_batch"](cap), in_capture=True)
        seq, rpi = pb.seq_lens, pb.req_pool_indices
        parts = {
            "whole hook": (
                lambda: call_replay_hook(ours, pb),
                lambda: theirs.init_forward_metadata_out_graph(sb, in_capture=False),
            ),
            "kv buffers": (
                lambda: ours._update_decode_kv_buffers(bs, seq, rpi),
                lambda: theirs._update_decode_kv_buffers(None, bs, seq, rpi),
            ),
            "get_num_kv_splits": (
                lambda: ours.get_num_kv_splits(ours.cuda_graph_num_kv_splits[:bs], seq[:bs]),
                lambda: theirs.get_num_kv_splits(theirs.cuda_graph_num_kv_splits[:bs], seq[:bs]),
            ),
            "cumsum into kv_indptr": (lambda: ours.kv_indptr[1 : bs + 1].copy_(torch.cumsum(seq[:bs], 0)), None),
            "build_kv_indices": (
                lambda: build_kv_indices(
                    ours.world.req_to_token, rpi[:bs], seq[:bs], ours.kv_indptr[: bs + 1], ours.cuda_graph_kv_indices
                ),
                None,
            ),
        }
        for name, fns in parts.items():
            meds = [[], []]
            for _ in range(a.rounds):
                for side, fn in enumerate(fns):
                    if fn is None:
                        continue
                    xs = []
                    for _ in range(a.repeats):
                        sync()
                        t0 = time.perf_counter()
                        fn()
                        xs.append(time.perf_counter() - t0)
                    meds[side].append(statistics.median(xs) * 1e6)
            cells = [f"{statistics.median(m):.1f}" if m else "" for m in meds]
            print(f"| {bs} | {name} | {cells[0]} | {cells[1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
