"""SGLang 0.5.23's own Triton replay hook beside refimpl's faithful one (``triton/unified``), in one process, on the same
padded batches: host µs, medians of alternating rounds (the GPU synchronised, untimed, before each call), and the graph
buffers compared after each round (issue 32 part 3). Decode also times each side's **glue graph** (the replay hook
captured into a graph of its own, SGLang 0.5.23's ``SGLANG_ENABLE_METADATA_GLUE_GRAPH``; refimpl's ``capture_glue``):
``graph.replay()`` after the batch was loaded into the static inputs both read, buffers compared after each round.
Verify's glue is not timed here: its hook copies the spec input's tree mask, a tensor the batch brings.

    python benchmarks/sglang_probe/hook_timing.py ROOT [decode|target_verify] [--sizes 1,8,64] [--ctx 4096] [--pin 3]

ROOT: ``scripts/fetch_sglang.sh``'s tree or ``trim.py``'s. On a CPU the hooks run in the Triton interpreter: the printed numbers say
nothing about a GPU; the buffer comparison holds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import side_by_side  # noqa: E402


def build(mode: str, sizes, ctx: int) -> dict:
    """Both backends over one refimpl ``World``: SGLang's ``TritonAttnBackend`` (graph state for the largest size) and
    refimpl's faithful ``triton/unified`` with its runner (not captured), a batch generator and ``sglang_batch``, which
    turns a refimpl batch into the fields 0.5.23's hooks read."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode as SglMode

    from refimpl.backends import find
    from refimpl.batch import World
    from refimpl.batchgen import BatchGenerator
    from refimpl.config import TREE, GraphConfig, ModelConfig
    from refimpl.graphs import make_engine
    from refimpl.graphs.runner import GraphRunner
    from refimpl.layout import GraphKind
    from refimpl.model import TinyDecoder

    verify = mode == "target_verify"
    spec, cfg, max_bs = TREE if verify else None, ModelConfig(), max(sizes)
    rows = spec.num_draft_tokens if verify else 1
    world = World.create(cfg, max_context_len=ctx, pool_size=5 * max_bs + 2)
    theirs = side_by_side.sglang_triton_backend(world, cfg, spec)
    ours = next(e for e in find("triton") if e.variant == "unified").load(False)(world, spec)
    gcfg = GraphConfig(max_bs=max_bs, capture_bs=tuple(sizes), max_context_len=ctx, speculative=verify)
    runner = GraphRunner(TinyDecoder(cfg), ours, make_engine("auto"), GraphKind.parse(mode), gcfg, spec)
    theirs.init_cuda_graph_state(max_bs, max_bs * rows)
    sgl_mode = SglMode.TARGET_VERIFY if verify else SglMode.DECODE

    def sglang_batch(x):
        fields = dict(batch_size=x.batch_size, req_pool_indices=x.req_pool_indices, seq_lens=x.seq_lens)
        fields.update(seq_lens_cpu=x.seq_lens_cpu, seq_lens_sum=x.seq_lens_sum, out_cache_loc=x.out_cache_loc)
        info = side_by_side.NoneNS(custom_mask=x.spec_info.custom_mask, num_tokens_per_req=rows) if verify else None
        return side_by_side.NoneNS(**fields, forward_mode=sgl_mode, spec_info=info, encoder_lens=None, kv_loc_plan=None)

    gen = BatchGenerator(world, spec, seed=1)
    return dict(world=world, theirs=theirs, ours=ours, runner=runner, gen=gen, sglang_batch=sglang_batch, rows=rows)


