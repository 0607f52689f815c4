"""Recipe K's held-out curve: greedy held-out success at iterations 2 and 4 (and 6 for seed 0) beside the
start and iteration 8 of the comparison's runs (one folder up), for SHARPO, GRPO and GiGPO, seeds 0-2.

The comparison's runs evaluated only at iteration 8. A greedy evaluation draws no random number, so a
rerun of the same flags with `--eval-every 2` trains the very same policy and adds the points in between
(command.txt in this folder). This script checks that, and writes each run's folder here for
tools.compare's gather: the rerun's evaluations, the comparison run's metrics and evaluation of iteration
8. It refuses a rerun whose iterations differ from the comparison run's in anything but time.

    python results/learning-cpu/recipe-k/curve/compose.py RERUNS   (from the repository root)

RERUNS: the folder holding the reruns, one <algo>-seed<k> folder each.
"""
import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
COMPARISON = HERE.parent
RUNS = [f"{algo}-seed{seed}" for algo in ("sharpo", "grpo", "gigpo") for seed in (0, 1, 2)]


def what_was_learned(line: dict) -> dict:
    """A metrics line without what depends on the machine's speed or on the evaluations."""
    return {k: v for k, v in line.items() if not k.startswith(("seconds/", "eval/", "tokens_per_s"))
            and k != "peak_memory_gb"}


def main(reruns: Path) -> None:
    for name in RUNS:
        rerun, original, out = reruns / name, COMPARISON / name, HERE / name
        ran = [json.loads(line) for line in (rerun / "metrics.jsonl").read_text().splitlines()]
        full = [json.loads(line) for line in (original / "metrics.jsonl").read_text().splitlines()]
        differ = [m["iteration"] for m, k in zip(ran, full) if what_was_learned(m) != what_was_learned(k)]
        if differ or len(ran) > len(full):
            raise SystemExit(f"{name}: the rerun's iterations {differ} differ from the comparison run's")
        evals = sorted(rerun.glob("eval_*_iter-*.json"))
        out.mkdir(exist_ok=True)
        for old in out.glob("eval_*_iter-*.json"):
            old.unlink()
        for path in evals + sorted(original.glob("eval_*_iter-000008.json")):
            shutil.copy(path, out / path.name)
        shutil.copy(original / "config.json", out / "config.json")
        shutil.copy(original / "metrics.jsonl", out / "metrics.jsonl")
        its = [int(p.stem.rsplit("-", 1)[1]) for p in sorted(out.glob("eval_*_iter-*.json"))]
        print(f"{name}: rerun's {len(ran)} iterations match the comparison run's; held-out evaluations at {its}")


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        raise SystemExit("usage: python results/learning-cpu/recipe-k/curve/compose.py RERUNS_FOLDER")
    main(Path(sys.argv[1]))
