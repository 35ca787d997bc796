"""Host µs of each layer of one input-copy launch, outermost first (``StaticInputs.load`` -> the ``load_inputs`` op ->
``launch_load_inputs`` -> ``direct_launch`` -> the compiled kernel's ``run``), beside a bare torch launch and the host
mirror two ways; Triton unified, decode and multi-step draft decode, graph bs 8 with one padded row. CUDA only.

    python benchmarks/copies_layers.py
"""

import statistics
import sys
import time

import torch

sys.path.insert(0, "benchmarks")
from refimpl import bench
from refimpl.backends import find
from refimpl.config import CHAIN
from refimpl.graphs import make_engine
from refimpl.kernels import _op, load_inputs
from refimpl.kernels.inputs import _load_inputs_kernel, launch_load_inputs
from refimpl.kernels.validation import NONE
from refimpl.layout import KINDS
from refimpl.rig import Rig

bench.pin_to_core(3)


def med(fn, n=2000):
    for _ in range(100):
        fn()
    xs = []
    for _ in range(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        xs.append((time.perf_counter() - t) * 1e6)
    return statistics.median(xs)


for kind in ("decode", "draft_decode"):
    rig = Rig.build(
        find("triton", "unified")[0],
        KINDS[kind],
        CHAIN,
        make_engine("auto"),
        capture_bs=(8,),
        max_context_len=64,
        pool_size=40,
        gen_seed=1,
        capture=False,
    )
    inp = rig.runner.inputs
    fb = rig.gen.for_mode(rig.kind, 7, seq_lens=[40] * 7)
    src = (fb.input_ids, fb.positions, fb.req_pool_indices, fb.seq_lens, fb.out_cache_loc)
    a = (*src, *inp._whole, 8, inp.rows, inp.steps, 1, 0, 0, *inp._unjudged)
    inp.load(fb, 8)
    inp.load(fb, 8)
    key = next(k for k in _op._COMPILED if k[0] is _load_inputs_kernel and not k[2] and k[3] == inp.steps)
    k = _op._COMPILED[key]
    n, raw = fb.num_tokens, fb.batch_size
    block = key[4]
    args = (*src, *inp._whole, *inp._whole[:3], n, raw, 8, 8 * inp.rows, 1, 0, 0, 0, False, NONE, inp.steps, block)
    ptrs = (t.data_ptr() for t in src + inp._whole + inp._whole[:3])
    iargs = (*ptrs, n, raw, 8, 8 * inp.rows, 1, 0, 0, 0, False, NONE, inp.steps, block)
    stream = torch._C._cuda_getCurrentRawStream(0)
    r = {
        "StaticInputs.load": med(lambda: inp.load(fb, 8)),
        "load_inputs op": med(lambda: load_inputs(*a)),
        "launch_load_inputs": med(lambda: launch_load_inputs(src, inp._whole, 8, inp.rows, inp.steps, 1, 0, 0)),
        "direct_launch": med(lambda: _op.direct_launch(_load_inputs_kernel, (1,), args, key, fb.input_ids.device)),
        "kernel.run tensors": med(lambda: k.run(1, 1, 1, stream, k.function, k.packed_metadata, None, None, None, *args)),
        "kernel.run int ptrs": med(lambda: k.run(1, 1, 1, stream, k.function, k.packed_metadata, None, None, None, *iargs)),
        "5 data_ptr()": med(lambda: [t.data_ptr() for t in src]),
        "host mirror torch": med(lambda: (inp.seq_lens_cpu[:7].copy_(fb.seq_lens_cpu), inp.seq_lens_cpu[7:8].fill_(1))),
        "host mirror numpy": med(
            lambda: (inp._mirror.__setitem__(slice(0, 7), fb.seq_lens_cpu.numpy()), inp._mirror.__setitem__(slice(7, 8), 1))
        ),
        "torch empty launch (zero_)": med(lambda: inp.seq_lens.zero_()),
    }
    print(kind, {k2: round(v, 1) for k2, v in r.items()}, flush=True)
