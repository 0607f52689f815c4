"""Env data is checked when it loads, before any model: a malformed or corrupt file is one error
naming the file, the entry and the field; data that would silently change the task is refused,
or made usable (WebShop option values) with the task unchanged."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_runs import one_line as _one_line
from cli_runs import run_cli as _cli
from envs.alfworld import AlfWorldEnv
from envs.webshop import SHIPPED_DATA as WEBSHOP_DATA
from envs.webshop import WebShopEnv
from infra.cli import DataError, UserError

ROOT = Path(__file__).resolve().parent.parent

ALFWORLD_DATA = ROOT / "data" / "alfworld"


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
    (lambda g: (g / "traj_data.json").write_text("[" * 100_000 + "]" * 100_000), "nested too deeply"),
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


def test_webshop_json_nested_too_deeply_is_one_error(tmp_path):
    root = _copy_webshop(tmp_path)
    path = sorted(root.glob("items_shuffle*.json"))[0]
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(DataError, match="nested too deeply") as err:
        WebShopEnv(data_dir=root)
    assert path.name in str(err.value)


@pytest.mark.parametrize("file, fn, needle", [
    ("items_human_ins", lambda d: next(iter(d.values()))[0].update(instruction_attributes="red"), "instruction_attributes"),
    ("items_shuffle", lambda d: d[0].update(asin=d[0]["asin"].lower()), "upper-case"),
    ("items_shuffle", lambda d: d[0].update(product_category=None), "'product_category' should be str"),
    ("items_shuffle", lambda d: d[0].update(small_description=[1, 2]), "small_description"),
    ("items_shuffle", lambda d: d[0].update(customization_options={"color": "red"}), "option 'color'"),
    ("items_ins_v2", lambda d: d.update({next(iter(d)): {"attributes": "soft"}}), "'attributes' should be a list"),
    ("items_shuffle", lambda d: d[0].update(pricing="$" + "9" * 400), "'pricing'"),
    ("items_shuffle", lambda d: d[0].update(pricing="$abc"), "each '\\$' must be followed by a number"),
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


@pytest.mark.slow
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
    code = ("import sys; from infra import checkpoint; from infra.cli import run; import train\n"
            "checkpoint.load_policy = lambda *a, **k: sys.exit('the model was loaded')\n"
            f"run(lambda: train.main(['--model', 'tiny', '--preset', 'none', '--data-dir', {str(root)!r}, "
            f"'--output-dir', {str(tmp_path / 'run')!r}]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("error: ") and "game.tw-pddl is missing" in out.stderr
    assert "Traceback" not in out.stderr


# ----------------------------------------------------------------------------- unreadable files, empty splits
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


def test_an_empty_split_is_one_line_not_a_draw_that_never_ends():
    """A split with no task (a WebShop folder whose one goal went to the other split) is a one-line
    error where the tasks are read, for training and for an evaluation: at b60459e training drew from
    nothing forever (holding the run's lock), and eval.py reported 0 episodes as success 0.0."""
    from types import SimpleNamespace

    from envs.make import training_tasks
    from eval import pick_games

    empty = SimpleNamespace(name="webshop", tasks=lambda split: [], task_type=lambda t: "x", data_variable="WEBSHOP_DATA")
    with pytest.raises(UserError, match="the train split of webshop's data holds no task"):
        training_tasks(empty, "train")
    with pytest.raises(UserError, match="the test split of webshop's data holds no game"):
        pick_games(empty, "test", 3)
