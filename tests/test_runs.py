"""Runs resume and survive: --resume continues a run in its folder with its saved flags (and refuses
changes that would alter what is learned), and a kill at any point loses at most the iteration in
progress: the resumed run ends with the weights and metrics of the run that was never stopped."""
import json
import os
import re
from pathlib import Path

import pytest
import torch

import train
from infra import checkpoint
from infra.cli import UserError
from stub_env import StubEnv
from tiny_runs import tiny_args, tiny_run_folder, tiny_train

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
    with pytest.raises(UserError, match="--output-dir"):
        train.parse_args(["--resume", str(run), "--output-dir", str(tmp_path / "elsewhere")])


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
STAGES = {"rollout": "rollout", "segments": "make_rows", "teacher": "score", "advantage": "advantages",
          "update": "update", "iteration done": "iteration"}


KILL_POINTS = list(STAGES) + ["metrics logged", "samples logged", "checkpoint written", "checkpoint renamed",
                              "latest updated"]


class _Killed(BaseException):
    """Stands in for kill -9: unwinds without running any `except Exception` handler."""


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
    calls = {"n": 0}

    def kill_on_second(name):
        if name == point:
            calls["n"] += 1
            if calls["n"] == 2:  # the second time: inside iteration 2
                raise _Killed(name)

    if point in STAGES:
        method = getattr(train.Trainer, STAGES[point])

        def wrapped(self, *a, **k):
            result = method(self, *a, **k)
            kill_on_second(point)
            return result

        monkeypatch.setattr(train.Trainer, STAGES[point], wrapped)
    else:
        monkeypatch.setattr(checkpoint, "crash_hook", kill_on_second)
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
    from rollout import load_policy

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
