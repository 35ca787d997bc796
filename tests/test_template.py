"""The backend template (``examples/paged_decode_backend.py``) works where a reviewer puts it: copied outside the
repository and renamed as its "Start here" docstring says, the command it prints checks it from that folder."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import examples.paged_decode_backend as template
import refimpl

ROOT = Path(__file__).resolve().parent.parent


def test_the_template_copied_outside_the_repository_passes_the_printed_command(tmp_path):
    doc = template.__doc__
    assert doc.startswith("Start here")
    printed = [line.split("#")[0].strip() for line in doc.splitlines() if "--backend-class my_backend" in line]
    (command,) = [line for line in printed if "--fuzz" not in line]
    assert command == "python -m refimpl check --backend-class my_backend:MyBackend"
    source = Path(template.__file__).read_text()
    source = re.sub(r"\bPagedDecodeBackend\b", "MyBackend", source).replace('"paged_decode_example"', '"my_backend"')
    (tmp_path / "my_backend.py").write_text(source)
    assert not tmp_path.resolve().is_relative_to(ROOT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of the repository on the path ...
    probe = subprocess.run([sys.executable, "-c", "import refimpl"], cwd=tmp_path, env=env, capture_output=True)
    if probe.returncode:  # ... unless refimpl is not installed but on PYTHONPATH (the GPU gate): then its folder only
        env["PYTHONPATH"] = str(Path(refimpl.__file__).resolve().parents[1])
    argv = [sys.executable, *shlex.split(command)[1:], "--mode", "decode", "--bs", "1,3"]
    res = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [line.split() for line in res.stdout.splitlines() if line.startswith("my_backend ")]
    assert [(r[4], r[-1]) for r in rows] == [("1", "ok"), ("3", "ok")], res.stdout
    assert "0 unexpected failures" in res.stdout
