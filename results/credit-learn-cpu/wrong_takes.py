"""The credit diagnostic's scores against one mistake: a `take` of an object the task did not ask for
(the learning set's commonest failure, results/learning-cpu/failures). Reads credit.json (tools/credit.py's
output), labels each step of the failed episodes "took a wrong object" or not, and prints, over all those
steps and over their `take` steps alone (so that what a take answer looks like is no clue), each score's AUC with its 95% interval over games, and the real teacher's AUC minus each placebo's and minus
the best no-teacher scores, paired per game (tools/credit.py's own functions).

Run from the repository root: python results/credit-learn-cpu/wrong_takes.py results/credit-learn-cpu/credit.json
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tools.credit import bootstrap_auc, paired_difference, roc_auc  # noqa: E402

SCORES = ["plan/all", "plan/action", "plan/rlsd", "other_task/all", "shuffled/all", "filler/all",
          "surprise", "length", "step_index", "invalid", "not_in_plan", "gigpo"]


def took_a_wrong_object(action: str | None, game: str) -> bool:
    asked = game.split("/")[1].split("-")[1].lower()  # <split>/<family>-<Object>-None-<Target>-<n>/<trial>
    return bool(action) and action.startswith("take ") and action.split()[1] != asked


def part(steps: dict, picked: list[int]) -> dict:
    """AUCs (interval over games) of every score for "took a wrong object" on the picked steps, and the
    real teacher's AUC minus the placebos' and some no-teacher scores', paired per game."""
    labels = [took_a_wrong_object(steps["action"][b], steps["game"][b]) for b in picked]
    games = [steps["game"][b] for b in picked]
    score = {name: [steps["scores"][name][b] for b in picked] for name in SCORES}
    out = {"steps": len(picked), "wrong_takes": sum(labels), "auc": {}, "plan_all_minus": {}}
    for name in SCORES:
        low, high = bootstrap_auc(score[name], labels, games, 1000, 0)
        out["auc"][name] = {"auc": roc_auc(score[name], labels), "low": low, "high": high}
    for other in ["other_task/all", "shuffled/all", "filler/all", "length", "not_in_plan"]:
        out["plan_all_minus"][other] = paired_difference(score["plan/all"], score[other], labels, games, 1000, 0)
    return out


def main(path: str) -> dict:
    steps = json.loads(Path(path).read_text())["steps"]
    failed = [b for b, won in enumerate(steps["won"]) if not won]
    takes = [b for b in failed if (steps["action"][b] or "").startswith("take ")]
    out = {"every step of failed episodes": part(steps, failed),
           "the take steps of failed episodes (wrong object or right one)": part(steps, takes)}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main(sys.argv[1])
