"""Runs that survive, round seven: each defect a hostile user found at b066a05, at its root.

- Provenance from the parser: which flags a command line gave comes from tyro's own parse, so every
  spelling it takes (`--max_steps`, `--no-plain`, `--help` anywhere) means the same to a resume, a
  preset and the tools.
- Empty is not absent: `--resume ''` (an unset $RUN) is an error, never the default.
- A name is claimed before the work, exclusively; outputs are checked before long work starts.
- Shared files are updated under a lock with a fresh read (the precision cache).
- A record is used only for what it measured (tools.compare, eval.py's --out).
- Old run folders resolve their relative data folder the way it was written, or refuse in one line.
- Text goes out in whatever encoding the stream has.
- A picture that cannot be drawn costs a complete run nothing.
(The verl bridge's settings are checked in verl_bridge/tests/test_sharpo_trainer.py, in its venv.)"""
import io
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import eval as eval_script
import train
from flags import LEARN_WARMSTART
from infra import checkpoint, precision
from infra.cli import GuardedStream, UserError, given_flags
from infra.curves import draw_curves
from tiny_runs import tiny_run_folder

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parent.parent


def _cli(*argv, env=None, cwd=ROOT, timeout=300):
    return subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


# ----------------------------------------------------------------------------- provenance from the parser
@pytest.mark.parametrize("order", ["help last", "help first"])
def test_help_beside_resume_prints_help_and_trains_nothing(tmp_path, order, capsys):
    """`--resume R --iterations 3 --help` trained iteration 3 and printed no help: the help flag was stripped
    before the resume path, which never reached tyro."""
    run = tiny_run_folder(tmp_path)
    argv = ["--resume", str(run), "--iterations", "3"]
    argv = argv + ["--help"] if order == "help last" else ["--help"] + argv
    before = (run / "metrics.jsonl").read_text()
    with pytest.raises(SystemExit) as stop:
        train.parse_args(argv)
    assert stop.value.code == 0 and "--iterations" in capsys.readouterr().out
    assert (run / "metrics.jsonl").read_text() == before


def test_underscore_spellings_mean_what_the_hyphens_mean(tmp_path):
    """tyro takes `--max_steps` for `--max-steps`; the provenance scan knew only hyphens, so a resume ran a
    changed experiment, kept training in place instead of branching, ignored allowed changes, and a preset's
    warm start overrode the one the command line gave."""
    run = tiny_run_folder(tmp_path)
    with pytest.raises(UserError, match=r"--max-steps \(run: 2, given: 5\)"):
        train.parse_args(["--resume", str(run), "--iterations", "3", "--max_steps", "5"])
    branch = train.parse_args(["--resume", str(run), "--output_dir", str(tmp_path / "branch")])
    assert branch.output_dir == str(tmp_path / "branch")
    resumed = train.parse_args(["--resume", str(run), "--iterations", "3", "--eval_every", "1", "--eval_games", "2"])
    assert (resumed.eval_every, resumed.eval_games) == (1, 2)
    demo = train.parse_args(["--preset", "cpu-demo", "--init_adapter", str(LEARN_WARMSTART), "--output-dir", "x"])
    assert demo.init_adapter == str(LEARN_WARMSTART)
    given, asks_help = given_flags(train.TrainArgs, ["--max_steps=5", "--no_plain", "--shuffle_rewards"])
    assert given == {"max_steps": 5, "plain": False, "shuffle_rewards": True} and not asks_help


def test_compare_and_the_device_check_read_flags_as_the_parser_does(tmp_path):
    """tools.compare labelled a placebo run "sharpo" (`--shuffle_rewards` passed its scan); the device check's
    dry run timed the default batches under `--decode_batches 2`."""
    from tools import compare, device_check

    with pytest.raises(UserError, match="--shuffle-rewards is set by compare.py"):
        compare.main(["--algos", "sharpo", "--out", str(tmp_path / "c"), "--", "--shuffle_rewards", "--model", "tiny"])
    assert given_flags(device_check.DeviceCheckArgs, ["--decode_batches", "2"])[0] == {"decode_batches": "2"}


# ----------------------------------------------------------------------------- empty is not absent
@pytest.mark.parametrize("argv", [["--resume", ""], ["--model", "", "--preset", "none"], ["--output-dir", ""],
                                  ["--init-adapter", "", "--preset", "none", "--model", "tiny"]])
def test_an_empty_value_is_an_error_not_the_default(argv):
    """`--resume ''` (an unset $RUN) started a new run; `--model ''` trained the default model while
    config.json recorded ''."""
    with pytest.raises(UserError, match="'' is empty"):
        train.parse_args(argv)


def test_eval_with_an_empty_checkpoint_plays_no_base_model():
    with pytest.raises(UserError, match="--checkpoint '' is empty"):
        eval_script.main(["--policy", "model", "--checkpoint", ""])


