"""Recipe K's comparison, read off its run folders: each algorithm against the placebo and against
GRPO, paired per seed and game, greedy and sampled; SHARPO's multipliers per iteration.

    python results/learning-cpu/recipe-k/contrasts.py   (from the repository root; writes contrasts.json)

summary.md (greedy) and summary_sampled.md (tools.compare's gathers, command.txt) hold each algorithm
against the start and against GRPO; this puts both measures in one table with the contrast with the
placebo, the control a claim of learning needs, and what SHARPO's multiplier did as the rollouts'
success changed.
"""
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
from tools.compare import learned_bootstrap, paired_bootstrap, won_by_game  # noqa: E402

ALGOS, SEEDS = ("sharpo", "grpo", "gigpo", "placebo"), (0, 1, 2)
MEASURES = {"greedy": ("eval_start_valid_seen.json", "eval_alfworld_valid_seen_iter-000008.json"),
            "sampled": ("eval_start_valid_seen_t0.6x4.json", "eval_valid_seen_final_t0.6x4.json")}


def wins(path: Path) -> dict | None:
    return won_by_game(json.loads(path.read_text())) if path.is_file() else None


def fmt(boot: list[float] | None) -> str:
    return "-" if boot is None else f"{boot[0]:+.3f} [{boot[1]:+.3f}, {boot[2]:+.3f}]"


out = {}
for measure, (start_file, after_file) in MEASURES.items():
    start = wins(HERE / start_file)
    after = {a: {s: w for s in SEEDS if (w := wins(HERE / f"{a}-seed{s}" / after_file))} for a in ALGOS}
    rows = {}
    for algo in ALGOS:
        if not after[algo]:
            continue
        rows[algo] = {"seeds": sorted(after[algo]),
                      "after": [sum(w.values()) / len(w) for w in after[algo].values()],
                      "minus_start": learned_bootstrap(start, after[algo]),
                      "minus_placebo": None if algo == "placebo" else paired_bootstrap(after[algo], after["placebo"]),
                      "minus_grpo": None if algo == "grpo" else paired_bootstrap(after[algo], after["grpo"])}
    out[measure] = {"start": sum(start.values()) / len(start), "rows": rows}
    print(f"{measure} held out (start {out[measure]['start']:.3f}); paired per seed and game, 95% bootstrap")
    for algo, r in rows.items():
        print(f"  {algo:8s} seeds {r['seeds']}  after {', '.join(f'{x:.3f}' for x in r['after'])}"
              f"  - start {fmt(r['minus_start'])}  - placebo {fmt(r['minus_placebo'])}  - GRPO {fmt(r['minus_grpo'])}")

out["sharpo_multiplier"] = {}
for seed in SEEDS:
    metrics_file = HERE / f"sharpo-seed{seed}" / "metrics.jsonl"
    if not metrics_file.is_file():
        continue
    lines = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    out["sharpo_multiplier"][seed] = [{k: m.get(k) for k in ("iteration", "success", "groups_with_win_spread",
                                                               "mult_mean", "mult_std", "mult_at_bound", "gap_mean")}
                                      for m in lines]
    print(f"SHARPO seed {seed}: iteration: success, share of groups with a win and a loss, multiplier mean/std/at bound")
    for m in out["sharpo_multiplier"][seed]:
        mult = "tied" if m["mult_mean"] is None else f"{m['mult_mean']:.3f}/{m['mult_std']:.3f}/{m['mult_at_bound']:.2f}"
        print(f"  {m['iteration']}: {m['success']:.2f}, {m['groups_with_win_spread']:.2f}, {mult}")
(HERE / "contrasts.json").write_text(json.dumps(out, indent=1) + "\n")
