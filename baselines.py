"""Baselines: RLSD, StepOPSD, SDAR and GiGPO, each plugged into train.py through the algorithm table;
and the placebo control every claim stands beside (--shuffle-rewards: the rewards dealt out by chance).

A reader of the method may skip this file: each baseline subclasses advantage.SHARPO (or its GRPO)
and changes some of its answers (the advantage of stage 3, the credit of stage 5, a loss term of
stage 6), so the loop holds no branch per algorithm. All use the same rows and the same update;
those with a teacher share its pass, those that scale the advantage the `lam` mixing (METHOD.md,
"Baselines").

  rlsd (arXiv 2604.03128): the multiplier per token instead of per segment
    (Eq. 8)   m_i,t = clip(exp(sign(A_i) * delta_t), 1 - eps_m, 1 + eps_m)
    It reads no segment gap, so --gap-tokens action is refused with it.
  stepopsd (arXiv 2605.27140, from its public summary): per segment,
    (Eq. 9)   m = clip(2 * sigmoid(sign(A_i) * g_i,k), 1 - eps_m, 1 + eps_m)
  sdar (arXiv 2605.15155): GRPO's advantage unchanged, plus a gated self-distillation term,
    (Eq. 10)  coef * token_mean(sg(sigmoid(beta * delta'_t)) * (sg(logp_teacher_t) - logp_new_t)),
    the gradient only through logp_new (beta 5, coef 0.01). Its gate reads delta'_t =
    logp_teacher_t - logp_old_t, the teacher against PPO's old log-probs of the step (the student's
    before the update, or logp_new itself on the first step, METHOD.md section 5), as SDAR's
    reference code does. The term covers only the tokens of rows with hindsight, averaged over
    their own count: without hindsight the gate would be a flat 0.5, plain self-imitation.
  gigpo (Group-in-Group Policy Optimization, arXiv 2505.10978): no teacher. Steps of different
    trajectories of one group that act from the same environment state form a step group, and
    their discounted returns are compared:
    (Eq. 11)  R_t        = sum_{k >= t} gamma^(k - t) r_k             (per trajectory; gamma 0.95)
    (Eq. 12)  A_step     = (R_t - mean_{step group} R) / (std_{step group} R + 1e-6)
    (Eq. 13)  Ahat_i,t   = A_i + omega * A_step(i, k(t))              (omega 1; over the segment)
    --gigpo-norm mean (verl-agent's mean_norm, its default) leaves the std out of both halves,
    Eq. 1 and Eq. 12. A step group of one, or one whose returns are all equal, gives A_step = 0;
    with omega = 0 it is GRPO. Choices where the paper leaves one: two steps share a state when
    the observation they acted from is the same text, within one episode group (in ALFWorld two
    states with the same view but different inventories count as one); an invalid answer leaves
    the state unchanged, so the step after it acts from the same state; r_k are the env's step
    rewards (10 at the winning step, -0.1 per invalid answer).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from advantage import (GRPO, SHARPO, Advantages, Credit, bounded, check_mixing, grpo_advantages, mix,
                       needed_rows, row_advantages, segment_gap)
from segments import Row


# ------------------------------------------------------------------ RLSD and StepOPSD
def rlsd_multipliers(adv: torch.Tensor, logp_teacher: torch.Tensor, logp_student: torch.Tensor,
                     eps_m: float) -> torch.Tensor:
    """RLSD's multiplier, one per token: m_t = clip(exp(sign(A_i) * delta_t), 1 - eps_m, 1 + eps_m)
    (Eq. 8). (B, T)."""
    delta = (logp_teacher - logp_student).detach()  # (B, T)                              (Eq. 2)
    return bounded(torch.sign(adv)[:, None] * delta, eps_m)  # (B, T)                   (Eq. 8)


def rlsd_token_advantages(adv: torch.Tensor, logp_teacher: torch.Tensor, logp_student: torch.Tensor,
                          response_mask: torch.Tensor, lam: float,
                          eps_m: float) -> tuple[torch.Tensor, torch.Tensor]:
    """RLSD: Ahat_t = A_i * ((1 - lam) + lam * m_t) with the per-token m_t of Eq. 8.
    Returns (Ahat (B, T), 0 off the segment; m_t (B, T))."""
    check_mixing(lam, eps_m)
    m = rlsd_multipliers(adv, logp_teacher, logp_student, eps_m)  # (B, T)                (Eq. 8)
    return mix(adv, m, response_mask, lam), m  # (B, T), (B, T)                           (Eq. 5)


class RLSD(SHARPO):
    """--algo rlsd: SHARPO with one multiplier a token (Eq. 8)."""

    per_token = True

    def credit(self, adv: Advantages, logp, rows, args) -> Credit:
        gaps = segment_gap(logp.teacher, logp.student, rows.response_mask, rows.gap_mask)  # (B,) logged
        token_adv, m = rlsd_token_advantages(adv.row, logp.teacher, logp.student, rows.response_mask,
                                             args.lam, args.eps_m)  # (B, T), (B, T)       (Eq. 8)
        return Credit(token_adv, gaps, m)


class StepOPSD(SHARPO):
    """--algo stepopsd: SHARPO with 2 * sigmoid in place of exp (Eq. 9)."""

    shape = "sigmoid"


# ------------------------------------------------------------------ --gap-tokens action (StepOPSD's filter)
def action_token_mask(tokenizer, response_ids: list[int]) -> list[bool]:
    """True for the response tokens that overlap the text inside <action>...</action> (the last
    such block, tags in any case; tags included), for StepOPSD's action-only gap. All False when
    there is none."""
    pieces = [tokenizer.decode([t]) for t in response_ids]
    ends, pos = [], 0
    for piece in pieces:
        pos += len(piece)
        ends.append(pos)
    text = "".join(pieces)
    flags = re.IGNORECASE | re.ASCII  # any ASCII case, as the parser reads it
    opens = [m.start() for m in re.finditer("<action>", text, flags)]
    start = opens[-1] if opens else -1
    close = re.compile("</action>", flags).search(text, start) if start >= 0 else None
    if close is None:
        return [False] * len(response_ids)
    stop = close.end()
    return [ends[k] > start and (ends[k - 1] if k else 0) < stop for k in range(len(pieces))]


def action_masks(tokenizer, rows: list[Row], T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask (B, T) bool: True = a token inside <action>...</action> (action_token_mask),
    fallback (B,) bool).

    A response without an <action> block (mostly an invalid answer) has no action tokens: its mask
    falls back to the whole response, and `fallback` marks it (runs log the share,
    `gap_action_fallback`), so such a segment still gets a gap rather than a silent multiplier 1."""
    mask = torch.zeros(len(rows), T, dtype=torch.bool)  # (B, T)
    fallback = torch.zeros(len(rows), dtype=torch.bool)  # (B,)
    for b, r in enumerate(rows):
        n = len(r.response_ids)
        found = torch.tensor(action_token_mask(tokenizer, r.response_ids), dtype=torch.bool)  # (n,)
        fallback[b] = n > 0 and not bool(found.any())
        mask[b, :n] = torch.ones(n, dtype=torch.bool) if fallback[b] else found
    return mask, fallback


