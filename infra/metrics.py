"""Metrics: what each training iteration logs (metrics.jsonl) and the sample trajectories it keeps
(samples.jsonl), and the episode summary eval.py prints. docs/training.md defines every key.

`gather` arguments combine the values of every process in a multi-process run (the identity in
a plain run), so the numbers are over all of the iteration's episodes.
"""
from __future__ import annotations

import contextlib
import json
import resource
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from advantage import Advantages, Credit
from baselines import ALGORITHMS
from errors import OutputLost, Stopped, UserError
from infra.curves import draw_curves
from rollout import LogProbs
from segments import Rows, Trajectory


def summarize(trajs: list[Trajectory]) -> dict:
    """Success, reward, length and invalid rate of finished episodes, overall and per task type (eval.py's docstring)."""
    steps = sum(len(t.steps) for t in trajs)
    invalid = sum(s.action is None for t in trajs for s in t.steps)
    by_type: dict[str, list[bool]] = defaultdict(list)
    for t in trajs:
        by_type[t.task_type].append(t.won)
    out = {
        "episodes": len(trajs),
        "success": sum(t.won for t in trajs) / max(len(trajs), 1),
        "mean_reward": sum(t.reward for t in trajs) / max(len(trajs), 1),
        "mean_steps": steps / max(len(trajs), 1),
        "invalid_rate": invalid / max(steps, 1),
    }
    if any("score" in t.info for t in trajs):
        out["mean_score"] = sum(t.info.get("score", 0.0) for t in trajs) / len(trajs)
    out.update({f"success/{k}": sum(v) / len(v) for k, v in sorted(by_type.items())})
    out.update({f"episodes/{k}": len(v) for k, v in sorted(by_type.items())})
    return out


@dataclass
class Stages:
    """What one iteration's stages returned, for its metrics line and sample records."""

    trajs: list[Trajectory]  # 1. rollout
    rows: Rows  # 2. segments
    adv: Advantages  # 3. advantage
    logp: LogProbs  # 4. logprobs
    credit: Credit  # 5. credit
    update: dict  # 6. update: the update/... statistics
    watch: "Stopwatch"  # seconds per stage
    actor: object  # who decoded the rollout (tokens_generated; vLLM: its log-prob difference)


def timed(watch, name: str):
    """`with timed(watch, name):` times a stage when there is a stopwatch, and does nothing without one."""
    return watch(name) if watch is not None else contextlib.nullcontext()


class Stopwatch:
    """Seconds per named stage of one iteration (`with watch("rollout"): ...`); with an env, also
    the env's share of the time (seconds/env) and its crashes since the watch started."""

    def __init__(self, env=None):
        self.seconds = {"rollout": 0.0, "env": 0.0, "segments": 0.0, "student": 0.0, "teacher": 0.0,
                        "reference": 0.0, "update": 0.0}
        self.env, self.open = env, []
        self.env_start = sum(env.seconds.values()) if env is not None else 0.0
        self.crashes_start = getattr(env, "crashes", 0)
        reset_peak_memory()  # peak_memory_gb is this iteration's own peak, not the run's so far

    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        self.open.append(name)
        yield
        self.open.pop()
        spent = time.perf_counter() - start
        self.seconds[name] += spent
        if self.open:  # a stage timed inside another (the reference pass in the update) is its own
            self.seconds[self.open[-1]] -= spent
        if self.env is not None:
            self.seconds["env"] = sum(self.env.seconds.values()) - self.env_start

    def crashes(self) -> int:
        return getattr(self.env, "crashes", 0) - self.crashes_start


