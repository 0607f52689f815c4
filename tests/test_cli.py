"""The command line: flags mean what they say, presets and explicit flags combine as documented,
and every user error is one line with exit code 2 before anything loads."""
import subprocess
import sys
from pathlib import Path

import pytest

import eval as eval_script
import train
import flags as train_flags
from flags import LEARN_WARMSTART
from flags.parse import describe
from infra import checkpoint
from infra.cli import UserError, given_flags
from tiny_runs import flags, tiny_args, tiny_run_folder, tiny_train

ROOT = Path(__file__).resolve().parent.parent


def test_explicit_model_beats_the_presets_warm_start():
    """The cpu-demo preset's warm start is SmolLM2's: with --model tiny it is dropped (it made a
    size-mismatch crash); with the preset's own model it stays; an explicit one is kept."""
    args = train.parse_args(["--preset", "cpu-demo", "--env", "alfworld", "--model", "tiny"])
    assert args.model == "tiny" and args.init_adapter is None
    assert train.parse_args(["--preset", "cpu-demo"]).init_adapter == str(train_flags.WARMSTART)
    assert train.parse_args(["--preset", "cpu-demo", "--init-adapter", "none"]).init_adapter is None


def test_the_learning_preset_plays_the_learning_set():
    """--preset cpu-learn trains on data/alfworld-learn's train games with its own warm start,
    evaluates on its held-out split, writes to its own run folder, and is ALFWorld's only."""
    args = train.parse_args(["--preset", "cpu-learn"])
    assert args.data_dir == str(train_flags.DATA / "alfworld-learn") and args.eval_split == "valid_seen"
    assert args.init_adapter == str(train_flags.LEARN_WARMSTART) and args.output_dir == "runs/alfworld-sharpo-cpu-learn"
    assert (train_flags.DATA / "alfworld-learn" / "json_2.1.1" / "train").is_dir()
    assert (train_flags.LEARN_WARMSTART / "adapter_model.safetensors").is_file()
    with pytest.raises(UserError, match="cpu-learn is alfworld's"):
        train.parse_args(["--preset", "cpu-learn", "--env", "webshop"])


def test_help_shows_the_presets_defaults_and_bad_values_stop_before_loading():
    """`train.py --help` comes from tyro, in sections (the method's flags, the baselines', the run's),
    and prints the defaults the chosen preset will use; a misspelt env is one line, exit 2, before any
    model or env is imported."""
    out = subprocess.run([sys.executable, "train.py", "--preset", "cpu-demo", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    text = " ".join(out.stdout.translate({ord(c): " " for c in "\u2502\u2500\u256d\u256e\u2570\u256f"}).split())
    assert "--iterations INT training iterations, one rollout batch each (default: 2)" in text
    assert text.index("MethodArgs options") < text.index("BaselineArgs options") < text.index("RunArgs options")
    assert "The method's flags (METHOD.md)" in text and "How a run of train.py is executed" in text
    assert "--model {None}|STR" in text and "(default: smollm2)" in text
    assert "--env {alfworld,webshop}" in text and "--algo {sharpo,grpo,rlsd,stepopsd,sdar,gigpo}" in text
    bad = subprocess.run([sys.executable, "-c", "import sys, train; from infra.cli import run; "
                          "run(lambda: train.main(['--env', 'alfwrld'])); "],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1] == ("error: --env 'alfwrld' is no environment of this project: "
                                                   "choose one of alfworld, webshop")
    assert "Traceback" not in bad.stderr


def test_min_new_tokens_is_no_training_flag(capsys):
    """Forcing response lengths (the bench's timing trick) makes the PPO ratio off-policy: train.py has no such flag."""
    with pytest.raises(UserError, match="Unrecognized options: --min-new-tokens"):
        train.parse_args(["--min-new-tokens", "8"])


def test_rollout_vllm_without_vllm_says_how_to_install_it(monkeypatch):
    """Before any model loads: --rollout vllm in an environment without vLLM names the installer;
    --vllm-gpu-memory must be a share."""
    import importlib.util

    import vllm_rollout

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name, *a))
    assert vllm_rollout.missing() == vllm_rollout.INSTALL
    with pytest.raises(UserError, match="install_vllm.sh"):
        train.parse_args(["--rollout", "vllm"])
    with pytest.raises(UserError, match="--vllm-gpu-memory"):
        train.parse_args(["--vllm-gpu-memory", "35"])
    assert train.parse_args(["--preset", "cpu-demo"]).rollout == "hf"