# ------------------------------------------------------------------ SDAR
def sdar_loss(logp_new: torch.Tensor, logp_teacher: torch.Tensor, logp_old: torch.Tensor,
              mask: torch.Tensor, num_tokens: int | float, beta: float) -> torch.Tensor:
    """SDAR's gated self-distillation term (Eq. 10): token_mean(sg(sigmoid(beta * delta)) *
    (sg(logp_teacher) - logp_new)), the gradient only through logp_new, delta = logp_teacher -
    logp_old.

    mask (b, T) bool: the trained tokens of rows with hindsight; num_tokens: their count in the
    whole minibatch (without hindsight the gate would be a flat 0.5: plain self-imitation).
    Returns a scalar."""
    gate = torch.sigmoid(beta * (logp_teacher - logp_old).detach())  # (b, T) sg(sigmoid(.))
    term = gate * (logp_teacher.detach() - logp_new)  # (b, T) gradient via logp_new   (Eq. 10)
    return (term * mask.to(logp_new.dtype)).sum() / max(float(num_tokens), 1.0)


class SDAR(GRPO):
    """--algo sdar: GRPO's advantage, plus the gated term of Eq. 10, which reads every row with
    hindsight: every row keeps its student pass and its place in the update (reads_every_row), and
    every row with hindsight its teacher pass, whatever its advantage."""

    reads_every_row = True
    verl = False  # a loss term of its own

    def uses_teacher(self, args) -> bool:
        return True

    def loss_names(self, args) -> tuple[str, ...]:
        return ("sdar_loss",) if args.sdar_coef > 0 else ()

    def loss_terms(self, logp_new, logp_old, part, rows, logp, counts, args) -> dict:
        if not self.loss_names(args):
            return {}
        t = logp_new.shape[1]
        mask = rows.response_mask[part, :t].to(logp_new.device)  # (b, t)
        hind = mask & rows.has_hindsight[part, None].to(mask.device)  # (b, t) rows with hindsight
        teacher = logp.teacher[part, :t].to(logp_new.device)  # (b, t)
        term = sdar_loss(logp_new, teacher, logp_old, hind, counts["hindsight"], args.sdar_beta)
        return {"sdar_loss": (args.sdar_coef, term)}  # (Eq. 10)


