"""What SGLang 0.5.23's FlashInfer-MLA multi-step draft wrapper's steps read at graph replay, for
``tests/test_sglang_flashinfer_adapter.py`` (run as a child process: importing the adapter installs SGLang's stand-ins).

Run on a CPU machine (CI): the windows are the CPU stand-in's. Prints, as JSON, the live requests' committed lengths and, per step and live request, the keys its planned window holds
as ``[request, position]`` of the request table (the CPU stand-in's window is flashinfer's ``MLAPlan``'s: start and length
from the plan's host arrays)."""

import json

from refimpl.adapters.sglang import SGLangFlashInferMLAAttnBackend
from refimpl.backends import BackendEntry
from refimpl.check import CheckSettings
from refimpl.flashinfer_wrappers.standin import read_partition
from refimpl.graphs import make_engine
from refimpl.layout import KINDS
from refimpl.rig.core import Rig


def windows(raw_bs: int = 3) -> dict:
    name = f"{SGLangFlashInferMLAAttnBackend.__module__}:{SGLangFlashInferMLAAttnBackend.__name__}"
    settings = CheckSettings()
    entry = BackendEntry.from_class(SGLangFlashInferMLAAttnBackend, name)
    rig = Rig.build(entry, KINDS["draft_decode"], settings.spec, make_engine("cpu-emulator"), **settings.rig_args())
    fb = rig.gen.for_mode(rig.kind, raw_bs)
    rig.runner.replay(fb)
    bs = rig.runner.pick_bs(raw_bs)
    seq, table = fb.seq_lens_cpu.tolist(), rig.world.req_to_token
    owner = {}  # slot -> (request, position): the prefix and the drafts of every live request
    for r, p in enumerate(fb.req_pool_indices.tolist()):
        for t in range(seq[r] + settings.spec.num_steps):
            owner[int(table[p, t])] = [r, t]
    out = []
    for step in rig.backend.step_backends:
        w = step.sglang.decode_cuda_graph_metadata[bs]  # the wrapper this batch's graph replays
        _, _, start, n, _ = w._spans(*read_partition(w))
        keys = w._kv_indices_buf.tolist()
        out.append([[owner.get(k, [-1, -1]) for k in keys[int(start[r]) : int(start[r] + n[r])]] for r in range(raw_bs)])
    return {"seq": seq, "windows": out}


if __name__ == "__main__":
    print(json.dumps(windows()))
