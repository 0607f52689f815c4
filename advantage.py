"""Advantage: GRPO group advantage times SHARPO's bounded segment multiplier, and the policy loss.

Equations (METHOD.md; each line that implements one carries its tag):
  (Eq. 1) A_i      = (R_i - mean_{j in group} R_j) / (std_{j in group} R_j + eps_adv)  unbiased
  (Eq. 2) delta_t  = logp_teacher_t - logp_student_t                                  detached
  (Eq. 3) g_i,k    = mean_{t in a_k} delta_t                                          segment gap
  (Eq. 4) m_i,k    = clip(exp(sign(A_i) * g_i,k), 1 - eps_m, 1 + eps_m)                multiplier
  (Eq. 5) Ahat_i,t = A_i * ((1 - lam) + lam * m_i,k(t))                               token adv.
  (Eq. 6) L_pg     = token_mean( max(-Ahat * r, -Ahat * clip(r, 1 - eps, 1 + eps)) ),
                     r = exp(logp_new - logp_old)
  (Eq. 7) L_kl     = token_mean( k3(logp_ref, logp_new) )
Baselines, one argument apart (METHOD.md section 6): GRPO = lam 0; RLSD = the multiplier per token
(Eq. 8); StepOPSD = 2 * sigmoid(.) in place of exp(.) (Eq. 9); SDAR = GRPO's advantage plus a
gated term in the loss (Eq. 10); GiGPO, without a teacher, compares discounted step returns
within step groups (Eq. 11-13).

Shapes: N trajectories; B training rows, one per environment step, so one segment a row (its
response); T response-token positions. `response_mask` (B, T) bool is True on a row's response
tokens (the segment), False on padding. Rows holding several segments (verl's per-trajectory
layout) are verl_bridge/'s concern; it calls these same functions per segment.

Deviations from the paper: the paper's text is not available (abstract only). The forms
above follow METHOD.md, which builds them from RLSD / StepOPSD / SDAR / OPSD. A one-member
group gets A = 0 (verl returns its raw reward); a group whose rewards are all equal gets
exactly 0 (checked with max == min, not left to floating-point rounding).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


# ------------------------------------------------------------------ GRPO (METHOD.md section 1)
def grpo_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6, norm_by_std: bool = True
) -> torch.Tensor:
    """Group-relative advantage A_i of each trajectory (Eq. 1). Exercise 1.

    rewards (N,) float, group_ids (N,) long (any labels). Returns (N,) in rewards' dtype.
    norm_by_std=False gives R_i - mean (Dr. GRPO, GiGPO's `mean` norm). One-member groups and
    groups with all-equal rewards give exactly 0.
    """
    r = rewards.double()  # (N,) float64: the group statistics are exact enough to test by hand
    _, g = torch.unique(group_ids, return_inverse=True)  # (N,) group index 0..num_groups-1
    num_groups = int(g.max().item()) + 1
    zeros = torch.zeros(num_groups, dtype=r.dtype, device=r.device)
    count = zeros.index_add(0, g, torch.ones_like(r))  # (num_groups,)
    mean = zeros.index_add(0, g, r) / count  # (num_groups,)
    centered = r - mean[g]  # (N,) R_i - mean                                          (Eq. 1)
    var = zeros.index_add(0, g, centered**2) / (count - 1).clamp(min=1)  # (num_groups,) unbiased
    adv = centered / (var.sqrt()[g] + eps) if norm_by_std else centered  # (N,)       (Eq. 1)
    hi = zeros.scatter_reduce(0, g, r, "amax", include_self=False)  # (num_groups,)
    lo = zeros.scatter_reduce(0, g, r, "amin", include_self=False)  # (num_groups,)
    has_spread = (count[g] > 1) & (hi[g] > lo[g])  # (N,) False: no baseline or nothing to compare
    return torch.where(has_spread, adv, torch.zeros_like(adv)).to(rewards.dtype)  # (N,)


def shuffled_within_groups(rewards: torch.Tensor, group_ids: torch.Tensor,
                           generator: torch.Generator) -> torch.Tensor:
    """A control, not a method (--shuffle-rewards): each group's rewards permuted among its members.

    Every group keeps its rewards, so its advantages and the update's size stay what they were;
    which episode gets which reward becomes chance, so what the update teaches is cut from what was
    done. rewards (N,), group_ids (N,). Returns (N,)."""
    out = rewards.clone()  # (N,)
    for g in torch.unique(group_ids):
        members = (group_ids == g).nonzero().squeeze(1)  # (n_g,)
        out[members] = rewards[members[torch.randperm(len(members), generator=generator)]]
    return out


# ------------------------------------------------------------------ SHARPO (METHOD.md sections 3-4)
def segment_gap(logp_teacher: torch.Tensor, logp_student: torch.Tensor, response_mask: torch.Tensor,
                gap_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The segment gap g of each row: the mean teacher-student log-prob gap over its response
    (Eq. 2-3). Exercise 2.

    logp_teacher, logp_student (B, T): log-probs of the sampled tokens; response_mask (B, T) bool:
    True on the row's response tokens. gap_mask (B, T) bool, optional: only those tokens enter the
    mean (StepOPSD's action-only filter, --gap-tokens action). A row with no counted token gives 0.
    No gradient reaches the teacher or the student through the gap. Returns (B,).
    """
    counted = response_mask if gap_mask is None else response_mask & gap_mask  # (B, T)
    delta = (logp_teacher - logp_student).detach()  # (B, T) delta_t                    (Eq. 2)
    total = torch.where(counted, delta, torch.zeros_like(delta)).sum(1)  # (B,)
    return total / counted.sum(1).clamp(min=1)  # (B,) g                                 (Eq. 3)


def bounded(z: torch.Tensor, eps_m: float, shape: str = "exp") -> torch.Tensor:
    """clip(f(z), 1 - eps_m, 1 + eps_m), f = exp (SHARPO, RLSD; Eq. 4, 8) or 2 * sigmoid
    (StepOPSD; Eq. 9)."""
    if shape == "exp":
        m = torch.exp(z)
    elif shape == "sigmoid":
        m = 2.0 * torch.sigmoid(z)
    else:
        raise ValueError(f"shape must be 'exp' or 'sigmoid'; got {shape!r}")
    return m.clamp(1.0 - eps_m, 1.0 + eps_m)


def segment_multipliers(adv: torch.Tensor, gaps: torch.Tensor, eps_m: float = 0.2,
                        shape: str = "exp") -> torch.Tensor:
    """m = clip(exp(sign(A) * g), 1 - eps_m, 1 + eps_m) of each segment (Eq. 4; shape="sigmoid":
    Eq. 9). adv and gaps of the same shape ((B,) here; (B, S) in the verl bridge)."""
    return bounded(torch.sign(adv) * gaps, eps_m, shape)  # m                           (Eq. 4)


def check_mixing(lam: float, eps_m: float) -> None:
    """The one check of lam and eps_m (train.py's flags go through it too): 0 <= lam <= 1 and
    0 < eps_m < 1 (section 4), else a ValueError that names the bad one."""
    if not 0.0 <= lam <= 1.0:  # a nan fails too
        raise ValueError(f"lam (--lam) must be in [0, 1] (0 = plain GRPO, 1 = the multiplier "
                         f"alone); got {lam}")
    if not 0.0 < eps_m < 1.0:
        raise ValueError(f"eps_m (--eps-m), the multiplier's bound, must be in (0, 1); got {eps_m}")


def mix(adv: torch.Tensor, token_mult: torch.Tensor, response_mask: torch.Tensor,
        lam: float) -> torch.Tensor:
    """Ahat = A * ((1 - lam) + lam * m) on response tokens, 0 elsewhere (Eq. 5).

    adv (B,), token_mult (B, T): the multiplier each token gets, response_mask (B, T).
    Returns (B, T)."""
    token_adv = adv[:, None] * ((1.0 - lam) + lam * token_mult)  # (B, T) Ahat            (Eq. 5)
    return torch.where(response_mask, token_adv, torch.zeros_like(token_adv))  # (B, T) 0 off it


def token_advantages(adv: torch.Tensor, gaps: torch.Tensor, response_mask: torch.Tensor,
                     lam: float = 0.5, eps_m: float = 0.2,
                     shape: str = "exp") -> tuple[torch.Tensor, torch.Tensor]:
    """SHARPO's credit: each segment's bounded multiplier m_i, and the token advantage
    A_i * ((1 - lam) + lam * m_i) on every token of the row's segment (Eq. 4-5). Exercise 3.

    adv (B,) each row's trajectory advantage A_i; gaps (B,) each row's segment gap g_i;
    response_mask (B, T) bool. eps_m is the multiplier's bound, not PPO's clip; shape
    "sigmoid" is StepOPSD's 2 * sigmoid. Returns (Ahat (B, T), 0 off the segment; m (B,)).
    lam = 0 is GRPO.
    """
    check_mixing(lam, eps_m)
    m = segment_multipliers(adv, gaps, eps_m, shape)  # (B,) one multiplier a segment     (Eq. 4)
    return mix(adv, m[:, None].expand_as(response_mask), response_mask, lam), m  #      (Eq. 5)


def rlsd_multipliers(adv: torch.Tensor, logp_teacher: torch.Tensor, logp_student: torch.Tensor,
                     eps_m: float = 0.2) -> torch.Tensor:
    """RLSD's multiplier, one per token: m_t = clip(exp(sign(A_i) * delta_t), 1 - eps_m, 1 + eps_m)
    (Eq. 8). (B, T)."""
    delta = (logp_teacher - logp_student).detach()  # (B, T)                              (Eq. 2)
    return bounded(torch.sign(adv)[:, None] * delta, eps_m)  # (B, T)                   (Eq. 8)


def rlsd_token_advantages(adv: torch.Tensor, logp_teacher: torch.Tensor, logp_student: torch.Tensor,
                          response_mask: torch.Tensor, lam: float = 0.5,
                          eps_m: float = 0.2) -> tuple[torch.Tensor, torch.Tensor]:
    """RLSD: Ahat_t = A_i * ((1 - lam) + lam * m_t) with the per-token m_t of Eq. 8.
    Returns (Ahat (B, T), 0 off the segment; m_t (B, T))."""
    check_mixing(lam, eps_m)
    m = rlsd_multipliers(adv, logp_teacher, logp_student, eps_m)  # (B, T)                (Eq. 8)
    return mix(adv, m, response_mask, lam), m  # (B, T), (B, T)                           (Eq. 5)


# ------------------------------------------------------------------ GiGPO (METHOD.md section 6)
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
                           omega: float = 1.0) -> torch.Tensor:
    """GiGPO's token advantage A_i + omega * A_step of each row, constant over its segment, 0
    elsewhere (Eq. 13).

    adv (B,) the episode advantage of each row's trajectory; step_adv (B,) each row's step
    advantage; response_mask (B, T). Returns (B, T).
    """
    row_adv = adv + omega * step_adv  # (B,)                                             (Eq. 13)
    zero = torch.zeros((), dtype=adv.dtype)
    return torch.where(response_mask, row_adv[:, None].to(adv.dtype), zero)  # (B, T)


