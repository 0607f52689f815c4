"""Rollout: play batched multi-turn episodes with the policy, and score the sampled tokens.

At every turn, one batched `generate` over all live episodes (left padding) samples a
response a_k ~ pi(. | c_k) from the policy itself: temperature 1, top_p 1, top_k 0, no
repetition penalty (the model's own generation defaults are overridden, METHOD.md). The
env plays every live episode; finished episodes leave the batch. Each step is stored with
exactly the ids generate was fed (c_k) and sampled (a_k), so training never re-tokenizes.

`response_logprobs` is the one log-prob function for student, teacher and reference:
    logp_t = log softmax(lm_head(h_{t-1}) / temperature)[x_t]   for t in the response only,
computed in chunks so the full (B, L, V) float32 logits never exist at once.
`student_teacher_logprobs` scores a student row and its teacher row with one decoder pass over
what they share: the teacher's row is the student's context, then the hindsight block, then the
same response (segments.py), so the teacher continues from the student's cache and pays only for
its block and the response.

Precision: with bf16 base weights the decoder runs under bf16 autocast; the output head, the
log-softmax and every loss term run in float32. Loading the model is infra/models.py's job.
"""
from __future__ import annotations

import contextlib
import inspect

import torch
import torch.utils.checkpoint
from tqdm.auto import tqdm
from transformers import GenerationConfig

from errors import UserError
from segments import Row, Step, Trajectory, collate_rows, generation_prompt_ids, length_batches, shared_prefix_len


def autocast(model):
    """bf16 autocast for a model whose base weights are bf16 (LoRA weights stay float32); a no-op in float32."""
    weight = model.get_input_embeddings().weight
    return torch.autocast(weight.device.type, dtype=torch.bfloat16, enabled=weight.dtype == torch.bfloat16)



# ----------------------------------------------------------------------------- log-probs
def head_logprobs(model, hidden: torch.Tensor, targets: torch.Tensor, length: torch.Tensor, temperature: float = 1.0,
                  max_logit_elems: int = 2**26) -> torch.Tensor:
    """log softmax(lm_head(h) / temperature)[target], in float32, T-chunk by T-chunk: (B, T), 0 past `length`.

    hidden (B, T, H): the hidden state before each response token; targets (B, T): the tokens;
    length (B,): response tokens per row. At most `max_logit_elems` float32 logits exist at a time.
    A head whose weights are not float32 (bf16 or a 4-bit model's bf16 head: 152064 x 3584 is 2 GiB in
    float32) is never copied whole: the log-softmax's normaliser is summed over vocabulary chunks, each made
    float32 in turn and, under autograd, recomputed in the backward pass instead of kept (_head_logsumexp).
    """
    B, T = targets.shape
    head = model.get_output_embeddings()
    weight, bias = head.weight, head.bias  # (V, H), (V,) or None
    V = weight.shape[0]
    chunk = max(1, max_logit_elems // (B * V))
    pieces = []
    with torch.autocast(hidden.device.type, enabled=False):  # float32 from here on
        for s in range(0, T, chunk):
            h, y = hidden[:, s : s + chunk].float(), targets[:, s : s + chunk]  # (B, c, H), (B, c)
            if weight.dtype == torch.float32:  # the whole head at once: no copy is made
                logits = torch.nn.functional.linear(h, weight, bias) / temperature  # (B, c, V)
                pieces.append(logits.log_softmax(-1).gather(-1, y[..., None]).squeeze(-1))  # (B, c)
                continue
            target = (h * weight[y].float()).sum(-1) + (0.0 if bias is None else bias[y].float())  # (B, c) logit
            pieces.append(target / temperature - _head_logsumexp(h, weight, bias, temperature, max_logit_elems))
    logp = torch.cat(pieces, dim=1)  # (B, T)
    valid = torch.arange(T, device=targets.device)[None, :] < length[:, None]  # (B, T) True = a real response token
    return torch.where(valid, logp, torch.zeros_like(logp))  # (B, T)


def _head_logsumexp(h: torch.Tensor, weight: torch.Tensor, bias, temperature: float, max_logit_elems: int) -> torch.Tensor:
    """logsumexp over the vocabulary of linear(h, weight, bias) / temperature, (B, c), in float32, the vocabulary
    in chunks of at most max_logit_elems logits; under autograd each chunk is recomputed in backward (checkpoint),
    so no float32 copy of the head and no (B, c, V) logits are kept for it."""
    rows = max(1, max_logit_elems // max(h.shape[0] * h.shape[1], 1))

    def part(h, w, b):
        return (torch.nn.functional.linear(h, w.float(), None if b is None else b.float()) / temperature).logsumexp(-1)

    grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    parts = [torch.utils.checkpoint.checkpoint(part, h, weight[v : v + rows], None if bias is None else bias[v : v + rows],
                                               use_reentrant=False) if grad else
             part(h, weight[v : v + rows], None if bias is None else bias[v : v + rows])
             for v in range(0, weight.shape[0], rows)]  # each (B, c)
    return torch.logsumexp(torch.stack(parts, -1), -1)  # (B, c)


def response_states(hidden: torch.Tensor, input_ids: torch.Tensor, start: torch.Tensor, T: int):
    """(the hidden states that predict each response token (B, T, H), those tokens (B, T)).

    The [:, 1:] shift: the hidden state at position p predicts the token at p + 1, so the j-th
    response token (at start + j) is scored from the hidden state at start + j - 1.
    """
    L = input_ids.shape[1]
    offsets = torch.arange(T, device=input_ids.device)[None, :]  # (1, T)
    pred_pos = (start[:, None] - 1 + offsets).clamp(max=L - 2)  # (B, T) (padding positions clamped, zeroed later)
    targets = input_ids.gather(1, pred_pos + 1)  # (B, T)
    return hidden.gather(1, pred_pos[..., None].expand(-1, -1, hidden.shape[-1])), targets  # (B, T, H), (B, T)


def response_logprobs(
    model, batch: dict[str, torch.Tensor], temperature: float = 1.0, max_logit_elems: int = 2**26
) -> torch.Tensor:
    """log pi(x_t | x_<t) of every response token, response-aligned: (B, T), 0 on padding.

    batch: collate_rows output on the model's device. temperature: the one the tokens were
    sampled at (logits / T, as verl does), so the log-probs are those of the sampling policy.
    The decoder runs once over the rows (bf16 autocast when the base weights are bf16); the
    output head and log-softmax run in float32 only on the hidden states that predict response
    tokens (head_logprobs).
    """
    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]  # (B, L), (B, L)
    start, length = batch["response_start"], batch["response_len"]  # (B,), (B,)
    with autocast(model):
        hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask,
                                     use_cache=False).last_hidden_state  # (B, L, H) no KV cache: nothing decodes after
    h, targets = response_states(hidden, input_ids, start, int(length.max()))  # (B, T, H), (B, T)
    return head_logprobs(model, h, targets, length, temperature, max_logit_elems)  # (B, T)