@pytest.mark.parametrize("script, argv, needle", [
    ("train", ["--env", "bogus"], "--env"),
    ("train", ["--split", "bogus"], "--split"),
    ("train", ["--lr", "-1"], "--lr"),
    ("train", ["--lora-r", "0"], "--lora-r"),
    ("train", ["--temperature", "nan"], "--temperature"),
    ("eval", ["--batch-size", "0"], "--batch-size"),
    ("eval", ["--policy", "expert", "--checkpoint", "runs/x"], "--policy model"),
])
def test_user_errors_are_one_line_and_exit_2(script, argv, needle):
    code = f"import {script}; from infra.cli import run; run(lambda: {script}.main({argv!r}))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = [line for line in out.stderr.splitlines() if line.startswith("error")]
    assert out.returncode == 2 and len(lines) == 1 and needle in lines[0], out.stderr
    assert "Traceback" not in out.stderr


def test_eval_checkpoint_without_config_is_a_clear_error(tmp_path):
    tiny_train(tiny_args(tmp_path / "run", iterations=1))
    ckpt = checkpoint.find_checkpoint(tmp_path / "run")
    (ckpt / "config.json").unlink()
    (tmp_path / "run" / "config.json").unlink()
    with pytest.raises(UserError, match="no complete checkpoint|config.json"):
        eval_script.main(["--policy", "model", "--checkpoint", str(ckpt)])


def test_group_size_one_warns(capsys):
    train.parse_args(["--group-size", "1", "--model", "tiny"])
    assert "advantage 0" in capsys.readouterr().err


def test_eval_writes_into_runs_not_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    eval_script.main(["--env", "webshop", "--policy", "random", "--num-games", "2"])
    assert (tmp_path / "runs" / "eval" / "webshop_random_test.json").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["runs"]


def test_install_script_shows_progress():
    """install.sh says what it is doing (pip's progress is not silenced with -q)."""
    text = (ROOT / "install.sh").read_text()
    assert " -q" not in text and text.count("echo ") >= 3


@pytest.mark.parametrize("argv, needle", [
    (["--lr", "-1e-3"], "--lr must be in (0, 1]; got -0.001"),  # argparse alone read -1e-3 as a flag
    (["--lr", "-inf"], "--lr must be in (0, 1]; got -inf"),
    (["--lam", "nan"], "--lam must be in [0, 1]; got nan"),
    (["--eps-m", "1"], "--eps-m must be in (0, 1); got 1.0"),
    (["--seed", str(2**70)], "--seed must be in [0, 2^32); got"),  # a ValueError traceback in torch before
    (["--groups", "100000"], "above this project's limit of 4096"),  # it printed nothing for minutes before
    (["--max-steps", "100000"], "above this project's limit of 1000"),
])
def test_flags_at_their_edges_are_one_message(argv, needle):
    with pytest.raises(UserError) as err:
        train.parse_args(argv)
    assert needle in str(err.value) and str(err.value).count(";") == needle.count(";")


@pytest.mark.parametrize("tool, argv, needle", [
    ("eval", ["--policy", "random", "--seed", str(2**32)], "--seed must be in [0, 2^32); got 4294967296"),
    ("eval", ["--policy", "random", "--seed", "-1"], "--seed must be in [0, 2^32); got -1"),
    ("tools.warmstart", ["--seed", "-5"], "--seed must be in [0, 2^32); got -5"),
    ("tools.credit", ["--seeds", "0,4294967296"], "--seeds must be in [0, 2^32); got 4294967296"),
    ("tools.compare", ["--seeds", "-2", "--out", "unused", "--", "--model", "tiny"], "--seeds must be in [0, 2^32); got -2"),
])
def test_seeds_out_of_range_are_one_message_in_every_tool(tool, argv, needle, tmp_path, monkeypatch):
    """Every --seed / --seeds is range-checked before anything loads (torch raised a ValueError
    traceback for a seed beyond 2^32 - 1, and random.seed took a negative one silently)."""
    import importlib

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as err:
        importlib.import_module(tool).main(argv)
    assert needle in str(err.value)
    assert not (tmp_path / "unused").exists()


