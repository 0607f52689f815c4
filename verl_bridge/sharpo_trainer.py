"""SHARPO inside verl: a `RayPPOTrainer` whose actor update first runs the hindsight teacher
through verl's own actor workers, then trains on SHARPO's token advantages.

verl's PPO step (RayPPOTrainer.fit, verl 0.9.1) goes: rollout, rewards, old_log_probs (the
actor's log-prob pass), advantages, `_update_actor(batch)`. `SharpoRayPPOTrainer` overrides the
last one. There the batch holds the responses, their `old_log_probs` and the group's advantages,
and the actor has not moved yet, so the teacher is the same policy the student pass scored:

  1. hindsight: each sample's block, the env's plan where the batch carries one
     (non_tensor_batch[plan_key]: a list of actions), else the actions of the shortest
     successful trajectory of the same group (`uid`), never the sample's own (segments.py's
     `sibling_hindsight` rule); a sample with neither has no teacher;
  2. teacher rows: the student's prompt ids up to the assistant header, the block as one more
     user turn and the header, as the tokenizer's chat template renders them
     (segments.add_hindsight), then the same response ids, unchanged;
  3. the teacher pass: verl's `_compute_old_log_prob` over those rows, on the samples whose
     A_i != 0 only (`needs_teacher`: no teacher can move a sample whose advantage is 0); every
     other sample takes its `old_log_probs` as its teacher's, a gap of exactly 0;
  4. credit: `advantages` (and `returns`) become Ahat = verl_sharpo.sharpo_advantages, which
     calls advantage.py (METHOD.md Eq. 1-5); then the parent's update runs unchanged.

Layouts (verl_sharpo.py): "per_step", verl-agent's one sample an environment step (a
trajectory's samples in batch order are its steps in order: verl's `trainer.balance_batch`
reorders the batch, so turn it off with this layout); "per_trajectory", verl's multi-turn agent
loop, one sample a trajectory, each run of response_mask == 1 one segment.

Settings: the config's top-level `sharpo` section (`SharpoSettings`, fields below); a launch
adds it with `+sharpo.layout=per_step` and so on (main_sharpo.py).

Deviations from train.py: A_i is this bridge's (verl_sharpo.py: a group of one or of tied scores
gets 0, where verl's GRPO gives the raw score or float noise); an action is the text inside the
response's one <action>...</action> (`action_pattern`), a response without exactly one is not
an action; the teacher pass is verl's full forward, not train.py's shared-prefix pass, and
its batch is padded to whole micro-batches with repeated rows (dropped after). Not
covered: verl's v1 trainer (`trainer.use_v1=True`), whose `_update_actor` gets a TransferQueue
handle (`KVBatchMeta`), not a DataProto, and whose data plane (`transfer_queue`) is another
package; multimodal samples (position_ids with rope rows).

Shapes: B samples, Lp prompt positions (left-padded), T response positions (right-padded).
"""
from __future__ import annotations

import math
import re
import typing
from dataclasses import dataclass, fields

import torch
from verl import DataProto
from verl.protocol import pad_dataproto_to_divisor, unpad_dataproto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils.model import compute_position_id_with_mask

from verl_bridge.verl_sharpo import BRIDGED, bridged, label_ids, needs_teacher, runs_of_ones, sharpo_advantages  # isort: split
from advantage import check_mixing  # the repository root is on the path now (verl_sharpo put it there)
from flags import MethodArgs
from segments import EXPERT_HEADLINE, SIBLING_HEADLINE, add_hindsight, format_plan


# The settings that take one of a few names, and those names (--algo, --episode-stats: train.py's own).
CHOICES = {"layout": ("per_step", "per_trajectory"), "algo": BRIDGED,
           "episode_stats": typing.get_args(typing.get_type_hints(MethodArgs)["episode_stats"])}


