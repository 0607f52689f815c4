"""Compare: learning curves of several --algo values over several seeds, with 95% intervals.

Runs `train.py` once per (algorithm, seed) with otherwise identical flags (the flags after
`--`), each in OUT/<algo>-seed<k>; the same seed draws the same tasks for every algorithm (the
task sampler is seeded by --seed alone). A finished run is not rerun, a killed one is resumed,
so the command can be repeated until everything is done; runs start seed by seed (every
algorithm of seed 0, then of seed 1, ...), so a set stopped halfway still compares like with
like. Then it gathers the run folders and
writes into OUT:
  curves.png    success, mean reward, invalid rate and groups with spread per iteration:
                the mean over seeds, with a 95% t-interval band, one colour per algorithm
  summary.md    the table below, as Markdown;  summary.json  the same numbers
Summary, per algorithm (mean over seeds, 95% t-interval over seeds):
  final_success   mean rollout success over the last --final-window iterations of a run
  auc_success     mean rollout success over all iterations (area under the curve / iterations)
  eval_success    the last greedy evaluation's success, when the runs evaluated
  s_per_iter      wall seconds per iteration;  time_vs_grpo  s_per_iter / GRPO's
  train_rise      the training success (rollouts, on the games the run trains on) of the last 2
                  iterations, averaged, minus that of iteration 1 (played by the starting policy)
  train_rise_boot the same from each task's success (metrics' task_wins), with a 95% bootstrap
                  interval over seeds and tasks (both resampled)
  invalid_change  the invalid-answer rate of the last 2 iterations minus iteration 1's
  rise_vs_<control>_boot  train_rise minus the control's (placebo, placebo-sharpo), paired per seed
                  and task (the same bootstrap): the interval a claim that the reward did it needs
With --eval-split, each finished run's last checkpoint and the policy every run started from
are evaluated greedily with eval.py on that split (all its games, --eval-max-steps each; a run's
own evaluation of its last iteration, `--eval-every`, is read instead when it played the same
games with the same limits), so the table also says whether anything learned:
  start_success   the starting policy's success (the same for every run: greedy, same start)
  held_out_after  the trained policy's success;  learned  held_out_after - start_success
  learned_boot    the same difference, paired per game, with a 95% bootstrap interval over
                  games and seeds (both resampled): the interval a claim of learning needs
  vs_grpo_boot    held_out_after minus GRPO's, paired per seed and game (the same bootstrap):
                  the interval a claim that an algorithm beats GRPO needs
  vs_placebo_boot held_out_after minus the placebo's (below), paired per seed and game over the
                  seeds both ran: the interval a claim that the reward taught anything needs
  learning.png    held-out success (start, every in-loop evaluation) and the rollout success
                  over the last 5 iterations, against iteration and against wall-clock minutes
  reach_vs_grpo   (summary.json) iterations an algorithm's mean held-out curve needs to reach
                  GRPO's final mean, over GRPO's iterations (linear between evaluations)

--eval-samples K --eval-temperature T replaces the greedy outcome of each game (one coin, which any
small change of the weights can flip) by the share of K episodes won at temperature T, and every
held-out number above by its sampled form (files eval_start_<split>_t<T>x<K>.json and
eval_<split>_final_t<T>x<K>.json; the in-loop evaluations and learning.png stay greedy).

With n seeds the interval is mean +- t_{0.975, n-1} * sd / sqrt(n): wide for 3 seeds, as it
should be. "No difference" is what overlapping intervals say.

Besides the --algo values, --algos takes `placebo`: GRPO with --shuffle-rewards, each group's
rewards handed to its episodes by chance. It updates as much as GRPO and learns nothing from
what was done, so its learned_boot is what moving the policy alone does to the held-out games,
and each algorithm's vs_placebo_boot is the control a claim of learning needs. `placebo-sharpo`
is the same control for SHARPO (--algo sharpo --shuffle-rewards).

Run: python -m tools.compare --algos sharpo,grpo --seeds 0,1,2 --out runs/compare -- --iterations 8
     python -m tools.compare --algos sharpo,grpo,gigpo --eval-split valid_seen --out runs/compare -- --iterations 4
"""
from __future__ import annotations

import errors  # first: a Ctrl-C or kill while the imports below load is one line

errors.quiet_start(__name__)
# isort: split

import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import train
from eval import IN_LOOP_RECORD  # train.py's --eval-every names, and no other
from baselines import ALGORITHMS
from infra.checkpoint import file_system_problem, find_checkpoint, read_iteration, read_json
from infra.cli import UserError, check_domains, float_in, given_flags, parse_dataclass, run, seed_problems
from envs.make import env_class

