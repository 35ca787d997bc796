"""Copy only the SGLang files the probe loads (``side_by_side.py`` run in every mode, with the stand-ins: some modules
load only when a hook runs) from an unpacked wheel into a trimmed tree small enough to carry to the H200 (no network).

    python benchmarks/sglang_probe/trim.py /tmp/sgl /tmp/sgl-trim    # then: side_by_side.py /tmp/sgl-trim <mode>
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODULES = (
    "sglang.srt.server_args",
    "sglang.srt.runtime_context",
    "sglang.srt.configs.model_config",
    "sglang.srt.layers.attention.triton_backend",
    "sglang.srt.mem_cache.kv_index_translator",
    "sglang.srt.model_executor.forward_batch_info",
)

DATA = ("sglang/kernels/jit/include", "sglang/kernels/jit/csrc")  # sglang.kernels.jit's path check wants both to exist


def main(src: Path, dest: Path) -> None:
    site = (src / "site").resolve()
    sys.path[:0] = [str(HERE), str(site), str(src / "deps")]
    os.environ["TRITON_INTERPRET"] = "1"
    warnings.filterwarnings("ignore")
    import refimpl  # noqa: F401  (the interpreter set up before any @triton.jit)
    from refimpl.adapters import sglang_stubs as sgl_stubs

    sgl_stubs.install(sgl_stubs.ROOTS)
    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs

    runtime_context.publish(ServerArgs(model_path="dummy", device="cpu", attention_backend="triton"), role="test")
    for name in MODULES:
        importlib.import_module(name)
    import side_by_side

    for mode in ("decode", "target_verify", "draft_extend_v2", "draft_decode"):
        side_by_side.main(src, mode)
    files = {Path(m.__file__).resolve() for m in list(sys.modules.values()) if getattr(m, "__file__", None)}
    files = sorted(f for f in files if f.is_relative_to(site))
    for f in files:
        out = dest / "site" / f.relative_to(site)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, out)
    for data in DATA:  # directories a loaded module checks for at import (their contents are GPU build sources)
        (dest / "site" / data).mkdir(parents=True, exist_ok=True)
    shutil.copytree(src / "deps", dest / "deps", dirs_exist_ok=True)
    (dest / "wheels").mkdir(exist_ok=True)
    for wheel in (src / "wheels").glob("*.whl"):  # msgspec / dill for the H200's Python (not the SGLang wheel)
        if not wheel.name.startswith("sglang-"):
            shutil.copy2(wheel, dest / "wheels" / wheel.name)
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    print(f"{len(files)} files from {site} -> {dest} ({size / 2**20:.1f} MiB with deps)")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
