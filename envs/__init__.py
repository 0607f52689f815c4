"""Text environments: the batched interface every env implements, and the answer-format parser.

An env holds a batch of independent episodes. `reset(task_ids)` starts one episode per id
(repeats allowed: a group is G copies of one task) and returns one `EnvStep` each;
`step(responses)` takes one raw model response per episode (None for an episode that is
already done), parses and plays it, and returns one `EnvStep` per episode (None for done
ones). Step rewards already include 10 * won and -0.1 per invalid action, so an episode's
reward R_i (METHOD.md section 1) is the sum of its step rewards.

The answer format is the verl-agent convention: reasoning in <think>...</think>, then exactly
one <action>...</action>. `extract_action` checks the tags; each env then checks the action.

Interface (duck-typed; see envs/alfworld.py):
    env.name, env.max_steps, env.default_eval_split
    env.tasks(split) -> list[str]                    task ids of a split, sorted
    env.task_type(task_id) -> str
    env.reset(task_ids) -> list[EnvStep]
    env.step(responses: list[str | None]) -> list[EnvStep | None]
    env.expert_plan(task_id) -> list[str]            the expert's actions from the start state
    env.build_messages(state, history, history_len) -> list[dict]   the policy's chat context (step_prompt)
    env.close()
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from errors import UserError

INVALID_PENALTY = 0.1  # subtracted from the reward for each invalid action (METHOD.md section 1)
WIN_REWARD = 10.0  # added once, at the step that wins
SPLITS = {"alfworld": ("train", "valid_seen", "valid_unseen", "valid_train"), "webshop": ("train", "test")}  # per env


def check_responses(responses: list, done: list[bool]) -> None:
    """step()'s contract: one response per episode of the batch, None for the episodes already done."""
    if len(responses) != len(done):
        raise ValueError(f"step got {len(responses)} responses for {len(done)} episodes")
    if any(d and r is not None for r, d in zip(responses, done)):
        raise ValueError("step got a response for an episode that is already done (pass None)")


def step_prompt(
    intro: str, history: list[tuple[str, str]], observation: str, actions_label: str, actions: list[str],
    example_action: str, history_len: int | None,
) -> list[dict]:
    """The policy's chat context for one step, one user message (the model's default system prompt):
    the intro with the task, the last `history_len` (observation, action) pairs (None = all),
    the current observation, the available actions and the answer format."""
    start = 0 if history_len is None else max(0, len(history) - history_len)  # never negative: early steps show all
    shown = history[start:]
    first = len(history) - len(shown)
    lines = [intro]
    if shown:
        lines.append(f"You have taken {len(history)} step(s). Your most recent ones, observation then action:")
        for j, (obs, act) in enumerate(shown, start=first + 1):
            lines.append(f"[Step {j}] Observation: {obs}\n[Step {j}] Action: {act}")
    lines.append(f"[Step {len(history) + 1}] Current observation: {observation}")
    lines.append(f"{actions_label}: " + ", ".join(actions))
    lines.append(answer_format(example_action))
    return [{"role": "user", "content": "\n".join(lines)}]


def answer_format(example_action: str) -> str:
    """The answer-format instruction that ends every prompt, with an env-specific example."""
    return (
        "First think step by step about the situation inside <think> </think> tags. "
        "Then give exactly one admissible action inside <action> </action> tags, "
        f"for example: <think>...</think><action>{example_action}</action>"
    )


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
    action: str | None = None  # the action played this step (None after reset or for an invalid one)
    info: dict = field(default_factory=dict)  # env extras (e.g. WebShop's raw score)


# opening and closing tags, any case of ASCII letters only: without re.ASCII, IGNORECASE would
# also match e.g. the Kelvin sign (U+212A) as a "k" in <thinK>
_TAGS = re.compile(r"<(/?)(think|action)>", re.IGNORECASE | re.ASCII)


