"""Runs that survive, round four: a checkpoint is what it claims, a resumed or evaluated run plays the data and
env it trained on, branching is a command that works, one writer by the folder, every write one line on failure,
no read of a special file, no wait without a bound. Each case is something a user did or could do; the answer
is one line (exit 2) that names the file and what to do, before any work is lost."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import train
from infra.checkpoint import RunFolder, find_checkpoint
from infra.cli import UserError
from stub_env import StubEnv
from tiny_runs import flags, tiny_run_folder

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parent.parent


def _cli(*argv, env=None, timeout=300):
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def _one_line(done, *words):
    assert done.returncode == 2, done.stderr[-1500:]
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and all(w in last for w in words), last


def _resume_trainer(run):
    args = train.parse_args(["--resume", str(run), "--iterations", "2"])
    return train.Trainer(args, env=StubEnv(args.max_steps))


# ----------------------------------------------------------------------------- a checkpoint is what it claims
@pytest.mark.parametrize("damage", ["no lora_B", "renamed", "empty", "wrong shape"])
def test_an_adapter_that_does_not_match_its_config_is_one_line(tmp_path, damage):
    """peft loads an adapter file missing tensors with fresh LoRA weights in their place (a warning only): resume
    and eval.py refuse it, naming the file."""
    run = tiny_run_folder(tmp_path)
    weights = run / "checkpoints" / "iter-000001" / "adapter_model.safetensors"
    state = load_file(weights)
    if damage == "no lora_B":
        state = {k: v for k, v in state.items() if "lora_B" not in k}
    elif damage == "renamed":
        state = {k.replace("q_proj", "qq_proj"): v for k, v in state.items()}
    elif damage == "empty":
        state = {}
    else:
        key = next(k for k in state if "lora_A" in k)
        state[key] = torch.zeros(3, 3)
    save_file(state, weights)
    said = "another base model" if damage == "wrong shape" else "adapter_model.safetensors"
    with pytest.raises(UserError, match=said):
        _resume_trainer(run)
    done = _cli("eval.py", "--policy", "model", "--checkpoint", str(run), "--num-games", "1", "--max-steps", "1")
    _one_line(done, said)


@pytest.mark.parametrize("damage", ["exp_avg shape", "lr string", "rng out of range", "rng negative", "metrics line",
                                    "state ahead", "config without lr"])
def test_well_formed_but_wrong_files_are_one_line_before_any_rollout(tmp_path, damage):
    run = tiny_run_folder(tmp_path)
    ckpt = run / "checkpoints" / "iter-000001"
    if damage in ("exp_avg shape", "lr string"):
        state = torch.load(ckpt / "optimizer.pt", weights_only=True)
        if damage == "exp_avg shape":
            state["state"][0]["exp_avg"] = torch.zeros(7)
        else:
            state["param_groups"][0]["lr"] = "fast"
        torch.save(state, ckpt / "optimizer.pt")
    elif damage.startswith("rng"):
        rng = json.loads((ckpt / "rng.json").read_text())
        rng["python"][1][0] = 2**40 if damage == "rng out of range" else -5
        (ckpt / "rng.json").write_text(json.dumps(rng))
    elif damage == "metrics line":
        (run / "metrics.jsonl").write_text('{"iteration": 1}\n')
    elif damage == "state ahead":
        (ckpt / "state.json").write_text('{"iteration": 7}')
    else:
        config = json.loads((ckpt / "config.json").read_text())
        del config["lr"]
        (ckpt / "config.json").write_text(json.dumps(config))
    done = _cli("train.py", "--resume", str(run), "--iterations", "2")
    _one_line(done)
    assert "iter 2" not in done.stdout  # nothing ran


def test_a_copy_named_like_a_checkpoint_is_not_one(tmp_path):
    """checkpoints/iter-99 (not six digits) is no checkpoint of the run: never the newest, never pruned."""
    run = tiny_run_folder(tmp_path)
    (run / "checkpoints" / "iter-000001").rename(run / "checkpoints" / "keep")
    import shutil

    shutil.copytree(run / "checkpoints" / "keep", run / "checkpoints" / "iter-000001")
    shutil.copytree(run / "checkpoints" / "keep", run / "checkpoints" / "iter-99")
    assert find_checkpoint(run).name == "iter-000001"


# ----------------------------------------------------------------------------- the data and env it trained on
def test_a_resume_plays_the_data_it_trained_on(tmp_path, monkeypatch):
    """A run started with $WEBSHOP_DATA records that folder; one started on the shipped data refuses to resume
    while the variable points elsewhere (it would play another catalog, silently)."""
    monkeypatch.delenv("WEBSHOP_DATA", raising=False)
    shipped = tiny_run_folder(tmp_path, "shipped", env="webshop")
    monkeypatch.setenv("WEBSHOP_DATA", str(tmp_path / "other-catalog"))
    with pytest.raises(UserError, match="shipped webshop data.*WEBSHOP_DATA is set now"):
        train.parse_args(["--resume", str(shipped), "--iterations", "2"])
    args = train.parse_args(flags(model="tiny", preset="none", env="webshop", output_dir=str(tmp_path / "r")))
    assert args.data_dir == str((tmp_path / "other-catalog").resolve())  # config.json says which data it played
    monkeypatch.delenv("WEBSHOP_DATA")
    train.parse_args(["--resume", str(shipped), "--iterations", "2"])


def test_eval_of_a_checkpoint_plays_its_own_env(tmp_path):
    run = tiny_run_folder(tmp_path, env="webshop")
    done = _cli("eval.py", "--policy", "model", "--checkpoint", str(run), "--num-games", "1", "--max-steps", "1")
    assert done.returncode == 0, done.stderr[-1500:]
    assert "webshop / test / policy model" in done.stdout
    _one_line(_cli("eval.py", "--env", "alfworld", "--policy", "model", "--checkpoint", str(run)), "trained on webshop")


# ----------------------------------------------------------------------------- branching
def test_branching_twice_continues_from_the_checkpoint_each_time(tmp_path):
    """--resume CHECKPOINT --output-dir NEW starts a new run folder from that checkpoint (an older one too), with
    the run's logs up to it; a branch branches again; eval.py scores a branch's own newest checkpoint; a copied
    checkpoint folder is not resumed in place (the run would loop), and the refusal says how to branch."""
    run = tiny_run_folder(tmp_path, iterations=2, keep_checkpoints=2)
    first = run / "checkpoints" / "iter-000001"
    args = train.parse_args(["--resume", str(first), "--output-dir", str(tmp_path / "b1"), "--iterations", "3"])
    lines = train.train(args, train.Trainer(args, env=StubEnv(2)))
    assert [m["iteration"] for m in lines] == [2, 3]
    logged = [json.loads(x)["iteration"] for x in (tmp_path / "b1" / "metrics.jsonl").read_text().splitlines()]
    assert logged == [1, 2, 3]  # the parent's iteration 1, then the branch's own
    assert find_checkpoint(tmp_path / "b1").name == "iter-000003"
    args = train.parse_args(["--resume", str(tmp_path / "b1"), "--output-dir", str(tmp_path / "b2"), "--iterations", "4"])
    assert [m["iteration"] for m in train.train(args, train.Trainer(args, env=StubEnv(2)))] == [4]
    with pytest.raises(UserError, match="already holds a run"):
        train.parse_args(["--resume", str(first), "--output-dir", str(tmp_path / "b1")])
    import shutil

    shutil.copytree(first, tmp_path / "copy")
    with pytest.raises(UserError, match="--output-dir NEW_FOLDER"):
        train.parse_args(["--resume", str(tmp_path / "copy"), "--iterations", "3"])


# ----------------------------------------------------------------------------- one writer
def test_removing_the_lock_file_lets_no_second_writer_in(tmp_path):
    holder = RunFolder(tmp_path / "run")
    holder.lock()
    try:
        (tmp_path / "run" / ".lock").unlink()
        with pytest.raises(UserError, match="in use by another run"):
            RunFolder(tmp_path / "run").lock()
    finally:
        holder.unlock()
    second = RunFolder(tmp_path / "run")
    second.lock()  # free again once the holder let go
    second.unlock()


# ----------------------------------------------------------------------------- writes that fail
@pytest.mark.slow
def test_eval_refuses_an_output_it_cannot_write_before_playing(tmp_path):
    (tmp_path / "afile").write_text("")
    (tmp_path / "afolder").mkdir()
    base = ["eval.py", "--policy", "random", "--num-games", "1", "--max-steps", "1", "--env", "webshop"]
    _one_line(_cli(*base, "--out", str(tmp_path / "afile" / "x.json")), "cannot write")
    _one_line(_cli(*base, "--out", str(tmp_path / "afolder")), "is a folder")
    _one_line(_cli(*base, "--out", "/dev/full"), "cannot write /dev/full", "no space left")
    _one_line(_cli(*base, "--out", str(tmp_path / ("x" * 300 + ".json"))), "too long")


def test_a_run_folder_path_too_long_is_refused_before_it_starts(tmp_path):
    deep = tmp_path / "/".join(["d" * 200] * 20)  # ~4,000 bytes: the checkpoint's files would not fit
    _one_line(_cli("train.py", *flags(model="tiny", preset="none", env="webshop", output_dir=str(deep))), "too long")
    _one_line(_cli("train.py", *flags(model="tiny", preset="none", env="webshop", output_dir=str(tmp_path / ("n" * 300)))),
              "too long")


# ----------------------------------------------------------------------------- special files
@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_webshop_data_file_that_is_no_regular_file_is_one_line(tmp_path, kind):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(ROOT / "data" / "webshop", data)
    target = data / "items_shuffle.json"
    target.unlink()
    os.mkfifo(target) if kind == "fifo" else target.mkdir()
    clock = time.perf_counter()
    done = _cli("eval.py", "--env", "webshop", "--policy", "random", "--data-dir", str(data), "--num-games", "1",
                timeout=60)
    _one_line(done, "not a regular file")
    assert time.perf_counter() - clock < 60


# ----------------------------------------------------------------------------- no wait without a bound
def test_a_frozen_worker_counts_as_crashed_within_its_timeout():
    """SIGSTOP one of two ALFWorld workers mid-episode: the step returns within the timeout, that worker's episodes
    end as failed, it is killed and started anew, and the other worker's episodes go on."""
    from envs.make import make_env

    env = make_env("alfworld", workers=2, timeout=5)
    try:
        tasks = env.tasks("train")[:2]
        env.reset(tasks)
        os.kill(env._procs[0].pid, signal.SIGSTOP)
        clock = time.perf_counter()
        out = env.step(["<think>x</think><action>look</action>"] * 2)
        assert time.perf_counter() - clock < 30
        assert out[0].info.get("env_crash") and not out[1].info.get("env_crash")
        assert env.crashes == 1 and env._procs[0].is_alive()  # a fresh worker in its place
    finally:
        env.close()


