"""Which of the start's greedy wins the runs keep: the start's greedy outcome of each held-out game beside
its sampled share (4 episodes at temperature 0.6) and the number of the 9 runs (SHARPO, GRPO, GiGPO x seeds
0-2) that win it greedily at each evaluated iteration, plus, per run, the start's wins it lost and the games
it gained by each iteration.

A greedy win is the one path of argmaxes; where the start wins a game greedily but loses it most of the time
when sampled, its greedy path wins by a near tie, and any update (a placebo's too) may break it.

    python results/learning-cpu/recipe-k/curve/fragile.py   (from the repository root; writes fragile.json)
"""
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
from tools.compare import in_loop_evaluations, won_by_game  # noqa: E402

RUNS = [f"{algo}-seed{seed}" for algo in ("sharpo", "grpo", "gigpo") for seed in (0, 1, 2)]


def main() -> None:
    start = won_by_game(json.loads((HERE / "eval_start_valid_seen.json").read_text()))
    sampled = won_by_game(json.loads((HERE.parent / "eval_start_valid_seen_t0.6x4.json").read_text()))
    evals = {run: {it: won_by_game(record) for it, record in in_loop_evaluations(HERE / run).items()} for run in RUNS}
    iterations = sorted(set.intersection(*[set(e) for e in evals.values()]))
    games = sorted(start, key=lambda g: (-start[g], -sampled[g], g))
    per_game = {g: {"start_greedy": bool(start[g]), "start_sampled": sampled[g],
                    "runs_winning": {it: sum(bool(evals[r][it][g]) for r in RUNS) for it in iterations}} for g in games}
    per_run = {r: {it: {"lost": sorted(g for g in games if start[g] and not evals[r][it][g]),
                        "gained": sorted(g for g in games if not start[g] and evals[r][it][g])} for it in iterations}
               for r in RUNS}
    print(f"| game | start greedy | start sampled (t 0.6 x 4) | runs of 9 winning at iterations {iterations} |")
    print("|---|---|---|---|")
    for g, row in per_game.items():
        print(f"| {g.split('/')[1]} | {'won' if row['start_greedy'] else '-'} | {row['start_sampled']:.2f} | "
              + ", ".join(str(row["runs_winning"][it]) for it in iterations) + " |")
    for it in iterations:
        lost = [len(per_run[r][it]["lost"]) for r in RUNS]
        gained = [len(per_run[r][it]["gained"]) for r in RUNS]
        print(f"iteration {it}: start's wins lost per run {lost}, games gained per run {gained}")
    (HERE / "fragile.json").write_text(json.dumps({"runs": RUNS, "iterations": iterations, "games": per_game,
                                                   "per_run": per_run}, indent=1) + "\n")


if __name__ == "__main__":
    main()
