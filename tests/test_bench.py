"""``python -m refimpl bench`` on CPU: it runs, writes what it says, and refuses bad flags."""

import csv
import json

import pytest
import torch

from refimpl.__main__ import main
from refimpl.bench import CSV_COLUMNS
from refimpl.config import CHAIN


def test_bench_writes_json_csv_and_figures(tmp_path, capsys):
    rc = main(
        [
            "bench",
            "--backend",
            "triton",
            "--variant",
            "unified",
            "--variant",
            "in_graph",
            "--mode",
            "decode",
            "--ctx",
            "32",
            "--bs",
            "1",
            "--repeats",
            "2",
            "--warmup",
            "1",
            "--rotate",
            "2",
            "--out",
            str(tmp_path),
            "--figures",
            str(tmp_path),
        ]
    )
    assert rc == 0
    data = json.loads((tmp_path / "results.json").read_text())
    # the engine the timings come from: the emulator on CPU, real CUDA graphs on a GPU
    assert ("CUDA graph" if torch.cuda.is_available() else "emulator") in data["environment"]["note"]
    rows = data["rows"]
    assert {(r["variant"], r["bs"]) for r in rows} == {("unified", 1), ("in_graph", 1)}
    for r in rows:
        assert set(r["host_us"]) >= {"validate", "copies", "hook", "launch", "path"}
        assert r["step_us"]["graph"]["n"] == 2 and r["static_bytes"] > 0
    # what each shape's replay hook launches, counted while it ran
    hooks = {r["variant"]: r["hook_launches"] for r in rows if r["bs"] == 1}
    assert hooks["in_graph"] == {} and hooks["unified"]["refimpl.build_kv_indices.default"] == 1
    with open(tmp_path / "results.csv") as f:
        table = list(csv.reader(f))
    assert tuple(table[0]) == CSV_COLUMNS and len(table) == 1 + len(rows)
    assert (tmp_path / "replay_breakdown.png").stat().st_size > 0


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--variant", "nosuch"], "argument --variant: unknown ['nosuch']"),
        (["--ctx", "0"], "argument --ctx: context lengths must be >= 1"),
        (["--repeats", "x"], "argument --repeats: 'x' is not an integer"),
    ],
)
def test_bench_refuses_bad_flags(argv, fragment, capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", *argv])
    assert e.value.code == 2 and fragment in capsys.readouterr().err


def test_each_timed_hook_sees_the_batch_it_was_loaded_with():
    """The hook pass rotates batches of different lengths: each hook call must follow that batch's own ``load_inputs``
    (FlashInfer's verify hook checks the tree mask against the loaded lengths; an H200 sweep died on it)."""
    from refimpl import bench
    from refimpl.backends import find
    from refimpl.graphs import CPUEmulatorEngine
    from refimpl.layout import KINDS
    from refimpl.rig import Rig

    spec = CHAIN
    rig = Rig.build(
        find("flashinfer", "unified")[0], KINDS["target_verify"], spec, CPUEmulatorEngine(), capture_bs=(2,), max_context_len=48
    )
    batches = [rig.gen.target_verify(2, seq_lens=lens) for lens in ([5, 9], [20, 30])]
    out = bench.time_replay_path(rig.runner, batches, repeats=2 * bench.RUN, warmup=0)  # both batches hooked
    assert out["host_us"]["hook"]["n"] == 2 * bench.RUN


def test_host_times_loads_a_batch_once_per_run_of_calls():
    """Hook and launch are timed in runs on one loaded batch (a load before every call read 1.16x a plain loop on the
    H200): ``before`` runs once per run, on the batch the run's calls get, and the batches still rotate."""
    from refimpl import bench

    calls, loads = [], []
    bench.host_times(calls.append, "ab", repeats=6, warmup=2, sync=lambda: None, before=loads.append, run=4)
    assert calls == list("aaaabbbb") and loads == list("ab")


def test_each_host_phase_is_timed_alone_in_a_pass_of_its_own(monkeypatch):
    """The bench's hook column is the hook's own cost (issue 16): every timer bracket of ``time_replay_path`` holds one
    call of one phase, and a phase's pass runs no other phase between its calls, only its untimed set-up (a
    synchronisation, the batch's load). The old bench timed each hook right after a wait for the previous step's graph
    and read it 1.1-3x high (``benchmarks/results/bench_vs_direct/``). This replaces a GPU test that held the bench to
    15% of a plain loop by timing both: the medians of its rounds read the bench 1.10-1.16x the loop (cause not
    isolated), host noise moved single rounds 0.38-2.1x, and it failed the gate at 15c157a, a330df9, e9520b2 and
    57f9278. The timings live in ``benchmarks/bench_vs_direct.py``."""
    from refimpl import bench
    from refimpl.backends import find
    from refimpl.graphs import CPUEmulatorEngine
    from refimpl.layout import KINDS
    from refimpl.rig import Rig

    rig = Rig.build(
        find("triton", "unified")[0], KINDS["decode"], CHAIN, CPUEmulatorEngine(), capture_bs=(2,), max_context_len=48
    )
    runner, log, depth = rig.runner, [], [0]

    def logged(name, real):  # the bench's own calls only, not the runner's calls inside them
        def call(*a, **k):
            log.extend([name] if depth[0] == 0 else [])
            depth[0] += 1
            try:
                return real(*a, **k)
            finally:
                depth[0] -= 1

        return call

    for name in ("validate", "load_inputs", "replay_hook", "launch", "synchronize", "replay"):
        monkeypatch.setattr(runner, name, logged(name, getattr(runner, name)))
    clock = bench.time.perf_counter
    monkeypatch.setattr(bench, "time", type("Clock", (), {"perf_counter": lambda: (log.append("timer"), clock())[1]}))
    monkeypatch.setattr(bench, "_sync", lambda cuda: lambda: log.append("sync"))
    batches = [rig.gen.decode(2, seq_lens=lens) for lens in ([5, 9], [20, 30])]
    bench.time_replay_path(runner, batches, repeats=2 * bench.RUN, warmup=0)  # warm-up calls close no timer

    text = " ".join(log).split("timer")  # even pieces: between brackets (untimed); odd: inside one
    timed, gaps = text[1::2], text[0::2]
    phases = [t.split() for t in timed]
    assert {tuple(p) for p in phases if p[0] != "replay"} == {("validate",), ("load_inputs",), ("replay_hook",), ("launch",)}
    settled, loaded = {"sync", "synchronize"}, {"sync", "load_inputs"}  # each phase's untimed set-up
    setup = {"validate": settled, "load_inputs": settled, "replay_hook": loaded, "launch": loaded}
    for (phase, *_), gap in zip(phases[1:], gaps[1:]):  # what ran untimed before each bracket but the first
        assert phase not in setup or set(gap.split()) <= setup[phase], (phase, "timed after", gap.split())