def _blocks(text: str, name: str) -> list[tuple[int, int]]:
    """(start, end) of the contents of each <name>...</name> block, as a non-greedy regex would
    pair them (an opening tag with the first closing tag after it), in one linear pass."""
    blocks, open_at = [], None
    for m in _TAGS.finditer(text):
        if m.group(2).lower() != name:
            continue
        if not m.group(1) and open_at is None:
            open_at = m.end()
        elif m.group(1) and open_at is not None:
            blocks.append((open_at, m.start()))
            open_at = None
    return blocks


def extract_action(text: str) -> tuple[str | None, str]:
    """The action inside the answer's tags, or None and why the answer is invalid.

    Invalid: no <think>...</think> block, no or several <action>...</action> blocks, an
    empty action, or any character in the action outside printable ASCII (another script,
    Unicode spaces included); ASCII spaces, tabs and newlines collapse to one space. Tags
    match in any case. Linear time in the length of the text, whatever it holds.
    """
    if not _blocks(text, "think"):
        return None, "missing <think>...</think>"
    actions = _blocks(text, "action")
    if not actions:
        return None, "missing <action>...</action>"
    if len(actions) > 1:
        return None, f"{len(actions)} actions given, one expected"
    raw = text[actions[0][0] : actions[0][1]]
    if not all(32 <= ord(c) < 127 or c in "\t\n\r" for c in raw):
        return None, "action has characters outside ASCII"
    action = " ".join(raw.split())  # collapse ASCII whitespace and newlines
    if not action:
        return None, "empty action"
    return action, ""


def history_length(value: str) -> int | None:
    """The --history flag: 'all' -> None (the whole episode so far); else a non-negative integer."""
    if value == "all":
        return None
    if not value.isdigit():
        raise ValueError(f"--history must be a non-negative integer or 'all'; got {value!r}")
    return int(value)


def make_env(name: str, data_dir=None, max_steps: int = 0, workers: int = 1, timeout: float = 600.0, **kwargs):
    """Build an env by name (max_steps 0 = the env's own default); env packages are imported
    only when asked for. workers > 1 runs ALFWorld's episodes in that many processes
    (envs/workers.py), each given `timeout` seconds to answer a reset or step; WebShop always runs
    in-process (a step takes ~0.05 ms)."""
    kwargs["data_dir"] = data_dir
    if max_steps > 0:
        kwargs["max_steps"] = max_steps
    if name == "alfworld" and workers > 1:
        # deferred: each env's packages only when that env is asked for
        from envs.workers import WorkerEnv

        return WorkerEnv(name, workers, timeout=timeout, **kwargs)
    if name == "alfworld":
        from envs.alfworld import AlfWorldEnv

        return AlfWorldEnv(**kwargs)
    if name == "webshop":
        try:  # WebShop's search and reward packages load only when WebShop is asked for
            from envs.webshop import WebShopEnv
        except ModuleNotFoundError as err:
            raise UserError(f"--env webshop needs the {err.name} package, which is not installed: "
                            "pip install -r requirements.txt (or bash install.sh)") from None
        return WebShopEnv(**kwargs)
    raise ValueError(f"unknown env {name!r}: choose 'alfworld' or 'webshop'")


def training_tasks(env, split: str, max_plan_len: int = 0) -> list[str]:
    """The task ids of `split`; with max_plan_len > 0 only those whose expert plan is at most that long."""
    tasks = env.tasks(split)
    if max_plan_len > 0:
        tasks = [t for t in tasks if len(env.expert_plan(t)) <= max_plan_len]
        if not tasks:
            raise UserError(f"no {split} task has an expert plan of <= {max_plan_len} steps")
    return tasks


def draw_tasks(rng, tasks: list[str], n: int) -> list[str]:
    """n tasks for one training iteration: distinct while there are enough, then again from a fresh draw."""
    chosen = []
    while len(chosen) < n:
        chosen += rng.sample(tasks, min(n - len(chosen), len(tasks)))
    return chosen


def resolve_workers(flag: int, batch: int) -> int:
    """--env-workers: 0 = the CPU cores, capped by the batch (episodes played at once); else the flag."""
    if flag > 0:
        return flag
    return max(1, min(os.cpu_count() or 1, batch))
