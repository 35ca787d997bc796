"""The checker passes the unified hello-world backend and catches each classic bug class."""

import pytest
import torch
from helpers import CAPTURE_BS

from refimpl.backends import BackendEntry
from refimpl.backends.torch_native import TorchNativeBackend, TorchNativeMetadata
from refimpl.check import CheckSettings, check_entry_mode, run_checks
from refimpl.graphs import CPUEmulatorEngine
from refimpl.modes import ForwardMode
from refimpl.rig import diff_states

FAST = CheckSettings(capture_bs=CAPTURE_BS, raw_bs=(1, 3), max_context_len=32, num_slots=None)


class FreshBufferAtReplay(TorchNativeBackend):
    """Bug class 'stale bound buffer': replay builds kv_indptr in a fresh tensor."""

    variant = "bug-fresh-buffer"

    def init_forward_metadata_replay_cuda_graph(self, bs, rpi, seq_lens, *args, **kw):
        real = self.cuda_graph_kv_indptr
        self.cuda_graph_kv_indptr = torch.zeros_like(real)  # the graph still reads `real`
        try:
            super().init_forward_metadata_replay_cuda_graph(bs, rpi, seq_lens, *args, **kw)
        finally:
            self.cuda_graph_kv_indptr = real


class FrozenScalarAtCapture(TorchNativeBackend):
    """Bug class 'Python scalar baked at capture' (old TRTLLM-MLA max_seq_len)."""

    variant = "bug-frozen-scalar"

    def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, rpi, seq_lens, *a, **k):
        super().init_forward_metadata_capture_cuda_graph(bs, num_tokens, rpi, seq_lens, *a, **k)
        md = self.forward_metadata
        longest = int(seq_lens[:bs].max())  # host read *outside* the graph, then frozen
        self.forward_metadata = TorchNativeMetadata(
            md.kv_indptr, md.kv_indices, md.q_per_req, longest, md.custom_mask, md.mask_indptr
        )


def entry(cls, variant):
    e = BackendEntry("torch_native", variant, "refimpl.backends.torch_native:TorchNativeBackend")
    object.__setattr__(e, "load", lambda multi_step=False: cls)
    return e


@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.IDLE])
def test_unified_hello_world_passes(mode):
    rows = check_entry_mode(entry(TorchNativeBackend, "unified"), mode, CPUEmulatorEngine(), FAST)
    assert rows and all(r.passed for r in rows), [r.findings for r in rows]
    assert all(r.findings == [] for r in rows)
    # verify's hook copies the batch's custom mask: a glue graph would replay the mask it was captured with
    assert all(r.glue_equals_eager is (mode != ForwardMode.TARGET_VERIFY) for r in rows)
    assert all(bool(r.glue_findings) == (mode == ForwardMode.TARGET_VERIFY) for r in rows)


def test_fresh_buffer_at_replay_is_caught():
    rows = check_entry_mode(entry(FreshBufferAtReplay, "bug"), ForwardMode.DECODE, CPUEmulatorEngine(), FAST)
    bad = [r for r in rows if r.bs > 1]
    # Pattern A shares the buggy body between capture and replay, so (a) cannot see it ...
    assert bad and all(r.capture_equals_replay for r in bad)
    # ... but the graph reads the real buffer, which nobody refilled: (b) fails
    assert all(r.graph_equals_eager is False for r in bad)
    assert all(any(f.startswith("graph vs eager") for f in r.findings) for r in bad)
    assert all(r.matches_oracle for r in rows), "the eager path itself is right"


def replay_forgets(buffer: str) -> type:
    """Bug class 'capture and replay drifted apart' (Pattern C): the replay hook leaves ``buffer`` as it was (capture
    fills it)."""

    class ReplayForgets(TorchNativeBackend):
        variant = "bug-drift"

        def init_forward_metadata_replay_cuda_graph(self, bs, rpi, seq_lens, *args, **kw):
            saved = getattr(self, buffer).clone()
            super().init_forward_metadata_replay_cuda_graph(bs, rpi, seq_lens, *args, **kw)
            if not getattr(self, "_capturing", False):
                getattr(self, buffer).copy_(saved)

        def init_forward_metadata_capture_cuda_graph(self, *a, **k):
            self._capturing = True
            try:
                super().init_forward_metadata_capture_cuda_graph(*a, **k)
            finally:
                self._capturing = False

    return ReplayForgets


