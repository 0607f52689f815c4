"""A sweep of hostile inputs: crafted run folders and corrupted data sets, signals, a full disk,
two writers on one run folder and flags at their edges, each through the real command lines, and
every outcome classified. Not part of the test suite (it takes ~30 minutes); the suite tests each
kind of case once, this counts them all.

A case ends well in one of these ways: exit 2 with one `error: ...` line and no traceback; exit
0 with an unchanged task (the expert's success equal to the clean data's); for a signal, exit 130
or 143 with one line saying what was kept, then a resume that ends with the uninterrupted run's
weights and metrics; for a full disk, one line, `latest` intact, and the same resume once space
is freed; for two writers, one refused with one line and the other's run intact. Anything else
(a traceback, another exit code, a hang, a changed task or result, a lost checkpoint, a marker
file written by a payload) is counted as a failure and printed.

Signals, a full disk and two writers train the tiny model on the scripted env of the tests (its
reward depends on the sampled text, so the weights move and "the same weights" means something),
through `infra.cli.run` as train.py's own main does. The full disk is a small tmpfs (needs root;
those cases are skipped with a line otherwise).

Run: python tests/hostile_sweep.py [--out /tmp/sweep] [--only signals,disk,writers,flags,folders,data,round4,round5,round6,round7]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

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
        # round four: well-formed files that are not what they claim
        "adapter without lora_B": lambda r: _edit_adapter(new(r), lambda s: {k: v for k, v in s.items() if "lora_B" not in k}),
        "adapter tensors renamed": lambda r: _edit_adapter(new(r), lambda s: {k.replace("lora_A", "lora_X"): v
                                                                               for k, v in s.items()}),
        "adapter an empty file": lambda r: _edit_adapter(new(r), lambda s: {}),
        "optimizer exp_avg shape": lambda r: _edit_optimizer(new(r), lambda s: s["state"][0].update(exp_avg=torch.zeros(7))),
        "optimizer lr a string": lambda r: _edit_optimizer(new(r), lambda s: s["param_groups"][0].update(lr="fast")),
        "rng out of range": lambda r: json_edit(new(r) / "rng.json", lambda d: d["python"][1].__setitem__(0, 2**40)),
        "rng negative": lambda r: json_edit(new(r) / "rng.json", lambda d: d["torch"].__setitem__(0, -3)),
        "metrics line without success": lambda r: (r / "metrics.jsonl").write_text('{"iteration": 2}\n'),
        "metrics success a string": lambda r: (r / "metrics.jsonl").write_text('{"iteration": 2, "success": "high"}\n'),
        "state ahead of its folder": lambda r: (new(r) / "state.json").write_text(json.dumps({"iteration": 7})),
        "config without lr": lambda r: json_edit(new(r) / "config.json", lambda d: d.pop("lr")),
        "config without algo": lambda r: json_edit(new(r) / "config.json", lambda d: d.pop("algo")),
        "config.json a FIFO": lambda r: ((new(r) / "config.json").unlink(), os.mkfifo(new(r) / "config.json")),
        "metrics.jsonl a FIFO": lambda r: ((r / "metrics.jsonl").unlink(), os.mkfifo(r / "metrics.jsonl")),
    }


def _edit_adapter(ckpt: Path, fn) -> None:
    from safetensors.torch import save_file

    save_file(fn(load_file(ckpt / "adapter_model.safetensors")), ckpt / "adapter_model.safetensors")


def _edit_optimizer(ckpt: Path, fn) -> None:
    state = torch.load(ckpt / "optimizer.pt", weights_only=True)
    fn(state)
    torch.save(state, ckpt / "optimizer.pt")


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


def _special(root: Path, kind: str) -> None:
    path = sorted(root.glob("items_shuffle*.json"))[0]
    path.unlink()
    os.mkfifo(path) if kind == "fifo" else path.mkdir()


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
        "items_shuffle a FIFO": lambda root: _special(root, "fifo"),
        "items_shuffle a folder": lambda root: _special(root, "folder"),
    }


# ----------------------------------------------------------------------------- signals, disk, writers
# train.py's loop on the tests' scripted env (StubEnv), through infra.cli.run like train.py's main.
STUB_DRIVER = """
import errors
errors.quiet_start(__name__)  # as train.py's first lines
import sys
sys.path.insert(0, "tests")
import torch
torch.set_num_threads(1)
import train
from infra.cli import run
from stub_env import StubEnv
def main():
    args = train.parse_args(sys.argv[1:])
    train.train(args, train.Trainer(args, env=StubEnv(args.max_steps)))
run(main)
"""
STUB_FLAGS = ["--model", "tiny", "--preset", "none", "--iterations", "3", "--groups", "2", "--group-size", "4",
              "--max-steps", "2", "--max-new-tokens", "8", "--lr", "1e-2", "--lora-r", "4", "--lora-alpha", "8",
              "--eval-every", "0", "--hindsight", "expert", "--seed", "5"]
TIMING = ("seconds/", "tokens_per_s", "peak_memory")


def stub(folder: Path, resume: bool = False, **popen) -> subprocess.Popen:
    argv = ["--resume", str(folder)] if resume else [*STUB_FLAGS, "--output-dir", str(folder)]
    return subprocess.Popen([PY, "-c", STUB_DRIVER, *argv], cwd=ROOT, text=True, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


def finish(proc: subprocess.Popen, timeout: int = 600) -> tuple[int | None, str, str]:
    """(exit code or None for a hang, stdout, stderr)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return None, out, err
    return proc.returncode, out, err


