"""train.py --rollout vllm: the rollouts decoded by vLLM (policy.py), installed apart (install_vllm.sh)."""
from pathlib import Path

from vllm_rollout.policy import INSTALL, VLLMPolicy, missing  # noqa: F401  (vLLM itself loads at the first rollout)


def vllm_policy(model, tokenizer, args):
    """train.py's actor for --rollout vllm (policy.VLLMPolicy), from the run's flags; its engine starts at the
    first rollout."""
    return VLLMPolicy(model, tokenizer, Path(args.output_dir) / "vllm", args.max_new_tokens, args.temperature,
                      args.lora_r, args.seed, base_name=args.model, gpu_memory=args.vllm_gpu_memory)
