"""ALFWorld on the real engine: data loading, the agent interface, batching, the expert."""
import json
from pathlib import Path

import pytest

from envs import extract_action
from envs.alfworld import (
    SHIPPED_DATA,
    TASK_TYPES,
    AlfWorldEnv,
    build_messages,
    find_games,
    parse_action,
    replay,
)
from eval import ExpertPolicy, pick_games, summarize
from infra.cli import DataError
from rollout import play_episodes

REAL_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "alfworld"


@pytest.fixture(scope="module")
def env():
    e = AlfWorldEnv()
    yield e
    e.close()


def _answer(action):
    return f"<think>plan</think><action>{action}</action>"


def test_shipped_games_cover_all_task_types_and_are_small():
    """train has all six task types, valid_unseen at least 2 games, under 1 MB in all."""
    games = find_games(SHIPPED_DATA, "train")
    types = {json.loads((SHIPPED_DATA / "json_2.1.1" / g / "traj_data.json").read_text())["task_type"] for g in games}
    assert types == set(TASK_TYPES)
    assert len(find_games(SHIPPED_DATA, "valid_unseen")) >= 2
    size = sum(p.stat().st_size for p in SHIPPED_DATA.rglob("*") if p.is_file())
    assert size < 1_000_000
    short = [g for g in games + find_games(SHIPPED_DATA, "valid_unseen")
             if len(json.loads((SHIPPED_DATA / "json_2.1.1" / g / "game.tw-pddl").read_text())["walkthrough"]) <= 4]
    assert len(short) >= 3


def test_learning_set_is_what_its_generator_draws_and_its_splits_share_no_room():
    """data/alfworld-learn (64 train, 32 held out) and data/alfworld-learn-warmstart (16) are the
    rooms envs/make_alfworld_games.py draws, every game solvable in 3-4 steps, each room in one
    split only, the two short task families in every split."""
    from envs.make_alfworld_games import LEARN_SPLITS, learn_games, pddl_problem

    data = SHIPPED_DATA.parent
    folders = {"train": (data / "alfworld-learn", "train"), "valid_seen": (data / "alfworld-learn", "valid_seen"),
               "warmstart": (data / "alfworld-learn-warmstart", "train")}
    specs, problems = learn_games(), set()
    for split, n in LEARN_SPLITS.items():
        root, name = folders[split]
        games = find_games(root, name)
        assert len(games) == n
        mine = [g for g in specs if g["split"] == split]
        types = set()
        for game in games:
            gamedata = json.loads((root / "json_2.1.1" / game / "game.tw-pddl").read_text())
            assert gamedata["solvable"] and 3 <= len(gamedata["walkthrough"]) <= 4
            problem = gamedata["pddl_problem"].split("(:objects", 1)[1]
            assert problem not in problems  # no room twice, across the three
            problems.add(problem)
            types.add(json.loads((root / "json_2.1.1" / game / "traj_data.json").read_text())["task_type"])
        assert types == {"pick_and_place_simple", "look_at_obj_in_light"}
        drawn = {pddl_problem(g, "x").split("(:objects", 1)[1] for g in mine}
        assert drawn <= problems  # the folders hold exactly what the generator draws


def test_walkthrough_wins_and_a_wrong_sequence_does_not(env):
    """Replaying a shipped game's stored walkthrough on the engine wins; the same actions
    in a wrong order (put before take) do not."""
    task = next(t for t in env.tasks("train") if "Mug-None-CoffeeMachine" in t)
    plan = env.expert_plan(task)
    assert replay(env.gamefile(task), plan)
    assert not replay(env.gamefile(task), [plan[1], plan[2], plan[0]])


def test_stepping_a_walkthrough_through_the_env_gives_reward_10(env):
    """Through the batched interface: the walkthrough ends the episode with won and R = 10."""
    task = next(t for t in env.tasks("train") if "Mug-None-CoffeeMachine" in t)
    states = env.reset([task])
    for k, action in enumerate(env.expert_plan(task)):
        assert not states[0].done
        states = env.step([_answer(action)])
    assert states[0].won and states[0].done and states[0].reward == 10.0


@pytest.mark.parametrize("text,ok,why", [
    ("<think>x</think><action>go to bed 1</action>", "go to bed 1", ""),
    ("<think>x</think>\n<action>  Go to   Bed 1 \n</action>", "go to bed 1", ""),  # case, spaces
    ("<action>go to bed 1</action>", None, "missing <think>"),
    ("<think>x</think> go to bed 1", None, "missing <action>"),
    ("<think>x</think><action>go to bed 1</action><action>look</action>", None, "2 actions"),
    ("<think>x</think><action>  </action>", None, "empty action"),
    ("<think>x</think><action>去 bed 1</action>", None, "outside ASCII"),
    ("<think>x</think><action>fly to the moon</action>", None, "not an admissible action"),
    ("", None, "missing <think>"),
])
def test_parse_action(text, ok, why):
    """Every invalid case is named; valid actions map to their admissible spelling."""
    action, reason = parse_action(text, ["go to bed 1", "look"])
    assert action == ok
    assert why in reason


