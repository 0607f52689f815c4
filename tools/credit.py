"""Credit: does the hindsight teacher's gap point at the steps that broke (or made) an episode?

Plays groups of G episodes on held-out games with a policy (the training settings), scores every
step with the hindsight teacher and with controls, and compares each score with a label:
  - a step of a *failed* episode is a **mistake** when its answer was invalid, or (ALFWorld,
    the default label) when its action did not shorten the shortest remaining plan: the PDDL
    planner's plan from the state after the step is not shorter than from the state before.
    So a step on *any* shortest plan is no mistake. The second label is the handcoded
    expert's: a mistake is any action other than the one that expert would take.
  - a step of a *won* episode **agrees** when it is not a mistake by the same rule.
  - **blame AUC** = P(a mistake gets a higher blame score than a non-mistake), on the steps of
    failed episodes; **credit AUC** likewise with the credit score and agreement, on won ones.
    0.5 = no better than chance.
The scores (blame; credit is the same with the opposite sign of g):
  method   sharpo: the segment multiplier SHARPO applies, clip(exp(-g), 1 -+ eps_m) with
           g = mean_t (logp_teacher_t - logp_student_t) over the segment (all tokens, or
           only those inside <action>); the teacher's hindsight is the planner's shortest plan
           from the start. rlsd: the mean of its per-token multipliers. (StepOPSD's multiplier,
           2 sigmoid(-g) clipped to the same bound, is monotone in the same g too, but its clip
           binds at |g| ~ 0.41 where exp's binds at ~0.18-0.22, so it ties other steps and its
           AUC may differ: blame z = (0.30, 0.25, 0.10), labels (T, F, F), gives 0.75 with exp
           and 1.0 with 2 sigmoid. It is not scored here.)
  placebo  the same multiplier from a teacher shown a block that carries no information about
           this task: another task's plan of the closest length; the true plan shuffled; a
           filler block with as many lines.
  no teacher  the student's surprise (-mean logp_student); response length; step index; the
           invalid flag; the action is not in the plan (string match); GiGPO's -A_step;
           GRPO's constant weight (0.5 by construction).
  paired   the real teacher's AUC minus each placebo's and minus the best no-teacher score,
           with a 95% bootstrap interval, resampling whole games (all episodes of a game
           together), the same resample for both scores. The best no-teacher score is picked
           on the same steps it is then compared on, so that difference is optimistic for the
           no-teacher side and its interval leaves the pick out (the table says so).
Identical steps (same game, same outcome, same context ids, same response ids, same labels)
are scored and counted once: a small warm-started model often repeats itself exactly. The
labels are part of the key because the context shows only the last --history turns: two
copies can come from states that differ beyond it, and then they count as two steps.

Deviations from the training loop: every step of every failed episode is scored, also in
groups where all episodes failed (training gives those A = 0 and so no update): the
question here is where the teacher points, not how large the update is.

Output in --out: credit.json, roc.png and the table on stdout.

Run: python -m tools.credit --env alfworld        (CPU: the embedded SmolLM2 with the warm start, our held-out games)
     python -m tools.credit --data-dir ../alfworld_data --split valid_seen --games 16
     python -m tools.credit --model Qwen/Qwen2.5-7B-Instruct --data-dir DIR --max-steps 50 --max-new-tokens 256
"""
from __future__ import annotations

import errors  # first: a Ctrl-C or kill while the imports below load is one line

errors.quiet_start(__name__)
# isort: split

import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from advantage import grpo_advantages, segment_gap, segment_multipliers
from baselines import action_masks, gigpo_step_advantages, rlsd_multipliers
from envs.answer import history_length, history_problems
from envs.make import env_class, make_env, resolve_workers
from envs import ENVS
from eval import check_trained_data, pick_games
from infra.checkpoint import check_writable, find_checkpoint, json_safe, load_checkpoint_policy, read_config
from flags import BaselineArgs, MethodArgs, preset_defaults
from infra.cli import UserError, check_domains, choice_of, flag_type, given_flags, parse_dataclass, run, seed_problems
from infra.models import load_policy, resolve_dtype
from rollout import ModelPolicy, play_episodes
from speed import FastPath
from segments import (
    EXPERT_HEADLINE,
    Trajectory,
    build_row,
    build_teacher_row,
    format_plan,
    response_masks,
)

