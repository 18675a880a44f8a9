#!/usr/bin/env bash
# Build (or reuse) the torch_xla virtual environment, outside the clone.
#
# torch_xla 2.9 needs exactly torch 2.9.0, while the main environment stays on
# torch 2.13, so the torch_xla tests and benchmark run in their own venv. It
# is keyed by the pins and cached, so later runs (and CI on the same machine)
# reuse it; the project itself is installed editable from the clone that runs
# this script, so the venv always runs the current checkout's code.
#
# Usage: tools/xla-env.sh            build if missing, print the venv's python
#        tools/xla-env.sh --path     print the venv's python path only
# Env:   TPU_INFO_XLA_VENV           override the venv directory
#        PYTHON                      interpreter used to create it (python3)
# The torch 2.9.0 wheel from PyPI pulls its CUDA wheels: about 4 GB.
set -euo pipefail

TORCH_VERSION=2.9.0
TORCH_XLA_VERSION=2.9.0
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/tpu-info"
VENV="${TPU_INFO_XLA_VENV:-$CACHE/xla-venv-torch${TORCH_VERSION}-xla${TORCH_XLA_VERSION}}"
PY="$VENV/bin/python"

if [ "${1:-}" = "--path" ]; then
  echo "$PY"
  exit 0
fi

stamp="$VENV/.tpu-info-ready"
if [ ! -f "$stamp" ]; then
  echo "xla-env: building $VENV (torch==$TORCH_VERSION torch-xla==$TORCH_XLA_VERSION)" >&2
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  "${PYTHON:-python3}" -m venv "$VENV"
  "$PY" -m pip install -q --upgrade pip
  # torch-xla's wheel does not declare its torch pin: pin both here.
  "$PY" -m pip install -q "torch==$TORCH_VERSION" "torch-xla==$TORCH_XLA_VERSION"
  "$PY" -m pip install -q "grpcio>=1.85.1" "protobuf>=7.35.1" "rich>=13.7" "textual>=0.80" \
    "psutil>=5.9" "prometheus-client>=0.20" "shtab>=1.8.1" "pytest>=8" numpy
  touch "$stamp"
fi
# Dependencies added since a venv was built (its stamp is older): each once.
"$PY" -c "import shtab" 2>/dev/null || "$PY" -m pip install -q "shtab>=1.8.1" >&2
# A venv built before the rename holds our editable `tpu-info` (the old
# distribution name): remove it, so only xla-tpu-info maps the packages.
if "$PY" -m pip show tpu-info 2>/dev/null | grep '^Editable project location:' >/dev/null; then
  "$PY" -m pip uninstall -q -y tpu-info >&2
fi
# Always (re)point the editable install at this clone: cheap, no downloads.
"$PY" -m pip install -q --no-deps -e "$ROOT" >&2
echo "$PY"
