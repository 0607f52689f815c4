"""Rollout: play batched multi-turn episodes with the policy, and score the sampled tokens.

At every turn, one batched `generate` over all live episodes samples a response a_k ~ pi(. | c_k)
from the policy (METHOD.md's sampling rule: `decode`, `draw`), keeping the ids it was fed (c_k).

The log-probs of the sampled tokens, for the student, its teacher and the reference, are one
computation, written here plainly (`row_logprobs`): one forward over the row, then
    logp_t = log softmax(lm_head(h_{t-1}) / temperature)[x_t]   for t in the response only.
speed.py's `FastPath` computes the same, batched and cached; train.py --plain runs this file's.
"""
from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig

from errors import UserError
from segments import Row, Rows, Step, Trajectory, generation_prompt_ids


def autocast(model):
    """bf16 autocast for a model whose base weights are bf16; a no-op in float32."""
    weight = model.get_input_embeddings().weight
    bf16 = weight.dtype == torch.bfloat16
    return torch.autocast(weight.device.type, dtype=torch.bfloat16, enabled=bf16)


# ------------------------------------------------------------------ log-probs
def row_logprobs(model, row: Row, temperature: float = 1.0) -> torch.Tensor:
    """log pi(a_t | c, a_<t) of one row's response tokens, (n,): one forward over the whole row,
    the logits over the sampling temperature (METHOD.md section 7)."""
    device = model.get_input_embeddings().weight.device
    ids = torch.tensor([row.input_ids], device=device)  # (1, L)
    with autocast(model):
        hidden = model.get_decoder()(input_ids=ids).last_hidden_state[0]  # (L, H)
    # the [:, 1:] shift: the state at position p predicts the token at p + 1, so the response tokens
    # (positions num_prompt .. L-1) are scored from the states at num_prompt-1 .. L-2
    states = hidden[row.num_prompt - 1 : -1].float()  # (n, H)
    head = model.get_output_embeddings()
    bias = None if head.bias is None else head.bias.float()  # (V,)
    logits = torch.nn.functional.linear(states, head.weight.float(), bias) / temperature  # (n, V)
    return logits.log_softmax(-1).gather(-1, ids[0, row.num_prompt :, None]).squeeze(-1)  # (n,)


def micro_batch_logprobs(model, rows: list[Row], temperature: float = 1.0) -> torch.Tensor:
    """The update's pass over a micro-batch: its rows' response log-probs, (b, t), 0 past each
    row's response; with gradient when grad is enabled."""
    t = max(len(r.response_ids) for r in rows)
    out = [row_logprobs(model, r, temperature) for r in rows]  # each (n,)
    return torch.stack([torch.nn.functional.pad(x, (0, t - len(x))) for x in out])  # (b, t)


def pass_logprobs(model, rows: list[Row | None], T: int, temperature: float = 1.0,
                  only: torch.Tensor | None = None, desc: str = "log-probs") -> torch.Tensor:
    """A no-grad pass of stage 4 (the student's, the teacher's): the response log-probs of the rows
    `only` (B,) selects (default: all), (B, T), 0 elsewhere."""
    out = torch.zeros(len(rows), T)  # (B, T)
    picked = [b for b in range(len(rows)) if only is None or only[b]]
    with torch.no_grad():
        for b in tqdm(picked, desc=desc, unit="row", leave=False):
            logp = row_logprobs(model, rows[b], temperature).float().cpu()  # (n,)
            out[b, : len(logp)] = logp
    return out


def student_teacher_logprobs(model, rows: Rows, student: torch.Tensor, taught: torch.Tensor,
                             temperature: float = 1.0, desc: str = "log-probs",
                             watch=None) -> tuple[torch.Tensor, torch.Tensor]:
    """No-grad log-probs of the same response tokens a_k, by the student and by its teacher:
    (B, T) each.

    The student scores its own rows (`student` (B,) selects which), the teacher the rows with the
    hindsight block (`taught` (B,), within `student`), over the response tokens only (METHOD.md
    section 2). Rows not selected stay 0. watch: gets each pass's seconds.
    """
    watch = watch or (lambda name: contextlib.nullcontext())
    T = rows.response_mask.shape[1]
    with watch("student"):
        logp_student = pass_logprobs(model, rows.rows, T, temperature, only=student,
                                     desc=f"{desc} student")  # (B, T)
    with watch("teacher"):
        logp_teacher = pass_logprobs(model, rows.teacher_rows, T, temperature, only=taught,
                                     desc=f"{desc} teacher")  # (B, T)
    return logp_student, logp_teacher


def generate(model, prompts: list[list[int]], config) -> list[list[int]]:
    """Sample a response after each prompt (ids), in one batch: the ids each row sampled."""
    device = model.get_input_embeddings().weight.device
    ids, mask = left_padded(prompts, config.pad_token_id)  # (B, L) each
    return decode(model, ids.to(device), mask.to(device), config)


