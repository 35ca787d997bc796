"""A child process that runs ``python -m refimpl check ...`` command lines one after another, for
``tests/test_sglang_adapter.py`` and ``tests/test_sglang_flashinfer_adapter.py``: SGLang's import (about 5 s on a CPU, its
stand-ins process-wide) happens once per test file instead of once per check. A child, not the test process: the
stand-ins must not reach the other test files.

Reads one JSON request per line on stdin, ``{"argv": [...], "env": {...}}`` (``env``: variables set for that command
only), and answers each with one line, ``REPLY`` then JSON ``{"code", "stdout", "stderr"}``: the command's exit code and
what it printed (an exception's traceback on stderr, exit code 1). Exits when stdin closes."""

import contextlib
import io
import json
import os
import sys
import traceback

from refimpl.__main__ import main

REPLY = "@@sglang-checks "  # a reply line's prefix: anything else on stdout is not a reply

if __name__ == "__main__":
    for line in sys.stdin:
        request = json.loads(line)
        saved = {k: os.environ.get(k) for k in request["env"]}
        os.environ.update(request["env"])
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(request["argv"])
            except SystemExit as e:  # argparse's errors
                code = e.code
            except Exception:  # as the command line would: its traceback, exit 1; the next command still runs
                traceback.print_exc()
                code = 1
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
        print(REPLY + json.dumps({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}), flush=True)
