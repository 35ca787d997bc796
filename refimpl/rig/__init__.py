"""The rig (``core``: one backend under capture and replay, built the same way for every tool) and the verdicts drawn
from it (``verdicts``). ``check``, ``fuzz``, ``bench``, ``capabilities``, ``benchmarks/`` and the notebooks are its
clients; none of them imports another."""

from .core import *  # noqa: F403
from .core import __all__ as _core
from .verdicts import *  # noqa: F403
from .verdicts import __all__ as _verdicts

__all__ = _core + _verdicts