def test_a_stop_under_a_progress_bar_starts_its_own_line_and_the_exit_ignores_further_signals(capsys):
    """The stop's line follows a cleared bar, not the half-drawn bar (tests/bad_inputs.py saw
    "...0/2 [00:00<?, ?turn/s]interrupted: ..."); once the command is over, a signal during the
    interpreter's exit is ignored (it ended the process with -2 and no line)."""
    import signal

    from tqdm.auto import tqdm

    from infra.cli import run

    def stopped_mid_bar():
        bar = tqdm(range(3), leave=False)
        next(iter(bar))
        raise KeyboardInterrupt()

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(SystemExit) as exit_:
            run(stopped_mid_bar)
        assert exit_.value.code == 130
        assert all(signal.getsignal(s) == signal.SIG_IGN for s in before)
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    assert capsys.readouterr().err.splitlines()[-1].startswith("interrupted: stopped before it finished")


def test_the_demo_says_what_its_preset_changes_and_why():
    """The cpu-demo preset switches the hindsight mode and the KL term, among others: the run's first
    lines say so, each change with its reason; a flag given on the command line is not reported as
    the preset's."""
    text = describe(train.parse_args(["--preset", "cpu-demo", "--output-dir", "unused"]))
    assert "the cpu-demo preset changes, from the GPU setting:" in text
    assert "--hindsight expert: the 135M model rarely has a winning sibling" in text
    assert "--kl-coef 0.0: no KL term" in text
    mine = describe(train.parse_args(["--preset", "cpu-demo", "--hindsight", "sibling", "--output-dir", "x"]))
    assert "--hindsight" not in mine and "--kl-coef 0.0" in mine
    assert "preset changes" not in describe(train.parse_args(["--preset", "none", "--model", "tiny",
                                                                      "--output-dir", "x"]))


# ----------------------------------------------------------------------------- which flags were given: tyro's parse
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


# ----------------------------------------------------------------------------- empty is not absent; none in any case
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


# ----------------------------------------------------------------------------- flags that conflict or take days
def test_credit_refuses_a_model_beside_a_checkpoint(tmp_path):
    from tools import credit

    run = tiny_run_folder(tmp_path)
    with pytest.raises(UserError, match="--model and --checkpoint"):
        credit.main(["--checkpoint", str(run), "--model", "smollm2", "--out", str(tmp_path / "c")])


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


@pytest.mark.parametrize("spelling", ["none", "None", "NONE"])
def test_none_for_a_run_folder_flag_is_that_flag_left_out(tmp_path, spelling):
    """`none`, in any case, is None for a flag that takes it; for the flags whose None a run resolves as
    it starts, a resume reads it as the flag left out: `--resume none` is no resume (a new run),
    `--output-dir none` the run's own folder, `--gradient-checkpointing none` the run's own setting (not
    null in config.json). Each was a pathlib TypeError or a null once."""
    new = train.parse_args(["--resume", spelling, "--model", "tiny", "--preset", "none", "--output-dir", "x"])
    assert new.resume is None and new.output_dir == "x"
    run = tiny_run_folder(tmp_path)
    assert train.parse_args(["--resume", str(run), "--resume", spelling, "--model", "tiny"]).resume is None
    resumed = train.parse_args(["--resume", str(run), "--iterations", "2", "--output-dir", spelling,
                                "--gradient-checkpointing", spelling])
    assert Path(resumed.output_dir) == run and resumed.gradient_checkpointing is False


@pytest.mark.parametrize("argv, needle", [
    (["--tyro-print-completion", "nosuchshell"], "tyro writes completion scripts for bash, zsh"),
    (["--tyro-write-completion", "bash", "/nonexistent/dir/x"], "cannot write /nonexistent/dir/x"),
    (["--tyro_write_completion", "zsh", "/"], "cannot write /"),
])
def test_tyro_s_own_flags_fail_in_one_line(argv, needle):
    """tyro reads its completion flags itself, before the parse that refuses a bad flag in one line: a
    shell it writes no script for was an AssertionError, a file it cannot write a FileNotFoundError."""
    with pytest.raises(UserError, match=needle):
        train.parse_args(argv)
    with pytest.raises(UserError, match=needle):
        eval_script.main(argv)


