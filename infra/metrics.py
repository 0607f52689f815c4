"""Metrics: what each training iteration logs (metrics.jsonl) and the sample trajectories it keeps
(samples.jsonl). docs/training.md defines every key.

`gather` arguments combine the values of every process in a multi-process run (the identity in
a plain run), so the numbers are over all of the iteration's episodes.
"""
from __future__ import annotations

import resource
import time
from collections import defaultdict
from contextlib import contextmanager

import torch

from advantage import ALGORITHMS
from eval import summarize
from segments import Trajectory


class Stopwatch:
    """Seconds per named stage of one iteration (`with watch("rollout"): ...`); with an env, also
    the env's share of the time (seconds/env) and its crashes since the watch started."""

    def __init__(self, env=None):
        self.seconds = {"rollout": 0.0, "env": 0.0, "segments": 0.0, "student": 0.0, "teacher": 0.0,
                        "reference": 0.0, "update": 0.0}
        self.env = env
        self.env_start = sum(env.seconds.values()) if env is not None else 0.0
        self.crashes_start = getattr(env, "crashes", 0)

    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        yield
        self.seconds[name] += time.perf_counter() - start
        if self.env is not None:
            self.seconds["env"] = sum(self.env.seconds.values()) - self.env_start

    def crashes(self) -> int:
        return getattr(self.env, "crashes", 0) - self.crashes_start


def iteration_metrics(trainer, batch, policy, update: dict, watch: Stopwatch) -> dict:
    """The metrics line of the iteration train.py just ran (docs/training.md defines each key)."""
    dist, args, seconds = trainer.dist, trainer.args, watch.seconds
    all_trajs = dist.gather(batch.trajs)  # [distributed] metrics over every process's episodes
    out = {"iteration": trainer.iteration_done, **rollout_metrics(all_trajs, [t.group for t in all_trajs])}
    if ALGORITHMS[args.algo].teacher:
        out.update(teacher_metrics(batch, args.algo, args.mult_eps, dist.gather))
    if ALGORITHMS[args.algo].step_groups:
        out.update(gigpo_metrics(batch, dist.gather))
    out.update(update)
    out["rows"] = int(dist.sum(len(batch.rows)))
    out["skipped/student"] = int(dist.sum(batch.skipped["student"]))  # the same rows sit out the update
    if ALGORITHMS[args.algo].teacher:
        out["skipped/teacher"] = int(dist.sum(batch.skipped["teacher"]))
    out["env_crashes"] = int(dist.sum(watch.crashes()))
    out["tokens_generated"] = int(dist.sum(policy.tokens_generated))
    out["tokens_per_s_generate"] = out["tokens_generated"] / max(seconds["rollout"], 1e-9)
    if hasattr(policy, "metrics"):  # --rollout vllm: its log-probs against the trainer's (rollout/logp_diff_*)
        out.update(policy.metrics(batch))
    out["processes"] = dist.world
    out.update({f"seconds/{k}": v for k, v in seconds.items()})
    out["peak_memory_gb"] = peak_memory_gb()
    return out


def rollout_metrics(trajs: list[Trajectory], group_ids: list[int]) -> dict:
    """Success (overall, per task type), reward, invalid rate, share of groups with reward spread,
    and of groups with success spread (some episodes won, some not)."""
    summary = summarize(trajs)
    by_group: dict[int, set] = defaultdict(set)
    won_by_group: dict[int, set] = defaultdict(set)
    for traj, g in zip(trajs, group_ids):
        by_group[g].add(round(traj.reward, 6))
        won_by_group[g].add(bool(traj.won))
    out = {k: v for k, v in summary.items() if not k.startswith("episodes/")}
    out["groups_with_spread"] = sum(len(v) > 1 for v in by_group.values()) / len(by_group)
    # the rest of the spread is penalties alone (0.1 an invalid answer), which the std of a group blows up to full size
    out["groups_with_win_spread"] = sum(len(v) > 1 for v in won_by_group.values()) / len(won_by_group)
    return out


def _same(items: list) -> list:
    return items


