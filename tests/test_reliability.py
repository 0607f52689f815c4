"""Runs that survive: nothing a run folder holds runs code when loaded, no kill loses a
checkpoint, data is checked at load, answers are parsed exactly as documented, user errors are
one line (issue: runs that survive)."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from infra import checkpoint
import eval as eval_script
import train
from infra.cli import DataError, UserError
from envs import extract_action
from envs.alfworld import AlfWorldEnv
from envs.webshop import SHIPPED_DATA as WEBSHOP_DATA
from envs.webshop import WebShopEnv, parse_action
from tools.plots import segments_html
from stub_env import StubEnv

ROOT = Path(__file__).resolve().parent.parent
ALFWORLD_DATA = ROOT / "data" / "alfworld"
TIMING = ("seconds/", "tokens_per_s", "peak_memory")


def _args(out, **kw):
    base = dict(model="tiny", preset="none", iterations=3, groups=2, group_size=4, max_steps=2, max_new_tokens=8,
                lr=1e-2, lora_r=4, lora_alpha=8, eval_every=0, hindsight="expert", seed=5, output_dir=str(out))
    base.update(kw)
    return train.parse_args([f"--{k.replace('_', '-')}={v}" for k, v in base.items()])


def _run(args):
    trainer = train.Trainer(args, env=StubEnv(args.max_steps))
    return train.train(args, trainer), trainer


def _lora(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def _strip(m):
    return {k: v for k, v in m.items() if not k.startswith(TIMING)}


# ----------------------------------------------------------------------------- 1. safe loading
class _Payload:
    """Unpickling this would create a file: the proof that code ran."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_a_crafted_run_folder_runs_no_code_on_resume(tmp_path):
    """optimizer.pt holding a pickled call (what a crafted folder could ship) is refused with a
    clear error and the call never runs; rng.json is plain JSON, a bad one is an error."""
    _run(_args(tmp_path / "run", iterations=1))
    ckpt = checkpoint.find_checkpoint(tmp_path / "run")
    marker = tmp_path / "pwned"
    torch.save({"state": {}, "param_groups": [], "x": _Payload(marker)}, ckpt / "optimizer.pt")
    with pytest.raises(UserError, match="tensors only"):
        train.Trainer(train.parse_args(["--resume", str(tmp_path / "run"), "--iterations", "2"]), env=StubEnv(2))
    assert not marker.exists()
    assert not (ckpt / "rng.pt").exists()  # RNG state is JSON, not a pickle
    json.loads((ckpt / "rng.json").read_text())


# ----------------------------------------------------------------------------- 2. kills
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
    history, trainer = _run(_args(out))
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
        _run(_args(out))
    monkeypatch.undo()
    done = checkpoint.read_iteration(checkpoint.find_checkpoint(out))
    assert done >= 1  # never more than the iteration in progress is lost
    with pytest.raises(UserError, match="--resume"):  # a restart without --resume deletes nothing
        train.train(_args(out), None)
    resumed = train.parse_args(["--resume", str(out)])
    rest, trainer = _run(resumed)
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
    _run(_args(out, iterations=1))
    for name in ("metrics.jsonl", "samples.jsonl"):
        with (out / name).open("a") as f:
            f.write('{"iteration": 2, "succ')
    rest, _ = _run(train.parse_args(["--resume", str(out), "--iterations", "2"]))
    assert [m["iteration"] for m in rest] == [2]
    for name in ("metrics.jsonl", "samples.jsonl"):
        lines = (out / name).read_text().splitlines()
        assert all(json.loads(line)["iteration"] in (1, 2) for line in lines)


def test_resume_takes_the_newest_complete_checkpoint_and_keeps_n(tmp_path):
    """A half-written checkpoint folder (no state.json) is never resumed from; --keep-checkpoints
    keeps the newest N; an earlier kept checkpoint can be evaluated by its folder."""
    out = tmp_path / "run"
    _run(_args(out, iterations=3, keep_checkpoints=3))
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
    _run(_args(out, iterations=1, init_adapter=str(tmp_path / "warm")))
    _run(train.parse_args(["--resume", str(out), "--iterations", "4"]))
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["iter-000003", "iter-000004"]
    assert (out / "latest" / "warmstart" / "adapter_model.safetensors").exists()


