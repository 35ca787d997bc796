"""Write a smaller copy of a flashinfer wheel for a GPU machine without network (the device tool carries 64 MiB).

flashinfer compiles its kernels on first use (JIT) from the CUDA sources inside the wheel. refimpl builds only the
paged decode, prefill and MLA modules and the mask bit-packing kernel: their sources are the top-level files of
``flashinfer/data/csrc`` plus the headers under ``data/include`` (and CUTLASS for the SM90 variants). The copy keeps
every Python file of flashinfer, those sources and headers and the include folders of the bundled CCCL and CUTLASS
(0.7.2 compiles against its own CCCL first: without it nvcc fails on ``cuda::fast_mod_div``), and drops the sources of
the other kernel families (the subfolders of ``data/csrc``: MoE, sampling, GDN, ...) and CCCL's and CUTLASS's Python
packages, examples and tests. 0.7.2: 65 MB -> 31 MB.

    python3 scripts/trim_flashinfer_wheel.py IN.whl OUT_DIR     # writes OUT_DIR/<same file name>
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path

DATA = "flashinfer/data/"
# what flashinfer's JIT puts on the include path (-I / -isystem) from the bundled CCCL and CUTLASS
KEEP = tuple(DATA + d for d in ("cccl/cub/", "cccl/libcudacxx/include/", "cccl/thrust/", "cutlass/include/",
                                "cutlass/tools/util/include/"))  # fmt: skip


def dropped(name: str) -> bool:
    if name.startswith(DATA + "csrc/"):  # the other kernel families' sources live in subfolders
        return "/" in name[len(DATA + "csrc/") :]
    if name.startswith((DATA + "cccl/", DATA + "cutlass/")):  # their Python packages, examples and tests
        return not name.startswith(KEEP)
    return False


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def trim(src: Path, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    dst = out_dir / src.name
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        record = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        lines = []
        for info in zin.infolist():
            if dropped(info.filename) or info.filename == record:
                continue
            data = zin.read(info)
            zout.writestr(info, data)
            lines.append(_record_line(info.filename, data))
        zout.writestr(record, "\n".join([*lines, f"{record},,"]) + "\n")  # the wheel's file list, without the dropped
    return dst


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python3 scripts/trim_flashinfer_wheel.py IN.whl OUT_DIR")
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    dst = trim(src, out)
    print(f"{dst}: {dst.stat().st_size / 1e6:.1f} MB (from {src.stat().st_size / 1e6:.1f} MB)")
