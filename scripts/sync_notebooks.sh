#!/usr/bin/env bash
# Regenerate every notebooks/*.ipynb from its py:percent twin (the source of truth, edited by
# hand) with jupytext, then execute it in place so the committed outputs are current.
#   usage: bash scripts/sync_notebooks.sh [notebooks/NN_name.py ...]
set -euo pipefail
cd "$(dirname "$0")/.."
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(notebooks/*.py)
export MPLBACKEND=Agg PYTHONHASHSEED=0
for py in "${files[@]}"; do
  nb="${py%.py}.ipynb"
  jupytext --quiet --to ipynb --output "$nb" "$py"
  (cd notebooks && jupyter nbconvert --log-level WARN --to notebook --execute --inplace \
     --ExecutePreprocessor.timeout=600 "$(basename "$nb")")
  echo "synced $nb"
done