# ------------------------------------------------------------------ GiGPO
def discounted_returns(rewards: torch.Tensor, traj_ids: torch.Tensor, gamma: float) -> torch.Tensor:
    """R_t = sum_{k >= t} gamma^(k - t) r_k within each trajectory (Eq. 11).

    rewards (B,) step rewards, traj_ids (B,) the trajectory of each row; rows of one trajectory
    are contiguous and in step order. Returns (B,) in rewards' dtype.
    """
    out = torch.zeros_like(rewards)  # (B,)
    running = 0.0
    for b in range(len(rewards) - 1, -1, -1):  # backwards: R_t = r_t + gamma * R_{t+1}  (Eq. 11)
        if b == len(rewards) - 1 or traj_ids[b] != traj_ids[b + 1]:
            running = 0.0  # the last step of a trajectory
        running = float(rewards[b]) + gamma * running
        out[b] = running
    return out


def anchor_groups(group_ids: list[int], anchors: list[str]) -> torch.Tensor:
    """Step groups: rows of one episode group whose anchor state (the observation they acted
    from) is the same text. Returns (B,) long ids, equal for rows of one step group."""
    index: dict[tuple[int, str], int] = {}
    ids = [index.setdefault((g, a), len(index)) for g, a in zip(group_ids, anchors)]
    return torch.tensor(ids)  # (B,)


