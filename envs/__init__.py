"""Text environments: `Env`, the batched interface every env implements, and ENVS, their table.

An episode's reward R_i (METHOD.md section 1) is the sum of its step rewards. An invalid answer
(envs/answer.py: the tags, in the verl-agent format; then an action the env does not admit) is not
played: the state stays, and 0.1 is subtracted.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from envs.answer import answer_format, check_responses, extract_action, step_prompt  # noqa: F401
from envs.table import EnvTable

INVALID_PENALTY = 0.1  # subtracted for each invalid answer (above)
WIN_REWARD = 10.0  # added once, at the step that wins


@dataclass
class EnvStep:
    """What one episode looks like after reset or after one step."""

    observation: str  # the text the env returned (for an invalid action: what went wrong)
    admissible: list[str]  # actions the env accepts now
    reward: float  # this step's reward: 10 * won_now - 0.1 * invalid
    done: bool  # episode over: won or out of steps
    won: bool  # the task is complete
    invalid: bool  # this step's response was an invalid action (the env state did not change)
    task: str  # the goal text, e.g. "put a clean plate in countertop"
    task_type: str  # e.g. "pick_clean_then_place_in_recep"
    expert_action: str | None  # what the env's expert would do next, None when it has no advice
    action: str | None = None  # the action played this step (None after reset, or invalid)
    info: dict = field(default_factory=dict)  # env extras (e.g. WebShop's raw score)


class Env(ABC):
    """A batch of independent episodes. Its class attributes are read before one is built (the
    flags' checks, the memory plan); `__init__` sets the bookkeeping the loop reads."""

    name: str  # its name in ENVS: --env
    splits: tuple[str, ...]  # --split and --eval-split take one of these
    default_eval_split: str  # the held-out split an evaluation plays by default
    default_max_steps: int  # an episode's steps when --max-steps is 0
    prompt_tokens: int  # its longest prompt at --history 2, for the GPU memory plan
    data_variable: str | None = None  # the environment variable naming its data folder
    real_data: str | None = None  # how to get the data the GPU presets need; None: it needs none
    held_out_split: str | None = None  # games no shipped warm start saw (tools/credit.py)
    expert_thought: str = "The next step is to {action}."  # an expert answer's (tools/warmstart.py)
    in_workers: bool = False  # its episodes may run in processes (envs/workers.py): a slow engine

    def __init__(self, data_dir: str | None = None, max_steps: int = 0):  # data_dir: --data-dir
        self.max_steps = max_steps or self.default_max_steps
        self.seconds = {"reset": 0.0, "step": 0.0}  # wall time in reset and step, summed
        self.counts = {"reset": 0, "step": 0}  # episodes reset, steps played
        self.crashes = 0  # episodes ended by a crashed worker process (envs/workers.py)

    @abstractmethod
    def tasks(self, split: str) -> list[str]:
        """The task ids of a split, sorted."""

    @abstractmethod
    def task_type(self, task_id: str) -> str:
        """e.g. "pick_and_place_simple": success is logged per type."""

    @abstractmethod
    def expert_plan(self, task_id: str) -> list[str]:
        """The expert's actions from the start state (--hindsight expert)."""

    @abstractmethod
    def reset(self, task_ids: list[str]) -> list[EnvStep]:
        """One new episode per id (a group: G copies of one task)."""

    @abstractmethod
    def step(self, responses: list[str | None]) -> list[EnvStep | None]:
        """Plays one raw model response per episode; None for a done one, which gets None."""

    @abstractmethod
    def build_messages(self, state: EnvStep, history: list[tuple[str, str]],
                       history_len: int | None) -> list[dict]:
        """The policy's chat context: the last history_len (None: all) of the earlier
        (observation, action) pairs, oldest first, then `state`."""

    @abstractmethod
    def valid(self, state: EnvStep, text: str) -> bool:
        """Whether step() would play the answer `text` in `state`."""

    def data_digest(self) -> str | None:
        """Its tasks in a hash: a resume checks it plays the data it began on (None: no check)."""
        return None

    def planner_plans(self, task_id: str, actions: list[str]) -> list[list[str] | None] | None:
        """A planner's shortest plan from the start and after each action (None: it has none)."""
        return None

    def close(self) -> None:
        """Release what it holds (engines, processes)."""


# --env's choices: a new env is a subclass of Env in one file, and one line here (envs/table.py).
ENVS = EnvTable(Env, {"alfworld": "envs.alfworld:AlfWorldEnv",
                      "webshop": "envs.webshop:WebShopEnv"})