# ------------------------------------------------------------------ the algorithms, one table
@dataclass(frozen=True)
class Algorithm:
    """How one --algo uses the functions above (METHOD.md sections 4 and 6)."""

    granularity: str  # "segment": one multiplier per segment; "token": one per token (RLSD)
    shape: str  # f in m = clip(f(sign(A) * g)): "exp" (SHARPO, RLSD), "sigmoid" (StepOPSD)
    mixes: bool  # Ahat = A * ((1 - lam) + lam * m); False: lam = 0, the advantage is GRPO's
    teacher: bool  # needs the hindsight teacher's log-probs (a teacher pass)
    sdar: bool  # the loss carries SDAR's gated self-distillation term
    step_groups: bool  # GiGPO: Ahat = A_i + omega * A_step, from the step groups; no teacher


ALGORITHMS = {
    "sharpo": Algorithm("segment", "exp", mixes=True, teacher=True, sdar=False, step_groups=False),
    "grpo": Algorithm("segment", "exp", mixes=False, teacher=False, sdar=False, step_groups=False),
    "rlsd": Algorithm("token", "exp", mixes=True, teacher=True, sdar=False, step_groups=False),
    "stepopsd": Algorithm("segment", "sigmoid", mixes=True, teacher=True, sdar=False,
                          step_groups=False),
    "sdar": Algorithm("segment", "exp", mixes=False, teacher=True, sdar=True, step_groups=False),
    "gigpo": Algorithm("segment", "exp", mixes=False, teacher=False, sdar=False, step_groups=True),
}