@pytest.mark.parametrize("argv, field, value", [
    (["--load-in-4bit", "none"], "load_in_4bit", False),  # None: on a CPU, resolved to False
    (["--init-adapter", "NONE"], "init_adapter", None),
])
def test_none_in_any_case_for_a_flag_that_takes_none(argv, field, value):
    """The docs say an `X | None` flag takes `none`: tyro took only `None` (`--load-in-4bit none` refused)."""
    args = train.parse_args(["--model", "tiny", "--preset", "none", "--output-dir", "x", *argv])
    assert getattr(args, field) == value


def test_eval_takes_none_for_its_optional_flags():
    args = eval_script.parse_dataclass(eval_script.EvalArgs, ["--env", "none", "--max-steps", "none"])
    assert args.env is None and args.max_steps is None


def test_a_history_python_calls_a_digit_names_the_flag():
    with pytest.raises(UserError, match="--history must be a non-negative integer"):
        train.parse_args(["--history", "\u00b2", "--model", "tiny", "--preset", "none"])


# ----------------------------------------------------------------------------- names claimed, outputs checked first
def test_two_evaluations_of_one_checkpoint_claim_two_names(tmp_path):
    """Two `eval.py --checkpoint RUN` at once both picked the first free name, and one result was lost: the
    name is claimed (a hidden claim file beside it, created exclusively) before any game, so the second takes
    the next."""
    run = tiny_run_folder(tmp_path)
    ckpt = run / "checkpoints" / "iter-000001"
    first = eval_script.claim_out_path("alfworld", "model", "test", ckpt)
    second = eval_script.claim_out_path("alfworld", "model", "test", ckpt)
    assert first != second and checkpoint.claim_of(first).is_file() and checkpoint.claim_of(second).is_file()
    assert second.name == "evalpy_alfworld_test_iter-000001-2.json"


def test_an_evaluation_that_fails_gives_its_claimed_name_back(tmp_path, monkeypatch):
    run = tiny_run_folder(tmp_path)

    def broken(*args, **kw):
        raise UserError("the policy would not load")

    monkeypatch.setattr(eval_script, "load_model_policy", broken)
    with pytest.raises(UserError, match="would not load"):
        eval_script.main(["--policy", "model", "--checkpoint", str(run), "--num-games", "1"])
    assert not list(run.glob("evalpy_*.json"))


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


def test_credit_refuses_a_model_beside_a_checkpoint(tmp_path):
    from tools import credit

    run = tiny_run_folder(tmp_path)
    with pytest.raises(UserError, match="--model and --checkpoint"):
        credit.main(["--checkpoint", str(run), "--model", "smollm2", "--out", str(tmp_path / "c")])


# ----------------------------------------------------------------------------- shared files: a lock, a fresh read
def _measure(cache: str, model: str) -> None:
    os.environ["SHARPO_CACHE"] = cache
    import time as clock

    from infra import precision as p

    def once(bf16: bool) -> float:  # a clear verdict, slowly: both processes read the file before either writes
        clock.sleep(0.05)
        return 0.01 if bf16 else 0.03

    p.measured_cpu_dtype(model, once=once, cap_s=1.0)


def test_two_measurements_at_once_keep_both_records(tmp_path):
    """Two processes measuring into one fresh $SHARPO_CACHE both said "kept in dtype.json" and one record
    remained: each read at start and rewrote the whole file at the end."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_measure, args=(str(tmp_path), model)) for model in ("tiny", "smollm2")]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
    records = json.loads((tmp_path / "dtype.json").read_text())
    assert sorted(key.rsplit("| ", 1)[1] for key in records) == ["smollm2", "tiny"]


def test_the_cache_keeps_what_another_process_wrote_since_it_was_read(tmp_path):
    path = tmp_path / "dtype.json"
    path.write_text(json.dumps({"other": {"dtype": "bf16"}}))
    assert precision.write_cache(path, "mine", {"dtype": "fp32"}) is None
    assert set(json.loads(path.read_text())) == {"other", "mine"}


# ----------------------------------------------------------------------------- a record is what it measured
def test_eval_refuses_an_out_named_as_a_runs_own_evaluation(tmp_path):
    """`eval.py --out RUN/eval_..._iter-000004.json` on a run at iteration 2 was accepted, and compare then
    took iteration 2's checkpoint for the final one."""
    run = tiny_run_folder(tmp_path)
    with pytest.raises(UserError, match="name of a run's own evaluation"):
        eval_script.main(["--policy", "model", "--checkpoint", str(run),
                          "--out", str(run / "eval_alfworld_test_iter-000004.json")])