def iteration_metrics(stages: Stages, args, dist, iteration: int) -> dict:
    """The metrics line of the iteration train.py just ran (docs/training.md defines each key)."""
    seconds, adv, rows, algo = stages.watch.seconds, stages.adv, stages.rows, ALGORITHMS[args.algo]
    all_trajs = dist.gather(stages.trajs)  # [distributed] metrics over every process's episodes
    out = {"iteration": iteration, **rollout_metrics(all_trajs, [t.group for t in all_trajs])}
    if algo.uses_teacher(args):
        out.update(teacher_metrics(stages, args.algo, args.eps_m, dist.gather))
    if adv.step is not None:  # GiGPO
        out.update(gigpo_metrics(adv, dist.gather))
    if rows.gap_mask is not None:  # --gap-tokens action: responses without an <action> block, gap over all their tokens
        out["gap_action_fallback"] = sum(dist.gather(rows.gap_fallback.tolist())) / max(dist.sum(len(rows.rows)), 1)
    out.update(stages.update)
    out["rows"] = int(dist.sum(len(rows.rows)))
    out["skipped/student"] = int(dist.sum(int((~adv.trained).sum())))  # the same rows sit out the update
    if algo.uses_teacher(args):
        out["skipped/teacher"] = int(dist.sum(int((rows.has_hindsight & ~adv.taught).sum())))
    out["env_crashes"] = int(dist.sum(stages.watch.crashes()))
    out["tokens_generated"] = int(dist.sum(stages.actor.tokens_generated))
    out["tokens_per_s_generate"] = out["tokens_generated"] / max(seconds["rollout"], 1e-9)
    if hasattr(stages.actor, "metrics"):  # --rollout vllm: its log-probs against the trainer's (rollout/logp_diff_*)
        out.update(stages.actor.metrics(rows, stages.logp))
    out["processes"] = dist.world
    out.update({f"seconds/{k}": v for k, v in seconds.items()})
    out["peak_memory_gb"] = peak_memory_gb()
    return out


def rollout_metrics(trajs: list[Trajectory], group_ids: list[int]) -> dict:
    """Success (overall, per task type, per task as [won, played]), reward, invalid rate, share of
    groups with reward spread, and of groups with success spread (some episodes won, some not)."""
    summary = summarize(trajs)
    task_wins: dict[str, list[int]] = {}
    for traj in trajs:
        won, played = task_wins.get(traj.task_id, [0, 0])
        task_wins[traj.task_id] = [won + bool(traj.won), played + 1]
    by_group: dict[int, set] = defaultdict(set)
    won_by_group: dict[int, set] = defaultdict(set)
    for traj, g in zip(trajs, group_ids):
        by_group[g].add(round(traj.reward, 6))
        won_by_group[g].add(bool(traj.won))
    out = {k: v for k, v in summary.items() if not k.startswith("episodes/")}
    out["groups_with_spread"] = sum(len(v) > 1 for v in by_group.values()) / len(by_group)
    # the rest of the spread is penalties alone (0.1 an invalid answer), which the std of a group blows up to full size
    out["groups_with_win_spread"] = sum(len(v) > 1 for v in won_by_group.values()) / len(won_by_group)
    out["task_wins"] = task_wins
    return out


def _same(items: list) -> list:
    return items


def teacher_metrics(stages: Stages, algo: str, eps: float, gather=_same) -> dict:
    """What the teacher found and what --algo applied of it.

    gap_mean, gap_abs_mean: the segment gap g over the rows the teacher scores (hindsight and
    A != 0; sdar: every row with hindsight).
    mult_mean, mult_std, mult_at_bound: the multiplier the algorithm really applies, over the
    units it applies it to, where it can differ from 1 (hindsight and A != 0): segments for
    sharpo and stepopsd, tokens for rlsd. grpo and sdar scale no advantage and log none.
    gather: combines the values of every process ([distributed]; the identity in a plain run)."""
    rows, adv, credit = stages.rows, stages.adv, stages.credit
    hind = rows.has_hindsight  # (B,)
    sel = hind & (adv.row != 0)  # (B,) rows whose multiplier can differ from 1
    spec = ALGORITHMS[algo]
    if credit.mults is None:  # grpo, sdar, gigpo scale no advantage
        m = torch.zeros(0)
    elif not spec.per_token:  # sharpo, stepopsd
        m = credit.mults[sel]  # (n,) one per segment
    else:  # rlsd: one per trained token
        m = credit.mults[sel][rows.response_mask[sel]]  # (n,)
    hind_all = torch.tensor(gather(hind.tolist()), dtype=torch.bool)  # (B_all,)
    scored = hind & (adv.trained if spec.reads_every_row else sel)  # (B,) the rows the teacher must score (section 4)
    g = torch.tensor(gather(credit.gaps[scored].tolist()))  # (n_scored,)
    m = torch.tensor(gather(m.tolist()))  # (n,)
    out = {"hindsight_share": float(hind_all.float().mean()), "segments_scored": sum(gather([int(sel.sum())]))}
    if g.numel():
        out.update({"gap_mean": float(g.mean()), "gap_abs_mean": float(g.abs().mean())})
    if spec.mixes and m.numel():
        at_bound = ((m <= 1 - eps + 1e-6) | (m >= 1 + eps - 1e-6)).float()
        out.update({"mult_mean": float(m.mean()), "mult_std": float(m.std()) if m.numel() > 1 else 0.0,
                    "mult_at_bound": float(at_bound.mean())})
    return out


