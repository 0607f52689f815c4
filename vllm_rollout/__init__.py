"""train.py --rollout vllm: the rollouts decoded by vLLM (policy.py), installed apart (install_vllm.sh)."""
import importlib.util

INSTALL = ("--rollout vllm needs vLLM, installed apart: bash vllm_rollout/install_vllm.sh, then run train.py "
           "with .venv-vllm/bin/python")


def missing() -> str | None:
    """None when vLLM can be imported here, else the line that says how to install it."""
    return None if importlib.util.find_spec("vllm") is not None else INSTALL