def left_padded(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts as ids (B, L), each ending at column L, and a mask (B, L), 1 = a token."""
    ids = torch.full((len(prompts), max(len(p) for p in prompts)), pad_id)  # (B, L)
    mask = torch.zeros_like(ids)  # (B, L)
    for b, p in enumerate(prompts):
        ids[b, ids.shape[1] - len(p) :], mask[b, ids.shape[1] - len(p) :] = torch.tensor(p), 1
    return ids, mask


def decode(model, ids: torch.Tensor, mask: torch.Tensor, config, cache=None) -> list[list[int]]:
    """Up to config.max_new_tokens ids after each row of ids (B, L), a token for every row a step,
    until each has sampled an end of turn (then padding; once half have, the ended rows leave the
    batch). cache: ids' first columns' KV cache (speed.py prefills it). config.min_new_tokens
    (timing tools) forbids an earlier end."""
    decoder, head, key = model.get_decoder(), model.get_output_embeddings(), cache_keyword(model)
    start = 0 if cache is None else cache.get_seq_length()  # the columns the cache holds
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, L) each token's place in its own row
    fed, position = ids[:, start:], positions[:, start:]  # the first step's input, (B, L - start)
    eos = torch.tensor(config.eos_token_id, device=ids.device)
    rows = torch.arange(len(ids), device=ids.device)  # (b,) the batch's rows of ids
    live = torch.ones(len(ids), dtype=torch.bool, device=ids.device)  # (b,) no end of turn yet
    sampled = torch.full((len(ids), config.max_new_tokens), config.pad_token_id, device=ids.device)
    for step in range(config.max_new_tokens):
        out = decoder(input_ids=fed, attention_mask=mask, position_ids=position, use_cache=True,
                      **{key: cache})
        cache = out[key]
        logits = head(out.last_hidden_state[:, -1].contiguous()).float()  # (b, V) the last token's
        if step < (config.min_new_tokens or 0):
            logits[:, eos] = -torch.inf
        if config.do_sample:  # a uniform for each row of ids, as if none had left the batch
            u = torch.rand(len(ids), 1, dtype=torch.float64, device=ids.device)[rows]  # (b, 1)
            token = draw(logits, config.temperature, u)  # (b,)
        else:
            token = logits.argmax(-1)  # (b,) greedy
        sampled[rows[live], step] = token[live]
        live &= ~torch.isin(token, eos)
        decoding = int(live.sum())
        if not decoding:
            break
        fed, position = token[:, None], position[:, -1:] + 1  # (b, 1) each
        mask = torch.cat([mask, mask.new_ones(len(mask), 1)], dim=1)  # (b, L + step + 1)
        if 2 * decoding <= len(live):  # the ended rows leave the batch
            cache.batch_select_indices(live.nonzero()[:, 0])
            rows, fed, position, mask = rows[live], fed[live], position[live], mask[live]
            live = live[live]
    return sampled[:, : step + 1].tolist()  # (B, new)


def cache_keyword(model) -> str:
    """The decoder's name for its KV cache: `cache` (transformers 5.24), else `past_key_values`."""
    params = inspect.signature(model.get_decoder().forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def draw(logits: torch.Tensor, temperature: float, u: torch.Tensor) -> torch.Tensor:
    """An id a row from softmax(logits / temperature), (B, V) -> (B,), by inverse CDF at u (B, 1),
    uniform in [0, 1); the sum in float64, so that no small probability rounds away."""
    cdf = torch.softmax(logits / temperature, dim=-1).double().cumsum(-1)  # (B, V)
    at = u * cdf[:, -1:]  # (B, 1)
    return torch.searchsorted(cdf, at, right=True).squeeze(-1).clamp_(max=cdf.shape[-1] - 1)


@dataclass
class LogProbs:
    """Log-probs of the sampled tokens (train.py's stage 4), (B, T); rows a pass left out hold 0."""

    student: torch.Tensor  # (B, T) before the update: the gap's baseline, PPO's old (section 5)
    teacher: torch.Tensor  # (B, T) the same tokens after the hindsight block (section 2)


# ------------------------------------------------------------------ sampling
def sampling_config(tokenizer, model, max_new_tokens: int, temperature: float = 1.0):
    """METHOD.md's sampling rule (temperature 0: greedy) for `decode`; top-p, top-k and repetition
    penalty off, whatever the model's own (Qwen's top_p 0.8, top_k 20, penalty 1.05), for any
    transformers' generate given it (the device check's)."""
    eos = {tokenizer.eos_token_id}
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        eos.add(im_end)
    model_eos = getattr(model.generation_config, "eos_token_id", None)
    if model_eos is not None:  # the model's own end ids too
        eos |= set(model_eos if isinstance(model_eos, list) else [model_eos])
    greedy = temperature == 0
    return GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=not greedy,
        temperature=None if greedy else temperature, top_p=None if greedy else 1.0,
        top_k=None if greedy else 0, min_p=None, typical_p=None, repetition_penalty=1.0,
        eos_token_id=sorted(eos), pad_token_id=tokenizer.pad_token_id, use_cache=True,
    )


def until_end_of_turn(ids: list[int], eos) -> list[int]:
    """The sampled ids up to and including the first end-of-turn id (all of them if none came)."""
    end = next((j + 1 for j, tok in enumerate(ids) if tok in eos), len(ids))
    return ids[:end]


class ModelPolicy:
    """The LLM policy as an actor (batch > 0: at most `batch` episodes a generate, to bound its
    memory). generate: this file's, or speed.FastPath's."""

    def __init__(self, model, tokenizer, max_new_tokens: int, temperature: float = 1.0,
                 batch: int = 0, generate=generate):
        self.model, self.tokenizer, self.batch, self.sample = model, tokenizer, batch, generate
        self.config = sampling_config(tokenizer, model, max_new_tokens, temperature)
        self.eos = set(self.config.eos_token_id)
        self.tokens_generated = 0

    @contextlib.contextmanager
    def serving(self, model, iteration: int):
        """One rollout of train.py: tokens_generated counts from 0. (vLLM's policy is handed the
        adapter here.)"""
        self.tokens_generated = 0
        yield self

    def act(self, contexts: list[list[dict]], states) -> list[tuple[list[int], list[int], str]]:
        """(prompt ids, sampled response ids, response text) for each context."""
        return self.generate([generation_prompt_ids(self.tokenizer, m) for m in contexts])

    @torch.no_grad()
    def generate(self, prompts: list[list[int]]) -> list[tuple[list[int], list[int], str]]:
        """The same for prompts as ids, at most `batch` of them a call."""
        size = self.batch or len(prompts)
        chunks = [prompts[s : s + size] for s in range(0, len(prompts), size)]
        return [out for chunk in chunks for out in self._generate(chunk)]

    def _generate(self, prompts: list[list[int]]) -> list[tuple[list[int], list[int], str]]:
        was_training = self.model.training
        self.model.eval()
        with autocast(self.model):  # bf16 weights: LoRA too in bf16 while sampling
            sampled = self.sample(model=self.model, prompts=prompts, config=self.config)
        self.model.train(was_training)
        results = []
        for b, ids in enumerate(sampled):
            response = until_end_of_turn(ids, self.eos)
            self.tokens_generated += len(response)
            text = self.tokenizer.decode(response, skip_special_tokens=True)
            results.append((prompts[b], response, text))
        return results


# ------------------------------------------------------------------ episodes
def play_episodes(env, task_ids: list[str], policy, history_len: int | None,
                  group_ids: list[int] | None = None, desc: str = "rollout") -> list[Trajectory]:
    """Play one episode per task id, all in one batch, until each is won or out of steps.

    policy.act(contexts, states) returns (prompt ids, response ids, text) per live episode.
    group_ids: the group of each episode (default: its position). Trajectories in task_ids order.
    """
    states = env.reset(task_ids)
    group_ids = list(range(len(task_ids))) if group_ids is None else group_ids
    trajs = [Trajectory(t, g, s.task_type) for t, g, s in zip(task_ids, group_ids, states)]
    history: list[list[tuple[str, str]]] = [[] for _ in task_ids]
    anchors = [s.observation for s in states]  # each episode's state; an invalid answer keeps it
    bar = tqdm(total=env.max_steps, desc=desc, unit="turn", leave=False)
    while True:
        live = [i for i, s in enumerate(states) if not s.done]
        if not live:
            break
        contexts = [env.build_messages(states[i], history[i], history_len) for i in live]
        outputs = policy.act(contexts, [states[i] for i in live])
        responses: list[str | None] = [None] * len(states)
        for i, (_, _, text) in zip(live, outputs):
            responses[i] = text
        results = env.step(responses)
        for i, context, (prompt_ids, response_ids, text) in zip(live, contexts, outputs):
            res = results[i]
            trajs[i].steps.append(Step(context, prompt_ids, response_ids, text, res.action,
                                       res.reward, anchors[i], states[i].expert_action))
            if not res.invalid:
                anchors[i] = res.observation
            history[i].append((states[i].observation, res.action or "(invalid response)"))
            states[i] = res
            if res.done:
                trajs[i].won = res.won
                trajs[i].info.update(res.info)
        bar.update(1)
        bar.set_postfix(live=sum(not s.done for s in states))
    bar.close()
    if trajs and not any(t.steps for t in trajs):
        raise UserError("no episode played a step: every one ended in an env crash (see the "
                        "warnings above)")
    return trajs
