"""Report: what a training iteration tells, in metrics.jsonl and samples.jsonl, and what a run prints.

The iteration's metrics line (docs/training.md defines every key): the rollout's success, reward and
spread; what the teacher found and the algorithm applied (from its Advantages and Credit, and its own
`metrics`: GiGPO's, baselines.py); the update's statistics; rows, tokens, seconds and memory. A few
sample trajectories with each segment's gap and multiplier. The run's logs, evaluations and
checkpoints, when the loop calls for them (RunLog); the progress line, and the closing table of
where the last iteration's credit went. A reader of the method may skip this file: it computes
nothing the update uses and decides no step; its one check, `check_finite_policy`, stops a run whose
optimizer step left the policy unsampleable.

`gather` arguments combine the values of every process in a multi-process run (the identity in a
plain run), so the numbers are over all of the iteration's episodes.
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from advantage import Advantages, Credit
from errors import OutputLost, Stopped, UserError
from eval import in_loop_evaluation, summarize
from infra import dashboard
from infra.curves import draw_curves
from infra.metrics import Stopwatch, peak_memory_gb, text_curve
from rollout import LogProbs
from segments import Rows, Trajectory

RECENT = 5  # iterations in the moving success rate `success_recent`


@dataclass
class Stages:
    """What one iteration's stages returned, for its metrics line and sample records."""

    trajs: list[Trajectory]  # 1. rollout
    rows: Rows  # 2. segments
    adv: Advantages  # 3. advantage
    logp: LogProbs  # 4. logprobs
    credit: Credit  # 5. credit
    update: dict  # 6. update: the update/... statistics
    watch: Stopwatch  # seconds per stage
    actor: object  # who decoded the rollout (tokens_generated; vLLM: its log-prob difference)


def line_and_samples(stages: Stages, trainer, iteration: int) -> tuple[dict, list[dict]]:
    """train.py's stage 7: the iteration's metrics line and its sample trajectories."""
    t = trainer
    return (iteration_metrics(stages, t.algo, t.args, t.dist, iteration),
            sample_records(stages, t.algo, t.tokenizer, t.args.samples_per_iter, iteration))


def iteration_metrics(stages: Stages, algo, args, dist, iteration: int) -> dict:
    """The metrics line of the iteration train.py just ran (docs/training.md defines each key);
    algo: the --algo that ran it (baselines.ALGORITHMS): what its teacher found, and its own `metrics`."""
    seconds, adv, rows = stages.watch.seconds, stages.adv, stages.rows
    all_trajs = dist.gather(stages.trajs)  # [distributed] metrics over every process's episodes
    out = {"iteration": iteration, **rollout_metrics(all_trajs, [t.group for t in all_trajs])}
    if algo.uses_teacher(args):
        out.update(teacher_metrics(algo, rows, adv, stages.credit, args.eps_m, dist.gather))
    out.update(algo.metrics(adv, dist.gather))  # an algorithm's own (GiGPO's step groups)
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


def teacher_metrics(algo, rows: Rows, adv: Advantages, credit: Credit, eps_m: float, gather) -> dict:
    """What the teacher found and what --algo applied of it.

    gap_mean, gap_abs_mean: the segment gap g over the rows the teacher scores (hindsight and
    A != 0; sdar: every row with hindsight).
    mult_mean, mult_std, mult_at_bound: the multiplier the algorithm really applies (Credit.mults),
    where it can differ from 1 (hindsight and A != 0): over segments where it is one a segment
    (sharpo, stepopsd), over tokens where it is one a token (rlsd). grpo, sdar and gigpo scale no
    advantage and log none.
    gather: combines the values of every process ([distributed]; the identity in a plain run)."""
    hind = rows.has_hindsight  # (B,)
    moves = hind & (adv.row != 0)  # (B,) rows whose multiplier can differ from 1
    scored = hind & (adv.trained if algo.reads_every_row else moves)  # (B,) the rows the teacher scores
    g = torch.tensor(gather(credit.gaps[scored].tolist()))  # (n,)
    if credit.mults is None:  # no multiplier
        m = torch.zeros(0)
    elif credit.mults.dim() == 1:  # one a segment
        m = credit.mults[moves]  # (n,)
    else:  # one a token
        m = credit.mults[moves][rows.response_mask[moves]]  # (n,)
    m = torch.tensor(gather(m.tolist()))  # (n_m,)
    hind_all = torch.tensor(gather(hind.tolist()), dtype=torch.bool)  # (B_all,)
    out = {"hindsight_share": float(hind_all.float().mean()), "segments_scored": sum(gather([int(moves.sum())]))}
    if g.numel():
        out.update({"gap_mean": float(g.mean()), "gap_abs_mean": float(g.abs().mean())})
    if m.numel():
        at_bound = ((m <= 1 - eps_m + 1e-6) | (m >= 1 + eps_m - 1e-6)).float()  # (n_m,)
        out.update({"mult_mean": float(m.mean()), "mult_std": float(m.std()) if m.numel() > 1 else 0.0,
                    "mult_at_bound": float(at_bound.mean())})
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


