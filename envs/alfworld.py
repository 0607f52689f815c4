"""ALFWorld on its real engine: the `alfworld` package's TextWorld games, batched for rollouts.

Reward (METHOD.md section 1): R_i = 10 * won - 0.1 * n_invalid_actions, paid per step.
An episode ends when it is won or after `max_steps` steps (default 50, as verl-agent).

Data: the `json_2.1.1/<split>/<task>/<trial>/{traj_data.json, game.tw-pddl}` layout that
`alfworld-download` produces, from `data_dir`, else $ALFWORLD_DATA, else the small games shipped
in data/alfworld (written by envs/make_alfworld_games.py). Unsolvable games are skipped.

Deviations from upstream ALFWorld / verl-agent:
  - An invalid answer (bad tags, or an action not among the admissible ones) is not sent to
    the engine: the state stays, the step counts, the observation says what was wrong, and
    0.1 is subtracted.
  - The prompt is written for this project in the verl-agent convention (task, the last
    `history_len` observation/action pairs, the current observation, the admissible actions,
    the <think>/<action> answer format); its wording is ours.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path

from envs import INVALID_PENALTY, WIN_REWARD, Env, EnvStep, check_responses, extract_action, step_prompt
from errors import DataError, UserError

SHIPPED_DATA = Path(__file__).resolve().parent.parent / "data" / "alfworld"
SPLITS = ("train", "valid_seen", "valid_unseen", "valid_train")
TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
_WELCOME = re.compile(r"^-= Welcome to TextWorld, ALFRED! =-\s*")
_TASK = re.compile(r"Your task is to: (.*)")


# ----------------------------------------------------------------------------- data
def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The folder that holds json_2.1.1: data_dir, else $ALFWORLD_DATA, else the shipped games."""
    chosen = data_dir or os.environ.get("ALFWORLD_DATA") or SHIPPED_DATA
    root = Path(chosen).expanduser()
    if root.name == "json_2.1.1":
        root = root.parent
    if not (root / "json_2.1.1").is_dir():
        raise DataError(
            f"ALFWorld data not found: {root / 'json_2.1.1'} does not exist. Point --data-dir (or "
            f"$ALFWORLD_DATA) at the folder that contains json_2.1.1 (what `alfworld-download` "
            f"writes), or leave both unset to use the games shipped in {SHIPPED_DATA}."
        )
    return root


# The fields the engine, the handcoded expert and this env read, with their types.
TRAJ_FIELDS = {"task_type": str, "pddl_params": dict}
PDDL_PARAMS = {"object_target": str, "parent_target": str, "toggle_target": str, "mrecep_target": str, "object_sliced": bool}
GAME_FIELDS = {"pddl_domain": str, "grammar": str, "pddl_problem": str, "solvable": bool}


