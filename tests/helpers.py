"""Shared test helpers (pytest puts this folder on sys.path)."""

import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from refimpl._env import default_device  # refimpl first: sets TRITON_INTERPRET on CPU

DEVICE = default_device()  # cpu (Triton interpreter) here; cuda on a GPU machine
FULL = DEVICE.type == "cuda" or os.environ.get("REFIMPL_FULL") == "1"  # as conftest.py: the gate's larger cases too
RAW_BS = (1, 3) if FULL else (3,)  # the per-size rows: CPU CI checks the padded size, the gate a captured one too
# the graphs a test captures: CPU CI the smallest and the one raw bs 3 pads to (two sizes: what one capture leaves
# behind for the next still shows), the gate a middle size too (each capture runs the model twice in the interpreter)
CAPTURE_BS = (1, 2, 4) if FULL else (1, 4)


def gate(*values, id=None):
    """A larger case of a parametrized test: the GPU gate runs it, CPU CI skips it (``gate`` marker, conftest.py)."""
    return pytest.param(*values, marks=pytest.mark.gate, id=id)


@pytest.fixture(autouse=True)
def on_device():
    """Every factory call in a test (torch.tensor, zeros, ...) lands on DEVICE. Autouse in each
    test module that imports it (the kernel tests)."""
    with torch.device(DEVICE):
        yield


def rng(seed):
    """A generator on DEVICE, seeded."""
    return torch.Generator(device=DEVICE).manual_seed(seed)


class RecordOps(TorchDispatchMode):
    """Records the name of every op dispatched inside the block (one entry per custom op)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def per_size_settings(spec, raw_bs=RAW_BS):
    """The checker's per-size verdicts only, in a small world: (e) and (f) have their own tests (test_glue.py,
    test_history.py) and the capability matrix; CI time."""
    from refimpl.check import CheckSettings

    small = dict(max_context_len=40, num_slots=None, glue_replays=0, history=False)
    return CheckSettings(capture_bs=CAPTURE_BS, raw_bs=raw_bs, spec=spec, **small)


def fast_check_settings():
    """The checker's settings for a backend-class test: the capture sizes above, raw sizes 1 and 3, a short context."""
    from refimpl.check import CheckSettings

    return CheckSettings(capture_bs=CAPTURE_BS, raw_bs=(1, 3), max_context_len=32, num_slots=None)


def check_class(target: str, modes=("decode",)):
    """The checker's rows for one ``--backend-class`` target (``module:Class``) on the CPU emulator, as the CLI loads it."""
    from refimpl.backends import load_backend_class
    from refimpl.check import run_checks

    return run_checks(modes=modes, engine="cpu-emulator", settings=fast_check_settings(), entries=[load_backend_class(target)])