T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}  # Student t quantiles, 0.975, by degrees of freedom
CURVES = ("success", "mean_reward", "invalid_rate", "groups_with_spread")
BOOTSTRAP = 2000  # resamples of learned_boot
BASELINE = "grpo"  # the algorithm the others are compared with: time, the held-out curve, the paired bootstrap
LABELS = {BASELINE: "GRPO"}  # how the summary's columns name it
CONTROLS = {"placebo": ["--algo", BASELINE, "--shuffle-rewards"],  # runs that are not an --algo: their train.py flags
            "placebo-sharpo": ["--algo", "sharpo", "--shuffle-rewards"]}
RISE_WINDOW = 2  # train_rise: the mean of the last 2 iterations' training success minus the first's


@dataclass
class CompareArgs:
    """Command-line flags of compare.py (train.py's flags go after `--`)."""

    algos: str = "sharpo,grpo"  # comma-separated --algo values, placebo (GRPO on shuffled rewards), placebo-sharpo
    seeds: str = "0,1,2"  # comma-separated seeds
    out: str = "runs/compare"  # folder of the runs and of the summary
    jobs: int = 1  # runs at the same time (each with OMP_NUM_THREADS = cores / jobs)
    gather_only: bool = False  # only summarise the run folders already in --out
    final_window: int = 3  # iterations averaged into final_success
    eval_split: str = ""  # evaluate the start policy and each run's last checkpoint on this split ("" = no)
    eval_max_steps: int = 8  # env steps per evaluation episode
    eval_new_tokens: int = 64  # response length limit in the evaluation
    eval_samples: int = 1  # episodes per held-out game; > 1 samples each game that often at --eval-temperature
    eval_temperature: float_in("[0.01, 100]", also=0.0) = 0.0  # 0 = greedy; with --eval-samples, e.g. the runs' own --temperature


# ----------------------------------------------------------------------------- statistics
def t_quantile(df: int) -> float:
    """t_{0.975, df} (the nearest tabulated df at or below; 1.96 beyond 30)."""
    if df < 1:
        return float("nan")
    return T975[max(k for k in T975 if k <= df)] if df <= 30 else 1.96


