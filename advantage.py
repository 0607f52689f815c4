"""Advantage: GRPO group advantage times SHARPO's bounded segment multiplier, and the policy loss.

Each line that implements an equation of METHOD.md carries its tag, `(Eq. N)`. GRPO is lam = 0.

Shapes: N trajectories; B training rows, one per step, one segment each; T response positions.
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
    norm_by_std=False gives R_i - mean (GiGPO's `mean` norm). One-member and all-equal groups: 0.
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


def row_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, traj: torch.Tensor,
                   episode_stats: str, norm_by_std: bool = True) -> torch.Tensor:
    """A_i of each training row, (B,) (Eq. 1). rewards, group_ids (N,); traj (B,) each row's
    trajectory. The group's statistics over its trajectories, or ("step") over its step rows."""
    if episode_stats == "trajectory":
        return grpo_advantages(rewards, group_ids, norm_by_std=norm_by_std)[traj]  # (B,)
    return grpo_advantages(rewards[traj], group_ids[traj], norm_by_std=norm_by_std)  # (B,)


# ------------------------------------------------------------------ SHARPO (METHOD.md sections 3-4)
def segment_gap(logp_teacher: torch.Tensor, logp_student: torch.Tensor, response_mask: torch.Tensor,
                gap_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The segment gap g of each row: the mean teacher-student log-prob gap over its response
    (Eq. 2-3). Exercise 2.

    logp_teacher, logp_student (B, T); response_mask (B, T) bool; gap_mask (B, T) bool, optional:
    only those tokens count (--gap-tokens action). No gradient flows through the gap. (B,).
    """
    counted = response_mask if gap_mask is None else response_mask & gap_mask  # (B, T)
    delta = (logp_teacher - logp_student).detach()  # (B, T) delta_t                    (Eq. 2)
    total = torch.where(counted, delta, torch.zeros_like(delta)).sum(1)  # (B,)
    return total / counted.sum(1).clamp(min=1)  # (B,) g                                 (Eq. 3)


def bounded(z: torch.Tensor, eps_m: float, shape: str = "exp") -> torch.Tensor:
    """clip(f(z), 1 - eps_m, 1 + eps_m), f = exp (Eq. 4) or 2 * sigmoid (StepOPSD, baselines.py)."""
    if shape not in ("exp", "sigmoid"):
        raise ValueError(f"shape must be 'exp' or 'sigmoid'; got {shape!r}")
    m = torch.exp(z) if shape == "exp" else 2.0 * torch.sigmoid(z)
    return m.clamp(1.0 - eps_m, 1.0 + eps_m)


def segment_multipliers(adv: torch.Tensor, gaps: torch.Tensor, eps_m: float,
                        shape: str = "exp") -> torch.Tensor:
    """m = clip(f(sign(A) * g), 1 - eps_m, 1 + eps_m) of each segment: f = exp (Eq. 4), or
    StepOPSD's 2 * sigmoid with shape "sigmoid" (Eq. 9). adv and gaps of the same shape ((B,) here;
    (B, S) in the verl bridge)."""
    return bounded(torch.sign(adv) * gaps, eps_m, shape)  # m                           (Eq. 4)


def check_mixing(lam: float, eps_m: float) -> None:
    """0 <= lam <= 1 and 0 < eps_m < 1 (section 4), else a ValueError naming the bad one."""
    if not 0.0 <= lam <= 1.0:  # a nan fails too
        raise ValueError(f"lam (--lam) must be in [0, 1] (0 = plain GRPO, 1 = the multiplier "
                         f"alone); got {lam}")
    if not 0.0 < eps_m < 1.0:
        raise ValueError(f"eps_m (--eps-m), the multiplier's bound, must be in (0, 1); got {eps_m}")


def mix(adv: torch.Tensor, token_mult: torch.Tensor, response_mask: torch.Tensor,
        lam: float) -> torch.Tensor:
    """Ahat = A * ((1 - lam) + lam * m) on response tokens, 0 elsewhere (Eq. 5).
    adv (B,), token_mult (B, T): the multiplier each token gets, response_mask (B, T)."""
    token_adv = adv[:, None] * ((1.0 - lam) + lam * token_mult)  # (B, T) Ahat            (Eq. 5)
    return torch.where(response_mask, token_adv, torch.zeros_like(token_adv))  # (B, T)


def token_advantages(adv: torch.Tensor, gaps: torch.Tensor, response_mask: torch.Tensor,
                     lam: float, eps_m: float,
                     shape: str = "exp") -> tuple[torch.Tensor, torch.Tensor]:
    """SHARPO's credit: each segment's bounded multiplier m_i, and the token advantage
    A_i * ((1 - lam) + lam * m_i) on every token of the row's segment (Eq. 4-5). Exercise 3.

    adv (B,) A_i; gaps (B,) g_i; response_mask (B, T) bool; eps_m: the multiplier's bound, not
    PPO's clip. Returns (Ahat (B, T), 0 off the segment; m (B,)).
    """
    check_mixing(lam, eps_m)
    m = segment_multipliers(adv, gaps, eps_m, shape)  # (B,) one multiplier a segment     (Eq. 4)
    return mix(adv, m[:, None].expand_as(response_mask), response_mask, lam), m  #      (Eq. 5)


# ------------------------------------------------------------------ the rows each pass reads
def needed_rows(moves: torch.Tensor, has_hindsight: torch.Tensor, kl: bool, teacher: bool = True,
                reads_every_row: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(trained, taught), (B,) bool each: the rows the student pass and the update read, and the
    rows the teacher scores, by section 4's rule. moves (B,): the rows whose Ahat can be != 0."""
    trained = moves | (kl or reads_every_row)  # (B,)
    taught = has_hindsight & (trained if reads_every_row else moves) & teacher  # (B,)
    return trained, taught


