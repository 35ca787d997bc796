"""Where validation's host time goes, part by part (profile for issue 14's 30 µs goal).

python benchmarks/validate_parts.py [--pin CORE] [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import refimpl.validate as V
from refimpl import default_dtype
from refimpl.batch import World
from refimpl.batchgen import BatchGenerator
from refimpl.bench import pin_to_core
from refimpl.config import CHAIN, tiny_model_config
from refimpl.kernels import validation as K
from refimpl.modes import ForwardMode

SPEC = CHAIN


def med(fn, batches, repeats, sync_after=False):
    for fb in batches * 5:
        fn(fb)
        torch.cuda.synchronize()
    ts = []
    for i in range(repeats):
        fb = batches[i % len(batches)]
        t0 = time.perf_counter_ns()
        fn(fb)
        ts.append((time.perf_counter_ns() - t0) / 1e3)
        if sync_after:
            torch.cuda.synchronize()
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pin", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=300)
    args = ap.parse_args()
    print(pin_to_core(args.pin))
    dev = torch.device("cuda")
    for kind, page, ctx, mode in (("mha", 1, 512, ForwardMode.DECODE), ("mla", 64, 256, ForwardMode.DRAFT_EXTEND_V2)):
        cfg = tiny_model_config(kind, default_dtype(dev), dev.type)
        world = World.create(cfg, max_context_len=ctx, pool_size=300, num_slots=1 << 20, page_size=page, device=dev, seed=0)
        gen = BatchGenerator(world, SPEC, seed=1)
        for bs in (1, 64):
            batches = [gen.for_mode(mode, bs) for _ in range(4)]
            full = med(lambda fb: V.validate_batch(fb, SPEC, for_graph=True), batches, args.repeats)
            # host rules only: the device half answered from a table (no launch, no read)
            real = V._launch_device_checks
            answers = {
                id(fb): real(fb, fb.seq_lens_cpu.tolist(), fb.num_tokens // bs, 0, None, mode.is_any_draft_extend())()
                for fb in batches
            }
            V._launch_device_checks = lambda fb, *a: lambda: answers[id(fb)]
            host = med(lambda fb: V.validate_batch(fb, SPEC, for_graph=True), batches, args.repeats)
            V._launch_device_checks = real
            # the device half alone, and its launch alone
            fb0 = batches[0]
            per = fb0.num_tokens // bs
            extra = 0
            seq = fb0.seq_lens_cpu.tolist()
            devhalf = med(lambda fb: real(fb, seq, per, extra, None, mode.is_any_draft_extend())(), batches, args.repeats)
            w = fb0.world
            out = V._scratch(dev, K.result_size(bs, fb0.num_tokens, fb0.out_cache_loc.numel()))
            tensors = (w.req_to_token, fb0.seq_lens, fb0.req_pool_indices, fb0.input_ids, fb0.positions, fb0.out_cache_loc)
            kw = dict(rows_per_req=per, extra=0, max_span=ctx, vocab=w.cfg.vocab_size, num_slots=w.kv_cache.num_slots)
            launch = med(lambda fb: K.batch_check(out, *tensors, **kw), batches, args.repeats, sync_after=True)
            K.batch_check(out, *tensors, **kw)
            torch.cuda.synchronize()
            read = med(lambda fb: K.read_result(out, bs, fb0.num_tokens, fb0.out_cache_loc.numel()), batches, args.repeats)

            def launch_read(fb):
                K.batch_check(out, *tensors, **kw)
                K.read_result(out, bs, fb0.num_tokens, fb0.out_cache_loc.numel())

            lr = med(launch_read, batches, args.repeats)
            small = out[:8]
            tiny = med(lambda fb: small.tolist(), batches, args.repeats)
            # the compiled kernel launched directly (no JITFunction.run binding)
            direct = float("nan")
            try:
                n_, m_ = fb0.num_tokens, fb0.out_cache_loc.numel()
                nprog = K.num_programs(bs, n_, m_)
                r2t = w.req_to_token
                allargs = [
                    out,
                    fb0.seq_lens,
                    fb0.seq_lens,
                    fb0.seq_lens,
                    fb0.req_pool_indices,
                    fb0.input_ids,
                    fb0.positions,
                    fb0.out_cache_loc,
                    fb0.seq_lens,
                    r2t,
                    r2t.stride(0),
                    r2t.shape[0],
                    r2t.shape[1],
                    w.cfg.vocab_size,
                    w.kv_cache.num_slots,
                    bs,
                    n_,
                    m_,
                    per,
                    0,
                    ctx,
                    nprog,
                    False,
                    False,
                    False,
                    K.BLOCK,
                    K.CHUNK,
                    K.NCAT,
                    K.NONE,
                ]
                ck = K._batch_check_kernel[(nprog,)](*allargs)
                stream = torch.cuda.current_stream().cuda_stream

                def go(fb):
                    ck.run(nprog, 1, 1, stream, ck.function, ck.packed_metadata, None, None, None, *allargs)

                direct = med(go, batches, args.repeats, sync_after=True)

                def go_read(fb):
                    ck.run(nprog, 1, 1, stream, ck.function, ck.packed_metadata, None, None, None, *allargs)
                    K.read_result(out, bs, n_, m_)

                direct_read = med(go_read, batches, args.repeats)
                print(f"  direct launch {direct:.1f} µs, direct launch + read {direct_read:.1f}")
            except Exception as e:  # noqa: BLE001
                print("  direct launch failed:", type(e).__name__, e)
            # GPU time of the kernel
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(50_000_000)  # the GPU busy while the host queues: GPU time only
            e0.record()
            for _ in range(100):
                K.batch_check(out, *tensors, **kw)
            e1.record()
            torch.cuda.synchronize()
            gpu = e0.elapsed_time(e1) * 10
            print(
                f"{kind} {mode.label} bs {bs}: full {full:.1f} | host rules {host:.1f} | "
                f"device half {devhalf:.1f} | launch {launch:.1f} | read {read:.1f} | "
                f"launch+read {lr:.1f} | 8-int tolist {tiny:.1f} | kernel GPU {gpu:.1f} µs",
                flush=True,
            )
            if bs == 64:
                import cProfile
                import pstats

                pr = cProfile.Profile()
                pr.enable()
                for i in range(300):
                    V.validate_batch(batches[i % 4], SPEC, for_graph=True)
                pr.disable()
                pstats.Stats(pr).sort_stats("tottime").print_stats(18)
            gen.release_all()


if __name__ == "__main__":
    main()