def rows_logprobs(model, rows: list[Row], pad_id: int, micro_batch_rows: int, temperature: float, T: int,
                  desc: str = "log-probs", only: torch.Tensor | None = None) -> torch.Tensor:
    """No-grad response log-probs of many rows, micro-batch by micro-batch: (B, T).
    only (B,) bool: compute just those rows; the others stay 0."""
    device = model.get_input_embeddings().weight.device
    out = torch.zeros(len(rows), T)
    picked = [b for b in range(len(rows)) if only is None or only[b]]
    with torch.no_grad():
        for part in tqdm(length_batches(picked, rows, micro_batch_rows), desc=desc, unit="batch", leave=False):
            batch = {k: v.to(device) for k, v in collate_rows([rows[b] for b in part], pad_id).items()}
            logp = response_logprobs(model, batch, temperature=temperature).float().cpu()  # (b, t)
            out[part, : logp.shape[1]] = logp
    return out


def student_teacher_logprobs(model, rows: list[Row], teacher_rows: list[Row | None], pad_id: int, micro_batch_rows: int,
                             temperature: float, T: int, student: torch.Tensor, taught: torch.Tensor,
                             desc: str = "log-probs", watch=None) -> tuple[torch.Tensor, torch.Tensor]:
    """No-grad response log-probs of the `student` rows and of the `taught` rows' teacher rows: (B, T) each.

    A teacher row is its student row's context, then the hindsight block, then the same response
    (segments.py), so the two share a prefix (segments.shared_prefix_len). Per micro-batch, one
    decoder pass over the student rows, laid out so that every shared prefix ends at the same
    column Lc (left padding before it; the rest of the row, then right padding, after it), keeps
    its KV cache; the teacher rows continue from that cache cut back to Lc: only their block,
    header and response are computed. Position ids count real tokens, so left padding moves
    nothing. Rows outside `student` stay 0, and so do teacher rows outside `taught`; `taught`
    must lie within `student` (the teacher reads the student pass's cache). watch: a stopwatch
    (`with watch("student"):`, infra/metrics.py) that gets each part's seconds.
    """
    watch = watch or (lambda name: contextlib.nullcontext())
    if bool((taught & ~student).any()):
        raise ValueError("student_teacher_logprobs: a taught row must also be a student row (it reads its cache)")
    device = model.get_input_embeddings().weight.device
    logp_student, logp_teacher = torch.zeros(len(rows), T), torch.zeros(len(rows), T)  # (B, T), (B, T)
    picked = [b for b in range(len(rows)) if student[b]]
    decoder = model.get_decoder()
    with torch.no_grad(), autocast(model):
        for part in tqdm(length_batches(picked, rows, micro_batch_rows), desc=desc, unit="batch", leave=False):
            shared = [shared_prefix_len(rows[b], teacher_rows[b]) if taught[b] else rows[b].num_prompt - 1 for b in part]
            Lc = max(shared)
            Ls = max(len(rows[b].input_ids) - n for b, n in zip(part, shared))
            ids = torch.full((len(part), Lc + Ls), pad_id, dtype=torch.long)  # (b, Lc + Ls)
            mask = torch.zeros_like(ids)  # (b, Lc + Ls) 1 = real token
            for j, (b, n) in enumerate(zip(part, shared)):
                row = rows[b].input_ids
                ids[j, Lc - n : Lc + len(row) - n], mask[j, Lc - n : Lc + len(row) - n] = torch.tensor(row), 1
            with watch("student"):
                ids, mask = ids.to(device), mask.to(device)
                out = decoder(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                              use_cache=True)  # (b, Lc + Ls, H) and the KV cache
                start = torch.tensor([Lc + rows[b].num_prompt - n for b, n in zip(part, shared)], device=device)  # (b,)
                length = torch.tensor([len(rows[b].response_ids) for b in part], device=device)  # (b,)
                h, targets = response_states(out.last_hidden_state, ids, start, int(length.max()))  # (b, t, H), (b, t)
                logp = head_logprobs(model, h, targets, length, temperature).cpu()  # (b, t)
                logp_student[part, : logp.shape[1]] = logp
            keep = [j for j, b in enumerate(part) if taught[b]]
            if keep:
                with watch("teacher"):
                    logp_teacher[[part[j] for j in keep]] = _teacher_tails(
                        model, _cache_of(out), mask[:, :Lc], keep, [teacher_rows[b] for b in part], shared, length,
                        pad_id, temperature, T, Ls)
    return logp_student, logp_teacher