def mean_interval(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high) of a 95% t-interval; the interval is the mean itself for one value."""
    n = len(values)
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    mean = sum(values) / n
    if n == 1:
        return mean, mean, mean
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def read_metrics(run: Path) -> list[dict]:
    """The metrics lines of a run folder, skipping a torn line; a line without an iteration and a
    success number (edited, or another program's) is one error naming it."""
    out = []
    path = run / "metrics.jsonl"
    if path.exists():
        for n, line in enumerate(path.read_bytes().splitlines(), 1):
            try:
                record = json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
                continue  # a line a kill cut short
            number = record.get("success") if isinstance(record, dict) else None
            if not isinstance(number, (int, float)) or isinstance(number, bool) or \
                    not isinstance(record.get("iteration"), int) or isinstance(record.get("iteration"), bool):
                raise UserError(f"{path} line {n} is not a train.py metrics line (it needs an integer "
                                "'iteration' and a number 'success'): restore the log, or delete that line")
            if "task_wins" in record and not valid_task_wins(record["task_wins"]):
                raise UserError(f"{path} line {n}: 'task_wins' should map each task to [won, played], integers "
                                "with 0 <= won <= played and played >= 1: restore the log, or delete that line")
            out.append(record)
    return out


def valid_task_wins(value) -> bool:
    """metrics' task_wins as train.py writes it: {task: [won, played]}, 0 <= won <= played, played >= 1."""
    def pair(v):
        return (isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
                and 0 <= v[0] <= v[1] and v[1] >= 1)
    return isinstance(value, dict) and all(isinstance(k, str) and pair(v) for k, v in value.items())


def run_summary(metrics: list[dict], final_window: int) -> dict:
    """The per-run numbers the module docstring defines."""
    success = [m["success"] for m in metrics]
    evals = [m["eval/success"] for m in metrics if m.get("eval/success") is not None]
    seconds = [iteration_seconds(m) for m in metrics]
    invalid = [m.get("invalid_rate") for m in metrics]
    return {"iterations": len(metrics), "final_success": sum(success[-final_window:]) / len(success[-final_window:]),
            "auc_success": sum(success) / len(success), "eval_success": evals[-1] if evals else None,
            "s_per_iter": sum(seconds) / len(seconds), "train_rise": rise(success),
            "invalid_change": rise(invalid) if None not in invalid else None}


def rise(values: list[float]) -> float | None:
    """The mean of the last RISE_WINDOW values minus the first (None for a run of too few iterations)."""
    if len(values) <= RISE_WINDOW:
        return None
    return sum(values[-RISE_WINDOW:]) / RISE_WINDOW - values[0]


def task_rise(metrics: list[dict]) -> dict[str, float] | None:
    """{task: its training success over the last RISE_WINDOW iterations minus the first's}, over the tasks
    every one of those iterations played (metrics' task_wins); None without them."""
    if len(metrics) <= RISE_WINDOW or not all(isinstance(m.get("task_wins"), dict) for m in metrics):
        return None
    first, last = metrics[0]["task_wins"], [m["task_wins"] for m in metrics[-RISE_WINDOW:]]
    tasks = [t for t in first if all(t in w for w in last)]
    rate = lambda w, t: w[t][0] / w[t][1]  # noqa: E731  (won, played)
    return {t: sum(rate(w, t) for w in last) / RISE_WINDOW - rate(first, t) for t in tasks} or None


def summarize(runs: dict[str, dict[int, list[dict]]], final_window: int, held_out: dict | None = None) -> dict:
    """{algo: {stat: [mean, low, high], "seeds": n}} over the runs that have metrics; held_out:
    {"start": success, (algo, seed): success} when the runs were evaluated (--eval-split)."""
    table = {}
    for algo, by_seed in runs.items():
        per_run = [{**run_summary(m, final_window), **held_out_summary(held_out, algo, seed)}
                   for seed, m in by_seed.items() if m]
        if not per_run:
            continue
        row = {"seeds": len(per_run), "iterations": min(r["iterations"] for r in per_run)}
        for key in ("final_success", "auc_success", "eval_success", "s_per_iter", "train_rise", "invalid_change",
                    "start_success", "held_out_after", "learned"):
            values = [r[key] for r in per_run if r[key] is not None]
            row[key] = list(mean_interval(values)) if values else None
        table[algo] = row
    if BASELINE in table:
        for row in table.values():
            row[f"time_vs_{BASELINE}"] = row["s_per_iter"][0] / table[BASELINE]["s_per_iter"][0]
    return table


def held_out_summary(held_out: dict | None, algo: str, seed: int) -> dict:
    """A run's held-out success before (the start policy) and after training, and the change."""
    if not held_out or (algo, seed) not in held_out:
        return {"start_success": None, "held_out_after": None, "learned": None}
    start, after = held_out["start"], held_out[(algo, seed)]
    return {"start_success": start, "held_out_after": after, "learned": after - start}


def learned_bootstrap(start: dict, after: dict[int, dict], n: int = BOOTSTRAP, seed: int = 0) -> list[float] | None:
    """[mean, low, high] of held-out success after minus before, paired per game: the mean over
    seeds and games of won_after - won_start, with a 95% percentile interval from resampling
    seeds and games (with replacement) together. start: {game: won}; after: {seed: {game: won}}."""
    return paired_bootstrap(after, {k: start for k in after}, n, seed)


def paired_bootstrap(a: dict[int, dict], b: dict[int, dict], n: int = BOOTSTRAP, seed: int = 0) -> list[float] | None:
    """[mean, low, high] of a's wins minus b's, paired per seed and game (a, b: {seed: {game: won}}),
    the interval from resampling seeds and games together; None when they share no seed or game."""
    seeds = sorted(k for k in a if k in b)
    games = sorted(g for g in (b[seeds[0]] if seeds else {}) if all(g in a[k] and g in b[k] for k in seeds))
    if not seeds or not games:
        return None
    diff = [[float(a[k][g]) - float(b[k][g]) for g in games] for k in seeds]  # (seeds, games)
    mean = sum(map(sum, diff)) / (len(seeds) * len(games))
    rng, stats = random.Random(seed), []
    for _ in range(n):
        ks = [rng.randrange(len(seeds)) for _ in seeds]
        gs = [rng.randrange(len(games)) for _ in games]
        stats.append(sum(diff[k][g] for k in ks for g in gs) / (len(ks) * len(gs)))
    stats.sort()
    return [mean, stats[int(0.025 * n)], stats[int(0.975 * n) - 1]]


def won_by_game(record: dict) -> dict | None:
    """{game: won} of an evaluation record (eval.py's JSON, or a run's in-loop evaluation)."""
    games = record.get("games")  # checked by evaluation_record
    return {g: float(v["won"]) for g, v in games.items()} if games is not None else None


def iteration_seconds(m: dict) -> float:
    """Wall seconds of one metrics line: its stages (seconds/env is a part of seconds/rollout)."""
    return sum(v for k, v in m.items() if k.startswith("seconds/") and k != "seconds/env" and v is not None)


def wall_minutes(metrics: list[dict]) -> list[float]:
    """Cumulative wall minutes at the end of each iteration (every stage and evaluation)."""
    total, out = 0.0, []
    for m in metrics:
        total += iteration_seconds(m)
        out.append(total / 60)
    return out


def evaluation_record(path: Path) -> dict:
    """An evaluation record (eval.py's JSON), every field compare reads checked here, where it is read: a
    JSON object whose `success` is a number, `config` an object, `games` (when there) an object giving
    each game's outcome as an object with a number `won`; else one line naming the file and the field
    (a truncated, hand-made or foreign file is no result)."""
    record = read_json(path, "an evaluation record (eval.py's JSON)")
    success = record.get("success")
    if not isinstance(success, (int, float)) or isinstance(success, bool) or not math.isfinite(success):
        raise UserError(f"{path}: 'success' should be a number, found {success!r:.40}: not an evaluation "
                        "record; move it out of the run folder, or evaluate again")
    if not isinstance(record.get("config", {}), dict):
        raise UserError(f"{path}: 'config' should be a JSON object: not an evaluation record")
    games = record.get("games", {})
    outcomes = games.values() if isinstance(games, dict) else [None]
    if not all(isinstance(g, dict) and isinstance(g.get("won"), (int, float)) and math.isfinite(g["won"])
               for g in outcomes):
        raise UserError(f"{path}: 'games' should map each game to its outcome, {{\"won\": a number, ...}}, found "
                        f"{json.dumps(games)[:40]}: not an evaluation record; move it out of the run folder, or "
                        "evaluate again")
    return record


def in_loop_evaluations(run: Path, split: str = "*") -> dict[int, dict]:
    """A run's in-loop evaluation records on `split` (eval_<env>_<split>_iter-N.json, eval.py's
    format), by iteration, in order of iteration; a copy under another name is not one of them."""
    paths = {int(m.group(1)): p for p in run.glob(f"eval_*_{split}_iter-*.json")
             if (m := IN_LOOP_RECORD.fullmatch(p.name))}
    return {it: evaluation_record(paths[it]) for it in sorted(paths)}


def eval_curve(run: Path, split: str, metrics: list[dict], start: float | None) -> list[tuple[int, float, float]]:
    """(iteration, held-out success, wall minutes) of a run: the start policy's at 0, then each
    in-loop evaluation on `split` (eval_<env>_<split>_iter-N.json)."""
    minutes = {m["iteration"]: t for m, t in zip(metrics, wall_minutes(metrics))}
    points = [(0, start, 0.0)] if start is not None else []
    for it, record in in_loop_evaluations(run, split).items():
        if it in minutes:
            points.append((it, record["success"], minutes[it]))
    return points


def at_common_iterations(curves: list[list[tuple]]) -> list[list[tuple]]:
    """Each run's held-out points (iteration first) at the iterations every run evaluated, in order of
    iteration, so that the k-th point of every run is of one iteration and a mean over seeds is a mean
    of one iteration (a seed evaluated more often keeps only those)."""
    common = set.intersection(*[{p[0] for p in c} for c in curves]) if curves else set()
    return [sorted(p for p in c if p[0] in common) for c in curves]


def reach_ratio(curves: dict[str, list[list[tuple]]]) -> dict:
    """For each algorithm: the iteration at which its mean held-out curve (over seeds, linear
    between evaluations) first reaches GRPO's final mean, divided by GRPO's last evaluated iteration."""
    def mean_curve(runs):
        return [(points[0][0], sum(p[1] for p in points) / len(points)) for points in zip(*at_common_iterations(runs))]

    if not curves.get(BASELINE):
        return {}
    grpo = mean_curve(curves[BASELINE])
    if len(grpo) < 2:
        return {}
    target, last = grpo[-1][1], grpo[-1][0]
    out = {"grpo_final_held_out": target, "grpo_iterations": last}
    for algo, runs in curves.items():
        curve, reached = mean_curve(runs), None
        for (i0, s0), (i1, s1) in zip(curve, curve[1:]):
            if s1 >= target:
                reached = i1 if s1 == s0 else i0 + (i1 - i0) * max(0.0, (target - s0) / (s1 - s0))
                break
        out[algo] = None if reached is None else reached / last
    return out


def markdown_table(table: dict) -> str:
    def cell(v):
        return "-" if v is None else f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]"

    held = any(r.get("held_out_after") for r in table.values())
    boot = any(r.get("learned_boot") for r in table.values())
    vs = [c for c in (BASELINE, "placebo") if any(r.get(f"vs_{c}_boot") for r in table.values())]
    rise = any(r.get("train_rise") for r in table.values())
    rise_vs = [c for c in CONTROLS if any(r.get(f"rise_vs_{c}_boot") for r in table.values())]
    lines = ["| algo | seeds | iterations | final success | AUC success | eval success | s / iter | time vs GRPO |"
             + (f" training rise (last {RISE_WINDOW} - first) | the same over seeds and tasks (bootstrap) |"
                " invalid-rate change |" if rise else "")
             + "".join(f" rise - {c}'s, paired (bootstrap) |" for c in rise_vs)
             + (" held-out start | held-out after | learned |" if held else "")
             + (" learned, paired over games (bootstrap) |" if boot else "")
             + "".join(f" after - {LABELS.get(c, c)}'s, paired (bootstrap) |" for c in vs),
             "|---|---|---|---|---|---|---|---|" + ("---|---|---|" if rise else "") + "---|" * len(rise_vs)
             + ("---|---|---|" if held else "") + ("---|" if boot else "") + "---|" * len(vs)]
    for algo, r in table.items():
        lines.append(f"| {algo} | {r['seeds']} | {r['iterations']} | {cell(r['final_success'])} | {cell(r['auc_success'])} | "
                     f"{cell(r['eval_success'])} | {r['s_per_iter'][0]:.0f} | {r.get('time_vs_grpo', float('nan')):.2f} |"
                     + (f" {cell(r.get('train_rise'))} | {cell(r.get('train_rise_boot'))} | {cell(r.get('invalid_change'))} |"
                        if rise else "")
                     + "".join(f" {cell(r.get(f'rise_vs_{c}_boot'))} |" for c in rise_vs)
                     + (f" {cell(r['start_success'])} | {cell(r['held_out_after'])} | {cell(r['learned'])} |" if held else "")
                     + (f" {cell(r.get('learned_boot'))} |" if boot else "")
                     + "".join(f" {cell(r.get(f'vs_{c}_boot'))} |" for c in vs))
    return "\n".join(lines) + "\n"