def test_compare_takes_a_runs_own_evaluation_only_where_it_measured_the_same(tmp_path):
    """compare took a run's in-loop record as its held-out result whatever games it played (2 against the
    start's 17): only the limits were matched."""
    from tools import compare

    args = compare.CompareArgs(eval_split="valid_seen", eval_max_steps=4, eval_new_tokens=8)
    config = {"split": "valid_seen", "iteration": 3, "max_steps": 4, "max_new_tokens": 8}
    all_games = {f"g{k}": {"won": False, "steps": 4} for k in range(5)}
    record = {"success": 0.0, "games": dict(list(all_games.items())[:2]), "config": config}
    path = tmp_path / "eval_alfworld_valid_seen_iter-000003.json"
    path.write_text(json.dumps(record))
    assert compare.in_loop_evaluation(tmp_path, "valid_seen", 3, args, set(all_games)) is None  # 2 of 5 games
    path.write_text(json.dumps({**record, "games": all_games}))
    assert compare.in_loop_evaluation(tmp_path, "valid_seen", 3, args, set(all_games)) == path
    path.write_text(json.dumps({**record, "games": all_games, "config": {**config, "iteration": 2}}))
    assert compare.in_loop_evaluation(tmp_path, "valid_seen", 3, args, set(all_games)) is None  # another checkpoint


@pytest.mark.parametrize("wins", [[0, 0], [1], "x", [2, 1], [True, 1]])
def test_compare_reads_damaged_task_wins_in_one_line(tmp_path, wins):
    from tools import compare

    line = {"iteration": 1, "success": 0.5, "task_wins": {"t": wins}}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(line) + "\n")
    with pytest.raises(UserError, match="task_wins"):
        compare.read_metrics(tmp_path)


# ----------------------------------------------------------------------------- old run folders
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


# ----------------------------------------------------------------------------- the stream's own encoding
def test_a_stream_that_cannot_write_a_symbol_gets_its_nearest_ascii():
    raw = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    stream = GuardedStream(raw, "output")
    stream.write("mult 1.004\u00b10.006 | caf\u00e9 \u2192 done\n")
    raw.flush()
    assert raw.buffer.getvalue().decode("ascii") == "mult 1.004+-0.006 | caf? -> done\n"


def test_a_run_on_an_ascii_stdout_ends_well():
    """`PYTHONIOENCODING=ascii` (or `LC_ALL=C`): the progress line's `\u00b1`, printed after the checkpoint, ended
    a complete run in a traceback with exit 1; eval.py's table with an accented category too."""
    code = ("import report; from infra.cli import run\n"
            "line = {'iteration': 2, 'success': 0.5, 'invalid_rate': 0.0, 'mean_reward': 5.0, 'groups_with_spread': 1.0,"
            " 'mult_mean': 1.004, 'mult_std': 0.006, 'mult_at_bound': 0.0, 'seconds/rollout': 3.0}\n"
            "run(lambda: print(report.progress_line(line, [0.25, 0.5]), '| caf\\u00e9'))")
    done = _cli("-c", code, env={"PYTHONIOENCODING": "ascii"})
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "mult 1.004+-0.006" in done.stdout and "caf?" in done.stdout and ",- +0.25" in done.stdout


# ----------------------------------------------------------------------------- pictures
def test_a_broken_matplotlib_costs_a_complete_run_nothing(tmp_path, monkeypatch, capsys):
    """A matplotlib failure other than OSError (ImportError, RuntimeError) ended a complete run with a
    traceback and exit 1, so tools.compare reported it FAILED."""
    from infra import curves

    (tmp_path / "metrics.jsonl").write_text(json.dumps({"iteration": 1, "success": 0.5}) + "\n")

    def broken(*args):
        raise RuntimeError("no backend")

    monkeypatch.setattr(curves, "curves_png", broken)
    assert draw_curves(tmp_path) is None and "RuntimeError: no backend" in capsys.readouterr().err


def test_plots_of_a_log_with_an_iteration_beyond_float_draw_the_others(tmp_path):
    from tools import plots

    lines = [{"iteration": 1, "success": 0.5}, {"iteration": 10**400, "success": 0.7}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    out = plots.make_plots(tmp_path)
    assert out["curves.png"].stat().st_size > 0


# ----------------------------------------------------------------------------- the device check's wheel
def test_a_damaged_wheel_is_one_line(tmp_path):
    from tools import device_check

    (tmp_path / "bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl").write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(UserError, match="not a whole wheel"):
        device_check.slim_bitsandbytes(tmp_path)
    good = tmp_path / "good"
    good.mkdir()
    with zipfile.ZipFile(good / "bitsandbytes-0.50.2-py3-none-any.whl", "w") as z:
        z.writestr("bitsandbytes/libbitsandbytes_cuda121.so", b"x")
        z.writestr("bitsandbytes/libbitsandbytes_cuda130.so", b"y")
    device_check.slim_bitsandbytes(good)
    with zipfile.ZipFile(good / "bitsandbytes-0.50.2-py3-none-any.whl") as z:
        assert z.namelist() == ["bitsandbytes/libbitsandbytes_cuda130.so"]