def _cache_argument(model) -> str:
    """The decoder's name for the KV cache: `cache` (transformers 5.24) or `past_key_values` (earlier 5.x)."""
    return "cache" if "cache" in inspect.signature(model.get_decoder().forward).parameters else "past_key_values"


def _cache_of(out):
    """The KV cache a decoder pass returned, under either name (see _cache_argument)."""
    return out["cache"] if "cache" in out.keys() else out["past_key_values"]


def _teacher_tails(model, cache, ctx_mask, keep: list[int], teacher_rows: list[Row], shared: list[int],
                   length: torch.Tensor, pad_id: int, temperature: float, T: int, Ls: int) -> torch.Tensor:
    """The teacher rows `keep` of one micro-batch, continued from its student pass's cache (Lc + Ls
    positions; ctx_mask (b, Lc): the shared contexts' real tokens): only block, header and
    response are computed. Returns (k, T) response log-probs."""
    device = ctx_mask.device
    cache.crop(-Ls)  # back to the shared contexts (a negative count removes tokens, in every version)
    cache.batch_select_indices(torch.tensor(keep, device=device))  # the taught rows only
    tails = [teacher_rows[j].input_ids[shared[j] :] for j in keep]  # block, header, response
    Lt = max(len(t) for t in tails)
    tail_ids = torch.full((len(keep), Lt), pad_id, dtype=torch.long)  # (k, Lt) right-padded
    tail_mask = torch.zeros_like(tail_ids)  # (k, Lt) 1 = real token
    for i, t in enumerate(tails):
        tail_ids[i, : len(t)], tail_mask[i, : len(t)] = torch.tensor(t), 1
    tail_ids, tail_mask = tail_ids.to(device), tail_mask.to(device)
    n_ctx = torch.tensor([shared[j] for j in keep], device=device)  # (k,) real context tokens before each tail
    out = model.get_decoder()(
        input_ids=tail_ids, attention_mask=torch.cat([ctx_mask[keep], tail_mask], dim=1),  # (k, Lc + Lt)
        position_ids=n_ctx[:, None] + torch.arange(Lt, device=device)[None, :],  # (k, Lt) after the context
        use_cache=True, **{_cache_argument(model): cache})  # (k, Lt, H)
    start = torch.tensor([teacher_rows[j].num_prompt - shared[j] for j in keep], device=device)  # (k,)
    t_len = length[keep]  # (k,) the same responses as the student rows
    h, targets = response_states(out.last_hidden_state, tail_ids, start, int(t_len.max()))  # (k, t, H), (k, t)
    logp = head_logprobs(model, h, targets, t_len, temperature).cpu()  # (k, t)
    return torch.nn.functional.pad(logp, (0, T - logp.shape[1]))  # (k, T)


