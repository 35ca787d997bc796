"""Emulator parity: the programs of ``parity_programs.py`` under the emulator and under CUDA graphs.

On every machine each program runs under ``CPUEmulatorEngine()``: a capturable program replays
exactly (bitwise) what an eager re-execution of its step gives on the mutated inputs; a stale
pitfall replays its frozen expectation instead (and visibly differs from eager); a host-sync /
data-dependent-shape pitfall raises ``GraphCaptureError`` at capture.

With CUDA (``gpu`` marker) the same program runs under ``CUDAGraphEngine`` and under the emulator
on CUDA tensors: every replay's outputs are ``torch.equal`` across the two engines (same device,
same dtype, same kernels), and both raise the same exception class for the capture pitfalls. The
failing captures run in a subprocess, since a failed CUDA capture can poison the process.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
from parity_programs import KNOWN_DIVERGENCES, PROGRAMS, Accumulate, Trace, run_program

from refimpl.graphs import CPUEmulatorEngine, GraphCaptureError

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CAPTURABLE = [p for p in PROGRAMS if p.capture_error is None]
FAILING = [p for p in PROGRAMS if p.capture_error is not None]


def _ids(programs):
    return [p.name for p in programs]


def same(a: tuple, b: tuple) -> bool:
    """Bitwise: same count, shapes, dtypes, devices and values."""
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype and x.device == y.device and torch.equal(x, y) for x, y in zip(a, b)
    )


def _diff(a: tuple, b: tuple) -> str:
    parts = []
    for i, (x, y) in enumerate(zip(a, b)):
        if x.shape != y.shape or x.dtype != y.dtype:
            parts.append(f"#{i}: {tuple(x.shape)} {x.dtype} vs {tuple(y.shape)} {y.dtype}")
        elif not torch.equal(x, y):
            d = (x.double() - y.double()).abs().max().item()
            parts.append(f"#{i}: max |diff| {d:.3e}")
    return "; ".join(parts) or f"{len(a)} vs {len(b)} outputs"


def check_against_contract(program, trace: Trace) -> None:
    """The single-engine half of parity: the trace honours the program's documented outcome."""
    if program.capture_error is not None:
        assert trace.error is program.capture_error, (trace.error, trace.message)
        assert not any(trace.captured.values()), "a failed capture must leave the graph uncaptured"
        assert not trace.replays
        return
    assert trace.error is None, f"{trace.error.__name__}: {trace.message}"
    assert all(trace.captured.values()) and set(trace.captured) == set(program.keys)
    assert len(trace.replays) == program.replays
    assert trace.addresses_stable, "static outputs must stay at their captured addresses"
    differs_from_eager = 0
    for k, r in enumerate(trace.replays):
        where = f"{program.name} replay {k} ({r.key}) on {trace.engine}"
        if r.expected is not None:
            assert same(r.graph, r.expected), f"{where}: graph vs expected {_diff(r.graph, r.expected)}"
        if program.stale:
            differs_from_eager += not same(r.graph, r.eager)
        else:
            assert same(r.graph, r.eager), f"{where}: graph vs eager {_diff(r.graph, r.eager)}"
    if program.stale:
        assert differs_from_eager, f"{program.name}: the stale pitfall never showed (graph == eager)"


# ----------------------------------------------------------------------------------------------
# every machine: the emulator


@pytest.mark.parametrize("program", PROGRAMS, ids=_ids(PROGRAMS))
def test_emulator_honours_program(program):
    torch.manual_seed(0)
    engine = CPUEmulatorEngine()
    check_against_contract(program, run_program(program, engine))


def test_programs_cover_the_brief():
    names = [p.name for p in PROGRAMS]
    assert len(names) == len(set(names)), names
    assert {p.name for p in FAILING} >= {
        "host_sync_item",
        "host_sync_branch",
        "host_sync_tolist",
        "host_sync_nonzero",
        "data_dependent_shape_static_mask",
        "data_dependent_shape_value_mask",
    }
    assert sum(p.stale for p in PROGRAMS) == 2
    assert any(len(p.keys) > 1 for p in PROGRAMS), "one program shares an engine between graphs"


def test_emulator_custom_kernels_are_recorded():
    program = next(p for p in PROGRAMS if p.name == "kernels_paged_attention")
    trace = run_program(program, CPUEmulatorEngine())
    kernels = trace.kernels["main"]
    assert kernels["refimpl.build_kv_indices.default"] == 1, kernels
    assert kernels["refimpl.dense_paged_attention.default"] == 1, kernels


# ----------------------------------------------------------------------------------------------
# CUDA: real CUDA graphs vs the emulator on CUDA tensors