def test_resume_with_dtype_auto_is_the_runs_dtype(tmp_path):
    """--dtype auto at a resume means what it resolves to here: the run's own precision, so no change."""
    run = tiny_run_folder(tmp_path)  # its config.json holds what auto resolved to on this machine
    assert train.parse_args(["--resume", str(run), "--dtype", "auto", "--iterations", "2"]).dtype == \
        json.loads((run / "config.json").read_text())["dtype"]


@pytest.mark.parametrize("inside", ["latest", "checkpoints/iter-000001", "checkpoints", "sub/run"])
def test_a_run_is_never_written_inside_another(tmp_path, inside):
    """A new run aimed at another run's `latest`, one of its checkpoints, its checkpoints/ folder or any folder
    below it is refused in one line before anything is written: the other run's files stay byte for byte."""
    import train

    parent = tiny_run_folder(tmp_path, "a")
    before = {p: p.read_bytes() for p in parent.rglob("*") if p.is_file() and p.name != ".lock"}
    args = train.parse_args(flags(model="tiny", preset="none", iterations=1, groups=1, group_size=2, max_steps=1,
                                  max_new_tokens=4, output_dir=str(parent / inside)))
    with pytest.raises(UserError, match=f"is inside the run folder {parent}"):
        train.train(args, train.Trainer(args, env=StubEnv(1)))
    after = {p: p.read_bytes() for p in parent.rglob("*") if p.is_file() and p.name != ".lock"}
    assert after == before and not (parent / "sub").exists()


