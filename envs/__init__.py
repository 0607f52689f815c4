"""Text environments: the batched interface every env implements.

An env holds a batch of independent episodes. `reset(task_ids)` starts one episode per id
(repeats allowed: a group is G copies of one task) and returns one `EnvStep` each;
`step(responses)` takes one raw model response per episode (None for an episode that is
already done), parses and plays it, and returns one `EnvStep` per episode (None for done
ones). Step rewards already include 10 * won and -0.1 per invalid action, so an episode's
reward R_i (METHOD.md section 1) is the sum of its step rewards.

The answer format is the verl-agent convention: reasoning in <think>...</think>, then exactly
one <action>...</action> (envs/answer.py checks the tags and builds the prompt). An answer that
breaks it, or names an action the env does not admit, is an invalid action: not played, the state
unchanged, 0.1 subtracted from the reward.

Interface (duck-typed; see envs/alfworld.py):
    Env.name, .splits, .default_eval_split, .default_max_steps   class attributes, read before
                                                                 an env is built (flags/parse.py)
    env.max_steps
    env.tasks(split) -> list[str]                    task ids of a split, sorted
    env.task_type(task_id) -> str
    env.reset(task_ids) -> list[EnvStep]
    env.step(responses: list[str | None]) -> list[EnvStep | None]
    env.expert_plan(task_id) -> list[str]            the expert's actions from the start state
    env.build_messages(state, history, history_len) -> list[dict]   the policy's chat context
    env.close()
An env is one file and one line in ENVS below; envs/make.py builds one by name.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from envs.answer import answer_format, check_responses, extract_action, step_prompt  # noqa: F401

INVALID_PENALTY = 0.1  # subtracted from the reward for each invalid action (METHOD.md section 1)
WIN_REWARD = 10.0  # added once, at the step that wins
# --env's choices: name -> its class, or "module:Class" to import it only when asked for
ENVS = {"alfworld": "envs.alfworld:AlfWorldEnv", "webshop": "envs.webshop:WebShopEnv"}


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
