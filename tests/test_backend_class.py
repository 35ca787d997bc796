"""The checker as a review tool: ``--backend-class`` loads any backend that implements the
contract; planted bugs are named; a missing module, class or method is a one-line error."""

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import check_class as check
from helpers import fast_check_settings

from refimpl.__main__ import main
from refimpl.backends import REGISTRY, BackendLoadError, load_backend_class
from refimpl.check import run_checks

FAST = fast_check_settings()
ROOT = Path(__file__).resolve().parent.parent


def test_example_backend_passes_every_mode_it_captures():
    rows = check("examples.paged_decode_backend:PagedDecodeBackend", modes=None)
    ran = [r for r in rows if not any(f.startswith("skipped") for f in r.findings)]
    assert {r.mode for r in ran} == {"decode", "idle"}
    assert all(r.passed and not r.findings for r in ran), [r.findings for r in ran]
    assert all(r.replay_matches_reference for r in ran)  # the example gives a reference


def test_capture_that_skips_a_fill_is_named():
    rows = check("broken_backends:CaptureSkipsAFill")
    assert all(r.capture_equals_replay is False for r in rows)
    assert all(any(f.startswith("kv_indices:") for f in r.findings) for r in rows)
    # replay fills what capture skipped, so the replayed graph is right: only (a) sees it
    assert all(r.graph_equals_eager and r.replay_matches_reference for r in rows)


def test_frozen_scalar_is_named():
    rows = check("broken_backends:FrozenScalar")
    assert all(r.capture_equals_replay is False for r in rows)
    assert all(any(f.startswith("max_kv_len:") and "frozen at capture" in f for f in r.findings) for r in rows)


def test_fresh_tensor_at_replay_is_named():
    rows = check("broken_backends:FreshTensorAtReplay")
    # capture runs the same (wrong) body, so (a) agrees with itself; the reference names it
    assert all(r.capture_equals_replay for r in rows)
    assert all(r.replay_matches_reference is False for r in rows)
    assert all(any(f.startswith("reference: kv_indptr:") for f in r.findings) for r in rows)
    assert all(r.graph_equals_eager is False for r in rows)


def test_foreign_kv_write_is_caught_by_the_guard():
    """The checker's KV guard is the only verdict that sees a write into another request's
    slots (the graph and eager write the same wrong slot, so their outputs agree)."""
    rows = {r.bs: r for r in check("broken_backends:ForeignKVWrite", modes=["decode"])}
    # bs 3: each row also writes the slot after its own (pages are handed out in random order: another request's,
    # a free one, or an earlier one of this batch's), so the guard names it and the graph no longer agrees with eager
    assert rows[3].graph_equals_eager is False
    guard = r"(padded or live rows wrote|the replay overwrote) [1-9]\d* \D*KV slot\(s\) .*: slot \d+ \((request-table row \d+, position \d+|a free slot)"
    assert any(re.match(guard, f) for f in rows[3].findings), rows[3].findings