def run_result(folder: Path) -> tuple[list[dict], dict] | None:
    """(metrics without timings, adapter tensors of `latest`), or None if the run did not finish."""
    latest = folder / "latest"
    if not (latest / "state.json").is_file():
        return None
    metrics = [{k: v for k, v in json.loads(line).items() if not k.startswith(TIMING)}
               for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return metrics, load_file(str(latest / "adapter_model.safetensors"))


def same_run(a, b) -> bool:
    return (a is not None and b is not None and a[0] == b[0] and a[1].keys() == b[1].keys()
            and all(torch.equal(a[1][k], b[1][k]) for k in a[1]))


def kept_ok(folder: Path, printed: int) -> bool:
    """No checkpoint lost: every iteration whose progress line was printed has its checkpoint
    (a save precedes the line), and `latest`, if there, resolves to a complete checkpoint."""
    latest = folder / "latest"
    if latest.is_symlink() and not (latest / "state.json").is_file():
        return False
    if printed == 0:
        return True
    return (latest / "state.json").is_file() and json.loads((latest / "state.json").read_text())["iteration"] >= printed


def printed_iterations(stdout: str) -> int:
    return sum(1 for line in stdout.splitlines() if line.startswith("iter "))


def resume_and_compare(folder: Path, reference) -> str:
    """Resume (or restart, when no checkpoint was kept) to the end; compare with the reference."""
    has_checkpoint = (folder / "latest" / "state.json").is_file()
    code, _, err = finish(stub(folder, resume=has_checkpoint))
    if code != 0:
        return f"resume failed (exit {code}): {(err.strip().splitlines() or [''])[-1][:80]}"
    return "identical resume" if same_run(run_result(folder), reference) else "RESUME DIFFERS"


def stop_line_ok(code, err: str, signum: int) -> bool:
    lines = [x for x in err.strip().splitlines() if x.strip()]
    word = "terminated (SIGTERM): " if signum == signal.SIGTERM else "interrupted: "
    return code == (143 if signum == signal.SIGTERM else 130) and bool(lines) and lines[-1].startswith(word)


def started(folder: Path, proc: subprocess.Popen, timeout: float = 300) -> float:
    """Wait until the run has written config.json (its imports and model load are behind it);
    returns the time it took."""
    t0 = time.time()
    while not (folder / "config.json").exists() and proc.poll() is None and time.time() - t0 < timeout:
        time.sleep(0.05)
    return time.time() - t0


def signal_cases(work: Path, reference, seconds: float, record) -> None:
    """SIGINT and SIGTERM to the run alone: twice while it imports, then at 12 moments spread over
    its training (rollout, passes, update, log and checkpoint writes, from config.json on); then
    SIGTERM and SIGINT to the whole process group of an ALFWorld run with two env worker processes
    (the workers must not print a traceback)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        for k in range(14):
            folder = work / "signals" / f"{signum.name}-{k:02d}"
            shutil.rmtree(folder, ignore_errors=True)
            proc = stub(folder)
            if k < 2:  # while importing
                delay = 1.0 + 2.0 * k
                time.sleep(delay)
                name = f"{signum.name} {delay:.0f} s after start"
            else:
                delay = 0.6 * seconds * (k - 2) / 12  # the measured seconds include the exit, and load varies
                started(folder, proc)
                time.sleep(delay)
                name = f"{signum.name} {delay:.1f} s into training"
            proc.send_signal(signum)
            code, out, err = finish(proc)
            if code is None:
                record("signals", name, "train", "hang")
            elif "Traceback" in err:
                record("signals", name, "train", "traceback", err.strip().splitlines()[-1][:110])
            elif not kept_ok(folder, printed_iterations(out)):
                record("signals", name, "train", "CHECKPOINT LOST")
            elif code == 0:
                record("signals", name, "train", "finished first" if same_run(run_result(folder), reference)
                       else "RESULT DIFFERS")
            elif not stop_line_ok(code, err, signum):
                record("signals", name, "train", f"exit {code}", (err.strip().splitlines() or [""])[-1][:110])
            else:
                record("signals", name, "train", resume_and_compare(folder, reference), err.strip().splitlines()[-1][:90])
    for signum in (signal.SIGTERM, signal.SIGINT):
        for delay in (4, 12, 25, 40):
            folder = work / "signals" / f"group-{signum.name}-{delay}"
            shutil.rmtree(folder, ignore_errors=True)
            argv = ["train.py", "--model", "tiny", "--preset", "none", "--env", "alfworld", "--env-workers", "2",
                    "--iterations", "2", "--groups", "2", "--group-size", "2", "--max-steps", "3",
                    "--max-new-tokens", "8", "--lora-r", "4", "--lora-alpha", "8", "--eval-every", "0",
                    "--output-dir", str(folder)]
            proc = subprocess.Popen([PY, *argv], cwd=ROOT, text=True, env=ENV, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True)
            time.sleep(delay)
            try:
                os.killpg(proc.pid, signum)
            except ProcessLookupError:
                pass
            code, out, err = finish(proc)
            name = f"group {signum.name} after {delay} s (2 workers)"
            if code is None:
                outcome = "hang"
            elif "Traceback" in err:
                outcome = "traceback"
            elif not kept_ok(folder, printed_iterations(out)):
                outcome = "CHECKPOINT LOST"
            elif code == 0 or stop_line_ok(code, err, signum):
                outcome = "ok" if code == 0 else "one-line stop"
            else:
                outcome = f"exit {code}"
            record("signals", name, "train", outcome, (err.strip().splitlines() or [""])[-1][:110])


def disk_cases(work: Path, reference, record) -> None:
    """A run folder on a tmpfs that fills at different writes (config, logs, a checkpoint's
    adapter, its optimizer state, `latest`); then the tmpfs is grown and the run resumed."""
    if os.geteuid() != 0:
        print("disk full: skipped (mounting a small tmpfs needs root)")
        return
    for size_kib in (8, 16, 64, 160, 240, 320, 480, 720):
        mount = work / "disk" / f"{size_kib}k"
        mount.mkdir(parents=True, exist_ok=True)
        subprocess.run(["umount", str(mount)], capture_output=True)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(mount)]).returncode:
            print("disk full: skipped (mount failed)")
            return
        try:
            folder = mount / "run"
            code, out, err = finish(stub(folder))
            name = f"tmpfs of {size_kib} KiB"
            last = (err.strip().splitlines() or [""])[-1]
            if code is None:
                record("disk full", name, "train", "hang")
            elif "Traceback" in err:
                record("disk full", name, "train", "traceback", last[:110])
            elif not kept_ok(folder, printed_iterations(out)):
                record("disk full", name, "train", "CHECKPOINT LOST")
            elif code == 0:
                record("disk full", name, "train", "ok (it fitted)")
            elif code != 2 or not last.startswith("error: cannot "):
                record("disk full", name, "train", f"exit {code}", last[:110])
            else:
                subprocess.run(["mount", "-o", "remount,size=64m", str(mount)], check=True)
                record("disk full", name, "train", resume_and_compare(folder, reference), last[:90])
        finally:
            subprocess.run(["umount", str(mount)], capture_output=True)


def writer_cases(work: Path, reference, record) -> None:
    """Two runs on one fresh folder started together; a --resume, and a new run's --output-dir,
    onto a folder whose run is still going."""
    folder = work / "writers" / "together"
    shutil.rmtree(folder, ignore_errors=True)
    procs = [stub(folder), stub(folder)]
    results = [finish(p) for p in procs]
    codes = sorted(r[0] for r in results)
    refused = [r for r in results if r[0] == 2]
    intact = same_run(run_result(folder), reference)
    if codes == [0, 2] and "is in use by" in refused[0][2] and intact:
        outcome = "one refused, run intact"
    elif codes == [0, 2] and "already holds a run" in refused[0][2] and intact:
        # on a loaded machine one interpreter can start so late that the other has finished: the late
        # one then finds a finished run and is refused for that (the message says to --resume it)
        outcome = "one refused (the other had finished), run intact"
    else:
        outcome = f"exits {codes}, {'intact' if intact else 'RUN DAMAGED'}"
    record("two writers", "two runs started together", "train", outcome,
           (refused[0][2].strip().splitlines() or [""])[-1][:90] if refused else "")
    long = 400  # iterations of the first run: it must still hold the folder when the second has imported
    for name, second in (("--resume while it runs", lambda f: stub(f, resume=True)),
                         ("a new run's --output-dir onto it", lambda f: stub(f))):
        folder = work / "writers" / name.split()[0].strip("-")
        shutil.rmtree(folder, ignore_errors=True)
        first = subprocess.Popen([PY, "-c", STUB_DRIVER, *STUB_FLAGS, "--iterations", str(long), "--output-dir",
                                  str(folder)], cwd=ROOT, text=True, env=ENV, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
        deadline = time.time() + 300
        while not (folder / "latest").exists() and first.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        code2, _, err2 = finish(second(folder))
        still_running = first.poll() is None
        first.send_signal(signal.SIGTERM)  # enough: the second has had its chance
        code1, _, err1 = finish(first)
        logged = [json.loads(line)["iteration"] for line in (folder / "metrics.jsonl").read_text().splitlines()]
        kept = json.loads((folder / "latest" / "state.json").read_text())["iteration"]
        intact = logged[:kept] == list(range(1, kept + 1)) and code1 == 143 and "keeps iteration" in err1
        outcome = ("refused, run intact" if still_running and code2 == 2 and "is in use by" in err2 and intact else
                   "NOT A TEST (the first run ended first)" if not still_running else
                   f"exits {code1}/{code2}, {'intact' if intact else 'RUN DAMAGED'}")
        record("two writers", name, "train", outcome, (err2.strip().splitlines() or [""])[-1][:90])


# ----------------------------------------------------------------------------- flags at their edges
TINY_WEBSHOP = ["--model", "tiny", "--preset", "none", "--env", "webshop", "--iterations", "1", "--groups", "1",
                "--group-size", "2", "--max-steps", "2", "--max-new-tokens", "8", "--lora-r", "4", "--lora-alpha", "8",
                "--eval-every", "0"]


def flag_cases() -> list[tuple[str, list[str]]]:
    """(name, command line): each should be one line (exit 2) or a run that finishes quickly."""
    train_cases = [
        ["--seed", "-1"], ["--seed", str(2**32)], ["--seed", str(2**70)], ["--seed", "1.5"],
        ["--lr", "-1e-3"], ["--lr", "0"], ["--lr", "nan"], ["--lr", "inf"], ["--lr", "-inf"], ["--lr", "1e400"],
        ["--lam", "nan"], ["--lam", "-0.1"], ["--lam", "1.5"], ["--eps-m", "0"], ["--eps-m", "1"],
        ["--temperature", "-1"], ["--temperature", "nan"], ["--kl-coef", "-1"], ["--gigpo-gamma", "2"],
        ["--groups", "0"], ["--groups", "-3"], ["--groups", "100000"], ["--group-size", "100000"],
        ["--group-size", "0"], ["--max-steps", "100000"], ["--max-steps", "-1"], ["--max-new-tokens", "0"],
        ["--max-new-tokens", "100000"], ["--iterations", "0"], ["--iterations", "-1"], ["--lora-r", "0"],
        ["--lora-alpha", "-8"], ["--ppo-epochs", "0"], ["--minibatches", "0"], ["--save-every", "0"],
        ["--keep-checkpoints", "0"], ["--micro-batch-rows", "0"], ["--env-workers", "-1"], ["--eval-every", "-1"],
        ["--groups", "99999999999999999999"], ["--lr", "1e-3x"], ["--max-plan-len", "-2"],
    ]
    cases = [(" ".join(c), ["train.py", *TINY_WEBSHOP, *c, "--output-dir", "{out}"]) for c in train_cases]
    cases += [(f"eval {' '.join(c)}", ["eval.py", "--env", "webshop", "--policy", "random", "--num-games", "1", *c,
                                       "--out", "{out}.json"])
              for c in (["--seed", "-1"], ["--seed", str(2**32)], ["--batch-size", "0"], ["--max-steps", "-1"],
                        ["--temperature", "nan"], ["--num-games", "-1"])]
    cases += [("warmstart --seed -5", ["-m", "tools.warmstart", "--seed", "-5", "--out", "{out}"]),
              ("warmstart --headlines nope", ["-m", "tools.warmstart", "--env", "webshop", "--headlines", "nope",
                                              "--out", "{out}"]),
              ("device_check --decode-batches 4,x", ["-m", "tools.device_check", "--model", "tiny", "--decode-batches",
                                                     "4,x"]),
              ("device_check --response-tokens 999", ["-m", "tools.device_check", "--model", "tiny",
                                                      "--response-tokens", "999"]),
              ("device_check --model qwen7b-shape (no GPU)", ["-m", "tools.device_check"]),
              ("credit --seeds 0,2^32", ["-m", "tools.credit", "--seeds", f"0,{2**32}", "--out", "{out}"]),
              ("compare --seeds -2", ["-m", "tools.compare", "--seeds", "-2", "--out", "{out}", "--", "--model", "tiny"]),
              ("compare --jobs 0", ["-m", "tools.compare", "--jobs", "0", "--out", "{out}", "--", "--model", "tiny"])]
    return cases


def flags_section(work: Path, marker: Path, record) -> None:
    for k, (name, argv) in enumerate(flag_cases()):
        out = work / "flags" / f"case-{k:02d}"
        shutil.rmtree(out, ignore_errors=True)
        try:
            proc = run([a.replace("{out}", str(out)) for a in argv], timeout=180)
            outcome = verdict(proc, marker)
            last = (proc.stderr.strip().splitlines() or [""])[-1][:110]
        except subprocess.TimeoutExpired:
            outcome, last = "hang", ""
        record("edge flags", name, argv[0].removesuffix(".py") if argv[0] != "-m" else argv[1], outcome, last)


def frozen_worker(timeout: str, within: float) -> str:
    """A frozen ALFWorld worker (SIGSTOP): the step returns within `within` seconds and only that worker's
    episodes end as crashed. `timeout` is make_env's keyword as text ("" for the default)."""
    code = ("import os, signal, sys, time; sys.path.insert(0, '.'); from envs.make import make_env\n"
            f"env = make_env('alfworld', workers=2, {timeout}); env.reset(env.tasks('train')[:2])\n"
            "os.kill(env._procs[0].pid, signal.SIGSTOP); t = time.time()\n"
            "out = env.step(['<think>x</think><action>look</action>'] * 2)\n"
            "ok = out[0].info.get('env_crash') and not out[1].info.get('env_crash')\n"
            f"ok = ok and time.time() - t < {within}; env.close(); sys.exit(0 if ok else 1)")
    try:
        proc = subprocess.run([PY, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, env=ENV)
    except subprocess.TimeoutExpired:
        return "HANG"
    return "ok" if proc.returncode == 0 else f"exit {proc.returncode}"


def round_four(work: Path, marker: Path, record) -> None:
    """Resumes and evaluations under other data or env, branching, a removed lock file, outputs that cannot be
    written, paths too long, a frozen env worker."""
    base = work / "r4-base"
    if not base.exists():
        tiny_run(base)
    # a resume under another catalog: the shipped run refuses while $WEBSHOP_DATA points elsewhere
    other = work / "r4-other-catalog"
    shutil.rmtree(other, ignore_errors=True)
    shutil.copytree(ROOT / "data" / "webshop", other)
    copy = work / "r4-data"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(base, copy, symlinks=True)
    proc = subprocess.run([PY, "train.py", "--resume", str(copy), "--iterations", "3"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**ENV, "WEBSHOP_DATA": str(other)})
    record("round four", "resume under another $WEBSHOP_DATA", "resume", verdict(proc, marker),
           (proc.stderr.strip().splitlines() or [""])[-1][:90])
    # eval of a WebShop checkpoint without --env plays WebShop
    proc = run(["eval.py", "--policy", "model", "--checkpoint", str(base), "--num-games", "1", "--max-steps", "2",
                "--max-new-tokens", "8", "--out", str(work / "r4-eval.json")])
    outcome = verdict(proc, marker)
    if outcome == "ok":
        outcome = "ok" if json.loads((work / "r4-eval.json").read_text())["config"]["env"] == "webshop" else "WRONG ENV"
    record("round four", "eval of a webshop run without --env", "eval", outcome)
    # branching twice, then evaluating the branch
    for name, source, out in (("branch from an older checkpoint", base / "checkpoints" / "iter-000001", work / "r4-b1"),
                              ("branch of a branch", work / "r4-b1", work / "r4-b2")):
        shutil.rmtree(out, ignore_errors=True)
        proc = run(["train.py", "--resume", str(source), "--output-dir", str(out), "--iterations", "3"])
        outcome = verdict(proc, marker)
        logged = [json.loads(x)["iteration"] for x in (out / "metrics.jsonl").read_text().splitlines()] \
            if (out / "metrics.jsonl").exists() else []
        if outcome == "ok" and logged != list(range(1, 4)):
            outcome = f"LOGGED {logged}"
        record("round four", name, "resume", outcome)
    loop = work / "r4-copied-checkpoint"
    shutil.rmtree(loop, ignore_errors=True)
    shutil.copytree(base / "checkpoints" / "iter-000001", loop)
    proc = run(["train.py", "--resume", str(loop), "--iterations", "3"])
    record("round four", "resume of a copied checkpoint folder", "resume", verdict(proc, marker),
           (proc.stderr.strip().splitlines() or [""])[-1][:90])
    # one writer, with the lock file removed under a run that holds the folder
    folder = work / "r4-lock"
    shutil.rmtree(folder, ignore_errors=True)
    first = subprocess.Popen([PY, "-c", STUB_DRIVER, *STUB_FLAGS, "--iterations", "400", "--output-dir", str(folder)],
                             cwd=ROOT, text=True, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while not (folder / "latest").exists() and first.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    (folder / ".lock").unlink(missing_ok=True)
    code2, _, err2 = finish(stub(folder, resume=True))
    still = first.poll() is None
    first.send_signal(signal.SIGTERM)
    finish(first)
    record("round four", "second writer after .lock was removed", "train",
           "refused, run intact" if still and code2 == 2 and "in use" in err2 else f"exit {code2} (first running: {still})")
    # outputs that cannot be written, paths too long
    (work / "r4-afile").write_text("")
    (work / "r4-afolder").mkdir(exist_ok=True)
    for name, out in (("--out under a file", str(work / "r4-afile" / "x.json")), ("--out a folder", str(work / "r4-afolder")),
                      ("--out /dev/full", "/dev/full"), ("--out name of 300 bytes", str(work / ("x" * 300)))):
        proc = run(["eval.py", "--env", "webshop", "--policy", "random", "--num-games", "1", "--max-steps", "1",
                    "--out", out])
        record("round four", name, "eval", verdict(proc, marker), (proc.stderr.strip().splitlines() or [""])[-1][:90])
    for name, out in (("run folder path of 4,000 bytes", str(work / "/".join(["d" * 200] * 20))),
                      ("run folder name of 300 bytes", str(work / ("n" * 300)))):
        proc = run(["train.py", *TINY_WEBSHOP, "--output-dir", out])
        record("round four", name, "train", verdict(proc, marker), (proc.stderr.strip().splitlines() or [""])[-1][:90])
    record("round four", "a SIGSTOPped env worker", "env", frozen_worker("timeout=10", within=60))


# ----------------------------------------------------------------------------- round five
def snapshot(folder: Path) -> dict:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != ".lock"}


def last_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[-1]


def stop_verdict(code: int | None, err: str, expected: int) -> str:
    if code is None:
        return "HANG"
    if "Traceback" in err:
        return "traceback"
    return "one-line stop" if code == expected and last_line(err) else f"exit {code}"


def as_nobody() -> list[str] | None:
    """The command prefix that runs a command as user nobody, when this machine lets it (root, setpriv, a
    Python nobody can run); None otherwise (those cases are reported as not run)."""
    prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "env", "HOME=/tmp",
              f"SHARPO_CACHE={tempfile.gettempdir()}/sweep-nobody-cache"]
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        return None
    probe = subprocess.run([*prefix, PY, "-c", "import torch"], capture_output=True, timeout=120)
    return prefix if probe.returncode == 0 else None


def round_five(work: Path, marker: Path, record) -> None:
    """Round five: runs inside runs, output streams that close or fill, SIGHUP, a diverged policy, other users'
    files, the C locale, a full model cache, damaged logs, what a resume or an eval could change silently, a
    frozen worker at the defaults, and the misleading messages of round five's issue."""
    base = work / "r5-base"
    if not base.exists():
        tiny_run(base)
    # 1. a run written inside another
    for inside in ("latest", "checkpoints/iter-000001", "checkpoints", "sub/run"):
        before = snapshot(base)
        proc = run(["train.py", *TINY_WEBSHOP, "--output-dir", str(base / inside)])
        outcome = verdict(proc, marker)
        if outcome == "one-line error":
            outcome = "refused, run intact" if snapshot(base) == before else "REFUSED, RUN CHANGED"
        record("round five", f"new run in base/{inside}", "train", outcome, last_line(proc.stderr)[:90])
    # 2. output streams that close or fill; SIGHUP
    out = work / "r5-pipe"
    shutil.rmtree(out, ignore_errors=True)
    proc = subprocess.Popen([PY, "train.py", *TINY_WEBSHOP[:-2], "--iterations", "3", "--output-dir", str(out)], cwd=ROOT,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    proc.wait(timeout=600)
    outcome = stop_verdict(proc.returncode, err, 141)
    if outcome == "one-line stop":
        resumed = run(["train.py", "--resume", str(out)])
        outcome = outcome if resumed.returncode == 0 else f"stop, then resume {verdict(resumed, marker)}"
    record("round five", "train | head -1, then --resume", "train", outcome, last_line(err)[:90])
    for name, argv, stream in (("train > /dev/full", ["train.py", *TINY_WEBSHOP[:-2], "--output-dir",
                                                     str(work / "r5-full-out")], "stdout"),
                               ("train 2> /dev/full", ["train.py", *TINY_WEBSHOP[:-2], "--output-dir",
                                                      str(work / "r5-full-err")], "stderr"),
                               ("eval > /dev/full", ["eval.py", "--env", "webshop", "--policy", "random", "--num-games",
                                                    "2", "--out", str(work / "r5-full.json")], "stdout"),
                               ("plots > /dev/full", ["-m", "tools.plots", str(base)], "stdout")):
        for folder in (work / "r5-full-out", work / "r5-full-err"):
            shutil.rmtree(folder, ignore_errors=True)
        with open("/dev/full", "w") as full:
            done = subprocess.run([PY, *argv], cwd=ROOT, text=True, env=ENV, timeout=600,
                                  **({"stdout": full, "stderr": subprocess.PIPE} if stream == "stdout"
                                     else {"stdout": subprocess.PIPE, "stderr": full}))
        said = done.stderr if stream == "stdout" else done.stdout
        outcome = stop_verdict(done.returncode, said, 74)
        if name.startswith("eval") and outcome == "one-line stop" and not (work / "r5-full.json").is_file():
            outcome = "LOST ITS JSON"
        record("round five", name, argv[0].removesuffix(".py") if argv[0] != "-m" else argv[1], outcome,
               last_line(said)[:90])
    hup = work / "r5-hup"
    shutil.rmtree(hup, ignore_errors=True)
    proc = stub(hup)
    started(hup, proc)
    deadline = time.time() + 300
    while not (hup / "latest").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGHUP)
    code, _, err = finish(proc)
    outcome = "finished first" if code == 0 else stop_verdict(code, err, 129)
    record("round five", "SIGHUP mid-run", "train", outcome, last_line(err)[:90])
    # 3. a diverged policy
    # (the stub env: its rewards differ within a group, so the first step has a gradient to overflow)
    flags = [*STUB_FLAGS, "--output-dir", str(work / "r5-diverge")]
    flags[flags.index("--lr") + 1] = "1e30"
    proc = subprocess.run([PY, "-c", STUB_DRIVER, *flags], cwd=ROOT, text=True, env=ENV, capture_output=True,
                          timeout=600)
    outcome = verdict(proc, marker)
    if outcome == "one-line error" and list((work / "r5-diverge").glob("checkpoints/iter-*")):
        outcome = "CHECKPOINTED A DIVERGED POLICY"
    outcome = "DIVERGED UNSEEN" if outcome == "ok" else outcome
    record("round five", "--lr 1e30", "train", outcome, last_line(proc.stderr)[:90])
    bad = work / "r5-diverged-ckpt"
    shutil.rmtree(bad, ignore_errors=True)
    shutil.copytree(base, bad, symlinks=True)
    weights = bad / "checkpoints" / "iter-000002" / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    from safetensors.torch import save_file
    save_file({k: v * 1e30 if "lora_B" in k else v for k, v in tensors.items()}, str(weights))
    for name, argv in (("resume of a diverged checkpoint", ["train.py", "--resume", str(bad), "--iterations", "3"]),
                       ("sampled eval of a diverged checkpoint", ["eval.py", "--policy", "model", "--checkpoint",
                                                                  str(bad), "--temperature", "1", "--num-games", "1"])):
        proc = run(argv)
        record("round five", name, argv[0].removesuffix(".py"), verdict(proc, marker), last_line(proc.stderr)[:90])
    # 4. other users' files, the C locale, a full model cache
    nobody = as_nobody()
    if nobody is None:
        record("round five", "as another user (not run: needs root and setpriv)", "eval", "ok (not run)")
    else:
        shared = Path(tempfile.mkdtemp(prefix="sweep-shared-"))
        os.chmod(shared, 0o777)  # nobody writes its --out here
        locked = shared / "run"
        shutil.copytree(base, locked, symlinks=True)
        subprocess.run(["chmod", "-R", "a+rX", str(locked)], check=True)
        os.chmod(locked / "checkpoints", 0o700)
        proc = subprocess.run([*nobody, PY, "eval.py", "--policy", "model", "--checkpoint", str(locked), "--out",
                               str(shared / "e.json")], cwd=ROOT, capture_output=True, text=True, timeout=300)
        record("round five", "checkpoints/ of mode 700, another user", "eval", verdict(proc, marker),
               last_line(proc.stderr)[:90])
        os.chmod(locked / "checkpoints", 0o755)
        os.chmod(locked / "checkpoints" / "iter-000002" / "adapter_model.safetensors", 0)
        proc = subprocess.run([*nobody, PY, "eval.py", "--policy", "model", "--checkpoint", str(locked), "--out",
                               str(shared / "e.json")], cwd=ROOT, capture_output=True, text=True, timeout=300)
        outcome = verdict(proc, marker)
        if outcome == "one-line error" and "missing" in last_line(proc.stderr):
            outcome = "SAID MISSING"
        record("round five", "an adapter of mode 000, another user", "eval", outcome, last_line(proc.stderr)[:90])
        data = shared / "alfworld"
        shutil.copytree(ROOT / "data" / "alfworld", data)
        subprocess.run(["chmod", "-R", "a+rX", str(data)], check=True)
        os.chmod(next(data.glob("json_2.1.1/valid_unseen/*/*/traj_data.json")), 0)
        proc = subprocess.run([*nobody, PY, "eval.py", "--policy", "expert", "--data-dir", str(data), "--out",
                               str(shared / "x.json")], cwd=ROOT, capture_output=True, text=True, timeout=300)
        record("round five", "an unreadable traj_data.json, another user", "eval", verdict(proc, marker),
               last_line(proc.stderr)[:90])
        shutil.rmtree(shared, ignore_errors=True)
    c_env = {**ENV, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    folder = work / "r5-données"
    shutil.rmtree(folder, ignore_errors=True)
    outcomes = []
    for argv in (["train.py", *TINY_WEBSHOP[:-2], "--output-dir", str(folder)],
                 ["train.py", "--resume", str(folder), "--iterations", "2"], ["-m", "tools.plots", str(folder)]):
        proc = subprocess.run([PY, *argv], cwd=ROOT, capture_output=True, text=True, env=c_env, timeout=600)
        outcomes.append(verdict(proc, marker))
    record("round five", "LC_ALL=C, a run folder named données", "train", "ok" if set(outcomes) == {"ok"} else
           next(o for o in outcomes if o != "ok"))
    mount = work / "r5-tiny-cache"
    mount.mkdir(exist_ok=True)
    if os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                                            capture_output=True).returncode == 0:
        try:
            proc = subprocess.run([PY, "eval.py", "--policy", "model", "--model", "smollm2", "--num-games", "1",
                                   "--max-steps", "1", "--max-new-tokens", "4", "--out", str(work / "r5-cache.json")],
                                  cwd=ROOT, capture_output=True, text=True, timeout=600,
                                  env={**ENV, "SHARPO_CACHE": str(mount)})
            record("round five", "the model cache on a full file system", "eval", verdict(proc, marker),
                   last_line(proc.stderr)[:90])
        finally:
            subprocess.run(["umount", str(mount)], capture_output=True)
    else:
        record("round five", "the model cache on a full file system (not run: no tmpfs)", "eval", "ok (not run)")
    # 5. a frozen worker at the defaults
    record("round five", "a SIGSTOPped worker, the default timeout", "env", frozen_worker("", within=45))
    # 6. nothing changes silently; 7. messages
    short = work / "r5-short"
    if not short.exists():
        proc = run(["train.py", *TINY_WEBSHOP[:-2], "--history", "1", "--max-steps", "2", "--max-new-tokens", "6",
                    "--output-dir", str(short)])
    proc = run(["eval.py", "--policy", "model", "--checkpoint", str(short), "--num-games", "1", "--out",
                str(work / "r5-short.json")])
    outcome = verdict(proc, marker)
    if outcome == "ok":
        config = json.loads((work / "r5-short.json").read_text())["config"]
        outcome = "ok" if (config["history"], config["max_steps"], config["max_new_tokens"]) == ("1", 2, 6) else \
            f"PLAYED {config['history']}, {config['max_steps']}, {config['max_new_tokens']}"
    record("round five", "eval of a run: its own history, steps, tokens", "eval", outcome)
    cases = {
        "an edited RUN/config.json (lr)": lambda f: json_edit(f / "config.json", lambda c: {**c, "lr": 0.5}),
        "an invalid RUN/config.json": lambda f: (f / "config.json").write_text("{oops"),
        "goals changed under the data path": None,
        "a non-UTF-8 byte in metrics line 1": lambda f: (f / "metrics.jsonl").write_bytes(
            b'{"iteration": 1, "succ\xffess": 0.5}\n' + (f / "metrics.jsonl").read_bytes().split(b"\n", 1)[1]),
        'a metrics line {"iteration": true}': lambda f: (f / "metrics.jsonl").write_text(
            (f / "metrics.jsonl").read_text() + json.dumps({"iteration": True, "success": 0.5}) + "\n"),
    }
    for name, damage in cases.items():
        folder = work / "r5-runs" / name.replace(" ", "_").replace("/", "_")
        shutil.rmtree(folder, ignore_errors=True)
        argv = ["train.py", "--resume", str(folder), "--iterations", "3"]
        if damage is None:  # its own copy of the catalog, changed after the run
            catalog = folder.parent / "catalog"
            shutil.rmtree(catalog, ignore_errors=True)
            shutil.copytree(ROOT / "data" / "webshop", catalog)
            proc = run(["train.py", *TINY_WEBSHOP[:-2], "--iterations", "2", "--data-dir", str(catalog),
                        "--output-dir", str(folder)])
            human = next(catalog.glob("items_human_ins*.json"))
            goals = json.loads(human.read_text())
            goals[next(iter(goals))][0]["instruction"] = "i want something else entirely"
            human.write_text(json.dumps(goals))
        else:
            shutil.copytree(base, folder, symlinks=True)
            damage(folder)
        proc = run(argv)
        outcome = verdict(proc, marker)
        if damage is not None and "metrics" in name and outcome == "ok":
            outcome = "ok" if "no log line: dropped" in proc.stderr else "DROPPED WITHOUT A WORD"
        record("round five", name, "resume", outcome, last_line(proc.stderr)[:90])
    for name, argv in (("--resume --iterations 1 of a run at 2", ["train.py", "--resume", str(base), "--iterations", "1"]),
                       ("--resume --preset cpu-demo", ["train.py", "--resume", str(base), "--iterations", "3",
                                                       "--preset", "cpu-demo"]),
                       ("credit --env webshop, its default split (with --seeds x)",
                        ["-m", "tools.credit", "--env", "webshop", "--seeds", "x"])):
        proc = run(argv)
        outcome = verdict(proc, marker)
        if "split" in last_line(proc.stderr):
            outcome = "REFUSED ITS OWN SPLIT"
        record("round five", name, argv[0].removesuffix(".py") if argv[0] != "-m" else argv[1], outcome,
               last_line(proc.stderr)[:90])
    own = work / "r5-own-value"
    shutil.rmtree(own, ignore_errors=True)
    shutil.copytree(base, own, symlinks=True)
    for path in [own / "config.json", *own.glob("checkpoints/*/config.json")]:
        json_edit(path, lambda c: {**c, "lr": -1.0})
    proc = run(["train.py", "--resume", str(own), "--iterations", "3"])
    outcome = verdict(proc, marker)
    if outcome == "one-line error" and "config.json" not in last_line(proc.stderr):
        outcome = "BLAMED A FLAG"
    record("round five", "a checkpoint's own bad value", "resume", outcome, last_line(proc.stderr)[:90])
    proc = subprocess.Popen([PY, "eval.py", "--env", "webshop", "--policy", "random", "--num-games", "40"], cwd=ROOT,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    time.sleep(8)
    proc.send_signal(signal.SIGTERM)
    code, _, err = finish(proc)
    outcome = "finished first" if code == 0 else stop_verdict(code, err, 143)
    if "train.py --resume" in err:
        outcome = "TOLD TO RESUME TRAINING"
    record("round five", "SIGTERM of an eval", "eval", outcome, last_line(err)[:90])


def one_goal_shop(root: Path) -> Path:
    """A copy of the shipped WebShop data with one goal left: every split but one is empty."""
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(ROOT / "data" / "webshop", root)
    json_edit(root / "items_human_ins.json", lambda d: {k: v[:1] for k, v in list(d.items())[:1]})
    return root


def lora_b_zero(run_dir: Path) -> bool:
    """Every lora_B of the run's last adapter still 0, as it started (LoRA's B starts at zero)."""
    from safetensors.torch import load_file as load

    ckpt = run_dir / "latest"
    weights = load(str(ckpt / "adapter_model.safetensors"))
    return all(not t.any() for k, t in weights.items() if "lora_B" in k)


def round_six(work: Path, marker: Path, record) -> None:
    """Round six (issue 65): an evaluation that replaced another, data paths that meant another folder later, a
    checkpoint's env ignored, empty splits, unparseable prices, weights moved by no signal, the precision cache,
    sizes that take days, over-long names, unreadable data, damaged records, a clip past 1, closed streams."""
    def case(name, command, proc, check=None):
        outcome = verdict(proc, marker)
        if outcome == "ok" and check is not None:
            outcome = check()
        record("round six", name, command, outcome, last_line(proc.stderr)[:90])

    tiny = [*TINY_WEBSHOP, "--hindsight", "expert", "--seed", "3"]
    # 1. eval.py on a run folder after the loop evaluated the same iteration: the loop's record unchanged
    r1 = work / "r6-eval"
    shutil.rmtree(r1, ignore_errors=True)
    assert run(["train.py", *tiny[:-2], "--iterations", "2", "--eval-every", "1", "--eval-games", "3",
                "--output-dir", str(r1)]).returncode == 0
    own = r1 / "eval_webshop_test_iter-000002.json"
    before = own.read_bytes()
    for k in range(2):
        proc = run(["eval.py", "--policy", "model", "--checkpoint", str(r1), "--num-games", "1", "--max-steps", "1"])
        case(f"eval.py beside the loop's record ({k + 1})", "eval", proc,
             lambda: "ok" if own.read_bytes() == before else "REPLACED THE LOOP'S RECORD")
    # 2. a relative --data-dir, read from another working folder that has its own ./shop
    a, b = work / "r6-a", work / "r6-b"
    for folder in (a, b):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
    shutil.copytree(ROOT / "data" / "webshop", a / "shop")
    one_goal_shop(b / "shop")
    proc = subprocess.run([PY, str(ROOT / "train.py"), *tiny, "--data-dir", "shop", "--output-dir", "run"], cwd=a,
                          capture_output=True, text=True, timeout=600, env=ENV)
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = subprocess.run([PY, str(ROOT / "eval.py"), "--policy", "model", "--checkpoint", str(a / "run"), "--num-games",
                           "2", "--max-steps", "1", "--out", str(b / "e.json")], cwd=b, capture_output=True, text=True,
                          timeout=600, env=ENV)
    case("relative --data-dir, eval from elsewhere", "eval", proc,
         lambda: "ok" if json.loads((b / "e.json").read_text())["config"]["data_dir"] == str(a / "shop")
         else "PLAYED ANOTHER CATALOG")
    # 3, 16. tools.credit: the checkpoint's env; an empty split
    proc = run(["-m", "tools.credit", "--checkpoint", str(a / "run"), "--games", "1", "--group-size", "2", "--seeds", "0",
                "--max-steps", "2", "--out", str(work / "r6-credit")])
    case("credit on a WebShop checkpoint", "credit", proc,
         lambda: "ok" if json.loads((work / "r6-credit" / "credit.json").read_text())["config"]["env"] == "webshop"
         else "SCORED ON ANOTHER ENV")
    shop = one_goal_shop(work / "r6-one-goal")
    proc = run(["-m", "tools.credit", "--env", "webshop", "--data-dir", str(shop), "--split", "train", "--games", "1",
                "--group-size", "2", "--seeds", "0", "--out", str(work / "r6-credit-empty")])
    case("credit on an empty split", "credit", proc)
    # 4, 8. an empty split: eval.py, and train.py (a draw from nothing)
    for split in ("train", "test"):  # the one goal is a test goal: train is empty
        record_path = work / f"r6-one-goal-{split}.json"
        record_path.unlink(missing_ok=True)
        proc = run(["eval.py", "--env", "webshop", "--policy", "random", "--split", split, "--data-dir", str(shop),
                    "--out", str(record_path)])
        case(f"eval on one goal, --split {split}", "eval", proc,
             lambda: "ok" if json.loads(record_path.read_text())["episodes"] > 0 else "0 EPISODES AS A RESULT")
    try:
        proc = run(["train.py", *tiny, "--data-dir", str(shop), "--output-dir", str(work / "r6-one-goal-run")], timeout=180)
        case("train on one goal", "train", proc)
    except subprocess.TimeoutExpired:
        record("round six", "train on one goal", "train", "HANG")
    # 5. a price that is not a number
    bad = work / "r6-price"
    shutil.rmtree(bad, ignore_errors=True)
    shutil.copytree(ROOT / "data" / "webshop", bad)
    json_edit(bad / "items_shuffle.json", lambda d: d[0].update(pricing="$abc"))
    case("price $abc", "eval", run(["eval.py", "--env", "webshop", "--policy", "expert", "--data-dir", str(bad)]))
    # 6. every group tied, --kl-coef 0.01, lr 1e-2: no weight moves, on either path
    for way in ([], ["--plain"]):
        out = work / f"r6-tied{'-plain' if way else ''}"
        shutil.rmtree(out, ignore_errors=True)
        proc = run(["train.py", *tiny[:-2], "--iterations", "4", "--kl-coef", "0.01", "--lr", "1e-2", *way,
                    "--output-dir", str(out)])
        case(f"tied groups, KL 0.01, lr 1e-2 {' '.join(way)}", "train", proc,
             lambda: "ok" if lora_b_zero(out) else "WEIGHTS MOVED")
    # 7, 10, 11. the precision cache: a NaN ratio, a record without `measured`, a FIFO
    probe = "from infra.models import resolve_dtype; print(resolve_dtype('auto', 'cpu', 'smollm2'))"
    for name, write in (("NaN ratio", lambda p: p.write_text(json.dumps({"ratio": float("nan"), "dtype": "bf16"}))),
                        ("no measured", lambda p: p.write_text(json.dumps({"dtype": "bf16", "ratio": 0.4}))),
                        ("a FIFO", lambda p: os.mkfifo(p))):
        cache = work / f"r6-cache-{name.replace(' ', '-')}"
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir()
        write(cache / "dtype.json")
        try:
            proc = subprocess.run([PY, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300,
                                  env={**ENV, "SHARPO_CACHE": str(cache)})
            case(f"dtype.json {name}", "dtype", proc)
        except subprocess.TimeoutExpired:
            record("round six", f"dtype.json {name}", "dtype", "HANG")
    # 9, 15. sizes that take days, a clip past 1
    for flag in (["--minibatches", "100000000"], ["--ppo-epochs", "100000000"], ["--ppo-clip", "1e300"]):
        case(" ".join(flag), "train", run(["train.py", *tiny, *flag, "--output-dir", str(work / "r6-flag")], timeout=180))
    # 12. a path component over 255 bytes, in every path flag
    long = "/tmp/" + "x" * 300
    for name, argv in (("--resume", ["train.py", "--resume", long]),
                       ("--data-dir (webshop)", ["train.py", *tiny, "--data-dir", long, "--output-dir", str(work / "r6-l")]),
                       ("--data-dir (alfworld)", ["train.py", "--model", "tiny", "--preset", "none", "--data-dir", long,
                                                  "--output-dir", str(work / "r6-l")]),
                       ("--init-adapter", ["train.py", *tiny, "--init-adapter", long, "--output-dir", str(work / "r6-l")]),
                       ("--model", ["train.py", "--model", long, "--preset", "none", "--output-dir", str(work / "r6-l")]),
                       ("eval --checkpoint", ["eval.py", "--policy", "model", "--checkpoint", long]),
                       ("eval --data-dir", ["eval.py", "--env", "webshop", "--policy", "random", "--data-dir", long]),
                       ("plots", ["-m", "tools.plots", long]),
                       ("compare --out", ["-m", "tools.compare", "--gather-only", "--out", long, "--", "--model", "tiny"])):
        case(f"a name over 255 bytes: {name}", argv[0] if argv[0] != "-m" else argv[1], run(argv, timeout=180))
    # 13. an unreadable items_shuffle.json (another user's)
    nobody = as_nobody()
    if nobody is None:
        record("round six", "items_shuffle.json unreadable", "eval", "ok (not run)", "needs root and setpriv")
    else:
        locked = work / "r6-locked"
        shutil.rmtree(locked, ignore_errors=True)
        shutil.copytree(ROOT / "data" / "webshop", locked)
        os.chmod(work, 0o755)
        os.chmod(locked, 0o755)
        os.chmod(locked / "items_shuffle.json", 0o600)
        for command in ("eval.py", "train.py"):
            argv = ([command, "--env", "webshop", "--policy", "random", "--data-dir", str(locked)] if command == "eval.py"
                    else [command, *tiny, "--data-dir", str(locked), "--output-dir", "/tmp/r6-nobody-run"])
            proc = subprocess.run([*nobody, PY, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)
            case("items_shuffle.json unreadable", command.removesuffix(".py"), proc)
    # 14. tools.compare --gather-only on damaged records and an unwritable --out
    cmp = work / "r6-compare"
    for name, damage in (("truncated eval JSON", lambda run_dir: (run_dir / "eval_webshop_test_iter-000002.json").write_text("{")),
                         ("iter-best copy", lambda run_dir: shutil.copy(run_dir / "eval_webshop_test_iter-000002.json",
                                                                        run_dir / "eval_webshop_test_iter-best.json")),
                         ("record without success", lambda run_dir: json_edit(run_dir / "eval_webshop_test_iter-000002.json",
                                                                              lambda d: d.pop("success"))),
                         ("record a list", lambda run_dir: (run_dir / "eval_webshop_test_iter-000002.json").write_text("[]")),
                         ("truncated config.json", lambda run_dir: (run_dir / "config.json").write_text("{"))):
        shutil.rmtree(cmp, ignore_errors=True)
        cmp.mkdir()
        shutil.copytree(r1, cmp / "sharpo-seed0", symlinks=True)
        damage(cmp / "sharpo-seed0")
        proc = run(["-m", "tools.compare", "--algos", "sharpo", "--seeds", "0", "--gather-only", "--eval-split", "test",
                    "--out", str(cmp), "--", *tiny[:-2], "--iterations", "2"])
        case(f"compare: {name}", "compare", proc)
    # 17. stdin and stdout closed
    out = work / "r6-closed"
    shutil.rmtree(out, ignore_errors=True)
    proc = subprocess.run(["bash", "-c", " ".join([PY, "train.py", *tiny, "--output-dir", str(out)]) + " >&- <&-"],
                          cwd=ROOT, stderr=subprocess.PIPE, text=True, timeout=600, env=ENV)
    proc.stdout = ""
    case("stdin and stdout closed", "train", proc, lambda: "ok" if (out / "latest").exists() else "NO CHECKPOINT")
    # also seen: abbreviations, a model that is not one, a run without samples, --history, a one-time --plain
    case("--mode tiny (an abbreviation)", "train", run(["train.py", "--mode", "tiny"]))
    for tool in ("tools.bench", "tools.credit", "tools.warmstart"):
        case(f"{tool} --model not-a-model", tool.split(".")[1], run(["-m", tool, "--model", "no/such-model-xyz"], timeout=180))
    for tool in ("tools.credit", "tools.warmstart"):
        case(f"{tool} --history zz", tool.split(".")[1], run(["-m", tool, "--history", "zz"], timeout=180))
    none = work / "r6-no-samples"
    shutil.rmtree(none, ignore_errors=True)
    assert run(["train.py", *tiny, "--samples-per-iter", "0", "--output-dir", str(none)]).returncode == 0
    case("plots of a --samples-per-iter 0 run", "plots", run(["-m", "tools.plots", str(none)]),
         lambda: "ok" if (none / "curves.png").exists() else "NO CURVES")
    proc = run(["train.py", "--resume", str(none), "--iterations", "2", "--plain"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    code = ("import train; a = train.parse_args(['--resume', %r, '--iterations', '3']); print(a.plain)" % str(none))
    proc = subprocess.run([PY, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, env=ENV)
    case("a one-time --resume --plain", "resume", proc,
         lambda: "ok" if proc.stdout.strip().splitlines()[-1] == "False" else "PLAIN STAYED ON")


SECTIONS = ("signals", "disk", "writers", "flags", "folders", "data", "round4", "round5", "round6", "round7")
OK = ("one-line error", "ok", "unchanged task", "identical resume", "finished first", "one-line stop", "ok (it fitted)",
      "one refused, run intact", "one refused (the other had finished), run intact", "refused, run intact",
      "ok (not run)")


def round_seven(work: Path, marker: Path, record) -> None:
    """Round seven (issue 73), a class of cases for each root: provenance from the parser (every spelling,
    --help anywhere), empty is not absent, a name claimed before the work, a shared file under a lock, a
    record used only for what it measured, old run folders' relative data, the stream's own encoding, the
    verl bridge's settings before Ray (with .venv-verl only)."""
    def case(root, name, command, proc, check=None):
        outcome = verdict(proc, marker)
        if outcome == "ok" and check is not None:
            outcome = check()
        record(f"r7 {root}", name, command, outcome, last_line(proc.stderr)[:90])

    tiny = [*TINY_WEBSHOP, "--hindsight", "expert", "--seed", "3"]
    r = work / "r7-run"
    shutil.rmtree(r, ignore_errors=True)
    assert run(["train.py", *tiny, "--output-dir", str(r)]).returncode == 0
    logged = (r / "metrics.jsonl").read_text()
    # provenance from the parser
    for argv in (["--resume", str(r), "--iterations", "3", "--help"], ["--help", "--resume", str(r), "--iterations", "4"]):
        proc = run(["train.py", *argv])
        case("provenance", " ".join(a for a in argv if a.startswith("-")), "train", proc,
             lambda: "ok" if (r / "metrics.jsonl").read_text() == logged and "usage" in proc.stdout else "TRAINED")
    for spelling in (["--max_steps", "5"], ["--max_steps=5"], ["--lora_r", "8"], ["--shuffle_rewards"]):
        proc = run(["train.py", "--resume", str(r), "--iterations", "2", *spelling])
        case("provenance", f"resume {spelling[0]}", "train", proc, lambda: "RAN A CHANGED EXPERIMENT")
    branch = work / "r7-branch"
    shutil.rmtree(branch, ignore_errors=True)
    proc = run(["train.py", "--resume", str(r), "--iterations", "2", "--output_dir", str(branch)])
    case("provenance", "resume --output_dir NEW", "train", proc,
         lambda: "ok" if (branch / "checkpoints" / "iter-000002").is_dir() and (r / "metrics.jsonl").read_text() == logged
         else "TRAINED IN PLACE")
    # empty is not absent
    for argv in (["train.py", "--resume", ""], ["train.py", *tiny, "--model", "", "--output-dir", str(work / "r7-e")],
                 ["eval.py", "--policy", "model", "--checkpoint", ""], ["-m", "tools.credit", "--checkpoint", ""]):
        case("empty", f"{argv[1] if argv[0] == '-m' else argv[0]} {argv[-2] if argv[-1] == '' else '--model'} ''",
             "cli", run(argv))
    # a name claimed before the work: two evaluations of one checkpoint at once
    procs = [subprocess.Popen([PY, "eval.py", "--policy", "model", "--checkpoint", str(r), "--num-games", "2",
                               "--max-steps", "1"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=ENV) for _ in range(2)]
    outs = [proc.communicate(timeout=600) for proc in procs]
    kept = sorted(p.name for p in r.glob("evalpy_*.json") if p.stat().st_size > 0)
    record("r7 claimed", "two eval.py at once", "eval", "ok" if len(kept) == 2 and all(p.returncode == 0 for p in procs)
           else f"{len(kept)} RESULTS KEPT", outs[1][1].strip()[-90:])
    # a shared file under a lock: two precision measurements into one fresh cache
    cache = work / "r7-cache"
    shutil.rmtree(cache, ignore_errors=True)
    code = ("import sys; sys.path.insert(0, '.'); import time; from infra import precision; "
            "precision.measured_cpu_dtype(sys.argv[1], once=lambda bf16: time.sleep(0.05) or (0.01 if bf16 else 0.03), "
            "cap_s=1.0)")
    procs = [subprocess.Popen([PY, "-c", code, model], cwd=ROOT, env={**ENV, "SHARPO_CACHE": str(cache)})
             for model in ("tiny", "smollm2")]
    for proc in procs:
        proc.wait(timeout=300)
    records = json.loads((cache / "dtype.json").read_text()) if (cache / "dtype.json").is_file() else {}
    record("r7 locked", "two measurements at once", "precision", "ok" if len(records) == 2 else f"{len(records)} KEPT")
    # a record used only for what it measured
    proc = run(["eval.py", "--policy", "model", "--checkpoint", str(r), "--out", str(r / "eval_webshop_test_iter-000004.json")])
    case("records", "eval --out named as a later in-loop record", "eval", proc)
    # old run folders: a relative --data-dir from another working folder
    a, b = work / "r7-a", work / "r7-b"
    for folder in (a, b):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
    shutil.copytree(r, a / "run")
    shutil.copytree(ROOT / "data" / "webshop", a / "shop")
    one_goal_shop(b / "shop")
    for config in (a / "run" / "config.json", *sorted((a / "run" / "checkpoints").glob("iter-*/config.json"))):
        json_edit(config, lambda c: {**c, "data_dir": "shop"})
    for name, tool in (("eval.py", [str(ROOT / "eval.py"), "--policy", "model", "--num-games", "1"]),
                       ("tools.credit", ["-m", "tools.credit", "--games", "1"])):
        proc = subprocess.run([PY, *tool, "--checkpoint", str(a / "run"), "--out", str(b / "out")], cwd=b,
                              capture_output=True, text=True, timeout=600, env={**ENV, "PYTHONPATH": str(ROOT)})
        case("old folders", f"{name} relative data from elsewhere", "eval", proc)
    # the stream's own encoding
    for variables in ({"PYTHONIOENCODING": "ascii"}, {"LC_ALL": "C", "PYTHONUTF8": "0"}):
        folder = work / f"r7-ascii-{len(variables)}"
        shutil.rmtree(folder, ignore_errors=True)
        proc = subprocess.run([PY, "train.py", *tiny, "--output-dir", str(folder)], cwd=ROOT, capture_output=True,
                              text=True, errors="replace", timeout=600, env={**ENV, **variables})
        case("encoding", " ".join(variables), "train", proc)
    # the verl bridge's settings, checked before Ray starts
    verl = ROOT / ".venv-verl" / "bin" / "python"
    if verl.exists():
        for setting in ("granularity=tokens", "shape=Exp", "episode_stats=steps", "success_above=nan"):
            code = ("from hydra import compose, initialize_config_dir; import verl.trainer.config as c; "
                    "from verl_bridge.main_sharpo import check_config\n"
                    "with initialize_config_dir(config_dir=str(c.__path__[0]), version_base=None):\n"
                    f"    cfg = compose(config_name='ppo_trainer', overrides=['algorithm.adv_estimator=grpo', "
                    f"'trainer.use_v1=False', '+sharpo.layout=per_trajectory', '+sharpo.{setting}'])\n"
                    "try:\n    check_config(cfg)\nexcept ValueError as err:\n    raise SystemExit(f'error: {err}')")
            proc = subprocess.run([str(verl), "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, env=ENV)
            outcome = "one-line error" if proc.returncode == 1 and "error: sharpo." in proc.stderr else \
                "TRAINED SOMETHING ELSE" if proc.returncode == 0 else f"exit {proc.returncode}"
            record("r7 verl", setting, "verl", outcome, last_line(proc.stderr)[:90])
    else:
        print("   (no .venv-verl: the verl cases are skipped; bash verl_bridge/install_verl.sh makes it)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="work folder (default: a temporary one)")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {', '.join(SECTIONS)}")
    args = ap.parse_args()
    only = set(args.only.split(","))
    if only - set(SECTIONS):
        ap.error(f"--only: unknown {', '.join(sorted(only - set(SECTIONS)))}; choose from {', '.join(SECTIONS)}")
    work = Path(args.out or tempfile.mkdtemp(prefix="sweep-"))
    work.mkdir(parents=True, exist_ok=True)
    marker = work / "pwned"
    counts, bad = {}, []

    def record(kind: str, name: str, command: str, outcome: str, detail: str = "") -> None:
        counts.setdefault(kind, {}).setdefault(outcome, 0)
        counts[kind][outcome] += 1
        ok = outcome in OK
        print(f"{'  ' if ok else '!!'} {kind:12s} {command:8s} {name:38s} {outcome} {detail}", flush=True)
        if not ok:
            bad.append((kind, name, command, outcome, detail))

    if only & {"signals", "disk", "writers"}:
        reference_folder = work / "reference"
        shutil.rmtree(reference_folder, ignore_errors=True)
        proc = stub(reference_folder)
        loading = started(reference_folder, proc)
        t0 = time.time()
        code, _, err = finish(proc)
        assert code == 0, err[-3000:]
        seconds, reference = time.time() - t0, run_result(reference_folder)
        print(f"the uninterrupted stub run: {loading:.0f} s to start, {seconds:.0f} s of training", flush=True)
        if "signals" in only:
            signal_cases(work, reference, seconds, record)
        if "disk" in only:
            disk_cases(work, reference, record)
        if "writers" in only:
            writer_cases(work, reference, record)
    if "flags" in only:
        flags_section(work, marker, record)
    if "round4" in only:
        round_four(work, marker, record)
    if "round5" in only:
        round_five(work, marker, record)
    if "round6" in only:
        round_six(work, marker, record)
    if "round7" in only:
        round_seven(work, marker, record)
    base = work / "base"
    if "folders" in only and not base.exists():
        tiny_run(base)
    for name, damage in (run_folder_cases(marker) if "folders" in only else {}).items():
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
                               ("webshop", webshop_cases(), ROOT / "data" / "webshop")) if "data" in only else ():
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