TEACHERS = ("plan", "other_task", "shuffled", "filler")  # the real hindsight, then the three placebos
PLACEBOS = TEACHERS[1:]
NO_TEACHER = ("surprise", "length", "step_index", "invalid", "not_in_plan", "gigpo", "grpo")


@dataclass
class CreditArgs:
    """Command-line flags of credit.py."""

    env: choice_of(ENVS) = MethodArgs.env  # environment (with --checkpoint: its run's)
    model: str | None = None  # HF id or path, "smollm2" or "tiny"; default: smollm2 without a GPU, else Qwen2.5-7B
    init_adapter: str | None = None  # warm start merged first; default: the cpu-demo preset's, for its model
    dtype: str = "auto"  # precision (train.py's --dtype: auto, bf16, fp32); a checkpoint keeps its run's
    checkpoint: str | None = None  # score with a train.py run's policy instead (a run folder or checkpoint)
    data_dir: str | None = None  # env data folder; default: the shipped data
    env_workers: int = 0  # ALFWorld: processes the episodes run in; 0 = CPU cores, capped by the batch; 1 = in-process
    split: str | None = None  # the games played; default: the env's held_out_split, games no warm start saw
    games: int = 12  # games per seed (every task type in turn); 0 = the whole split
    group_size: int = 4  # episodes per game and seed (G)
    seeds: str = "0,1,2"  # sampling seeds, comma-separated: each plays every game G times
    max_steps: int = 4  # env steps per episode (0 = the env's default)
    max_new_tokens: int = 64  # response length limit per turn
    temperature: flag_type(MethodArgs, "temperature") = 1.0  # sampling temperature, as train.py's (the log-probs use the same); cpu-learn's is 0.6
    history: str = "2"  # observation/action pairs in the prompt
    eps_m: flag_type(MethodArgs, "eps_m") = MethodArgs.eps_m  # multiplier bound eps_m (train.py's default)
    gigpo_gamma: flag_type(BaselineArgs, "gigpo_gamma") = BaselineArgs.gigpo_gamma  # GiGPO's discount (for its no-teacher score)
    micro_batch_rows: int = 4  # rows per no-grad forward pass
    bootstrap: int = 1000  # bootstrap resamples for the intervals
    out: str | None = None  # output folder; default runs/credit-<env>


# ----------------------------------------------------------------------------- labels
def agrees_with_expert(action: str | None, expert: str | None) -> bool:
    """A valid action equal to the handcoded expert's (case-insensitive); a search agrees with a search."""
    if action is None or expert is None:
        return False
    a, e = action.lower().strip(), expert.lower().strip()
    return a == e or (a.startswith("search[") and e.startswith("search["))


def step_labels(trajs: list[Trajectory]) -> list[list[bool]]:
    """Per trajectory, per step: True = the step agrees with the handcoded expert (else a mistake)."""
    return [[agrees_with_expert(s.action, s.expert_action) for s in t.steps] for t in trajs]


def shortens_plan(traj: Trajectory, plans: list[list[str] | None]) -> list[bool | None]:
    """Per step: True = valid and the shortest remaining plan got shorter; False = invalid, or
    not shorter; None = the planner had no plan there (not labelled). plans: the planner's plan
    from the start and after each valid action (envs.alfworld.planner_plans)."""
    out, j = [], 0
    for step in traj.steps:
        if step.action is None:
            out.append(False)
            continue
        before, after = plans[j], plans[j + 1] if j + 1 < len(plans) else None
        out.append(None if before is None or after is None else len(after) < len(before))
        j += 1
    return out


# ----------------------------------------------------------------------------- AUC and the bootstrap
def roc_auc(scores, labels) -> float:
    """P(score of a positive > score of a negative), ties counting half (Mann-Whitney U / n_pos n_neg).
    nan when one class is empty."""
    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):  # average ranks over ties
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def roc_curve(scores, labels) -> tuple[list[float], list[float]]:
    """(false positive rates, true positive rates) at every threshold, from (0, 0) to (1, 1)."""
    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    fpr, tpr = [0.0], [0.0]
    n_pos, n_neg = max(int(labels.sum()), 1), max(int((~labels).sum()), 1)
    for threshold in sorted(set(scores.tolist()), reverse=True):
        above = scores >= threshold
        fpr.append(float((above & ~labels).sum() / n_neg))
        tpr.append(float((above & labels).sum() / n_pos))
    return fpr, tpr