def sample_records(stages: Stages, algo, tokenizer, k: int, it: int) -> list[dict]:
    """A few trajectories (those whose advantage is not 0 first, then those with hindsight) with each
    segment's gap and multiplier: null on a row with hindsight the teacher did not score (its Ahat
    is 0); a row without hindsight shows the gap 0 and the multiplier 1 its credit took."""
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
                **algo.sample_fields(adv, b),
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


# ----------------------------------------------------------------------------- the update's statistics
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
    """The statistics of one iteration's update (train.py's stage 6): the progress bar, each micro-
    batch's loss terms and what PPO's step did to its tokens, the optimizer steps taken or skipped;
    update/... means over the steps taken. It decides nothing and takes no step: train.py does."""

    def __init__(self, iteration: int, dist, args, algo):
        self.iteration, self.dist, self.args, self.steps, self.skipped = iteration, dist, args, 0, 0
        self.keys = (["pg_loss", "clip_frac", "approx_kl_old", "loss"] + ["kl_ref"] * (args.kl_coef > 0)
                     + list(algo.loss_names(args)))
        self.sums: dict[str, float] = defaultdict(float)
        self.stats = []  # this minibatch's micro-batches

    def progress(self, minibatches):
        total = self.args.ppo_epochs * self.args.minibatches
        return tqdm(minibatches, total=total, desc=f"iter {self.iteration} update", leave=False)

    def record(self, terms: dict, loss, logp_new, logp_old, token_adv, mask, counts: dict) -> None:
        """One micro-batch's loss terms and what PPO's step did to its tokens (loss_stats)."""
        ppo = loss_stats(logp_new, logp_old, token_adv, mask, counts["tokens"], counts["trained"],
                         self.args.ppo_clip)
        self.stats.append({**{k: v.detach() for k, v in terms.items()}, **ppo, "loss": loss.detach()})

    def step(self, grad_norm: float | None) -> None:
        """The minibatch's optimizer step: its statistics, summed over processes, with grad_norm (the
        gradient's norm before the clip); None: a non-finite loss or gradient skipped it."""
        stats, self.stats = self.stats, []
        if grad_norm is None:
            self.skipped += 1
            print(f"warning: iteration {self.iteration}: non-finite loss or gradient, step skipped", file=sys.stderr)
            return
        self.steps += 1
        summed = {k: self.dist.sum(sum(float(s[k]) for s in stats)) for k in self.keys}  # each already / the count
        for k, v in {**summed, "grad_norm": grad_norm}.items():
            self.sums[k] += v

    def means(self) -> dict:
        return {**{f"update/{k}": v / max(self.steps, 1) for k, v in self.sums.items()},
                "update/optimizer_steps": self.steps, "update/skipped_steps": self.skipped}


