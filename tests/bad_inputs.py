"""Every bad input through the real command lines gets one line, a resume, or its run intact.

Crafted run folders and corrupted data sets, signals, a full disk, two writers on one run folder, flags at
their edges, damaged checkpoints, logs and records, paths a file system cannot take, closed streams and
other encodings, each through the real command lines, and every outcome classified. Not part of the test
suite (it takes ~30 minutes); the suite tests each kind of case once, this counts them all.

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
those cases are skipped with a line otherwise), as are the cases run as another user (root and setpriv).

Run: python tests/bad_inputs.py [--out /tmp/bad-inputs] [--only SECTION,...]  (every section by default)

Sections, by the part each guards:
  signals       a stop (SIGINT, SIGTERM, SIGHUP) at any moment of a run, of its worker processes, of an eval
  disk          a run folder on a file system that fills at each of its writes
  writers       two writers on one run folder, and a second one after the .lock file was removed
  flags         flags at their edges, sizes that take days, abbreviations, a tool's --model, --history, split
  cli           which flags a command line gave (every spelling, --help anywhere), an empty value
  folders       crafted or damaged run folders, a run aimed inside another, another user's run folder
  data          corrupted data sets, a split with no task, a price that is no number, another user's data
  checkpoints   a diverged policy: at the step that made it, and its checkpoint at resume and at eval
  resume        branching, a copied checkpoint, an edited config or log, what a resume may change
  trained-data  a checkpoint played on its own env, data and settings (resume, eval.py, tools.credit)
  records       eval.py's records beside a run's own and at once, compare and plots on damaged ones
  paths         an output that cannot be written, a name or path too long, in every path flag
  streams       an output that closes or fills, stdin and stdout closed
  encoding      an ASCII stdout, the C locale, a run folder named données
  workers       a frozen ALFWorld worker, at a short timeout and at the default
  models        the embedded model's cache on a full file system
  precision     the --dtype auto cache: damaged, a FIFO, two measurements into it at once
  updates       an update without signal (every group tied) moves no weight, on either path
  verl          the verl bridge's settings, checked before Ray starts (with .venv-verl only)
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
        # well-formed files that are not what they claim
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


# ----------------------------------------------------------------------------- shared by the sections below
TINY = [*TINY_WEBSHOP, "--hindsight", "expert", "--seed", "3"]
MADE: dict[str, Path] = {}


def made_once(work: Path, name: str, argv: list[str]) -> Path:
    """work/name: a finished run of `train.py ARGV`, made afresh the first time a section asks for it in this
    process (the sections that read it share it)."""
    folder = work / name
    if name not in MADE:
        shutil.rmtree(folder, ignore_errors=True)
        proc = run(["train.py", *argv, "--output-dir", str(folder)])
        assert proc.returncode == 0, proc.stderr[-2000:]
        MADE[name] = folder
    return folder


def base_run(work: Path) -> Path:
    """work/base: the tiny WebShop run of tiny_run() (2 iterations, 2 checkpoints), kept between calls."""
    base = work / "base"
    if not base.exists():
        tiny_run(base)
    return base


def cases_of(kind: str, marker: Path, record):
    """case(name, command, proc, check=None): records proc's verdict under `kind`; where it ended well,
    check() says whether it did what it should."""
    def case(name, command, proc, check=None):
        outcome = verdict(proc, marker)
        if outcome == "ok" and check is not None:
            outcome = check()
        record(kind, name, command, outcome, last_line(proc.stderr)[:90])
    return case


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
              f"SHARPO_CACHE={tempfile.gettempdir()}/bad-inputs-nobody-cache"]
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        return None
    probe = subprocess.run([*prefix, PY, "-c", "import torch"], capture_output=True, timeout=120)
    return prefix if probe.returncode == 0 else None


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


def damaged_resumes(work: Path, base: Path, marker: Path, record, kind: str, cases: dict) -> None:
    """Resume a copy of `base` damaged by each case (None: a run on its own copy of the catalog, whose goals
    change after the run), and record what the resume did."""
    for name, damage in cases.items():
        folder = work / "damaged-resumes" / name.replace(" ", "_").replace("/", "_")
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
        record(kind, name, "resume", outcome, last_line(proc.stderr)[:90])


# ----------------------------------------------------------------------------- signals: a hangup, an eval
def hangup_and_eval_stops(work: Path, record) -> None:
    """SIGHUP mid-run (the terminal closed), and SIGTERM to an eval.py, whose line must not say to resume a
    training run."""
    hup = work / "signals" / "hup"
    shutil.rmtree(hup, ignore_errors=True)
    proc = stub(hup)
    started(hup, proc)
    deadline = time.time() + 300
    while not (hup / "latest").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGHUP)
    code, _, err = finish(proc)
    outcome = "finished first" if code == 0 else stop_verdict(code, err, 129)
    record("signals", "SIGHUP mid-run", "train", outcome, last_line(err)[:90])
    proc = subprocess.Popen([PY, "eval.py", "--env", "webshop", "--policy", "random", "--num-games", "40"], cwd=ROOT,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    time.sleep(8)
    proc.send_signal(signal.SIGTERM)
    code, _, err = finish(proc)
    outcome = "finished first" if code == 0 else stop_verdict(code, err, 143)
    if "train.py --resume" in err:
        outcome = "TOLD TO RESUME TRAINING"
    record("signals", "SIGTERM of an eval", "eval", outcome, last_line(err)[:90])


# ----------------------------------------------------------------------------- writers: the lock file
def lock_file_removed(work: Path, marker: Path, record) -> None:
    """A second writer onto a folder whose run goes on after its .lock file was removed."""
    folder = work / "writers" / "lock-removed"
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
    record("two writers", "second writer after .lock was removed", "train",
           "refused, run intact" if still and code2 == 2 and "in use" in err2
           else f"exit {code2} (first running: {still})")


# ----------------------------------------------------------------------------- flags: sizes, names, defaults
def more_flag_cases(work: Path, marker: Path, record) -> None:
    """Sizes that take days and a PPO clip past 1, an abbreviated flag, a --model that is no model and a
    --history that is no number in the tools, and tools.credit's default split for WebShop."""
    case = cases_of("edge flags", marker, record)
    for flag in (["--minibatches", "100000000"], ["--ppo-epochs", "100000000"], ["--ppo-clip", "1e300"]):
        case(" ".join(flag), "train", run(["train.py", *TINY, *flag, "--output-dir", str(work / "flags" / "sizes")],
                                          timeout=180))
    case("--mode tiny (an abbreviation)", "train", run(["train.py", "--mode", "tiny"]))
    for tool in ("tools.bench", "tools.credit", "tools.warmstart"):
        case(f"{tool} --model not-a-model", tool.split(".")[1],
             run(["-m", tool, "--model", "no/such-model-xyz"], timeout=180))
    for tool in ("tools.credit", "tools.warmstart"):
        case(f"{tool} --history zz", tool.split(".")[1], run(["-m", tool, "--history", "zz"], timeout=180))
    proc = run(["-m", "tools.credit", "--env", "webshop", "--seeds", "x"])
    outcome = verdict(proc, marker)
    if "split" in last_line(proc.stderr):
        outcome = "REFUSED ITS OWN SPLIT"
    record("edge flags", "credit --env webshop, its default split (with --seeds x)", "credit", outcome,
           last_line(proc.stderr)[:90])


