"""Segments: cut each trajectory at environment turns into one training row per step.

A trajectory is a list of steps k = 1..K. At step k the policy saw a context c_k (chat
messages) and sampled a response a_k. Segment k is the tokens of a_k, every sampled token,
the end-of-turn token included. One training row per step:

    row_k = [ ids(c_k) as tokenized for generation | a_k as sampled ]
              the prompt (never trained on)            the segment (response_mask True)

The hindsight teacher's row is the student's context, then the hindsight block as one more
user turn, then the assistant header and the same response:

    teacher_k = [ ids(c_k) | block turn | header | a_k ]     student_k = [ ids(c_k) | header | a_k ]

so the teacher reads only what the student did not (and speed.py scores both rows with one pass
over ids(c_k), `shared_prefix_len`). Log-probs are kept over response tokens only, so the teacher
row and the student row align token for token although their prompts differ.

`make_rows` cuts a batch of trajectories into these rows (train.py's stage 2): `Rows`, with the
`response_mask` (B, T) that marks each row's segment over its response positions.

Shapes: B training rows (one per step), T response-token positions.
This file also holds the small typed containers (`Step`, `Trajectory`, `Row`, `Rows`) that flow
from rollout.py to train.py.
"""
from __future__ import annotations

import re
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
    reward: float  # step reward from the env (10 * won and -0.1 for an invalid action included)
    anchor: str = ""  # the state it acted from: the last reset's or valid action's observation
    expert_action: str | None = None  # what the env's expert would have done there (tools/credit)


@dataclass
class Trajectory:
    """One episode: the steps, its task and outcome; R_i is the sum of the step rewards."""

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
    """The context ids exactly as `apply_chat_template(..., add_generation_prompt=True)` gives
    them."""
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
    turn.

    Nothing before it changes, so the teacher's prompt starts with the student's context token
    for token (up to the assistant header), and a pass over that context serves both.
    """
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
    """--hindsight sibling: each trajectory's hindsight text, or None (METHOD.md section 2).

    The actions of the shortest successful trajectory of the same group (ties: lowest index),
    never the trajectory itself: the lone success of a group, and every trajectory of a group
    without success, get None.
    """
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


def action_token_mask(tokenizer, response_ids: list[int]) -> list[bool]:
    """True for the response tokens that overlap the text inside <action>...</action> (the last
    such block, tags in any case; tags included), for StepOPSD's action-only gap. All False when
    there is none."""
    pieces = [tokenizer.decode([t]) for t in response_ids]
    ends, pos = [], 0
    for piece in pieces:
        pos += len(piece)
        ends.append(pos)
    text = "".join(pieces)
    flags = re.IGNORECASE | re.ASCII  # any ASCII case, as the parser reads it
    opens = [m.start() for m in re.finditer("<action>", text, flags)]
    start = opens[-1] if opens else -1
    close = re.compile("</action>", flags).search(text, start) if start >= 0 else None
    if close is None:
        return [False] * len(response_ids)
    stop = close.end()
    return [ends[k] > start and (ends[k - 1] if k else 0) < stop for k in range(len(pieces))]


def action_masks(tokenizer, rows: list[Row], T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask (B, T) bool: True = a token inside <action>...</action> (action_token_mask),
    fallback (B,) bool).

    A response without an <action> block (mostly an invalid answer) has no action tokens: its mask
    falls back to the whole response, and `fallback` marks it (runs log the share,
    `gap_action_fallback`), so such a segment still gets a gap rather than a silent multiplier 1."""
    mask = torch.zeros(len(rows), T, dtype=torch.bool)  # (B, T)
    fallback = torch.zeros(len(rows), dtype=torch.bool)  # (B,)
    for b, r in enumerate(rows):
        n = len(r.response_ids)
        found = torch.tensor(action_token_mask(tokenizer, r.response_ids), dtype=torch.bool)  # (n,)
        fallback[b] = n > 0 and not bool(found.any())
        mask[b, :n] = torch.ones(n, dtype=torch.bool) if fallback[b] else found
    return mask, fallback


def response_masks(lengths: torch.Tensor, T: int | None = None) -> torch.Tensor:
    """(B, T) bool over response positions: True on a row's `lengths[b]` response tokens, False
    on padding."""
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


