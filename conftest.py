import os
import sys

import pytest

# refimpl must switch the Triton interpreter on before any kernel module is imported
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import refimpl  # noqa: E402,F401

HAS_CUDA = torch.cuda.is_available()


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped cleanly without one)")
    config.addinivalue_line("markers", "slow: takes more than a few seconds on CPU")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        tags = getattr(getattr(item, "cell", None), "metadata", {}).get("tags", [])
        if ("gpu" in item.keywords or "gpu" in tags) and not HAS_CUDA:
            item.add_marker(skip_gpu)