def measure(mode: str, sizes, ctx: int, repeats: int, rounds: int) -> list[dict]:
    import torch

    from refimpl.graphs.runner import call_capture_hook, call_replay_hook, capture_glue

    verify = mode == "target_verify"
    s = build(mode, sizes, ctx)
    world, theirs, ours, runner, gen, sglang_batch, rows = (
        s[k] for k in ("world", "theirs", "ours", "runner", "gen", "sglang_batch", "rows")
    )
    sync = torch.cuda.synchronize if world.device.type == "cuda" else (lambda: None)

    def timed(fn, batches) -> float:
        xs = []
        for i in range(repeats):
            sync()
            t0 = time.perf_counter()
            fn(batches[i % len(batches)])
            xs.append(time.perf_counter() - t0)
        sync()
        return statistics.median(xs) * 1e6

    def buffers_equal(bs, n) -> bool:
        pairs = [(theirs.kv_indptr[: bs + 1], ours.kv_indptr[: bs + 1])]
        pairs.append((theirs.cuda_graph_kv_indices[:n], ours.cuda_graph_kv_indices[:n]))
        if not verify:
            pairs.append((theirs.cuda_graph_num_kv_splits[:bs], ours.cuda_graph_num_kv_splits[:bs]))
        return all(torch.equal(a.to(b.dtype), b) for a, b in pairs)

    def glued(bs, fbs) -> tuple[float, float, bool]:
        """Both hooks captured as glue graphs over the runner's static inputs; each replay after ``load`` of a batch."""
        inputs = runner.inputs
        inputs.rest()
        static = runner.capture_batch(bs, inputs)
        ours_graph, why = capture_glue(runner.engine, ours, static, warmups=3)
        assert why is None, why
        theirs_static = sglang_batch(static)
        for _ in range(3):
            theirs.init_forward_metadata_out_graph(theirs_static, in_capture=False)
        theirs_graph = runner.engine.new_graph()
        theirs_graph.capture(lambda: theirs.init_forward_metadata_out_graph(theirs_static, in_capture=False))
        ours_us, theirs_us, equal = [], [], True
        for _ in range(rounds):
            for graph, xs in ((ours_graph, ours_us), (theirs_graph, theirs_us)):
                ts = []
                for i in range(repeats):
                    inputs.load(fbs[i % len(fbs)], bs)
                    sync()
                    t0 = time.perf_counter()
                    graph.replay()
                    ts.append(time.perf_counter() - t0)
                sync()
                xs.append(statistics.median(ts) * 1e6)
            inputs.load(fbs[0], bs)
            ours_graph.replay()
            theirs_graph.replay()
            sync()
            equal &= buffers_equal(bs, int(inputs.seq_lens[:bs].sum()))
        return statistics.median(ours_us), statistics.median(theirs_us), equal

    out = []
    for bs in sizes:
        span = ctx - (rows if verify else 0)
        fbs = [gen.for_mode(mode, bs, seq_lens=[span - 1 - (i * 7 + k) % 50 for i in range(bs)]) for k in range(4)]
        padded = [runner.padded_batch(fb) for fb in fbs]
        theirs_in = [sglang_batch(p) for p in padded]
        cap = runner.capture_batch(bs)
        call_capture_hook(ours, cap)
        theirs.init_forward_metadata_out_graph(sglang_batch(cap), in_capture=True)
        ours_us, theirs_us, equal = [], [], True
        for _ in range(rounds):
            ours_us.append(timed(lambda p: call_replay_hook(ours, p), padded))
            theirs_us.append(timed(lambda b: theirs.init_forward_metadata_out_graph(b, in_capture=False), theirs_in))
            call_replay_hook(ours, padded[0])
            theirs.init_forward_metadata_out_graph(theirs_in[0], in_capture=False)
            equal &= buffers_equal(bs, int(padded[0].seq_lens.sum()))
        ours_med, theirs_med = statistics.median(ours_us), statistics.median(theirs_us)
        out.append(dict(mode=mode, what="hook", bs=bs, ours_us=ours_med, sglang_us=theirs_med, equal=equal))
        if not verify and world.device.type == "cuda":
            o, t, same = glued(bs, fbs)
            out.append(dict(mode=mode, what="glue graph", bs=bs, ours_us=o, sglang_us=t, equal=same))
        gen.release_all()
    return out


def parse(doc: str, mode: bool = True) -> argparse.Namespace:
    """The probes' command line (this script's and ``hook_parts.py``'s), then SGLang's tree set up (``ROOT``)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("root", type=Path)
    if mode:
        p.add_argument("mode", nargs="?", default="decode", choices=("decode", "target_verify"))
    p.add_argument("--sizes", default="1,8,64")
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=300)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--pin", type=int, default=None)
    args = p.parse_args()
    side_by_side.setup(args.root)
    return args


def main() -> int:
    args = parse(__doc__)
    from refimpl import bench

    pinned = bench.pin_to_core(args.pin)
    rows = measure(args.mode, tuple(int(x) for x in args.sizes.split(",")), args.ctx, args.repeats, args.rounds)
    from refimpl.adapters import sglang_stubs as sgl_stubs

    print(f"{bench.environment().get('device')}; {pinned}; context {args.ctx}; host µs, medians of {args.rounds} rounds")
    print(f"SGLang modules stood in for by the fallback finder: {sorted(set(sgl_stubs.FALLBACK)) or 'none'}")
    print("| mode | what | bs | refimpl triton/unified | SGLang 0.5.23 | refimpl / SGLang | buffers |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        same = "equal" if r["equal"] else "DIFFER"
        ratio = r["ours_us"] / r["sglang_us"]
        print(f"| {r['mode']} | {r['what']} | {r['bs']} | {r['ours_us']:.1f} | {r['sglang_us']:.1f} | {ratio:.2f}x | {same} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