def _cuda_engines():
    from refimpl.graphs.cuda import CUDAGraphEngine

    emu = CPUEmulatorEngine()
    assert emu.name == "emulator-cuda", "on a CUDA machine the emulator runs on CUDA tensors"
    return emu, CUDAGraphEngine()


@pytest.mark.gpu
@pytest.mark.parametrize("program", CAPTURABLE, ids=_ids(CAPTURABLE))
def test_cuda_graph_and_emulator_replay_identically(program):
    emu_engine, cuda_engine = _cuda_engines()
    torch.manual_seed(0)
    emu = run_program(program, emu_engine)
    torch.manual_seed(0)
    cuda = run_program(program, cuda_engine)
    torch.cuda.synchronize()
    # each engine on its own honours the program (eager on CUDA runs the same kernels)
    check_against_contract(program, emu)
    check_against_contract(program, cuda)
    # and the two agree bit for bit after every replay
    assert emu.kernels == cuda.kernels, (emu.kernels, cuda.kernels)
    assert [r.key for r in emu.replays] == [r.key for r in cuda.replays]
    for k, (a, b) in enumerate(zip(emu.replays, cuda.replays)):
        assert same(a.graph, b.graph), f"replay {k} ({a.key}): emulator vs CUDA {_diff(a.graph, b.graph)}"


_FAILING_CAPTURE = "import sys; sys.path[:0] = [{here!r}, {root!r}]; import parity_programs as p; p.main([{name!r}])"


def _capture_outcomes_in_subprocess(program) -> dict:
    """Run ``parity_programs.main`` for one program in a fresh interpreter; its JSON summary."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = _FAILING_CAPTURE.format(here=HERE, root=ROOT, name=program.name)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("PARITY-RESULT ")]
    assert res.returncode == 0 and lines, (res.returncode, res.stdout[-2000:], res.stderr[-4000:])
    result = json.loads(lines[-1].removeprefix("PARITY-RESULT "))
    assert set(result) == {"emulator-cuda", "cuda"}, result
    return result


@pytest.mark.gpu
@pytest.mark.parametrize("program", FAILING, ids=_ids(FAILING))
def test_cuda_graph_and_emulator_refuse_the_same_capture(program):
    result = _capture_outcomes_in_subprocess(program)
    want = program.capture_error.__name__
    for name, r in result.items():
        assert r["error"] == want, (name, r)
        assert not any(r["captured"].values()) and r["replays"] == 0, (name, r)
    assert want == GraphCaptureError.__name__


# Known engine differences. Each test asserts parity; while the difference is there and looks
# exactly as described it reports xfail (an imperative, non-strict one: fixing the engine turns it
# into a pass), and any other outcome fails.


@pytest.mark.gpu
def test_capture_side_effects_match():
    emu_engine, cuda_engine = _cuda_engines()
    program = Accumulate()
    after_capture, before = {}, {}
    for engine in (emu_engine, cuda_engine):
        state = program.setup(engine.device)
        engine.warmup(lambda s=state: program.step(s), 2)
        state.acc.copy_(state.acc0)  # undo the warm-up runs
        engine.synchronize()
        engine.new_graph().capture(lambda s=state: program.step(s))
        engine.synchronize()
        after_capture[engine.name] = state.acc.clone()
        before[engine.name] = (state.acc0.clone(), (state.acc0 + state.x).clone())
    emu, cuda = after_capture["emulator-cuda"], after_capture["cuda"]
    if torch.equal(emu, cuda):
        return
    acc0, acc0_plus_x = before["cuda"]
    assert torch.equal(emu, acc0_plus_x) and torch.equal(cuda, acc0), "an unexplained difference"
    pytest.xfail(
        "engine difference: the emulator executes the step while capturing (acc += x happens "
        "once), CUDA stream capture only records it (acc unchanged until the first replay)"
    )


@pytest.mark.gpu
@pytest.mark.parametrize("program", KNOWN_DIVERGENCES, ids=_ids(KNOWN_DIVERGENCES))
def test_device_to_host_copy_refused_alike(program):
    result = _capture_outcomes_in_subprocess(program)
    assert result["cuda"]["error"] == "GraphCaptureError", result  # what CUDA itself does
    if result["emulator-cuda"]["error"] == "GraphCaptureError":
        return
    assert result["emulator-cuda"]["error"] is None, result
    pytest.xfail(
        "engine difference: the emulator on CUDA tensors records a synchronous device-to-host "
        "copy (.to('cpu'), copy_ into a CPU tensor); CUDA stream capture refuses it"
    )