def cluster_resamples(cluster_of, n: int, seed: int) -> list[np.ndarray]:
    """n bootstrap resamples of row indices, drawing whole clusters (games) with replacement."""
    cluster_of = np.asarray(cluster_of)
    clusters = np.unique(cluster_of)
    if len(clusters) == 0:
        return []
    rows_of = {c: np.flatnonzero(cluster_of == c) for c in clusters}
    rng = np.random.default_rng(seed)
    return [np.concatenate([rows_of[c] for c in rng.choice(clusters, size=len(clusters), replace=True)])
            for _ in range(n)]


def interval(values: list[float]) -> tuple[float, float]:
    """95% percentile interval of the finite values (nan, nan when there are none)."""
    values = [v for v in values if v == v]
    if not values:
        return float("nan"), float("nan")
    return float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))


def bootstrap_auc(scores, labels, cluster_of, n: int, seed: int) -> tuple[float, float]:
    """95% percentile interval of the AUC, resampling whole clusters (trajectories or games)."""
    scores, labels = np.asarray(scores, float), np.asarray(labels, bool)
    return interval([roc_auc(scores[r], labels[r]) for r in cluster_resamples(cluster_of, n, seed)])


def paired_difference(a, b, labels, cluster_of, n: int, seed: int) -> dict:
    """AUC(a) - AUC(b) on the same steps, with a 95% interval from the same cluster resamples for both."""
    a, b, labels = np.asarray(a, float), np.asarray(b, float), np.asarray(labels, bool)
    diffs = [roc_auc(a[r], labels[r]) - roc_auc(b[r], labels[r]) for r in cluster_resamples(cluster_of, n, seed)]
    low, high = interval(diffs)
    return {"diff": roc_auc(a, labels) - roc_auc(b, labels), "low": low, "high": high}


# ----------------------------------------------------------------------------- scores
def step_scores(logp_student: torch.Tensor, logp_teachers: dict[str, torch.Tensor], response_mask: torch.Tensor,
                action_mask: torch.Tensor, sign: torch.Tensor, eps_m: float) -> dict[str, torch.Tensor]:
    """Every teacher score of every step, oriented so that higher = more weight on that step,
    from advantage.py's own functions (METHOD.md sections 3-4).

    logp_student (B, T) and each logp_teachers[name] (B, T): log-probs of the sampled tokens;
    response_mask (B, T): True on the segment's tokens; action_mask (B, T): tokens inside
    <action> (the whole response where there is none); sign (B,): -1 on steps of failed episodes (blame), +1 on won ones (credit), which is
    all of A that the multiplier reads. Returns, (B,) each: "<teacher>/all" and "<teacher>/action"
    (SHARPO's segment multiplier, the gap over those tokens), "<teacher>/rlsd" (the mean of RLSD's
    per-token multipliers) and "<teacher>/gap" (g itself, all tokens)."""
    out = {}
    for name, logp_teacher in logp_teachers.items():
        for tokens, mask in (("all", None), ("action", action_mask)):
            gaps = segment_gap(logp_teacher, logp_student, response_mask, mask)  # (B,)
            out[f"{name}/{tokens}"] = segment_multipliers(sign, gaps, eps_m)  # (B,)
            if tokens == "all":
                out[f"{name}/gap"] = gaps  # (B,)
        per_token = rlsd_multipliers(sign, logp_teacher, logp_student, eps_m)  # (B, T)
        out[f"{name}/rlsd"] = (per_token * response_mask).sum(1) / response_mask.sum(1).clamp(min=1)  # (B,)
    return out


