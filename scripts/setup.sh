#!/usr/bin/env bash
# Create .venv and install vramscope with everything the demo and the tests need.
# Idempotent: re-installs only when pyproject.toml changed. On a CPU machine torch is pinned to 2.13.0
# (the CPU build); set VRAMSCOPE_TORCH to choose another torch requirement.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv || { echo "setup: cannot create a virtual environment; install python3-venv" >&2; exit 1; }
fi
stamp=.venv/.vramscope-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "${VRAMSCOPE_TORCH:-torch==2.13.0}"
.venv/bin/python -m pip install -q -e ".[all,dev]"
echo "$want" > "$stamp"