def test_resuming_an_older_checkpoint_is_refused_while_newer_ones_exist(tmp_path):
    out = tmp_path / "run"
    _run(_args(out, iterations=2))
    with pytest.raises(UserError, match="iter-000002"):
        train.parse_args(["--resume", str(out / "checkpoints" / "iter-000001")])


# ----------------------------------------------------------------------------- 3. data checked at load
def _copy_alfworld(tmp_path) -> Path:
    shutil.copytree(ALFWORLD_DATA, tmp_path / "alf")
    return tmp_path / "alf"


def _first_game(root: Path) -> Path:
    return sorted((root / "json_2.1.1" / "train").glob("*/*"))[0]


@pytest.mark.parametrize("corrupt, needle", [
    (lambda g: (g / "game.tw-pddl").unlink(), "game.tw-pddl is missing"),
    (lambda g: (g / "traj_data.json").write_text("{not json"), "not valid JSON"),
    (lambda g: _edit(g / "game.tw-pddl", walkthrough="go to desk 1"), "'walkthrough' should be a list"),
    (lambda g: _edit(g / "traj_data.json", task_type="juggle"), "task_type 'juggle'"),
    (lambda g: _edit(g / "traj_data.json", pddl_params={"object_target": "Mug"}), "pddl_params: field 'parent_target' is missing"),
    (lambda g: _edit(g / "game.tw-pddl", solvable="yes"), "field 'solvable' should be bool"),
    (lambda g: _edit(g / "game.tw-pddl", pddl_problem="garbage ((("), "'pddl_problem' is not a PDDL problem"),
    (lambda g: _edit(g / "game.tw-pddl", pddl_problem="(define (problem p) (:goal (and)"), "balance its parentheses"),
    (lambda g: _edit(g / "game.tw-pddl", grammar="}{ garbage"), "'grammar' is not a grammar"),
    (lambda g: _edit(g / "game.tw-pddl", walkthrough=["dance"]), "'dance' is no ALFWorld command"),
])
def test_corrupt_alfworld_games_are_one_error_naming_file_and_field(tmp_path, corrupt, needle):
    root = _copy_alfworld(tmp_path)
    game = _first_game(root)
    corrupt(game)
    with pytest.raises(DataError, match=needle) as err:
        AlfWorldEnv(data_dir=root).tasks("train")
    assert str(game) in str(err.value)


def _edit(path: Path, **fields):
    record = json.loads(path.read_text())
    record.update(fields)
    path.write_text(json.dumps(record))


def _copy_webshop(tmp_path) -> Path:
    shutil.copytree(WEBSHOP_DATA, tmp_path / "ws")
    return tmp_path / "ws"


def _edit_first(path: Path, fn):
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("file, fn, needle", [
    ("items_human_ins", lambda d: next(iter(d.values()))[0].update(instruction_attributes="red"), "instruction_attributes"),
    ("items_shuffle", lambda d: d[0].update(asin=d[0]["asin"].lower()), "upper-case"),
    ("items_shuffle", lambda d: d[0].update(product_category=None), "'product_category' should be str"),
    ("items_shuffle", lambda d: d[0].update(small_description=[1, 2]), "small_description"),
    ("items_shuffle", lambda d: d[0].update(customization_options={"color": "red"}), "option 'color'"),
    ("items_ins_v2", lambda d: d.update({next(iter(d)): {"attributes": "soft"}}), "'attributes' should be a list"),
    ("items_shuffle", lambda d: d[0].update(pricing="$" + "9" * 400), "'pricing'"),
    ("items_shuffle", lambda d: d[0].update(customization_options={"size": [{"value": "Description"}]}), "page button"),
    ("items_shuffle", lambda d: d[0].update(customization_options={"size": [{"value": "\u2122"[:0] + "\u00a0"}]}), "empty"),
])
def test_corrupt_webshop_files_are_one_error_naming_file_entry_and_field(tmp_path, file, fn, needle):
    root = _copy_webshop(tmp_path)
    path = sorted(root.glob(f"{file}*.json"))[0]
    _edit_first(path, fn)
    with pytest.raises(DataError, match=needle) as err:
        WebShopEnv(data_dir=root)
    assert path.name in str(err.value)


