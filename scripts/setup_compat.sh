#!/usr/bin/env bash
# The second test leg: the versions current users run (Python 3.12, the newest torch this machine's
# pip allows, the newest DeepSpeed, megatron-core 0.19.x), in .venv-compat. The agent hooks framework
# internals (ProcessGroup methods, ZeRO optimizers, loss scalers, megatron parallel state) that move
# between releases, so the real-job tests run here too. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
    # pyenv's shims exist on PATH even where 3.12 is not the selected version: try each candidate.
    local root
    root=$( (command -v pyenv >/dev/null && pyenv root) || echo "$HOME/.pyenv")
    for p in ${PYTHON_COMPAT:-} "$root"/versions/3.12*/bin/python3.12 "$(command -v python3.12 || true)"; do
        if [ -n "$p" ] && "$p" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
            echo "$p"
            return
        fi
    done
    echo "no Python 3.12 found (set PYTHON_COMPAT, or install one with pyenv)" >&2
    exit 1
}

PY=$(find_python)
[ -x .venv-compat/bin/python ] || "$PY" -m venv .venv-compat
. .venv-compat/bin/activate
python -m pip install -q --upgrade pip
# A plain requirement: the newest release pip may take here (a standard wheel; it runs on CPU).
python -m pip install -q torch
python -m pip install -q --upgrade deepspeed
python -m pip install -q -e ".[all,dev]"
python - <<'PY'
import deepspeed, megatron.core, sys, torch
print(f"compat leg: Python {sys.version.split()[0]}, torch {torch.__version__}, "
      f"deepspeed {deepspeed.__version__}, megatron-core {megatron.core.__version__}")
PY
