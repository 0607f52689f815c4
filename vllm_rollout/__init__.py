"""train.py --rollout vllm: the rollouts decoded by vLLM (policy.py), installed apart (install_vllm.sh)."""
import importlib.util
from pathlib import Path

INSTALL = ("--rollout vllm needs vLLM, installed apart: bash vllm_rollout/install_vllm.sh, then run train.py "
           "with .venv-vllm/bin/python")


def missing() -> str | None:
    """None when vLLM can be imported here, else the line that says how to install it."""
    return None if importlib.util.find_spec("vllm") is not None else INSTALL


def vllm_policy(model, tokenizer, args):
    """train.py's actor for --rollout vllm (policy.VLLMPolicy), from the run's flags; its engine starts at the
    first rollout. Imported here, when asked for: vLLM is an optional extra."""
    from vllm_rollout.policy import VLLMPolicy

    return VLLMPolicy(model, tokenizer, Path(args.output_dir) / "vllm", args.max_new_tokens, args.temperature,
                      args.lora_r, args.seed, base_name=args.model, gpu_memory=args.vllm_gpu_memory)
