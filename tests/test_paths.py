"""The paths a command is given: every output (train.py's run folder, eval.py's --out, the --out of
tools.compare, tools.credit and tools.warmstart) is checked before any work, and a path the file system
cannot take (a file in the way, a folder in a file's place, /dev/full, a name over 255 bytes, a path over
4,096) is one line and exit 2, in any path flag of any script. If these fail, the work is lost at its
last write, or ends in a traceback."""
import pytest

from cli_runs import one_line as _one_line
from cli_runs import run_cli as _cli
from infra.cli import UserError
from tiny_runs import flags


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


def test_credit_and_warmstart_check_their_output_before_the_work(tmp_path, monkeypatch):
    """tools.credit and tools.warmstart found a read-only or occupied --out only after all their work."""
    from tools import credit, warmstart

    occupied = tmp_path / "a-file"
    occupied.write_text("taken")

    def no_work(*args, **kw):
        raise AssertionError("the work started before --out was checked")

    monkeypatch.setattr(credit, "load", no_work)
    monkeypatch.setattr(warmstart, "load_policy", no_work)
    with pytest.raises(UserError, match="cannot write"):
        credit.main(["--out", str(occupied), "--games", "1"])
    with pytest.raises(UserError, match="cannot write"):
        warmstart.main(["--out", str(occupied)])


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