def curves_png(runs: dict[str, dict[int, list[dict]]], path: Path) -> None:
    """One panel per metric: mean over seeds per iteration, 95% t-interval band."""
    # deferred: matplotlib only when drawing (and its backend is set first)
    import matplotlib

    matplotlib.use("Agg")
    # deferred: matplotlib only when drawing (and its backend is set first)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(CURVES), figsize=(4 * len(CURVES), 3.2))
    for c, (algo, by_seed) in enumerate(runs.items()):
        n_iter = min((len(m) for m in by_seed.values() if m), default=0)
        if not n_iter:
            continue
        for ax, key in zip(axes, CURVES):
            stats = [mean_interval([m[i][key] for m in by_seed.values() if m and m[i].get(key) is not None])
                     for i in range(n_iter)]
            x = list(range(1, n_iter + 1))
            ax.plot(x, [s[0] for s in stats], color=f"C{c}", label=f"{algo} ({len(by_seed)} seeds)")
            ax.fill_between(x, [s[1] for s in stats], [s[2] for s in stats], color=f"C{c}", alpha=0.2)
    # deferred: matplotlib only when drawing
    from matplotlib.ticker import MaxNLocator

    for ax, key in zip(axes, CURVES):
        ax.set_title(key)
        ax.set_xlabel("iteration")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # whole iterations
    axes[0].legend(fontsize=8)
    fig.suptitle("mean over seeds, 95% t-interval band", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def learning_png(runs: dict[str, dict[int, list[dict]]], curves: dict[str, list[list[tuple]]], path: Path) -> None:
    """The learning picture: held-out greedy success (start, then each in-loop evaluation) and the
    rollout success over the last 5 iterations (`success_recent`), against iteration and against
    wall-clock minutes; mean over seeds with a 95% t-interval band, one colour per algorithm."""
    # deferred: matplotlib only when drawing (and its backend is set first)
    import matplotlib

    matplotlib.use("Agg")
    # deferred: matplotlib only when drawing (and its backend is set first)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(2, 2, figsize=(10, 6.4), sharey="row")
    for c, algo in enumerate(runs):
        series = []  # (row, [(x_iter, x_min, y) per run])
        evals = [r for r in curves.get(algo, []) if r]
        if evals:
            series.append((0, [[(p[0], p[2], p[1]) for p in r] for r in at_common_iterations(evals)]))
        rolls = [m for m in runs[algo].values() if m]
        if rolls:
            key = "success_recent" if all("success_recent" in x for m in rolls for x in m) else "success"
            series.append((1, [[(x["iteration"], t, x[key]) for x, t in zip(m, wall_minutes(m))] for m in rolls]))
        for row, per_run in series:
            n = min(len(r) for r in per_run)
            stats = [mean_interval([r[i][2] for r in per_run]) for i in range(n)]
            for col, k in ((0, 0), (1, 1)):
                x = [sum(r[i][k] for r in per_run) / len(per_run) for i in range(n)]  # minutes: mean over seeds
                ax = axes[row][col]
                ax.plot(x, [v[0] for v in stats], color=f"C{c}", marker="o" if row == 0 else None, ms=3,
                        label=f"{algo} ({len(per_run)} seeds)")
                ax.fill_between(x, [max(v[1], 0.0) for v in stats], [min(v[2], 1.0) for v in stats], color=f"C{c}",
                                alpha=0.15)  # a success rate's band stops at 0 and 1 (two seeds' t-interval is wide)
    for row, title in enumerate(("held-out success (greedy)", "rollout success, last 5 iterations")):
        axes[row][0].set_ylabel(title, fontsize=9)
        axes[row][0].set_xlabel("iteration")
        axes[row][0].xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        axes[row][1].set_xlabel("wall-clock minutes")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("mean over seeds, 95% t-interval band (cut at 0 and 1)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ----------------------------------------------------------------------------- running
def run_state(run: Path, iterations: int) -> str:
    """'done', 'partial' (resume it) or 'new'."""
    try:
        done = read_iteration(find_checkpoint(run))
    except UserError:
        return "new"
    return "done" if done >= iterations else "partial"


def launch(algo: str, seed: int, run: Path, train_flags: list[str], threads: int, state: str) -> subprocess.Popen:
    if state == "partial":
        argv = ["--resume", str(run)]
    else:  # a folder without a complete checkpoint holds nothing to resume: start it afresh
        shutil.rmtree(run, ignore_errors=True)
        argv = [*train_flags, *CONTROLS.get(algo, ["--algo", algo]), "--seed", str(seed), "--output-dir", str(run)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    log = open(run.parent / f"{run.name}.log", "a")
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve().parent.parent / "train.py"), *argv],
                            stdout=log, stderr=subprocess.STDOUT, env=env)


