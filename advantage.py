"""Advantage: GRPO group advantage times SHARPO's bounded segment multiplier, and the policy loss.

Equations (METHOD.md; the numbers are its sections):
  (1) A_i    = (R_i - mean_{j in group} R_j) / (std_{j in group} R_j + eps_adv)     std unbiased
  (3) delta_t = logp_teacher_t - logp_student_t                                      detached
      g_{i,k} = mean_{t in a_k} delta_t                                              segment gap
  (4) m_{i,k} = clip(exp(sign(A_i) * g_{i,k}), 1 - eps_m, 1 + eps_m)                 multiplier
      Ahat_{i,t} = A_i * ((1 - lam) + lam * m_{i,k(t)})                              token advantage
  (5) L = token_mean( max(-Ahat * r, -Ahat * clip(r, 1 - eps, 1 + eps)) )  r = exp(logp_new - logp_student)
        + kl_coef * token_mean(k3(logp_ref, logp_new))
        + sdar_coef * token_mean_{hindsight rows}( sg(sigmoid(beta * delta)) * (sg(logp_teacher) - logp_new) )
Baselines, one argument apart: GRPO = lam 0; RLSD = the multiplier per token
(granularity="token"); StepOPSD = 2 * sigmoid(.) in place of exp(.) (shape="sigmoid");
SDAR = GRPO advantage plus the gated term of policy_loss. GiGPO, without a teacher:
      R_t = sum_{k >= t} gamma^(k - t) r_k                   discounted return of step t
      A_step = GRPO's formula over each step group (same episode group, same anchor state)
      Ahat_{i,t} = A_i + omega * A_step(i, k(t))

Shapes: N trajectories, B training rows (one per step; row b carries its trajectory's A),
T response-token positions, S segments per row.

Deviations from the paper: the paper's text is not available (abstract only). The forms
above follow METHOD.md, which builds them from RLSD / StepOPSD / SDAR / OPSD. A one-member
group gets A = 0 (verl returns its raw reward); a group whose rewards are all equal gets
exactly 0 (checked with max == min, not left to floating-point rounding).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from segments import segment_means


# ----------------------------------------------------------------------------- (1) GRPO
def grpo_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6, norm_by_std: bool = True
) -> torch.Tensor:
    """Group-relative advantage A_i of each trajectory (METHOD.md section 1).

    rewards (N,) float, group_ids (N,) long (any labels). Returns (N,) in rewards' dtype.
    norm_by_std=False gives R_i - mean (Dr. GRPO style). One-member groups and groups with
    all-equal rewards give exactly 0.
    """
    r = rewards.double()  # (N,) float64: the group statistics are exact enough to test by hand
    _, g = torch.unique(group_ids, return_inverse=True)  # (N,) group index 0..num_groups-1
    num_groups = int(g.max().item()) + 1
    zeros = torch.zeros(num_groups, dtype=r.dtype, device=r.device)
    count = zeros.index_add(0, g, torch.ones_like(r))  # (num_groups,)
    mean = zeros.index_add(0, g, r) / count  # (num_groups,)
    centered = r - mean[g]  # (N,) R_i - mean
    var = zeros.index_add(0, g, centered**2) / (count - 1).clamp(min=1)  # (num_groups,) unbiased
    std = var.sqrt()  # (num_groups,)
    adv = centered / (std[g] + eps) if norm_by_std else centered  # (N,)
    hi = zeros.scatter_reduce(0, g, r, "amax", include_self=False)  # (num_groups,)
    lo = zeros.scatter_reduce(0, g, r, "amin", include_self=False)  # (num_groups,)
    has_spread = (count[g] > 1) & (hi[g] > lo[g])  # (N,) False: no baseline or nothing to compare
    return torch.where(has_spread, adv, torch.zeros_like(adv)).to(rewards.dtype)  # (N,)


def shuffled_within_groups(rewards: torch.Tensor, group_ids: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A control, not a method (--shuffle-rewards): each group's rewards permuted among its members.

    Every group keeps its rewards, so its advantages and the update's size stay what they were; which
    episode gets which reward becomes chance, so what the update teaches is cut from what was done.
    rewards (N,), group_ids (N,). Returns (N,)."""
    out = rewards.clone()  # (N,)
    for g in torch.unique(group_ids):
        members = (group_ids == g).nonzero().squeeze(1)  # (n_g,)
        out[members] = rewards[members[torch.randperm(len(members), generator=generator)]]
    return out


