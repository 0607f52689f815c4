"""A controlled world: when does segment credit help, and by how much? (A stub; the world itself follows.)"""
from __future__ import annotations

import torch


def decompose_log_m(mults: torch.Tensor, traj: torch.Tensor, scored: torch.Tensor | None = None) -> dict:
    """Split the variance of log m over segments in two (the law of total variance, population variances):
    `episode`, the variance of each episode's mean log m (shared by all its steps: a rescaling of the whole
    episode, which mostly follows sign(A)), and `within`, the mean variance of log m inside an episode (what
    differs between the steps of one episode: the credit assignment). total = episode + within.

    mults (B,) each segment's multiplier, traj (B,) its episode, scored (B,) bool the segments to count
    (default all). Returns total, episode, within, within_share (within / total; 0 when total is 0) and segments."""
    keep = torch.ones_like(traj, dtype=torch.bool) if scored is None else scored.bool()
    x, ep = mults[keep].double().log(), traj[keep]  # (n,), (n,)
    if x.numel() == 0:
        return {"total": 0.0, "episode": 0.0, "within": 0.0, "within_share": 0.0, "segments": 0}
    _, idx = torch.unique(ep, return_inverse=True)  # (n,) episode index
    k = int(idx.max()) + 1
    count = torch.zeros(k, dtype=x.dtype).index_add(0, idx, torch.ones_like(x))  # (k,)
    mean = torch.zeros(k, dtype=x.dtype).index_add(0, idx, x) / count  # (k,) each episode's mean log m
    total = float(((x - x.mean()) ** 2).mean())
    within = float(((x - mean[idx]) ** 2).mean())
    episode = float(((mean[idx] - x.mean()) ** 2).mean())
    return {"total": total, "episode": episode, "within": within,
            "within_share": within / total if total > 0 else 0.0, "segments": int(x.numel())}
