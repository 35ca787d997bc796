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