def teacher_metrics(batch, algo: str, eps: float, gather=_same) -> dict:
    """What the teacher found and what --algo applied of it.

    gap_mean, gap_abs_mean: the segment gap g over the rows the teacher scores (hindsight and
    A != 0; sdar: every row with hindsight).
    mult_mean, mult_std, mult_at_bound: the multiplier the algorithm really applies, over the
    units it applies it to, where it can differ from 1 (hindsight and A != 0): segments for
    sharpo and stepopsd, tokens for rlsd. grpo and sdar scale no advantage and log none.
    gather: combines the values of every process ([distributed]; the identity in a plain run)."""
    hind = batch.has_hindsight  # (B,)
    sel = hind & (batch.adv_row != 0)  # (B,) rows whose multiplier can differ from 1
    spec = ALGORITHMS[algo]
    if spec.mixes and spec.granularity == "segment":  # sharpo, stepopsd
        m = batch.mults[sel]  # (n,) one per segment
    elif spec.mixes:  # rlsd
        m = batch.token_mults[sel][batch.segment_ids[sel] >= 0]  # (n,) one per trained token
    else:  # grpo, sdar, gigpo scale no advantage
        m = torch.zeros(0)
    hind_all = torch.tensor(gather(hind.tolist()), dtype=torch.bool)  # (B_all,)
    g = torch.tensor(gather(batch.gaps[batch.taught].tolist()))  # (n_taught,)
    m = torch.tensor(gather(m.tolist()))  # (n,)
    out = {"hindsight_share": float(hind_all.float().mean()), "segments_scored": sum(gather([int(sel.sum())]))}
    if g.numel():
        out.update({"gap_mean": float(g.mean()), "gap_abs_mean": float(g.abs().mean())})
    if spec.mixes and m.numel():
        at_bound = ((m <= 1 - eps + 1e-6) | (m >= 1 + eps - 1e-6)).float()
        out.update({"mult_mean": float(m.mean()), "mult_std": float(m.std()) if m.numel() > 1 else 0.0,
                    "mult_at_bound": float(at_bound.mean())})
    return out


def gigpo_metrics(batch, gather=_same) -> dict:
    """How much step-level signal GiGPO found: the share of steps in a step group of size >= 2,
    the mean step-group size, and the spread (std) of the step advantage."""
    _, inverse, counts = torch.unique(batch.step_groups, return_inverse=True, return_counts=True)
    row_sizes = torch.tensor(gather(counts[inverse].tolist()))  # (B_all,) size of each row's step group
    group_sizes = torch.tensor(gather(counts.tolist()), dtype=torch.float)  # (groups_all,)
    step_adv = torch.tensor(gather(batch.step_adv.tolist()))  # (B_all,)
    return {"gigpo/step_group_share": float((row_sizes >= 2).float().mean()),
            "gigpo/step_group_size": float(group_sizes.mean()),
            "gigpo/step_adv_std": float(step_adv.std()) if step_adv.numel() > 1 else 0.0}


def peak_memory_gb() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


def sample_records(batch, tokenizer, k: int, it: int) -> list[dict]:
    """A few trajectories (those whose advantage is not 0 first, then those with hindsight) with each
    segment's gap and multiplier (null where the teacher did not score the row: its Ahat is 0)."""
    trajs, steps = batch.trajs, batch.steps
    delta = batch.logp_teacher - batch.logp_student  # (B, T) per-token teacher - student gap
    moving = {i for (i, _), m in zip(steps, batch.moves) if m}  # trajectories with a row that can move the policy
    shown = [i for i in range(len(trajs)) if trajs[i].steps]  # an episode whose worker crashed at reset has none
    picked = sorted(shown, key=lambda i: (i not in moving, trajs[i].hindsight is None, i))[:k]
    records = []
    for i in picked:
        mine = [b for b, (j, _) in enumerate(steps) if j == i]
        segs = []
        for b in mine:
            s, n = steps[b][1], len(batch.rows[b].response_ids)
            scored = bool(batch.taught[b] or not batch.has_hindsight[b])
            segs.append({
                "observation": s.messages[-1]["content"].split("Current observation: ")[-1].split("\nAdmissible")[0],
                "response": s.response_text, "action": s.action, "reward": s.reward,
                "gap": float(batch.gaps[b]) if scored else None, "multiplier": float(batch.mults[b]) if scored else None,
                **({"step_advantage": float(batch.step_adv[b])} if batch.step_adv is not None else {}),
                "tokens": [tokenizer.decode([t]) for t in batch.rows[b].response_ids],
                "token_delta": [round(float(x), 4) for x in delta[b, :n]] if scored else None,
            })
        traj = trajs[i]
        records.append({"iteration": it, "task_id": traj.task_id, "task_type": traj.task_type, "won": traj.won,
                        "reward": traj.reward, "advantage": float(batch.adv_row[mine[0]]),
                        "hindsight": traj.hindsight, "segments": segs})
    return records


RECENT = 5  # iterations in the moving success rate `success_recent`


def progress_line(m: dict) -> str:
    parts = [f"iter {m['iteration']}", f"success {m['success']:.2f}"]
    if "success_recent" in m:
        parts.append(f"last {RECENT} {m['success_recent']:.2f}")
    parts += [f"reward {m['mean_reward']:+.2f}",
             f"invalid {m['invalid_rate']:.2f}", f"spread {m['groups_with_spread']:.2f}"]
    if "mult_mean" in m:
        parts.append(f"mult {m['mult_mean']:.3f}±{m['mult_std']:.3f} bound {m['mult_at_bound']:.2f}")
    if "update/loss" in m:
        parts.append(f"loss {m['update/loss']:+.4f}")
    if "eval/success" in m:
        parts.append(f"eval {m['eval/success']:.2f}")
    parts.append(f"{sum(v for k, v in m.items() if k.startswith('seconds/') and k != 'seconds/env'):.0f}s")
    return " | ".join(parts)
