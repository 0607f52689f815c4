"""Recipe K's held-out curve, iteration by iteration: greedy wins of 32 per run, each algorithm's gain over
the start and its difference to GRPO, paired per seed and game (95% bootstrap over seeds and games), at
every iteration all three seeds were evaluated.

    python results/learning-cpu/recipe-k/curve/by_iteration.py   (from the repository root; writes by_iteration.json)
"""
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
from tools.compare import in_loop_evaluations, learned_bootstrap, paired_bootstrap, won_by_game  # noqa: E402

ALGOS, SEEDS = ("sharpo", "grpo", "gigpo"), (0, 1, 2)


def fmt(boot: list[float] | None) -> str:
    return "-" if boot is None else f"{boot[0]:+.3f} [{boot[1]:+.3f}, {boot[2]:+.3f}]"


def main() -> None:
    start = won_by_game(json.loads((HERE / "eval_start_valid_seen.json").read_text()))
    won = {}  # (algo, seed) -> {iteration: {game: won}}
    for algo in ALGOS:
        for seed in SEEDS:
            won[(algo, seed)] = {it: won_by_game(record)
                                 for it, record in in_loop_evaluations(HERE / f"{algo}-seed{seed}").items()}
    iterations = sorted(set.intersection(*[set(by_it) for by_it in won.values()]))
    out = {"iterations": iterations, "wins": {}, "after_minus_start": {}, "minus_grpo": {}}
    print("| algo | wins of 32 per seed at iterations " + ", ".join(map(str, [0, *iterations]))
          + " | after - start | minus GRPO |\n|---|---|---|---|")
    for algo in ALGOS:
        at = {it: {seed: won[(algo, seed)][it] for seed in SEEDS} for it in iterations}
        grpo = {it: {seed: won[("grpo", seed)][it] for seed in SEEDS} for it in iterations}
        wins = {it: [int(sum(at[it][s].values())) for s in SEEDS] for it in iterations}
        gain = {it: learned_bootstrap(start, at[it]) for it in iterations}
        vs = {it: None if algo == "grpo" else paired_bootstrap(at[it], grpo[it]) for it in iterations}
        out["wins"][algo], out["after_minus_start"][algo], out["minus_grpo"][algo] = wins, gain, vs
        print(f"| {algo} | {int(sum(start.values()))}; " + "; ".join(", ".join(map(str, wins[it])) for it in iterations)
              + " | " + "; ".join(f"it {it}: {fmt(gain[it])}" for it in iterations)
              + " | " + "; ".join(f"it {it}: {fmt(vs[it])}" for it in iterations) + " |")
    (HERE / "by_iteration.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