def make_rows(tokenizer, trajs: list[Trajectory], hindsight: list[str | None],
              action_only: bool = False) -> Rows:
    """One student row per step of `trajs` and its teacher row where the trajectory has hindsight
    (hindsight: one block or None per trajectory). action_only: the gap reads only the tokens inside
    <action>...</action> (--gap-tokens action)."""
    index = [(i, s) for i, traj in enumerate(trajs) for s in traj.steps]  # (trajectory, step)
    rows = [build_row(tokenizer, s.messages, s.response_ids) for _, s in index]
    for row, (_, s) in zip(rows, index):  # the trained ids are exactly the fed and sampled ids
        if row.input_ids != s.prompt_ids + s.response_ids:
            raise ValueError("a row's ids differ from the ids generate was fed and sampled: the "
                             "chat template does not reproduce the prompt it gave at rollout")
    teacher_rows = [build_teacher_row(tokenizer, s.messages, s.response_ids, hindsight[i])
                    if hindsight[i] is not None else None for i, s in index]
    lengths = torch.tensor([len(r.response_ids) for r in rows])  # (B,)
    response_mask = response_masks(lengths, int(lengths.max()) if len(rows) else 0)  # (B, T)
    T = response_mask.shape[1]
    gap_mask, fallback = None, torch.zeros(len(rows), dtype=torch.bool)  # (B,)
    if action_only:
        gap_mask, fallback = action_masks(tokenizer, rows, T)  # (B, T), (B,)
    has_hindsight = torch.tensor([hindsight[i] is not None for i, _ in index], dtype=torch.bool)
    return Rows(torch.tensor([i for i, _ in index]), [s for _, s in index], rows, teacher_rows,
                response_mask, gap_mask, fallback, has_hindsight)


def length_batches(picked: list[int], rows: list[Row], size: int) -> list[list[int]]:
    """The rows `picked` cut into micro-batches of `size`, shortest rows first, so that the rows of
    a micro-batch have similar lengths and little padding is computed. Each row is in exactly one
    micro-batch; what a row's log-probs and gradients are does not depend on which one (up to float
    rounding), since padding is masked and gradients add up over micro-batches."""
    order = sorted(picked, key=lambda b: len(rows[b].input_ids))  # stable: ties keep their order
    return [order[s : s + size] for s in range(0, len(order), size)]


# ------------------------------------------------------------------ what train.py's stages return
@dataclass
class Advantages:
    """Stage 3: the direction of each row, from the rewards alone; which rows stages 4-6 compute.

    The method needs three masks; each row mask follows from A_i alone (section 4):

    | mask                 | True on                    | --kl-coef 0            | --kl-coef > 0 |
    |----------------------|----------------------------|------------------------|---------------|
    | rows.response_mask   | a row's response tokens:   | the same               | the same      |
    |   (B, T)             | its segment, trained on    |                        |               |
    | trained (B,)         | rows the student pass and  | rows whose Ahat can be | every row     |
    |                      | the update read            | != 0 (sdar: every row) |               |
    | taught (B,)          | rows the teacher scores    | rows with hindsight whose Ahat can be  |
    |                      |                            | != 0 (sdar: every row with hindsight)  |

    A row whose Ahat is 0 adds exactly 0 to the policy gradient, so leaving it out of the passes
    changes nothing; a KL term, or SDAR's, reads it (advantage.needed_rows).
    """

    row: torch.Tensor  # (B,) A_i of each row's trajectory (Eq. 1)
    step: torch.Tensor | None  # (B,) GiGPO's step advantage A_step (Eq. 12); None for the others
    step_groups: torch.Tensor | None  # (B,) long: GiGPO's step group (same group, same state)
    trained: torch.Tensor  # (B,) bool: the rows the student pass and the update read (table above)
    taught: torch.Tensor  # (B,) bool: the rows the teacher pass scores (table above)


@dataclass
class LogProbs:
    """Stage 4: log-probs of the sampled tokens, response-aligned (B, T); rows a pass left out
    hold 0, and are never read."""

    student: torch.Tensor  # (B, T) the policy before the update: the gap's baseline, PPO's logp_old
    teacher: torch.Tensor  # (B, T) the same tokens after the hindsight block; = student untaught
    ref: torch.Tensor | None  # (B, T) the reference (adapter off), for the KL term; or None

    def old(self, part: list[int], logp_new: torch.Tensor, moved: bool) -> torch.Tensor:
        """PPO's logp_old for the rows `part` of a micro-batch, (b, t) like logp_new: the student's
        log-probs once an optimizer step of this iteration has moved a weight; before that,
        logp_new itself (detached), so the first step's ratio is exactly 1 (METHOD.md section 5)."""
        if not moved:
            return logp_new.detach()  # (b, t) nothing moved: another pass's rounding is no change
        return self.student[part, : logp_new.shape[1]].to(logp_new.device)  # (b, t)


@dataclass
class Credit:
    """Stage 5: the size of each row's update, from the teacher's gap."""

    token_adv: torch.Tensor  # (B, T) Ahat, 0 off the segment (Eq. 5; RLSD Eq. 8, GiGPO Eq. 13)
    gaps: torch.Tensor  # (B,) the segment gap g of each row (Eq. 3)
    mults: torch.Tensor | None  # the multiplier Ahat applied: (B,) one a segment (Eq. 4, 9);
    #                             RLSD (B, T) one a token (Eq. 8); None: grpo, sdar, gigpo
