#!/usr/bin/env bash
# The optional verl bridge (verl_bridge/verl_sharpo.py) gets its own virtual environment:
# verl 0.9.1 pins transformers < 5.11, and this project's requirements.txt pins 5.24.
#   bash verl_bridge/install_verl.sh [VENV_DIR]        (default: .venv-verl; ~2 GB, ~3-5 min)
#   VENV_DIR/bin/python -m pytest -q verl_bridge/tests
set -euo pipefail
cd "$(dirname "$0")/.."  # the repository root: VENV_DIR is relative to it
VENV="${1:-.venv-verl}"
echo "install_verl.sh: 1/3 a virtual environment in $VENV"
"${PYTHON:-python3}" -m venv "$VENV"
echo "install_verl.sh: 2/3 torch 2.13.0 (pinned: an unpinned torch pulls a multi-GB CUDA build)"
"$VENV/bin/pip" install --progress-bar on torch==2.13.0
echo "install_verl.sh: 3/3 verl 0.9.1 and what it needs (ray, tensordict, transformers < 5.11, ...)"
"$VENV/bin/pip" install --progress-bar on verl==0.9.1 pytest
echo "install_verl.sh: done"
