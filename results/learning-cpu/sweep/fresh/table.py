"""Recipe K on seeds no earlier run used: 4 iterations, evaluated at 2 and 4, at four sampling temperatures
(SHARPO, seed 3) and at the preset's 0.6 (SHARPO and GRPO, seeds 3 and 4). Greedy held-out wins of 32 (start 8),
after minus start paired per game with its 95% bootstrap interval over the 32 games (one seed each), then the
preset's temperature over seeds 0-4: these fresh seeds beside recipe K's seeds 0-2 at iteration 4
(../../recipe-k/curve), paired per seed and game, the bootstrap over seeds and games.

    python results/learning-cpu/sweep/fresh/table.py   (from the repository root; writes table.json)
"""
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
from tools.compare import in_loop_evaluations, learned_bootstrap, won_by_game  # noqa: E402

CURVE = HERE.parents[1] / "recipe-k" / "curve"


def evaluations(folder: Path) -> dict[int, dict]:
    """{iteration: {game: won}} of a run's in-loop evaluations."""
    return {it: won_by_game(record) for it, record in in_loop_evaluations(folder).items()}


def fmt(boot: list[float]) -> str:
    return f"{boot[0]:+.3f} [{boot[1]:+.3f}, {boot[2]:+.3f}]"


def main() -> None:
    start = won_by_game(json.loads((HERE.parents[1] / "eval_start_valid_seen.json").read_text()))
    out, evals_of = {"runs": {}, "preset_temperature_at_4": {}}, {}
    print("| run | temperature | seed | rollout success per iteration | groups with a win and a loss | greedy wins at 2, 4 "
          "| after - start at 4 (95% over games) |\n|---|---|---|---|---|---|---|")
    for folder in sorted(p for p in HERE.iterdir() if p.is_dir()):
        metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        config = json.loads((folder / "config.json").read_text())
        evals = evals_of[folder.name] = evaluations(folder)
        row = {"algo": config["algo"], "temperature": config["temperature"], "seed": config["seed"],
               "success": [round(m["success"], 3) for m in metrics],
               "win_groups": [round(m["groups_with_win_spread"] * config["groups"]) for m in metrics],
               "wins": {it: int(sum(w.values())) for it, w in evals.items()},
               "gain_at_4": learned_bootstrap(start, {0: evals[4]})}
        out["runs"][folder.name] = row
        print(f"| {row['algo']} | {row['temperature']} | {row['seed']} | {', '.join(f'{s:.2f}' for s in row['success'])} "
              f"| {', '.join(map(str, row['win_groups']))} | {', '.join(map(str, row['wins'].values()))} "
              f"| {fmt(row['gain_at_4'])} |")
    for algo in ("sharpo", "grpo"):
        at4 = {seed: evaluations(CURVE / f"{algo}-seed{seed}")[4] for seed in (0, 1, 2)}
        at4.update({r["seed"]: evals_of[name][4] for name, r in out["runs"].items()
                    if r["algo"] == algo and r["temperature"] == 0.6})
        wins = {seed: int(sum(w.values())) for seed, w in sorted(at4.items())}
        fresh = {s: w for s, w in at4.items() if s > 2}
        row = {"wins": wins, "seeds_0_to_4": learned_bootstrap(start, at4), "fresh_seeds": learned_bootstrap(start, fresh)}
        out["preset_temperature_at_4"][algo] = row
        print(f"{algo} at temperature 0.6, iteration 4, wins per seed {wins}: after - start over seeds "
              f"{sorted(at4)} {fmt(row['seeds_0_to_4'])}; fresh seeds {sorted(fresh)} alone {fmt(row['fresh_seeds'])}")
    (HERE / "table.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
