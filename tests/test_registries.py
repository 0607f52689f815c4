"""A new environment is one file and one line (envs.ENVS); a new algorithm is one class and one line
(baselines.ALGORITHMS). This file holds both extensions: an env and an algorithm written here,
each registered with its one line, train one tiny iteration through train.py's own command line
and are evaluated by eval.py's, with no other file of the project changed."""
import json

import pytest
import torch

import eval as eval_script
import train
from advantage import SHARPO, Credit
from baselines import ALGORITHMS
from envs import ENVS, Env, EnvStep


class CoinEnv(Env):
    """An env written from envs.Env alone: what it requires (its class attributes without a default
    and its abstract methods) and nothing more. Two tasks, an episode of at most two turns, won by a
    response of an even number of characters (a coin flip for a random model); it needs no data."""

    name = "coin"
    splits = ("train", "test")
    default_eval_split = "test"
    default_max_steps = 2
    prompt_tokens = 64

    def tasks(self, split):
        return [f"{split}-heads", f"{split}-tails"]

    def task_type(self, task_id):
        return task_id.split("-")[1]

    def expert_plan(self, task_id):
        return ["flip"]

    def build_messages(self, state, history, history_len):
        return [{"role": "user", "content": f"Task: {state.task}. Now: {state.observation}"}]

    def reset(self, task_ids):
        self.steps = [0] * len(task_ids)
        return [EnvStep("a coin", ["flip"], 0.0, False, False, False, "flip it", self.task_type(t), "flip")
                for t in task_ids]

    def step(self, responses):
        out = []
        for i, text in enumerate(responses):
            if text is None:
                out.append(None)
                continue
            self.steps[i] += 1
            won = len(text) % 2 == 0
            out.append(EnvStep("flipped", ["flip"], 10.0 if won else 0.0, won or self.steps[i] >= self.max_steps,
                               won, False, "flip it", "coin", "flip", action="flip"))
        return out

    def valid(self, state, text):
        return True


class HalvedSHARPO(SHARPO):
    """SHARPO with every token advantage halved: an algorithm that changes one answer (stage 5)."""

    def credit(self, adv, logp, rows, args) -> Credit:
        full = super().credit(adv, logp, rows, args)
        return Credit(full.token_adv / 2, full.gaps, full.mults)


def test_a_new_env_and_a_new_algorithm_train_and_evaluate_from_their_own_file(tmp_path, monkeypatch):
    monkeypatch.setitem(ENVS, "coin", CoinEnv)  # the env's one line
    monkeypatch.setitem(ALGORITHMS, "halved", HalvedSHARPO())  # the algorithm's one line
    torch.set_num_threads(1)
    out = tmp_path / "run"
    train.main(["--env", "coin", "--algo", "halved", "--model", "tiny", "--preset", "none", "--iterations", "1",
                "--groups", "2", "--group-size", "4", "--max-new-tokens", "8", "--lora-r", "4", "--lora-alpha", "8",
                "--hindsight", "expert", "--lr", "1e-2", "--seed", "5", "--eval-every", "1", "--eval-games", "2",
                "--output-dir", str(out)])
    line = json.loads((out / "metrics.jsonl").read_text())
    assert line["iteration"] == 1 and line["episodes"] == 8 and "mult_mean" in line and "eval/success" in line
    assert json.loads((out / "config.json").read_text())["algo"] == "halved"
    record = json.loads((out / "eval_coin_test_iter-000001.json").read_text())
    assert sorted(record["games"]) == ["test-heads", "test-tails"]
    metrics = eval_script.main(["--policy", "model", "--checkpoint", str(out), "--out", str(tmp_path / "e.json")])
    assert metrics["config"]["env"] == "coin" and metrics["episodes"] == 2


def test_a_name_no_registry_holds_is_one_line():
    from infra.cli import UserError

    with pytest.raises(UserError, match="--env 'kitchen' is no environment of this project: choose one of alfworld"):
        train.parse_args(["--env", "kitchen", "--model", "tiny", "--preset", "none"])
    with pytest.raises(UserError, match="--algo 'ppo' is no algorithm of this project: choose one of sharpo"):
        train.parse_args(["--algo", "ppo", "--model", "tiny", "--preset", "none"])



class PartialEnv(Env):
    """An env written to a docstring, not to the class: no step(), no valid(), no prompt_tokens."""

    name, splits, default_eval_split, default_max_steps = "partial", ("train",), "train", 2
    tasks, task_type, expert_plan = CoinEnv.tasks, CoinEnv.task_type, CoinEnv.expert_plan
    reset, build_messages = CoinEnv.reset, CoinEnv.build_messages


def test_an_env_class_that_is_not_a_whole_env_is_refused_at_registration(monkeypatch):
    """Registering a class that lacks a method or a required attribute of envs.Env (or does not subclass
    it) is one line naming what it lacks, at the registration itself; a class registered by its
    "module:Class" name is checked the same way when it is first asked for (--env)."""
    from envs.make import env_class
    from infra.cli import UserError

    lacks = r"env 'partial' \('PartialEnv'\) is not a whole env: it lacks step\(\), valid\(\), prompt_tokens"
    with pytest.raises(UserError, match=lacks):
        ENVS["partial"] = PartialEnv
    assert "partial" not in ENVS
    with pytest.raises(UserError, match="lacks envs.Env as its base class"):
        ENVS["duck"] = type("Duck", (), {"name": "duck"})
    monkeypatch.setitem(ENVS, "partial", f"{__name__}:PartialEnv")  # by name: imported when asked for
    with pytest.raises(UserError, match=lacks):
        train.parse_args(["--env", "partial", "--model", "tiny", "--preset", "none"])
    monkeypatch.setitem(ENVS, "coin", CoinEnv)  # a whole env registers
    assert env_class("coin") is CoinEnv


def test_a_gpu_preset_does_not_ask_a_data_free_env_for_data(monkeypatch):
    """An env that needs no data (real_data None) passes the GPU presets' data check, which an env with
    data (ALFWorld) fails without --data-dir or --demo-data."""
    from flags.parse import check
    from infra.cli import UserError

    monkeypatch.setitem(ENVS, "coin", CoinEnv)
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    for env, needs in (("coin", False), ("alfworld", True)):
        args = train.parse_args(["--env", env, "--model", "tiny", "--preset", "none"])
        args.preset = "gpu"  # as --preset auto resolves on a GPU machine (the model check is the tiny one's)
        if needs:
            with pytest.raises(UserError, match="--preset gpu trains on alfworld's real data, and none is given"):
                check(args)
        else:
            check(args)


def test_an_env_whose_init_skips_the_interface_s_is_one_line(monkeypatch):
    """An env whose own __init__ does not call Env.__init__ (which sets the seconds, counts and crashes
    the loop reads) is one line when it is built, not an AttributeError in the first iteration."""
    from envs.make import make_env
    from infra.cli import UserError

    class Forgetful(CoinEnv):
        def __init__(self, data_dir=None, max_steps=0):
            self.max_steps = max_steps or 2

    monkeypatch.setitem(ENVS, "forgetful", Forgetful)
    with pytest.raises(UserError, match=r"Forgetful.__init__ did not call super\(\).__init__\(data_dir, max_steps\)"):
        make_env("forgetful")
    monkeypatch.setitem(ENVS, "coin", CoinEnv)
    assert make_env("coin", max_steps=1).counts == {"reset": 0, "step": 0}