def auc_table(data: dict, n_boot: int, seed: int = 0) -> dict:
    """AUC of every score under both labels, for blame (failed episodes) and credit (won ones),
    with game-bootstrap intervals, and the paired differences of the real teacher.

    data: per step (one entry each, lists of equal length): "game", "won", "label" (planner
    label, None = unlabelled), "label_expert" (handcoded label), and "scores": {name: list},
    each oriented as a blame score on failed steps and a credit score on won ones."""
    won = np.asarray(data["won"], bool)
    table = {"scores": {}, "paired": {}, "counts": {}}
    for part, in_part in (("blame", ~won), ("credit", won)):
        for label_key in ("label", "label_expert"):
            lab = [data[label_key][b] for b in range(len(won))]
            idx = [b for b in range(len(won)) if in_part[b] and lab[b] is not None]
            # blame: a mistake is a positive; credit: an agreeing step is
            positives = [(not lab[b]) if part == "blame" else bool(lab[b]) for b in idx]
            games = [data["game"][b] for b in idx]
            table["counts"][f"{part}/{label_key}"] = {"steps": len(idx), "positives": int(sum(positives)),
                                                       "games": len(set(games))}
            for name, values in data["scores"].items():
                s = [values[b] for b in idx]
                low, high = bootstrap_auc(s, positives, games, n_boot, seed)
                table["scores"].setdefault(name, {})[f"{part}/{label_key}"] = {
                    "auc": roc_auc(s, positives), "low": low, "high": high}
            if label_key != "label":
                continue
            real = [data["scores"]["plan/all"][b] for b in idx]
            free = {n: roc_auc([data["scores"][n][b] for b in idx], positives) for n in NO_TEACHER}
            best = max((n for n in free if free[n] == free[n]), key=lambda n: free[n], default="surprise")
            for other in [f"{p}/all" for p in PLACEBOS] + [best]:
                table["paired"][f"{part}/plan/all - {other}"] = paired_difference(
                    real, [data["scores"][other][b] for b in idx], positives, games, n_boot, seed)
    return table


# ----------------------------------------------------------------------------- hindsight blocks
def placebo_plans(plans: dict[str, list[str]], seed: int) -> dict[str, dict[str, list[str]]]:
    """For each task: its own plan and the three placebos (another task's plan of the closest
    length, ties to the next task in order; the plan shuffled, never left in order when it has
    two distinct steps; filler lines, as many as the plan has)."""
    rng = random.Random(seed)
    tasks = sorted(plans)
    out = {}
    for k, task in enumerate(tasks):
        plan = plans[task]
        others = [t for t in tasks[k + 1 :] + tasks[:k]]
        other = min(others, key=lambda t: abs(len(plans[t]) - len(plan))) if others else task
        shuffled = list(plan)
        while len(set(plan)) > 1 and shuffled == plan:
            rng.shuffle(shuffled)
        out[task] = {"plan": plan, "other_task": plans[other], "shuffled": shuffled,
                     "filler": ["(step withheld)"] * len(plan)}
    return out


# ----------------------------------------------------------------------------- play and score
def load(args: CreditArgs):
    """(model, tokenizer, env) with the settings of a training run; an unset --split becomes the
    env's held-out split."""
    args.split = args.split or held_out_split(args.env)
    if args.checkpoint:
        model, tokenizer = load_checkpoint_policy(find_checkpoint(args.checkpoint))
    else:
        name = args.model or ("smollm2" if not torch.cuda.is_available() else None)
        demo = preset_defaults("cpu-demo", args.env)[1]  # the CPU demo's model, its warm start and LoRA
        init = args.init_adapter
        if init is None and name == demo["model"]:
            init = demo.get("init_adapter")
        model, tokenizer = load_policy(name, init_adapter=None if init in (None, "none") else init,
                                       lora_r=demo["lora_r"], lora_alpha=demo["lora_alpha"], dtype=args.dtype)
    model.eval()
    workers = resolve_workers(args.env_workers, args.games * args.group_size if args.games else 8)
    env = make_env(args.env, data_dir=args.data_dir, max_steps=args.max_steps, workers=workers)
    return model, tokenizer, env


def held_out_split(env: str) -> str:
    """--split's default: the env's split of games no shipped warm start saw, else its evaluation split."""
    cls = env_class(env)
    return cls.held_out_split or cls.default_eval_split


