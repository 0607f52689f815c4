"""Segments: cut each trajectory at environment turns into one training row per step.

At step k the policy saw a context c_k (chat messages) and sampled a response a_k. Segment k is
the tokens of a_k, every sampled token (end-of-turn included, when sampled). One row per step:

    student_k = [ ids(c_k) and the assistant header, as fed to generate | a_k as sampled ]
    teacher_k = [ ids(c_k) | hindsight block turn | header | a_k ]
                  the prompt (never trained on)            the segment (response_mask True)

Both rows begin with ids(c_k); the student's goes on with the header, the teacher's with the
block's turn (`shared_prefix_len`: the ids they share, which speed.py's pass reads once for both).

Shapes: B training rows (one per step), T response-token positions. This file also holds the
containers (`Step`, `Trajectory`, `Row`, `Rows`) that flow from rollout.py to train.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

HINDSIGHT_HEADER = "Hindsight (information you did not have when you acted):"
EXPERT_HEADLINE = "The expert's plan for this task, from the start:"  # --hindsight expert
SIBLING_HEADLINE = "Another attempt at this same task succeeded with these actions:"  # sibling


# ------------------------------------------------------------------ containers
@dataclass
class Step:
    """One environment turn of one episode, exactly as the policy saw and produced it."""

    messages: list[dict]  # context c_k as chat messages (role, content)
    prompt_ids: list[int]  # c_k tokenized for generation: the ids generate() was fed (no padding)
    response_ids: list[int]  # a_k: the sampled ids, end-of-turn token included when sampled
    response_text: str  # a_k decoded (special tokens dropped), what the env parsed
    action: str | None  # the parsed action, None when the response was an invalid action
    reward: float  # the env's step reward (EnvStep.reward)
    anchor: str = ""  # the state it acted from: the last reset's or valid action's observation
    expert_action: str | None = None  # what the env's expert would have done there (tools/credit)


@dataclass
class Trajectory:
    """One episode: the steps, its task and outcome."""

    task_id: str  # which game / goal
    group: int  # index of its group (G rollouts of the same task share one)
    task_type: str  # e.g. "pick_and_place_simple"
    steps: list[Step] = field(default_factory=list)
    won: bool = False
    info: dict = field(default_factory=dict)  # env extras (e.g. WebShop's raw score)
    hindsight: str | None = None  # the teacher's hindsight block; None = no hindsight

    @property
    def reward(self) -> float:
        """R_i: the episode reward (METHOD.md section 1)."""
        return float(sum(s.reward for s in self.steps))

    @property
    def actions(self) -> list[str]:
        """The parsed actions of the valid steps, in order."""
        return [s.action for s in self.steps if s.action is not None]


@dataclass
class Row:
    """One training row: prompt ids, then the response ids (the row's one segment)."""

    input_ids: list[int]  # prompt ids + response ids
    num_prompt: int  # where the response starts in input_ids: ids before it are never trained on

    @property
    def response_ids(self) -> list[int]:
        return self.input_ids[self.num_prompt :]


# ------------------------------------------------------------------ row builders
def generation_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The context ids as `apply_chat_template(..., add_generation_prompt=True)` gives them."""
    enc = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = enc["input_ids"] if hasattr(enc, "keys") else enc  # transformers 5: a BatchEncoding
    return list(ids)


def build_row(tokenizer, messages: list[dict], response_ids: list[int]) -> Row:
    """The student's row: the generation prompt of `messages`, then `response_ids` unchanged."""
    prompt = generation_prompt_ids(tokenizer, messages)
    response = list(response_ids)
    return Row(input_ids=prompt + response, num_prompt=len(prompt))  # the response: the segment


def add_hindsight(messages: list[dict], hindsight: str) -> list[dict]:
    """The teacher's context: the student's messages, then the hindsight block as one more user
    turn; nothing before it changes."""
    if not any(m["role"] == "user" for m in messages):
        raise ValueError("add_hindsight: the context has no user message (no task to give "
                         "hindsight on)")
    block = {"role": "user", "content": f"{HINDSIGHT_HEADER}\n{hindsight}"}
    return [dict(m) for m in messages] + [block]


def build_teacher_row(tokenizer, messages: list[dict], response_ids: list[int],
                      hindsight: str) -> Row:
    """The teacher's row: same response ids after a context that carries the hindsight block."""
    return build_row(tokenizer, add_hindsight(messages, hindsight), response_ids)


def shared_prefix_len(row: Row, teacher_row: Row) -> int:
    """How many leading ids a student row and its teacher row share (the student's context and, in
    ChatML, the next turn's start token), capped below both prompts' ends, so that every response
    token is scored after the shared part."""
    a, b = row.input_ids, teacher_row.input_ids
    limit = min(row.num_prompt, teacher_row.num_prompt) - 1
    n = 0
    while n < limit and a[n] == b[n]:
        n += 1
    return n


def sibling_hindsight(trajs: list[Trajectory]) -> list[str | None]:
    """--hindsight sibling: each trajectory's hindsight text, or None, by METHOD.md section 2's
    rule (a group mate's win, the shortest; never its own)."""
    out: list[str | None] = []
    for i, traj in enumerate(trajs):
        wins = [j for j, other in enumerate(trajs)
                if other.group == traj.group and other.won and j != i]
        if not wins:
            out.append(None)
            continue
        best = min(wins, key=lambda j: (len(trajs[j].steps), j))
        out.append(format_plan(SIBLING_HEADLINE, trajs[best].actions))
    return out


def format_plan(headline: str, actions: list[str]) -> str:
    """A hindsight block: one line saying what the plan is, then its actions, numbered."""
    return "\n".join([headline] + [f"{k}. {a}" for k, a in enumerate(actions, start=1)])


def response_masks(lengths: torch.Tensor, T: int | None = None) -> torch.Tensor:
    """(B, T) bool: True on row b's `lengths[b]` response tokens, False on padding."""
    T = int(lengths.max()) if T is None else T
    return torch.arange(T)[None, :] < lengths[:, None]  # (B, T)


@dataclass
class Rows:
    """Stage 2 of train.py: a batch of trajectories cut into one training row per step (B rows;
    T response positions, the longest response). Log-probs, gaps and advantages are indexed so."""

    traj: torch.Tensor  # (B,) long: each row's trajectory (a trajectory's rows in step order)
    steps: list[Step]  # the step of each row
    rows: list[Row]  # the student's rows: context ids, then the response ids
    teacher_rows: list[Row | None]  # the response after the hindsight context; None: no hindsight
    response_mask: torch.Tensor  # (B, T) bool: a row's response tokens, its one segment (trained)
    gap_mask: torch.Tensor | None  # (B, T) bool: the tokens the gap averages (--gap-tokens action)
    gap_fallback: torch.Tensor  # (B,) bool: no <action> block, the gap over the whole response
    has_hindsight: torch.Tensor  # (B,) bool: the row's trajectory has a hindsight block


def make_rows(tokenizer, trajs: list[Trajectory], hindsight: list[str | None]) -> Rows:
    """One student row per step of `trajs` and its teacher row where the trajectory has hindsight
    (hindsight: one block or None per trajectory). The gap reads every response token
    (--gap-tokens action: baselines.action_masks sets gap_mask)."""
    index = [(i, s) for i, traj in enumerate(trajs) for s in traj.steps]  # (trajectory, step)
    rows = [build_row(tokenizer, s.messages, s.response_ids) for _, s in index]
    for row, (_, s) in zip(rows, index):
        if row.input_ids != s.prompt_ids + s.response_ids:
            raise ValueError("a row's ids differ from the ids generate was fed and sampled: the "
                             "chat template does not reproduce the prompt it gave at rollout")
    teacher_rows = [build_teacher_row(tokenizer, s.messages, s.response_ids, hindsight[i])
                    if hindsight[i] is not None else None for i, s in index]
    lengths = torch.tensor([len(r.response_ids) for r in rows])  # (B,)
    response_mask = response_masks(lengths, int(lengths.max()) if len(rows) else 0)  # (B, T)
    gap_mask, fallback = None, torch.zeros(len(rows), dtype=torch.bool)  # (B,)
    has_hindsight = torch.tensor([hindsight[i] is not None for i, _ in index], dtype=torch.bool)
    return Rows(torch.tensor([i for i, _ in index]), [s for _, s in index], rows, teacher_rows,
                response_mask, gap_mask, fallback, has_hindsight)


def length_batches(picked: list[int], rows: list[Row], size: int) -> list[list[int]]:
    """The rows `picked` cut into micro-batches of `size`, shortest first, so that little padding
    is computed. Which micro-batch a row is in changes nothing beyond float rounding."""
    order = sorted(picked, key=lambda b: len(rows[b].input_ids))  # stable: ties keep their order
    return [order[s : s + size] for s in range(0, len(order), size)]
