"""The pull request reviewed in notebook 07 (``examples/review_backend.py``): the checker names
the submitted version's bug (by verdict, buffer and index) and passes the reviewed version."""

import difflib
import inspect
import re
import textwrap

from helpers import CAPTURE_BS

from examples.review_backend import ReviewBackend, ReviewBackendBuggy
from refimpl.backends import load_backend_class
from refimpl.check import CheckSettings, run_checks

# verdict (e) off: it has its own tests (test_glue.py) and the capability matrix; CI time
FAST = CheckSettings(capture_bs=CAPTURE_BS, raw_bs=(1, 3), max_context_len=32, num_slots=None, glue_replays=0, history=False)
N = FAST.spec.num_draft_tokens


def check(cls_name, modes):
    return run_checks(
        modes=modes, engine="cpu-emulator", settings=FAST, entries=[load_backend_class(f"examples.review_backend:{cls_name}")]
    )


def diffs(finding):
    """``[i] a vs b`` pairs of a finding -> {i: (a, b)}."""
    return {int(i): (int(a), int(b)) for i, a, b in re.findall(r"\[(\d+)\] (\d+) vs (\d+)", finding)}


def test_submitted_version_gets_mask_indptr_named_in_verify_only():
    rows = check("ReviewBackendBuggy", ["decode", "target_verify"])
    decode = [r for r in rows if r.mode == "decode"]
    verify = {r.bs: r for r in rows if r.mode == "target_verify"}
    assert len(decode) == 2 and all(r.passed and not r.findings for r in decode)
    assert sorted(verify) == [1, 3]
    for raw_bs, graph_bs in ((1, 1), (3, 4)):
        r = verify[raw_bs]
        assert r.capture_equals_replay is False and r.replay_matches_reference is False
        assert r.matches_oracle is True
        (a,) = [f for f in r.findings if f.startswith("mask_indptr: ")]
        (d,) = [f for f in r.findings if f.startswith("reference: mask_indptr: ")]
        # every block start after the first is off by N*N per block before it (N counted twice)
        assert sorted(diffs(a)) == list(range(1, graph_bs + 1))
        assert all(rep - cap == i * N * N for i, (cap, rep) in diffs(a).items())
        # the reference agrees with the capture path: the replay hook is the wrong side
        assert {i: (b, a) for i, (a, b) in diffs(d).items()} == diffs(a)
        assert not any("kv_ind" in f for f in r.findings)
    assert verify[1].graph_equals_eager is True  # one block, starting at 0: output unchanged
    assert verify[3].graph_equals_eager is False


def test_reviewed_version_passes_every_mode_it_captures():
    rows = check("ReviewBackend", None)
    ran = [r for r in rows if not any(f.startswith("skipped") for f in r.findings)]
    assert [(r.mode, r.bs) for r in ran] == [
        ("decode", 1),
        ("decode", 3),
        ("idle", 0),
        ("target_verify", 1),
        ("target_verify", 3),
    ]
    assert all(r.passed and not r.findings for r in ran), [r.findings for r in ran]
    assert all(r.capture_equals_replay and r.graph_equals_eager and r.matches_oracle and r.replay_matches_reference for r in ran)


def test_the_fix_is_one_call_in_the_replay_hook():
    def src(cls):
        fn = cls.init_forward_metadata_replay_cuda_graph
        return textwrap.dedent(inspect.getsource(fn)).splitlines()

    changed = [d for d in difflib.ndiff(src(ReviewBackendBuggy), src(ReviewBackend)) if d[:2] in ("- ", "+ ")]
    code = [d for d in changed if not d[2:].lstrip().startswith("#")]
    assert [d[:2] + d[2:].strip() for d in code] == [
        "- layout.mask_indptr(kv_lens, n, out=self.cuda_graph_mask_indptr)",
        "+ layout.mask_indptr(seq_lens[:bs], n, out=self.cuda_graph_mask_indptr)",
    ]
    capture = ReviewBackend.init_forward_metadata_capture_cuda_graph
    assert ReviewBackendBuggy.init_forward_metadata_capture_cuda_graph is capture
