"""The seed-12 FlashInfer draft-decode tree finding of part 4: a flipped pick, or a wrong attention value? (device tool, d444672)"""

from refimpl.backends import find
from refimpl.fuzz import TREE, FuzzParams, FuzzTarget, reproduce
from refimpl.graphs import make_engine

params = {"raw_bs": 4, "seq_lens": [66, 48, 17, 63], "trees": None, "accept_length": None, "poison_high": True}
print("reproduce with follow:", reproduce("flashinfer/unified/draft_decode/tree", params, seed=12))
entry = next(e for e in find("flashinfer") if e.variant == "unified")
t = FuzzTarget(entry, "draft_decode", TREE, make_engine("auto"), seed=12)
fb = t.batch(FuzzParams(**params))
eager = t.runner.eager(fb).clone()
t.rig.oracle.init_forward_metadata(fb)
own = t.rig.program(fb, t.rig.oracle)
e, o = eager.float(), own.float()
print("shape", tuple(e.shape), "step0 max diff", (e[:, 0] - o[:, 0]).abs().max().item())
print("step0 picks eager", e[:, 0].argmax(-1).tolist(), "oracle", o[:, 0].argmax(-1).tolist())
for r in range(e.shape[0]):
    top = o[r, 0].topk(2)
    print(
        f"row {r}: oracle top2 {top.values.tolist()} idx {top.indices.tolist()}; eager at those {e[r, 0, top.indices].tolist()}; step1 diff {(e[r, 1] - o[r, 1]).abs().max().item():.3g}"
    )