def test_a_diverged_policy_is_named_at_the_step_that_made_it_and_at_load(tmp_path):
    """A learning rate of 1e30 (past --lr's range): the first optimizer step makes the logits overflow; the run
    stops in one line naming it, and no checkpoint of that iteration is written. A checkpoint whose weights are near 1e30 (they pass the
    finite check) is refused at resume and at eval, naming the checkpoint to go back to."""
    import train

    args = train.parse_args(flags(model="tiny", preset="none", iterations=2, groups=1, group_size=4, max_steps=2,
                                  max_new_tokens=8, lr=1e-2, lora_r=4, lora_alpha=8, eval_every=0,
                                  hindsight="expert", output_dir=str(tmp_path / "div")))
    args.lr = 1e30  # past the range --lr takes on a command line: a step made to overflow
    with pytest.raises(UserError, match="iteration 1: an optimizer step made the policy's sampling distribution "
                                        "non-finite.*no checkpoint yet"):
        train.train(args, train.Trainer(args, env=StubEnv(2)))
    assert not list((tmp_path / "div").glob("checkpoints/iter-*"))
    run = tiny_run_folder(tmp_path, "ok", iterations=2, keep_checkpoints=2)
    ckpt = run / "checkpoints" / "iter-000002"
    tensors = load_file(str(ckpt / "adapter_model.safetensors"))
    save_file({k: v * 1e30 if "lora_B" in k else v for k, v in tensors.items()}, str(ckpt / "adapter_model.safetensors"))
    with pytest.raises(UserError, match=r"iter-000002: its policy's sampling distribution is not finite.*go back to "
                                        r".*iter-000001"):
        train.Trainer(train.parse_args(["--resume", str(run), "--iterations", "3"]), env=StubEnv(2))
    done = subprocess.run([sys.executable, "eval.py", "--policy", "model", "--checkpoint", str(run), "--num-games",
                           "1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "sampling distribution is not finite" in done.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_eval_of_a_run_plays_its_own_history_steps_and_tokens(tmp_path):
    """eval.py --checkpoint RUN plays the run's own --history, --max-steps and --max-new-tokens (it played
    history 2, 15 steps and 256 tokens for a run trained with 1, 2 and 8), says so, and a flag given wins."""
    run = tiny_run_folder(tmp_path, history="1", max_steps=2, max_new_tokens=8)
    out = tmp_path / "e.json"
    done = subprocess.run([sys.executable, "eval.py", "--policy", "model", "--checkpoint", str(run), "--num-games",
                           "1", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"playing as {run} trained: --history 1, --max-steps 2, --max-new-tokens 8" in done.stdout
    config = json.loads(out.read_text())["config"]
    assert (config["history"], config["max_steps"], config["max_new_tokens"]) == ("1", 2, 8)
    done = subprocess.run([sys.executable, "eval.py", "--policy", "model", "--checkpoint", str(run), "--num-games",
                           "1", "--max-steps", "1", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and json.loads(out.read_text())["config"]["max_steps"] == 1
    assert "--max-steps" not in done.stdout.split("trained:")[-1].splitlines()[0]


@pytest.mark.parametrize("edit", ["lr", "invalid"])
def test_a_hand_edited_run_config_is_refused_on_resume(tmp_path, edit):
    """RUN/config.json edited by hand (a valid change of --lr, or broken JSON) was discarded on --resume
    without a word: now refused in one line naming the file and the checkpoint's copy. A change of a flag a
    resume may change (--iterations) is no edit."""
    import train

    run = tiny_run_folder(tmp_path)
    path = run / "config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "iterations": 5}))  # what a resume itself writes: fine
    train.parse_args(["--resume", str(run), "--iterations", "2"])
    path.write_text(json.dumps({**config, "lr": 0.5}) if edit == "lr" else "{not json")
    with pytest.raises(UserError, match="config.json (was edited|is not a JSON object).*iter-000001"):
        train.parse_args(["--resume", str(run), "--iterations", "2"])


def test_a_resume_refuses_tasks_that_changed_under_the_same_path(tmp_path):
    """Goals changed inside the recorded data folder, same path: the resume switched tasks without a word.
    Each checkpoint now records the tasks' digest, and a resume on other tasks is refused in one line."""
    import shutil

    import train
    from envs.make import make_env
    from flags import DATA

    data = tmp_path / "webshop"
    shutil.copytree(DATA / "webshop", data)
    base = dict(model="tiny", preset="none", env="webshop", data_dir=str(data), iterations=1, groups=1, group_size=2,
                max_steps=2, max_new_tokens=4, lora_r=4, lora_alpha=8, eval_every=0, hindsight="expert",
                output_dir=str(tmp_path / "run"))
    args = train.parse_args(flags(**base))
    train.train(args)
    digest = make_env("webshop", data_dir=data).data_digest()
    assert json.loads((tmp_path / "run" / "checkpoints" / "iter-000001" / "state.json").read_text())["data"] == digest
    human = next(data.glob("items_human_ins*.json"))
    goals = json.loads(human.read_text())
    first = next(iter(goals))
    goals[first][0]["instruction"] = "i want something else entirely"
    human.write_text(json.dumps(goals))
    assert make_env("webshop", data_dir=data).data_digest() != digest
    with pytest.raises(UserError, match="the data changed since .*iter-000001 was saved"):
        train.Trainer(train.parse_args(["--resume", str(tmp_path / "run"), "--iterations", "2"]))


def test_a_log_line_dropped_on_resume_is_reported_with_its_number(tmp_path, capsys):
    """A non-UTF-8 byte in metrics.jsonl line 1 deleted that line on resume without a word, and a line with
    {"iteration": true} was kept as iteration 1: now each dropped line is named by its number on stderr, and
    an iteration must be an integer (a boolean is none)."""
    import train
    from stub_env import StubEnv as Stub

    run = tiny_run_folder(tmp_path, iterations=2)
    path = run / "metrics.jsonl"
    lines = path.read_bytes().splitlines()
    path.write_bytes(lines[0].replace(b'"iteration"', b'"iter\\xfftion"') + b"\n" + lines[1] + b"\n"
                     + json.dumps({"iteration": True, "success": 0.5}).encode() + b"\n")
    capsys.readouterr()
    args = train.parse_args(["--resume", str(run), "--iterations", "3"])
    train.train(args, train.Trainer(args, env=Stub(args.max_steps)))
    err = capsys.readouterr().err
    assert f"{path} line 1 is no log line: dropped" in err and f"{path} line 3 is no log line: dropped" in err
    kept = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["iteration"] for line in kept] == [2, 3]


def test_unreadable_folders_and_files_are_one_line(tmp_path, monkeypatch):
    """As another user: a run whose checkpoints/ is mode 700, and an adapter of mode 000, were a
    PermissionError traceback and "holds no adapter". (The tests run as root, which reads everything: the
    refusals are raised by hand here; tests/hostile_sweep.py runs them as nobody.)"""
    from infra import checkpoint

    run = tiny_run_folder(tmp_path)
    real_iterdir = Path.iterdir

    def iterdir(self):
        if self.name == "checkpoints":
            raise PermissionError(13, "Permission denied", str(self))
        return real_iterdir(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    with pytest.raises(UserError, match=r"cannot read .*checkpoints \(Permission denied\): run as its owner"):
        checkpoint.find_checkpoint(run)
    monkeypatch.setattr(Path, "iterdir", real_iterdir)
    real_open = open

    def refusing(path, *a, **k):
        if str(path).endswith("adapter_model.safetensors"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr("builtins.open", refusing)
    with pytest.raises(UserError, match=r"cannot read .*adapter_model.safetensors \(Permission denied\)"):
        checkpoint.checkpoint_adapters(checkpoint.find_checkpoint(run))


@pytest.mark.slow
def test_a_non_ascii_run_folder_under_the_c_locale(tmp_path):
    """LC_ALL=C (ASCII, no UTF-8 coercion), a run folder named données and a sampled response that is not
    ASCII: the run, its resume and its plots work (UnicodeEncodeError tracebacks in checkpoint.py and in
    the plots' segments.html before)."""
    out = tmp_path / "données"
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0", "OMP_NUM_THREADS": "1"}
    argv = ["train.py", "--model", "tiny", "--preset", "none", "--env", "webshop", "--iterations", "1", "--groups", "1",
            "--group-size", "2", "--max-steps", "2", "--max-new-tokens", "6", "--lora-r", "4", "--lora-alpha", "8",
            "--eval-every", "0", "--hindsight", "expert", "--output-dir", str(out)]
    for command in (argv, ["train.py", "--resume", str(out), "--iterations", "2"], ["-m", "tools.plots", str(out)]):
        if command[0] == "-m":  # logged text that is not ASCII (the tiny model samples U+FFFD tokens)
            samples = out / "samples.jsonl"
            samples.write_text(samples.read_text().replace('"task_id": "', '"task_id": "caf\\u00e9 \\ufffd'))
        done = subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True, env=env,
                              timeout=300)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert (out / "checkpoints" / "iter-000002" / "README.md").is_file()
    assert "café" in (out / "segments.html").read_text(encoding="utf-8")


def test_a_full_disk_under_the_model_cache_falls_back_to_the_model_file(tmp_path, monkeypatch):
    """The embedded model's one-time conversion on a full file system (safetensors says so as its own error
    type: a SafetensorError traceback before) says why and reads the GGUF file instead."""
    import transformers
    from safetensors import SafetensorError

    from infra import models

    monkeypatch.setenv("SHARPO_CACHE", str(tmp_path / "cache"))
    tiny = models.build_tiny_model(models.build_tiny_tokenizer())
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: tiny)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: models.build_tiny_tokenizer())

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                              "\"No space left on device\" })")

    monkeypatch.setattr(type(tiny), "save_pretrained", full)
    said = []
    source = models.smollm2_folder(announce=said.append)
    assert source.suffix == ".gguf" and "no space left on the device" in said[-1]


def test_resume_messages_say_what_happened(tmp_path):
    """--resume with --iterations at or below the run's iteration did nothing and exited 0: refused; --preset on a
    resume was recorded but never applied: refused as a change; a checkpoint's own bad value was blamed on a flag
    the user never gave: the message names the config.json."""
    import train
    import flags as config

    run = tiny_run_folder(tmp_path, iterations=2)
    with pytest.raises(UserError, match="--iterations 1: .* is at iteration 2 already"):
        train.parse_args(["--resume", str(run), "--iterations", "1"])
    with pytest.raises(UserError, match=r"would change it: --preset \(run: 'none', given: 'cpu-demo'\)"):
        train.parse_args(["--resume", str(run), "--iterations", "3", "--preset", "cpu-demo"])
    for path in (run / "config.json", run / "checkpoints" / "iter-000002" / "config.json"):
        path.write_text(json.dumps({**json.loads(path.read_text()), "lr": -1.0}))
    with pytest.raises(UserError, match=r"iter-000002/config.json holds a value train.py refuses .*lr.*--lr must be"):
        train.parse_args(["--resume", str(run), "--iterations", "3"])
    assert "preset" not in config.RESUME_MAY_CHANGE


def test_logs_and_tools_name_a_line_they_cannot_read(tmp_path, capsys):
    """tools.plots on a samples line whose segments is a string (an AttributeError traceback): skipped and
    named; tools.compare's gather on a metrics line without success (a KeyError): one line naming it; tools.credit
    --env webshop took ALFWorld's split as its default and refused it after loading the model: now its own."""
    from tools import compare, credit, plots

    run = tiny_run_folder(tmp_path)
    samples = run / "samples.jsonl"
    records = [json.loads(line) for line in samples.read_text().splitlines()]
    records[0]["segments"] = "oops"
    samples.write_text("".join(json.dumps(r) + "\n" for r in records))
    plots.make_plots(run)
    assert f"{samples} line 1 is not a train.py log record: skipped" in capsys.readouterr().err
    (run / "metrics.jsonl").write_text(json.dumps({"iteration": 1}) + "\n")
    with pytest.raises(UserError, match="metrics.jsonl line 1 is not a train.py metrics line"):
        compare.read_metrics(run)
    with pytest.raises(UserError) as err:
        credit.main(["--env", "webshop", "--seeds", "x"])
    assert "--seeds" in str(err.value) and "--split" not in str(err.value)
    with pytest.raises(UserError, match="--split for webshop must be one of train, test"):
        credit.main(["--env", "webshop", "--split", "valid_seen"])


def test_a_checkpoint_removed_while_it_loads_is_one_line(tmp_path, monkeypatch):
    """eval.py on a checkpoint a running run prunes as it loads: HFValidationError ('Repo id must be...')
    before; now one line saying so and what to load instead."""
    import shutil

    from infra import checkpoint

    run = tiny_run_folder(tmp_path)
    ckpt = checkpoint.find_checkpoint(run)

    def pruned(name, **kwargs):
        shutil.rmtree(ckpt)
        raise ValueError("Repo id must be in the form 'repo_name' or 'namespace/repo_name'")

    monkeypatch.setattr(checkpoint, "load_policy", pruned)
    with pytest.raises(UserError, match="was removed while it loaded .*load the run folder"):
        checkpoint.load_checkpoint_policy(ckpt)


# ----------------------------------------------------------------------------- round six (issue 65, in part)
def test_an_empty_split_is_one_line_not_a_draw_that_never_ends():
    """A split with no task (a WebShop folder whose one goal went to the other split) is a one-line
    error where the tasks are read, for training and for an evaluation: at b60459e training drew from
    nothing forever (holding the run's lock), and eval.py reported 0 episodes as success 0.0."""
    from types import SimpleNamespace

    from envs.make import training_tasks
    from eval import pick_games

    empty = SimpleNamespace(name="webshop", tasks=lambda split: [], task_type=lambda t: "x")
    with pytest.raises(UserError, match="the train split of webshop's data holds no task"):
        training_tasks(empty, "train")
    with pytest.raises(UserError, match="the test split of webshop's data holds no game"):
        pick_games(empty, "test", 3)


@pytest.mark.parametrize("argv, needle", [
    (["--minibatches", "100000000"], "optimizer steps per iteration"),
    (["--ppo-epochs", "100000000"], "optimizer steps per iteration"),
    (["--ppo-clip", "1e300"], r"--ppo-clip must be in \(0, 1\)"),
])
def test_sizes_that_take_days_and_a_clip_past_one_are_refused(tmp_path, argv, needle):
    """--minibatches or --ppo-epochs of 10^8 (2,146 hours an iteration) and a PPO clip past 1 (a
    RuntimeError in the update at b60459e) are refused before anything loads, naming the flag."""
    with pytest.raises(UserError, match=needle):
        train.parse_args(argv + flags(model="tiny", preset="none", output_dir=str(tmp_path / "r")))


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


def test_credit_plays_the_checkpoint_s_env(tmp_path, monkeypatch):
    """tools.credit on a WebShop run's checkpoint plays WebShop (at b60459e: ALFWorld, and credit.json
    said so), and an --env that contradicts the checkpoint is one line, as in eval.py."""
    from tools import credit

    run = tiny_run_folder(tmp_path, env="webshop")
    with pytest.raises(UserError, match="was trained on webshop"):
        credit.main(["--checkpoint", str(run), "--env", "alfworld", "--games", "1", "--seeds", "0"])
    seen = []

    def stop(args):
        seen.append((args.env, args.split))
        raise UserError("stopped here")

    monkeypatch.setattr(credit, "load", stop)
    with pytest.raises(UserError, match="stopped here"):
        credit.main(["--checkpoint", str(run), "--games", "1", "--seeds", "0"])
    assert seen == [("webshop", credit.HELD_OUT["webshop"])]


def test_an_unreadable_webshop_file_is_one_line(tmp_path, monkeypatch):
    """A WebShop data file that cannot be read (another user's, mode 600: a PermissionError at
    b60459e, from train.py and eval.py) is one line naming the file and what to do, as ALFWorld's is.
    Simulated: this test runs as root, whom permissions do not stop."""
    import shutil
    from pathlib import Path as _Path

    from envs.webshop import WebShopEnv
    from errors import DataError

    root = tmp_path / "shop"
    shutil.copytree(ROOT / "data" / "webshop", root)
    real = _Path.read_text

    def denied(self, *a, **k):
        if self.name.startswith("items_shuffle"):
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(_Path, "read_text", denied)
    with pytest.raises(DataError, match=r"cannot read .*items_shuffle.*Permission denied.*chmod"):
        WebShopEnv(data_dir=root)


@pytest.mark.slow
def test_eval_never_replaces_the_run_s_own_evaluation(tmp_path):
    """eval.py --checkpoint RUN after the run's in-loop evaluation of the same iteration leaves that
    record byte-identical and writes its own beside it; a second eval.py writes a third file; --out
    aimed at the run's record is refused. At b60459e it replaced the record without a word."""
    run = tiny_run_folder(tmp_path, iterations=1, eval_every=1, eval_games=2, env="webshop")
    record = run / "eval_webshop_test_iter-000001.json"
    before = record.read_bytes()
    for _ in range(2):
        done = _cli("eval.py", "--policy", "model", "--checkpoint", str(run), "--num-games", "1", "--max-steps", "1")
        assert done.returncode == 0, done.stderr[-2000:]
    assert record.read_bytes() == before
    assert (run / "evalpy_webshop_test_iter-000001.json").is_file() and (run / "evalpy_webshop_test_iter-000001-2.json").is_file()
    done = _cli("eval.py", "--policy", "model", "--checkpoint", str(run), "--num-games", "1", "--out", str(record))
    assert done.returncode == 2 and "name of a run's own evaluation" in done.stderr and record.read_bytes() == before


def test_a_relative_data_dir_is_recorded_as_the_folder_it_meant(tmp_path, monkeypatch):
    """--data-dir shop, typed relative, is recorded absolute in config.json, so eval.py --checkpoint from
    another working folder (one with its own ./shop) plays the run's catalog, not that one; a resume
    that types it relative again is the same run. At b60459e config.json kept `shop` as typed."""
    import shutil

    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    shutil.copytree(ROOT / "data" / "webshop", work / "shop")
    elsewhere.mkdir()
    monkeypatch.chdir(work)
    run = tiny_run_folder(tmp_path, env="webshop", data_dir="shop")
    saved = json.loads((run / "config.json").read_text())["data_dir"]
    assert saved == str((work / "shop").resolve())
    monkeypatch.chdir(elsewhere)
    with pytest.raises(UserError, match="continues the same experiment"):  # another folder's shop: refused
        shutil.copytree(ROOT / "data" / "webshop", elsewhere / "shop")
        train.parse_args(["--resume", str(run), "--data-dir", "shop", "--iterations", "2"])
    monkeypatch.chdir(work)
    assert train.parse_args(["--resume", str(run), "--data-dir", "shop", "--iterations", "2"]).data_dir == saved


@pytest.mark.parametrize("damage, needle", [
    (lambda run: (run / "eval_alfworld_valid_seen_iter-000004.json").write_text('{"success": 0.5, "ga'),
     "is not valid JSON"),
    (lambda run: (run / "eval_alfworld_valid_seen_iter-000004.json").write_text('{"games": {}}'),
     "'success' should be a number"),
    (lambda run: (run / "eval_alfworld_valid_seen_iter-000004.json").write_text("[1, 2]"),
     "should hold a JSON object"),
    (lambda run: (run / "config.json").write_text('{"env": "alf'), "is not valid JSON"),
    (lambda run: (run / "eval_alfworld_valid_seen_iter-best.json").write_text('{"success": 1.0}'), None),
])
def test_compare_reads_damaged_records_in_one_line(tmp_path, damage, needle):
    """tools.compare --gather-only over a run whose records are damaged: a truncated evaluation or
    config.json, a record without `success`, one that is a list: one line naming the file (at b60459e
    a JSONDecodeError, KeyError or TypeError traceback); a copy under another name
    (eval_..._iter-best.json, a ValueError at b60459e) is not one of the run's records, and is passed by."""
    from tools import compare

    record = {"success": 0.5, "games": {"valid_seen/g0": {"won": True, "steps": 3}},
              "config": {"env": "alfworld", "split": "valid_seen", "iteration": 4, "checkpoint": None,
                         "max_steps": 6, "max_new_tokens": 64}}
    (tmp_path / "eval_start_valid_seen.json").write_text(json.dumps(record))
    run = tmp_path / "sharpo-seed0"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"env": "alfworld", "model": "smollm2", "data_dir": None}))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"iteration": i, "success": 0.5, "seconds/rollout": 1.0})
                                               + "\n" for i in (1, 2, 3, 4)))
    (run / "eval_alfworld_valid_seen_iter-000004.json").write_text(json.dumps(record))
    damage(run)
    argv = ["--algos", "sharpo", "--seeds", "0", "--out", str(tmp_path), "--gather-only", "--eval-split",
            "valid_seen", "--eval-max-steps", "6", "--", "--env", "alfworld", "--iterations", "4"]
    if needle is None:
        assert compare.main(argv)["sharpo"]["held_out_after"] is not None
    else:
        with pytest.raises(UserError, match=needle):
            compare.main(argv)


