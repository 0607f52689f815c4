"""The seed-3 pilots: recipe K for 4 iterations on a seed no earlier run used, at four sampling temperatures
(SHARPO) and at the preset's (GRPO). Greedy held-out wins of 32 at iterations 2 and 4 (start 8), and after minus
start paired per game with its 95% bootstrap interval over the 32 games (one seed each).

    python results/learning-cpu/sweep/seed3/table.py   (from the repository root; writes table.json)
"""
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
from tools.compare import learned_bootstrap, won_by_game  # noqa: E402

RUNS = ("sharpo-t0.6", "grpo-t0.6", "sharpo-t0.4", "sharpo-t0.8", "sharpo-t1.0")


def main() -> None:
    start = won_by_game(json.loads((HERE.parents[1] / "eval_start_valid_seen.json").read_text()))
    out = {}
    print("| run | temperature | rollout success per iteration | groups with a win and a loss | greedy wins at 2, 4 "
          "| after - start at 4 (95% over games) |\n|---|---|---|---|---|---|")
    for run in RUNS:
        folder = HERE / run
        if not folder.is_dir():
            continue
        metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        config = json.loads((folder / "config.json").read_text())
        evals = {int(p.stem.rsplit("-", 1)[1]): won_by_game(json.loads(p.read_text()))
                 for p in sorted(folder.glob("eval_*_iter-*.json"))}
        row = {"temperature": config["temperature"], "success": [round(m["success"], 3) for m in metrics],
               "win_groups": [round(m["groups_with_win_spread"] * config["groups"]) for m in metrics],
               "wins": {it: int(sum(w.values())) for it, w in evals.items()},
               "gain_at_4": learned_bootstrap(start, {0: evals[4]}) if 4 in evals else None}
        out[run] = row
        gain = row["gain_at_4"]
        print(f"| {run} | {row['temperature']} | {', '.join(f'{s:.2f}' for s in row['success'])} | "
              f"{', '.join(map(str, row['win_groups']))} | {', '.join(str(w) for w in row['wins'].values())} | "
              + ("-" if gain is None else f"{gain[0]:+.3f} [{gain[1]:+.3f}, {gain[2]:+.3f}]") + " |")
    (HERE / "table.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