def hindsight_plans(env, games: list[str]) -> dict[str, list[str]]:
    """The real hindsight of each game: an env's planner's shortest plan from the start (ALFWorld's:
    the same source as the label), else the env's expert plan."""
    plans = {g: env.planner_plans(g, []) for g in games}
    return {g: ((p[0] or []) if p is not None else env.expert_plan(g)) for g, p in plans.items()}


def planner_labels(env, trajs: list[Trajectory]) -> list[list[bool | None]] | None:
    """shortens_plan for every step of every trajectory (the env's planner replays its valid actions);
    None for an env without a planner."""
    plans = [env.planner_plans(t.task_id, t.actions) for t in trajs]
    if any(p is None for p in plans):
        return None
    return [shortens_plan(t, p) for t, p in zip(trajs, plans)]


def score_steps(model, tokenizer, trajs: list[Trajectory], blocks: dict, labels: list[list[bool | None]],
                args: CreditArgs) -> dict:
    """One entry per distinct step (see auc_table's data): the labels, every teacher's and every
    no-teacher score. blocks: placebo_plans' output for the trajectories' tasks."""
    rewards = torch.tensor([t.reward for t in trajs])  # (N,)
    adv = grpo_advantages(rewards, torch.tensor([t.group for t in trajs]))  # (N,)
    steps = [(i, k, s) for i, t in enumerate(trajs) for k, s in enumerate(t.steps)]
    step_adv, _ = gigpo_step_advantages(torch.tensor([s.reward for _, _, s in steps]),
                                        torch.tensor([i for i, _, _ in steps]),
                                        [trajs[i].group for i, _, _ in steps], [s.anchor for _, _, s in steps],
                                        args.gigpo_gamma)  # (B_all,)
    expert_labels = step_labels(trajs)
    seen, keep = {}, []
    for b, (i, k, s) in enumerate(steps):  # identical steps count once
        key = (trajs[i].task_id, trajs[i].won, tuple(s.prompt_ids), tuple(s.response_ids), labels[i][k],
               expert_labels[i][k])  # one key, one label: copies from states the context cannot tell apart stay two
        if key not in seen:
            seen[key] = b
            keep.append(b)
    steps_kept = [steps[b] for b in keep]
    rows = [build_row(tokenizer, s.messages, s.response_ids) for _, _, s in steps_kept]
    T = max(len(r.response_ids) for r in rows)
    lengths = torch.tensor([len(r.response_ids) for r in rows])  # (B,)
    response_mask = response_masks(lengths, T)  # (B, T) True on the response, False on padding
    action_mask = action_masks(tokenizer, rows, T)[0]  # (B, T) tokens inside <action> (none: the whole response)
    fast = FastPath(tokenizer.pad_token_id, args.micro_batch_rows)
    logp_student = fast.pass_logprobs(model, rows=rows, T=T, temperature=args.temperature, desc="student")  # (B, T)
    logp_teachers = {}
    for name in TEACHERS:
        teacher_rows = [build_teacher_row(tokenizer, s.messages, s.response_ids,
                                          format_plan(EXPERT_HEADLINE, blocks[trajs[i].task_id][name]))
                        for i, _, s in steps_kept]
        logp_teachers[name] = fast.pass_logprobs(model, rows=teacher_rows, T=T, temperature=args.temperature,
                                                 desc=f"teacher: {name}")  # (B, T)
    won = torch.tensor([trajs[i].won for i, _, _ in steps_kept])  # (B,)
    sign = torch.where(won, 1.0, -1.0)  # (B,) credit on won episodes, blame on failed ones
    scores = step_scores(logp_student, logp_teachers, response_mask, action_mask, sign, args.eps_m)
    surprise = -(logp_student * response_mask).sum(1) / lengths  # (B,) -mean log p of the sampled tokens
    plan_words = {t: {a.lower() for a in blocks[t]["plan"]} for t in blocks}
    not_in_plan = torch.tensor([float(s.action is None or s.action.lower() not in plan_words[trajs[i].task_id])
                                for i, _, s in steps_kept])  # (B,)
    raw = {"surprise": surprise, "length": lengths.float(),
           "step_index": torch.tensor([float(k) for _, k, _ in steps_kept]),
           "invalid": torch.tensor([float(s.action is None) for _, _, s in steps_kept]),
           "not_in_plan": not_in_plan, "gigpo": -step_adv[keep]}
    for name, value in raw.items():  # blame scores; the credit score is the opposite
        scores[name] = torch.where(won, -value, value)
    scores["grpo"] = torch.zeros(len(rows))  # GRPO's: every step of an episode alike
    expert = expert_labels
    return {"game": [trajs[i].task_id for i, _, _ in steps_kept], "won": won.tolist(),
            "episode": [i for i, _, _ in steps_kept], "step": [k for _, k, _ in steps_kept],
            "adv": [float(adv[i]) for i, _, _ in steps_kept],
            "label": [labels[i][k] for i, k, _ in steps_kept], "label_expert": [expert[i][k] for i, k, _ in steps_kept],
            "action": [s.action for _, _, s in steps_kept], "copies": len(steps) - len(keep),
            "scores": {k: v.tolist() for k, v in scores.items()}}