@dataclass
class SharpoSettings:
    """The `sharpo` section of a verl config."""

    layout: str = "per_step"  # "per_step" (verl-agent) or "per_trajectory" (verl's agent loop)
    lam: float = MethodArgs.lam  # mixing weight of the multiplier (METHOD.md Eq. 5); 0 = plain GRPO
    eps_m: float = MethodArgs.eps_m  # the multiplier's bound (Eq. 4)
    algo: str = MethodArgs.algo  # train.py's --algo, one its table lets this bridge compute (BRIDGED)
    episode_stats: str = MethodArgs.episode_stats  # per_step: group statistics over trajectories or "step"s
    success_above: float = 0.0  # a trajectory whose best sample score exceeds this succeeded
    action_pattern: str = r"<action>(.*?)</action>"  # a response's action: its one match, stripped
    plan_key: str = "expert_plan"  # non_tensor_batch key of the env's plan, when the env gives one

    @classmethod
    def from_config(cls, config) -> "SharpoSettings":
        """The settings of a verl config, checked against it: a ValueError names what to change."""
        section = dict(config.get("sharpo", None) or {})
        unknown = set(section) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"sharpo: unknown setting(s) {sorted(unknown)}; the settings are "
                             f"{[f.name for f in fields(cls)]}")
        settings = cls(**section)
        for name in ("lam", "eps_m", "success_above"):  # a number, finite (a NaN threshold passes no score)
            value = getattr(settings, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"sharpo.{name} must be a finite number; got {value!r}")
        check_mixing(settings.lam, settings.eps_m)  # train.py's own check of --lam and --eps-m
        for name, choices in CHOICES.items():  # exactly one of the names each setting takes, in its case
            if getattr(settings, name) not in choices:
                raise ValueError(f"sharpo.{name} must be one of {', '.join(map(repr, choices))}; "
                                 f"got {getattr(settings, name)!r}")
        if not isinstance(settings.plan_key, str) or not settings.plan_key:
            raise ValueError(f"sharpo.plan_key must name a non_tensor_batch key; got {settings.plan_key!r}")
        try:
            groups = re.compile(settings.action_pattern).groups if isinstance(settings.action_pattern, str) else -1
        except re.error as err:
            raise ValueError(f"sharpo.action_pattern is no regular expression ({err})") from None
        if groups != 1:
            raise ValueError("sharpo.action_pattern must be a regular expression with exactly one group (the "
                             f"action); got {settings.action_pattern!r}")
        if settings.layout == "per_step" and config.trainer.get("balance_batch", False):
            raise ValueError("sharpo.layout=per_step reads a trajectory's steps in batch order, which "
                             "trainer.balance_batch reorders: set trainer.balance_batch=False")
        return settings


# ------------------------------------------------------------------ 1. hindsight
def turn_actions(data: DataProto, tokenizer, layout: str, pattern: str) -> list[list[str | None]]:
    """Each sample's turns, in order, as the action each holds, None where the turn is not a valid
    action (no or several matches of `pattern`): per_step a sample is one turn, per_trajectory each
    segment (run of response_mask == 1) is one."""
    responses, mask = data.batch["responses"], data.batch["response_mask"]  # (B, T), (B, T)
    segments = torch.where(mask.bool(), 0, -1) if layout == "per_step" else runs_of_ones(mask)  # (B, T)
    out = []
    for b in range(len(responses)):
        turns = []
        for s in range(int(segments[b].max()) + 1):
            text = tokenizer.decode(responses[b][segments[b] == s].tolist(), skip_special_tokens=True)
            found = re.findall(pattern, text, flags=re.DOTALL | re.IGNORECASE)
            valid = len(found) == 1 and found[0].strip()
            turns.append(" ".join(found[0].split()) if valid else None)
        out.append(turns)
    return out


