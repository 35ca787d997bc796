"""Stand-in modules for what SGLang's import chain touches and its attention backends never use
(``refimpl.adapters.sglang``; the probes in ``benchmarks/sglang_probe/``).

``install(roots)`` puts a finder first on ``sys.meta_path``: a module named in ``roots`` (a top-level package, or a dotted
SGLang subpackage such as ``sglang.srt.parser``) imports as a permissive stand-in whose every attribute is a ``_Stub``
(callable, subscriptable, subclassable, falsy, usable as a decorator). The names probed by ``inspect`` / ``typing``
raise ``AttributeError``, as on a plain object. ``install(roots, fallback=True)`` also puts a second finder *last*: any
module that SGLang's code imports and no real finder found (a GPU-only package the CPU probe never imported) becomes a stand-in too, its name kept in
``FALLBACK`` so a run can print what it did not really import.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

_PROBED = set(
    """
    __wrapped__ __signature__ __origin__ __args__ __parameters__ __module__ __qualname__ __name__ __annotations__ __dict__
    __code__ __defaults__ __kwdefaults__ __func__ __self__ __set_name__ __get__ __len__ __iter__ __fspath__ __array__
    __torch_function__ __torch_dispatch__ __path__ __file__ __spec__ __loader__ __all__ __getstate__ __reduce_ex__
    """.split()
)


def _attr(name: str):
    if name in _PROBED:
        raise AttributeError(name)
    return _Stub()


class _Stub:
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator
        return _Stub()

    def __getattr__(self, name):
        return _attr(name)

    def __getitem__(self, key):
        return _Stub()

    def __setitem__(self, key, value):
        pass

    def __setattr__(self, key, value):
        pass

    def __contains__(self, key):
        return False

    def __len__(self):
        return 0

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False

    def __mro_entries__(self, bases):
        return (_StubBase,)

    def __or__(self, other):
        return _Stub()

    __ror__ = __truediv__ = __rtruediv__ = __add__ = __radd__ = __or__  # a path, a flag set: still a stand-in


class _StubMeta(type):
    def __getattr__(cls, name):
        return _attr(name)


class _StubBase(metaclass=_StubMeta):
    """What a class deriving from a stand-in (a ``pydantic.BaseModel``, a ``PretrainedConfig``) derives from."""

    def __init__(self, *args, **kwargs):
        pass

    def __init_subclass__(cls, **kwargs):
        pass

    def __getattr__(self, name):
        return _attr(name)


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        return "0.0.0" if name == "__version__" else _attr(name)


# what SGLang 0.5.23's attention backends import on a CPU and never use: top-level packages, and SGLang subpackages
# (dotted). ``tvm_ffi`` only where it is not installed: the real flashinfer's JIT loader needs the real one
ROOTS = tuple(
    """
    orjson pybase64 starlette aiohttp transformers huggingface_hub httpx httpx2 fastapi uvicorn zmq setproctitle uvloop
    sgl_kernel outlines xgrammar llguidance partial_json_parser compressed_tensors torchao gguf openai tiktoken
    sentencepiece einops prometheus_client interegular pynvml datasets requests PIL pydantic_core pydantic
    sglang.srt.entrypoints sglang.srt.function_call sglang.srt.parser sglang.srt.constrained torchvision safetensors regex
    tvm_ffi
    """.split()
)

FALLBACK: list[str] = []  # modules the last-resort finder stood in for
# never stood in, not even a name under them the fallback would take for a module: SGLang's ``from torch.distributed
# import all_gather_single`` must raise on a torch without it (it falls back to the older name), not import a stand-in
REAL = ("torch", "triton", "numpy")


def _imported_by_sglang() -> bool:
    """Whether the import statement being served is in SGLang's code (the fallback stands in for nothing else: other
    packages probe optional modules with try/except ImportError, and a stand-in would take the wrong branch)."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        frame = frame.f_back
    return frame is not None and frame.f_globals.get("__name__", "").startswith("sglang")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots, everything=False):
        self.roots, self.everything = set(roots), everything

    def find_spec(self, name, path, target=None):
        dotted = any(name == r or name.startswith(r + ".") for r in self.roots if "." in r)
        if self.everything and (not _imported_by_sglang() or name.split(".")[0] in REAL):
            return None
        if name.split(".")[0] in self.roots or dotted or self.everything:
            if self.everything:
                FALLBACK.append(name)
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def install(roots, fallback: bool = False) -> None:
    sys.meta_path.insert(0, _Finder(roots))
    if fallback and not any(getattr(f, "everything", False) for f in sys.meta_path):
        sys.meta_path.append(_Finder((), everything=True))
