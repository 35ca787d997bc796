#!/usr/bin/env bash
# The test command (README): lint and format checks, unit tests, every notebook executed by nbval
# (gpu cells skip on CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
ruff check . && ruff format --check .  # one policy (pyproject.toml): ruff's layout at 130 columns
# one worker per core, each test file (and each notebook: its cells share a kernel) on one worker
python -m pytest -q -p no:cacheprovider --nbval-lax --nbval-current-env --durations=10 -n auto --dist loadfile \
  tests notebooks "$@"
