#!/usr/bin/env bash
# The test command (README): unit tests + every notebook executed by nbval (gpu cells skip on CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pytest -q -p no:cacheprovider --nbval-lax --nbval-current-env --durations=10 \
  tests notebooks "$@"