ReplayForgetsMaskIndptr = replay_forgets("cuda_graph_mask_indptr")
ReplaySkipsTheMask = replay_forgets("cuda_graph_custom_mask")  # the graph reads the capture's dummy mask


def test_capture_replay_drift_is_caught():
    rows = check_entry_mode(entry(ReplayForgetsMaskIndptr, "bug"), ForwardMode.TARGET_VERIFY, CPUEmulatorEngine(), FAST)
    assert all(r.capture_equals_replay is False for r in rows)
    assert all(any(f.startswith("mask_indptr:") and "stale from capture" in f for f in r.findings) for r in rows)
    # request 0's mask starts at 0 either way; with more requests the stale offsets bite
    assert all(r.graph_equals_eager is False for r in rows if r.bs > 1)


def test_replay_that_skips_the_mask_is_named():
    rows = check_entry_mode(entry(ReplaySkipsTheMask, "bug"), ForwardMode.TARGET_VERIFY, CPUEmulatorEngine(), FAST)
    assert all(r.capture_equals_replay is False for r in rows)
    assert all(any(f.startswith("custom_mask:") for f in r.findings) for r in rows), [r.findings for r in rows]


def test_stale_from_capture_is_named_where_the_replay_kept_the_capture_batch():
    """FlashInfer-MLA as-upstream: the replay path fills unbound buffers, so the bound ``kv_indptr`` / ``kv_len_arr`` keep
    the capture batch's values (SGLang #37975): "stale from capture". Legacy Triton draft extend lays ``qo_indptr`` out
    another way at capture (not the capture batch's values): no such words."""
    from refimpl.backends import find

    settings = CheckSettings(
        capture_bs=CAPTURE_BS, raw_bs=(3,), max_context_len=32, num_slots=None, glue_replays=0, history=False
    )
    (mla,) = check_entry_mode(find("flashinfer_mla", "as-upstream")[0], "decode", CPUEmulatorEngine(), settings)
    stale = [f.split(": ")[0] for f in mla.findings if "stale from capture" in f]
    assert stale == ["kv_indptr", "kv_len_arr"], mla.findings
    (line,) = [f for f in mla.findings if f.startswith("kv_indptr: ")]
    assert line.endswith("; capture vs replay; stale from capture: the replay path kept the capture batch's values)")
    assert not any("stale" in f for f in mla.findings if f.startswith("reference: "))
    (triton,) = check_entry_mode(find("triton", "legacy")[0], "draft_extend", CPUEmulatorEngine(), settings)
    assert any(f.startswith("qo_indptr: ") for f in triton.findings), triton.findings
    assert not any("stale from capture" in f for f in triton.findings), triton.findings


def test_frozen_scalar_is_caught():
    rows = check_entry_mode(entry(FrozenScalarAtCapture, "bug"), ForwardMode.DECODE, CPUEmulatorEngine(), FAST)
    assert all(r.capture_equals_replay is False for r in rows)
    assert any("max_kv_len" in f and "frozen at capture" in f for f in rows[0].findings)
    assert any(r.graph_equals_eager is False for r in rows)


def test_unsupported_mode_is_reported_as_skipped():
    rows = check_entry_mode(entry(TorchNativeBackend, "unified"), ForwardMode.DRAFT_EXTEND, CPUEmulatorEngine(), FAST)
    assert len(rows) == 1 and rows[0].passed and "skipped" in rows[0].findings[0]
    assert rows[0].skipped and rows[0].status == "skipped"


