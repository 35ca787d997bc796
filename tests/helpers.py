"""Shared test helpers (pytest puts this folder on sys.path)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from refimpl._env import default_device  # refimpl first: sets TRITON_INTERPRET on CPU

DEVICE = default_device()  # cpu (Triton interpreter) here; cuda on a GPU machine


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