def gigpo_metrics(adv: Advantages, gather=_same) -> dict:
    """How much step-level signal GiGPO found: the share of steps in a step group of size >= 2,
    the mean step-group size, and the spread (std) of the step advantage."""
    _, inverse, counts = torch.unique(adv.step_groups, return_inverse=True, return_counts=True)
    row_sizes = torch.tensor(gather(counts[inverse].tolist()))  # (B_all,) size of each row's step group
    group_sizes = torch.tensor(gather(counts.tolist()), dtype=torch.float)  # (groups_all,)
    step_adv = torch.tensor(gather(adv.step.tolist()))  # (B_all,)
    return {"gigpo/step_group_share": float((row_sizes >= 2).float().mean()),
            "gigpo/step_group_size": float(group_sizes.mean()),
            "gigpo/step_adv_std": float(step_adv.std()) if step_adv.numel() > 1 else 0.0}


def peak_memory_gb() -> float:
    """The peak memory since the last reset_peak_memory (GPU: allocated by torch; CPU: the process's resident set)."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    try:  # Linux: the peak resident set since the last reset, in kB
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 2**20
    except (OSError, StopIteration, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # the process's peak so far, in KiB


def reset_peak_memory() -> None:
    """Start a new peak: torch's CUDA counter, or the kernel's peak resident set (Linux; elsewhere it keeps the run's)."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
        return
    with contextlib.suppress(OSError):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # 5: reset the peak resident set size (proc(5))


def sample_records(stages: Stages, tokenizer, k: int, it: int) -> list[dict]:
    """A few trajectories (those whose advantage is not 0 first, then those with hindsight) with each
    segment's gap and multiplier (null where the teacher did not score the row: its Ahat is 0)."""
    trajs, rows, adv, logp, credit = stages.trajs, stages.rows, stages.adv, stages.logp, stages.credit
    delta = logp.teacher - logp.student  # (B, T) per-token teacher - student gap
    moves = credit.token_adv.ne(0).any(1)  # (B,) rows whose Ahat is not 0
    moving = {int(i) for i, m in zip(rows.traj, moves) if m}  # trajectories with a row that can move the policy
    shown = [i for i in range(len(trajs)) if trajs[i].steps]  # an episode whose worker crashed at reset has none
    picked = sorted(shown, key=lambda i: (i not in moving, trajs[i].hindsight is None, i))[:k]
    records = []
    for i in picked:
        mine = [b for b, j in enumerate(rows.traj.tolist()) if j == i]
        segs = []
        for b in mine:
            s, n = rows.steps[b], len(rows.rows[b].response_ids)
            scored = bool(adv.taught[b] or not rows.has_hindsight[b])
            segs.append({
                "observation": s.messages[-1]["content"].split("Current observation: ")[-1].split("\nAdmissible")[0],
                "response": s.response_text, "action": s.action, "reward": s.reward,
                "gap": float(credit.gaps[b]) if scored else None,
                "multiplier": segment_multiplier(credit.mults, b, n) if scored else None,
                **({"step_advantage": float(adv.step[b])} if adv.step is not None else {}),
                "tokens": [tokenizer.decode([t]) for t in rows.rows[b].response_ids],
                "token_delta": [round(float(x), 4) for x in delta[b, :n]] if scored else None,
            })
        traj = trajs[i]
        records.append({"iteration": it, "task_id": traj.task_id, "task_type": traj.task_type, "won": traj.won,
                        "reward": traj.reward, "advantage": float(adv.row[mine[0]]),
                        "hindsight": traj.hindsight, "segments": segs})
    return records


def segment_multiplier(mults: torch.Tensor | None, b: int, n: int) -> float | None:
    """The multiplier row b's segment got (Credit.mults): its own, or RLSD's per-token mean over its n tokens;
    None where the algorithm applies none."""
    if mults is None:
        return None
    return float(mults[b]) if mults.dim() == 1 else float(mults[b, :n].mean())


def loss_stats(logp_new, logp_old, token_adv, mask, num_tokens, num_trained, ppo_clip: float) -> dict:
    """What PPO's step did to the trained tokens of a micro-batch, each over the minibatch's count:
    clip_frac, the share whose clipped term was the larger (over num_tokens, as the loss), and
    approx_kl_old, the k3 estimate of KL(old, new) (over num_trained, the tokens the loss reads)."""
    with torch.no_grad():
        m = mask.to(logp_new.dtype)  # (b, t) 1.0 = trained token
        log_ratio = logp_new - logp_old  # (b, t)
        ratio = torch.exp(log_ratio)  # (b, t)
        clipped = (-token_adv * ratio.clamp(1.0 - ppo_clip, 1.0 + ppo_clip)) > (-token_adv * ratio)  # (b, t)
        return {"clip_frac": (clipped.to(m.dtype) * m).sum() / max(float(num_tokens), 1.0),
                "approx_kl_old": ((ratio - 1 - log_ratio) * m).sum() / max(float(num_trained), 1.0)}


class UpdateLog:
    """The bookkeeping of one iteration's update (train.py's stage 6): the progress bar, each micro-
    batch's loss statistics, the optimizer steps taken or skipped (a non-finite loss or gradient), a
    check after each step that the policy can still be sampled; update/... means over the steps taken."""

    def __init__(self, iteration: int, dist, args, algo):
        self.iteration, self.dist, self.args, self.steps, self.skipped = iteration, dist, args, 0, 0
        self.keys = (["pg_loss", "clip_frac", "approx_kl_old", "loss"] + ["kl_ref"] * (args.kl_coef > 0)
                     + list(algo.loss_names(args)))
        self.sums: dict[str, float] = defaultdict(float)
        self.stats, self.all_finite = [], True  # this minibatch's micro-batches

    def progress(self, minibatches):
        total = self.args.ppo_epochs * self.args.minibatches
        return tqdm(minibatches, total=total, desc=f"iter {self.iteration} update", leave=False)

    def record(self, terms: dict, loss, logp_new, logp_old, token_adv, mask, counts: dict) -> None:
        """One micro-batch's loss terms and what PPO's step did to its tokens (loss_stats)."""
        ppo = loss_stats(logp_new, logp_old, token_adv, mask, counts["tokens"], counts["trained"],
                         self.args.ppo_clip)
        self.stats.append({**{k: v.detach() for k, v in terms.items()}, **ppo, "loss": loss.detach()})

    def finite(self, loss) -> bool:
        """Whether a micro-batch's loss is finite; one that is not skips its minibatch's step."""
        self.all_finite = self.all_finite and bool(torch.isfinite(loss))
        return self.all_finite

    def total(self, stats: list[dict]) -> dict[str, float]:
        """The minibatch's statistics: each micro-batch's is already divided by the minibatch's count, so they add up."""
        return {k: sum(float(s[k]) for s in stats) for k in self.keys}

    def step(self, optimizer, params: list, model, passes, row) -> bool:
        """The minibatch's optimizer step, taken together by every process (the gradients summed and
        clipped, infra/distributed.py), or skipped by all when a loss or the gradient is not finite.
        After a step, `row` is scored again: a step that made the policy's log-probs non-finite stops
        the run in one line, before anything of the iteration is checkpointed. Returns whether a step
        was taken: from then on PPO's old log-probs are the student pass's (on an all-zero gradient a
        step moves the weights only once AdamW's moments are non-zero, not on a run's first step)."""
        stats = self.total(self.stats) if self.all_finite else {}
        step = self.dist.step(optimizer, params, self.args.grad_clip, self.all_finite, stats)
        self.stats, self.all_finite = [], True
        self.add(step)
        if step is not None:
            self.check_sampling(model, passes, row)
        return step is not None

    @torch.no_grad()
    def check_sampling(self, model, passes, row) -> None:
        it = self.iteration
        logp = passes.batch_logprobs(model, rows=[row], temperature=self.args.temperature)  # (1, t)
        if not torch.isfinite(logp).all():
            kept = f"the run keeps iteration {it - 1}" if it > 1 else "no checkpoint yet"
            raise UserError(f"iteration {it}: an optimizer step made the policy's sampling "
                            "distribution non-finite (NaN or infinite log-probs: the update "
                            f"diverged; --lr {self.args.lr:g} too large?). Nothing of iteration "
                            f"{it} is checkpointed; {kept}. Start a new run with a smaller --lr")

    def add(self, step: dict | None) -> None:
        """One optimizer step's statistics (with grad_norm), or None: a non-finite loss or gradient skipped it."""
        if step is None:
            self.skipped += 1
            print(f"warning: iteration {self.iteration}: non-finite loss or gradient, step skipped", file=sys.stderr)
            return
        self.steps += 1
        for k, v in step.items():
            self.sums[k] += v

    def means(self) -> dict:
        return {**{f"update/{k}": v / max(self.steps, 1) for k, v in self.sums.items()},
                "update/optimizer_steps": self.steps, "update/skipped_steps": self.skipped}


def last_samples(run_dir) -> list[dict]:
    """The sample trajectories of a run folder's last logged iteration (samples.jsonl)."""
    path = Path(run_dir) / "samples.jsonl"
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [r for r in records if r["iteration"] == records[-1]["iteration"]] if records else []


def segments_table(records: list[dict]) -> str:
    """Sample trajectories as text: each step's action, reward, segment gap g and multiplier m (- where the teacher
    was not asked: A = 0), so the end of a run shows where the credit went (tools/plots.py draws the same)."""
    lines = []
    for r in records:
        lines.append(f"{r['task_id'].split('/')[1] if '/' in r['task_id'] else r['task_id']}: won {r['won']}, "
                     f"R {r['reward']:+.1f}, A {r['advantage']:+.3f}")
        for k, s in enumerate(r["segments"], 1):
            g, m = ("-" if s["gap"] is None else f"{s['gap']:+.3f}"), ("-" if s["multiplier"] is None else f"{s['multiplier']:.3f}")
            lines.append(f"  step {k}  g {g:>7s}  m {m:>5s}  {s['action'] or '(invalid answer)'}")
    return "\n".join(lines)


RECENT = 5  # iterations in the moving success rate `success_recent`
CURVE_WIDTH = 30  # iterations the progress line's text curve shows (the latest ones)
BARS, ASCII_BARS = "▁▂▃▄▅▆▇█", "_.,:-=+*#"


def text_curve(successes: list[float], encoding: str | None = None) -> str:
    """The training success of the iterations so far as one character each (the lowest bar 0, the
    highest 1), the latest CURVE_WIDTH, then the move since the first: "▂▅▇ +0.44". ASCII where
    the output cannot write the bars."""
    bars = BARS
    try:
        BARS.encode(encoding or getattr(sys.stdout, "encoding", None) or "ascii")
    except (UnicodeEncodeError, LookupError):
        bars = ASCII_BARS
    shown = "".join(bars[round(min(max(s, 0.0), 1.0) * (len(bars) - 1))] for s in successes[-CURVE_WIDTH:])
    return f"{'~' if len(successes) > CURVE_WIDTH else ''}{shown} {successes[-1] - successes[0]:+.2f}"


def progress_line(m: dict, successes: list[float] | None = None) -> str:
    """An iteration's line: the training success (on the games it played), its curve over the
    iterations so far (`successes`, this one last) and the invalid-answer rate first, then the rest."""
    parts = [f"iter {m['iteration']}", f"train success {m['success']:.2f}"
             + (f" {text_curve(successes)}" if successes else ""), f"invalid {m['invalid_rate']:.2f}"]
    if "success_recent" in m:
        parts.append(f"last {RECENT} {m['success_recent']:.2f}")
    parts += [f"reward {m['mean_reward']:+.2f}", f"spread {m['groups_with_spread']:.2f}"]
    if "mult_mean" in m:
        parts.append(f"mult {m['mult_mean']:.3f}±{m['mult_std']:.3f} bound {m['mult_at_bound']:.2f}")
    if "update/loss" in m:
        parts.append(f"loss {m['update/loss']:+.4f}")
    if "eval/success" in m:
        parts.append(f"eval {m['eval/success']:.2f}")
    parts.append(f"{sum(v for k, v in m.items() if k.startswith('seconds/') and k != 'seconds/env'):.0f}s")
    return " | ".join(parts)


def closing_summary(out: str) -> None:
    """What train.py prints when a run is complete: where its last iteration's credit went (each
    segment's gap g and multiplier m), and what to run next. A closed or full output loses only these
    lines."""
    table = segments_table(last_samples(out))
    curves = draw_curves(Path(out))  # infra/curves.py
    try:
        print(f"where the last iteration's credit went (each segment's gap g and multiplier m):\n{table}" if table
              else "no sample trajectories kept (--samples-per-iter 0): no table of where the credit went")
        if curves:
            print(f"the run's curves (success on its training games, reward, invalid rate, multiplier): {curves}")
        print(f"done: metrics in {out}/metrics.jsonl, checkpoints in {out}/checkpoints; draw the segments "
              f"with python -m tools.plots {out}, evaluate with python eval.py --policy model --checkpoint {out}")
    except OutputLost as err:
        raise Stopped(f"{out} is complete; only its closing summary was not printed", err) from None
