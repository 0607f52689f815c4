"""[speed] The fast versions of rollout.py's log-prob passes: the same numbers to float rounding, faster.

A reader of the method may skip this file: rollout.py computes the same log-probs plainly, one
forward per row (`python train.py --plain` runs only that path; tests/test_logprobs.py checks the
two agree to 1e-5 in float32). What is done here for speed and memory:
  - rows are batched `micro_batch_rows` at a time, padded, with attention masks and position ids
    that make the padding move nothing;
  - the student's and its teacher's rows share a prefix (segments.shared_prefix_len: the student's
    context, and in ChatML the next turn's opening token): one decoder pass over the student rows
    keeps its KV cache, and the teacher rows continue from it, computing only their tail (the rest of
    the block's turn, the header and the response); student rows with the same context (a group's
    first step) have it computed once, the others continuing from that cache too;
  - the layers below the first one the update trains (--lora-layers) never change: the student pass
    keeps each row's input to that layer, and the update's passes (and the KL's reference) start
    there, computing only the layers it trains (`kept_input`);
  - the output head and log-softmax run only on the hidden states that predict response tokens,
    in float32, in chunks, so that the (B, L, V) float32 logits never exist at once, and a head whose
    weights are not float32 is never copied to float32 whole.
  - in the rollouts, the episodes of a group start from the same prompt and keep sharing its task
    and older history: each prompt prefix shared by several rows of a generate call is prefilled
    once (as vLLM's prefix caching does), then each row's remainder after it, one row at a time, so
    that no padding is prefilled; rollout.decode continues from that cache and samples as before;
  - while generate decodes, the KV cache is written in place (InPlaceLayer) instead of concatenated,
    and the frozen linears compute on their weights packed once for the CPU's kernels (packed_linears).
`FastPath` has rollout.py's log-prob functions and `generate` as methods, under the same names and
signatures (called with keywords); train.py uses one in place of rollout.py unless --plain is given.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
from dataclasses import dataclass, field

import torch
import torch.utils.checkpoint
from tqdm.auto import tqdm
from transformers.cache_utils import DynamicLayer

from rollout import autocast, cache_keyword, decode, left_padded
from segments import Row, Rows, length_batches, shared_prefix_len


KEEP_BYTES = 2**30  # the student pass keeps at most 1 GiB of first-trained-layer inputs


@dataclass
class FastPath:
    """[speed] rollout.py's log-prob functions and `generate`, batched: `micro_batch_rows` rows a
    pass, padded with `pad_id`. Each method has the signature of the rollout.py function of the same
    name and returns the same numbers, to float rounding."""

    pad_id: int
    micro_batch_rows: int = 4
    kept: dict = field(default_factory=dict)  # id(row) -> (row, its input to layer kept_layer)
    kept_layer: int = 0  # the first trained layer, found as the student pass kept the inputs to it
    packed: dict = field(default_factory=dict)  # id(linear) -> (its weight, version, packed): generate's

    def __post_init__(self):
        keep_freed_memory()

    def micro_batch_logprobs(self, model, rows: list[Row], temperature: float = 1.0) -> torch.Tensor:
        """rollout.micro_batch_logprobs: one padded pass over the rows; (b, t) on the model's device. Rows
        whose input to the first trained layer the student pass kept start there (kept_input)."""
        device = model.get_input_embeddings().weight.device
        batch = {k: v.to(device) for k, v in collate_rows(rows, self.pad_id).items()}
        batch["kept"] = self.kept_input(rows, batch["input_ids"].shape[1], device)
        return response_logprobs(model, batch, temperature=temperature).float()  # (b, t)

    def keep(self, row: Row, states: torch.Tensor) -> None:
        """Keep a row's input to the first trained layer (len, H), on the CPU, while all kept stay
        within KEEP_BYTES (a row beyond it takes the whole pass). A copy: the micro-batch's padded
        states are not held through it, and its bytes are what it counts."""
        held = sum(h.nbytes for _, h in self.kept.values())
        if held + states.nbytes <= KEEP_BYTES:
            self.kept[id(row)] = (row, states.to("cpu", copy=True))

    def kept_input(self, rows: list[Row], L: int, device) -> tuple[int, torch.Tensor] | None:
        """(the first trained layer, the rows' kept inputs to it right-padded with zeros to L:
        (b, L, H) on `device`), or None unless every row has one. The layers below it hold no
        trained weight, so these are what a pass over those layers would compute now, to float
        rounding. The layer is the one found when they were kept, not asked of the model again:
        with the adapter off (the KL's reference pass) peft marks no weight as trained, and a
        reference that took the whole pass would differ from the update's by rounding, its KL
        gradient not exactly 0."""
        first = self.kept_layer
        if not rows or first == 0 or not all(id(row) in self.kept for row in rows):
            return None
        states = [self.kept[id(row)][1] for row in rows]  # (len, H) each
        out = states[0].new_zeros(len(rows), L, states[0].shape[-1])  # (b, L, H)
        for b, h in enumerate(states):
            out[b, : h.shape[0]] = h
        return first, out.to(device)

    def pass_logprobs(self, model, rows: list[Row | None], T: int, temperature: float = 1.0,
                      only: torch.Tensor | None = None, desc: str = "log-probs") -> torch.Tensor:
        """rollout.pass_logprobs, micro-batch by micro-batch: (B, T), rows outside `only` 0."""
        device = model.get_input_embeddings().weight.device
        out = torch.zeros(len(rows), T)
        picked = [b for b in range(len(rows)) if only is None or only[b]]
        with torch.no_grad():
            for part in tqdm(length_batches(picked, rows, self.micro_batch_rows), desc=desc, unit="batch", leave=False):
                batch = {k: v.to(device) for k, v in collate_rows([rows[b] for b in part], self.pad_id).items()}
                logp = response_logprobs(model, batch, temperature=temperature).float().cpu()  # (b, t)
                out[part, : logp.shape[1]] = logp
        return out

    def generate(self, model, prompts: list[list[int]], config) -> list[list[int]]:
        """rollout.generate (the same sampling config), each shared prompt prefix prefilled once and no
        padding prefilled (shared_prefix_generate), the frozen linears on weights packed once
        (packed_linears)."""
        with packed_linears(model, self.packed):
            return shared_prefix_generate(model, prompts, config, self.pad_id)

    def student_teacher_logprobs(self, model, rows: Rows, student: torch.Tensor, taught: torch.Tensor,
                                 temperature: float = 1.0, desc: str = "log-probs",
                                 watch=None) -> tuple[torch.Tensor, torch.Tensor]:
        """rollout.student_teacher_logprobs, the teacher rows continuing the student rows' KV cache.

        A teacher row is its student row's context, then the hindsight block, then the same response
        (segments.py), so the two share a prefix (segments.shared_prefix_len). Per micro-batch, one
        decoder pass over the student rows, laid out so that every shared prefix ends at the same
        column Lc (left padding before it; the rest of the row, then right padding, after it), keeps
        its KV cache; the teacher rows continue from that cache cut back to Lc: only their block,
        header and response are computed. Student rows with the same context (a group's first step:
        its episodes start from one prompt) have it computed once: the pass runs over the first of
        them, the others continue from its cache as the teacher rows do (_tails). Position ids count
        real tokens, so left padding moves nothing. `taught` must lie within `student` (the teacher
        reads the student pass's cache).
        """
        watch = watch or (lambda name: contextlib.nullcontext())
        if bool((taught & ~student).any()):
            raise ValueError("student_teacher_logprobs: a taught row must also be a student row (it reads its cache)")
        rows, teacher_rows, T = rows.rows, rows.teacher_rows, rows.response_mask.shape[1]
        device = model.get_input_embeddings().weight.device
        logp_student, logp_teacher = torch.zeros(len(rows), T), torch.zeros(len(rows), T)  # (B, T), (B, T)
        picked = [b for b in range(len(rows)) if student[b]]
        decoder = model.get_decoder()
        self.kept.clear()  # the last iteration's rows
        self.kept_layer = first = first_trained_layer(model)  # 0: every layer trains, nothing to keep
        with torch.no_grad(), autocast(model):
            for part in tqdm(length_batches(picked, rows, self.micro_batch_rows), desc=desc, unit="batch", leave=False):
                mine = [rows[b] for b in part]  # the micro-batch's student rows
                shared = [shared_prefix_len(rows[b], teacher_rows[b]) if taught[b] else rows[b].num_prompt - 1
                          for b in part]
                contexts = [row.input_ids[:n] for row, n in zip(mine, shared)]
                source = [contexts.index(c) for c in contexts]  # the micro-batch's first row with the same context
                firsts = [j for j, s in enumerate(source) if s == j]  # the rows whose pass computes their context
                copies = [j for j, s in enumerate(source) if s != j]  # the others (a group's first step: one prompt)
                place = {j: i for i, j in enumerate(firsts)}  # a first row -> its row of the pass and of the cache
                Lc = max(shared)
                Ls = max(len(mine[j].input_ids) - shared[j] for j in firsts)
                ids = torch.full((len(firsts), Lc + Ls), self.pad_id, dtype=torch.long)  # (u, Lc + Ls)
                mask = torch.zeros_like(ids)  # (u, Lc + Ls) 1 = real token
                for i, j in enumerate(firsts):
                    row, n = mine[j].input_ids, shared[j]
                    ids[i, Lc - n : Lc - n + len(row)], mask[i, Lc - n : Lc - n + len(row)] = torch.tensor(row), 1
                with watch("student"):
                    ids, mask = ids.to(device), mask.to(device)
                    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (u, Lc + Ls) real tokens before each
                    with inputs_to(decoder.layers[first] if first else None) as seen:
                        out = decoder(input_ids=ids, attention_mask=mask, position_ids=positions,
                                      use_cache=True)  # (u, Lc + Ls, H) and the KV cache
                    if seen:  # each row's real tokens, as they enter the first trained layer
                        for i, j in enumerate(firsts):
                            self.keep(mine[j], seen[0][i, Lc - shared[j] : Lc - shared[j] + len(mine[j].input_ids)])
                    start = torch.tensor([Lc - shared[j] + mine[j].num_prompt for j in firsts], device=device)  # (u,)
                    length = torch.tensor([len(mine[j].response_ids) for j in firsts], device=device)  # (u,)
                    h, targets = response_states(out.last_hidden_state, ids, start, int(length.max()))  # (u, t, H)
                    logp = head_logprobs(model, h, targets, length, temperature).cpu()  # (u, t)
                    logp_student[[part[j] for j in firsts], : logp.shape[1]] = logp
                    cache = out[cache_keyword(model)]
                    cache.crop(-Ls)  # back to the contexts (a negative count removes tokens, in every version)
                    held = [(layer.keys, layer.values) for layer in cache.layers]  # (u, heads, Lc, D) each
                    if copies:  # only the rest of each row: the turn's header and the response
                        reads = [place[source[j]] for j in copies]
                        logp, tails = _tails(model, cache, mask[:, :Lc], reads, [mine[j] for j in copies],
                                             [shared[j] for j in copies], self.pad_id, temperature, T, first)
                        logp_student[[part[j] for j in copies]] = logp
                        if seen:  # the context's inputs, from its first row's pass, then the tail's
                            for i, (j, u) in enumerate(zip(copies, reads)):
                                n = shared[j]
                                self.keep(mine[j], torch.cat([seen[0][u, Lc - n : Lc],
                                                              tails[i, : len(mine[j].input_ids) - n]]))
                keep = [j for j, b in enumerate(part) if taught[b]]
                if keep:
                    with watch("teacher"):
                        for layer, (keys, values) in zip(cache.layers, held):  # the contexts alone again
                            layer.keys, layer.values = keys, values
                        logp, _ = _tails(model, cache, mask[:, :Lc], [place[source[j]] for j in keep],
                                         [teacher_rows[part[j]] for j in keep], [shared[j] for j in keep], self.pad_id,
                                         temperature, T)
                        logp_teacher[[part[j] for j in keep]] = logp
        return logp_student, logp_teacher


# ----------------------------------------------------------------------------- the output head, in chunks
def head_chunks(B: int, T: int, V: int, H: int, max_logit_elems: int = 2**26,
                max_head_elems: int = 2**26) -> tuple[int, int]:
    """(response positions a chunk, vocabulary rows a chunk) for a head of V x H over (B, T) states:
    at most max_logit_elems float32 logits and max_head_elems float32 head weights (2^26: 256 MiB
    each) exist at a time. Qwen2.5-7B's head (152,064 x 3,584) is 2 GiB in float32: 9 slices."""
    positions = max(1, max_logit_elems // (B * V))
    rows = max(1, min(max_logit_elems // max(B * min(positions, T), 1), max_head_elems // H))
    return positions, rows


def head_logprobs(model, hidden: torch.Tensor, targets: torch.Tensor, length: torch.Tensor,
                  temperature: float = 1.0, max_logit_elems: int = 2**26,
                  max_head_elems: int = 2**26) -> torch.Tensor:
    """log softmax(lm_head(h) / temperature)[target] in float32, T-chunk by T-chunk: (B, T), 0 past `length`.

    hidden (B, T, H): the hidden state before each response token; targets (B, T): the tokens;
    length (B,): response tokens per row. At most `max_logit_elems` float32 logits exist at a time.
    A head whose weights are not float32 (bf16 or a 4-bit model's bf16 head: 152064 x 3584 is 2 GiB
    in float32) is never copied whole: the log-softmax's normaliser is summed over vocabulary
    chunks of at most `max_head_elems` weights (head_chunks), each made float32 in turn and, under
    autograd, recomputed in the backward pass instead of kept (_head_logsumexp).
    """
    B, T = targets.shape
    head = model.get_output_embeddings()
    weight, bias = head.weight, head.bias  # (V, H), (V,) or None
    V, H = weight.shape
    chunk, rows = head_chunks(B, T, V, H, max_logit_elems, max_head_elems)
    pieces = []
    with torch.autocast(hidden.device.type, enabled=False):  # float32 from here on
        for s in range(0, T, chunk):
            h, y = hidden[:, s : s + chunk].float(), targets[:, s : s + chunk]  # (B, c, H), (B, c)
            if weight.dtype == torch.float32:  # the whole head at once: no copy is made
                logits = torch.nn.functional.linear(h, weight, bias) / temperature  # (B, c, V)
                pieces.append(logits.log_softmax(-1).gather(-1, y[..., None]).squeeze(-1))  # (B, c)
                continue
            bias_y = 0.0 if bias is None else bias[y].float()  # (B, c)
            target = (h * weight[y].float()).sum(-1) + bias_y  # (B, c) the target's logit
            norm = _head_logsumexp(h, weight, bias, temperature, rows)  # (B, c)
            pieces.append(target / temperature - norm)
    logp = torch.cat(pieces, dim=1)  # (B, T)
    valid = torch.arange(T, device=targets.device)[None, :] < length[:, None]  # (B, T) a response token
    return torch.where(valid, logp, torch.zeros_like(logp))  # (B, T)


def _head_logsumexp(h: torch.Tensor, weight: torch.Tensor, bias, temperature: float,
                    rows: int) -> torch.Tensor:
    """logsumexp over the vocabulary of linear(h, weight, bias) / temperature, (B, c), in float32,
    the vocabulary `rows` at a time (head_chunks); under autograd each chunk is recomputed in
    backward (checkpoint), so no float32 copy of the head and no (B, c, V) logits are kept for it."""

    def part(h, w, b):
        return (torch.nn.functional.linear(h, w.float(), None if b is None else b.float()) / temperature).logsumexp(-1)

    grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    parts = []
    for v in range(0, weight.shape[0], rows):
        w, b = weight[v : v + rows], None if bias is None else bias[v : v + rows]
        parts.append(torch.utils.checkpoint.checkpoint(part, h, w, b, use_reentrant=False) if grad else part(h, w, b))
    return torch.logsumexp(torch.stack(parts, -1), -1)  # (B, c)


def response_states(hidden: torch.Tensor, input_ids: torch.Tensor, start: torch.Tensor, T: int):
    """(the hidden states that predict each response token (B, T, H), those tokens (B, T)).

    The [:, 1:] shift: the hidden state at position p predicts the token at p + 1, so the j-th
    response token (at start + j) is scored from the hidden state at start + j - 1.
    """
    L = input_ids.shape[1]
    offsets = torch.arange(T, device=input_ids.device)[None, :]  # (1, T)
    pred_pos = (start[:, None] - 1 + offsets).clamp(max=L - 2)  # (B, T) (padding clamped, zeroed later)
    targets = input_ids.gather(1, pred_pos + 1)  # (B, T)
    states = hidden.gather(1, pred_pos[..., None].expand(-1, -1, hidden.shape[-1]))  # (B, T, H)
    return states, targets


# ----------------------------------------------------------------------------- batched rows
def collate_rows(rows: list[Row], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad rows into tensors for one forward pass.

    Returns input_ids and attention_mask (B, L) over the whole row, and the response
    layout: response_start (B,) and response_len (B,), from which model log-probs are
    gathered into response-aligned (B, T) tensors (T = longest response).
    """
    B, L = len(rows), max(len(r.input_ids) for r in rows)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)  # (B, L)
    attention_mask = torch.zeros((B, L), dtype=torch.long)  # (B, L), 1 = real token
    for b, r in enumerate(rows):
        input_ids[b, : len(r.input_ids)] = torch.tensor(r.input_ids)
        attention_mask[b, : len(r.input_ids)] = 1
    response_start = torch.tensor([r.num_prompt for r in rows])  # (B,)
    response_len = torch.tensor([len(r.input_ids) - r.num_prompt for r in rows])  # (B,)
    return dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_start=response_start,
        response_len=response_len,
    )


def response_logprobs(
    model, batch: dict[str, torch.Tensor], temperature: float = 1.0, max_logit_elems: int = 2**26
) -> torch.Tensor:
    """log pi(x_t | x_<t) of every response token, response-aligned: (B, T), 0 on padding.

    batch: collate_rows output on the model's device (right-padded rows). temperature: the one the
    tokens were sampled at. The decoder runs once over the rows (bf16 autocast when the base
    weights are bf16); the output head and log-softmax run in float32 only on the hidden states
    that predict response tokens (head_logprobs).
    """
    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]  # (B, L), (B, L)
    start, length = batch["response_start"], batch["response_len"]  # (B,), (B,)
    decoder, kept = model.get_decoder(), batch.get("kept")  # (first layer, (B, L, H)) or None: kept_input
    with autocast(model):
        if kept is None:
            hidden = decoder(input_ids=input_ids, attention_mask=attention_mask,
                             use_cache=False).last_hidden_state  # (B, L, H) nothing decodes after
        else:  # start at the first trained layer, from the kept inputs
            first, states = kept
            with layers_from(decoder, first):
                hidden = decoder(inputs_embeds=states, attention_mask=attention_mask,
                                 use_cache=False).last_hidden_state  # (B, L, H)
    h, targets = response_states(hidden, input_ids, start, int(length.max()))  # (B, T, H), (B, T)
    return head_logprobs(model, h, targets, length, temperature, max_logit_elems)  # (B, T)


def first_trained_layer(model) -> int:
    """The index of the decoder's first layer holding a trained weight; 0 when the embeddings train
    or no layer does (nothing below it to keep)."""
    decoder = model.get_decoder()
    if any(p.requires_grad for p in decoder.get_input_embeddings().parameters()):
        return 0
    return next((i for i, layer in enumerate(decoder.layers)
                 if any(p.requires_grad for p in layer.parameters())), 0)


@contextlib.contextmanager
def inputs_to(layer):
    """A list that receives the hidden states `layer` (None: no layer) is called with while open."""
    seen = []
    hook = layer and layer.register_forward_pre_hook(lambda module, args: seen.append(args[0].detach()))
    try:
        yield seen
    finally:
        hook and hook.remove()


@contextlib.contextmanager
def layers_from(decoder, first: int):
    """The decoder with only its layers `first`, `first` + 1, ... while open: its forward, given the
    input to layer `first` as inputs_embeds, computes only those (mask, positions and norm as usual).
    The config's layer_types (Qwen2 picks each layer's attention mask from them by position) are cut
    alike."""
    layers, types = decoder.layers, getattr(decoder.config, "layer_types", None)
    decoder.layers = torch.nn.ModuleList(list(layers)[first:])
    if types is not None:
        decoder.config.layer_types = types[first:]
    try:
        yield decoder
    finally:
        decoder.layers = layers
        if types is not None:
            decoder.config.layer_types = types


def _tails(model, cache, ctx_mask, sources: list[int], rows: list[Row], shared: list[int], pad_id: int,
           temperature: float, T: int, first: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rows continued from the contexts of one micro-batch's student pass (cache: their KV, cut back to the
    Lc context columns; ctx_mask (u, Lc): their real tokens): row i reads context sources[i], whose real
    tokens are its own first shared[i] ids, and only its tail is computed: a teacher row's block, header and
    response; a student row's header and response where an earlier row's pass computed their context.
    Returns ((k, T) response log-probs, each tail's input to layer `first` (k, Lt, H); None if first is 0)."""
    device = ctx_mask.device
    cache.batch_select_indices(torch.tensor(sources, device=device))  # a context for each row, repeated as needed
    tails = [row.input_ids[n:] for row, n in zip(rows, shared)]
    Lt = max(len(t) for t in tails)
    tail_ids = torch.full((len(rows), Lt), pad_id, dtype=torch.long)  # (k, Lt) right-padded
    tail_mask = torch.zeros_like(tail_ids)  # (k, Lt) 1 = real token
    for i, t in enumerate(tails):
        tail_ids[i, : len(t)], tail_mask[i, : len(t)] = torch.tensor(t), 1
    tail_ids, tail_mask = tail_ids.to(device), tail_mask.to(device)
    n_ctx = torch.tensor(shared, device=device)  # (k,) real context tokens before each tail
    decoder = model.get_decoder()
    with inputs_to(decoder.layers[first] if first else None) as seen:
        out = decoder(
            input_ids=tail_ids, attention_mask=torch.cat([ctx_mask[sources], tail_mask], dim=1),  # (k, Lc + Lt)
            position_ids=n_ctx[:, None] + torch.arange(Lt, device=device)[None, :],  # (k, Lt) after the context
            use_cache=True, **{cache_keyword(model): cache})  # (k, Lt, H)
    start = torch.tensor([row.num_prompt - n for row, n in zip(rows, shared)], device=device)  # (k,)
    t_len = torch.tensor([len(row.response_ids) for row in rows], device=device)  # (k,)
    h, targets = response_states(out.last_hidden_state, tail_ids, start, int(t_len.max()))  # (k, t, H), (k, t)
    logp = head_logprobs(model, h, targets, t_len, temperature).cpu()  # (k, t)
    return torch.nn.functional.pad(logp, (0, T - logp.shape[1])), (seen[0] if seen else None)  # (k, T)


# ----------------------------------------------------------------------------- rollouts: shared prefixes prefilled once
MIN_SHARED = 16  # tokens two prompts must share to be prefilled as one prefix


def prefix_clusters(prompts: list[list[int]], min_shared: int = MIN_SHARED) -> tuple[list[int], list[int]]:
    """(the cluster of each prompt, each cluster's shared prefix length): a prompt joins the cluster
    it shares most leading tokens with, when that is at least `min_shared` and saves more than the
    cluster's shorter prefix would cost its other members (a group's rows keep their task's prefix
    when another task's prompt shares only the chat template's header); every prefix stops at least
    one token before each member's end, so that generate has a token of each row left to compute
    its first logits from."""
    prefixes: list[list[int]] = []
    members: list[int] = []
    cluster_of = []
    for p in prompts:
        shared = [common_length(q, p) for q in prefixes]  # with each cluster's prefix
        best = max(range(len(prefixes)), key=shared.__getitem__, default=None)
        lost = 0 if best is None else (len(prefixes[best]) - shared[best]) * (members[best] - 1)
        if best is not None and shared[best] >= min_shared and shared[best] > lost:
            prefixes[best] = prefixes[best][: shared[best]]
            members[best] += 1
            cluster_of.append(best)
        else:
            prefixes.append(list(p))
            members.append(1)
            cluster_of.append(len(prefixes) - 1)
    lengths = [min([len(prefixes[c])] + [len(prompts[b]) - 1 for b, k in enumerate(cluster_of) if k == c])
               for c in range(len(prefixes))]
    return cluster_of, lengths


def common_length(a: list[int], b: list[int]) -> int:
    """How many leading ids a and b share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def shared_prefix_generate(model, prompts: list[list[int]], config, pad_id: int,
                           in_place: bool = True) -> list[list[int]]:
    """rollout.generate over `prompts` (config: rollout.sampling_config), each shared prefix prefilled once and
    no padding prefilled; in_place (tools.bench's "before" turns it off): the cache written in place while
    decoding.

    The prefill (prefilled_rows) computes each cluster's prefix once, then each row's remainder but its last
    token after it, one row at a time, and lays the rows' caches out as the plain generate lays out its
    prompts: left-padded to the longest. rollout.decode continues from that cache with each row's last token,
    then decodes as the plain path does. Returns each row's ids after its prompt."""
    device = model.get_input_embeddings().weight.device
    cache = prefilled_rows(model, prompts)  # None: every prompt is one token
    ids, mask = left_padded(prompts, pad_id)  # (B, L) each, as rollout.generate lays them out
    if in_place and cache is not None:  # layer by layer: no layer's states are held twice
        for i, layer in enumerate(cache.layers):
            cache.layers[i] = InPlaceLayer.holding(layer)
    return decode(model, ids.to(device), mask.to(device), config, cache)  # (B, new)


def prefilled_rows(model, prompts: list[list[int]]):
    """[speed] The KV cache of every prompt but its last token, (B, heads, L - 1, D) a layer, each row's
    states right-aligned after zeros (left padding, L the longest prompt): each shared prefix (prefix_clusters)
    computed once, then each row's remainder after it, one row at a time.

    One row at a time, nothing computed is padding: a batched prefill pads every row to the longest
    remainder, and a row's states would sit after the longest prefix, so the padding is computed through
    every layer and every decode step attends over it (one cpu-watch rollout's 5 calls: 34,811 positions
    computed for 12,834 distinct tokens). On a CPU a prefill of a hundred tokens already runs the matrix
    products at their rate, so batching rows gains nothing there (docs/scaling.md)."""
    device = model.get_input_embeddings().weight.device
    decoder, name = model.get_decoder(), cache_keyword(model)
    cluster_of, n = prefix_clusters(prompts)
    W = max(len(p) for p in prompts) - 1  # cached columns
    keys = values = cache = None
    for c, shared in enumerate(n):
        members = [b for b, k in enumerate(cluster_of) if k == c]
        prefix = {}  # the cluster's prefix's cache, computed once
        if shared:
            ids = torch.tensor([prompts[members[0]][:shared]], device=device)  # (1, n_c)
            prefix = {name: decoder(input_ids=ids, use_cache=True)[name]}
        for b in members:
            rest = prompts[b][shared:-1]  # the remainder but its last token
            if rest:
                positions = torch.arange(shared, shared + len(rest), device=device)[None]  # (1, r) after the prefix
                cache = decoder(input_ids=torch.tensor([rest], device=device), position_ids=positions,
                                use_cache=True, **prefix)[name]
            elif shared:
                cache = prefix[name]
            else:
                continue  # a one-token prompt: nothing to cache
            if keys is None:  # a layer's (B, heads, W, D) zeros: the padding's states, masked
                if any(type(layer) is not DynamicLayer for layer in cache.layers):
                    raise ValueError("speed.prefilled_rows lays out full-attention caches only; run with --plain")
                shape = lambda layer: (len(prompts), layer.keys.shape[1], W, layer.keys.shape[-1])  # noqa: E731
                keys, values = ([getattr(layer, part).new_zeros(shape(layer)) for layer in cache.layers]
                                for part in ("keys", "values"))
            held = len(prompts[b]) - 1
            for i, layer in enumerate(cache.layers):
                keys[i][b, :, W - held :], values[i][b, :, W - held :] = layer.keys[0], layer.values[0]
            if shared and rest:
                cache.crop(-len(rest))  # back to the prefix, for the cluster's next row
    if cache is not None:
        for i, layer in enumerate(cache.layers):  # the last row's cache object, holding every row
            layer.keys, layer.values = keys[i], values[i]
    return cache


# ----------------------------------------------------------------------------- decoding: the weights read at their pace
@contextlib.contextmanager
def packed_linears(model, packed: dict):
    """[speed] Inside, each frozen bf16 or float32 nn.Linear of `model` on a CPU (the decoder's and the
    output head; not the LoRA's, which every update changes) computes with its weight packed once for the
    CPU's matrix kernel (`packed`: id(module) -> (weight, its version, packed copy), kept for later calls
    while the weight is the same tensor, not changed in place). Unpacked, the kernel lays the weight out
    again at every call, a copy as large as the weight, and a decode step's few rows do not pay for it
    (tools/decode_floor.py times the step; docs/scaling.md has the figures).
    Both dtypes take oneDNN's blocked layout and product:
      bf16     the same numbers as the bf16 linear autocast runs.
      float32  torch's float32 linear to float rounding. Not under bf16 autocast, whose linear would
               compute in bf16. (MKL's packed product, used before, took 1.7-2.8x as long for the head
               at a decode step's rows on an AVX512-BF16 EPYC: docs/scaling.md.)
    tests/test_rollout_speed.py checks both. Where torch lacks the kernel (PACKED), a linear is left as it is."""
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.device.type == "cpu"
               and not m.weight.requires_grad and m.weight.dtype in PACKED and PACKED[m.weight.dtype]()]
    if not linears:
        yield
        return
    for m in linears:
        held = packed.get(id(m))
        if held is None or held[0] is not m.weight or held[1] != m.weight._version:  # new, replaced or changed
            pack = torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), 16)  # 16 rows: a hint (_packed)
            packed[id(m)] = (m.weight, m.weight._version, pack)
        m.forward = functools.partial(_packed, packed=packed[id(m)][2], weight=m.weight, bias=m.bias)
    try:
        yield
    finally:
        for m in linears:
            del m.forward  # the class's own again


def _packed(x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """nn.Linear's forward on a weight packed for oneDNN: the input in the weight's dtype (bf16 as autocast
    gives it; float32 as it comes). Calls of any row count use the one pack (its row count is a hint)."""
    return torch.ops.mkldnn._linear_pointwise(x.to(weight.dtype), packed, bias, "none", [], "")


PACKED = {  # a weight's dtype -> whether torch can pack it here and now (oneDNN's kernels for that dtype)
    torch.bfloat16: lambda: (torch.backends.mkldnn.is_available()
                             and torch.ops.mkldnn._is_mkldnn_bf16_supported()),  # none on an AVX2-only CPU
    torch.float32: lambda: torch.backends.mkldnn.is_available() and not torch.is_autocast_enabled("cpu"),
}


def keep_freed_memory() -> None:
    """[speed] glibc's allocator (Linux) made to keep the memory a CPU run frees for its next allocation: a
    decode step frees and allocates blocks of a few MiB, which glibc hands back to the system above 128 KiB
    and the process then faults in again, page by page. Blocks up to 32 MiB now come from the heap, and its
    freed top is kept up to 1 GiB (mallopt's M_MMAP_THRESHOLD, M_TRIM_THRESHOLD). Above 32 MiB glibc maps
    a block whatever that threshold says, and bf16 runs make such blocks at each log-prob pass (a bf16
    head's float32 copy, 108 MiB for SmolLM2), so the main thread's blocks never come from mmap
    (M_MMAP_MAX 0). Each step's faults and system time before and after: docs/scaling.md. Process-wide;
    no number changes; a no-op without glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.mallopt(-3, 32 * 2**20)  # M_MMAP_THRESHOLD
    libc.mallopt(-1, 2**30)  # M_TRIM_THRESHOLD
    libc.mallopt(-4, 0)  # M_MMAP_MAX (other threads' arenas map what their heaps cannot hold)


# ----------------------------------------------------------------------------- decoding: no step copies what it need not
class InPlaceLayer(DynamicLayer):
    """[speed] One decoder layer's KV cache in a buffer with room for `GROW` more tokens: a decoding step
    writes its token's keys and values in place and attends to the filled part, a view. transformers'
    DynamicLayer concatenates instead, copying the layer's whole cache at every step (at the demo's third
    turn, 8 rows of up to 618 tokens, the concatenations were ~20% of a CPU decode step's op time).
    Attention reads the same values over the same length, so no number changes (the static cache attends
    over its whole buffer, masked, which in bf16 rounds otherwise). A new buffer is made, the states held
    copied into it once, when the room is used up or when another method of the cache (reorder_cache) has
    replaced the states with a tensor of its own; a selection of rows (batch_select_indices) copies the kept
    rows, room and all, into a buffer of their own; after a crop the states are still the buffer's first
    tokens, and the next step writes after them."""

    GROW = 64  # tokens of room a new buffer has past the states it holds

    @classmethod
    def holding(cls, layer: DynamicLayer) -> "InPlaceLayer":
        """An InPlaceLayer with the keys and values `layer` holds (not copied: the first update moves them
        into its buffer)."""
        new = cls()
        if layer.is_initialized:
            new.lazy_initialization(layer.keys, layer.values)
            new.keys, new.values = layer.keys, layer.values
        return new

    def update(self, key_states, value_states, *args, **kwargs):
        """Write the new states (B, heads, k, D) after the n held, and return the n + k held, as views."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, k = self.get_seq_length(), key_states.shape[-2]
        buffers = getattr(self, "buffers", None)
        in_buffer = (buffers is not None and self.keys.data_ptr() == buffers[0].data_ptr()
                     and self.values.data_ptr() == buffers[1].data_ptr() and n + k <= buffers[0].shape[-2]
                     and all(held.shape[:2] == buffer.shape[:2] == state.shape[:2] and held.shape[-1] == state.shape[-1]
                             and state.dtype == buffer.dtype for held, buffer, state in
                             zip((self.keys, self.values), buffers, (key_states, value_states))))
        if not in_buffer:  # a new buffer: the states held so far, then room (in the dtype torch.cat would give)
            size = (*key_states.shape[:2], n + k + self.GROW)
            buffers = tuple(new.new_empty((*size, new.shape[-1]), dtype=torch.promote_types(old.dtype, new.dtype))
                            for old, new in ((self.keys, key_states), (self.values, value_states)))
            if n:
                buffers[0][..., :n, :], buffers[1][..., :n, :] = self.keys, self.values
            self.buffers = buffers
        buffers[0][..., n : n + k, :], buffers[1][..., n : n + k, :] = key_states, value_states
        self.keys, self.values = buffers[0][..., : n + k, :], buffers[1][..., : n + k, :]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows `indices` (rollout.decode: those still decoding), copied once, room and all, into
        a buffer of their own (DynamicLayer's copies them out of it, and the next step into a new one)."""
        if getattr(self, "buffers", None) is None or self.keys.data_ptr() != self.buffers[0].data_ptr():
            return super().batch_select_indices(indices)
        n = self.get_seq_length()
        self.buffers = tuple(buffer[indices] for buffer in self.buffers)
        self.keys, self.values = self.buffers[0][..., :n, :], self.buffers[1][..., :n, :]

    def reset(self) -> None:
        """Empty, as DynamicLayer.reset leaves it, the buffers freed too."""
        self.buffers = None
        super().reset()
