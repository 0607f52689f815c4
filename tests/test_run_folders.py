"""Run folders a user copied into, crafted, or half-wrote: checkpoints are only what train.py
wrote, `latest` only points into its own run, a run killed before its first checkpoint can go
on, no code runs from a model a run folder names, and every broken file is one clear error."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import train
from cli_runs import one_line as _one_line
from cli_runs import run_cli as _cli
from infra import checkpoint
from infra.checkpoint import RunFolder, find_checkpoint
from infra.cli import UserError
from stub_env import StubEnv
from tiny_runs import flags, tiny_args, tiny_run_folder, tiny_train

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def run2(tmp_path):
    """A finished 2-iteration tiny run (checkpoints iter-000001 and iter-000002)."""
    out = tmp_path / "run"
    tiny_train(tiny_args(out, iterations=2))
    return out


def test_a_foreign_folder_in_checkpoints_is_never_resumed_or_pruned(run2):
    """A copy named iter-best (sorts after iter-000002 by name) and a symlink named like a
    checkpoint are not the run's: resume takes iter-000002, and pruning with keep 1 deletes
    only the run's own older checkpoint."""
    ckpts = run2 / "checkpoints"
    shutil.copytree(ckpts / "iter-000001", ckpts / "iter-best")
    os.symlink(ckpts / "iter-000001", ckpts / "iter-999999")
    assert checkpoint.find_checkpoint(run2).name == "iter-000002"
    args = train.parse_args(["--resume", str(run2), "--iterations", "3", "--keep-checkpoints", "1"])
    assert Path(args.resume).name == "iter-000002"
    tiny_train(args)
    assert sorted(p.name for p in ckpts.iterdir()) == ["iter-000003", "iter-999999", "iter-best"]
    assert os.readlink(run2 / "latest") == "checkpoints/iter-000003"


def test_checkpoints_sort_by_iteration_not_by_name(tmp_path):
    """iter-1000000 (seven digits) is newer than iter-999999, though it sorts before it as text."""
    for n in (999_999, 1_000_000):
        folder = tmp_path / "checkpoints" / f"iter-{n:06d}"
        folder.mkdir(parents=True)
        (folder / "state.json").write_text(json.dumps({"iteration": n}))
    assert checkpoint.find_checkpoint(tmp_path).name == "iter-1000000"
    padded = tmp_path / "checkpoints" / "iter-0000002"  # not a name train.py writes: never taken for the run's
    padded.mkdir()
    (padded / "state.json").write_text(json.dumps({"iteration": 2}))
    assert checkpoint.find_checkpoint(tmp_path).name == "iter-1000000"
    assert [p.name for p in checkpoint.run_checkpoints(tmp_path)] == ["iter-999999", "iter-1000000"]


def test_latest_must_point_into_its_own_run(run2, tmp_path):
    """RUN/latest pointing into another run is refused (eval would score the other run and
    write into it); a `latest` that is a real folder stops training before any iteration."""
    other = tmp_path / "other"
    shutil.copytree(run2, other, symlinks=True)
    (other / "latest").unlink()
    os.symlink(run2 / "checkpoints" / "iter-000001", other / "latest")
    with pytest.raises(UserError, match="outside this run"):
        checkpoint.find_checkpoint(other / "latest")
    assert checkpoint.find_checkpoint(run2 / "latest").name == "iter-000002"
    (run2 / "latest").unlink()
    (run2 / "latest").mkdir()
    with pytest.raises(UserError, match="real folder"):
        tiny_train(train.parse_args(["--resume", str(run2), "--iterations", "3"]))
    assert checkpoint.read_iteration(checkpoint.find_checkpoint(run2)) == 2  # nothing was written


def test_a_checkpoints_entry_that_is_no_folder_stops_before_any_work(run2):
    """`checkpoints` replaced by a file: resume says so in one line before anything loads."""
    shutil.rmtree(run2 / "checkpoints")
    (run2 / "checkpoints").write_text("not a folder")
    with pytest.raises(UserError, match="is not a folder"):
        tiny_train(train.parse_args(["--resume", str(run2), "--iterations", "3"]))