def test_compare_out_that_cannot_take_results_is_one_line(tmp_path):
    """tools.compare --out under a file (as a read-only mount refuses a folder): one line before any run."""
    from tools import compare

    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UserError, match="cannot take the results"):
        compare.main(["--algos", "sharpo", "--seeds", "0", "--out", str(blocker / "out"), "--gather-only",
                      "--", "--env", "alfworld", "--iterations", "4"])


@pytest.mark.parametrize("argv", [
    ["train.py", "--model", "tiny", "--preset", "none", "--data-dir", "/tmp/" + "x" * 300, "--output-dir", "{tmp}"],
    ["train.py", "--resume", "/tmp/" + "x" * 300],
    ["eval.py", "--policy", "model", "--checkpoint", "/tmp/" + "x" * 300],
    ["-m", "tools.plots", "/tmp/" + "x" * 300],
])
def test_a_path_name_too_long_is_one_line(tmp_path, argv):
    """A path component over 255 bytes, in any script's path flag: one line and exit 2 (an
    `OSError: [Errno 36] File name too long` traceback at b60459e)."""
    done = _cli(*[a.replace("{tmp}", str(tmp_path / "r")) for a in argv])
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-1500:]
    assert done.stderr.strip().splitlines()[-1].startswith("error: a path has a name longer than")


