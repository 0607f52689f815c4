"""What a resume takes from its run folder, and what it refuses: the run's config.json as its checkpoint
saved it (one edited by hand is refused, naming the file), only the flags a resume may change (not
--preset; --iterations at or below the run's own is refused), a one-time --plain for that session alone,
and a checkpoint's own bad value blamed on its file, not on a flag; --resume with --output-dir branches a new
run from any checkpoint, a branch too. If these fail, a resume runs another experiment than the one it
continues, or does nothing and exits 0, or names the wrong culprit."""
import json

import pytest

import train
from infra.checkpoint import find_checkpoint
from infra.cli import UserError
from stub_env import StubEnv
from tiny_runs import tiny_run_folder


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