def moving_rows(algo: str, adv: torch.Tensor, step_adv: torch.Tensor | None = None,
                omega: float = 1.0) -> torch.Tensor:
    """(B,) bool: the rows whose Ahat can differ from 0, known from the rewards alone (section 4).

    Ahat = A_i * ((1 - lam) + lam * m) with m > 0 is exactly 0 when A_i = 0, whatever the teacher
    says; GiGPO's Ahat is A_i + omega * A_step. The policy-gradient term of any other row is 0."""
    if ALGORITHMS[algo].step_groups:
        return (adv + omega * step_adv) != 0
    return adv != 0


def needed_rows(algo: str, moves: torch.Tensor, has_hindsight: torch.Tensor,
                kl: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(trained, taught), (B,) bool each: the rows the student pass and the update must read, and
    the rows the teacher must score (section 4). A row whose Ahat is 0 adds exactly 0 to the
    policy gradient; only a KL term (kl) or SDAR's term reads it. moves (B,): moving_rows."""
    spec = ALGORITHMS[algo]
    trained = moves | (kl or spec.sdar)  # (B,) a KL or SDAR term reads rows whose Ahat is 0 too
    taught = has_hindsight & (trained if spec.sdar else moves) & spec.teacher  # (B,)
    return trained, taught


# ------------------------------------------------------------------ the loss (METHOD.md section 5)
def policy_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, token_adv: torch.Tensor,
                mask: torch.Tensor, num_tokens: int | float, ppo_clip: float = 0.2) -> torch.Tensor:
    """PPO-clip on token advantages, token-mean over the whole minibatch (Eq. 6). Exercise 4.

    logp_new (b, T): the policy being trained (the gradient flows here); logp_old (b, T): the same
    tokens before the update (PPO's "old" log-probs: logp_student, or logp_new itself on an
    iteration's first step, section 5); token_adv (b, T): Ahat; mask (b, T) bool: True = a trained
    token. These b rows are one micro-batch; num_tokens counts the trained tokens of the *whole*
    minibatch, so the micro-batches' losses (and gradients) add up to exactly the minibatch's token
    mean: every generated token weighs the same, whatever the length of its response (verl-agent's
    aggregation). Returns a scalar.
    """
    ratio = torch.exp(logp_new - logp_old.detach())  # (b, T) r_t                       (Eq. 6)
    clipped = ratio.clamp(1.0 - ppo_clip, 1.0 + ppo_clip)  # (b, T)
    pg = torch.maximum(-token_adv * ratio, -token_adv * clipped)  # (b, T) PPO-clip    (Eq. 6)
    return (pg * mask).sum() / max(float(num_tokens), 1.0)  # over the minibatch's token count