def test_a_run_killed_before_its_first_checkpoint_goes_on(tmp_path, capsys):
    """config.json and a metrics line, no checkpoint (a kill in iteration 1): --resume starts it
    from iteration 1 with its saved flags, and a plain restart starts it afresh; either way one
    line says so, and the log holds each iteration once."""
    for how in ("resume", "restart"):
        out = tmp_path / how
        out.mkdir()
        (out / "config.json").write_text(json.dumps(vars(tiny_args(out, iterations=2))))
        (out / "metrics.jsonl").write_text('{"iteration": 1, "success": 0.5}\n')
        args = train.parse_args(["--resume", str(out)]) if how == "resume" else tiny_args(out, iterations=2)
        assert args.resume is None and args.iterations == 2
        history, _ = tiny_train(args)
        assert [m["iteration"] for m in history] == [1, 2]
        assert "holds no checkpoint yet" in capsys.readouterr().out
        logged = [json.loads(line)["iteration"] for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert logged == [1, 2]


def _break(ckpt: Path, how: str) -> None:
    """Damage one file of a checkpoint the way a bad disk, a bad copy or a hostile sender would."""
    if how == "adapter bytes":
        (ckpt / "adapter_model.safetensors").write_bytes(b"\x00" * 64)
    elif how == "adapter as .bin":
        (ckpt / "adapter_model.safetensors").rename(ckpt / "adapter_model.bin")
    elif how == "adapter config":
        (ckpt / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": "eight"}))
    elif how == "optimizer structure":
        torch.save({"state": {0: {"step": torch.tensor(1.0)}}, "param_groups": [{"params": [0]}]}, ckpt / "optimizer.pt")
    elif how == "optimizer not a dict":
        torch.save([torch.zeros(2)], ckpt / "optimizer.pt")
    elif how == "config types":
        config = json.loads((ckpt / "config.json").read_text())
        (ckpt / "config.json").write_text(json.dumps({**config, "lr": "fast", "groups": [2]}))
    elif how == "config deep":
        (ckpt / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    elif how == "model with custom code":
        model_dir = ckpt.parent.parent / "model"
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps({"model_type": "llama", "auto_map": {"AutoConfig": "x.Y"}}))
        config = json.loads((ckpt / "config.json").read_text())
        (ckpt / "config.json").write_text(json.dumps({**config, "model": str(model_dir)}))


BREAKS = ["adapter bytes", "adapter as .bin", "adapter config", "optimizer structure", "optimizer not a dict",
          "config types", "config deep", "model with custom code"]


@pytest.mark.parametrize("how", BREAKS)
def test_a_broken_checkpoint_is_one_error_on_resume(run2, how):
    """Resume of a damaged checkpoint stops with a UserError naming the file (no traceback)."""
    _break(run2 / "checkpoints" / "iter-000002", how)
    with pytest.raises(UserError) as err:
        tiny_train(train.parse_args(["--resume", str(run2), "--iterations", "3"]))
    assert "iter-000002" in str(err.value) or "model" in str(err.value), str(err.value)


@pytest.mark.parametrize("how", ["adapter bytes", "adapter as .bin", "config deep", "model with custom code"])
def test_a_broken_checkpoint_is_one_line_from_eval(run2, how):
    """eval.py --checkpoint on a damaged checkpoint: exit 2, one line, no traceback."""
    _break(run2 / "checkpoints" / "iter-000002", how)
    proc = subprocess.run([sys.executable, "eval.py", "--policy", "model", "--checkpoint", str(run2), "--env", "webshop",
                           "--num-games", "1"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and proc.stderr.strip().count("\n") == 0, proc.stderr[-2000:]


def test_non_utf8_bytes_in_a_log_are_dropped_at_resume(run2):
    """A line that is not UTF-8 in metrics.jsonl is dropped like a torn line, not a crash."""
    with (run2 / "metrics.jsonl").open("ab") as f:
        f.write(b'\xff\xfe{"iteration": 1}\n')
    history, _ = tiny_train(train.parse_args(["--resume", str(run2), "--iterations", "3"]))
    assert [m["iteration"] for m in history] == [3]
    assert [json.loads(x)["iteration"] for x in (run2 / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


def test_no_model_folder_with_custom_code_is_loaded(tmp_path):
    """A model folder whose config asks for custom code (auto_map) is refused before any
    transformers call that could ask to run it; so is a path that is neither a folder nor an id."""
    from infra.models import check_model_source, load_policy

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": ["x.T", None]}}))
    with pytest.raises(UserError, match="custom code"):
        load_policy(str(folder))
    with pytest.raises(UserError, match="Hugging Face id"):
        check_model_source(str(tmp_path / "missing"))
    check_model_source("Qwen/Qwen2.5-7B-Instruct")  # an id: fine


def test_a_run_folder_has_one_writer_and_a_dead_holders_lock_is_taken_over(tmp_path):
    """While a live process holds RUN/.lock, train.py on that folder (a second run or a --resume)
    stops with one line naming the holder, before anything loads and with nothing written; the
    lock file a killed run leaves holds no flock, so the next run takes it over."""
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from infra.checkpoint import RunFolder; "
                               f"run = RunFolder({str(out)!r}); run.lock(); print('held', flush=True); time.sleep(60)"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=rf"is in use by train.py \(pid {holder.pid}"):
            train.train(tiny_args(out, iterations=1))
        assert sorted(p.name for p in out.iterdir()) == [".lock"]
    finally:
        holder.kill()
        holder.wait()
    tiny_train(tiny_args(out, iterations=1))  # the dead holder's lock is taken over
    assert "train.py (pid" in (out / ".lock").read_text() and (out / "latest").exists()
    with pytest.raises(UserError, match="is inside the run folder"):  # a file of the run's own checkpoint
        train.train(tiny_args(out / "latest" / "state.json", iterations=1))
    (out.parent / "a_file").write_text("x")
    with pytest.raises(UserError, match="cannot use .* as a run folder"):
        train.train(tiny_args(out.parent / "a_file", iterations=1))  # a file, not a folder


def test_no_run_writes_into_the_root_the_home_folder_the_repository_or_a_folder_of_other_files(tmp_path, monkeypatch):
    """--output-dir /, ~, the repository's root (e.g. `.` from there) and a folder holding files no
    run wrote are refused with one line before anything is written."""
    for place in ("/", str(Path.home()), str(ROOT)):
        with pytest.raises(UserError, match="a folder of its own"):
            checkpoint.RunFolder(place).lock()
    monkeypatch.chdir(ROOT)
    with pytest.raises(UserError, match="the repository's root"):
        train.train(tiny_args(".", iterations=1))
    assert not (ROOT / ".lock").exists() and not (ROOT / "config.json").exists()
    mine = tmp_path / "thesis"
    mine.mkdir()
    (mine / "chapter1.tex").write_text("mine")
    with pytest.raises(UserError, match=r"holds files no run wrote \(chapter1.tex\)"):
        tiny_train(tiny_args(mine, iterations=1))
    assert sorted(p.name for p in mine.iterdir()) == ["chapter1.tex"]


@pytest.mark.parametrize("where, error", [
    ("metrics logged", OSError(28, "No space left on device")),  # append_jsonl's own error
    ("checkpoint written", RuntimeError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, "
                                        "message: \"No space left on device\" })")),  # safetensors' words for it
    ("latest updated", OSError(30, "Read-only file system")),
])
def test_a_full_or_read_only_disk_is_one_line_and_the_run_resumes_once_fixed(tmp_path, monkeypatch, where, error):
    """A file-system refusal at a write point is one UserError naming the run folder and --resume;
    the previous checkpoint and `latest` stay intact, and the run resumes once the disk is fixed."""
    out = tmp_path / "run"
    tiny_train(tiny_args(out, iterations=1))

    def refuse(name):
        if name == where:
            raise error

    monkeypatch.setattr(checkpoint, "crash_hook", refuse)
    with pytest.raises(UserError, match=r"cannot write .* (no space left|read-only).* --resume"):
        tiny_train(tiny_args(out, iterations=2, resume=str(out)))
    monkeypatch.setattr(checkpoint, "crash_hook", None)
    assert checkpoint.read_iteration(checkpoint.find_checkpoint(out)) in (1, 2)  # 2 only after `latest` was renamed
    lines, _ = tiny_train(tiny_args(out, iterations=3, resume=str(out)))
    assert checkpoint.read_iteration(checkpoint.find_checkpoint(out)) == 3


def test_a_short_write_from_torch_on_a_full_disk_is_one_line_too(tmp_path, monkeypatch):
    """torch's zip writer, on a full tmpfs, raised only "unexpected pos 64 vs 0" (no OS words): on a
    file system with next to no space left that is a full disk (one line); elsewhere it is not
    a disk problem and keeps its traceback."""
    import collections

    out = tmp_path / "run"
    tiny_train(tiny_args(out, iterations=1))
    short = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")
    usage = collections.namedtuple("usage", "total used free")

    def refuse(name):
        if name == "checkpoint written":
            raise short

    monkeypatch.setattr(checkpoint, "crash_hook", refuse)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 4096, 4096))
    with pytest.raises(UserError, match=r"cannot write the checkpoint of iteration 2 .* no space left .* --resume"):
        tiny_train(tiny_args(out, iterations=2, resume=str(out)))
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: usage(10**12, 10**9, 10**12 - 10**9))
    with pytest.raises(RuntimeError, match="unexpected pos"):
        tiny_train(tiny_args(out, iterations=2, resume=str(out)))
    monkeypatch.setattr(checkpoint, "crash_hook", None)
    tiny_train(tiny_args(out, iterations=2, resume=str(out)))
    assert checkpoint.read_iteration(checkpoint.find_checkpoint(out)) == 2


# ----------------------------------------------------------------------------- files well formed but wrong
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


# ----------------------------------------------------------------------------- one writer, no run inside another
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


# ----------------------------------------------------------------------------- logs and folders that cannot be read
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
    refusals are raised by hand here; tests/bad_inputs.py runs them as nobody.)"""
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


class _Killed(BaseException):
    """Stands in for kill -9: unwinds without running any `except Exception` handler."""


def test_a_new_run_in_a_stopped_run_s_folder_keeps_none_of_its_records(tmp_path, monkeypatch, capsys):
    """A run stopped in iteration 2, before its first checkpoint (--eval-every 1 --save-every 3), left
    its log and its evaluation of iteration 1; a new run there with other flags (--lr 0.5 --eval-every
    0) starts from iteration 1 and removes them, saying which in one line: tools.compare and the plots
    read every record in a run folder as its run's."""
    out = tmp_path / "run"
    iteration = train.Trainer.iteration

    def stopped_in_the_second(self):
        if self.iteration_done == 1:
            raise _Killed
        return iteration(self)

    monkeypatch.setattr(train.Trainer, "iteration", stopped_in_the_second)
    with pytest.raises(_Killed):
        tiny_train(tiny_args(out, env="webshop", eval_every=1, eval_games=1, save_every=3))
    monkeypatch.undo()
    assert (out / "eval_webshop_test_iter-000001.json").is_file() and not checkpoint.run_checkpoints(out)
    capsys.readouterr()
    tiny_train(tiny_args(out, env="webshop", lr=0.5, eval_every=0, iterations=1))
    said = capsys.readouterr().out
    assert "starting it from iteration 1; removed what that run wrote: eval_webshop_test_iter-000001.json" in said
    assert sorted(p.name for p in out.iterdir()) == [".lock", "checkpoints", "config.json", "latest", "metrics.jsonl",
                                                     "samples.jsonl"]
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in logged] == [1] and json.loads((out / "config.json").read_text())["lr"] == 0.5


