"""The profile behind ``profile_h200.txt`` (issue 32 part 1, not landed): run from a checkout of branch
``wip/issue32-deferred-validation`` (its ``GraphRunner.gate`` and ``validate.check_batch`` do not exist on main).

    python benchmarks/results/default_path_wip/profile_wip.py
"""

import cProfile
import io
import pstats
import time

import torch

from refimpl import bench
from refimpl.backends import find
from refimpl.config import CHAIN
from refimpl.graphs import make_engine
from refimpl.kernels import validation
from refimpl.layout import KINDS
from refimpl.rig import Rig
from refimpl.validate import check_batch

bench.pin_to_core(3)
entry, engine = find("triton", "in_graph")[0], make_engine("auto")
rig = Rig.build(entry, KINDS["decode"], CHAIN, engine, capture_bs=(8,), max_context_len=4096, pool_size=42, gen_seed=1)
runner = rig.runner
batches = [rig.gen.for_mode(rig.kind, 8, seq_lens=[4000 - i for i in range(8)]) for _ in range(4)]
sync = torch.cuda.synchronize


def phase(name, fn, before=None, n=300):
    xs = []
    for i in range(n + 30):
        fb = batches[i % 4]
        sync()
        if before:
            before(fb)
        t0 = time.perf_counter()
        fn(fb)
        if i >= 30:
            xs.append((time.perf_counter() - t0) * 1e6)
    xs.sort()
    print(f"{name:28s} median {xs[len(xs) // 2]:7.1f} us  p10 {xs[len(xs) // 10]:7.1f}")


phase("validate", runner.validate)
phase("copies", lambda fb: runner.load_inputs(fb, 8))
phase("gate", lambda fb: runner.gate(8), before=lambda fb: (runner.validate(fb), runner.load_inputs(fb, 8)))
phase("replay on", runner.replay)
runner.validate_inputs = False
phase("replay off", runner.replay)
runner.validate_inputs = True
print("compiled direct launchers:", [(k[0].fn.__name__, k[1:]) for k in validation._COMPILED])
phase("check_batch alone", lambda fb: check_batch(fb, runner.spec_cfg, runner.kind, True, world=runner.world))

profile = cProfile.Profile()
profile.enable()
for i in range(500):
    fb = batches[i % 4]
    runner.validate(fb)
    runner.load_inputs(fb, 8)
    runner.gate(8)
sync()
profile.disable()
out = io.StringIO()
pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(30)
print(out.getvalue()[:6000])
