"""Exercise 1: the GRPO group advantage (METHOD.md section 1; the project's version: advantage.grpo_advantages).

Check your answer:  python -m exercises.check 1
"""
import torch


def grpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """A_i = (R_i - mean_{j in group} R_j) / (std_{j in group} R_j + 1e-6), the std unbiased.

    rewards (N,) float: R_i, one per trajectory; group_ids (N,) long: the group of each
    trajectory (any labels: 7 and 3 are as good as 0 and 1). Returns (N,) in rewards' dtype.
    A group whose rewards all tie, and a group of one, give exactly 0 (not 0 / 1e-6 noise, and
    never NaN): there is nothing to compare there.
    """
    raise NotImplementedError("exercise 1: write grpo_advantages (METHOD.md section 1)")
