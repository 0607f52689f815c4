"""The answer format and the prompt every env builds: the verl-agent convention, reasoning in
<think>...</think>, then exactly one <action>...</action>; `extract_action` checks the tags, each env
then checks the action. A reader of the method may skip this file (envs/__init__.py says what an env
does with an answer: an invalid one is penalized, not played).
"""
from __future__ import annotations

import re


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
    if not (value.isascii() and value.isdigit()):  # '²' is a digit to Python, no number
        raise ValueError(f"--history must be a non-negative integer or 'all'; got {value!r}")
    return int(value)


def history_problems(value: str) -> list[str]:
    """--history's problem, if it has one (history_length's rule), as the flag checks collect them."""
    try:
        history_length(value)
    except ValueError as err:
        return [str(err)]
    return []
