import os
import sys

import pytest

# refimpl must switch the Triton interpreter on before any kernel module is imported
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import refimpl  # noqa: E402,F401

HAS_CUDA = torch.cuda.is_available()
FULL = HAS_CUDA or os.environ.get("REFIMPL_FULL") == "1"  # every case of every test, the gate's larger ones too


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped cleanly without one)")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    skip_gate = pytest.mark.skip(reason="a larger case: the GPU gate runs it (REFIMPL_FULL=1 runs it here)")
    for item in items:
        tags = getattr(getattr(item, "cell", None), "metadata", {}).get("tags", [])
        if ("gpu" in item.keywords or "gpu" in tags) and not HAS_CUDA:
            item.add_marker(skip_gpu)
        elif "gate" in item.keywords and not FULL:
            item.add_marker(skip_gate)