def stop_runs(procs: list[subprocess.Popen], signum: int) -> None:
    """Stop the runs still going: a Ctrl-C at the terminal reached them already (one process
    group), so each gets 2 s to stop by itself, then the signal compare.py got."""
    deadline = time.time() + 2
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            proc.send_signal(signum)
    for proc in procs:
        proc.wait()


def evaluated_iteration(path: Path) -> int | None:
    """The training iteration of the checkpoint an eval.py result evaluated (None: no such file or no checkpoint)."""
    if not path.is_file():
        return None
    config = evaluation_record(path).get("config", {})
    found = re.search(r"iter-(\d+)", str(config.get("checkpoint") or ""))
    return int(found.group(1)) if found else None


def in_loop_evaluation(run: Path, split: str, iteration: int, args: "CompareArgs", games: set) -> Path | None:
    """The run's own evaluation of `iteration` on `split`, when it measured what compare's would: the same
    games (`games`, the start policy's: every game of the split), greedily, one episode each, with the
    limits --eval-* asks for, of that iteration's checkpoint (its record says so, not only its name)."""
    for path in run.glob(f"eval_*_{split}_iter-{iteration:06d}.json"):
        if not IN_LOOP_RECORD.fullmatch(path.name):
            continue
        record = evaluation_record(path)
        config = record.get("config", {})
        played = record.get("games", {})  # checked by evaluation_record
        if (config.get("max_steps") == args.eval_max_steps and config.get("max_new_tokens") == args.eval_new_tokens
                and config.get("split") == split and config.get("iteration") == iteration
                and set(played) == games and all("samples" not in g for g in played.values())):
            return path
    return None