def test_diff_states_names_buffer_and_elements():
    a = {"kv_indptr": torch.tensor([0, 3, 5]), "max_len": 8}
    b = {"kv_indptr": torch.tensor([0, 3, 6]), "max_len": 9, "extra": torch.zeros(1)}
    out = diff_states(a, b)
    assert "kv_indptr: 1 of 3 elements differ ([2] 5 vs 6" in out[1]
    assert out[2] == "max_len: 8 frozen at capture vs 9 after replay"
    assert out[0] == "extra: only the replay path sets it"


def test_run_checks_json_keys_and_unknown_backend():
    rows = run_checks(["torch_native"], ["decode"], None, "cpu-emulator", FAST)
    keys = set(rows[0].to_json())
    assert keys == {
        "backend",
        "variant",
        "mode",
        "bs",
        "engine",
        "capture_equals_replay",
        "graph_equals_eager",
        "matches_oracle",
        "findings",
        "pattern",
        "replay_matches_reference",
        "glue_equals_eager",
        "glue_findings",
        "expected",  # issue 17: new fields only
        "status",
        "history_ok",  # issue 18: verdict (f)
        "arguments",  # issue 33: --arguments (empty without it)
    }
    assert rows[0].pattern == TorchNativeBackend.pattern  # the record carries the class's label
    with pytest.raises(ValueError, match="unknown backend 'nope'"):
        run_checks(["nope"], None, None, "cpu-emulator", FAST)


SMALL_WORLD = ["--context", "64", "--pool", "4096"]  # the CLI's smallest world: the output's form is the point


def test_cli_reports_like_a_tool(capsys):
    """A status per row (historical shapes' findings are ``expected``, not failures), skipped rows without a batch size,
    verdict (e)'s reasons as information, one short legend line and a closing summary; no progress bar off a terminal;
    exit 0 when nothing that must pass failed."""
    from refimpl.__main__ import LEGEND, main

    assert (
        main(["check", "--backend", "flashinfer_mla", "--mode", "decode", "--mode", "draft_decode", "--bs", "1", *SMALL_WORLD])
        == 0
    )
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert "%|" not in err and "%|" not in out  # stderr is not a terminal here: no progress bar
    rows = [line.split() for line in lines[2:] if line.startswith("flashinfer_mla")]
    mode = lambda r: "draft_decode" if "draft_decode" in r else "decode"  # noqa: E731
    status = {(r[1], mode(r)): r[-1] for r in rows}
    assert status == {
        ("unified", "decode"): "ok",
        ("as-upstream", "decode"): "expected",
        ("legacy", "decode"): "expected",
        ("unified", "draft_decode"): "ok",
        ("as-upstream", "draft_decode"): "skipped",
        ("legacy", "draft_decode"): "skipped",
    }, rows
    assert all(r[r.index(mode(r)) + 1] == ("-" if r[-1] == "skipped" else "1") for r in rows)  # no bs 0 when skipped
    assert LEGEND in lines and len(LEGEND) < 200
    # verdict (e)'s reasons read as information under rows that pass; findings that fail a row keep "    - "
    glue = [line for line in lines if line.startswith("    (e) ")]
    assert glue and all(line.startswith("    (e) glue refused (information): ") for line in glue), glue
    assert not any(line.startswith("    - ") and "glue" in line for line in lines)
    assert lines[-1].startswith("check: 6 rows in ") and lines[-1].endswith(
        "2 ok, 2 expected historical findings (legacy / as-upstream shapes), 2 skipped, 0 unexpected failures"
    )


def test_cli_shows_the_progress_bar_on_a_terminal_only(capsys, monkeypatch):
    """The README's progress bar runs on stderr when a person watches it (a terminal), not in a log or a notebook."""
    import refimpl.__main__ as cli

    monkeypatch.setattr(cli, "_terminal", lambda: True)
    assert cli.main(["check", "--backend", "torch_native", "--mode", "idle"]) == 0
    out, err = capsys.readouterr()
    assert "check:" in err and "%|" in err and "%|" not in out
