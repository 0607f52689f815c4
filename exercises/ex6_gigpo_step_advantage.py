"""Exercise 6: GiGPO's step groups and step advantage (Eq. 11-12 in baselines.py's docstring;
METHOD.md section 6; the project's version: baselines.gigpo_step_advantages).

Check your answer:  python -m exercises.check 6
"""
import torch

from advantage import grpo_advantages  # noqa: F401  (exercise 1: you may use it)


def gigpo_step_advantages(step_rewards: torch.Tensor, traj_ids: torch.Tensor, group_ids: list[int],
                          anchors: list[str], gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The step advantage of every row (one row = one step), and the step group of every row.

    step_rewards (B,): r_t of each step; traj_ids (B,): its trajectory (a trajectory's rows are
    contiguous and in step order); group_ids: its episode group; anchors: the text of the state
    it acted from. Two rows are in the same step group when they share the episode group and
    the anchor. The step advantage compares discounted returns R_t = sum_{k >= t} gamma^(k - t) r_k
    within each step group, as GRPO compares episode rewards within an episode group.
    Returns (step advantages (B,) float32, step-group ids (B,) long: equal ids = same group).
    """
    raise NotImplementedError("exercise 6: write gigpo_step_advantages (baselines.py, Eq. 11-12)")
