"""Stand-ins for the modules SGLang's import chain touches that its attention backends never use."""
import importlib.abc, importlib.machinery, sys, types

class _Stub:
    def __init__(self, *a, **k): pass
    def __call__(self, *a, **k):
        if len(a) == 1 and callable(a[0]) and not k: return a[0]  # used as a decorator
        return _Stub()
    def __getattr__(self, name):
        if name in _PROBED: raise AttributeError(name)
        return _Stub()
    def __getitem__(self, k): return _Stub()
    def __setitem__(self, k, v): pass
    def __setattr__(self, k, v): pass
    def __contains__(self, k): return False
    def __len__(self): return 0
    def __iter__(self): return iter(())
    def __bool__(self): return False
    def __mro_entries__(self, bases): return (_StubBase,)
    def __or__(self, other): return _Stub()
    __ror__ = __or__

_PROBED = {"__wrapped__", "__signature__", "__origin__", "__args__", "__parameters__", "__module__", "__qualname__",
           "__name__", "__annotations__", "__dict__", "__code__", "__defaults__", "__kwdefaults__", "__func__", "__self__",
           "__set_name__", "__get__", "__len__", "__iter__", "__fspath__", "__array__", "__torch_function__",
           "__torch_dispatch__", "__path__", "__file__", "__spec__", "__loader__", "__all__", "__getstate__", "__reduce_ex__"}


class _StubMeta(type):
    def __getattr__(cls, name):
        if name in _PROBED: raise AttributeError(name)
        return _Stub()


class _StubBase(metaclass=_StubMeta):
    def __init__(self, *a, **k): pass
    def __init_subclass__(cls, **k): pass
    def __getattr__(self, name):
        if name in _PROBED: raise AttributeError(name)
        return _Stub()

class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name in _PROBED: raise AttributeError(name)
        if name == "__version__": return "0.0.0"
        return _Stub()

class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots): self.roots = set(roots)
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.roots or any(name == r or name.startswith(r + ".") for r in self.roots if "." in r):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None
    def create_module(self, spec):
        m = _StubModule(spec.name); m.__path__ = []; m.__stub__ = True; return m
    def exec_module(self, module): pass

def install(roots):
    sys.meta_path.insert(0, Finder(roots))