def gap_summary(data: dict, eps: float) -> dict:
    """The real teacher's gap g (nats per token) on mistakes and on other steps, all and action
    tokens, with the share of segments at the multiplier bound."""
    out = {}
    lab = data["label"]
    for tokens in ("gap", "all", "action"):
        values = data["scores"][f"plan/{tokens}"]
        if tokens == "gap":
            mistakes = [v for v, x in zip(values, lab) if x is False]
            others = [v for v, x in zip(values, lab) if x is True]
            out["gap_mean_mistakes"] = float(np.mean(mistakes)) if mistakes else None
            out["gap_mean_others"] = float(np.mean(others)) if others else None
            out["gap_abs_mean"] = float(np.mean(np.abs(values))) if values else None
        else:
            out[f"mult_std/{tokens}"] = float(np.std(values)) if values else None
            out[f"at_bound/{tokens}"] = float(np.mean([abs(v - 1) >= eps - 1e-6 for v in values])) if values else None
    return out


# ----------------------------------------------------------------------------- report
SCORE_ROWS = ([("method", f"plan/{t}") for t in ("all", "action", "rlsd")]
              + [("placebo", f"{p}/all") for p in PLACEBOS]
              + [("no teacher", n) for n in NO_TEACHER])


def print_table(table: dict, info: dict) -> None:
    """The AUC table as text: a column only where some AUC is defined (no won episode: no credit column), a row
    only where its score has one (the rows left out are counted), every number rounded."""
    def cell(x):
        return "n/a" if x["auc"] != x["auc"] else f"{x['auc']:.3f} [{x['low']:.2f}, {x['high']:.2f}]"

    c = table["counts"]
    print(f"\ncredit localization: {info['trajectories']} episodes ({info['won']} won) on {info['games']} games "
          f"({info['split']}), seeds {info['seeds']}; {info['steps']} distinct steps ({info['copies']} copies dropped); "
          f"model {info['model']}")
    print(f"  blame: {c['blame/label']['steps']} steps of failed episodes, {c['blame/label']['positives']} mistakes "
          f"(planner label); credit: {c['credit/label']['steps']} steps of won episodes, "
          f"{c['credit/label']['positives']} agreeing")
    columns = [(key, title) for key, title in (("blame/label", "blame AUC, planner"), ("blame/label_expert",
               "blame AUC, handcoded"), ("credit/label", "credit AUC, planner"))
               if any(table["scores"][name][key]["auc"] == table["scores"][name][key]["auc"] for _, name in SCORE_ROWS)]
    print(f"  {'kind':10s} {'score':18s} " + " ".join(f"{title:>24s}" for _, title in columns))
    left_out = 0
    for kind, name in SCORE_ROWS:
        row = table["scores"][name]
        if all(row[key]["auc"] != row[key]["auc"] for key, _ in columns):
            left_out += 1
            continue
        print(f"  {kind:10s} {name:18s} " + " ".join(f"{cell(row[key]):>24s}" for key, _ in columns))
    if left_out:
        print(f"  ({left_out} score(s) left out: undefined on these steps)")
    print("  paired differences of AUC (planner label), 95% interval over games (the best no-teacher score is picked\n"
          "  on these same steps: that difference favours it, and its interval leaves the pick out):")
    for key, d in table["paired"].items():
        if d["diff"] == d["diff"]:
            print(f"    {key:38s} {d['diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]")
    g = {k: ("n/a" if not isinstance(v, float) or v != v else f"{v:+.3f}" if k.startswith("gap_mean") else f"{v:.3f}")
         for k, v in info["gaps"].items()}
    print(f"  real teacher's gap g: mean {g['gap_mean_mistakes']} on mistakes, {g['gap_mean_others']} on other "
          f"steps, mean |g| {g['gap_abs_mean']}; multiplier std {g['mult_std/all']}, at the bound {g['at_bound/all']}")
    print("  (0.5 = chance; grpo weighs every step the same, so 0.5 is its value by construction)")