def k3(logp_ref: torch.Tensor, logp_new: torch.Tensor) -> torch.Tensor:
    """The low-variance k3 estimate of KL(new || ref) per token, exp(d) - d - 1 >= 0 with
    d = ref - new (Eq. 7)."""
    d = logp_ref.detach() - logp_new  # (b, T)
    return torch.exp(d) - d - 1.0  # (b, T)                                              (Eq. 7)


def kl_loss(logp_ref: torch.Tensor, logp_new: torch.Tensor, mask: torch.Tensor,
            num_tokens: int | float) -> torch.Tensor:
    """The KL term to the reference (adapter off): k3 per token, token-mean over the whole
    minibatch like policy_loss (Eq. 7). All (b, T); mask bool. Returns a scalar."""
    kl = k3(logp_ref, logp_new) * mask.to(logp_new.dtype)  # (b, T)                     (Eq. 7)
    return kl.sum() / max(float(num_tokens), 1.0)


def sdar_loss(logp_new: torch.Tensor, logp_teacher: torch.Tensor, logp_old: torch.Tensor,
              mask: torch.Tensor, num_tokens: int | float, beta: float = 5.0) -> torch.Tensor:
    """SDAR's gated self-distillation term (Eq. 10): token_mean(sg(sigmoid(beta * delta)) *
    (sg(logp_teacher) - logp_new)), the gradient only through logp_new, delta = logp_teacher -
    logp_old.

    mask (b, T) bool: the trained tokens of rows with hindsight; num_tokens: their count in the
    whole minibatch (without hindsight the gate would be a flat 0.5: plain self-imitation).
    Returns a scalar."""
    gate = torch.sigmoid(beta * (logp_teacher - logp_old).detach())  # (b, T) sg(sigmoid(.))
    term = gate * (logp_teacher.detach() - logp_new)  # (b, T) gradient via logp_new   (Eq. 10)
    return (term * mask.to(logp_new.dtype)).sum() / max(float(num_tokens), 1.0)
