"""A checkpoint is played on what it trained on: config.json records the data folder absolute (and
$WEBSHOP_DATA's folder), each checkpoint the digest of its tasks, so a resume, eval.py --checkpoint and
tools.credit --checkpoint play the run's own env, data, --history, --max-steps and --max-new-tokens, or
refuse in one line (data changed under the same path, an old run's relative data folder read from
elsewhere, an --env the checkpoint contradicts); a flag given wins where it may. If these fail, a resumed
or evaluated run plays another catalog, env or setting without a word, and its numbers mean something
else."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import eval as eval_script
import train
from cli_runs import one_line as _one_line
from cli_runs import run_cli as _cli
from infra.cli import UserError
from tiny_runs import flags, tiny_run_folder

ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- the resume
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


# ----------------------------------------------------------------------------- eval.py and tools.credit on a checkpoint
def test_a_relative_data_folder_of_an_old_run_is_refused_from_elsewhere(tmp_path, monkeypatch):
    """Run folders written before data folders were recorded absolute (b60459e and older) hold `data_dir`
    as typed: eval.py and tools.credit read it against the current folder and played that folder's data."""
    run = tiny_run_folder(tmp_path)
    for config in (run / "config.json", run / "checkpoints" / "iter-000001" / "config.json"):
        saved = json.loads(config.read_text())
        config.write_text(json.dumps({**saved, "data_dir": "games"}))
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(ROOT / "data" / "alfworld", elsewhere / "games")
    monkeypatch.chdir(elsewhere)
    with pytest.raises(UserError, match="relative to the folder its run was started in"):
        eval_script.main(["--policy", "model", "--checkpoint", str(run), "--num-games", "1"])


def test_data_edited_since_the_run_is_refused_unless_asked_for(tmp_path):
    from types import SimpleNamespace

    run = tiny_run_folder(tmp_path)
    ckpt = run / "checkpoints" / "iter-000001"
    state = json.loads((ckpt / "state.json").read_text())
    (ckpt / "state.json").write_text(json.dumps({**state, "data": "aaaa"}))
    env = SimpleNamespace(data_digest=lambda: "bbbb")
    with pytest.raises(UserError, match="holds other tasks than"):
        eval_script.check_trained_data(ckpt, env, str(tmp_path / "shop"))
    eval_script.check_trained_data(ckpt, SimpleNamespace(data_digest=lambda: "aaaa"), str(tmp_path / "shop"))


def test_eval_of_a_checkpoint_plays_its_own_env(tmp_path):
    run = tiny_run_folder(tmp_path, env="webshop")
    done = _cli("eval.py", "--policy", "model", "--checkpoint", str(run), "--num-games", "1", "--max-steps", "1")
    assert done.returncode == 0, done.stderr[-1500:]
    assert "webshop / test / policy model" in done.stdout
    _one_line(_cli("eval.py", "--env", "alfworld", "--policy", "model", "--checkpoint", str(run)), "trained on webshop")


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
    assert seen == [("webshop", credit.held_out_split("webshop"))] and seen[0][1] == "test"


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