def sampled_tag(args: "CompareArgs") -> str:
    """The file-name tag of a sampled held-out evaluation ("" for the greedy one)."""
    if args.eval_samples == 1 and args.eval_temperature == 0:
        return ""
    return f"_t{args.eval_temperature:g}x{args.eval_samples}"


def evaluate(out: Path, runs_of: dict, args: CompareArgs, iterations: int) -> dict:
    """Greedy held-out evaluation records (eval.py's JSON) of the start policy and of each finished
    run's last checkpoint (eval.py in a subprocess each, all CPU threads; a result already on disk,
    or the run's own in-loop evaluation of its last iteration, is read, not recomputed)."""
    split, results, tag = args.eval_split, {}, sampled_tag(args)
    common = ["--policy", "model", "--split", split, "--max-steps", str(args.eval_max_steps),
              "--max-new-tokens", str(args.eval_new_tokens)]
    if tag:
        common += ["--temperature", str(args.eval_temperature), "--samples-per-game", str(args.eval_samples), "--seed", "0"]
    first = next((run for run in runs_of.values() if (run / "config.json").is_file()), None)
    if first is None:
        return {}
    config = read_json(first / "config.json", "the run's training flags")
    if not all(isinstance(config.get(k), str) for k in ("env", "model")):
        raise UserError(f"{first / 'config.json'} has no 'env' and 'model' of train.py's: not a run's config")
    data_dir = config.get("data_dir")
    if isinstance(data_dir, str) and not Path(data_dir).is_absolute():
        raise UserError(f"{first / 'config.json'} records --data-dir {data_dir!r}, relative to the folder its run was "
                        "started in (runs before data folders were recorded absolute): evaluate those runs with "
                        "eval.py --checkpoint RUN --data-dir THE_FOLDER, or run them again")
    common += ["--env", config["env"]]  # a run's checkpoint plays its own data (eval.py checks its digest)
    start_path = out / f"eval_start_{split}{tag}.json"
    run_eval(start_path, ["--model", config["model"], *start_flags(config), *(["--data-dir", data_dir] if data_dir else [])],
             common, "start", args)
    if not start_path.is_file():
        return {}
    results["start"] = evaluation_record(start_path)
    games, jobs = set(results["start"].get("games") or {}), {}
    for key, run_dir in runs_of.items():
        path = run_dir / f"eval_{split}_final{tag}.json"
        own = None if tag else in_loop_evaluation(run_dir, split, iterations, args, games)  # the loop's are greedy
        if own is not None:
            jobs[key] = (own, [])
        elif evaluated_iteration(path) == iterations:  # on disk, and of the last iteration's checkpoint
            jobs[key] = (path, [])
        elif run_state(run_dir, iterations) == "done" and not args.gather_only:  # an unfinished run's is not its last
            path.unlink(missing_ok=True)  # one of an earlier iteration's checkpoint: the run was extended since
            jobs[key] = (path, ["--checkpoint", str(run_dir)])
    for key, (path, which) in jobs.items():
        run_eval(path, which, common, f"{key[0]} seed {key[1]}", args)
        if path.is_file():
            results[key] = evaluation_record(path)
    return results


