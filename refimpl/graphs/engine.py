"""The contract every graph engine honours (CUDA and the CPU emulator alike).

``capture(fn)`` records ``fn`` and returns its outputs, the graph's *static outputs* (every replay rewrites them in
place); ``replay()`` re-runs the recorded work on the captured storage, no Python from ``fn`` (scalars, shapes, branches
frozen at capture); ``ops()`` / ``kernels()`` list what was recorded (each refimpl kernel is one ``refimpl.<name>``
custom op). ``GraphCaptureError``: work a capture cannot record (``.item()``); ``GraphReplayError``: a replay that
cannot happen.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch


class GraphCaptureError(RuntimeError):
    """Raised when captured code does something a CUDA graph cannot record."""


class GraphReplayError(RuntimeError):
    """Raised when a graph is replayed in a state it cannot be replayed in."""


class Graph(ABC):
    engine_name: str = "?"

    def __init__(self):
        self.captured = False
        # (op name, launches work at replay): views and pure allocations do not
        self._op_log: list[tuple[str, bool]] = []

    @abstractmethod
    def capture(self, fn: Callable[[], Any]) -> Any: ...

    @abstractmethod
    def replay(self): ...

    def ops(self) -> list[str]:
        """Every recorded op, in order (views and allocations included)."""
        return [name for name, _ in self._op_log]

    def kernels(self) -> Counter:
        """Ops that launch work at replay, with counts (views and allocations left out)."""
        return Counter(n for n, launches in self._op_log if launches)

    def custom_kernels(self) -> Counter:
        """Only refimpl's own registered kernels (``refimpl.*`` custom ops)."""
        return Counter({k: v for k, v in self.kernels().items() if k.startswith("refimpl.")})

    def _check_captured(self):
        if not self.captured:
            raise GraphReplayError(f"{self.engine_name} graph replayed before capture")


class GraphEngine(ABC):
    """Creates graphs and owns what captures share (the CUDA memory pool)."""

    name: str = "?"
    device: torch.device

    @abstractmethod
    def new_graph(self) -> Graph: ...

    def warmup(self, fn: Callable[[], Any], n: int):
        """Run the step ``n`` times eagerly before capture (SGLang runs it twice, [facts#capture])."""
        for _ in range(n):
            fn()

    def synchronize(self):  # noqa: B027 - a no-op on engines without streams
        """Wait for the engine's queued work (CUDA: its device)."""

    def memory_in_use(self) -> int | None:
        """Bytes the engine's graphs hold (CUDA: the graph pool), None where not meaningful."""
        return None