def test_an_evaluation_claims_its_name_under_a_name_no_reader_takes_and_gives_it_back(tmp_path, monkeypatch):
    """eval.py --checkpoint RUN claims its record's name before the first game; a kill (which runs no
    handler) or a write that fails (a full disk) left a 0-byte evalpy_..._iter-N.json, a name that
    promises a result, one more per retry. The claim is a hidden `.evalpy_....json.claim` beside it: a
    kill leaves no file named like a record (and the next evaluation takes the next name), a failed
    write gives the claim back."""
    import errno

    import eval as eval_script
    from tiny_runs import tiny_run_folder

    run = tiny_run_folder(tmp_path, env="webshop")
    ckpt = checkpoint.find_checkpoint(run)
    killed = eval_script.claim_out_path("webshop", "model", "test", ckpt)  # then killed: nothing given back
    assert killed.name == "evalpy_webshop_test_iter-000001.json" and not killed.exists()
    assert eval_script.claim_out_path("webshop", "model", "test", ckpt).name.endswith("iter-000001-2.json")
    before = sorted(p.name for p in run.iterdir())

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(eval_script, "write_atomic", full)
    for _ in range(2):
        with pytest.raises(UserError, match="no space left"):
            eval_script.main(["--policy", "model", "--checkpoint", str(run), "--num-games", "1"])
    assert sorted(p.name for p in run.iterdir()) == before
    assert not list(run.glob("evalpy_*.json"))


def test_an_output_on_a_read_only_mount_is_called_read_only(tmp_path, monkeypatch):
    """eval.py --out in a folder of a read-only file system said "permission denied"."""
    import eval as eval_script

    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False)
    statvfs = os.statvfs
    monkeypatch.setattr(os, "statvfs", lambda path: type("Stat", (), {"f_flag": statvfs(path).f_flag | os.ST_RDONLY}))
    with pytest.raises(UserError, match=r"cannot write .*x\.json \(the file system is read-only\): pass another --out"):
        eval_script.main(["--env", "webshop", "--policy", "random", "--num-games", "1", "--out", str(tmp_path / "x.json")])