def start_flags(config: dict) -> list[str]:
    """eval.py's flags for the policy the runs started from, in the runs' precision (bf16 and float32 play apart)."""
    return ((["--dtype", config["dtype"]] if config.get("dtype") else [])
            + (["--init-adapter", config["init_adapter"]] if config.get("init_adapter") else []))


def run_eval(path: Path, which: list[str], common: list[str], who: str, args: "CompareArgs") -> None:
    """eval.py into `path`, unless it is there (or --gather-only)."""
    if path.is_file() or args.gather_only:
        return
    print(f"  evaluating {who} on {args.eval_split} -> {path}", flush=True)
    eval_script = Path(__file__).resolve().parent.parent / "eval.py"
    subprocess.run([sys.executable, str(eval_script), *common, *which, "--out", str(path)], check=True,
                   stdout=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    own, train_flags = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    args = parse_dataclass(CompareArgs, own, description=__doc__)
    problems = check_domains(args, positive=("jobs", "final_window", "eval_samples"))
    if args.eval_samples > 1 and args.eval_temperature == 0:
        problems.append(f"--eval-samples {args.eval_samples} would replay each greedy episode: add --eval-temperature "
                        "(e.g. the runs' --temperature)")
    algos = [a for a in args.algos.split(",") if a]
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s]
    except ValueError:
        problems.append(f"--seeds must be comma-separated integers; got {args.seeds!r}")
        seeds = []
    problems += seed_problems("--seeds", seeds)
    problems += [f"--algos: unknown algorithm {a!r} (choose from {', '.join([*ALGORITHMS, *CONTROLS])})"
                 for a in algos if a not in ALGORITHMS and a not in CONTROLS]
    given, _ = given_flags(train.TrainArgs, train_flags)  # every spelling train.py's parser takes
    for name in ("algo", "seed", "output_dir", "resume", "shuffle_rewards"):
        if name in given:
            problems.append(f"--{name.replace('_', '-')} is set by compare.py for each run; drop it after --")
    run_flags = None if problems else train.parse_args(train_flags)  # the runs' flags, as train.py resolves them
    if run_flags and args.eval_split and args.eval_split not in env_class(run_flags.env).splits:
        problems.append(f"--eval-split for {run_flags.env} must be one of {', '.join(env_class(run_flags.env).splits)}; "
                        f"got {args.eval_split!r}")
    if problems:
        raise UserError("; ".join(problems))
    out = Path(args.out)
    try:  # before any run: a folder that cannot take the results costs nothing
        out.mkdir(parents=True, exist_ok=True)
        (out / ".write-check").write_text("", encoding="utf-8")
        (out / ".write-check").unlink()
    except OSError as err:
        why = file_system_problem(err, out) or err.strerror or err
        raise UserError(f"--out {out} cannot take the results ({why}): pass another --out") from None
    runs_of = {(a, s): out / f"{a}-seed{s}" for s in seeds for a in algos}  # seed by seed: what is done compares
    if not args.gather_only:
        todo = [(key, run_state(run, run_flags.iterations)) for key, run in runs_of.items()]
        todo = [(key, state) for key, state in todo if state != "done"]
        threads = max(1, (os.cpu_count() or 1) // args.jobs)
        running: list[tuple[tuple, subprocess.Popen]] = []
        print(f"compare: {len(runs_of)} runs, {len(todo)} to (re)start, {args.jobs} at a time -> {out}")
        try:
            while todo or running:
                while todo and len(running) < args.jobs:
                    (algo, seed), state = todo.pop(0)
                    print(f"  start {algo} seed {seed} ({state}); log: {out / f'{algo}-seed{seed}.log'}", flush=True)
                    running.append(((algo, seed), launch(algo, seed, runs_of[(algo, seed)], train_flags, threads, state)))
                time.sleep(2)
                for item in [r for r in running if r[1].poll() is not None]:
                    running.remove(item)
                    (algo, seed), proc = item
                    print(f"  {'done' if proc.returncode == 0 else f'FAILED (exit {proc.returncode})'}: {algo} seed {seed}",
                          flush=True)
        except KeyboardInterrupt as err:
            stop_runs([proc for _, proc in running], signal.SIGTERM if isinstance(err, errors.Terminated) else signal.SIGINT)
            raise errors.Stopped(f"each unfinished run ({', '.join(f'{a} seed {s}' for (a, s), _ in running)}) keeps "
                                 "its last checkpoint (its log says which); the same command resumes them",
                                 isinstance(err, errors.Terminated)) from None
    runs = {a: {s: read_metrics(runs_of[(a, s)]) for s in seeds} for a in algos}
    records = evaluate(out, runs_of, args, run_flags.iterations) if args.eval_split else {}
    held_out = {k: r["success"] for k, r in records.items()} or None
    table = summarize(runs, args.final_window, held_out)
    if not table:
        raise UserError(f"no run in {out} has metrics yet")
    start_games = won_by_game(records["start"]) if "start" in records else None
    after_of = {a: {s: won_by_game(records[(a, s)]) for s in seeds if (a, s) in records} for a in table}
    for algo, after in after_of.items():
        if start_games and after and all(after.values()):
            table[algo]["learned_boot"] = learned_bootstrap(start_games, after)
        for control in (BASELINE, "placebo"):
            other = after_of.get(control) or {}
            if algo != control and after and other and all(after.values()) and all(other.values()):
                table[algo][f"vs_{control}_boot"] = paired_bootstrap(after, other)
    rises = {a: {s: task_rise(runs[a][s]) for s in seeds if runs[a][s]} for a in table}
    for algo, by_seed in rises.items():
        if by_seed and all(by_seed.values()):
            table[algo]["train_rise_boot"] = paired_bootstrap(by_seed, {k: dict.fromkeys(v, 0.0) for k, v in by_seed.items()})
        for control in CONTROLS:
            other = rises.get(control) or {}
            if algo != control and by_seed and other and all(by_seed.values()) and all(other.values()):
                table[algo][f"rise_vs_{control}_boot"] = paired_bootstrap(by_seed, other)
    curves_png(runs, out / "curves.png")
    extra = {}
    if args.eval_split:
        greedy_start = out / f"eval_start_{args.eval_split}.json"  # the in-loop curves are greedy: so is their start
        start = evaluation_record(greedy_start)["success"] if greedy_start.is_file() else None
        curves = {a: [eval_curve(runs_of[(a, s)], args.eval_split, runs[a][s], start) for s in seeds if runs[a][s]]
                  for a in algos}
        if any(len(c) > 1 for runs_c in curves.values() for c in runs_c):
            learning_png(runs, curves, out / "learning.png")
            extra = {"held_out_curves": {a: [[list(p) for p in c] for c in cs] for a, cs in curves.items()},
                     "reach_vs_grpo": reach_ratio(curves)}
    (out / "summary.md").write_text(markdown_table(table), encoding="utf-8")
    (out / "summary.json").write_text(json.dumps({"train_flags": train_flags, "algos": algos, "seeds": seeds,
                                                  "final_window": args.final_window, "eval_split": args.eval_split,
                                                  "eval_max_steps": args.eval_max_steps,
                                                  "eval_samples": args.eval_samples,
                                                  "eval_temperature": args.eval_temperature, "table": table, **extra},
                                                 indent=1))
    print(markdown_table(table))
    print(f"wrote {out / 'curves.png'}, {out / 'summary.md'}, {out / 'summary.json'}")
    return table


if __name__ == "__main__":
    run(main)