def _load_json_object(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: not valid JSON ({err})") from None
    except RecursionError:
        raise DataError(f"{path}: JSON nested too deeply to be env data") from None
    except OSError as err:  # there but unreadable: permission denied, an I/O error
        raise DataError(f"cannot read {path} ({err.strerror or err}): make the data readable (chmod -R a+rX "
                        "the data folder)") from None
    if not isinstance(value, dict):
        raise DataError(f"{path}: expected a JSON object, found {type(value).__name__}")
    return value


def _check_fields(record: dict, expected: dict, where: str) -> None:
    for key, kind in expected.items():
        if key not in record:
            raise DataError(f"{where}: field {key!r} is missing")
        if not isinstance(record[key], kind):
            raise DataError(f"{where}: field {key!r} should be {kind.__name__}, found {type(record[key]).__name__}")


def check_game(folder: Path) -> bool:
    """Check one game folder's files and the type of every field used; returns `solvable`.
    Raises DataError naming the file and the field."""
    traj_path, game_path = folder / "traj_data.json", folder / "game.tw-pddl"
    for path in (traj_path, game_path):
        if not path.is_file():
            raise DataError(f"{folder}: {path.name} is missing (a game folder holds traj_data.json and game.tw-pddl)")
    traj = _load_json_object(traj_path)
    _check_fields(traj, TRAJ_FIELDS, str(traj_path))
    if traj["task_type"] not in TASK_TYPES:
        raise DataError(f"{traj_path}: task_type {traj['task_type']!r} is not one of {', '.join(TASK_TYPES)}")
    _check_fields(traj["pddl_params"], PDDL_PARAMS, f"{traj_path}: pddl_params")
    game = _load_json_object(game_path)
    _check_fields(game, GAME_FIELDS, str(game_path))
    for key, head in (("pddl_domain", "(define (domain"), ("pddl_problem", "(define (problem"), ("grammar", "grammar ::")):
        text = re.sub(r";[^\n]*", "", game[key]).lstrip() if key != "grammar" else game[key].lstrip()  # PDDL comments
        if not text.lower().startswith(head) or (key != "grammar" and not balanced(text)):
            raise DataError(f"{game_path}: field {key!r} is not a{' PDDL' if key != 'grammar' else ''} "
                            f"{key.split('_')[-1]} (it should start with {head!r}{' and balance its parentheses' if key != 'grammar' else ''})")
    walkthrough = game.get("walkthrough")
    if walkthrough is not None and not (isinstance(walkthrough, list) and all(isinstance(a, str) for a in walkthrough)):
        raise DataError(f"{game_path}: field 'walkthrough' should be a list of action strings")
    for action in walkthrough or []:
        if not action.isascii() or not action.isprintable():
            raise DataError(f"{game_path}: walkthrough action {action[:40]!r} has characters no action can hold")
        if action.split(" ", 1)[0] not in VERBS:
            raise DataError(f"{game_path}: walkthrough action {action[:40]!r} is no ALFWorld command "
                            f"(commands start with one of {', '.join(VERBS)})")
    return game["solvable"]


VERBS = ("go", "take", "move", "put", "open", "close", "toggle", "use", "heat", "cool", "clean", "slice", "examine",
         "look", "inventory", "help")  # the first word of every command the 2.1.2 grammar admits


def balanced(text: str) -> bool:
    """Parentheses close in order and all close (a cheap check that a PDDL text is not garbage)."""
    depth = 0
    for c in text:
        depth += (c == "(") - (c == ")")
        if depth < 0:
            return False
    return depth == 0


def find_games(root: Path, split: str) -> list[str]:
    """Task ids (game folders relative to json_2.1.1) of one split, sorted, every folder checked
    (check_game); unsolvable games are skipped, as ALFWorld does."""
    if split not in SPLITS:
        raise DataError(f"unknown ALFWorld split {split!r}: choose one of {', '.join(SPLITS)}")
    base = root / "json_2.1.1"
    games = []
    for folder in sorted(p for p in (base / split).glob("*/*") if p.is_dir()):
        if check_game(folder):
            games.append(str(folder.relative_to(base)))
    if not games:
        have = sorted(p.name for p in base.iterdir() if p.is_dir())
        raise DataError(
            f"no solvable ALFWorld games in {base / split} (splits here: {', '.join(have) or 'none'}). "
            f"Choose another --split, or point --data-dir at a full `alfworld-download` folder."
        )
    return games


# ----------------------------------------------------------------------------- engine
ENGINE_PACKAGES = ("textworld", "alfworld", "tatsu")  # what playing a game imports (fast-downward for the planner)


def check_engine() -> None:
    """ALFWorld's engine is installed, or one line that says so (before any game is read or model loaded)."""
    import importlib.util

    missing = [name for name in ENGINE_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(f"ALFWorld's engine is not installed here (no {', '.join(missing)} package): run bash "
                        "install.sh, or pip install --no-deps alfworld==0.4.2 textworld==1.7.0 as install.sh does")


def _engine(gamefile: str, max_episode_steps: int, expert: str = "handcoded"):
    """One real ALFWorld TextWorld env for one game, with an expert attached: "handcoded" (the
    package's scripted expert, its next action) or "planner" (the PDDL planner, fast-downward:
    a shortest plan from the current state, recomputed after every step)."""
    os.environ.setdefault("ALFWORLD_DATA", str(SHIPPED_DATA))  # else importing alfworld makes ~/.cache/alfworld
    # deferred: the ALFWorld engine only for ALFWorld (it also writes ~/.cache unless ALFWORLD_DATA is set)
    import textworld

    # deferred: the ALFWorld engine only for ALFWorld (it also writes ~/.cache unless ALFWORLD_DATA is set)
    import textworld.gym
    from alfworld.agents.environment.alfred_tw_env import (
        AlfredDemangler,
        AlfredExpert,
        AlfredExpertType,
        AlfredInfos,
    )

    infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile", "expert_plan"])
    env_id = textworld.gym.register_games(
        [gamefile], infos, batch_size=1, asynchronous=False, max_episode_steps=max_episode_steps,
        wrappers=[AlfredDemangler(shuffle=False), AlfredInfos,
                  AlfredExpert(expert_type=AlfredExpertType.PLANNER if expert == "planner" else AlfredExpertType.HANDCODED)],
    )
    return textworld.gym.make(env_id)


def _unbatch(obs, info) -> tuple[str, list[str], bool, str | None]:
    """(observation, admissible actions, won, expert's next action) from a batch of one."""
    text = _WELCOME.sub("", obs[0]).strip()
    admissible = list(info["admissible_commands"][0])
    plan = info["extra.expert_plan"][0]
    return text, admissible, bool(info["won"][0]), (plan[0] if plan else None)


def expert_walkthrough(gamefile: str, max_steps: int = 50) -> tuple[list[str], bool]:
    """Play the package's handcoded expert from the start state: (its actions, whether it won)."""
    env = _engine(gamefile, max_steps + 1)
    obs, info = env.reset()
    _, _, won, action = _unbatch(obs, info)
    plan = []
    while not won and action is not None and len(plan) < max_steps:
        plan.append(action)
        obs, _, _, info = env.step([action])
        _, _, won, action = _unbatch(obs, info)
    env.close()
    return plan, won


def planner_plans(gamefile: str, actions: list[str]) -> list[list[str] | None]:
    """The planner's shortest plan from the start state and after each action in turn:
    len(actions) + 1 plans. [] once the game is won; None where the planner found no plan
    (or an action was not admissible there)."""
    env = _engine(gamefile, len(actions) + 2, expert="planner")
    obs, info = env.reset()
    plans = []
    for k in range(len(actions) + 1):
        won, plan = bool(info["won"][0]), info["extra.expert_plan"][0]
        plans.append([] if won else (list(plan) or None))
        if k == len(actions):
            break
        if actions[k] not in info["admissible_commands"][0]:
            plans += [None] * (len(actions) - k)
            break
        obs, _, _, info = env.step([actions[k]])
    env.close()
    return plans


def replay(gamefile: str, actions: list[str]) -> bool:
    """Play a fixed action sequence on the engine from the start state: does it win?"""
    env = _engine(gamefile, len(actions) + 1)
    obs, info = env.reset()
    won = _unbatch(obs, info)[2]
    for action in actions:
        if won:
            break
        obs, _, _, info = env.step([action])
        won = _unbatch(obs, info)[2]
    env.close()
    return won


# ----------------------------------------------------------------------------- agent interface
def parse_action(text: str, admissible: list[str]) -> tuple[str | None, str]:
    """Model text -> (admissible action, "") or (None, why it is invalid). Never raises."""
    action, why = extract_action(text)
    if action is None:
        return None, why
    by_lower = {a.lower(): a for a in admissible}
    if action.lower() not in by_lower:
        return None, f"'{action}' is not an admissible action"
    return by_lower[action.lower()], ""


def build_messages(
    task: str, history: list[tuple[str, str]], observation: str, admissible: list[str], history_len: int | None
) -> list[dict]:
    """The policy's chat context for one ALFWorld step (envs.step_prompt): history is the
    (observation, action) pairs of earlier steps, oldest first; history_len keeps the last
    that many (None = all)."""
    intro = f"You are a household agent in a text world. Your task is to: {task}"
    return step_prompt(intro, history, observation, "Admissible actions", admissible, "go to countertop 1", history_len)


# ----------------------------------------------------------------------------- batched env
class AlfWorldEnv(Env):
    """A batch of independent ALFWorld episodes on the real engine (envs.Env is the interface)."""

    name = "alfworld"
    splits = SPLITS
    default_eval_split = "valid_unseen"
    default_max_steps = 50  # verl-agent's
    prompt_tokens = 780  # the longest prompt at --history 2, for the memory plan (docs/scaling.md)
    data_variable = "ALFWORLD_DATA"  # the data folder when --data-dir is not given
    real_data = ("on a connected machine, pip install alfworld==0.4.2 and run alfworld-download, then set "
                 "ALFWORLD_DATA (or --data-dir) to the folder that holds json_2.1.1")
    held_out_split = "valid_seen"  # the shipped games' 12 that no warm start saw
    expert_thought = "My task is to {task}. The next step is to {action}."
    in_workers = True  # the engine is slow: episodes may run in worker processes (envs/workers.py)

    def __init__(self, data_dir: str | os.PathLike | None = None, max_steps: int = 0):
        check_engine()
        super().__init__(data_dir, max_steps)
        self.root = resolve_data_dir(data_dir)
        self._engines: dict[str, list] = {}  # gamefile -> idle engines, reused across resets
        self._episodes: list[dict] = []
        self._plans: dict[str, list[str]] = {}
        self._types: dict[str, str] = {}

    # -- tasks
    def tasks(self, split: str) -> list[str]:
        return find_games(self.root, split)

    def data_digest(self) -> str:
        """The tasks in one hash (a resumed run checks it trains on the data it started on): each game
        folder's name and traj_data.json, and its game file's size, in every split."""
        digest, base = hashlib.sha256(), self.root / "json_2.1.1"
        for folder in sorted(p for p in base.glob("*/*/*") if (p / "traj_data.json").is_file()):
            try:
                digest.update(str(folder.relative_to(base)).encode() + (folder / "traj_data.json").read_bytes())
                game = folder / "game.tw-pddl"
                digest.update(str(game.stat().st_size if game.exists() else -1).encode())
            except OSError as err:
                raise DataError(f"cannot read {folder}: {err.strerror or err}") from None
        return digest.hexdigest()[:16]

    def gamefile(self, task_id: str) -> str:
        return str(self.root / "json_2.1.1" / task_id / "game.tw-pddl")

    def task_type(self, task_id: str) -> str:
        if task_id not in self._types:
            traj = _load_json_object(self.root / "json_2.1.1" / task_id / "traj_data.json")
            self._types[task_id] = traj["task_type"]
        return self._types[task_id]

    def expert_plan(self, task_id: str) -> list[str]:
        """The expert's actions from the start state (cached), for --hindsight expert: the game's
        stored walkthrough, or the handcoded expert played out when the game has none."""
        if task_id not in self._plans:
            walkthrough = _load_json_object(Path(self.gamefile(task_id))).get("walkthrough") or []
            self._plans[task_id] = walkthrough or expert_walkthrough(self.gamefile(task_id), self.max_steps)[0]
        return self._plans[task_id]

    def planner_plans(self, task_id: str, actions: list[str]) -> list[list[str] | None]:
        """The PDDL planner's shortest plan from the start state and after each action (planner_plans)."""
        return planner_plans(self.gamefile(task_id), actions)

    def build_messages(self, state: EnvStep, history: list[tuple[str, str]], history_len: int | None) -> list[dict]:
        return build_messages(state.task, history, state.observation, state.admissible, history_len)

    def valid(self, state: EnvStep, text: str) -> bool:
        return parse_action(text, state.admissible)[0] is not None

    # -- episodes
    def reset(self, task_ids: list[str]) -> list[EnvStep]:
        t0 = time.perf_counter()
        self._release()
        out = []
        for task_id in task_ids:
            gamefile = self.gamefile(task_id)
            pool = self._engines.setdefault(gamefile, [])
            try:
                engine = pool.pop() if pool else _engine(gamefile, self.max_steps + 10)
                obs, info = engine.reset()
            except Exception as err:  # the engine's own parse of a game it cannot play, whatever it raises
                detail = str(err).splitlines()[0][:160] if str(err) else "no detail"
                raise DataError(f"{gamefile}: the ALFWorld engine cannot load this game "
                                f"({type(err).__name__}: {detail})") from None
            text, admissible, won, expert = _unbatch(obs, info)
            match = _TASK.search(text)
            task = match.group(1).strip().rstrip(".") if match else ""
            state = EnvStep(text, admissible, 0.0, False, won, False, task, self.task_type(task_id), expert)
            self._episodes.append(dict(engine=engine, gamefile=gamefile, state=state, steps=0))
            out.append(state)
        self.seconds["reset"] += time.perf_counter() - t0  # wall time of the call: what a rollout waits for
        self.counts["reset"] += len(task_ids)
        return out

    def step(self, responses: list[str | None]) -> list[EnvStep | None]:
        check_responses(responses, [ep["state"].done for ep in self._episodes])
        t0 = time.perf_counter()
        out: list[EnvStep | None] = []
        for ep, text in zip(self._episodes, responses):
            prev: EnvStep = ep["state"]
            if prev.done:
                out.append(None)
                continue
            action, why = parse_action(text or "", prev.admissible)
            ep["steps"] += 1
            if action is None:  # invalid: the engine is not stepped, the state stays
                obs, admissible, won, expert = f"Invalid action ({why}). Nothing happens.", prev.admissible, False, prev.expert_action
                reward = -INVALID_PENALTY
            else:
                raw_obs, _, _, info = ep["engine"].step([action])
                obs, admissible, won, expert = _unbatch(raw_obs, info)
                reward = WIN_REWARD if won else 0.0
            done = won or ep["steps"] >= self.max_steps
            state = EnvStep(obs, admissible, reward, done, won, action is None, prev.task, prev.task_type,
                            expert, action, {"invalid_reason": why} if why else {})
            ep["state"] = state
            out.append(state)
        self.seconds["step"] += time.perf_counter() - t0
        self.counts["step"] += sum(r is not None for r in responses)
        return out

    def _release(self) -> None:
        for ep in self._episodes:
            self._engines[ep["gamefile"]].append(ep["engine"])
        self._episodes = []

    def close(self) -> None:
        self._release()
        for pool in self._engines.values():
            for engine in pool:
                engine.close()
        self._engines = {}
