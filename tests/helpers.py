"""Shared test helpers (pytest puts this folder on sys.path)."""

from torch.utils._python_dispatch import TorchDispatchMode


class RecordOps(TorchDispatchMode):
    """Records the name of every op dispatched inside the block (one entry per custom op)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))
