"""Issue 16, deliverable 5: FlashInfer's replay hooks against their own parts, on a GPU.

    python benchmarks/flashinfer_replan.py [--ctx 4096] [--sizes 1,8,64] [--repeats 300] [--pin CORE] [--out F]

Per row (backend/variant/mode) and batch size, host µs medians, the batches rotated and loaded as the bench loads them:

- ``hook``: the replay hook (``runner.replay_hook``);
- ``plan``: the hook's plan call alone (the installed fast plan, ``fast_prefill_plan`` or a full ``plan()``), replayed
  with the arguments the hook gave it;
- ``fills``: the two kernels that fill the bound kv buffers alone (``kv_indptr[1:] = cumsum(kv_lens)`` and
  ``build_kv_indices``);
- ``hook / (plan + fills)``: the goal is 1.2 or less for decode;
- at the first size, the whole step (``bench.time_steps``): eager over graph, goal 3 or more at bs 1.

``legacy`` rows re-plan fully on every replay (as SGLang does): the before of the unified rows' fast re-plans.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import refimpl.backends.flashinfer as fi_backend
from refimpl import bench, layout
from refimpl.backends import find
from refimpl.config import CHAIN
from refimpl.graphs import make_engine
from refimpl.kernels import build_kv_indices
from refimpl.layout import KINDS
from refimpl.rig import Rig

ROWS = tuple(f"flashinfer/{v}/{m}" for m in ("decode", "target_verify", "draft_extend") for v in ("unified", "legacy"))
ROWS += ("flashinfer_mla/unified/target_verify", "flashinfer_mla/legacy/target_verify")
SPEC = CHAIN


def _median(fn, batches, repeats, warmup, before=None) -> float:
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    return statistics.median(bench.host_times(fn, batches, repeats, warmup, sync, before=before))


def _recorded_plans(runner, batches, bs):
    """The plan call the hook makes for each batch: ``(fn, args, kwargs)``, recorded by running the hook once each."""
    from refimpl.flashinfer_wrappers import _wrappers

    calls, orig_fast = [], fi_backend.fast_prefill_plan

    def spy_fast(*a, **k):
        calls.append((orig_fast, a, k))
        return orig_fast(*a, **k)

    fi_backend.fast_prefill_plan = spy_fast
    shadowed = []
    for w in _wrappers(runner.backend, set()):
        own = w.__dict__.get("plan")

        def spy(*a, _plan=w.plan, **k):
            calls.append((_plan, a, k))
            return _plan(*a, **k)

        w.plan = spy
        shadowed.append((w, own))
    try:
        out = []
        for fb in batches:
            runner.load_inputs(fb, bs)
            calls.clear()
            runner.replay_hook(fb, bs)
            out.append(calls[-1])
    finally:
        fi_backend.fast_prefill_plan = orig_fast
        for w, own in shadowed:
            if own is None:
                del w.plan
            else:
                w.plan = own
    return out


def measure(row: str, sizes, repeats: int, warmup: int, ctx: int, rotate: int = 4) -> dict:
    name, variant, mode = row.split("/")
    entry, engine = find(name, variant)[0], make_engine("auto")
    rig = Rig.build(
        entry,
        KINDS[mode],
        SPEC,
        engine,
        capture_bs=sizes,
        max_context_len=ctx,
        pool_size=(rotate + 1) * max(sizes) + 2,
        gen_seed=1,
        validate_inputs=False,
    )
    runner, backend, out = rig.runner, rig.backend, {}
    for bs in sizes:
        lens = [ctx - KINDS[mode].span(SPEC) - i % 7 for i in range(bs)]
        batches = [rig.gen.for_mode(rig.kind, bs, seq_lens=lens) for _ in range(rotate)]
        load = lambda fb: runner.load_inputs(fb, bs)  # noqa: E731
        r = {"hook": _median(lambda fb: runner.replay_hook(fb, bs), batches, repeats, warmup, before=load)}
        plans = _recorded_plans(runner, batches, bs)
        by_id = {id(fb): p for fb, p in zip(batches, plans)}
        r["plan"] = _median(lambda fb: (p := by_id[id(fb)])[0](*p[1], **p[2]), batches, repeats, warmup, before=load)
        scratch = torch.zeros(bs + 1, dtype=torch.int32, device=engine.device)
        indices = torch.zeros(bs * ctx, dtype=torch.int32, device=engine.device)
        n = SPEC.num_draft_tokens

        def fills(fb):
            kv_lens = layout.attended_kv_lens(fb.forward_mode, fb.seq_lens, n)
            scratch[1:] = torch.cumsum(kv_lens, 0)
            build_kv_indices(backend.world.req_to_token, fb.req_pool_indices, kv_lens, scratch, indices)

        r["fills"] = _median(fills, batches, repeats, warmup)
        r["hook_over_parts"] = r["hook"] / (r["plan"] + r["fills"])
        if bs == sizes[0]:
            st = bench.time_steps(runner, batches, max(repeats // 3, 20), warmup)
            r["step_graph"], r["step_eager"] = st["graph"]["median"], st["eager"]["median"]
            r["eager_over_graph"] = st["eager_over_graph"]
        out[bs] = r
        rig.gen.release_all()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--sizes", default="1,8,64")
    p.add_argument("--repeats", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--pin", type=int, default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    pinned = bench.pin_to_core(args.pin)
    sizes = tuple(int(x) for x in args.sizes.split(","))
    env = {**bench.environment(), "pinning": pinned, "repeats": args.repeats, "context": args.ctx}
    res = {}
    for row in args.rows.split(","):  # written as they come
        t0 = time.perf_counter()
        res[row] = measure(row, sizes, args.repeats, args.warmup, args.ctx)
        print(f"{row}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps({"environment": env, "rows": res}, indent=1))
    per_bs = " / ".join(map(str, sizes))
    print(f"{env.get('device')}; {pinned}; context {args.ctx}; medians of {args.repeats}, host µs")
    print(f"| row | hook, bs {per_bs} | plan alone | fills alone | hook / (plan + fills) | step eager / graph, bs {sizes[0]} |")
    print("|---|---|---|---|---|---|")
    for row, r in res.items():
        each = lambda k, f=".1f": " / ".join(format(r[b][k], f) for b in sizes)  # noqa: E731
        first = r[sizes[0]]
        print(
            f"| {row} | {each('hook')} | {each('plan')} | {each('fills')} | {each('hook_over_parts', '.2f')} | "
            f"{first['eager_over_graph']:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
