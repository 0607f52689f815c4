"""SHARPO's token advantages for verl users: from a verl `DataProto`, through advantage.py.

Optional: needs `pip install verl==0.9.1` (in its own environment: verl 0.9.1 pins
transformers < 5.11, this repository uses 5.24). Nothing here re-implements the method: the
batch is read into the (B, T) tensors advantage.py takes, and advantage.py does the math.

Two layouts, as verl users have them:
  - "per_step" (verl-agent): one sample per environment step. non_tensor_batch["uid"] is the
    group, non_tensor_batch["traj_uid"] the trajectory; the sample's response is one segment.
    A sample's score is its token_level_rewards summed, as verl-agent writes it: the episode's
    reward, and in verl-agent's forks an invalid action's 0.1 penalty on that step's own sample
    only, so the samples of one trajectory may disagree. Each sample's advantage is
    (its own score - mean) / (std + eps), as verl-agent's episode_norm_reward computes it, with
    the group's mean and unbiased std taken (episode_stats) over
      "step":       every step sample of the group (verl-agent's default, compute_mean_std_cross_steps=True:
                    a 20-step loss weighs 20 times in the statistics, a 5-step win 5 times);
      "trajectory": one sample per trajectory, its first (verl-agent with that flag False; the GiGPO
                    paper's episode-level advantage, and train.py's --episode-stats trajectory).
    Where verl-agent departs, this follows advantage.grpo_advantages: a group of one, or whose
    counted scores all tie, gives 0 (verl-agent: the raw score, and float noise of -0.47 on
    inexact ties such as six samples of 9.9).
  - "per_trajectory" (verl's multi-turn agent loop): one sample per trajectory; each contiguous
    run of response_mask == 1 is one segment (the environment's tokens between them are 0 in
    the mask); R_i = token_level_rewards summed over the sample.
The caller fills batch[teacher_key] with the teacher's log-probs of the response tokens: the
same policy run on the same responses with the hindsight block in the prompt
(`hindsight_messages` builds that prompt from the chat messages). batch[student_key] holds
the student's (verl's old_log_probs). Returns Ahat (B, T_response), 0 outside segments.

Compute only where credit flows (as train.py does): `needs_teacher(data)` marks the samples
whose A_i != 0, the only ones whose teacher log-probs can change Ahat. Run the teacher on those
alone and give every other sample its student log-probs (any finite values give the same Ahat: 0).
sharpo_trainer.py does all of this inside verl's own trainer.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: advantage.py, segments.py

from advantage import check_mixing, grpo_advantages, mix, segment_multipliers  # noqa: E402
from baselines import ALGORITHMS, rlsd_token_advantages  # noqa: E402
from segments import SIBLING_HEADLINE, add_hindsight, format_plan  # noqa: E402

# The algorithms of train.py's table whose Ahat this bridge computes: those whose `verl` is set, Ahat
# from their mixes, shape and per_token alone (not GiGPO's step groups, nor SDAR's loss term).
BRIDGED = tuple(name for name, algorithm in ALGORITHMS.items() if algorithm.verl)


def bridged(algo: str):
    """ALGORITHMS[algo], an algorithm this bridge computes; any other name is a ValueError naming them."""
    if algo not in BRIDGED:
        raise ValueError(f"algo must be one of {', '.join(map(repr, BRIDGED))} (baselines.ALGORITHMS, those the "
                         f"verl bridge computes); got {algo!r}")
    return ALGORITHMS[algo]


def runs_of_ones(response_mask: torch.Tensor) -> torch.Tensor:
    """Segment ids from a response mask: the k-th contiguous run of 1s in a row is segment k
    (0, 1, ...); positions where the mask is 0 are -1. (B, T) -> (B, T) long."""
    mask = response_mask.bool()  # (B, T)
    previous = torch.nn.functional.pad(mask[:, :-1], (1, 0), value=False)  # (B, T) the mask one step left
    starts = mask & ~previous  # (B, T) True where a run of 1s begins
    ids = starts.long().cumsum(dim=1) - 1  # (B, T) run index, counted from 0
    return torch.where(mask, ids, torch.full_like(ids, -1))  # (B, T)


def segment_means(values: torch.Tensor, segment_ids: torch.Tensor, num_segments: int | None = None) -> torch.Tensor:
    """Mean of `values` over each segment's tokens: out[b, s] = mean_{t: seg[b,t]=s} values[b, t].

    values (B, T) float, segment_ids (B, T) long with -1 = no segment. Returns (B, S) with
    S = num_segments or max id + 1; an empty segment gives 0, never NaN. (train.py's rows hold one
    segment each, so advantage.segment_gap takes a mask; a per-trajectory verl sample holds several.)
    """
    B, T = values.shape
    S = max(int(segment_ids.max().item()) + 1 if num_segments is None else num_segments, 1)
    in_segment = segment_ids >= 0  # (B, T) True = token belongs to some segment
    index = segment_ids.clamp(min=0)  # (B, T) -1 parked at 0, then zeroed by the mask below
    vals = torch.where(in_segment, values, torch.zeros_like(values))  # (B, T)
    sums = torch.zeros(B, S, dtype=values.dtype, device=values.device).scatter_add(1, index, vals)  # (B, S)
    counts = torch.zeros(B, S, dtype=values.dtype, device=values.device).scatter_add(
        1, index, in_segment.to(values.dtype))  # (B, S)
    return sums / counts.clamp(min=1)  # (B, S) empty segment: 0 / 1 = 0


def token_advantages(adv: torch.Tensor, logp_teacher: torch.Tensor, logp_student: torch.Tensor,
                     segment_ids: torch.Tensor, lam: float, eps_m: float, algo: str = "sharpo") -> torch.Tensor:
    """Ahat (B, T) of `algo` (BRIDGED) for rows that may hold several segments (segment_ids (B, T), -1
    off them): each segment's gap (METHOD.md Eq. 2-3), its multiplier and the mixing (Eq. 4-5) by
    advantage.py's functions, as the algorithm's attributes say: its `shape` (StepOPSD's sigmoid),
    `per_token` (RLSD, Eq. 8), `mixes` (False, GRPO: Ahat = A)."""
    method = bridged(algo)
    lam = lam if method.mixes else 0.0  # GRPO: Ahat = A
    response_mask = segment_ids >= 0  # (B, T)
    if method.per_token:
        return rlsd_token_advantages(adv, logp_teacher, logp_student, response_mask, lam, eps_m)[0]
    check_mixing(lam, eps_m)
    gaps = segment_means((logp_teacher - logp_student).detach(), segment_ids)  # (B, S) g of each segment
    mults = segment_multipliers(adv[:, None], gaps, eps_m, method.shape)  # (B, S) m of each segment
    return mix(adv, mults.gather(1, segment_ids.clamp(min=0)), response_mask, lam)  # (B, T) each token its segment's


def label_ids(values) -> torch.Tensor:
    """Any hashable labels (numpy object arrays of uid strings) -> (N,) long ids."""
    index: dict = {}
    return torch.tensor([index.setdefault(v, len(index)) for v in np.asarray(values).tolist()])


def sharpo_advantages(data, *, lam: float, eps_m: float, episode_stats: str, layout: str = "per_step",
                      algo: str = "sharpo", teacher_key: str = "teacher_log_probs",
                      student_key: str = "old_log_probs", reward_key: str = "token_level_rewards",
                      mask_key: str = "response_mask") -> torch.Tensor:
    """Ahat (B, T) for a DataProto in `layout` (module docstring); lam, eps_m and algo as in
    token_advantages above, episode_stats as train.py's --episode-stats (verl_bridge/sharpo_trainer.py
    takes them from its settings, whose defaults are train.py's)."""
    adv_row, segment_ids = advantages_and_segments(data, layout, reward_key, mask_key, episode_stats)  # (B,), (B, T)
    batch = data.batch
    return token_advantages(adv_row, batch[teacher_key].float(), batch[student_key].float(), segment_ids,
                            lam=lam, eps_m=eps_m, algo=algo)


def needs_teacher(data, layout: str = "per_step", reward_key: str = "token_level_rewards",
                  mask_key: str = "response_mask", *, episode_stats: str) -> torch.Tensor:
    """(B,) bool: the samples whose A_i != 0, the only ones whose teacher log-probs can change Ahat
    (the rule train.py skips by: advantage.needed_rows)."""
    return advantages_and_segments(data, layout, reward_key, mask_key, episode_stats)[0] != 0


def own_score_advantages(scores: torch.Tensor, groups: torch.Tensor, counted: torch.Tensor,
                         eps: float = 1e-6) -> torch.Tensor:
    """Each sample's (own score - mean) / (std + eps), the group's mean and unbiased std over its `counted`
    samples (METHOD.md Eq. 1 with verl-agent's choice of samples). scores (B,) float64, groups (B,) long,
    counted (B,) bool. A group of one counted sample, or whose counted scores tie exactly, gives 0."""
    out = torch.zeros_like(scores)  # (B,)
    for g in torch.unique(groups):
        mine, stats = groups == g, scores[(groups == g) & counted]  # (B,), (n,)
        if len(stats) > 1 and stats.max() > stats.min():
            out[mine] = (scores[mine] - stats.mean()) / (stats.std() + eps)  # (Eq. 1) with the own score
    return out


def advantages_and_segments(data, layout: str, reward_key: str, mask_key: str,
                            episode_stats: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A_i of each sample (B,) and the segment ids (B, T) of `layout` (module docstring)."""
    batch, extra = data.batch, data.non_tensor_batch
    mask = batch[mask_key]  # (B, T) 1 = a generated token
    rewards = batch[reward_key].sum(dim=-1).double()  # (B,) each sample's reward
    groups = label_ids(extra["uid"])  # (B,)
    if layout == "per_step":
        traj = label_ids(extra["traj_uid"])  # (B,) trajectory of each step sample
        if episode_stats == "step":
            counted = torch.ones_like(traj, dtype=torch.bool)  # (B,) every step sample
        elif episode_stats == "trajectory":
            counted = torch.tensor([b == 0 or traj[b] not in traj[:b] for b in range(len(traj))])  # (B,) the first
        else:
            raise ValueError(f"episode_stats must be 'trajectory' or 'step'; got {episode_stats!r}")
        adv_row = own_score_advantages(rewards, groups, counted).float()  # (B,)
        segment_ids = torch.where(mask.bool(), 0, -1)  # (B, T) one response = one segment
    elif layout == "per_trajectory":
        adv_row = grpo_advantages(rewards, groups).float()  # (B,)
        segment_ids = runs_of_ones(mask)  # (B, T) each run of generated tokens is a segment
    else:
        raise ValueError(f"layout must be 'per_step' or 'per_trajectory'; got {layout!r}")
    return adv_row, segment_ids


def hindsight_messages(messages: list[dict], actions: list[str],
                       headline: str = SIBLING_HEADLINE) -> list[dict]:
    """The teacher's chat messages: the student's, then the hindsight block (a plan, numbered) as
    one more user turn, as train.py's teacher sees it (segments.add_hindsight)."""
    return add_hindsight(messages, format_plan(headline, actions))