def mistakes_png(data: dict, path: Path, placebo: str = "shuffled", max_episodes: int = 3) -> list[int]:
    """One panel per failed episode (the first `max_episodes` with a labelled step): each step's multiplier
    m - 1 under the real teacher and under a placebo, side by side, the planner's mistakes marked. Returns
    the episodes drawn."""
    # deferred: matplotlib only when drawing (and its backend is set first)
    import matplotlib

    matplotlib.use("Agg")
    # deferred: matplotlib only when drawing (and its backend is set first)
    import matplotlib.pyplot as plt

    episodes = []
    for b, e in enumerate(data["episode"]):
        if not data["won"][b] and data["label"][b] is not None and e not in episodes:
            episodes.append(e)
    episodes = episodes[:max_episodes]
    fig, axes = plt.subplots(1, max(len(episodes), 1), figsize=(4 * max(len(episodes), 1), 2.8), dpi=80, squeeze=False)
    for ax, e in zip(axes[0], episodes):
        idx = sorted((b for b in range(len(data["episode"])) if data["episode"][b] == e), key=lambda b: data["step"][b])
        x = range(len(idx))
        real = [data["scores"]["plan/all"][b] - 1 for b in idx]
        fake = [data["scores"][f"{placebo}/all"][b] - 1 for b in idx]
        ax.bar([i - 0.2 for i in x], real, 0.4, label="real teacher", color="tab:blue")
        ax.bar([i + 0.2 for i in x], fake, 0.4, label=f"placebo ({placebo} plan)", color="tab:gray")
        labels = [("MISTAKE\n" if data["label"][b] is False else "") + str(data["action"][b] or "(invalid)")[:14]
                  for b in idx]
        ax.set_xticks(list(x), labels, fontsize=6, rotation=30, ha="right")
        for tick, b in zip(ax.get_xticklabels(), idx):
            tick.set_color("tab:red" if data["label"][b] is False else "black")
        ax.axhline(0, color="black", lw=0.6)
        ax.set(title=f"failed episode {e}", ylabel="blame weight m - 1")
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return episodes


