"""Where the input copies' host time goes (issue 32 part 2: at most 10 µs at bs 1..256), beside the copy they replaced.

    python benchmarks/copies_parts.py [--pin CORE] [--repeats N]      # CUDA only

Per row (backend / variant / kind, graph bs, one padded row past bs 1): host µs medians of ``StaticInputs.load`` whole,
of its two parts (the ``load_inputs`` launch, the host mirror), and of the copy before it (``foreach``: byte views of
every source, then one ``torch._foreach_copy_`` over them and a padded-row buffer, the same host mirror; rebuilt here).
``same``: both write the same static inputs.
"""

import argparse
import statistics
import time

import torch

from refimpl import bench, layout
from refimpl.backends import find
from refimpl.config import CHAIN
from refimpl.graphs import make_engine
from refimpl.kernels import load_inputs
from refimpl.layout import KINDS
from refimpl.rig import Rig


def foreach_load(inp, fb, bs, plans={}):  # noqa: B006 - the plan cache
    """The copy before ``refimpl/kernels/inputs.py`` (at 5df02c7): its plan is made once per shape."""
    raw, n = fb.batch_size, fb.num_tokens
    if (plan := plans.get((id(inp), raw, bs))) is None:
        loc = inp.out_cache_loc[: inp.steps * bs * inp.rows].view(inp.steps, -1)
        dst = [inp.input_ids[:n], inp.positions[:n], inp.req_pool_indices[:raw], inp.seq_lens[:raw], *loc[:, :n].unbind()]
        pads = []
        if raw < bs:
            pad = inp.at_rest(bs - raw)
            dst += [inp.req_pool_indices[raw:bs], inp.seq_lens[raw:bs], *loc[:, n:].unbind()]
            pads = [pad.req_pool_indices, pad.seq_lens, *pad.out_cache_loc.view(inp.steps, -1)[:, : loc.shape[1] - n]]
        plan = plans[(id(inp), raw, bs)] = ([t.view(torch.uint8) for t in dst], [t.view(torch.uint8) for t in pads])
    dst, pads = plan
    src = [fb.input_ids, fb.positions, fb.req_pool_indices, fb.seq_lens]
    src += [fb.out_cache_loc] if inp.steps == 1 else fb.out_cache_loc.view(inp.steps, -1).unbind()
    torch._foreach_copy_(dst, [t.view(torch.uint8) for t in src] + pads)
    host_torch(inp, fb, bs)


def host(inp, fb, bs):
    inp._mirror[: fb.batch_size] = fb.seq_lens_cpu.numpy()
    inp._mirror[fb.batch_size : bs] = inp.fill


def host_torch(inp, fb, bs):
    """The host mirror through torch (before): a copy and a fill."""
    inp.seq_lens_cpu[: fb.batch_size].copy_(fb.seq_lens_cpu)
    inp.seq_lens_cpu[fb.batch_size : bs].fill_(inp.fill)


def launch(inp, fb, bs):
    load_inputs(
        fb.input_ids,
        fb.positions,
        fb.req_pool_indices,
        fb.seq_lens,
        fb.out_cache_loc,
        *inp._whole,
        bs,
        inp.rows,
        inp.steps,
        inp.fill,
        layout.PAD_REQ_SLOT,
        layout.PAD_CACHE_SLOT,
        *inp._unjudged,
    )


def med(fn, batches, repeats):
    xs = []
    for i in range(repeats + 20):
        fb = batches[i % len(batches)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(fb)
        if i >= 20:
            xs.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(xs)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pin", type=int, default=3)
    p.add_argument("--repeats", type=int, default=400)
    a = p.parse_args()
    bench.pin_to_core(a.pin)
    engine = make_engine("auto")
    print("host µs, medians:       load = launch + host  |  foreach (before)  same")
    for name, variant, kind in [
        ("triton", "in_graph", "decode"),
        ("triton", "unified", "draft_decode"),
        ("trtllm_mla", "in_graph", "draft_extend_v2"),
    ]:
        rig = Rig.build(
            find(name, variant)[0],
            KINDS[kind],
            CHAIN,
            engine,
            capture_bs=(1, 8, 64, 256),
            max_context_len=64,
            pool_size=1100,
            gen_seed=1,
            capture=False,
        )
        inp = rig.runner.inputs
        for bs in (1, 8, 64, 256):
            batches = [rig.gen.for_mode(rig.kind, bs - (bs > 1), seq_lens=[40] * (bs - (bs > 1))) for _ in range(4)]
            t = {
                "load": med(lambda fb: inp.load(fb, bs), batches, a.repeats),
                "launch": med(lambda fb: launch(inp, fb, bs), batches, a.repeats),
                "host": med(lambda fb: host(inp, fb, bs), batches, a.repeats),
                "foreach": med(lambda fb: foreach_load(inp, fb, bs), batches, a.repeats),
            }
            same = True
            for fb in batches:
                states = []
                for writer in (inp.load, lambda fb, bs: foreach_load(inp, fb, bs)):
                    inp.rest()
                    writer(fb, bs)
                    states.append({k: v.clone() for k, v in inp.views(bs).items()})
                same &= all(torch.equal(states[0][k], states[1][k]) for k in states[0])
            print(
                f"{name}/{variant} {kind:<16} bs {bs:>3}:  {t['load']:6.1f} = {t['launch']:6.1f} + {t['host']:4.1f}"
                f"  |  {t['foreach']:6.1f}  {same}",
                flush=True,
            )
            for fb in batches:
                rig.gen.release(fb)


if __name__ == "__main__":
    main()