# ----------------------------------------------------------------------------- cli: which flags were given
def cli_cases(work: Path, marker: Path, record) -> None:
    """Which flags a command line gave, read from the parser in every spelling it takes (--help anywhere runs
    nothing, --max_steps is --max-steps to a resume, --output_dir branches), and an empty value, which is an
    error, never the default."""
    case = cases_of("cli", marker, record)
    r = made_once(work, "seeded-run", TINY)
    logged = (r / "metrics.jsonl").read_text()
    for argv in (["--resume", str(r), "--iterations", "3", "--help"],
                 ["--help", "--resume", str(r), "--iterations", "4"]):
        proc = run(["train.py", *argv])
        case(" ".join(a for a in argv if a.startswith("-")), "train", proc,
             lambda: "ok" if (r / "metrics.jsonl").read_text() == logged and "usage" in proc.stdout else "TRAINED")
    for spelling in (["--max_steps", "5"], ["--max_steps=5"], ["--lora_r", "8"], ["--shuffle_rewards"]):
        proc = run(["train.py", "--resume", str(r), "--iterations", "2", *spelling])
        case(f"resume {spelling[0]}", "train", proc, lambda: "RAN A CHANGED EXPERIMENT")
    branch = work / "cli-branch"
    shutil.rmtree(branch, ignore_errors=True)
    proc = run(["train.py", "--resume", str(r), "--iterations", "2", "--output_dir", str(branch)])
    case("resume --output_dir NEW", "train", proc,
         lambda: "ok" if (branch / "checkpoints" / "iter-000002").is_dir()
         and (r / "metrics.jsonl").read_text() == logged else "TRAINED IN PLACE")
    for argv in (["train.py", "--resume", ""],
                 ["train.py", *TINY, "--model", "", "--output-dir", str(work / "cli-empty")],
                 ["eval.py", "--policy", "model", "--checkpoint", ""], ["-m", "tools.credit", "--checkpoint", ""]):
        case(f"{argv[1] if argv[0] == '-m' else argv[0]} {argv[-2] if argv[-1] == '' else '--model'} ''", "cli",
             run(argv))


# ----------------------------------------------------------------------------- folders: runs in runs, other users
def runs_inside_runs(work: Path, marker: Path, record) -> None:
    """A new run aimed at another run's latest, one of its checkpoints, its checkpoints/ or a folder below it:
    refused, the other run byte for byte as it was."""
    base = base_run(work)
    for inside in ("latest", "checkpoints/iter-000001", "checkpoints", "sub/run"):
        before = snapshot(base)
        proc = run(["train.py", *TINY_WEBSHOP, "--output-dir", str(base / inside)])
        outcome = verdict(proc, marker)
        if outcome == "one-line error":
            outcome = "refused, run intact" if snapshot(base) == before else "REFUSED, RUN CHANGED"
        record("run folder", f"new run in base/{inside}", "train", outcome, last_line(proc.stderr)[:90])