@torch.no_grad()
def check_finite_policy(model, passes, row, args, iteration: int) -> None:
    """After an optimizer step: `row` scored again, and a step that made the policy's log-probs non-
    finite stops the run in one line, before anything of the iteration is checkpointed."""
    logp = passes.micro_batch_logprobs(model, rows=[row], temperature=args.temperature)  # (1, t)
    if not torch.isfinite(logp).all():
        kept = f"the run keeps iteration {iteration - 1}" if iteration > 1 else "no checkpoint yet"
        raise UserError(f"iteration {iteration}: an optimizer step made the policy's sampling "
                        "distribution non-finite (NaN or infinite log-probs: the update "
                        f"diverged; --lr {args.lr:g} too large?). Nothing of iteration "
                        f"{iteration} is checkpointed; {kept}. Start a new run with a smaller --lr")


# ----------------------------------------------------------------------------- the run's logs
class RunLog:
    """What train.py's loop keeps of its run, one call each, when the loop says: each iteration's
    line (with the moving success rate) in metrics.jsonl and its sample trajectories in
    samples.jsonl, the same line in the --report-to tracker; a greedy evaluation on held-out games,
    its record beside them; a checkpoint (infra/checkpoint.py's safe write); the progress line.
    Only the main process writes."""

    def __init__(self, folder, trainer):
        self.folder, self.trainer, self.main = folder, trainer, trainer.dist.main
        args = trainer.args
        self.warmstart = trainer.warmstart  # the warm start the next checkpoint carries a copy of
        self.successes = [m["success"] for m in folder.logged()] if self.main else []  # the curve
        self.tracker = dashboard.open_tracker(args.report_to, args.output_dir, asdict(args)) if self.main else None
        self.eval_env = None  # the held-out games' env, made at the first evaluation

    def evaluate(self) -> dict:
        """Greedy play of --eval-games held-out games: the line's eval/... metrics; each game's
        outcome in the run folder, as eval.py writes it (eval_<env>_<split>_iter-N.json)."""
        t = self.trainer
        self.eval_env = self.eval_env or t.make_env(t.args.eval_games)
        line, record = in_loop_evaluation(self.eval_env, t.model, t.tokenizer, t.args, t.iteration_done,
                                          t.history_len)
        self.folder.save_evaluation(t.iteration_done, record)
        return line

    def write(self, line: dict, samples: list[dict]) -> None:
        self.successes.append(line["success"])
        recent = self.successes[-RECENT:]  # over more tasks
        line["success_recent"] = sum(recent) / len(recent)
        self.folder.log(line, samples)
        dashboard.log(self.tracker, line)  # --report-to: the same line, live

    def save(self) -> None:
        """A checkpoint of the iterations done: the adapter, the optimizer and random states, the
        flags; then `latest` points to it, and the oldest beyond --keep-checkpoints go."""
        t = self.trainer
        self.warmstart = self.folder.save(t.iteration_done, t.model, t.optimizer, t.rng, asdict(t.args),
                                          self.warmstart, t.args.keep_checkpoints)

    def show(self, line: dict) -> None:
        if self.main:
            print(progress_line(line, self.successes), flush=True)

    def close(self) -> None:
        dashboard.close(self.tracker)
        if self.eval_env is not None:
            self.eval_env.close()


# ----------------------------------------------------------------------------- what a run prints
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


def last_samples(run_dir) -> list[dict]:
    """The sample trajectories of a run folder's last logged iteration (samples.jsonl)."""
    path = Path(run_dir) / "samples.jsonl"
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [r for r in records if r["iteration"] == records[-1]["iteration"]] if records else []


def segments_table(records: list[dict]) -> str:
    """Sample trajectories as text: each step's action, reward, segment gap g and multiplier m (- where a row with
    hindsight was not scored: A = 0), so the end of a run shows where the credit went (tools/plots.py draws the same)."""
    lines = []
    for r in records:
        lines.append(f"{r['task_id'].split('/')[1] if '/' in r['task_id'] else r['task_id']}: won {r['won']}, "
                     f"R {r['reward']:+.1f}, A {r['advantage']:+.3f}")
        for k, s in enumerate(r["segments"], 1):
            g, m = ("-" if s["gap"] is None else f"{s['gap']:+.3f}"), ("-" if s["multiplier"] is None else f"{s['multiplier']:.3f}")
            lines.append(f"  step {k}  g {g:>7s}  m {m:>5s}  {s['action'] or '(invalid answer)'}")
    return "\n".join(lines)


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