# ----------------------------------------------------------------------------- (3)-(4) SHARPO
def _check_mixing(lam: float, mult_eps: float) -> None:
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam must be in [0, 1] (0 = plain GRPO, 1 = multiplier only); got {lam}")
    if not 0.0 < mult_eps < 1.0:
        raise ValueError(f"mult_eps (the multiplier bound eps_m, --mult-eps) must be in (0, 1); got {mult_eps}")


def _bounded_multiplier(z: torch.Tensor, mult_eps: float, shape: str) -> torch.Tensor:
    """m = clip(f(z), 1 - eps_m, 1 + eps_m) with f = exp (SHARPO, RLSD) or 2*sigmoid (StepOPSD)."""
    if shape == "exp":
        m = torch.exp(z)
    elif shape == "sigmoid":
        m = 2.0 * torch.sigmoid(z)
    else:
        raise ValueError(f"shape must be 'exp' or 'sigmoid'; got {shape!r}")
    return m.clamp(1.0 - mult_eps, 1.0 + mult_eps)


def segment_multipliers(
    adv: torch.Tensor,
    logp_teacher: torch.Tensor,
    logp_student: torch.Tensor,
    segment_ids: torch.Tensor,
    mult_eps: float = 0.2,
    shape: str = "exp",
    gap_mask: torch.Tensor | None = None,
    num_segments: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-segment gap g_{i,k} and bounded multiplier m_{i,k} (METHOD.md sections 3-4).

    adv (B,), logp_teacher / logp_student / segment_ids (B, T). gap_mask (B, T) bool, optional:
    True = the token counts towards the gap (e.g. only tokens inside <action>...</action>);
    default: every segment token. Returns gaps (B, S) and multipliers (B, S).
    """
    S = int(segment_ids.max().item()) + 1 if num_segments is None else num_segments
    delta = (logp_teacher - logp_student).detach()  # (B, T) delta_t, the teacher is never differentiated
    gap_ids = segment_ids if gap_mask is None else torch.where(gap_mask, segment_ids, -1)  # (B, T)
    gaps = segment_means(delta, gap_ids, num_segments=S)  # (B, S) g_{i,k}
    z = torch.sign(adv)[:, None] * gaps  # (B, S) sign(A_i) * g_{i,k}
    return gaps, _bounded_multiplier(z, mult_eps, shape)  # (B, S), (B, S) m_{i,k}


def spread(per_segment: torch.Tensor, segment_ids: torch.Tensor) -> torch.Tensor:
    """Each token gets its segment's value: per_segment (B, S), segment_ids (B, T) -> (B, T)
    (tokens outside segments get segment 0's value; callers mask them)."""
    return per_segment.gather(1, segment_ids.clamp(min=0))  # (B, T)


def token_multipliers(
    adv: torch.Tensor,
    logp_teacher: torch.Tensor,
    logp_student: torch.Tensor,
    segment_ids: torch.Tensor,
    mult_eps: float = 0.2,
    granularity: str = "segment",
    shape: str = "exp",
    gap_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The multiplier each token's advantage is scaled by (before the lam mixing): (B, T).

    granularity="segment" (SHARPO, StepOPSD): m_{i,k(t)}, shared by every token of a segment;
    "token" (RLSD): m_{i,t} = clip(f(sign(A_i) * delta_t)). 1 outside segments.
    """
    in_segment = segment_ids >= 0  # (B, T) True = a token the policy generated and is trained on
    if granularity == "segment":
        _, mult = segment_multipliers(adv, logp_teacher, logp_student, segment_ids, mult_eps, shape, gap_mask)
        token_mult = spread(mult, segment_ids)  # (B, T) m_{i,k(t)}: each token gets its segment's
    elif granularity == "token":
        delta = (logp_teacher - logp_student).detach()  # (B, T)
        token_mult = _bounded_multiplier(torch.sign(adv)[:, None] * delta, mult_eps, shape)  # (B, T) m_{i,t}
    else:
        raise ValueError(f"granularity must be 'segment' or 'token'; got {granularity!r}")
    return torch.where(in_segment, token_mult, torch.ones_like(token_mult))  # (B, T)


def sharpo_token_advantages(
    adv: torch.Tensor,
    logp_teacher: torch.Tensor,
    logp_student: torch.Tensor,
    segment_ids: torch.Tensor,
    lam: float = 0.5,
    mult_eps: float = 0.2,
    granularity: str = "segment",
    shape: str = "exp",
    gap_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Token advantage Ahat_{i,t} = A_i * ((1 - lam) + lam * m) (METHOD.md section 4).

    adv (B,) each row's trajectory advantage A_i; logp_teacher, logp_student, segment_ids
    (B, T) over response tokens (segment id -1 = not a trained token). mult_eps is the
    multiplier bound eps_m, not PPO's clip. granularity="segment" (SHARPO, StepOPSD) shares
    m over a segment; "token" (RLSD) uses m_t = clip(exp(sign(A) * delta_t)). shape="sigmoid"
    gives StepOPSD's 2 * sigmoid form. Returns (B, T), 0 outside segments.
    """
    _check_mixing(lam, mult_eps)
    token_mult = token_multipliers(adv, logp_teacher, logp_student, segment_ids, mult_eps, granularity, shape, gap_mask)
    return mix(adv, token_mult, segment_ids, lam)  # (B, T)


def mix(adv: torch.Tensor, token_mult: torch.Tensor, segment_ids: torch.Tensor, lam: float) -> torch.Tensor:
    """Ahat = A_i * ((1 - lam) + lam * m) on segment tokens, 0 elsewhere: adv (B,), token_mult (B, T)."""
    in_segment = segment_ids >= 0  # (B, T) True = a token the policy generated and is trained on
    token_adv = adv[:, None] * ((1.0 - lam) + lam * token_mult)  # (B, T) Ahat
    return torch.where(in_segment, token_adv, torch.zeros_like(token_adv))  # (B, T) 0 outside segments


# ----------------------------------------------------------------------------- GiGPO (METHOD.md section 6)
def discounted_returns(rewards: torch.Tensor, traj_ids: torch.Tensor, gamma: float) -> torch.Tensor:
    """R_t = sum_{k >= t} gamma^(k - t) r_k within each trajectory.

    rewards (B,) step rewards, traj_ids (B,) the trajectory of each row; rows of one trajectory
    are contiguous and in step order. Returns (B,) in rewards' dtype.
    """
    out = torch.zeros_like(rewards)  # (B,)
    running = 0.0
    for b in range(len(rewards) - 1, -1, -1):  # backwards: R_t = r_t + gamma * R_{t+1}
        if b == len(rewards) - 1 or traj_ids[b] != traj_ids[b + 1]:
            running = 0.0  # the last step of a trajectory
        running = float(rewards[b]) + gamma * running
        out[b] = running
    return out


def anchor_groups(group_ids: list[int], anchors: list[str]) -> torch.Tensor:
    """Step groups: rows of one episode group whose anchor state (the observation they acted
    from) is the same text. Returns (B,) long ids, equal for rows of one step group."""
    index: dict[tuple[int, str], int] = {}
    return torch.tensor([index.setdefault((g, a), len(index)) for g, a in zip(group_ids, anchors)])  # (B,)


def gigpo_step_advantages(step_rewards: torch.Tensor, traj_ids: torch.Tensor, group_ids: list[int], anchors: list[str],
                          gamma: float, norm_by_std: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """GiGPO's step advantage of every row: discounted returns compared within step groups.

    step_rewards (B,), traj_ids (B,) (rows of a trajectory contiguous, in step order), group_ids
    and anchors one per row. Returns (step advantages (B,) float32, step-group ids (B,) long).
    """
    returns = discounted_returns(step_rewards.double(), traj_ids, gamma)  # (B,) R_t
    step_groups = anchor_groups(group_ids, anchors)  # (B,)
    return grpo_advantages(returns, step_groups, norm_by_std=norm_by_std).float(), step_groups  # (B,), (B,)


def gigpo_token_advantages(
    adv: torch.Tensor, step_adv: torch.Tensor, segment_ids: torch.Tensor, omega: float = 1.0
) -> torch.Tensor:
    """GiGPO's token advantage A_i + omega * A_step(i, k), constant over segment k, 0 outside.

    adv (B,) the episode advantage of each row's trajectory; step_adv (B,) the step-group
    advantage of each row (its segment); segment_ids (B, T). Returns (B, T).
    """
    row_adv = adv + omega * step_adv  # (B,)
    in_segment = segment_ids >= 0  # (B, T)
    return torch.where(in_segment, row_adv[:, None].expand_as(segment_ids).to(adv.dtype), torch.zeros((), dtype=adv.dtype))


# ----------------------------------------------------------------------------- the algorithms, one table
@dataclass(frozen=True)
class Algorithm:
    """How one --algo uses the functions above (METHOD.md sections 4-6 and "Baselines")."""

    granularity: str  # "segment": one multiplier per segment; "token": one per token (RLSD)
    shape: str  # f in m = clip(f(sign(A) * g)): "exp" (SHARPO, RLSD) or "sigmoid" (StepOPSD: 2 * sigmoid)
    mixes: bool  # Ahat = A * ((1 - lam) + lam * m); False: lam = 0, the advantage is GRPO's
    teacher: bool  # needs the hindsight teacher's log-probs (a teacher pass)
    sdar: bool  # the loss carries SDAR's gated self-distillation term
    step_groups: bool  # GiGPO: Ahat = A_i + omega * A_step, from the step groups; no teacher


ALGORITHMS = {
    "sharpo": Algorithm("segment", "exp", mixes=True, teacher=True, sdar=False, step_groups=False),
    "grpo": Algorithm("segment", "exp", mixes=False, teacher=False, sdar=False, step_groups=False),
    "rlsd": Algorithm("token", "exp", mixes=True, teacher=True, sdar=False, step_groups=False),
    "stepopsd": Algorithm("segment", "sigmoid", mixes=True, teacher=True, sdar=False, step_groups=False),
    "sdar": Algorithm("segment", "exp", mixes=False, teacher=True, sdar=True, step_groups=False),
    "gigpo": Algorithm("segment", "exp", mixes=False, teacher=False, sdar=False, step_groups=True),
}


def moving_rows(algo: str, adv: torch.Tensor, step_adv: torch.Tensor | None = None, omega: float = 1.0) -> torch.Tensor:
    """(B,) bool: the rows whose Ahat can differ from 0, known from the rewards alone (section 4).

    Ahat = A_i * ((1 - lam) + lam * m) with m > 0 is exactly 0 when A_i = 0, whatever the teacher
    says; GiGPO's Ahat is A_i + omega * A_step. The policy-gradient term of any other row is 0."""
    if ALGORITHMS[algo].step_groups:
        return (adv + omega * step_adv) != 0
    return adv != 0


@dataclass
class Credit:
    """What credit_assignment gives, for B rows of one segment each."""

    token_adv: torch.Tensor  # (B, T) Ahat, 0 outside segments
    gaps: torch.Tensor  # (B,) the segment gap g of each row
    mults: torch.Tensor  # (B,) the segment multiplier m of each row (the one --algo's shape gives)
    token_mults: torch.Tensor  # (B, T) the multiplier each token's advantage gets (RLSD: its own; 1 off segments)


def credit_assignment(algo: str, adv: torch.Tensor, logp_teacher: torch.Tensor, logp_student: torch.Tensor,
                      segment_ids: torch.Tensor, lam: float = 0.5, mult_eps: float = 0.2,
                      gap_mask: torch.Tensor | None = None, step_adv: torch.Tensor | None = None,
                      omega: float = 1.0) -> Credit:
    """The token advantage of --algo, with each segment's gap and multiplier, computed once.

    adv (B,) A_i of each row's trajectory; logp_teacher, logp_student, segment_ids (B, T), one
    segment a row (ids 0 or -1); gap_mask (B, T) optional; step_adv (B,) GiGPO's A_step.
    (4) for the teacher algorithms, lam = 0 for grpo and sdar (GRPO's advantage), section 6 for gigpo.
    """
    spec = ALGORITHMS[algo]
    lam = lam if spec.mixes else 0.0
    _check_mixing(lam, mult_eps)
    gaps, mults = segment_multipliers(adv, logp_teacher, logp_student, segment_ids, mult_eps, spec.shape,
                                      gap_mask, num_segments=1)  # (B, 1), (B, 1)
    in_segment = segment_ids >= 0  # (B, T)
    if spec.granularity == "token":
        token_mults = token_multipliers(adv, logp_teacher, logp_student, segment_ids, mult_eps, "token", spec.shape)
    else:
        token_mults = torch.where(in_segment, spread(mults, segment_ids), torch.ones_like(logp_student))  # (B, T)
    if spec.step_groups:
        token_adv = gigpo_token_advantages(adv, step_adv, segment_ids, omega)  # (B, T)
    else:
        token_adv = mix(adv, token_mults, segment_ids, lam)  # (B, T)
    return Credit(token_adv, gaps[:, 0], mults[:, 0], token_mults)


# ----------------------------------------------------------------------------- (5) loss
def policy_loss(
    logp_new: torch.Tensor,
    logp_student: torch.Tensor,
    token_adv: torch.Tensor,
    loss_mask: torch.Tensor,
    num_tokens: int | float | None = None,
    ppo_clip: float = 0.2,
    logp_ref: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    logp_teacher: torch.Tensor | None = None,
    sdar_mask: torch.Tensor | None = None,
    num_sdar_tokens: int | float | None = None,
    sdar_coef: float = 0.0,
    sdar_beta: float = 5.0,
    num_kl_tokens: int | float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clip with token advantages, optional k3 KL and SDAR term (METHOD.md section 5).

    All tensors (B, T) over response tokens. logp_student: the policy's own log-probs of the
    sampled tokens before this update (PPO's "old" log-probs; the same tensor the gap uses).
    loss_mask (B, T) bool: True = a trained token.
    Aggregation is token-mean over the whole minibatch: each term is a sum over this
    micro-batch's trained tokens divided by `num_tokens`, the count of trained tokens in the
    whole minibatch. Passing that count makes gradient accumulation over micro-batches give
    exactly the minibatch's token mean (default: this call's own count). Token-mean weighs
    every generated token equally, whatever the length of its response (as verl-agent does).
    The SDAR term covers sdar_mask (trained tokens of rows that have hindsight) and is divided
    by their own minibatch count, num_sdar_tokens. The statistic approx_kl_old is the mean of
    the k3 estimate of KL(old, new) over the trained tokens: its sum over loss_mask divided by
    num_kl_tokens, the count of trained tokens in the whole minibatch (default: this call's own
    count; num_tokens may count more, e.g. tokens of rows left out of the loss). Returns (loss,
    detached stats).
    """
    mask = loss_mask.to(logp_new.dtype)  # (B, T) 1.0 = trained token
    n = mask.sum() if num_tokens is None else num_tokens  # the denominator: trained tokens in the minibatch
    n = max(float(n), 1.0)
    n_kl = max(float(mask.sum() if num_kl_tokens is None else num_kl_tokens), 1.0)  # approx_kl_old's denominator

    log_ratio = logp_new - logp_student.detach()  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T) r_t
    clipped = ratio.clamp(1.0 - ppo_clip, 1.0 + ppo_clip)  # (B, T)
    pg = torch.maximum(-token_adv * ratio, -token_adv * clipped)  # (B, T) PPO-clip, per token
    pg_loss = (pg * mask).sum() / n  # token-mean
    loss = pg_loss

    stats = {
        "pg_loss": pg_loss.detach(),
        "clip_frac": ((pg > -token_adv * ratio).to(mask.dtype) * mask).sum().detach() / n,
        "approx_kl_old": ((ratio - 1 - log_ratio) * mask).sum().detach() / n_kl,  # k3(old, new), mean over trained tokens
    }
    if kl_coef > 0:
        if logp_ref is None:
            raise ValueError("policy_loss: kl_coef > 0 needs logp_ref (the reference model's log-probs)")
        d = logp_ref.detach() - logp_new  # (B, T)
        kl = torch.exp(d) - d - 1.0  # (B, T) k3 estimator of KL(new || ref), >= 0
        kl_loss = (kl * mask).sum() / n
        loss = loss + kl_coef * kl_loss
        stats["kl_ref"] = kl_loss.detach()
    if sdar_coef > 0:
        if logp_teacher is None or sdar_mask is None:
            raise ValueError("policy_loss: sdar_coef > 0 needs logp_teacher and sdar_mask")
        smask = (sdar_mask & loss_mask).to(logp_new.dtype)  # (B, T) trained tokens of hindsight rows
        ns = max(float(smask.sum() if num_sdar_tokens is None else num_sdar_tokens), 1.0)
        delta = (logp_teacher - logp_student).detach()  # (B, T) teacher - student, detached
        gate = torch.sigmoid(sdar_beta * delta)  # (B, T) sg(sigmoid(beta * delta))
        sdar = gate * (logp_teacher.detach() - logp_new)  # (B, T) gradient only through logp_new
        sdar_loss = (sdar * smask).sum() / ns
        loss = loss + sdar_coef * sdar_loss
        stats["sdar_loss"] = sdar_loss.detach()
    stats["loss"] = loss.detach()
    return loss, stats