def test_webshop_option_values_are_made_clickable_and_the_task_is_unchanged(tmp_path):
    """Option values with non-ASCII letters or brackets (real WebShop data has them) become ASCII
    without brackets, on the page and in the goals alike: the expert still buys every goal at
    score 1.0, and every option it clicks is an admissible action."""
    root = _copy_webshop(tmp_path)
    products = json.loads(sorted(root.glob("items_shuffle*.json"))[0].read_text())
    human = json.loads((root / "items_human_ins.json").read_text())
    changed = 0
    for p in products:
        for values in (p.get("customization_options") or {}).values():
            for v in values or []:
                new = "Caf\u00e9 [" + v["value"] + "]\u2122"
                for ins in human.get(p["asin"], []):
                    ins["instruction_options"] = [new if o.lower() == v["value"].lower() else o
                                                  for o in ins.get("instruction_options") or []]
                v["value"], changed = new, changed + 1
    assert changed > 10
    sorted(root.glob("items_shuffle*.json"))[0].write_text(json.dumps(products))
    (root / "items_human_ins.json").write_text(json.dumps(human))
    env = WebShopEnv(data_dir=root)
    assert all(all(v.isascii() and "[" not in v for v in vals) for p in env.products for vals in p["options"].values())
    from eval import ExpertPolicy, evaluate

    for split in ("train", "test"):
        metrics, _ = evaluate(env, ExpertPolicy(), env.tasks(split), 2, batch_size=64)
        assert metrics["success"] == 1.0 and metrics["invalid_rate"] == 0.0