@pytest.mark.parametrize("plain", [False, True])
def test_an_update_without_signal_moves_no_weight(tmp_path, plain):
    """Every group tied (the tiny model never buys the right product) and --kl-coef 0.01: 4 iterations at
    lr 1e-2 leave every LoRA weight exactly as it started, on the default (batched) path as with --plain.
    At b60459e the reference's log-probs came from another pass than the update's, so the KL's gradient
    was float noise (~1e-8) that AdamW turned into full-sized steps on the default path."""
    args = train.parse_args(flags(model="tiny", preset="none", env="webshop", groups=1, group_size=2, max_steps=2,
                                  max_new_tokens=8, lora_r=4, lora_alpha=8, eval_every=0, hindsight="expert",
                                  lr=1e-2, seed=3, iterations=4, kl_coef=0.01, plain=plain,
                                  output_dir=str(tmp_path / "run")))
    trainer = train.Trainer(args)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    lines = train.train(args, trainer)
    assert all(line["groups_with_spread"] == 0 for line in lines)  # every group tied: no learning signal
    assert all("update/kl_ref" in line and line["seconds/reference"] > 0 for line in lines)  # the KL term ran
    for name, p in trainer.model.named_parameters():
        if p.requires_grad:
            assert torch.equal(p.detach(), before[name]), name


def test_plain_holds_for_the_session_it_is_given_in(tmp_path):
    """A one-time `--resume RUN --plain` was saved with the run, so every later resume ran the plain passes
    too: now a resume without --plain takes the fast passes again, and one with it keeps them plain."""
    run = tiny_run_folder(tmp_path, iterations=1)
    plain = train.parse_args(["--resume", str(run), "--iterations", "2", "--plain"])
    assert plain.plain
    train.train(plain)
    saved = json.loads((find_checkpoint(run) / "config.json").read_text())
    assert saved["plain"] is True  # what that session ran, recorded
    assert train.parse_args(["--resume", str(run), "--iterations", "3"]).plain is False
    assert train.parse_args(["--resume", str(run), "--iterations", "3", "--plain"]).plain is True