@dataclass
class Advantages:
    """Stage 3: the direction of each row, from the rewards alone, and the rows stages 4-6 read
    (needed_rows, section 4)."""

    row: torch.Tensor  # (B,) A_i of each row's trajectory (Eq. 1)
    trained: torch.Tensor  # (B,) bool: the rows the student pass and the update read
    taught: torch.Tensor  # (B,) bool: the rows the teacher pass scores


@dataclass
class Credit:
    """Stage 5: the size of each row's update, from the teacher's gap."""

    token_adv: torch.Tensor  # (B, T) Ahat, 0 off the segment (Eq. 5)
    gaps: torch.Tensor  # (B,) the segment gap g of each row (Eq. 3)
    mults: torch.Tensor | None  # (B,) the multiplier Ahat applied (Eq. 4); RLSD: (B, T); GRPO: None


# ------------------------------------------------------------------ the algorithm train.py runs
class SHARPO:
    """--algo sharpo: the method's answers to train.py's stages 2-7 (uses_teacher: 2, advantages:
    3, credit: 5, loss_terms: 6, metrics: 7). GRPO below and the baselines (baselines.py) subclass
    it."""

    mixes = True  # Ahat = A * ((1 - lam) + lam * m); False: Ahat = A, and no multiplier is logged
    shape = "exp"  # f in m = clip(f(sign(A) * g)) (Eq. 4)
    per_token = False  # True: one multiplier a token, not a segment gap (RLSD's)
    reads_every_row = False  # a loss term of its own reads rows whose Ahat is 0 (SDAR's)
    verl = True  # the verl bridge computes its Ahat from mixes, shape and per_token alone

    def uses_teacher(self, args) -> bool:
        """Whether the teacher pass runs: only where the multiplier can change Ahat (lam > 0)."""
        return args.lam > 0

    def advantages(self, rewards: torch.Tensor, groups: torch.Tensor, rows, args) -> Advantages:
        """Stage 3: Advantages, from the rewards (N,) and groups (N,) alone (Eq. 1, section 4)."""
        adv = row_advantages(rewards, groups, rows.traj, args.episode_stats)  # (B,)   (Eq. 1)
        trained, taught = needed_rows(adv != 0, rows.has_hindsight, args.kl_coef > 0,
                                      self.uses_teacher(args), self.reads_every_row)
        return Advantages(adv, trained, taught)

    def credit(self, adv: Advantages, logp, rows, args) -> Credit:
        """Stage 5: each segment's gap g (Eq. 2-3) and multiplier m (Eq. 4), and Ahat (Eq. 5)."""
        gaps = segment_gap(logp.teacher, logp.student, rows.response_mask, rows.gap_mask)  # (B,)
        lam = args.lam if self.mixes else 0.0  # GRPO: Ahat = A
        token_adv, m = token_advantages(adv.row, gaps, rows.response_mask, lam, args.eps_m,
                                        self.shape)  # (B, T), (B,)                  (Eq. 4-5)
        return Credit(token_adv, gaps, m if self.mixes else None)

    def loss_names(self, args) -> tuple[str, ...]:
        """The names of the terms loss_terms adds under these flags (SDAR's, when weighted)."""
        return ()

    def loss_terms(self, logp_new, logp_old, part, rows, logp, counts, args) -> dict:
        """Stage 6: terms added to PPO's loss, {name: (weight, term)}: none (SDAR adds one)."""
        return {}

    def metrics(self, adv: Advantages, gather) -> dict:
        """Statistics of its own for the metrics line, and for row b of a sample trajectory
        (`sample_fields`): none here (GiGPO logs its step groups, baselines.py)."""
        return {}

    def sample_fields(self, adv: Advantages, b: int) -> dict:
        return {}


