"""A sweep of hostile inputs: crafted run folders and corrupted data sets, each run through the
real command lines, and every outcome classified. Not part of the test suite (it takes ~20
minutes); the suite tests each kind of case once, this counts them all.

A run ends well in one of two ways: exit 2 with one `error: ...` line and no traceback, or exit
0 with an unchanged task (the expert's success equal to the clean data's). Anything else (a
traceback, another exit code, a changed expert success, a marker file written by a payload)
is counted as a failure and printed.

Run: python tests/hostile_sweep.py [--out /tmp/sweep]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


class Payload:
    """Unpickling this writes a marker file: the proof that code ran."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def run(argv: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([PY, *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=ENV)


def verdict(proc: subprocess.CompletedProcess, marker: Path) -> str:
    if marker.exists():
        return "CODE RAN"
    if "Traceback" in proc.stderr:
        return "traceback"
    if proc.returncode == 0:
        return "ok"
    lines = [x for x in proc.stderr.strip().splitlines() if x.strip()]
    if proc.returncode == 2 and lines and lines[-1].startswith("error: "):
        return "one-line error"
    return f"exit {proc.returncode}"


# ----------------------------------------------------------------------------- run folders
def tiny_run(folder: Path, warm: Path | None = None) -> None:
    argv = ["train.py", "--model", "tiny", "--preset", "none", "--env", "webshop", "--iterations", "2", "--groups", "1",
            "--group-size", "2", "--max-steps", "2", "--max-new-tokens", "8", "--lora-r", "4", "--lora-alpha", "8",
            "--eval-every", "0", "--hindsight", "expert", "--keep-checkpoints", "2", "--output-dir", str(folder)]
    if warm is not None:
        argv += ["--init-adapter", str(warm)]
    proc = run(argv)
    assert proc.returncode == 0, proc.stderr[-3000:]


def json_edit(path: Path, fn) -> None:
    data = json.loads(path.read_text())
    data = fn(data) or data
    path.write_text(json.dumps(data))