# ----------------------------------------------------------------------------- sampling
def sampling_config(tokenizer, model, max_new_tokens: int, temperature: float = 1.0):
    """Sample from the policy itself: top_p 1, top_k 0, no repetition penalty; temperature 0 = greedy.

    Installed as the model's own generation_config, so that no default of the model's
    (Qwen ships top_p 0.8, top_k 20, repetition penalty 1.05) can be merged back in.
    """
    eos = {tokenizer.eos_token_id}
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        eos.add(im_end)
    model_eos = getattr(model.generation_config, "eos_token_id", None)
    eos |= set(model_eos if isinstance(model_eos, list) else [model_eos] if model_eos is not None else [])
    greedy = temperature == 0
    return GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=not greedy, temperature=None if greedy else temperature,
        top_p=None if greedy else 1.0, top_k=None if greedy else 0, min_p=None, typical_p=None,
        repetition_penalty=1.0, eos_token_id=sorted(eos), pad_token_id=tokenizer.pad_token_id, use_cache=True,
    )


def until_end_of_turn(ids: list[int], eos) -> list[int]:
    """The sampled ids up to and including the first end-of-turn id (all of them when none came)."""
    end = next((j + 1 for j, tok in enumerate(ids) if tok in eos), len(ids))
    return ids[:end]


class ModelPolicy:
    """The LLM policy as an actor: one batched generate over all live episodes per turn (batch > 0: over at
    most `batch` of them at a time, which bounds the memory of generate's prefill and KV cache)."""

    def __init__(self, model, tokenizer, max_new_tokens: int = 256, temperature: float = 1.0, batch: int = 0):
        self.model, self.tokenizer, self.batch = model, tokenizer, batch
        self.config = sampling_config(tokenizer, model, max_new_tokens, temperature)
        model.generation_config = self.config
        self.eos = set(self.config.eos_token_id)
        self.tokens_generated = 0

    @contextlib.contextmanager
    def serving(self, model, iteration: int):
        """One rollout of train.py: the model decodes with this policy's sampling rule (an evaluation may
        have installed another), and tokens_generated counts this rollout's tokens. (vllm_rollout's
        policy hands the adapter of this moment to its engine here.)"""
        self.model.generation_config, self.tokens_generated = self.config, 0
        yield self

    @torch.no_grad()
    def act(self, contexts: list[list[dict]], states) -> list[tuple[list[int], list[int], str]]:
        """(prompt ids, sampled response ids, response text) for each context."""
        prompts = [generation_prompt_ids(self.tokenizer, m) for m in contexts]
        size = self.batch or len(prompts)
        return [r for s in range(0, len(prompts), size) for r in self._generate(prompts[s : s + size])]

    def _generate(self, prompts: list[list[int]]) -> list[tuple[list[int], list[int], str]]:
        B, L = len(prompts), max(len(p) for p in prompts)
        device = self.model.get_input_embeddings().weight.device
        input_ids = torch.full((B, L), self.tokenizer.pad_token_id, dtype=torch.long)  # (B, L) left-padded
        attention_mask = torch.zeros((B, L), dtype=torch.long)  # (B, L)
        for b, p in enumerate(prompts):
            input_ids[b, L - len(p) :] = torch.tensor(p)
            attention_mask[b, L - len(p) :] = 1
        was_training = self.model.training
        self.model.eval()
        with autocast(self.model):  # bf16 weights: LoRA too in bf16 while sampling
            out = self.model.generate(
                input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), generation_config=self.config
            )  # (B, L + new)
        self.model.train(was_training)
        results = []
        for b in range(B):
            response = until_end_of_turn(out[b, L:].tolist(), self.eos)
            self.tokens_generated += len(response)
            results.append((prompts[b], response, self.tokenizer.decode(response, skip_special_tokens=True)))
        return results


# ----------------------------------------------------------------------------- episodes
def play_episodes(
    env, task_ids: list[str], policy, history_len: int | None = 2, groups: list[int] | None = None, desc: str = "rollout"
) -> list[Trajectory]:
    """Play one episode per task id, all in one batch, until each is won or out of steps.

    policy.act(contexts, states) returns (prompt ids, response ids, text) per live episode.
    groups: the group index of each episode (default: its position). Returns the trajectories
    in task_ids order, each step holding exactly the ids that were fed and sampled.
    """
    states = env.reset(task_ids)
    groups = list(range(len(task_ids))) if groups is None else groups
    trajs = [Trajectory(t, g, s.task_type) for t, g, s in zip(task_ids, groups, states)]
    history: list[list[tuple[str, str]]] = [[] for _ in task_ids]
    anchors = [s.observation for s in states]  # the state each episode is in; an invalid answer leaves it
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
            trajs[i].steps.append(Step(context, prompt_ids, response_ids, text, res.action, res.reward, anchors[i],
                                       states[i].expert_action))
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
        raise UserError("no episode played a step: every one ended in an env crash (the warnings above name the games)")
    return trajs