def _float_flags():
    """(script, flag, its Interval) for every float flag of every script (tests/test_docs.py's list)."""
    import dataclasses
    import typing

    from infra.cli import Interval
    from test_docs import _entry_points

    out = []
    for script, cls in _entry_points().items():
        hints, plain = typing.get_type_hints(cls, include_extras=True), typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if plain[f.name] is float:
                ranges = [m for m in getattr(hints[f.name], "__metadata__", ()) if isinstance(m, Interval)]
                out.append((script, f.name, ranges[0] if ranges else None))
    return out


def test_every_float_flag_declares_the_values_it_computes_with():
    """Each float flag of each script names its range in its type (float_in), its default inside it, and
    the one check refuses a value outside it (nan, inf, past either end) naming the flag and the range.
    A flag two scripts take has one range: eval.py's and compare's temperature are train.py's (and 0,
    greedy); --lam and --eps-m are the method's own (advantage.check_mixing)."""
    import dataclasses

    from advantage import check_mixing
    from infra.cli import check_domains
    from test_docs import _entry_points

    found = _float_flags()
    assert len(found) >= 30 and [(s, n) for s, n, r in found if r is None] == []
    for script, name, values in found:
        cls = _entry_points()[script]
        assert getattr(cls(), name) in values, (script, name)
        low, high = (float(end) for end in values.text[1:-1].split(","))
        for bad in (float("nan"), float("inf"), -float("inf"), low - 1e-9, high * 2 + 1 if high else 1.0):
            if bad in values:
                continue  # an end that is part of the range, or the `also` value
            problems = check_domains(dataclasses.replace(cls(), **{name: bad}))
            assert problems == [f"--{name.replace('_', '-')} must be {values}; got {bad}"], (script, name, problems)
    train_temperature = dict(((s, n), r) for s, n, r in found)[("train.py", "temperature")]
    for key in (("eval.py", "temperature"), ("tools.compare", "eval_temperature")):
        assert dict(((s, n), r) for s, n, r in found)[key].text == train_temperature.text
    ranges = dict(((s, n), r) for s, n, r in found)
    for lam in (-0.1, 0.0, 0.5, 1.0, 1.1, float("nan")):
        for eps_m in (0.0, 0.2, 0.99, 1.0, float("nan")):
            try:
                check_mixing(lam, eps_m)
                method = True
            except ValueError:
                method = False
            assert method == (lam in ranges[("train.py", "lam")] and eps_m in ranges[("train.py", "eps_m")])


def test_numbers_that_parse_but_do_not_compute_are_refused_at_the_start():
    """--lr 1e300 overflowed AdamW's step, --temperature 1e-300 the logits over T: tracebacks, after the
    model loaded. Now one line before anything loads, with the range that works."""
    with pytest.raises(UserError, match=r"--lr must be in \(0, 1\]; got 1e\+300"):
        train.parse_args(["--lr", "1e300"])
    with pytest.raises(UserError, match=r"--temperature must be in \[0.01, 100\]; got 1e-300"):
        train.parse_args(["--temperature", "1e-300"])
    with pytest.raises(UserError, match=r"--temperature must be 0 or in \[0.01, 100\]; got 1e-300"):
        eval_script.main(["--temperature", "1e-300", "--samples-per-game", "2", "--policy", "model", "--model", "tiny"])


@pytest.mark.parametrize("script, argv", [
    ("eval.py", []), ("tools.credit", []), ("tools.compare", ["--out", "unused", "--", "--model", "tiny"]),
    ("tools.bench", []), ("tools.warmstart", []), ("tools.device_check", []), ("tools.world", []),
])
def test_every_script_checks_its_float_flags_before_any_work(script, argv):
    """Each script's own entry refuses each of its float flags out of range at its start (a check no
    script calls protects nothing): every flag at nan, one line naming each."""
    import importlib

    module = importlib.import_module("eval" if script == "eval.py" else script)
    names = [n for s, n, _ in _float_flags() if s == script]
    bad = [word for n in names for word in (f"--{n.replace('_', '-')}", "nan")]
    own = argv[: argv.index("--")] if "--" in argv else argv
    with pytest.raises(UserError) as err:
        module.main(own + bad + argv[len(own):])
    assert all(f"--{n.replace('_', '-')} must be" in str(err.value) for n in names), str(err.value)