def hindsight_blocks(data: DataProto, tokenizer, settings: SharpoSettings) -> list[str | None]:
    """Each sample's hindsight block, or None (module docstring, step 1). Of a group's successful
    trajectories, the one of fewest turns gives its valid actions (ties: the first in the batch)."""
    extra = data.non_tensor_batch
    groups = label_ids(extra["uid"]).tolist()  # (B,) group of each sample
    if settings.layout == "per_step":
        traj = label_ids(extra["traj_uid"]).tolist()  # (B,) trajectory of each sample
    else:
        traj = list(range(len(groups)))  # one sample a trajectory
    scores = data.batch["token_level_rewards"].sum(-1).tolist()  # (B,) each sample's score
    per_sample = turn_actions(data, tokenizer, settings.layout, settings.action_pattern)
    turns: dict[int, list[str | None]] = {}  # trajectory -> its turns, its samples in batch order
    best: dict[int, float] = {}  # trajectory -> its best sample score
    group_of: dict[int, int] = {}
    for b, t in enumerate(traj):
        turns.setdefault(t, []).extend(per_sample[b])
        best[t] = max(best.get(t, float("-inf")), scores[b])
        group_of[t] = groups[b]
    actions = {t: [a for a in turns[t] if a is not None] for t in turns}  # the valid ones
    won = [t for t in turns if best[t] > settings.success_above and actions[t]]  # in first-seen order
    plans = extra.get(settings.plan_key)
    blocks: list[str | None] = []
    for b, t in enumerate(traj):
        plan = None if plans is None else plans[b]
        if isinstance(plan, str):  # a list of actions, or nothing: a string would be read letter by letter
            raise ValueError(f"non_tensor_batch[{settings.plan_key!r}] of sample {b} is a string, {plan[:40]!r}: "
                             "give each sample its plan as a list of actions")
        if plan is not None and len(plan) > 0:
            blocks.append(format_plan(EXPERT_HEADLINE, [str(a) for a in plan]))
            continue
        mates = [u for u in won if group_of[u] == group_of[t] and u != t]
        if not mates:
            blocks.append(None)
            continue
        shortest = min(mates, key=lambda u: len(turns[u]))  # ties: the first in the batch
        blocks.append(format_plan(SIBLING_HEADLINE, actions[shortest]))
    return blocks


# ------------------------------------------------------------------ 2. teacher rows
def hindsight_turn(tokenizer, block: str, template_kwargs: dict | None = None) -> tuple[list[int], list[int]]:
    """(header, turn): the ids the chat template ends a prompt with for generation (the assistant
    header), and the ids it puts there instead when the block is one more user turn (the block's
    turn, then the header). The template renders a probe conversation both ways
    (segments.add_hindsight); past their shared start, the two differ by exactly these."""
    kwargs = dict(template_kwargs or {})
    probe = [{"role": "user", "content": "task"}]
    plain = _template_ids(tokenizer, probe, kwargs)
    taught = _template_ids(tokenizer, add_hindsight(probe, block), kwargs)
    shared = 0
    while shared < min(len(plain), len(taught)) and plain[shared] == taught[shared]:
        shared += 1
    return plain[shared:], taught[shared:]


def teacher_prompt_ids(student_prompt: list[int], header: list[int], turn: list[int], tokenizer) -> list[int]:
    """The teacher's prompt: the student's prompt ids with the hindsight turn put before the
    assistant header that ends them (`hindsight_turn`). The student's prompt must end with that
    header: it was rendered for generation by the same template."""
    if student_prompt[len(student_prompt) - len(header):] != header:
        raise ValueError(
            "sharpo: a student prompt does not end with the chat template's assistant header "
            f"{tokenizer.decode(header)!r}; the teacher's prompt is built from it. Render prompts with "
            "apply_chat_template(..., add_generation_prompt=True) and the same tokenizer "
            "(data.apply_chat_template_kwargs reach both).")
    return student_prompt[: len(student_prompt) - len(header)] + turn


def _template_ids(tokenizer, messages: list[dict], kwargs: dict) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
    return tokenizer.encode(text, add_special_tokens=False)


def teacher_batch(data: DataProto, rows: list[int], prompts: list[list[int]], pad_id: int) -> DataProto:
    """The teacher's samples, in verl's padded layout: prompts left-padded to the longest,
    then the student's responses and their attention and response masks, unchanged.
    rows: the samples taught; prompts: their teacher prompt ids."""
    Lp = max(len(p) for p in prompts)
    ids = torch.full((len(rows), Lp), pad_id, dtype=torch.long)  # (n, Lp) left-padded
    prompt_mask = torch.zeros(len(rows), Lp, dtype=torch.long)  # (n, Lp) 1 = a prompt token
    for k, p in enumerate(prompts):
        ids[k, Lp - len(p):] = torch.tensor(p)
        prompt_mask[k, Lp - len(p):] = 1
    T = data.batch["responses"].shape[1]
    responses = data.batch["responses"][rows]  # (n, T) the same ids the student sampled
    response_attention = data.batch["attention_mask"][rows, -T:]  # (n, T) env tokens too (per_trajectory)
    attention = torch.cat([prompt_mask, response_attention], dim=1)  # (n, Lp + T)
    tensors = {
        "prompts": ids,
        "responses": responses,
        "input_ids": torch.cat([ids, responses], dim=1),  # (n, Lp + T)
        "attention_mask": attention,
        "position_ids": compute_position_id_with_mask(attention),  # (n, Lp + T) as verl's rollout sets them
        "response_mask": data.batch["response_mask"][rows],  # (n, T)
    }
    meta = dict(data.meta_info, global_token_num=attention.sum(-1).tolist())
    return DataProto.from_dict(tensors=tensors, meta_info=meta)