class GRPO(SHARPO):
    """--algo grpo: lam = 0, Ahat = A on every token; no teacher pass."""

    mixes = False

    def uses_teacher(self, args) -> bool:
        return False


# ------------------------------------------------------------------ the loss (METHOD.md section 5)
def policy_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, token_adv: torch.Tensor,
                mask: torch.Tensor, num_tokens: int | float, ppo_clip: float) -> torch.Tensor:
    """PPO-clip on token advantages, token-mean over the whole minibatch (Eq. 6). Exercise 4.

    logp_new (b, T): the policy being trained (the gradient flows here); logp_old (b, T): PPO's old
    log-probs (section 5); token_adv (b, T): Ahat; mask (b, T) bool: the tokens trained on.
    num_tokens: the denominator, the response tokens of the *whole* minibatch (rows whose Ahat is 0
    included), so micro-batches add up to the minibatch's token mean (verl-agent's). A scalar.
    """
    ratio = torch.exp(logp_new - logp_old.detach())  # (b, T) r_t                       (Eq. 6)
    clipped = ratio.clamp(1.0 - ppo_clip, 1.0 + ppo_clip)  # (b, T)
    pg = torch.maximum(-token_adv * ratio, -token_adv * clipped)  # (b, T) PPO-clip    (Eq. 6)
    return (pg * mask).sum() / max(float(num_tokens), 1.0)  # over the minibatch's token count


def k3(logp_ref: torch.Tensor, logp_new: torch.Tensor) -> torch.Tensor:
    """k3, the low-variance estimate of KL(new || ref) a token: exp(d) - d - 1, d = ref - new."""
    d = logp_ref.detach() - logp_new  # (b, T)
    return torch.exp(d) - d - 1.0  # (b, T)                                              (Eq. 7)


def kl_loss(logp_ref: torch.Tensor, logp_new: torch.Tensor, mask: torch.Tensor,
            num_tokens: int | float) -> torch.Tensor:
    """The KL term to the reference (adapter off): k3, token-mean like policy_loss (Eq. 7)."""
    kl = k3(logp_ref, logp_new) * mask.to(logp_new.dtype)  # (b, T)                     (Eq. 7)
    return kl.sum() / max(float(num_tokens), 1.0)
