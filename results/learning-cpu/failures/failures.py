"""What the lost episodes of the learning runs did: a count over their samples.jsonl files.

An episode of the learning set (data/alfworld-learn) asks for one object; the room holds it on a
receptacle other than the target, beside distractors of other classes. For each lost episode, the
first `take` decides its kind: none, a wrong object, or the right one (then: placed, or not). For
each episode's first `take`, whether the asked-for object was in that step's observation.

Run from the repository root: python results/learning-cpu/failures/failures.py results/learning-cpu/*/samples.jsonl ...
"""
import collections
import json
import sys


def asked_object(record: dict) -> str:
    """The object the task names: <split>/<family>-<Object>-None-<Target>-<n>/<trial>."""
    return record["task_id"].split("/")[1].split("-")[1].lower()


def first_take(record: dict) -> int | None:
    """The index of the episode's first `take` step; None if it took nothing."""
    return next((i for i, s in enumerate(record["segments"]) if (s["action"] or "").startswith("take ")), None)


def kind_of(record: dict) -> str:
    actions = [s["action"] or "(invalid)" for s in record["segments"]]
    take = first_take(record)
    if take is None:
        return "took nothing"
    if actions[take].split()[1] != asked_object(record):
        return "took a wrong object first"
    final = "use " if record["task_id"].split("/")[1].startswith("look_at_obj_in_light") else "move "
    return "took the right object, then " + ("acted on it wrongly" if any(a.startswith(final) for a in actions[take + 1:])
                                               else "never used it")


def at_first_take(record: dict) -> tuple[bool, bool] | None:
    """(the right object, the object in view) at the episode's first take; None if it took nothing."""
    take = first_take(record)
    if take is None:
        return None
    step, obj = record["segments"][take], asked_object(record)
    return step["action"].split()[1] == obj, f" {obj} 1" in step["observation"].lower()


def main(paths: list[str]) -> dict:
    records = [json.loads(line) for p in paths for line in open(p)]
    lost = collections.Counter(kind_of(r) for r in records if not r["won"])
    takes = collections.Counter(at_first_take(r) for r in records)
    out = {"files": len(paths), "episodes": len(records), "won": sum(r["won"] for r in records),
           "lost_by_kind": dict(lost.most_common()),
           "first_take": {f"{'right' if k[0] else 'wrong'} object, the asked-for one {'in' if k[1] else 'not in'} view": v
                          for k, v in takes.items() if k is not None}}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
