"""A failed capture is contained: whatever raises inside it, the engine ends the capture, drops
the graph and leaves the process as it found it, so the next capture and replay in the same
process succeed (on the H200, an uncontained failure used to break every later capture of the
test run). Each case fails a capture, then checks the process state and runs the checker's
capture / replay / eager / oracle round on a fresh runner in the same process."""

import gc

import pytest
import torch

from refimpl.check import CheckSettings, run_checks
from refimpl.graphs import GraphCaptureError, make_engine

CASES = {
    # refused by refimpl's op recorder before CUDA sees it (both engines)
    "host_sync": (lambda y: y.sum().item(), GraphCaptureError),
    # the caller's own exception, raised mid-capture after work was recorded (both engines)
    "python_error": (lambda y: (_ for _ in ()).throw(KeyError("planted")), KeyError),
    # forbidden by CUDA itself during stream capture: it invalidates the capture (CUDA only)
    "cuda_sync": (lambda y: torch.cuda.synchronize(), GraphCaptureError),
}


@pytest.mark.parametrize("how", list(CASES))
def test_a_failed_capture_leaves_the_process_usable(how):
    engine = make_engine("auto")
    if how == "cuda_sync" and engine.device.type != "cuda":
        pytest.skip("a capture error raised by CUDA itself needs a CUDA device")
    fail, expected = CASES[how]
    x = torch.randn(32, 32, device=engine.device)
    engine.warmup(lambda: x @ x, 1)  # cuBLAS set up outside the capture, as the runner does
    caller = torch.cuda.current_stream() if engine.device.type == "cuda" else None

    def doomed():
        y = x @ x  # recorded before the failure
        fail(y)
        return y

    with pytest.raises(expected):
        engine.new_graph().capture(doomed)
    assert gc.isenabled()  # switched off for the capture only
    if caller is not None:
        assert torch.cuda.current_stream() == caller
        assert not torch.cuda.is_current_stream_capturing()
    torch.testing.assert_close(x @ x, (x.double() @ x.double()).to(x.dtype), rtol=1e-2, atol=1e-2)
    # a whole capture / replay / eager / oracle round, same process, on the same engine kind
    rows = run_checks(
        ["torch_native"],
        ["decode"],
        engine="auto",
        settings=CheckSettings(capture_bs=(1, 4), raw_bs=(3,), max_context_len=24, num_slots=None),
    )
    assert rows and all(r.passed and not r.findings for r in rows), [r.findings for r in rows]