@pytest.mark.parametrize(
    "target, fragment",
    [
        ("examples.no_such_module:X", "cannot import 'examples.no_such_module'"),
        ("examples.paged_decode_backend:NoSuchClass", "has no class 'NoSuchClass'"),
        ("broken_backends:NoGraphState", "missing: graph_state"),
        ("broken_backends:NeitherInterface", "implements neither init_forward_metadata_out_graph"),
        ("broken_backends:ReplayFixInADeadHook", "defines init_forward_metadata_replay_cuda_graph, which the runner never"),
        ("examples.paged_decode_backend", "expected package.module:ClassName"),
    ],
)
def test_bad_backend_class_is_a_clear_error(target, fragment, capsys):
    with pytest.raises(BackendLoadError, match=fragment):
        load_backend_class(target)
    assert main(["check", "--backend-class", target]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and fragment in err[0]


@pytest.mark.gate  # CPU CI: test_template.py runs the same command on a copy outside the repository
def test_cli_runs_the_example_from_the_repository_root():
    cmd = [
        sys.executable,
        "-m",
        "refimpl",
        "check",
        "--mode",
        "decode",
        "--backend-class",
        "examples.paged_decode_backend:PagedDecodeBackend",
    ]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "paged_decode_example" in res.stdout and "FAIL" not in res.stdout


def test_fuzz_reviews_the_backend_class_it_is_given(capsys):
    """``--fuzz`` honours ``--backend-class``: it fuzzes the class under review (not the registered backends) and each
    mismatch's reproducer names the class."""
    argv = ["check", "--fuzz", "4", "--backend-class", "broken_backends:FrozenScalar", "--mode", "decode"]
    code = main([*argv, "--engine", "cpu-emulator"])
    out = capsys.readouterr().out
    assert code == 1 and "MISMATCH bug_frozen_scalar/unified/decode/chain batch 0" in out, out
    assert 'backend_class="broken_backends:FrozenScalar"' in out and "fuzz: 4 batches over 1 targets" in out
    line = next(x for x in out.splitlines() if "reproduce: " in x).split("reproduce: ", 1)[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    run = subprocess.run(line, shell=True, capture_output=True, text=True, cwd=ROOT, env=env)  # the printed shell line
    assert run.returncode == 0 and "graph vs eager" in run.stdout, (run.stdout, run.stderr)


def test_a_bug_that_depends_on_the_previous_replay_is_caught_by_the_history():
    """A replay hook that skips its refresh when the size did not change passes every per-size row (each size's first
    replay is right) and fails verdict (f), the history, which names the replay; without (f) nothing sees it."""
    rows = check("broken_backends:RefreshOnlyWhenSizeChanges")
    per_size = [(r.capture_equals_replay, r.graph_equals_eager, r.matches_oracle) for r in rows]
    assert all(v == (True, True, True) for v in per_size), per_size
    (last,) = [r for r in rows if r.history_ok is not None]
    assert last.history_ok is False and last.status == "FAIL"
    assert last.findings[0].startswith("history replay 2 (A's lengths, other requests, bs 3): graph vs eager"), last.findings
    quiet = run_checks(
        modes=("decode",),
        engine="cpu-emulator",
        settings=dataclasses.replace(FAST, history=False),
        entries=[load_backend_class("broken_backends:RefreshOnlyWhenSizeChanges")],
    )
    assert all(r.passed for r in quiet)


def test_an_input_freed_after_capture_is_named_by_the_emulator_and_a_correct_twin_passes():
    """Liveness (issue 33): a split-KV scratch re-allocated by the replay hook leaves the graph the capture-time one,
    freed. The emulator refuses the replay, naming the op's argument (``attn_logits``); its correct twin
    (``triton/unified``) passes every verdict (the default checker's rows)."""
    rows = check("broken_backends:ScratchReallocatedAtReplay")
    op, freed = "refimpl.decode_attention_stage1.default's attn_logits (", "float32, memory the graph did not allocate) was freed"
    assert rows and all(r.status == "FAIL" for r in rows)
    assert all(any(op in f and freed in f for f in r.findings) for r in rows), [r.findings for r in rows]
    assert all(r.passed for r in check("refimpl.backends.triton:TritonAttnBackend"))


def test_metadata_pointing_outside_a_buffer_is_a_finding_not_a_crash():
    """The review tool survives the code it reviews: a replay whose kernel would read past the KV cache (an IndexError
    on a CPU; a device-side assert that ends the CUDA context on a GPU) is, on every device, a row that fails naming the
    entry, and the checker and the fuzzer go on to the next batch (refimpl/kernels/bounds.py)."""
    rows = check("broken_backends:SlotPastTheCache")
    outside = "out of bounds: the graph read dense_paged_attention: kv_indices[0] = 1000000000: a live entry outside"
    assert rows and all(r.status == "FAIL" and not r.graph_equals_eager for r in rows)
    assert all(any(f.startswith(outside) for f in r.findings) for r in rows), [r.findings for r in rows]
    assert not any(f.startswith("out of bounds: eager") for r in rows for f in r.findings)  # eager's metadata is right


def test_the_fuzzer_sees_a_history_bug_and_survives_metadata_outside_a_buffer(capsys):
    """The fuzzer's sequence of replays through one set of graphs sees the history bug the per-size rows miss, and
    reports (not crashes on) a kernel read outside the cache."""
    argv = ["check", "--fuzz", "6", "--backend-class", "broken_backends:RefreshOnlyWhenSizeChanges", "--mode", "decode"]
    assert main([*argv, "--engine", "cpu-emulator"]) == 1  # the history bug: the fuzzer's sequence of replays sees it
    out = capsys.readouterr().out
    assert "fuzz: 6 batches over 1 targets" in out and "MISMATCH bug_refresh_on_size_change" in out, out
    argv = ["check", "--fuzz", "2", "--backend-class", "broken_backends:SlotPastTheCache", "--mode", "decode"]
    assert main([*argv, "--engine", "cpu-emulator"]) == 1  # the bounds guard: a finding per batch, no crash
    out = capsys.readouterr().out
    assert "fuzz: 2 batches over 1 targets" in out and "out of bounds: the graph read dense_paged_attention" in out, out


def test_every_in_tree_class_can_be_passed_to_backend_class():
    """Each registered class, named as a reviewer would (``refimpl.backends.<module>:<Class>``), gives the registry's
    labels, page size and model kind (the MLA family's page sizes are class attributes); one runs end to end."""
    for entry in REGISTRY:
        got = load_backend_class("refimpl.backends" + entry.target)
        assert (got.name, got.variant, got.page_size) == (entry.name, entry.variant, entry.page_size), entry
        assert got.load().model_kind == entry.load().model_kind, entry
    (row,) = check("refimpl.backends.torch_native:TorchNativeBackend", modes=("decode",))[:1]
    assert row.passed, row.findings


def test_padded_rows_breaking_the_indptr_invariant_are_named():
    """Zeroed padded ``mask_indptr`` entries: every live output right, nothing read out of bounds, no reference to
    compare with; SGLang's kit's invariant names the buffer and the entry, on a padded batch only (raw bs 3 in the bs-4
    graph). Unplanted, Triton's verify keeps it at both sizes."""
    rows = {r.bs: r for r in check("broken_backends:PaddedMaskIndptrZeroed", modes=["target_verify"])}
    assert rows[1].passed and not rows[1].findings, rows[1].findings  # bs 1: its graph has no padded row
    bad = rows[3]
    assert bad.capture_equals_replay and bad.graph_equals_eager and bad.matches_oracle, bad.findings  # (a)-(c)
    assert bad.replay_matches_reference is False and bad.history_ok is False, bad.findings  # (d) without a reference; (f)
    assert re.fullmatch(r"invariant: mask_indptr\[4\] = 0 < mask_indptr\[3\] = \d+: must never decrease", bad.findings[0])
    assert all("invariant: mask_indptr[4] = 0 < mask_indptr[3]" in f for f in bad.findings), bad.findings  # nothing else
    good = run_checks(modes=["target_verify"], engine="cpu-emulator", settings=FAST, backends=["triton"], variants=["unified"])
    assert all(r.passed and not r.findings for r in good), [r.findings for r in good]


def test_the_invariants_hold_after_every_replay_not_only_on_a_fresh_backend():
    """The zeroed padded ``mask_indptr`` of a warm backend only: verdict (d)'s fresh backend keeps the invariant (and
    Triton's reference), the runner's backend breaks it at each replay with a padded row. ``Rig.run`` names it (d) in
    the padded row, and the history (f) in its replays through the padded graph."""
    rows = {r.bs: r for r in check("broken_backends:PaddedIndptrZeroedOnceWarm", modes=["target_verify"])}
    assert rows[1].passed and not rows[1].findings, rows[1].findings  # bs 1: its graph has no padded row
    bad = rows[3]
    assert bad.capture_equals_replay and bad.graph_equals_eager and bad.matches_oracle, bad.findings  # (a)-(c)
    assert bad.replay_matches_reference is False and bad.history_ok is False, bad.findings
    lines = [f for f in bad.findings if "invariant: mask_indptr[4] = 0 < mask_indptr[3]" in f]
    assert lines[0].startswith("invariant:") and any(f.startswith("history replay 2 ") for f in lines), bad.findings


def test_a_plan_sized_by_the_host_mirror_fails_under_max_capacity_views():
    """SGLang 0.5.23's draft-extend views keep ``seq_lens_cpu`` at full capacity (PR #36913): a plan sized by the mirror's
    length instead of ``bs`` plans rows past the bucket. refimpl's own runner hands views of the bucket, so (b)-(d)
    pass; (a) replays through both and names it where the bucket is smaller than the capacity (bs 1 of 4). Verify,
    which SGLang 0.5.23 hands views of the bucket, passes."""
    rows = check("broken_backends:PlanOverCapacity", modes=["target_verify"])
    assert all(r.passed and not r.findings for r in rows), [r.findings for r in rows]
    for mode in ("draft_extend", "draft_extend_v2"):
        rows = {r.bs: r for r in check("broken_backends:PlanOverCapacity", modes=[mode])}
        assert rows[3].passed and not rows[3].findings, rows[3].findings  # the bs-4 bucket is the capacity
        bad = rows[1]
        assert bad.graph_equals_eager and bad.matches_oracle and bad.replay_matches_reference, bad.findings
        assert bad.capture_equals_replay is False and len(bad.findings) == 1, bad.findings
        assert bad.findings[0].startswith("max-capacity views (SGLang #36913): the batch raised ValueError: batch_size=4")
