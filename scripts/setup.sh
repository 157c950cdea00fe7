#!/usr/bin/env bash
# Create .venv with everything diag, its demo and its tests need. Idempotent.
# torch 2.13.0 (CPU) goes first: a plain `torch` requirement would otherwise pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[all,dev]"
echo "diag installed in .venv: $(.venv/bin/diag --version)"