def gigpo_step_advantages(step_rewards: torch.Tensor, traj_ids: torch.Tensor, group_ids: list[int],
                          anchors: list[str], gamma: float,
                          norm_by_std: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """GiGPO's step advantage of every row: discounted returns compared within step groups
    (Eq. 11-12). Exercise 6.

    step_rewards (B,), traj_ids (B,) (rows of a trajectory contiguous, in step order), group_ids
    and anchors one per row. Returns (step advantages (B,) float32, step-group ids (B,) long).
    """
    returns = discounted_returns(step_rewards.double(), traj_ids, gamma)  # (B,) R_t      (Eq. 11)
    step_groups = anchor_groups(group_ids, anchors)  # (B,)
    step_adv = grpo_advantages(returns, step_groups, norm_by_std=norm_by_std)  # (B,)     (Eq. 12)
    return step_adv.float(), step_groups


def gigpo_token_advantages(adv: torch.Tensor, step_adv: torch.Tensor, response_mask: torch.Tensor,
                           omega: float) -> torch.Tensor:
    """GiGPO's token advantage A_i + omega * A_step of each row, constant over its segment, 0
    elsewhere (Eq. 13).

    adv (B,) the episode advantage of each row's trajectory; step_adv (B,) each row's step
    advantage; response_mask (B, T). Returns (B, T).
    """
    row_adv = adv + omega * step_adv  # (B,)                                             (Eq. 13)
    zero = torch.zeros((), dtype=adv.dtype)
    return torch.where(response_mask, row_adv[:, None].to(adv.dtype), zero)  # (B, T)


@dataclass
class StepAdvantages(Advantages):
    """GiGPO's stage 3: the episode advantage, and each row's step advantage (Eq. 11-12)."""

    step: torch.Tensor | None = None  # (B,) A_step of each row (Eq. 12)
    step_groups: torch.Tensor | None = None  # (B,) long: the step group of each row


class GiGPO(GRPO):
    """--algo gigpo: Ahat = A_i + omega * A_step from the step groups (Eq. 11-13); no teacher."""

    verl = False  # step groups (verl-agent has its own GiGPO)

    def advantages(self, rewards: torch.Tensor, groups: torch.Tensor, rows, args) -> Advantages:
        std = args.gigpo_norm == "std"  # `mean`: R - mean in both halves
        adv = row_advantages(rewards, groups, rows.traj, args.episode_stats, norm_by_std=std)  # (B,)
        step_rewards = torch.tensor([s.reward for s in rows.steps])  # (B,)
        anchors = [s.anchor for s in rows.steps]  # the state each row acted from
        step, step_groups = gigpo_step_advantages(step_rewards, rows.traj, groups[rows.traj].tolist(),
                                                  anchors, args.gigpo_gamma, norm_by_std=std)
        moves = (adv + args.gigpo_omega * step) != 0  # (B,) Ahat can be != 0
        trained, taught = needed_rows(moves, rows.has_hindsight, args.kl_coef > 0, teacher=False)
        return StepAdvantages(adv, trained, taught, step, step_groups)

    def credit(self, adv: Advantages, logp, rows, args) -> Credit:
        gaps = segment_gap(logp.teacher, logp.student, rows.response_mask, rows.gap_mask)  # (B,) 0
        token_adv = gigpo_token_advantages(adv.row, adv.step, rows.response_mask, args.gigpo_omega)
        return Credit(token_adv, gaps, None)  # (Eq. 13)

    def metrics(self, adv: StepAdvantages, gather) -> dict:
        """How much step-level signal GiGPO found: the share of steps in a step group of size >= 2,
        the mean step-group size, and the spread (std) of the step advantage."""
        _, inverse, counts = torch.unique(adv.step_groups, return_inverse=True, return_counts=True)
        row_sizes = torch.tensor(gather(counts[inverse].tolist()))  # (B_all,) each row's step group's size
        group_sizes = torch.tensor(gather(counts.tolist()), dtype=torch.float)  # (groups_all,)
        step_adv = torch.tensor(gather(adv.step.tolist()))  # (B_all,)
        return {"gigpo/step_group_share": float((row_sizes >= 2).float().mean()),
                "gigpo/step_group_size": float(group_sizes.mean()),
                "gigpo/step_adv_std": float(step_adv.std()) if step_adv.numel() > 1 else 0.0}

    def sample_fields(self, adv: StepAdvantages, b: int) -> dict:
        return {"step_advantage": float(adv.step[b])}


# ------------------------------------------------------------------ the placebo (--shuffle-rewards)
def shuffled_within_groups(rewards: torch.Tensor, group_ids: torch.Tensor,
                           generator: torch.Generator) -> torch.Tensor:
    """The placebo, not a method (--shuffle-rewards): each group's rewards permuted among its
    members; the update's size stays, what it teaches is cut from what was done. (N,) -> (N,)."""
    out = rewards.clone()  # (N,)
    for g in torch.unique(group_ids):
        members = (group_ids == g).nonzero().squeeze(1)  # (n_g,)
        out[members] = rewards[members[torch.randperm(len(members), generator=generator)]]
    return out


# ------------------------------------------------------------------ the table --algo reads
ALGORITHMS = {"sharpo": SHARPO(), "grpo": GRPO(), "rlsd": RLSD(), "stepopsd": StepOPSD(),
              "sdar": SDAR(), "gigpo": GiGPO()}