def run_folder_cases(marker: Path) -> dict:
    """name -> a function(run folder) that damages it."""
    new = lambda r: r / "checkpoints" / "iter-000002"  # noqa: E731
    return {
        "adapter zeroed": lambda r: (new(r) / "adapter_model.safetensors").write_bytes(b"\0" * 100),
        "adapter truncated": lambda r: (new(r) / "adapter_model.safetensors").write_bytes(
            (new(r) / "adapter_model.safetensors").read_bytes()[:200]),
        "adapter only as .bin": lambda r: (new(r) / "adapter_model.safetensors").rename(new(r) / "adapter_model.bin"),
        "adapter .bin with a payload": lambda r: ((new(r) / "adapter_model.safetensors").unlink(),
                                                  torch.save({"x": Payload(marker)}, new(r) / "adapter_model.bin")),
        "adapter_config not JSON": lambda r: (new(r) / "adapter_config.json").write_text("{nope"),
        "adapter_config wrong types": lambda r: json_edit(new(r) / "adapter_config.json", lambda d: d.update(r="8")),
        "adapter_config not LoRA": lambda r: json_edit(new(r) / "adapter_config.json", lambda d: d.update(peft_type="IA3")),
        "adapter_config deep": lambda r: (new(r) / "adapter_config.json").write_text("[" * 100000 + "]" * 100000),
        "optimizer payload": lambda r: torch.save({"state": {}, "param_groups": [], "x": Payload(marker)},
                                                  new(r) / "optimizer.pt"),
        "optimizer structure": lambda r: torch.save({"state": {0: {"step": torch.tensor(1.0)}},
                                                     "param_groups": [{"params": [0]}]}, new(r) / "optimizer.pt"),
        "optimizer a list": lambda r: torch.save([torch.zeros(3)], new(r) / "optimizer.pt"),
        "optimizer garbage": lambda r: (new(r) / "optimizer.pt").write_bytes(os.urandom(500)),
        "rng not JSON": lambda r: (new(r) / "rng.json").write_text("]["),
        "rng wrong types": lambda r: (new(r) / "rng.json").write_text(json.dumps({"torch": "x", "python": 1})),
        "state negative": lambda r: (new(r) / "state.json").write_text(json.dumps({"iteration": -1})),
        "state a string": lambda r: (new(r) / "state.json").write_text(json.dumps({"iteration": "2"})),
        "state deep": lambda r: (new(r) / "state.json").write_text("{\"a\":" * 50000 + "1" + "}" * 50000),
        "config deep": lambda r: (new(r) / "config.json").write_text("[" * 100000 + "]" * 100000),
        "config wrong types": lambda r: json_edit(new(r) / "config.json", lambda d: d.update(lr="fast", groups=[1])),
        "config model with custom code": lambda r: (
            (r / "m").mkdir(), (r / "m" / "config.json").write_text(json.dumps({"auto_map": {"AutoConfig": "a.B"}})),
            json_edit(new(r) / "config.json", lambda d: d.update(model=str(r / "m")))),
        "config model tokenizer custom code": lambda r: (
            (r / "m").mkdir(), (r / "m" / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": ["a.B", None]}})),
            json_edit(new(r) / "config.json", lambda d: d.update(model=str(r / "m")))),
        "config model missing path": lambda r: json_edit(new(r) / "config.json", lambda d: d.update(model="/nonexistent/m")),
        "config not an object": lambda r: (new(r) / "config.json").write_text("[1, 2]"),
        "config unknown env": lambda r: json_edit(new(r) / "config.json", lambda d: d.update(env="chess")),
        "metrics not UTF-8": lambda r: (r / "metrics.jsonl").write_bytes((r / "metrics.jsonl").read_bytes() + b"\xff\xfe\n"),
        "metrics deep line": lambda r: (r / "metrics.jsonl").write_text((r / "metrics.jsonl").read_text() + "[" * 100000 + "\n"),
        "foreign iter-best": lambda r: shutil.copytree(r / "checkpoints" / "iter-000001", r / "checkpoints" / "iter-best"),
        "checkpoint symlink": lambda r: os.symlink(r / "checkpoints" / "iter-000001", r / "checkpoints" / "iter-000009"),
        "latest into another run": lambda r: ((r / "latest").unlink(), os.symlink("/tmp", r / "latest")),
        "latest a real folder": lambda r: ((r / "latest").unlink(), (r / "latest").mkdir()),
        "latest dangling": lambda r: ((r / "latest").unlink(), os.symlink("checkpoints/iter-000077", r / "latest")),
        "newest half-written": lambda r: (new(r) / "state.json").unlink(),
        "checkpoints a file": lambda r: (shutil.rmtree(r / "checkpoints"), (r / "checkpoints").write_text("x")),
        "adapter NaN": lambda r: _nan_adapter(new(r)),
        "adapter other shapes": lambda r: _other_rank(new(r)),
        "no checkpoint yet": lambda r: shutil.rmtree(r / "checkpoints"),
    }


def _nan_adapter(ckpt: Path) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(ckpt / "adapter_model.safetensors")
    save_file({k: torch.full_like(v, float("nan")) for k, v in state.items()}, ckpt / "adapter_model.safetensors")


def _other_rank(ckpt: Path) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(ckpt / "adapter_model.safetensors")
    save_file({k: torch.zeros(v.shape[0] + 1, v.shape[1]) for k, v in state.items()}, ckpt / "adapter_model.safetensors")


# ----------------------------------------------------------------------------- data sets
def alfworld_cases() -> dict:
    def game(root, k=0):
        return sorted((root / "json_2.1.1" / "train").glob("*/*"))[k]

    def every(root, fn):
        for g in sorted((root / "json_2.1.1").glob("*/*/*")):
            fn(g)

    def edit(field, value, file="game.tw-pddl", all_games=False):
        def damage(root):
            for g in ([game(root)] if not all_games else sorted((root / "json_2.1.1").glob("*/*/*"))):
                json_edit(g / file, lambda d: d.update({field: value}))
        return damage

    return {
        "pddl garbage, one game": edit("pddl_problem", "garbage"),
        "pddl garbage, every game": edit("pddl_problem", "(((", all_games=True),
        "pddl unbalanced": edit("pddl_problem", "(define (problem x) (:goal"),
        "pddl undefined object": lambda r: json_edit(game(r) / "game.tw-pddl", lambda d: d.update(
            pddl_problem=d["pddl_problem"].replace("(:init", "(:init (inReceptacle ghost1 ghost2)"))),
        "domain garbage": edit("pddl_domain", "not pddl"),
        "domain garbage, every game": edit("pddl_domain", "", all_games=True),
        "grammar garbage": edit("grammar", "}{"),
        "grammar garbage, every game": edit("grammar", "x", all_games=True),
        "walkthrough dance": edit("walkthrough", ["dance"]),
        "walkthrough a string": edit("walkthrough", "go to desk 1"),
        "walkthrough numbers": edit("walkthrough", [1, 2]),
        "solvable a string": edit("solvable", "yes"),
        "unsolvable everywhere": edit("solvable", False, all_games=True),
        "task_type unknown": edit("task_type", "juggle", file="traj_data.json"),
        "task_type missing": lambda r: json_edit(game(r) / "traj_data.json", lambda d: d.pop("task_type")),
        "pddl_params missing field": edit("pddl_params", {"object_target": "Mug"}, file="traj_data.json"),
        "pddl_params a list": edit("pddl_params", [], file="traj_data.json"),
        "traj_data not JSON": lambda r: (game(r) / "traj_data.json").write_text("{"),
        "traj_data deep": lambda r: (game(r) / "traj_data.json").write_text("[" * 100000 + "]" * 100000),
        "traj_data a list": lambda r: (game(r) / "traj_data.json").write_text("[]"),
        "game file missing": lambda r: (game(r) / "game.tw-pddl").unlink(),
        "game file not UTF-8": lambda r: (game(r) / "game.tw-pddl").write_bytes(b"\xff\xfe{}"),
        "game file empty": lambda r: (game(r) / "game.tw-pddl").write_text(""),
        "train split empty": lambda r: shutil.rmtree(r / "json_2.1.1" / "train"),
        "json_2.1.1 missing": lambda r: shutil.rmtree(r / "json_2.1.1"),
        "pddl_problem a number": edit("pddl_problem", 7),
        "every traj_data garbage": lambda r: every(r, lambda g: (g / "traj_data.json").write_text("nope")),
        "a file where a game folder goes": lambda r: ((r / "json_2.1.1" / "train" / "x").mkdir(),
                                                    (r / "json_2.1.1" / "train" / "x" / "y").write_text("no folder")),
        "walkthrough non-ASCII": edit("walkthrough", ["go to d\u00e9sk 1"]),
        "goal text garbage in grammar": lambda r: json_edit(game(r) / "game.tw-pddl", lambda d: d.update(
            grammar=d["grammar"].replace("Your task is to", "\u0000\u0001"))),
    }


def webshop_cases() -> dict:
    def items(fn):
        def damage(root):
            path = sorted(root.glob("items_shuffle*.json"))[0]
            data = json.loads(path.read_text())
            fn(data)
            path.write_text(json.dumps(data))
        return damage

    def human(fn):
        def damage(root):
            data = json.loads((root / "items_human_ins.json").read_text())
            fn(data)
            (root / "items_human_ins.json").write_text(json.dumps(data))
        return damage

    def opts(value):
        return items(lambda d: d[0].update(customization_options={"color": [{"value": value}]}))

    def first(d):
        return next(iter(d.values()))[0]

    return {
        "option non-ASCII": items(lambda d: [o.update(value="Caf\u00e9 " + o["value"]) for p in d
                                              for vs in (p.get("customization_options") or {}).values() for o in vs or []]),
        "option with brackets": items(lambda d: [o.update(value="[" + o["value"] + "]") for p in d
                                                  for vs in (p.get("customization_options") or {}).values() for o in vs or []]),
        "option named description": opts("Description"),
        "option named buy now": opts("Buy Now"),
        "option only symbols": opts("\u2014\u2014"),
        "option empty": opts("   "),
        "option a number": opts(5),
        "option group a string": items(lambda d: d[0].update(customization_options={"color": "red"})),
        "price 400 digits": items(lambda d: d[0].update(pricing="$" + "9" * 400)),
        "price negative text": items(lambda d: d[0].update(pricing="-$5")),
        "price a list": items(lambda d: d[0].update(pricing=[1, 2])),
        "price huge": items(lambda d: d[0].update(pricing="$99999999")),
        "asin lower case": items(lambda d: d[0].update(asin=d[0]["asin"].lower())),
        "asin missing": items(lambda d: d[0].pop("asin")),
        "name missing": items(lambda d: d[0].pop("name")),
        "name a number": items(lambda d: d[0].update(name=3)),
        "products an object": lambda root: sorted(root.glob("items_shuffle*.json"))[0].write_text("{}"),
        "products not JSON": lambda root: sorted(root.glob("items_shuffle*.json"))[0].write_text("[{"),
        "products deep": lambda root: sorted(root.glob("items_shuffle*.json"))[0].write_text("[" * 100000 + "]" * 100000),
        "products not UTF-8": lambda root: sorted(root.glob("items_shuffle*.json"))[0].write_bytes(b"\xff[]"),
        "attributes a string": lambda root: json_edit(sorted(root.glob("items_ins_v2*.json"))[0],
                                                      lambda d: d.update({next(iter(d)): {"attributes": "soft"}})),
        "attributes file missing": lambda root: sorted(root.glob("items_ins_v2*.json"))[0].unlink(),
        "instruction missing": human(lambda d: first(d).pop("instruction")),
        "instruction attributes a string": human(lambda d: first(d).update(instruction_attributes="red")),
        "instruction options numbers": human(lambda d: first(d).update(instruction_options=[1])),
        "instruction options non-ASCII": human(lambda d: first(d).update(
            instruction_options=["Caf\u00e9 " + o for o in first(d).get("instruction_options") or ["x"]])),
        "human goals a list": lambda root: (root / "items_human_ins.json").write_text("[]"),
        "description a number": items(lambda d: d[0].update(full_description=1)),
        "bullets numbers": items(lambda d: d[0].update(small_description=[1])),
        "category a list": items(lambda d: d[0].update(category=[])),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="work folder (default: a temporary one)")
    args = ap.parse_args()
    work = Path(args.out or tempfile.mkdtemp(prefix="sweep-"))
    work.mkdir(parents=True, exist_ok=True)
    marker = work / "pwned"
    counts, bad = {}, []

    def record(kind: str, name: str, command: str, outcome: str, detail: str = "") -> None:
        counts.setdefault(kind, {}).setdefault(outcome, 0)
        counts[kind][outcome] += 1
        ok = outcome in ("one-line error", "ok", "unchanged task")
        print(f"{'  ' if ok else '!!'} {kind:12s} {command:8s} {name:38s} {outcome} {detail}", flush=True)
        if not ok:
            bad.append((kind, name, command, outcome, detail))

    base = work / "base"
    if not base.exists():
        tiny_run(base)
    for name, damage in run_folder_cases(marker).items():
        folder = work / "runs" / name.replace(" ", "_")
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(base, folder, symlinks=True)
        damage(folder)
        for command, argv in (("resume", ["train.py", "--resume", str(folder), "--iterations", "3"]),
                              ("eval", ["eval.py", "--policy", "model", "--checkpoint", str(folder), "--env", "webshop",
                                        "--num-games", "1", "--max-steps", "2", "--max-new-tokens", "8"])):
            proc = run(argv)
            record("run folder", name, command, verdict(proc, marker), (proc.stderr.strip().splitlines() or [""])[-1][:110])

    clean = {}
    for env, cases, source in (("alfworld", alfworld_cases(), ROOT / "data" / "alfworld"),
                               ("webshop", webshop_cases(), ROOT / "data" / "webshop")):
        split = "train"
        proc = run(["eval.py", "--env", env, "--policy", "expert", "--split", split, "--env-workers", "1",
                    "--out", str(work / f"clean-{env}.json")])
        assert proc.returncode == 0, proc.stderr[-2000:]
        clean[env] = json.loads((work / f"clean-{env}.json").read_text())["success"]
        for name, damage in cases.items():
            root = work / "data" / env / name.replace(" ", "_")
            shutil.rmtree(root, ignore_errors=True)
            shutil.copytree(source, root)
            damage(root)
            out = work / "data" / env / (name.replace(" ", "_") + ".json")
            proc = run(["eval.py", "--env", env, "--policy", "expert", "--split", split, "--data-dir", str(root),
                        "--env-workers", "1", "--out", str(out)])
            outcome = verdict(proc, marker)
            if outcome == "ok":
                success = json.loads(out.read_text())["success"]
                outcome = "unchanged task" if success == clean[env] else f"success {clean[env]:.2f} -> {success:.2f}"
            record(f"{env} data", name, "eval", outcome, (proc.stderr.strip().splitlines() or [""])[-1][:110])
            proc = run(["train.py", "--model", "tiny", "--preset", "none", "--env", env, "--data-dir", str(root),
                        "--iterations", "1", "--groups", "1", "--group-size", "2", "--max-steps", "2",
                        "--max-new-tokens", "8", "--lora-r", "4", "--lora-alpha", "8", "--eval-every", "0",
                        "--env-workers", "1", "--output-dir", str(root) + "-run"])
            record(f"{env} data", name, "train", verdict(proc, marker), (proc.stderr.strip().splitlines() or [""])[-1][:110])

    print("\ncounts:")
    for kind, by in counts.items():
        print(f"  {kind:14s} " + ", ".join(f"{k}: {v}" for k, v in sorted(by.items())))
    print(f"failures: {len(bad)}; code executions: {int(marker.exists())}")
    (work / "sweep.json").write_text(json.dumps({"counts": counts, "failures": bad}, indent=1))
    sys.exit(1 if bad or marker.exists() else 0)


if __name__ == "__main__":
    main()
