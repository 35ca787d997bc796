#!/usr/bin/env bash
# The test command (README): lint and format checks, unit tests, every notebook executed by nbval
# (gpu cells skip on CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
ruff check . && ruff format --check .  # one policy (pyproject.toml): ruff's layout at 130 columns
# SGLang 0.5.23's wheel for tests/test_sglang_*adapter.py (`python -m refimpl check --sglang triton`); without network the
# test skips (CI sets REFIMPL_REQUIRE_SGLANG=1: then it fails)
bash scripts/fetch_sglang.sh > /dev/null || echo "SGLang 0.5.23 not fetched: tests/test_sglang_*adapter.py will skip"
# one worker per core, each test file (and each notebook: its cells share a kernel) on one worker
python -m pytest -q -p no:cacheprovider --nbval-lax --nbval-current-env --durations=10 -n auto --dist loadfile \
  tests notebooks "$@"
