"""refimpl: how an LLM-serving engine captures and replays CUDA graphs around attention backends.

Import order matters: ``_env`` switches Triton's interpreter on (CPU-only machines) before any kernel module defines a
``@triton.jit`` function.
"""

from . import _env  # noqa: F401  (must stay first)
from ._env import default_device, default_dtype
from .config import GraphConfig, ModelConfig, SpecConfig
from .modes import ForwardMode

__all__ = ["ForwardMode", "ModelConfig", "SpecConfig", "GraphConfig", "default_device", "default_dtype"]
__version__ = "0.1.0"