def test_a_game_the_engine_cannot_load_is_one_error_naming_it(tmp_path):
    """A game whose files pass the checks but that the engine cannot play (an undefined object in
    its PDDL) stops train and eval with one line naming the game file, in-process and in a worker."""
    root = _copy_alfworld(tmp_path)
    game = _first_game(root)
    record = json.loads((game / "game.tw-pddl").read_text())
    _edit(game / "game.tw-pddl", pddl_problem=record["pddl_problem"].replace("(:init", "(:init (inReceptacle ghost1 ghost2)"))
    for workers in (1, 2):
        proc = subprocess.run([sys.executable, "eval.py", "--policy", "random", "--data-dir", str(root), "--split", "train",
                               "--env-workers", str(workers), "--max-steps", "2"], cwd=ROOT, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr and str(game) in proc.stderr.strip().splitlines()[-1], proc.stderr[-3000:]


def test_train_stops_on_bad_data_before_loading_a_model(tmp_path):
    """A corrupt data folder ends train.py in one line, exit 2, before the model loads."""
    root = _copy_alfworld(tmp_path)
    (_first_game(root) / "game.tw-pddl").unlink()
    code = ("import sys, rollout; from infra.cli import run; import train\n"
            "rollout.load_policy = lambda *a, **k: sys.exit('the model was loaded')\n"
            f"run(lambda: train.main(['--model', 'tiny', '--preset', 'none', '--data-dir', {str(root)!r}, "
            f"'--output-dir', {str(tmp_path / 'run')!r}]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("error: ") and "game.tw-pddl is missing" in out.stderr
    assert "Traceback" not in out.stderr


# ----------------------------------------------------------------------------- 4. parsing
def test_any_non_ascii_character_in_an_action_is_invalid():
    for space in ("\u00a0", "\u2003", "\u3000", "\u200b", "\u2028"):
        assert extract_action(f"<think>x</think><action>go to{space}desk 1</action>")[0] is None
    assert extract_action("<think>x</think><action>go to\n desk 1\t</action>")[0] == "go to desk 1"


def test_webshop_actions_are_the_whole_answer():
    clicks = ["< prev", "buy now"]
    assert parse_action("<think>x</think><action>click[< prev]</action>", clicks)[0] == "click[< prev]"
    for tail in ("; rm -rf /", " now", "]"):
        assert parse_action(f"<think>x</think><action>click[< prev]{tail}</action>", clicks)[0] is None


def test_tags_fold_case_over_ascii_only():
    """<THINK> and <Action> are tags; a Unicode letter that lowercases to an ASCII one (the
    Kelvin sign U+212A -> "k", the long s U+017F -> "s"...) does not make a tag."""
    assert extract_action("<THINK>x</Think><ACTION>look</action>")[0] == "look"
    for odd in ("<thin\u212a>x</think><action>look</action>", "<think>x</thin\u212a><action>look</action>",
                "<think>x</think><\u212bction>look</action>"):
        assert extract_action(odd)[0] is None


def test_webshop_action_parse_is_linear_and_matches_upstreams_regex():
    """The split of name[arg] is upstream's `(.+)\\[(.+)\\]` fullmatch on every short string over
    a small alphabet, and 64 kB of '[' parse in milliseconds (the regex took ~30 s)."""
    import random
    import re

    from envs.webshop import parse_web_action

    upstream = re.compile(r"(.+)\[(.+)\]")
    rng = random.Random(0)
    for _ in range(20_000):
        a = "".join(rng.choice("ab[] \n") for _ in range(rng.randint(0, 8)))
        m = upstream.fullmatch(a)
        assert parse_web_action(a) == ((a, None) if m is None else (m.group(1), m.group(2).lower())), a
    start = time.perf_counter()
    assert parse_web_action("[" * 65_536) == ("[" * 65_536, None)
    assert parse_web_action("click" + "[" * 65_537 + "x]") == ("click" + "[" * 65_536, "x")
    assert time.perf_counter() - start < 0.5


def test_tag_parsing_is_linear_on_tag_spam():
    """500 kB of unclosed tags parse in well under a second (regex pairing took ~minutes)."""
    spam = "<action>" * 40_000 + "<think>" * 20_000 + "</think" * 10_000
    assert len(spam) >= 500_000
    start = time.perf_counter()
    assert extract_action(spam)[0] is None
    assert time.perf_counter() - start < 1.0


# ----------------------------------------------------------------------------- 5. errors for people
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
    _run(_args(tmp_path / "run", iterations=1))
    ckpt = checkpoint.find_checkpoint(tmp_path / "run")
    (ckpt / "config.json").unlink()
    (tmp_path / "run" / "config.json").unlink()
    with pytest.raises(UserError, match="no complete checkpoint|config.json"):
        eval_script.main(["--policy", "model", "--checkpoint", str(ckpt)])


def test_group_size_one_warns(capsys):
    train.parse_args(["--group-size", "1", "--model", "tiny"])
    assert "advantage 0" in capsys.readouterr().err


# ----------------------------------------------------------------------------- 6. NaN hygiene
def test_samples_stay_valid_json_and_nan_weights_are_refused(tmp_path):
    """A non-finite number is written as null (strict JSON parses every line); an adapter or an
    optimizer state holding NaN is refused at load with a clear message."""
    path = tmp_path / "log.jsonl"
    checkpoint.append_jsonl(path, [{"iteration": 1, "gap": float("nan"), "xs": [1.0, float("inf")]}])
    record = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"bare {c} in JSON"))
    assert record["gap"] is None and record["xs"] == [1.0, None]

    _run(_args(tmp_path / "run", iterations=1))
    ckpt = checkpoint.find_checkpoint(tmp_path / "run")
    from safetensors.torch import load_file, save_file

    weights = load_file(ckpt / "adapter_model.safetensors")
    name = next(iter(weights))
    weights[name][0, 0] = float("nan")
    save_file(weights, ckpt / "adapter_model.safetensors")
    with pytest.raises(UserError, match="non-finite"):
        checkpoint.load_checkpoint_policy(ckpt)
    state = torch.load(ckpt / "optimizer.pt", weights_only=True)
    next(iter(state["state"].values()))["exp_avg"].fill_(float("nan"))
    torch.save(state, ckpt / "optimizer.pt")
    with pytest.raises(UserError, match="non-finite"):
        checkpoint.load_optimizer_state(ckpt)


def test_plots_escape_task_types():
    sample = {"iteration": 1, "task_id": "t", "task_type": "<script>x</script>", "won": False, "reward": 0.0,
              "advantage": 0.0, "hindsight": None, "segments": []}
    html = segments_html([sample], 0.2)
    assert "<script>x" not in html and "&lt;script&gt;" in html
