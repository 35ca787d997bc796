"""``check --arguments``: what a backend's replay hook and eager path do with each field of the batch (issue 33's
"dead argument", SGLang's kit's M12: a mutation of an argument nothing reads survives every output comparison; a
buffer-level checker says which argument it is)."""

import dataclasses

from helpers import fast_check_settings

from refimpl.backends import find, load_backend_class
from refimpl.check import check_entry_mode, table
from refimpl.graphs import make_engine

SETTINGS = dataclasses.replace(fast_check_settings(), raw_bs=(3,), arguments=True, history=False, glue_replays=0)


def rows(entry, mode):
    return check_entry_mode(entry, mode, make_engine("cpu-emulator"), SETTINGS)


def registered(name, variant):
    return next(e for e in find(name) if e.variant == variant)


def test_an_argument_asserted_and_never_read_is_classified():
    """Cutlass-MLA's legacy replay hook asserts ``seq_lens_cpu is not None`` and never reads it (the drift the unified
    hook removed): its values change nothing, None raises. The unified hook takes None too."""
    legacy, unified = (rows(registered("cutlass_mla", v), "decode")[0] for v in ("legacy", "unified"))
    assert legacy.arguments["replay hook"]["seq_lens_cpu"] == "dead, yet required: None raises AssertionError"
    assert unified.arguments["replay hook"]["seq_lens_cpu"] == "dead"
    for r in (legacy, unified):
        assert r.arguments["replay hook"]["req_pool_indices"] == "read: block_kv_indices"
        assert r.arguments["replay hook"]["positions"] == "dead"  # the model's, not the hook's
    assert "(args) replay hook: dead: " in table([legacy])


def test_an_eager_verify_path_that_drops_the_tree_mask_passes_on_chains_and_is_named():
    """The planted M12: every verdict passes (a chain's tree mask is causal), and the eager path's mask is dead while
    the replay hook reads it; Triton's own eager verify reads it (the output changes when it flips)."""
    (bad,) = rows(load_backend_class("broken_backends:EagerVerifyDropsTheMask"), "target_verify")
    assert bad.passed and not bad.findings, bad.findings
    assert bad.arguments["eager"]["spec_info.custom_mask"] == "dead"
    assert bad.arguments["replay hook"]["spec_info.custom_mask"] == "read: custom_mask"
    (good,) = rows(registered("triton", "unified"), "target_verify")
    eager = good.arguments["eager"]
    assert eager["spec_info.custom_mask"].startswith("read: ") and "output" in eager["spec_info.custom_mask"]
    # the extend kernel takes the new tokens' K and V from its inputs: a rotated out_cache_loc shows in the KV only
    assert eager["out_cache_loc"] == "read: KV written"
    assert eager["positions"] == eager["input_ids"] == "dead"  # the model reads them; the backend does not
    assert eager["spec_info.topk"] == "not varied"  # a chain: no smaller count
