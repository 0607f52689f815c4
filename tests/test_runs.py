"""Runs resume and survive: --resume continues a run in its folder with its saved flags (and refuses
changes that would alter what is learned), and a kill at any point loses at most the iteration in
progress: the resumed run ends with the weights and metrics of the run that was never stopped."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import errors
import train
from infra import checkpoint
from infra.cli import UserError
from stub_env import StubEnv
from tiny_runs import flags, tiny_args, tiny_run_folder, tiny_train

ROOT = Path(__file__).resolve().parent.parent
TIMING = ("seconds/", "tokens_per_s", "peak_memory")


def _lora(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def _strip(m):
    return {k: v for k, v in m.items() if not k.startswith(TIMING)}


def test_resume_writes_into_the_folder_it_resumes(tmp_path, monkeypatch):
    """`--resume runs/X` without --output-dir continues in runs/X: its checkpoint and log move
    on; the default folder runs/<env>-<algo> is never created."""
    monkeypatch.chdir(tmp_path)
    run = tiny_run_folder(tmp_path, "X")
    args = train.parse_args(["--resume", str(run), "--iterations", "2"])
    assert Path(args.output_dir).resolve() == run.resolve()
    train.train(args, train.Trainer(args, env=StubEnv(args.max_steps)))
    assert json.loads((run / "latest" / "state.json").read_text())["iteration"] == 2
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    assert not (tmp_path / "runs").exists()
    branch = train.parse_args(["--resume", str(run), "--output-dir", str(tmp_path / "elsewhere")])  # a new run folder
    assert branch.output_dir == str(tmp_path / "elsewhere") and Path(branch.resume).parent.parent == run
    with pytest.raises(UserError, match="--output-dir .* already holds a run"):  # never into another run's folder
        train.parse_args(["--resume", str(run), "--output-dir", str(tiny_run_folder(tmp_path, "Y"))])


def test_resume_restores_every_saved_setting_and_refuses_changes(tmp_path):
    """Every saved flag comes back (not the command line's defaults); a flag that would change
    the experiment is refused by name; --iterations and eval/logging flags may change."""
    run = tiny_run_folder(tmp_path, algo="rlsd", lam=0.3, kl_coef=0.05, hindsight="expert", group_size=2)
    args = train.parse_args(["--resume", str(run), "--iterations", "3", "--eval-every", "5"])
    saved = json.loads((run / "config.json").read_text())
    for key in ("algo", "lam", "kl_coef", "hindsight", "group_size", "lora_r", "seed", "model", "load_in_4bit",
                "init_adapter", "preset", "max_steps"):
        assert getattr(args, key) == saved[key], key
    assert args.iterations == 3 and args.eval_every == 5
    for flag, value in (("--algo", "sharpo"), ("--lam", "0.5"), ("--kl-coef", "0.01"), ("--model", "smollm2")):
        with pytest.raises(UserError, match=re.escape(flag)):
            train.parse_args(["--resume", str(run), flag, value])
    train.parse_args(["--resume", str(run), "--algo", "rlsd"])  # the same value is no change


# After each stage of the loop (the Trainer method, wrapped here), and between the writes of the
# run folder (checkpoint.crash_hook, called where infra/checkpoint.py writes).
STAGES = {"rollout": "rollout", "segments": "segments", "advantage": "advantage", "logprobs": "logprobs",
          "credit": "credit", "update": "update", "iteration done": "iteration"}


KILL_POINTS = list(STAGES) + ["metrics logged", "samples logged", "checkpoint written", "checkpoint renamed",
                              "latest updated"]


class _Killed(BaseException):
    """Stands in for kill -9: unwinds without running any `except Exception` handler."""


def _on_second_pass(monkeypatch, point: str, act) -> None:
    """Call act() the second time the run passes `point` (so inside iteration 2): after the
    Trainer method of a stage, or at a write of the run folder (checkpoint.crash_hook)."""
    calls = {"n": 0}

    def hit(name):
        if name == point:
            calls["n"] += 1
            if calls["n"] == 2:
                act()

    if point in STAGES:
        method = getattr(train.Trainer, STAGES[point])

        def wrapped(self, *a, **k):
            result = method(self, *a, **k)
            hit(point)
            return result

        monkeypatch.setattr(train.Trainer, STAGES[point], wrapped)
    else:
        monkeypatch.setattr(checkpoint, "crash_hook", hit)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("straight") / "run"
    history, trainer = tiny_train(tiny_args(out))
    return history, _lora(trainer.model)


@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_kill_at_any_point_loses_at_most_one_iteration(tmp_path, monkeypatch, point, uninterrupted):
    """Killed at `point` of iteration 2 (an injected kill, not timing luck): the folder still
    resumes; the resumed run ends with the uninterrupted run's weights and metrics, each
    iteration logged once; what was lost is at most the iteration in progress."""
    history, weights = uninterrupted
    out = tmp_path / "run"

    def kill():
        raise _Killed(point)

    _on_second_pass(monkeypatch, point, kill)
    with pytest.raises(_Killed):
        tiny_train(tiny_args(out))
    monkeypatch.undo()
    done = checkpoint.read_iteration(checkpoint.find_checkpoint(out))
    assert done >= 1  # never more than the iteration in progress is lost
    with pytest.raises(UserError, match="--resume"):  # a restart without --resume deletes nothing
        train.train(tiny_args(out), None)
    resumed = train.parse_args(["--resume", str(out)])
    rest, trainer = tiny_train(resumed)
    assert [m["iteration"] for m in rest] == list(range(done + 1, 4))
    assert all(torch.equal(weights[n], p) for n, p in _lora(trainer.model).items())
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in logged] == [1, 2, 3]
    assert [_strip(m) for m in logged] == [_strip(m) for m in history]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["iter-000002", "iter-000003"]
    assert os.readlink(out / "latest") == "checkpoints/iter-000003"


# Where a stop may land: after each stage, and at the writes of the log and of a checkpoint, which
# hold a signal until they end (errors.signals_deferred): a stop inside a checkpoint keeps it.
KEPT_AFTER = {**{point: 1 for point in STAGES}, "metrics logged": 1, "samples logged": 1,
              "checkpoint written": 2, "checkpoint renamed": 2, "latest updated": 2}


def _resumes_to_the_uninterrupted_run(out, done, uninterrupted):
    history, weights = uninterrupted
    rest, trainer = tiny_train(train.parse_args(["--resume", str(out)]))
    assert [m["iteration"] for m in rest] == list(range(done + 1, 4))
    assert all(torch.equal(weights[n], p) for n, p in _lora(trainer.model).items())
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [_strip(m) for m in logged] == [_strip(m) for m in history]


def test_the_tiny_run_changes_its_weights(uninterrupted):
    """The signal and kill tests compare weights: that proves something only if training moves them."""
    _, weights = uninterrupted
    start = _lora(train.Trainer(tiny_args("unused")).model)
    assert any(not torch.equal(start[n], w) for n, w in weights.items())


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("point", list(KEPT_AFTER))
def test_a_signal_at_any_point_says_what_was_kept_and_resumes(tmp_path, monkeypatch, point, signum, uninterrupted):
    """A real SIGINT or SIGTERM sent to the run at `point` of iteration 2: the run stops with one
    message naming the iteration its folder kept and --resume; the resumed run ends with the
    uninterrupted run's weights and metrics."""
    out = tmp_path / "run"
    _on_second_pass(monkeypatch, point, lambda: os.kill(os.getpid(), signum))
    before = signal.getsignal(signal.SIGTERM)
    errors.catch_sigterm()
    try:
        with pytest.raises(errors.Stopped) as stopped:
            tiny_train(tiny_args(out))
    finally:
        signal.signal(signal.SIGTERM, before)
    monkeypatch.undo()
    done = checkpoint.read_iteration(checkpoint.find_checkpoint(out))
    assert done == KEPT_AFTER[point]
    assert stopped.value.terminated == (signum == signal.SIGTERM)
    assert f"keeps iteration {done} (checkpoints/iter-{done:06d}" in str(stopped.value)
    assert f"python train.py --resume {out}" in str(stopped.value)
    _resumes_to_the_uninterrupted_run(out, done, uninterrupted)


STOP_IN_UPDATE = """
import os, pathlib, sys, time
sys.path.insert(0, "tests")
import torch
torch.set_num_threads(1)
import train
from infra.cli import run
from tiny_runs import tiny_args, tiny_train
out, calls, update = sys.argv[1], [], train.Trainer.update
def update_then_wait(self, *stages):
    result = update(self, *stages)
    calls.append(1)
    if len(calls) == 2:  # iteration 2's update is done: say so, then wait for the signal
        pathlib.Path(out + ".ready").write_text("ready")
        time.sleep(120)
    return result
train.Trainer.update = update_then_wait
run(lambda: tiny_train(tiny_args(out)) and None)
"""


@pytest.mark.parametrize("signum, code, word", [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                                (signal.SIGINT, 130, "interrupted"),
                                                (signal.SIGHUP, 129, "hung up (SIGHUP)")],
                         ids=["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_signal_from_outside_is_one_line_and_no_traceback(tmp_path, signum, code, word, uninterrupted):
    """`kill PID` (or Ctrl-C) from outside, a run of its own process: exit 143 (130), no
    traceback, the last line names the iteration kept; --resume ends as the uninterrupted run."""
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", STOP_IN_UPDATE, str(out)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "OMP_NUM_THREADS": "1"})
    ready = Path(f"{out}.ready")
    deadline = time.time() + 240
    while not ready.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert ready.exists(), proc.communicate()
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (f"{word}: {out} keeps iteration 1 (checkpoints/iter-000001; what came "
                                            f"after it is run again); continue with python train.py --resume {out}")
    _resumes_to_the_uninterrupted_run(out, 1, uninterrupted)


def test_a_torn_log_line_does_not_stop_a_resume(tmp_path):
    """Half a JSON line at the end of metrics.jsonl / samples.jsonl (a kill mid-write) is
    dropped at resume; the log is rewritten through a temp file, whole lines only."""
    out = tmp_path / "run"
    tiny_train(tiny_args(out, iterations=1))
    for name in ("metrics.jsonl", "samples.jsonl"):
        with (out / name).open("a") as f:
            f.write('{"iteration": 2, "succ')
    rest, _ = tiny_train(train.parse_args(["--resume", str(out), "--iterations", "2"]))
    assert [m["iteration"] for m in rest] == [2]
    for name in ("metrics.jsonl", "samples.jsonl"):
        lines = (out / name).read_text().splitlines()
        assert all(json.loads(line)["iteration"] in (1, 2) for line in lines)


def test_resume_takes_the_newest_complete_checkpoint_and_keeps_n(tmp_path):
    """A half-written checkpoint folder (no state.json) is never resumed from; --keep-checkpoints
    keeps the newest N; an earlier kept checkpoint can be evaluated by its folder."""
    out = tmp_path / "run"
    tiny_train(tiny_args(out, iterations=3, keep_checkpoints=3))
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["iter-000001", "iter-000002", "iter-000003"]
    (out / "checkpoints" / "iter-000003" / "state.json").unlink()  # as if cut short
    assert checkpoint.find_checkpoint(out).name == "iter-000002"
    assert checkpoint.find_checkpoint(out / "checkpoints" / "iter-000001").name == "iter-000001"


def test_resuming_a_warm_started_run_past_pruned_checkpoints(tmp_path):
    """With a warm start, each checkpoint carries its copy; a resumed run keeps saving after the
    checkpoint it was resumed from has been pruned (keep 2, 4 iterations)."""
    from infra.models import load_policy

    warm, _ = load_policy("tiny", lora_r=2, lora_alpha=4, seed=5)
    warm.save_pretrained(tmp_path / "warm")
    out = tmp_path / "run"
    tiny_train(tiny_args(out, iterations=1, init_adapter=str(tmp_path / "warm")))
    tiny_train(train.parse_args(["--resume", str(out), "--iterations", "4"]))
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["iter-000003", "iter-000004"]
    assert (out / "latest" / "warmstart" / "adapter_model.safetensors").exists()


def test_resuming_an_older_checkpoint_is_refused_while_newer_ones_exist(tmp_path):
    out = tmp_path / "run"
    tiny_train(tiny_args(out, iterations=2))
    with pytest.raises(UserError, match="iter-000002"):
        train.parse_args(["--resume", str(out / "checkpoints" / "iter-000001")])


@pytest.mark.parametrize("signum, code, word", [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                                (signal.SIGINT, 130, "interrupted"),
                                                (signal.SIGHUP, 129, "hung up (SIGHUP)")],
                         ids=["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_signal_while_train_py_still_imports_is_one_line(tmp_path, signum, code, word):
    """The imports take seconds (torch, transformers): a stop then is one line, not a
    KeyboardInterrupt traceback from inside some import, and no run folder is made."""
    proc = subprocess.Popen([sys.executable, "train.py", "--model", "tiny", "--output-dir", str(tmp_path / "run")],
                            cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(1.0)  # past the interpreter's own start, well inside the imports
    assert proc.poll() is None
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code and "Traceback" not in err, err
    assert err.strip().splitlines() == [f"{word}: stopped while starting, before anything was written"]
    assert not (tmp_path / "run").exists()


def test_lora_on_the_last_layers_trains_them_alone_and_resumes_exactly(tmp_path):
    """--lora-layers 1 on the tiny model's 2 layers (the cpu-demo preset sets 10 of SmolLM2's 30): LoRA
    weights exist in layer 1 only, they move, and a run resumed after iteration 1 ends with the weights and
    metrics of the run that was never stopped."""
    whole_metrics, whole = tiny_train(tiny_args(tmp_path / "whole", lora_layers=1, iterations=2))
    lora = _lora(whole.model)
    assert lora and all(".layers.1." in n for n in lora), sorted(lora)
    start = _lora(train.Trainer(tiny_args(tmp_path / "fresh", lora_layers=1), env=StubEnv(2)).model)
    assert start.keys() == lora.keys() and any(not torch.equal(start[n], lora[n]) for n in lora)
    tiny_train(tiny_args(tmp_path / "cut", lora_layers=1, iterations=1))
    resumed_metrics, resumed = tiny_train(train.parse_args(["--resume", str(tmp_path / "cut"), "--iterations", "2"]))
    after = _lora(resumed.model)
    assert after.keys() == lora.keys() and all(torch.equal(after[n], lora[n]) for n in lora)
    assert _strip(resumed_metrics[-1]) == _strip(whole_metrics[-1])


def test_folding_adapters_keeps_the_layers_either_one_touches():
    """A warm start on every layer folded with a run's LoRA on the last layers covers every layer; two
    adapters on some layers each cover the union of them."""
    from peft import LoraConfig

    from infra.checkpoint import fold_adapters

    def cfg(layers):
        return LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], task_type="CAUSAL_LM",
                          **({"layers_to_transform": layers, "layers_pattern": "layers"} if layers else {}))

    def state(layer):
        m = f"base_model.model.model.layers.{layer}.self_attn.q_proj"
        return {f"{m}.lora_A.weight": torch.ones(2, 4), f"{m}.lora_B.weight": torch.ones(4, 2)}

    out, folded = fold_adapters(state(0), cfg(None), state(1), cfg([1]))
    assert folded.layers_to_transform is None and folded.r == 4 and len(out) == 4
    out, folded = fold_adapters(state(0), cfg([0]), state(1), cfg([1]))
    assert folded.layers_to_transform == [0, 1] and folded.layers_pattern == "layers"
    m = "base_model.model.model.layers.0.self_attn.q_proj"
    assert torch.equal(out[f"{m}.lora_A.weight"][2:], torch.zeros(2, 4))  # layer 0: the second adapter's half is 0


def test_a_run_ends_with_its_last_iterations_segments(tmp_path):
    """What train.py prints at the end: each sample trajectory of the last logged iteration, a line per
    step with its gap g and multiplier m (- where the teacher was not asked)."""
    import report

    run = tiny_run_folder(tmp_path, iterations=2, group_size=4, samples_per_iter=2)
    records = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    last = report.last_samples(run)
    assert last and {r["iteration"] for r in last} == {2} and len(last) < len(records)
    table = report.segments_table(last).splitlines()
    assert len(table) == sum(1 + len(r["segments"]) for r in last)
    steps = [line for line in table if line.startswith("  step ")]
    assert steps and all(" g " in line and " m " in line for line in steps)
    assert report.last_samples(tmp_path / "nothing") == [] and report.segments_table([]) == ""


def test_a_run_saved_with_the_old_flag_name_resumes(tmp_path):
    """--mult-eps is --eps-m now (METHOD.md's symbol): a run folder whose config.json says mult_eps
    resumes with its value under the new name, and is saved under it."""
    run = tiny_run_folder(tmp_path, eps_m=0.3)
    for path in [run / "config.json", *run.glob("checkpoints/*/config.json")]:
        saved = json.loads(path.read_text())
        saved["mult_eps"] = saved.pop("eps_m")
        path.write_text(json.dumps(saved))
    args = train.parse_args(["--resume", str(run), "--iterations", "2"])
    assert args.eps_m == 0.3
    tiny_train(args)
    assert json.loads((run / "config.json").read_text())["eps_m"] == 0.3
    with pytest.raises(UserError, match="--eps-m"):  # and it is the same experiment: eps_m may not change
        train.parse_args(["--resume", str(run), "--eps-m", "0.2"])


TINY_RUN = ["train.py", "--model", "tiny", "--preset", "none", "--env", "webshop", "--iterations", "3", "--groups", "1",
            "--group-size", "2", "--max-steps", "2", "--max-new-tokens", "8", "--lora-r", "4", "--lora-alpha", "8",
            "--eval-every", "0", "--hindsight", "expert", "--output-dir"]


@pytest.mark.slow
def test_an_output_that_closes_or_fills_is_a_stop_and_the_run_resumes(tmp_path):
    """train.py | head -2 (its header): the first write after the reader left, an iteration's line, stops the
    run as SIGTERM would (exit 141, one line naming the checkpoint kept, no traceback); > /dev/full: exit 74,
    the same. Either run resumes. The reader takes the whole header: under PYTHONUNBUFFERED, print writes a
    line's text and its newline apart, and a reader that left between them stopped the run before its folder
    was open."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = tmp_path / "piped"
    proc = subprocess.Popen([sys.executable, *TINY_RUN, str(out)], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    header = [proc.stdout.readline() for _ in range(2)]  # head -2, then the reader leaves
    assert header[1].startswith("each iteration's line"), header
    proc.stdout.close()
    err = proc.stderr.read()
    proc.wait(timeout=300)
    assert proc.returncode == 141 and "Traceback" not in err, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("standard output closed (its reader left: a broken pipe): "
                                                   f"{out} keeps iteration")
    full = tmp_path / "full"
    with open("/dev/full", "w") as devfull:
        done = subprocess.run([sys.executable, *TINY_RUN, str(full)], cwd=ROOT, text=True, stdout=devfull,
                              stderr=subprocess.PIPE, env=env, timeout=300)
    assert done.returncode == 74 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("standard output full (no space left on its device)")
    resumed = subprocess.run([sys.executable, "train.py", "--resume", str(out)], cwd=ROOT, capture_output=True,
                             text=True, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3


def test_eval_writes_its_json_before_an_output_that_closes(tmp_path):
    """eval.py | head -1: the results are written first; the stop line says where they are."""
    path = tmp_path / "eval.json"
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader left before eval printed its table (the first thing it writes to stdout)
    proc = subprocess.Popen([sys.executable, "eval.py", "--env", "webshop", "--policy", "random", "--num-games", "2",
                             "--out", str(path)], cwd=ROOT, text=True, stdout=write_end,
                            stderr=subprocess.PIPE, env={**os.environ, "OMP_NUM_THREADS": "1"})
    os.close(write_end)
    err = proc.stderr.read()
    proc.wait(timeout=300)
    assert proc.returncode == 141 and "Traceback" not in err
    assert err.strip().splitlines()[-1].endswith(f"every game was played and the results are in {path}")
    assert json.loads(path.read_text())["episodes"] == 2


def test_a_run_with_stdin_and_stdout_closed_runs(tmp_path):
    """`train.py ... >&- <&-`: Python starts with sys.stdout None; the run goes on, its lines going
    nowhere (an AttributeError in infra/cli.py at b60459e)."""
    command = [sys.executable, "train.py", *flags(model="tiny", preset="none", env="webshop", groups=1, group_size=2,
                                                   max_steps=2, max_new_tokens=8, lora_r=4, lora_alpha=8,
                                                   eval_every=0, hindsight="expert", iterations=1,
                                                   output_dir=str(tmp_path / "run"))]
    done = subprocess.run(["bash", "-c", " ".join(command) + " >&- <&-"], cwd=ROOT, capture_output=False,
                          stderr=subprocess.PIPE, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert (tmp_path / "run" / "metrics.jsonl").is_file()