def roc_png(data: dict, path: Path) -> None:
    # deferred: matplotlib only when drawing (and its backend is set first)
    import matplotlib

    matplotlib.use("Agg")
    # deferred: matplotlib only when drawing (and its backend is set first)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4))
    won = np.asarray(data["won"], bool)
    for ax, part, title in ((axes[0], "blame", "failed episodes: blame vs mistake (planner label)"),
                            (axes[1], "credit", "won episodes: credit vs agreement (planner label)")):
        idx = [b for b in range(len(won)) if (won[b] == (part == "credit")) and data["label"][b] is not None]
        positives = [(not data["label"][b]) if part == "blame" else data["label"][b] for b in idx]
        shown = SCORE_ROWS[:6] + [("no teacher", "surprise"), ("no teacher", "not_in_plan")]
        for c, (kind, name) in enumerate(shown):
            fpr, tpr = roc_curve([data["scores"][name][b] for b in idx], positives)
            ax.plot(fpr, tpr, "-" if kind == "method" else ":" if kind == "placebo" else "--", color=f"C{c}",
                    label=f"{kind}: {name}")
        ax.plot([0, 1], [0, 1], color="grey", lw=0.8)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
    axes[1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ----------------------------------------------------------------------------- main
def play(model, tokenizer, env, games: list[str], args: CreditArgs, seeds: list[int]) -> list[Trajectory]:
    """Every game G times per seed; each (seed, game) is its own group."""
    trajs = []
    for seed in seeds:
        torch.manual_seed(seed)
        policy = ModelPolicy(model, tokenizer, args.max_new_tokens, temperature=args.temperature)
        task_ids = [g for g in games for _ in range(args.group_size)]
        groups = [seed * 10_000 + k for k in range(len(games)) for _ in range(args.group_size)]
        trajs += play_episodes(env, task_ids, policy, history_length(args.history), groups, desc=f"seed {seed}")
    return trajs


def main(argv: list[str] | None = None) -> dict:
    args = parse_dataclass(CreditArgs, argv, description=__doc__)
    args.dtype = resolve_dtype(args.dtype, "cuda" if torch.cuda.is_available() else "cpu", args.model or "smollm2")  # credit.json says which ran
    problems = check_domains(args, positive=("group_size", "max_new_tokens", "bootstrap", "micro_batch_rows"),
                             non_negative=("games", "max_steps"))
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        seeds = []
    if not seeds:
        problems.append(f"--seeds must be comma-separated integers; got {args.seeds!r}")
    problems += seed_problems("--seeds", seeds)
    data_of_run = False
    if args.checkpoint is not None:  # a run's policy plays its run's env (and data), as in eval.py
        trained = read_config(find_checkpoint(args.checkpoint))  # no config.json: one line, here
        given, _ = given_flags(CreditArgs, sys.argv[1:] if argv is None else argv)
        if "env" in given and given["env"] != trained["env"]:
            raise UserError(f"{args.checkpoint} was trained on {trained['env']}: drop --env (it defaults to the "
                            f"checkpoint's) or pass --env {trained['env']}")
        for flag in ("model", "init_adapter"):
            if flag in given:
                problems.append(f"--{flag.replace('_', '-')} and --checkpoint: the checkpoint names its own base "
                                f"model and warm start; drop --{flag.replace('_', '-')}")
        args.env = trained["env"]
        data_of_run = args.data_dir is None
        if data_of_run and isinstance(trained.get("data_dir"), str):
            args.data_dir = trained["data_dir"]
    args.split = args.split or held_out_split(args.env)
    splits = env_class(args.env).splits
    if args.split not in splits:  # before the model loads
        problems.append(f"--split for {args.env} must be one of {', '.join(splits)}; got {args.split!r}")
    problems += history_problems(args.history)
    if problems:
        raise UserError("; ".join(problems))
    out = Path(args.out or f"runs/credit-{args.env}")
    for name in ("credit.json", "roc.png"):  # before any game: a folder that cannot take them costs nothing
        check_writable(out / name)
    t0 = time.perf_counter()
    model, tokenizer, env = load(args)
    if data_of_run:
        check_trained_data(find_checkpoint(args.checkpoint), env, args.data_dir)
    try:
        games = pick_games(env, args.split, args.games)
        plans = hindsight_plans(env, games)
        trajs = play(model, tokenizer, env, games, args, seeds)
    finally:
        env.close()
    blocks = placebo_plans(plans, seed=0)
    labels = planner_labels(env, trajs) or step_labels(trajs)  # the planner's, else the expert's
    data = score_steps(model, tokenizer, trajs, blocks, labels, args)
    table = auc_table(data, args.bootstrap)
    info = {"trajectories": len(trajs), "won": sum(t.won for t in trajs), "games": len(games), "split": args.split,
            "seeds": args.seeds, "steps": len(data["won"]), "copies": data["copies"],
            "model": args.checkpoint or args.model or "smollm2", "gaps": gap_summary(data, args.eps_m),
            "seconds": time.perf_counter() - t0}
    out.mkdir(parents=True, exist_ok=True)
    roc_png(data, out / "roc.png")
    (out / "credit.json").write_text(json.dumps(json_safe(
        {"config": asdict(args), "info": info, "table": table, "steps": data}), indent=1))
    print_table(table, info)
    print(f"wrote {out / 'credit.json'} and {out / 'roc.png'} ({info['seconds']:.0f} s)")
    return table


if __name__ == "__main__":
    run(main)
