#!/usr/bin/env bash
# The optional verl bridge (verl_bridge/) gets its own virtual environment:
# verl 0.9.1 pins transformers < 5.11, and this project's requirements.txt pins 5.24.
#   bash verl_bridge/install_verl.sh [VENV_DIR]        (default: .venv-verl; ~2 GB, ~1 min from a local torch wheel)
#   VENV_DIR/bin/python -m pytest -q verl_bridge/tests
set -euo pipefail
cd "$(dirname "$0")/.."  # the repository root: VENV_DIR is relative to it
VENV="${1:-.venv-verl}"
# The CPU build by name: on a plain index an unlabelled torch==2.13.0 is the multi-GB CUDA build.
# pip takes it from its configured sources (a local wheel, a mirror), else from PyTorch's CPU index.
TORCH="torch==2.13.0+cpu"
TORCH_INDEX="${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
# Of verl's core extra (`verl[verl-core]`), the packages `pip install verl` leaves out although its
# workers and trainer (verl.workers.engine_workers, verl.trainer.ppo.ray_trainer) import them.
CORE="fastapi uvicorn cachetools"
echo "install_verl.sh: 1/3 a virtual environment in $VENV"
"${PYTHON:-python3}" -m venv "$VENV"
echo "install_verl.sh: 2/3 $TORCH"
if ! "$VENV/bin/pip" install --progress-bar on "$TORCH"; then
  echo "install_verl.sh: $TORCH is not in pip's configured sources; trying $TORCH_INDEX"
  "$VENV/bin/pip" install --progress-bar on "$TORCH" --extra-index-url "$TORCH_INDEX"
fi
# tyro: flags/__init__.py's command line, whose defaults (--lam, --eps-m, --episode-stats) the bridge reads.
echo "install_verl.sh: 3/3 verl 0.9.1, its core extra ($CORE), tyro and pytest"
# shellcheck disable=SC2086  # CORE is a list of names
"$VENV/bin/pip" install --progress-bar on verl==0.9.1 $CORE tyro==1.0.17 pytest
echo "install_verl.sh: done"
