"""Host time of FlashInfer ``plan()`` per batch size: the standard plan vs refimpl's fast plan.

Why it matters: on the graph path FlashInfer must re-plan before every replay, and the plan is
host work (a work partition computed on the CPU, then copied to the GPU). Published anchor:
75-110 us for a standard decode plan (flashinfer PR #5043, RTX 4090). The fast plan takes the
host indptr (built from ``seq_lens_cpu``) and skips the device-to-host indptr copy and the
copies into the bound buffers.

Method (device/METHOD.md): each timed call is preceded by ``torch.cuda.synchronize()`` so
queued GPU work is not billed to the plan; ``perf_counter`` around the call alone; warm-up
first (JIT compile, first plan); the seq-len sets rotate among 8 random batches; median of
``--reps`` calls; the whole sweep runs twice and both medians are reported (trust a difference
only if both runs agree).

    python benchmarks/plan_cost.py --out benchmarks/results/plan_cost   (GPU + flashinfer)
    python benchmarks/plan_cost.py --smoke                               (CPU stand-ins)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch

from refimpl.flashinfer_wrappers import flashinfer_available, make_workspace, wrapper_classes
from refimpl.flashinfer_wrappers.fast_plan import fast_decode_plan, fast_mla_decode_plan

H, HKV, D = 32, 8, 128  # a Llama-3-8B-like decode shape (per TP rank)
MLA_H, CKV, KPE = 16, 512, 64  # DeepSeek-like MLA (per TP rank)


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def batches(bs: int, ctx: int, dev, n: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed + bs)
    out = []
    for _ in range(n):
        lens = torch.randint(ctx // 4, ctx, (bs,), generator=g, dtype=torch.int32)
        indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32)
        indptr_cpu[1:] = torch.cumsum(lens, 0)
        indices = torch.randperm(int(indptr_cpu[-1]), generator=g).to(torch.int32)
        out.append((lens, indptr_cpu, indptr_cpu.to(dev), indices.to(dev)))
    return out


def time_calls(fn, inputs, reps: int, dev) -> float:
    """Median host microseconds of ``fn(x)`` over ``reps`` calls, inputs rotating."""
    samples = []
    for i in range(reps):
        x = inputs[i % len(inputs)]
        sync(dev)
        t0 = time.perf_counter()
        fn(x)
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def decode_sweep(fi, dev, sizes, ctx, reps, dtype):
    rows = []
    for bs in sizes:
        ws = make_workspace(dev)
        indptr_buf = torch.zeros(bs + 1, dtype=torch.int32, device=dev)
        indices_buf = torch.zeros(bs * ctx, dtype=torch.int32, device=dev)
        last = torch.ones(bs, dtype=torch.int32, device=dev)
        w = fi.BatchDecodeWithPagedKVCacheWrapper(
            ws,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=False,
            paged_kv_indptr_buffer=indptr_buf,
            paged_kv_indices_buffer=indices_buf,
            paged_kv_last_page_len_buffer=last,
        )
        inputs = batches(bs, ctx, dev)
        common = dict(data_type=dtype, q_data_type=dtype, non_blocking=True)
        last_cpu = torch.ones(bs, dtype=torch.int32)

        def full(x):
            _, _, indptr_dev, indices = x
            w.plan(indptr_dev, indices, last, H, HKV, D, 1, **common)

        def fast(x):
            _, indptr_cpu, _, _ = x
            fast_decode_plan(w, indptr_cpu, last_cpu, H, HKV, D, 1, q_data_type=dtype, kv_data_type=dtype)

        for _ in range(3):  # warm-up: JIT / first plan sets _cached_module
            full(inputs[0])
            fast(inputs[0])
        rows.append(
            dict(
                kind="decode",
                bs=bs,
                full_plan_us=time_calls(full, inputs, reps, dev),
                fast_plan_us=time_calls(fast, inputs, reps, dev),
            )
        )
        print(rows[-1], flush=True)
    return rows


def mla_sweep(fi, dev, sizes, ctx, reps, dtype):
    rows = []
    for bs in sizes:
        ws = make_workspace(dev)
        qo = torch.arange(bs + 1, dtype=torch.int32, device=dev)
        kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=dev)
        kv_indices = torch.zeros(bs * ctx, dtype=torch.int32, device=dev)
        kv_lens = torch.ones(bs, dtype=torch.int32, device=dev)
        w = fi.BatchMLAPagedAttentionWrapper(
            ws, use_cuda_graph=True, qo_indptr=qo, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_len_arr=kv_lens, backend="auto"
        )
        inputs = batches(bs, ctx, dev)
        qo_cpu = torch.arange(bs + 1, dtype=torch.int32)
        scale = 192**-0.5

        def full(x):
            lens, _, indptr_dev, indices = x
            w.plan(qo, indptr_dev, indices, lens.to(dev), MLA_H, CKV, KPE, 1, False, scale, dtype, dtype)

        def fast(x):
            lens, indptr_cpu, _, _ = x
            fast_mla_decode_plan(w, qo_cpu, indptr_cpu, lens, MLA_H, CKV, KPE, 1, False, scale, dtype, dtype)

        for _ in range(3):
            full(inputs[0])
            fast(inputs[0])
        rows.append(
            dict(
                kind="mla_decode",
                bs=bs,
                full_plan_us=time_calls(full, inputs, reps, dev),
                fast_plan_us=time_calls(fast, inputs, reps, dev),
            )
        )
        print(rows[-1], flush=True)
    return rows


def versions(dev) -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__, "device": str(dev)}
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:  # pragma: no cover
        pass
    if dev.type == "cuda":
        import subprocess

        info["gpu"] = torch.cuda.get_device_name(dev)
        info["cuda"] = torch.version.cuda
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
        )
        info["driver"] = smi.stdout.strip()
        import flashinfer

        info["flashinfer"] = flashinfer.__version__
    info["cpu"] = platform.processor() or platform.machine()
    return info


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for ax, kind in zip(axes, ("decode", "mla_decode")):
        for run_i, run in enumerate(result["runs"]):
            rows = [r for r in run if r["kind"] == kind]
            bs = [r["bs"] for r in rows]
            style = "-" if run_i == 0 else "--"
            ax.plot(
                bs,
                [r["full_plan_us"] for r in rows],
                "o" + style,
                color="C3",
                label="plan() (device indptr)" if run_i == 0 else None,
            )
            ax.plot(
                bs,
                [r["fast_plan_us"] for r in rows],
                "s" + style,
                color="C0",
                label="fast plan (host indptr)" if run_i == 0 else None,
            )
        ax.axhspan(75, 110, color="0.85", label="published plan(): 75-110 us")
        ax.set_xscale("log", base=2)
        ax.set_title(kind)
        ax.set_xlabel("batch size")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("host time per call, median (us)")
    axes[0].legend(fontsize=8)
    v = result["versions"]
    fig.suptitle(
        f"{v.get('gpu', v['device'])}, flashinfer {v.get('flashinfer', 'stand-in')}, "
        f"torch {v['torch']} (solid: run 1, dashed: run 2)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={"Software": None})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="benchmarks/results/plan_cost")
    p.add_argument("--reps", type=int, default=300)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--smoke", action="store_true", help="CPU stand-ins, tiny sizes, no files")
    args = p.parse_args()
    if args.smoke:
        dev, sizes, ctx, reps, dtype = torch.device("cpu"), [1, 4], 64, 5, torch.float32
    else:
        why = flashinfer_available()
        if why:
            raise SystemExit(f"needs the real flashinfer on a GPU: {why}")
        dev, sizes, ctx, reps, dtype = (
            torch.device("cuda", 0),
            [1, 2, 4, 8, 16, 32, 64, 128, 256],
            args.ctx,
            args.reps,
            torch.bfloat16,
        )
    fi = wrapper_classes(prefer_real=dev.type == "cuda")
    runs = [decode_sweep(fi, dev, sizes, ctx, reps, dtype) + mla_sweep(fi, dev, sizes, ctx, reps, dtype) for _ in range(2)]
    result = {"versions": versions(dev), "ctx": ctx, "reps": reps, "heads": [H, HKV, D], "mla": [MLA_H, CKV, KPE], "runs": runs}
    if args.smoke:
        print(json.dumps(result)[:400])
        return
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    plot(result, args.out + ".png")
    print("wrote", args.out + ".json", args.out + ".png")


if __name__ == "__main__":
    main()