def test_invalid_action_costs_a_step_and_0_1(env):
    """An invalid answer: the state stays, the step counts, the observation says why, -0.1."""
    task = env.tasks("train")[0]
    start = env.reset([task])[0]
    res = env.step(["no tags at all"])[0]
    assert res.invalid and res.reward == pytest.approx(-0.1) and not res.done
    assert res.admissible == start.admissible and "missing <think>" in res.observation


def test_episode_ends_at_max_steps():
    """With max_steps 2, two looks end the episode without a win."""
    env = AlfWorldEnv(max_steps=2)
    env.reset([env.tasks("train")[0]])
    assert not env.step([_answer("look")])[0].done
    last = env.step([_answer("look")])[0]
    assert last.done and not last.won
    with pytest.raises(ValueError, match="already done"):
        env.step([_answer("look")])
    env.close()


def test_prompt_for_a_known_state():
    """The prompt holds the task, the last `history_len` pairs with their step numbers, the
    current observation, the admissible actions and the answer format."""
    history = [("obs one", "look"), ("obs two", "go to bed 1"), ("obs three", "take book 1 from bed 1")]
    msgs = build_messages("put a book in shelf", history, "You arrive at shelf 1.", ["go to bed 1", "look"], 2)
    assert len(msgs) == 1 and msgs[0]["role"] == "user"
    text = msgs[0]["content"]
    assert "Your task is to: put a book in shelf" in text
    assert "obs one" not in text and "[Step 2] Observation: obs two" in text
    assert "[Step 3] Action: take book 1 from bed 1" in text
    assert "[Step 4] Current observation: You arrive at shelf 1." in text
    assert "Admissible actions: go to bed 1, look" in text
    assert "<think>" in text and "<action>" in text
    assert "obs one" in build_messages("t", history, "o", ["look"], None)[0]["content"]  # 'all'
    assert "Observation" not in build_messages("t", history, "o", ["look"], 0)[0]["content"]


def test_episodes_in_one_batch_stay_independent(env):
    """Three copies of one game: acting in one episode leaves the others untouched."""
    task = next(t for t in env.tasks("train") if "Mug-None-CoffeeMachine" in t)
    plan = env.expert_plan(task)
    s = env.reset([task, task, task])
    s = env.step([_answer(plan[0]), "garbage", _answer("look")])
    assert s[0].action == plan[0] and s[1].invalid and s[2].action == "look"
    assert "mug" not in s[2].observation.lower() or s[2].observation != s[0].observation
    for a in plan[1:]:
        s = env.step([_answer(a) if not s[0].done else None, _answer("look"), _answer("look")])
    assert s[0].won and not s[1].won and not s[2].won


def test_expert_wins_shipped_games(env):
    """The handcoded expert (eval.py --policy expert) wins at least 90% of the shipped games."""
    tasks = env.tasks("train") + env.tasks("valid_unseen")
    trajs = play_episodes(env, tasks, ExpertPolicy(), history_len=2)
    assert summarize(trajs)["success"] >= 0.9


def test_missing_data_dir_is_a_clear_error(tmp_path):
    """A folder without json_2.1.1, or a split without games, says what to do."""
    with pytest.raises(DataError, match="--data-dir"):
        AlfWorldEnv(data_dir=tmp_path)
    (tmp_path / "json_2.1.1" / "train").mkdir(parents=True)
    with pytest.raises(DataError, match="no solvable ALFWorld games"):
        AlfWorldEnv(data_dir=tmp_path).tasks("train")
    with pytest.raises(ValueError, match="unknown ALFWorld split"):
        AlfWorldEnv().tasks("test")


def test_round_robin_game_choice(env):
    """pick_games takes one game of each task type before a second of any."""
    picked = pick_games(env, "train", 6)
    assert {env.task_type(t) for t in picked} == set(TASK_TYPES)


def test_extract_action_ignores_text_around_tags():
    """Text before, between and after the tags does not matter."""
    assert extract_action("Sure! <think>a</think> then <action>look</action> done") == ("look", "")


@pytest.mark.slow
@pytest.mark.skipif(not (REAL_DATA / "json_2.1.1" / "valid_seen").is_dir(), reason="real ALFWorld games not present")
def test_expert_on_real_valid_seen_games():
    """On ALFWorld's own games (first two of each task type in sorted path order, 50 steps)
    the expert wins at least 70% (the package's expert alone wins ~93% of unseen games)."""
    env = AlfWorldEnv(data_dir=REAL_DATA, max_steps=50)
    tasks = []
    for tt in TASK_TYPES:
        tasks += [t for t in env.tasks("valid_seen") if env.task_type(t) == tt][:2]
    trajs = play_episodes(env, tasks, ExpertPolicy(), history_len=2)
    env.close()
    assert len(tasks) == 12
    assert summarize(trajs)["success"] >= 0.7