def another_users_run(work: Path, marker: Path, record) -> None:
    """eval.py, as user nobody, of a run whose checkpoints/ is of mode 700, then whose adapter is of mode 000."""
    nobody = as_nobody()
    if nobody is None:
        record("run folder", "as another user (not run: needs root and setpriv)", "eval", "ok (not run)")
        return
    shared = Path(tempfile.mkdtemp(prefix="bad-inputs-shared-"))
    os.chmod(shared, 0o777)  # nobody writes its --out here
    locked = shared / "run"
    shutil.copytree(base_run(work), locked, symlinks=True)
    subprocess.run(["chmod", "-R", "a+rX", str(locked)], check=True)
    os.chmod(locked / "checkpoints", 0o700)
    proc = subprocess.run([*nobody, PY, "eval.py", "--policy", "model", "--checkpoint", str(locked), "--out",
                           str(shared / "e.json")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    record("run folder", "checkpoints/ of mode 700, another user", "eval", verdict(proc, marker),
           last_line(proc.stderr)[:90])
    os.chmod(locked / "checkpoints", 0o755)
    os.chmod(locked / "checkpoints" / "iter-000002" / "adapter_model.safetensors", 0)
    proc = subprocess.run([*nobody, PY, "eval.py", "--policy", "model", "--checkpoint", str(locked), "--out",
                           str(shared / "e.json")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    outcome = verdict(proc, marker)
    if outcome == "one-line error" and "missing" in last_line(proc.stderr):
        outcome = "SAID MISSING"
    record("run folder", "an adapter of mode 000, another user", "eval", outcome, last_line(proc.stderr)[:90])
    shutil.rmtree(shared, ignore_errors=True)


# ----------------------------------------------------------------------------- data: empty splits, prices, other users
def empty_splits_and_prices(work: Path, marker: Path, record) -> None:
    """A WebShop folder with one goal (every split but test empty) for tools.credit, eval.py and train.py (a
    draw from nothing must not hang), and a price that is not a number."""
    case = cases_of("webshop data", marker, record)
    shop = one_goal_shop(work / "data-one-goal")
    proc = run(["-m", "tools.credit", "--env", "webshop", "--data-dir", str(shop), "--split", "train", "--games", "1",
                "--group-size", "2", "--seeds", "0", "--out", str(work / "data-credit-empty")])
    case("credit on an empty split", "credit", proc)
    for split in ("train", "test"):  # the one goal is a test goal: train is empty
        record_path = work / f"data-one-goal-{split}.json"
        record_path.unlink(missing_ok=True)
        proc = run(["eval.py", "--env", "webshop", "--policy", "random", "--split", split, "--data-dir", str(shop),
                    "--out", str(record_path)])
        case(f"eval on one goal, --split {split}", "eval", proc,
             lambda: "ok" if json.loads(record_path.read_text())["episodes"] > 0 else "0 EPISODES AS A RESULT")
    try:
        proc = run(["train.py", *TINY, "--data-dir", str(shop), "--output-dir", str(work / "data-one-goal-run")],
                   timeout=180)
        case("train on one goal", "train", proc)
    except subprocess.TimeoutExpired:
        record("webshop data", "train on one goal", "train", "HANG")
    bad = work / "data-price"
    shutil.rmtree(bad, ignore_errors=True)
    shutil.copytree(ROOT / "data" / "webshop", bad)
    json_edit(bad / "items_shuffle.json", lambda d: d[0].update(pricing="$abc"))
    case("price $abc", "eval", run(["eval.py", "--env", "webshop", "--policy", "expert", "--data-dir", str(bad)]))


def another_users_data(work: Path, marker: Path, record) -> None:
    """As user nobody: an ALFWorld game whose traj_data.json is of mode 000 (eval.py), and a WebShop
    items_shuffle.json of mode 600 (eval.py and train.py)."""
    nobody = as_nobody()
    if nobody is None:
        record("alfworld data", "as another user (not run: needs root and setpriv)", "eval", "ok (not run)")
        record("webshop data", "items_shuffle.json unreadable", "eval", "ok (not run)", "needs root and setpriv")
        return
    shared = Path(tempfile.mkdtemp(prefix="bad-inputs-shared-"))
    os.chmod(shared, 0o777)  # nobody writes its --out here
    data = shared / "alfworld"
    shutil.copytree(ROOT / "data" / "alfworld", data)
    subprocess.run(["chmod", "-R", "a+rX", str(data)], check=True)
    os.chmod(next(data.glob("json_2.1.1/valid_unseen/*/*/traj_data.json")), 0)
    proc = subprocess.run([*nobody, PY, "eval.py", "--policy", "expert", "--data-dir", str(data), "--out",
                           str(shared / "x.json")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    record("alfworld data", "an unreadable traj_data.json, another user", "eval", verdict(proc, marker),
           last_line(proc.stderr)[:90])
    shutil.rmtree(shared, ignore_errors=True)
    case = cases_of("webshop data", marker, record)
    locked = work / "data-locked"
    shutil.rmtree(locked, ignore_errors=True)
    shutil.copytree(ROOT / "data" / "webshop", locked)
    os.chmod(work, 0o755)
    os.chmod(locked, 0o755)
    os.chmod(locked / "items_shuffle.json", 0o600)
    for command in ("eval.py", "train.py"):
        argv = ([command, "--env", "webshop", "--policy", "random", "--data-dir", str(locked)] if command == "eval.py"
                else [command, *TINY, "--data-dir", str(locked), "--output-dir", "/tmp/bad-inputs-nobody-run"])
        proc = subprocess.run([*nobody, PY, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)
        case("items_shuffle.json unreadable", command.removesuffix(".py"), proc)


# ----------------------------------------------------------------------------- checkpoints: a diverged policy
def diverged_policy(work: Path, marker: Path, record) -> None:
    """--lr 1e30: refused in one line at the start (past --lr's range), never a checkpoint of a diverged
    policy; a checkpoint whose weights are near 1e30 is refused at resume and by a sampled eval."""
    # (the stub env: its rewards differ within a group, so the first step has a gradient to overflow)
    flags = [*STUB_FLAGS, "--output-dir", str(work / "checkpoints-diverge")]
    flags[flags.index("--lr") + 1] = "1e30"
    proc = subprocess.run([PY, "-c", STUB_DRIVER, *flags], cwd=ROOT, text=True, env=ENV, capture_output=True,
                          timeout=600)
    outcome = verdict(proc, marker)
    if outcome == "one-line error" and list((work / "checkpoints-diverge").glob("checkpoints/iter-*")):
        outcome = "CHECKPOINTED A DIVERGED POLICY"
    outcome = "DIVERGED UNSEEN" if outcome == "ok" else outcome
    record("checkpoints", "--lr 1e30", "train", outcome, last_line(proc.stderr)[:90])
    bad = work / "checkpoints-diverged"
    shutil.rmtree(bad, ignore_errors=True)
    shutil.copytree(base_run(work), bad, symlinks=True)
    weights = bad / "checkpoints" / "iter-000002" / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    from safetensors.torch import save_file
    save_file({k: v * 1e30 if "lora_B" in k else v for k, v in tensors.items()}, str(weights))
    for name, argv in (("resume of a diverged checkpoint", ["train.py", "--resume", str(bad), "--iterations", "3"]),
                       ("sampled eval of a diverged checkpoint", ["eval.py", "--policy", "model", "--checkpoint",
                                                                  str(bad), "--temperature", "1", "--num-games", "1"])):
        proc = run(argv)
        record("checkpoints", name, argv[0].removesuffix(".py"), verdict(proc, marker), last_line(proc.stderr)[:90])


# ----------------------------------------------------------------------------- resume
def resume_cases(work: Path, marker: Path, record) -> None:
    """Branching (from an older checkpoint, from a branch), a copied checkpoint folder resumed in place, an
    edited or invalid RUN/config.json, log lines that are no log lines, --iterations at or below the run's,
    --preset at a resume, a checkpoint's own bad value, and a one-time --plain."""
    base = base_run(work)
    for name, source, out in (("branch from an older checkpoint", base / "checkpoints" / "iter-000001",
                               work / "resume-b1"),
                              ("branch of a branch", work / "resume-b1", work / "resume-b2")):
        shutil.rmtree(out, ignore_errors=True)
        proc = run(["train.py", "--resume", str(source), "--output-dir", str(out), "--iterations", "3"])
        outcome = verdict(proc, marker)
        logged = [json.loads(x)["iteration"] for x in (out / "metrics.jsonl").read_text().splitlines()] \
            if (out / "metrics.jsonl").exists() else []
        if outcome == "ok" and logged != list(range(1, 4)):
            outcome = f"LOGGED {logged}"
        record("resume", name, "resume", outcome)
    loop = work / "resume-copied-checkpoint"
    shutil.rmtree(loop, ignore_errors=True)
    shutil.copytree(base / "checkpoints" / "iter-000001", loop)
    proc = run(["train.py", "--resume", str(loop), "--iterations", "3"])
    record("resume", "resume of a copied checkpoint folder", "resume", verdict(proc, marker),
           (proc.stderr.strip().splitlines() or [""])[-1][:90])
    damaged_resumes(work, base, marker, record, "resume", {
        "an edited RUN/config.json (lr)": lambda f: json_edit(f / "config.json", lambda c: {**c, "lr": 0.5}),
        "an invalid RUN/config.json": lambda f: (f / "config.json").write_text("{oops"),
        "a non-UTF-8 byte in metrics line 1": lambda f: (f / "metrics.jsonl").write_bytes(
            b'{"iteration": 1, "succ\xffess": 0.5}\n' + (f / "metrics.jsonl").read_bytes().split(b"\n", 1)[1]),
        'a metrics line {"iteration": true}': lambda f: (f / "metrics.jsonl").write_text(
            (f / "metrics.jsonl").read_text() + json.dumps({"iteration": True, "success": 0.5}) + "\n"),
    })
    for name, argv in (("--resume --iterations 1 of a run at 2",
                        ["train.py", "--resume", str(base), "--iterations", "1"]),
                       ("--resume --preset cpu-demo", ["train.py", "--resume", str(base), "--iterations", "3",
                                                       "--preset", "cpu-demo"])):
        proc = run(argv)
        outcome = verdict(proc, marker)
        if "split" in last_line(proc.stderr):
            outcome = "REFUSED ITS OWN SPLIT"
        record("resume", name, argv[0].removesuffix(".py") if argv[0] != "-m" else argv[1], outcome,
               last_line(proc.stderr)[:90])
    own = work / "resume-own-value"
    shutil.rmtree(own, ignore_errors=True)
    shutil.copytree(base, own, symlinks=True)
    for path in [own / "config.json", *own.glob("checkpoints/*/config.json")]:
        json_edit(path, lambda c: {**c, "lr": -1.0})
    proc = run(["train.py", "--resume", str(own), "--iterations", "3"])
    outcome = verdict(proc, marker)
    if outcome == "one-line error" and "config.json" not in last_line(proc.stderr):
        outcome = "BLAMED A FLAG"
    record("resume", "a checkpoint's own bad value", "resume", outcome, last_line(proc.stderr)[:90])
    case = cases_of("resume", marker, record)
    none = made_once(work, "no-samples-run", [*TINY, "--samples-per-iter", "0"])
    proc = run(["train.py", "--resume", str(none), "--iterations", "2", "--plain"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    code = ("import train; a = train.parse_args(['--resume', %r, '--iterations', '3']); print(a.plain)" % str(none))
    proc = subprocess.run([PY, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, env=ENV)
    case("a one-time --resume --plain", "resume", proc,
         lambda: "ok" if proc.stdout.strip().splitlines()[-1] == "False" else "PLAIN STAYED ON")


# ----------------------------------------------------------------------------- trained-data
def trained_data_cases(work: Path, marker: Path, record) -> None:
    """A checkpoint is played on its own env, data and settings: a resume while $WEBSHOP_DATA points at another
    catalog, eval.py of a WebShop run without --env, eval.py of a run with its own history, steps and tokens,
    goals changed under the recorded data path, a relative --data-dir read from another working folder (a new
    run's, and an old run's as it was written) by eval.py and tools.credit, tools.credit on a WebShop run."""
    base = base_run(work)
    other = work / "trained-other-catalog"
    shutil.rmtree(other, ignore_errors=True)
    shutil.copytree(ROOT / "data" / "webshop", other)
    copy = work / "trained-data"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(base, copy, symlinks=True)
    proc = subprocess.run([PY, "train.py", "--resume", str(copy), "--iterations", "3"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**ENV, "WEBSHOP_DATA": str(other)})
    record("trained data", "resume under another $WEBSHOP_DATA", "resume", verdict(proc, marker),
           (proc.stderr.strip().splitlines() or [""])[-1][:90])
    proc = run(["eval.py", "--policy", "model", "--checkpoint", str(base), "--num-games", "1", "--max-steps", "2",
                "--max-new-tokens", "8", "--out", str(work / "trained-eval.json")])
    outcome = verdict(proc, marker)
    if outcome == "ok":
        outcome = "ok" if json.loads((work / "trained-eval.json").read_text())["config"]["env"] == "webshop" \
            else "WRONG ENV"
    record("trained data", "eval of a webshop run without --env", "eval", outcome)
    short = work / "trained-short"
    if not short.exists():
        proc = run(["train.py", *TINY_WEBSHOP[:-2], "--history", "1", "--max-steps", "2", "--max-new-tokens", "6",
                    "--output-dir", str(short)])
    proc = run(["eval.py", "--policy", "model", "--checkpoint", str(short), "--num-games", "1", "--out",
                str(work / "trained-short.json")])
    outcome = verdict(proc, marker)
    if outcome == "ok":
        config = json.loads((work / "trained-short.json").read_text())["config"]
        outcome = "ok" if (config["history"], config["max_steps"], config["max_new_tokens"]) == ("1", 2, 6) else \
            f"PLAYED {config['history']}, {config['max_steps']}, {config['max_new_tokens']}"
    record("trained data", "eval of a run: its own history, steps, tokens", "eval", outcome)
    damaged_resumes(work, base, marker, record, "trained data", {"goals changed under the data path": None})
    case = cases_of("trained data", marker, record)
    a, b = work / "trained-a", work / "trained-b"
    for folder in (a, b):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
    shutil.copytree(ROOT / "data" / "webshop", a / "shop")
    one_goal_shop(b / "shop")
    proc = subprocess.run([PY, str(ROOT / "train.py"), *TINY, "--data-dir", "shop", "--output-dir", "run"], cwd=a,
                          capture_output=True, text=True, timeout=600, env=ENV)
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = subprocess.run([PY, str(ROOT / "eval.py"), "--policy", "model", "--checkpoint", str(a / "run"),
                           "--num-games", "2", "--max-steps", "1", "--out", str(b / "e.json")], cwd=b,
                          capture_output=True, text=True, timeout=600, env=ENV)
    case("relative --data-dir, eval from elsewhere", "eval", proc,
         lambda: "ok" if json.loads((b / "e.json").read_text())["config"]["data_dir"] == str(a / "shop")
         else "PLAYED ANOTHER CATALOG")
    proc = run(["-m", "tools.credit", "--checkpoint", str(a / "run"), "--games", "1", "--group-size", "2",
                "--seeds", "0", "--max-steps", "2", "--out", str(work / "trained-credit")])
    case("credit on a WebShop checkpoint", "credit", proc,
         lambda: "ok" if json.loads((work / "trained-credit" / "credit.json").read_text())["config"]["env"] == "webshop"
         else "SCORED ON ANOTHER ENV")
    r = made_once(work, "seeded-run", TINY)
    a, b = work / "old-folder-a", work / "old-folder-b"
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
        case(f"{name} relative data from elsewhere (an old run)", "eval", proc)


# ----------------------------------------------------------------------------- records
def records_cases(work: Path, marker: Path, record) -> None:
    """eval.py beside the loop's own record of the same iteration (unchanged), two eval.py of one checkpoint at
    once (two results kept), an --out named as a later in-loop record, tools.compare --gather-only on damaged
    records, tools.plots of a run that logged no samples."""
    case = cases_of("records", marker, record)
    r1 = made_once(work, "evaluated-run", [*TINY[:-2], "--iterations", "2", "--eval-every", "1", "--eval-games", "3"])
    own = r1 / "eval_webshop_test_iter-000002.json"
    before = own.read_bytes()
    for k in range(2):
        proc = run(["eval.py", "--policy", "model", "--checkpoint", str(r1), "--num-games", "1", "--max-steps", "1"])
        case(f"eval.py beside the loop's record ({k + 1})", "eval", proc,
             lambda: "ok" if own.read_bytes() == before else "REPLACED THE LOOP'S RECORD")
    r = made_once(work, "seeded-run", TINY)
    procs = [subprocess.Popen([PY, "eval.py", "--policy", "model", "--checkpoint", str(r), "--num-games", "2",
                               "--max-steps", "1"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=ENV) for _ in range(2)]
    outs = [proc.communicate(timeout=600) for proc in procs]
    kept = sorted(p.name for p in r.glob("evalpy_*.json") if p.stat().st_size > 0)
    record("records", "two eval.py at once", "eval", "ok" if len(kept) == 2 and all(p.returncode == 0 for p in procs)
           else f"{len(kept)} RESULTS KEPT", outs[1][1].strip()[-90:])
    proc = run(["eval.py", "--policy", "model", "--checkpoint", str(r), "--out",
                str(r / "eval_webshop_test_iter-000004.json")])
    case("eval --out named as a later in-loop record", "eval", proc)
    cmp = work / "records-compare"
    last = "eval_webshop_test_iter-000002.json"  # the loop's record of the run's last iteration
    for name, damage in (("truncated eval JSON", lambda run_dir: (run_dir / last).write_text("{")),
                         ("iter-best copy", lambda run_dir: shutil.copy(run_dir / last,
                                                                        run_dir / "eval_webshop_test_iter-best.json")),
                         ("record without success", lambda run_dir: json_edit(run_dir / last,
                                                                              lambda d: d.pop("success"))),
                         ("record a list", lambda run_dir: (run_dir / last).write_text("[]")),
                         ("truncated config.json", lambda run_dir: (run_dir / "config.json").write_text("{"))):
        shutil.rmtree(cmp, ignore_errors=True)
        cmp.mkdir()
        shutil.copytree(r1, cmp / "sharpo-seed0", symlinks=True)
        damage(cmp / "sharpo-seed0")
        proc = run(["-m", "tools.compare", "--algos", "sharpo", "--seeds", "0", "--gather-only", "--eval-split", "test",
                    "--out", str(cmp), "--", *TINY[:-2], "--iterations", "2"])
        case(f"compare: {name}", "compare", proc)
    none = made_once(work, "no-samples-run", [*TINY, "--samples-per-iter", "0"])
    case("plots of a --samples-per-iter 0 run", "plots", run(["-m", "tools.plots", str(none)]),
         lambda: "ok" if (none / "curves.png").exists() else "NO CURVES")


# ----------------------------------------------------------------------------- paths
def paths_cases(work: Path, marker: Path, record) -> None:
    """eval.py --out under a file, a folder, /dev/full, a name of 300 bytes; a run folder whose path or name is
    too long; a path component over 255 bytes in every path flag of every script."""
    (work / "paths-afile").write_text("")
    (work / "paths-afolder").mkdir(exist_ok=True)
    for name, out in (("--out under a file", str(work / "paths-afile" / "x.json")),
                      ("--out a folder", str(work / "paths-afolder")),
                      ("--out /dev/full", "/dev/full"), ("--out name of 300 bytes", str(work / ("x" * 300)))):
        proc = run(["eval.py", "--env", "webshop", "--policy", "random", "--num-games", "1", "--max-steps", "1",
                    "--out", out])
        record("paths", name, "eval", verdict(proc, marker), (proc.stderr.strip().splitlines() or [""])[-1][:90])
    for name, out in (("run folder path of 4,000 bytes", str(work / "/".join(["d" * 200] * 20))),
                      ("run folder name of 300 bytes", str(work / ("n" * 300)))):
        proc = run(["train.py", *TINY_WEBSHOP, "--output-dir", out])
        record("paths", name, "train", verdict(proc, marker), (proc.stderr.strip().splitlines() or [""])[-1][:90])
    case = cases_of("paths", marker, record)
    long, folder = "/tmp/" + "x" * 300, str(work / "paths-l")
    for name, argv in (("--resume", ["train.py", "--resume", long]),
                       ("--data-dir (webshop)", ["train.py", *TINY, "--data-dir", long, "--output-dir", folder]),
                       ("--data-dir (alfworld)", ["train.py", "--model", "tiny", "--preset", "none", "--data-dir", long,
                                                  "--output-dir", folder]),
                       ("--init-adapter", ["train.py", *TINY, "--init-adapter", long, "--output-dir", folder]),
                       ("--model", ["train.py", "--model", long, "--preset", "none", "--output-dir", folder]),
                       ("eval --checkpoint", ["eval.py", "--policy", "model", "--checkpoint", long]),
                       ("eval --data-dir", ["eval.py", "--env", "webshop", "--policy", "random", "--data-dir", long]),
                       ("plots", ["-m", "tools.plots", long]),
                       ("compare --out", ["-m", "tools.compare", "--gather-only", "--out", long, "--", "--model",
                                          "tiny"])):
        case(f"a name over 255 bytes: {name}", argv[0] if argv[0] != "-m" else argv[1], run(argv, timeout=180))


# ----------------------------------------------------------------------------- streams
def streams_cases(work: Path, marker: Path, record) -> None:
    """An output that closes (train | head -1, then --resume) or fills (> /dev/full, 2> /dev/full) for train.py,
    eval.py (whose JSON must still be written) and tools.plots; a run with stdin and stdout closed."""
    base = base_run(work)
    out = work / "streams-pipe"
    shutil.rmtree(out, ignore_errors=True)
    proc = subprocess.Popen([PY, "train.py", *TINY_WEBSHOP[:-2], "--iterations", "3", "--output-dir", str(out)],
                            cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    proc.wait(timeout=600)
    outcome = stop_verdict(proc.returncode, err, 141)
    if outcome == "one-line stop":
        resumed = run(["train.py", "--resume", str(out)])
        outcome = outcome if resumed.returncode == 0 else f"stop, then resume {verdict(resumed, marker)}"
    record("streams", "train | head -1, then --resume", "train", outcome, last_line(err)[:90])
    for name, argv, stream in (("train > /dev/full", ["train.py", *TINY_WEBSHOP[:-2], "--output-dir",
                                                     str(work / "streams-full-out")], "stdout"),
                               ("train 2> /dev/full", ["train.py", *TINY_WEBSHOP[:-2], "--output-dir",
                                                      str(work / "streams-full-err")], "stderr"),
                               ("eval > /dev/full", ["eval.py", "--env", "webshop", "--policy", "random", "--num-games",
                                                    "2", "--out", str(work / "streams-full.json")], "stdout"),
                               ("plots > /dev/full", ["-m", "tools.plots", str(base)], "stdout")):
        for folder in (work / "streams-full-out", work / "streams-full-err"):
            shutil.rmtree(folder, ignore_errors=True)
        with open("/dev/full", "w") as full:
            done = subprocess.run([PY, *argv], cwd=ROOT, text=True, env=ENV, timeout=600,
                                  **({"stdout": full, "stderr": subprocess.PIPE} if stream == "stdout"
                                     else {"stdout": subprocess.PIPE, "stderr": full}))
        said = done.stderr if stream == "stdout" else done.stdout
        outcome = stop_verdict(done.returncode, said, 74)
        if name.startswith("eval") and outcome == "one-line stop" and not (work / "streams-full.json").is_file():
            outcome = "LOST ITS JSON"
        record("streams", name, argv[0].removesuffix(".py") if argv[0] != "-m" else argv[1], outcome,
               last_line(said)[:90])
    case = cases_of("streams", marker, record)
    out = work / "streams-closed"
    shutil.rmtree(out, ignore_errors=True)
    proc = subprocess.run(["bash", "-c", " ".join([PY, "train.py", *TINY, "--output-dir", str(out)]) + " >&- <&-"],
                          cwd=ROOT, stderr=subprocess.PIPE, text=True, timeout=600, env=ENV)
    proc.stdout = ""
    case("stdin and stdout closed", "train", proc, lambda: "ok" if (out / "latest").exists() else "NO CHECKPOINT")


# ----------------------------------------------------------------------------- encoding
def encoding_cases(work: Path, marker: Path, record) -> None:
    """LC_ALL=C with a run folder named données (its run, resume and plots); a run on an ASCII stdout
    (PYTHONIOENCODING=ascii) and under LC_ALL=C."""
    c_env = {**ENV, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    folder = work / "encoding-données"
    shutil.rmtree(folder, ignore_errors=True)
    outcomes = []
    for argv in (["train.py", *TINY_WEBSHOP[:-2], "--output-dir", str(folder)],
                 ["train.py", "--resume", str(folder), "--iterations", "2"], ["-m", "tools.plots", str(folder)]):
        proc = subprocess.run([PY, *argv], cwd=ROOT, capture_output=True, text=True, env=c_env, timeout=600)
        outcomes.append(verdict(proc, marker))
    record("encoding", "LC_ALL=C, a run folder named données", "train", "ok" if set(outcomes) == {"ok"} else
           next(o for o in outcomes if o != "ok"))
    case = cases_of("encoding", marker, record)
    for variables in ({"PYTHONIOENCODING": "ascii"}, {"LC_ALL": "C", "PYTHONUTF8": "0"}):
        folder = work / f"encoding-ascii-{len(variables)}"
        shutil.rmtree(folder, ignore_errors=True)
        proc = subprocess.run([PY, "train.py", *TINY, "--output-dir", str(folder)], cwd=ROOT, capture_output=True,
                              text=True, errors="replace", timeout=600, env={**ENV, **variables})
        case(" ".join(variables), "train", proc)


# ----------------------------------------------------------------------------- workers
def workers_cases(work: Path, marker: Path, record) -> None:
    """A SIGSTOPped ALFWorld worker, at --env-timeout 10 and at the default timeout."""
    record("workers", "a SIGSTOPped env worker", "env", frozen_worker("timeout=10", within=60))
    record("workers", "a SIGSTOPped worker, the default timeout", "env", frozen_worker("", within=45))


# ----------------------------------------------------------------------------- models
def models_cases(work: Path, marker: Path, record) -> None:
    """The embedded model's one-time conversion into a cache on a full file system (a 1 MiB tmpfs)."""
    mount = work / "models-tiny-cache"
    mount.mkdir(exist_ok=True)
    if os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                                            capture_output=True).returncode == 0:
        try:
            proc = subprocess.run([PY, "eval.py", "--policy", "model", "--model", "smollm2", "--num-games", "1",
                                   "--max-steps", "1", "--max-new-tokens", "4",
                                   "--out", str(work / "models-cache.json")],
                                  cwd=ROOT, capture_output=True, text=True, timeout=600,
                                  env={**ENV, "SHARPO_CACHE": str(mount)})
            record("models", "the model cache on a full file system", "eval", verdict(proc, marker),
                   last_line(proc.stderr)[:90])
        finally:
            subprocess.run(["umount", str(mount)], capture_output=True)
    else:
        record("models", "the model cache on a full file system (not run: no tmpfs)", "eval", "ok (not run)")


# ----------------------------------------------------------------------------- precision
def precision_cases(work: Path, marker: Path, record) -> None:
    """The --dtype auto cache (dtype.json) with a NaN ratio, a record without `measured`, a FIFO in its place;
    two processes measuring into one fresh cache at once (both records kept)."""
    case = cases_of("precision", marker, record)
    probe = "from infra.models import resolve_dtype; print(resolve_dtype('auto', 'cpu', 'smollm2'))"
    for name, write in (("NaN ratio", lambda p: p.write_text(json.dumps({"ratio": float("nan"), "dtype": "bf16"}))),
                        ("no measured", lambda p: p.write_text(json.dumps({"dtype": "bf16", "ratio": 0.4}))),
                        ("a FIFO", lambda p: os.mkfifo(p))):
        cache = work / f"precision-cache-{name.replace(' ', '-')}"
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir()
        write(cache / "dtype.json")
        try:
            proc = subprocess.run([PY, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300,
                                  env={**ENV, "SHARPO_CACHE": str(cache)})
            case(f"dtype.json {name}", "dtype", proc)
        except subprocess.TimeoutExpired:
            record("precision", f"dtype.json {name}", "dtype", "HANG")
    cache = work / "precision-cache-shared"
    shutil.rmtree(cache, ignore_errors=True)
    code = ("import sys; sys.path.insert(0, '.'); import time; from infra import precision; "
            "precision.measured_cpu_dtype(sys.argv[1], once=lambda bf16: time.sleep(0.05) or (0.01 if bf16 else 0.03), "
            "cap_s=1.0)")
    procs = [subprocess.Popen([PY, "-c", code, model], cwd=ROOT, env={**ENV, "SHARPO_CACHE": str(cache)})
             for model in ("tiny", "smollm2")]
    for proc in procs:
        proc.wait(timeout=300)
    records = json.loads((cache / "dtype.json").read_text()) if (cache / "dtype.json").is_file() else {}
    record("precision", "two measurements at once", "precision", "ok" if len(records) == 2 else f"{len(records)} KEPT")


# ----------------------------------------------------------------------------- updates
def updates_cases(work: Path, marker: Path, record) -> None:
    """Every group tied, --kl-coef 0.01, lr 1e-2: no LoRA weight moves, on the default path and with --plain."""
    case = cases_of("updates", marker, record)
    for way in ([], ["--plain"]):
        out = work / f"updates-tied{'-plain' if way else ''}"
        shutil.rmtree(out, ignore_errors=True)
        proc = run(["train.py", *TINY[:-2], "--iterations", "4", "--kl-coef", "0.01", "--lr", "1e-2", *way,
                    "--output-dir", str(out)])
        case(f"tied groups, KL 0.01, lr 1e-2 {' '.join(way)}", "train", proc,
             lambda: "ok" if lora_b_zero(out) else "WEIGHTS MOVED")


# ----------------------------------------------------------------------------- verl
def verl_cases(work: Path, marker: Path, record) -> None:
    """The verl bridge's sharpo settings that would train something else, refused before Ray starts (run only
    where .venv-verl exists; bash verl_bridge/install_verl.sh makes it)."""
    verl = ROOT / ".venv-verl" / "bin" / "python"
    if verl.exists():
        for setting in ("algo=RLSD", "algo=gigpo", "granularity=token", "episode_stats=steps", "success_above=nan"):
            code = ("from hydra import compose, initialize_config_dir; import verl.trainer.config as c; "
                    "from verl_bridge.main_sharpo import check_config\n"
                    "with initialize_config_dir(config_dir=str(c.__path__[0]), version_base=None):\n"
                    f"    cfg = compose(config_name='ppo_trainer', overrides=['algorithm.adv_estimator=grpo', "
                    f"'trainer.use_v1=False', '+sharpo.layout=per_trajectory', '+sharpo.{setting}'])\n"
                    "try:\n    check_config(cfg)\nexcept ValueError as err:\n    raise SystemExit(f'error: {err}')")
            proc = subprocess.run([str(verl), "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                                  env=ENV)
            outcome = "one-line error" if proc.returncode == 1 and "error: sharpo" in proc.stderr else \
                "TRAINED SOMETHING ELSE" if proc.returncode == 0 else f"exit {proc.returncode}"
            record("verl", setting, "verl", outcome, last_line(proc.stderr)[:90])
    else:
        print("   (no .venv-verl: the verl cases are skipped; bash verl_bridge/install_verl.sh makes it)", flush=True)


SECTIONS = ("signals", "disk", "writers", "flags", "cli", "folders", "data", "checkpoints", "resume", "trained-data",
            "records", "paths", "streams", "encoding", "workers", "models", "precision", "updates", "verl")
# the sections that are one function (work, marker, record), in the order they run
RUN_BY_ONE = {"cli": cli_cases, "checkpoints": diverged_policy, "resume": resume_cases,
              "trained-data": trained_data_cases, "records": records_cases, "paths": paths_cases,
              "streams": streams_cases, "encoding": encoding_cases, "workers": workers_cases, "models": models_cases,
              "precision": precision_cases, "updates": updates_cases, "verl": verl_cases}
OK = ("one-line error", "ok", "unchanged task", "identical resume", "finished first", "one-line stop", "ok (it fitted)",
      "one refused, run intact", "one refused (the other had finished), run intact", "refused, run intact",
      "ok (not run)")


# ----------------------------------------------------------------------------- folders and data: every crafted case
def folder_cases(work: Path, marker: Path, record) -> None:
    """Each of run_folder_cases() on a copy of the base run, resumed and evaluated."""
    base = base_run(work)
    for name, damage in run_folder_cases(marker).items():
        folder = work / "runs" / name.replace(" ", "_")
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(base, folder, symlinks=True)
        damage(folder)
        for command, argv in (("resume", ["train.py", "--resume", str(folder), "--iterations", "3"]),
                              ("eval", ["eval.py", "--policy", "model", "--checkpoint", str(folder), "--env", "webshop",
                                        "--num-games", "1", "--max-steps", "2", "--max-new-tokens", "8"])):
            proc = run(argv)
            record("run folder", name, command, verdict(proc, marker),
                   (proc.stderr.strip().splitlines() or [""])[-1][:110])


def data_cases(work: Path, marker: Path, record) -> None:
    """Each of alfworld_cases() and webshop_cases() on a copy of the shipped data: the expert's evaluation (its
    success must be the clean data's, or the data refused in one line) and a tiny training run."""
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
            record(f"{env} data", name, "train", verdict(proc, marker),
                   (proc.stderr.strip().splitlines() or [""])[-1][:110])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="work folder (default: a temporary one)")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {', '.join(SECTIONS)}")
    args = ap.parse_args()
    only = set(args.only.split(","))
    if only - set(SECTIONS):
        ap.error(f"--only: unknown {', '.join(sorted(only - set(SECTIONS)))}; choose from {', '.join(SECTIONS)}")
    work = Path(args.out or tempfile.mkdtemp(prefix="bad-inputs-"))
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
            hangup_and_eval_stops(work, record)
        if "disk" in only:
            disk_cases(work, reference, record)
        if "writers" in only:
            writer_cases(work, reference, record)
            lock_file_removed(work, marker, record)
    if "flags" in only:
        flags_section(work, marker, record)
        more_flag_cases(work, marker, record)
    if "folders" in only:
        folder_cases(work, marker, record)
        runs_inside_runs(work, marker, record)
        another_users_run(work, marker, record)
    if "data" in only:
        data_cases(work, marker, record)
        empty_splits_and_prices(work, marker, record)
        another_users_data(work, marker, record)
    for name, section in RUN_BY_ONE.items():
        if name in only:
            section(work, marker, record)

    print("\ncounts:")
    for kind, by in counts.items():
        print(f"  {kind:14s} " + ", ".join(f"{k}: {v}" for k, v in sorted(by.items())))
    print(f"failures: {len(bad)}; code executions: {int(marker.exists())}")
    (work / "bad_inputs.json").write_text(json.dumps({"counts": counts, "failures": bad}, indent=1))
    sys.exit(1 if bad or marker.exists() else 0)


if __name__ == "__main__":
    main()
