"""The mutant list (issue 18): each verdict, the KV guard and each validation rule named here, switched off alone, makes
the test beside it fail. A mutant edits one line of refimpl's source text in memory (the function is recompiled from
the edited text and patched wherever it is bound); the catching test is then called and must fail. docs/mutants.md lists
them; ``test_docs_lists_every_mutant`` keeps the two in step.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import test_backend_class
import test_bad_inputs
import test_blind_spots
import test_checker
import test_emulator
import test_glue
import test_history
import torch
from helpers import gate

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    id: str
    where: str  # "module:function" or "module:Class.method"
    old: str  # a fragment of that function's source, found exactly once
    new: str
    catching: str  # the catching test, "file::name[param]"
    cpu_only: str = ""  # why the mutant cannot run on a GPU (empty: it can)

    def apply(self, monkeypatch) -> None:
        module_name, qual = self.where.split(":")
        module = importlib.import_module(module_name)
        owner, name = (module, qual) if "." not in qual else (getattr(module, qual.split(".")[0]), qual.split(".")[1])
        fn = getattr(owner, name)
        src = textwrap.dedent(inspect.getsource(fn))
        assert src.count(self.old) == 1, f"{self.id}: {self.old!r} found {src.count(self.old)} times in {self.where}"
        namespace = dict(vars(module))
        exec(compile(src.replace(self.old, self.new), inspect.getsourcefile(fn), "exec"), namespace)
        mutated = namespace[name]
        if owner is not module:
            monkeypatch.setattr(owner, name, mutated)
            return
        for m in list(sys.modules.values()):  # every module that imported the function by name
            if getattr(m, name, None) is fn:
                monkeypatch.setattr(m, name, mutated)


def _case(case_id: str):
    case = next(c for c in test_bad_inputs.CASES if c.id == case_id)
    return lambda: test_bad_inputs.test_bad_input_is_refused_before_any_write(case)


CATCHING = {
    "test_checker.py::test_capture_replay_drift_is_caught": test_checker.test_capture_replay_drift_is_caught,
    "test_checker.py::test_replay_that_skips_the_mask_is_named": test_checker.test_replay_that_skips_the_mask_is_named,
    "test_checker.py::test_fresh_buffer_at_replay_is_caught": test_checker.test_fresh_buffer_at_replay_is_caught,
    "test_blind_spots.py::test_oracle_rebuilds_the_verify_mask_from_the_trees": (
        test_blind_spots.test_oracle_rebuilds_the_verify_mask_from_the_trees
    ),
    "test_backend_class.py::test_fresh_tensor_at_replay_is_named": test_backend_class.test_fresh_tensor_at_replay_is_named,
    "test_backend_class.py::test_foreign_kv_write_is_caught_by_the_guard": (
        test_backend_class.test_foreign_kv_write_is_caught_by_the_guard
    ),
    "test_emulator.py::test_copy_ops_inside_capture_rerun": test_emulator.test_copy_ops_inside_capture_rerun,
    "test_backend_class.py::test_metadata_pointing_outside_a_buffer_is_a_finding_not_a_crash": (
        test_backend_class.test_metadata_pointing_outside_a_buffer_is_a_finding_not_a_crash
    ),
    "test_backend_class.py::test_a_bug_that_depends_on_the_previous_replay_is_caught_by_the_history": (
        test_backend_class.test_a_bug_that_depends_on_the_previous_replay_is_caught_by_the_history
    ),
    "test_history.py::test_the_history_replays_every_captured_graph": (
        test_history.test_the_history_replays_every_captured_graph
    ),
    "test_backend_class.py::test_padded_rows_breaking_the_indptr_invariant_are_named": (
        test_backend_class.test_padded_rows_breaking_the_indptr_invariant_are_named
    ),
    "test_backend_class.py::test_the_invariants_hold_after_every_replay_not_only_on_a_fresh_backend": (
        test_backend_class.test_the_invariants_hold_after_every_replay_not_only_on_a_fresh_backend
    ),
    "test_backend_class.py::test_a_plan_sized_by_the_host_mirror_fails_under_max_capacity_views": (
        test_backend_class.test_a_plan_sized_by_the_host_mirror_fails_under_max_capacity_views
    ),
    "test_glue.py::test_a_hook_whose_first_warm_up_writes_otherwise_than_its_capture_is_refused": (
        test_glue.test_a_hook_whose_first_warm_up_writes_otherwise_than_its_capture_is_refused
    ),
    "test_glue.py::test_a_skipped_host_phase_is_named_by_its_plan_inputs_alone": (
        test_glue.test_a_skipped_host_phase_is_named_by_its_plan_inputs_alone
    ),
    **{
        f"test_history.py::test_each_history_step_is_the_first_to_catch_the_bug_it_exists_for[{bug}]": (
            lambda bug=bug, step=step: test_history.test_each_history_step_is_the_first_to_catch_the_bug_it_exists_for(bug, step)
        )
        for bug, step in test_history.STEP_BUGS
    },
}

MUTANTS = [
    Mutant(
        "verdict (a) compares nothing",
        "refimpl.rig.verdicts:capture_vs_replay",
        "diffs = diff_states(live_p, live_q, rows=rows)",
        "diffs = []",
        "test_checker.py::test_capture_replay_drift_is_caught",
    ),
    Mutant(
        "verdict (a) drops the custom mask",
        "refimpl.rig.verdicts:_batch_defined",
        'return {**state, "custom_mask": state["custom_mask"][:end]}',
        'return {k: v for k, v in state.items() if k != "custom_mask"}',
        "test_checker.py::test_replay_that_skips_the_mask_is_named",
    ),
    Mutant(
        "verdict (b) graph vs eager always true",
        "refimpl.rig.core:Rig.run",
        'graph_ok = close(graph, eager, self.tol, "graph vs eager", findings) and not guard.violations and not outside',
        "graph_ok = True",
        "test_checker.py::test_fresh_buffer_at_replay_is_caught",
    ),
    Mutant(
        "verdict (c) the oracle always agrees",
        "refimpl.rig.core:Rig.run",
        'oracle_ok = close(eager, self.program(fb, self.oracle, **follow), self.tol, "eager vs oracle", findings)',
        "oracle_ok = True",
        "test_blind_spots.py::test_oracle_rebuilds_the_verify_mask_from_the_trees",
    ),
    Mutant(
        "verdict (d) compares nothing with the reference",
        "refimpl.rig.verdicts:diff_reference",
        "    return out",
        "    return []",
        "test_backend_class.py::test_fresh_tensor_at_replay_is_named",
    ),
    Mutant(
        "verdict (a) without the max-capacity views",
        "refimpl.rig.verdicts:max_capacity_views",
        "    try:\n        a, b = state(exact), state(full)",
        "    try:\n        a = b = state(exact)",
        "test_backend_class.py::test_a_plan_sized_by_the_host_mirror_fails_under_max_capacity_views",
    ),
    Mutant(
        "verdict (e) without the capture order",
        "refimpl.graphs.runner:capture_glue",
        "if first is not None and (lost",
        "if False and (lost",
        "test_glue.py::test_a_hook_whose_first_warm_up_writes_otherwise_than_its_capture_is_refused",
    ),
    Mutant(
        "verdict (e) without the plans' recorded inputs",
        "refimpl.flashinfer_wrappers:_counted",
        'w.__dict__.setdefault("_planned_from", {})[name] = _int_inputs(args, kw)',
        "pass",
        "test_glue.py::test_a_skipped_host_phase_is_named_by_its_plan_inputs_alone",
    ),
    Mutant(
        "verdict (d) without the padded-row invariants",
        "refimpl.rig.core:padded_row_invariants",
        "    return out",
        "    return []",
        "test_backend_class.py::test_padded_rows_breaking_the_indptr_invariant_are_named",
    ),
    Mutant(
        "the padded-row invariants not checked after the runner's replays",
        "refimpl.rig.core:Rig.run",
        "    findings += self.invariants(fb.batch_size)",
        "    pass",
        "test_backend_class.py::test_the_invariants_hold_after_every_replay_not_only_on_a_fresh_backend",
    ),
    Mutant(
        "verdict (f) the history replays nothing",
        "refimpl.rig.verdicts:history_verdict",
        "    steps, findings = history_steps(rig, big, a), []",
        "    steps, findings, long_run = [], [], lambda r: (1, [])",
        "test_backend_class.py::test_a_bug_that_depends_on_the_previous_replay_is_caught_by_the_history",
    ),
    Mutant(
        "(f) without A's lengths for other requests",
        "refimpl.rig.verdicts:history_steps",
        'steps = [("A", a), (f"A\'s lengths, other requests{trees}", gen.for_mode(kind, big, **same))]',
        'steps = [("A", a)]',
        "test_history.py::test_each_history_step_is_the_first_to_catch_the_bug_it_exists_for[RefreshOnlyWhenLengthsChange]",
    ),
    Mutant(
        "(f) without B, A's size with other lengths",
        "refimpl.rig.verdicts:history_steps",
        '    steps.append(("B, A\'s size, other lengths", _short(gen, kind, big)))',
        "    pass",
        "test_history.py::test_each_history_step_is_the_first_to_catch_the_bug_it_exists_for[IndptrOnlyWhenSizeChanges]",
    ),
    Mutant(
        "(f) without the other captured graphs",
        "refimpl.rig.verdicts:history_steps",
        '    return steps + [(f"C, the bs-{n} graph", _short(gen, kind, n)) for n in others]',
        "    return steps",
        "test_history.py::test_the_history_replays_every_captured_graph",
    ),
    Mutant(
        "(f) without the long run",
        "refimpl.rig.verdicts:history_verdict",
        "    bs, runs = long_run(rig)",
        "    bs, runs = 1, []",
        "test_history.py::test_each_history_step_is_the_first_to_catch_the_bug_it_exists_for[EveryKthReplaySkips]",
    ),
    Mutant(
        "the KV guard reports nothing",
        "refimpl.rig.core:KVGuard.check",
        "    return problems",
        "    return []",
        "test_backend_class.py::test_foreign_kv_write_is_caught_by_the_guard",
    ),
    Mutant(
        "the bounds guard passes every index through",
        "refimpl.kernels.bounds:guard_csr",
        '    if not _state["on"]:',
        "    if True:",
        "test_backend_class.py::test_metadata_pointing_outside_a_buffer_is_a_finding_not_a_crash",
        cpu_only="unguarded, the planted read is a device-side assert: it would end the test process's CUDA context",
    ),
    Mutant(
        "the emulator takes a copy inside capture for an allocation",
        "refimpl.graphs.recorder:Step.__init__",
        "if name.startswith(PURE_ALLOC):",
        'if name.startswith((*PURE_ALLOC, "aten.clone")):',
        "test_emulator.py::test_copy_ops_inside_capture_rerun",
    ),
    Mutant(
        "validation: accept-length bound S -> S+1",
        "refimpl.validate:check_batch",
        "max(acc) > steps)",
        "max(acc) > steps + 1)",
        "draft extend: accept length S+1 (one past the bound)",
    ),
    Mutant(
        "validation: seq_lens_sum unchecked",
        "refimpl.validate:check_batch",
        "if total != sum(seq):",
        "if False:",
        "seq_lens_sum understates the lengths (a kernel would read past its index buffer)",
    ),
    Mutant(
        "validation: any World accepted",
        "refimpl.validate:check_batch",
        "if world is not None and fb.world is not world:",
        "if False:",
        "a batch built against another World of the same sizes",
    ),
    Mutant(
        "validation: a graph verify batch may omit its mask",
        "refimpl.validate:check_batch",
        "if mask is None and for_graph and verify:",
        "if False:",
        "verify: no mask after a masked batch (the graph would read the last batch's)",
    ),
    Mutant(
        "validation: device and host seq_lens may disagree",
        "refimpl.validate:check_batch",
        'if res["seq_lens"] != seq:',
        "if False:",
        "device seq_lens past the context, host copy fine",
    ),
    Mutant(
        "validation: the tree mask's size unchecked",
        "refimpl.validate:check_batch",
        "if (got := mask.numel()) != (want := layout.tree_mask_total(seq, extra)):",
        "if False:",
        "verify: custom mask of the wrong size",
    ),
    Mutant(
        "validation: a self-blind mask accepted",
        "refimpl.validate:_report_device_findings",
        'if (e := first["custom_mask self"]) is not None and not getattr(fb.spec_info, "allow_blind_rows", False):',
        "if False:",
        "verify: a draft row that does not see itself",
    ),
    Mutant(
        "validation: a row may write any slot",
        "refimpl.validate:_report_device_findings",
        'if (i := first["out_cache_loc slot"]) is not None:',
        "if False:",
        "out_cache_loc of another request in the batch",
    ),
    Mutant(
        "deferred validation: the load ignores the verdict",
        "refimpl.kernels.inputs:load_inputs_ref",
        "refused = bool((verdict < NONE).any())",
        "refused = False",
        "out_cache_loc of a request outside the batch",
        cpu_only="on CUDA the Triton kernel loads the inputs, not load_inputs_ref",
    ),
    Mutant(
        "deferred validation: the device checks skip the host lengths",
        "refimpl.kernels.validation:batch_check_ref",
        "None if host is None else first_bad(seq, lambda i, v: v != host[i]),",
        "None,",
        "device seq_lens one short of the host copy, its write consistent with the device's",
        cpu_only="on CUDA the batch_check kernel checks, not batch_check_ref",
    ),
    Mutant(
        "deferred validation: a refusal found is never raised",
        "refimpl.graphs.runner:GraphRunner.synchronize",
        "if not self._record_np[0]:",
        "if True:",
        "out_cache_loc past the cache",
    ),
]


def _catching(m: Mutant):
    return CATCHING[m.catching] if "::" in m.catching else _case(m.catching)


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.id for m in MUTANTS])
def test_mutant_is_caught(mutant: Mutant, monkeypatch):
    """The catching test passes on the real code (the suite runs it) and fails with the mutant in place."""
    if mutant.cpu_only and torch.cuda.is_available():
        pytest.skip(mutant.cpu_only)
    monkeypatch.setattr(test_bad_inputs, "_SETUPS", {})  # runners of their own: a mutant may let a bad batch write
    catching = _catching(mutant)  # (a catching test missing from CATCHING fails here, not inside the raises)
    mutant.apply(monkeypatch)
    with pytest.raises((Exception, pytest.fail.Exception)):  # a failed assert, "DID NOT RAISE", or a crash
        catching()


def test_docs_lists_every_mutant():
    text = (ROOT / "docs" / "mutants.md").read_text()
    missing = [m.id for m in MUTANTS if f"| {m.id} |" not in text]
    assert not missing, f"docs/mutants.md lacks: {missing}"


@pytest.mark.parametrize(  # CPU CI: the first (each catching test also runs in its own file); the GPU gate: every one
    "mutant", [(pytest.param if i == 0 else gate)(m, id=m.id) for i, m in enumerate(MUTANTS)]
)
def test_the_harness_alone_breaks_nothing(mutant: Mutant, monkeypatch):
    """Recompiling and patching the same function with an edit that changes nothing leaves the catching test passing:
    each failure above comes from its edit, not from the harness or a broken test."""
    monkeypatch.setattr(test_bad_inputs, "_SETUPS", {})
    Mutant(mutant.id, mutant.where, mutant.old, mutant.old, mutant.catching).apply(monkeypatch)
    _catching(mutant)()