# ------------------------------------------------------------------ the trainer
class SharpoRayPPOTrainer(RayPPOTrainer):
    """verl's RayPPOTrainer with SHARPO's credit in `_update_actor` (module docstring)."""

    def _update_actor(self, batch: DataProto) -> DataProto:
        settings = SharpoSettings.from_config(self.config)
        logp_teacher, metrics = self._teacher_log_probs(batch, settings)  # (B, T), dict
        batch.batch["teacher_log_probs"] = logp_teacher
        ahat = sharpo_advantages(batch, layout=settings.layout, lam=settings.lam, eps_m=settings.eps_m,  # (B, T)
                                 algo=settings.algo, episode_stats=settings.episode_stats)
        batch.batch.pop("teacher_log_probs")  # the workers' update does not read it
        batch.batch["advantages"] = ahat  # (B, T) Ahat in place of the estimator's A
        batch.batch["returns"] = ahat.clone()  # (B, T) as verl's GRPO sets them: equal to the advantages
        output = super()._update_actor(batch)
        output.meta_info["metrics"].update(metrics)
        return output

    def _teacher_log_probs(self, batch: DataProto, settings: SharpoSettings) -> tuple[torch.Tensor, dict]:
        """The teacher's log-probs of each sample's response tokens (B, T): from verl's actor pass
        over the teacher rows of the samples that move and have a hindsight block, the student's
        `old_log_probs` for every other sample."""
        if batch.batch["position_ids"].dim() != 2:
            raise NotImplementedError("sharpo: multimodal samples (position_ids with rope rows) are not "
                                      "covered; the teacher rows are built for text prompts")
        logp = batch.batch["old_log_probs"].clone()  # (B, T) no teacher: a gap of exactly 0
        if not bridged(settings.algo).uses_teacher(settings):  # GRPO, lam 0: no teacher can change Ahat
            return logp, {}
        moving = needs_teacher(batch, settings.layout, episode_stats=settings.episode_stats)  # (B,)
        blocks = hindsight_blocks(batch, self.tokenizer, settings)
        rows = [b for b in range(len(batch)) if moving[b] and blocks[b] is not None]
        metrics = {"sharpo/moving_share": float(moving.float().mean()),
                   "sharpo/taught_share": len(rows) / max(len(batch), 1)}
        if not rows:
            return logp, metrics
        Lp = batch.batch["prompts"].shape[1]
        prompt_mask = batch.batch["attention_mask"][:, :Lp].bool()  # (B, Lp) the prompt's real tokens
        template_kwargs = self.config.data.get("apply_chat_template_kwargs", None) or {}
        turns = {blocks[b]: hindsight_turn(self.tokenizer, blocks[b], template_kwargs) for b in rows}  # once a block
        prompts = [teacher_prompt_ids(batch.batch["prompts"][b][prompt_mask[b]].tolist(), *turns[blocks[b]],
                                      self.tokenizer) for b in rows]
        taught = teacher_batch(batch, rows, prompts, self.tokenizer.pad_token_id)
        padded, pad = pad_dataproto_to_divisor(taught, self._teacher_divisor())  # repeats rows, dropped below
        scored, _ = self._compute_old_log_prob(padded)  # verl's own actor pass, no update
        logp[rows] = unpad_dataproto(scored, pad).batch["old_log_probs"]  # (n, T)
        mask = batch.batch["response_mask"][rows].bool()  # (n, T)
        gaps = (logp[rows] - batch.batch["old_log_probs"][rows])[mask]  # (tokens,) delta_t of the taught
        metrics["sharpo/teacher_gap_mean"] = float(gaps.mean()) if gaps.numel() else 0.0
        return logp, metrics

    def _teacher_divisor(self) -> int:
        """The teacher batch's size must split into equal micro-batches on every data-parallel rank
        (verl's workers assert it), as the student batch's does by configuration."""
        rollout = self.config.actor_rollout_ref.rollout
        micro = 1 if rollout.log_prob_use_dynamic_bsz else rollout.log_prob_micro_batch_size_per_gpu
        return self.actor_rollout_wg.world_size * micro
