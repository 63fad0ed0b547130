#!/usr/bin/env bash
# Create .venv and install vramscope with everything the demo and the tests need.
# Idempotent: re-installs only when pyproject.toml changed. On a CPU machine torch is pinned to 2.13.0
# (the CPU build); set VRAMSCOPE_TORCH to choose another torch requirement.
#
# uv installs when it can be had (on PATH, or from the package registry into .venv/.uv, outside the environment's
# site-packages), pip otherwise or when uv fails; VRAMSCOPE_INSTALLER=pip chooses pip. On this 2-core machine uv
# took 25 s (its cache warm, the bytecode compiled on both cores), pip 76 to 148 s (one package at a time).
# Both install the same packages at the same versions: uv is given pip's own settings (its config files and PIP_* variables: indexes,
# find-links, constraints) and, like pip, weighs every index alike and compiles the bytecode at install time
# (where PYTHONDONTWRITEBYTECODE is set, as on this project's machines, nothing compiles it later: each Python
# started would compile torch's modules again).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH=${VRAMSCOPE_TORCH:-torch==2.13.0}
stamp=.venv/.vramscope-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
if [ ! -x .venv/bin/python ]; then
  # Without pip: uv installs it (the version pip would upgrade itself to), the pip path bootstraps it below.
  "$PY" -m venv --without-pip .venv || { echo "setup: cannot create a virtual environment; install python3-venv" >&2; exit 1; }
fi

find_uv() {
  [ "${VRAMSCOPE_INSTALLER:-}" != pip ] || return 1
  if command -v uv >/dev/null 2>&1; then command -v uv; return 0; fi
  if [ ! -x .venv/.uv/bin/uv ]; then
    "$PY" -m pip install -q --no-compile --target .venv/.uv "uv<1" >/dev/null 2>&1 || return 1
  fi
  echo .venv/.uv/bin/uv
}

# pip's settings as uv options, one a line (`pip config list` shows the files' and the PIP_* variables' values).
uv_options_from_pip() {
  local listing line key value v
  listing=$("$PY" -m pip config list 2>/dev/null) || listing=$(
    for key in INDEX_URL EXTRA_INDEX_URL FIND_LINKS CONSTRAINT; do
      v=PIP_$key
      [ -z "${!v:-}" ] || echo ":env:.$(echo "$key" | tr 'A-Z_' 'a-z-')='${!v}'"
    done)
  while IFS= read -r line; do
    key=${line%%=*}
    value=${line#*=}; value=${value#\'}; value=${value%\'}
    case "${key##*.}" in
      index-url|extra-index-url|find-links|constraint)
        for v in $value; do echo "--${key##*.}=$v"; done ;;
    esac
  done <<< "$listing" | awk '!seen[$0]++'
}

install_with_uv() {
  local uv options
  uv=$(find_uv) || return 1
  mapfile -t options < <(uv_options_from_pip)
  "$uv" pip install -q --python .venv/bin/python --index-strategy unsafe-best-match --compile-bytecode \
    "${options[@]}" pip "$TORCH" -e ".[all,dev]"
}

install_with_pip() {
  .venv/bin/python -m pip --version >/dev/null 2>&1 || .venv/bin/python -m ensurepip --upgrade >/dev/null \
    || { echo "setup: the virtual environment has no pip; install python3-venv" >&2; exit 1; }
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "$TORCH"
  .venv/bin/python -m pip install -q -e ".[all,dev]"
}

if ! install_with_uv; then
  [ "${VRAMSCOPE_INSTALLER:-}" = pip ] || echo "setup: uv could not be had or failed; installing with pip" >&2
  install_with_pip
fi
echo "$want" > "$stamp"
