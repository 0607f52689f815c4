"""Warm start: teach a small model the answer format, and to read a hindsight block, by behaviour cloning.

RL needs reward spread inside a group. A 135M model sampled at temperature 1 almost never
writes <think>...</think><action>...</action> (measured on the shipped games: no valid
answer in 40 samples), so every rollout is invalid, all rewards tie and every advantage
is 0. This script replays the expert's plan of each training game, turns each step into
rows (the env's context, then "<think>...</think><action>target</action>" and the
end-of-turn token), and fits a LoRA adapter by maximum likelihood on the response tokens:

    L_BC = - (1 / n_tokens) * sum_{rows, t in response} log pi(a_t | c, a_<t)

SHARPO's teacher is the same policy with a hindsight block in its context (METHOD.md
section 2). A small model never shown such a block does not read it: its gap is noise. So
each step of a plan also gives rows whose context carries a block in exactly the teacher's
format (segments.add_hindsight, both headlines: the expert's plan and a successful sibling's):
  - plain:          no block; target = the plan's action (the student's view);
  - true plan:      the game's own plan; target = the plan's action;
  - rewritten plan: the plan with this step replaced by another admissible action; target =
                    that action. Here the block is the only way to know the target, so these
                    rows teach reading it, not recalling a memorised plan.
`--hindsight-rows 0` gives the format-only warm start (plain rows alone); `--headlines expert`
keeps the expert's headline only (the CPU demo's --hindsight), for WebShop, whose pages make a
row ~2x as long as ALFWorld's.

train.py --init-adapter merges the result into the base weights before RL (the CPU demo
preset does, with the adapter shipped in data/warmstart/), so the reference model of the
KL term is the warm-started policy. Large models (Qwen2.5-7B-Instruct) need no warm start.
`--check ADAPTER` measures, on games the warm start never saw, what the block does to the
log-prob of the plan's next action and of another admissible action, and the valid-answer rate;
`--check base` measures the model with no warm start (the control). Training reads the train
split only: the other splits are the held-out games the checks and eval.py measure.

Run: python -m tools.warmstart --model smollm2 --out data/warmstart/smollm2-alfworld
     python -m tools.warmstart --check data/warmstart/smollm2-alfworld --split valid_unseen
     python -m tools.warmstart --env webshop --headlines expert --epochs 1 --out data/warmstart/smollm2-webshop
     python -m tools.warmstart --env webshop --check data/warmstart/smollm2-webshop --split test --check-games 17
"""
from __future__ import annotations

import errors  # first: a Ctrl-C or kill while the imports below load is one line

errors.quiet_start(__name__)
# isort: split

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from envs import ENVS
from envs.answer import history_length, history_problems
from envs.make import make_env
from eval import fill_query, pick_games
from flags import CPU_DEMO_PER_ENV, MethodArgs
from infra.checkpoint import check_writable
from infra.cli import UserError, check_domains, choice_of, float_in, parse_dataclass, run
from infra.models import load_policy, resolve_dtype, save_adapter
from rollout import ModelPolicy
from speed import collate_rows, response_logprobs
from segments import EXPERT_HEADLINE, SIBLING_HEADLINE, Row, add_hindsight, build_row, format_plan, length_batches


@dataclass
class WarmstartArgs:
    """Command-line flags of warmstart.py."""

    env: choice_of(ENVS) = MethodArgs.env  # environment whose expert is cloned
    model: str = "smollm2"  # base model: "smollm2", "tiny", an HF id or a local path
    data_dir: str | None = None  # env data folder; default: the shipped games
    split: str = "train"  # games the expert plays
    tasks: int = 0  # clone only the first N of them, every task type in turn (eval.py's pick); 0 = all
    history: str | None = None  # observation/action pairs in the prompt; default: the env's CPU demo's (2; WebShop 1)
    epochs: int = 2  # passes over the rows
    hindsight_rows: int = 1  # per step and headline: one true-plan and this many rewritten-plan rows (0 = plain rows only)
    headlines: str = "expert,sibling"  # the blocks' headlines taught: expert (--hindsight expert), sibling, or both
    batch_rows: int = 4  # rows per optimizer step
    by_length: bool = False  # batch rows of similar length (shuffled batches): less padding for long, uneven rows
    lr: float_in("(0, 1]") = 1e-3  # AdamW learning rate of the LoRA weights
    lora_r: int = 4  # LoRA rank of the warm-start adapter (small: it is shipped)
    lora_alpha: int = 8  # LoRA alpha
    dtype: str = "auto"  # precision (train.py's --dtype: auto, bf16, fp32); the adapter is saved in float32
    seed: int = 0  # seed for the row order and LoRA init
    out: str | None = None  # where the adapter is saved; default: data/warmstart/<model>-<env>
    check: str | None = None  # measure this adapter (see the docstring) on --split instead of training; base = no adapter
    check_games: int = 12  # --check: games measured (the first N of the split, every task type in turn)


HEADLINES = {"expert": EXPERT_HEADLINE, "sibling": SIBLING_HEADLINE}


def expert_answer(task: str, action: str, thought: str) -> str:
    """The answer the model is taught: a one-line thought (the env's `expert_thought`: WebShop's does not
    restate its long tasks, so its answers fit the demo's 96 new tokens), then the expert's action."""
    return f"<think>{thought.format(task=task, action=action)}</think><action>{action}</action>"


def rewritten_plan(plan: list[str], k: int, admissible: list[str], rng: random.Random, task: str = "") -> list[str] | None:
    """The plan with step k replaced by another admissible action (None when there is none); a
    search[<your query>] becomes a search for three words drawn from the task (as eval.py's random policy)."""
    filled = [fill_query(a, task, rng) for a in admissible]
    others = [a for a in filled if a.lower() != plan[k].lower()]
    if not others:
        return None
    return plan[:k] + [rng.choice(others)] + plan[k + 1 :]


def expert_rows(env, tokenizer, split: str, history_len: int | None, hindsight_rows: int = 0,
                seed: int = 0, headlines: tuple[str, ...] = ("expert", "sibling"),
                tasks: list[str] | None = None) -> list[Row]:
    """Rows for each step of each game's expert plan (env.expert_plan: the stored walkthrough, a
    shortest plan for the short shipped games): the env's context at that step, then the target's
    answer and the end-of-turn token. Per step: one plain row, and for each of `headlines` one
    true-plan row and `hindsight_rows` rewritten-plan rows (see the module docstring). tasks: the
    task ids to play (default: every one of the split)."""
    rng = random.Random(seed)
    rows = []

    def add(messages, task, action):
        ids = tokenizer.encode(expert_answer(task, action, env.expert_thought), add_special_tokens=False)
        rows.append(build_row(tokenizer, messages, ids + [tokenizer.eos_token_id]))

    for task_id in env.tasks(split) if tasks is None else tasks:
        state = env.reset([task_id])[0]
        history: list[tuple[str, str]] = []
        plan = env.expert_plan(task_id)
        for k, action in enumerate(plan):
            messages = env.build_messages(state, history, history_len)
            add(messages, state.task, action)
            for headline in (HEADLINES[h] for h in headlines) if hindsight_rows else ():
                add(add_hindsight(messages, format_plan(headline, plan)), state.task, action)
                for _ in range(hindsight_rows):
                    other = rewritten_plan(plan, k, state.admissible, rng, state.task)
                    if other is not None:
                        add(add_hindsight(messages, format_plan(headline, other)), state.task, other[k])
            history.append((state.observation, action))
            state = env.step([f"<think>-</think><action>{action}</action>"])[0]
            if state.done:
                break
    return rows


def answer_logprobs(model, tokenizer, cases: list[tuple[list[dict], str, str]], thought: str,
                    rows_per_pass: int = 8) -> list[float]:
    """Mean log-prob per answer token of expert_answer(task, action, thought) and the end of turn, after
    each case's messages: cases = [(messages, task, action)]."""
    rows = [build_row(tokenizer, m, tokenizer.encode(expert_answer(t, a, thought), add_special_tokens=False)
                      + [tokenizer.eos_token_id]) for m, t, a in cases]
    out = []
    with torch.no_grad():
        for s in range(0, len(rows), rows_per_pass):
            batch = collate_rows(rows[s : s + rows_per_pass], tokenizer.pad_token_id)
            logp = response_logprobs(model, batch)  # (b, T), 0 on padding
            out += (logp.sum(1) / batch["response_len"]).tolist()
    return out


def reading_check(model, tokenizer, env, games: list[str], history_len: int | None, steps_per_game: int = 5,
                  seed: int = 0) -> dict:
    """On the first steps of each game's expert plan: the block's effect (log-prob with the
    true-plan block minus without, nats per answer token) on the answer that takes the plan's
    next action (on_plan), and on one that takes another admissible action (off_plan); and the
    share of valid answers sampled at temperature 1 without a block. Reading shows as
    on_plan > 0 > off_plan."""
    rng = random.Random(seed)
    on_cases, off_cases, contexts, states = [], [], [], []
    for task_id in games:
        state = env.reset([task_id])[0]
        history: list[tuple[str, str]] = []
        plan = env.expert_plan(task_id)
        for k, action in enumerate(plan[:steps_per_game]):
            messages = env.build_messages(state, history, history_len)
            taught = add_hindsight(messages, format_plan(EXPERT_HEADLINE, plan))
            on_cases += [(taught, state.task, action), (messages, state.task, action)]
            other = rewritten_plan(plan, k, state.admissible, rng, state.task)
            if other is not None:
                off_cases += [(taught, state.task, other[k]), (messages, state.task, other[k])]
            contexts.append(messages)
            states.append(state)
            history.append((state.observation, action))
            state = env.step([f"<think>-</think><action>{action}</action>"])[0]
            if state.done:
                break
    on = answer_logprobs(model, tokenizer, on_cases, env.expert_thought)
    off = answer_logprobs(model, tokenizer, off_cases, env.expert_thought)
    on_gap = [on[j] - on[j + 1] for j in range(0, len(on), 2)]  # with the block minus without
    off_gap = [off[j] - off[j + 1] for j in range(0, len(off), 2)]
    policy, valid = ModelPolicy(model, tokenizer, max_new_tokens=64, temperature=1.0), 0
    for s in range(0, len(contexts), 16):
        for (_, _, text), st in zip(policy.act(contexts[s : s + 16], None), states[s : s + 16]):
            valid += env.valid(st, text)
    mean = lambda xs: sum(xs) / max(len(xs), 1)  # noqa: E731
    return {"games": len(games), "states": len(states), "on_plan": mean(on_gap), "off_plan": mean(off_gap),
            "on_minus_off": mean(on_gap) - mean(off_gap),
            "off_plan_lower": sum(o < 0 for o in off_gap) / max(len(off_gap), 1),
            "valid_rate": valid / max(len(states), 1)}


def row_batches(rows: list[Row], order: list[int], size: int, by_length: bool) -> list[list[int]]:
    """One epoch's batches of row indices, in random order (the module's `random` state): `order`
    shuffled in place (each epoch reshuffles the last), then cut into batches; by_length, the
    shuffled rows are sorted by length (stable: equal lengths stay shuffled), cut, and the batches
    shuffled."""
    random.shuffle(order)
    if not by_length:
        return [order[s : s + size] for s in range(0, len(order), size)]
    batches = length_batches(order, rows, size)
    random.shuffle(batches)
    return batches


def main(argv: list[str] | None = None) -> None:
    args = parse_dataclass(WarmstartArgs, argv, description=__doc__)
    if args.history is None:
        args.history = CPU_DEMO_PER_ENV[args.env].get("history", "2")  # saved as it ran
    headlines = tuple(h.strip() for h in args.headlines.split(",") if h.strip())
    problems = check_domains(args, positive=("epochs", "batch_rows", "lora_r", "lora_alpha", "check_games"),
                             non_negative=("tasks", "hindsight_rows"))
    problems += [f"--headlines: '{h}' is not one of expert, sibling" for h in headlines if h not in HEADLINES]
    problems += ["--headlines: name at least one"] if not headlines else []
    problems += history_problems(args.history)
    if problems:
        raise UserError("; ".join(problems))
    args.dtype = resolve_dtype(args.dtype, "cuda" if torch.cuda.is_available() else "cpu", args.model)  # saved as it ran
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    if not args.check and args.split != "train":
        raise UserError(f"--split {args.split} holds held-out games: the warm start trains on train only "
                        f"(to measure an adapter on {args.split}, pass --check ADAPTER, or --check base for none)")
    if args.check:
        model, tokenizer = load_policy(args.model, init_adapter=None if args.check == "base" else args.check,
                                       lora_r=args.lora_r, lora_alpha=args.lora_alpha, seed=args.seed, dtype=args.dtype)
        model.eval()
        env = make_env(args.env, data_dir=args.data_dir)
        result = reading_check(model, tokenizer, env, pick_games(env, args.split, args.check_games),
                               history_length(args.history), seed=args.seed)
        env.close()
        print(json.dumps({"adapter": args.check, "split": args.split, **result}, indent=1))
        return
    out = Path(args.out or f"data/warmstart/{Path(args.model).name}-{args.env}")
    for name in ("adapter_config.json", "adapter_model.safetensors", "warmstart_config.json"):
        check_writable(out / name)  # before any training: a folder that cannot take the adapter costs nothing
    model, tokenizer = load_policy(args.model, lora_r=args.lora_r, lora_alpha=args.lora_alpha, seed=args.seed,
                                   dtype=args.dtype)
    env = make_env(args.env, data_dir=args.data_dir)
    tasks = pick_games(env, args.split, args.tasks) if args.tasks else None
    rows = expert_rows(env, tokenizer, args.split, history_length(args.history), args.hindsight_rows, args.seed,
                       headlines, tasks)
    env.close()
    print(f"{len(rows)} rows from {len(tasks) if tasks else 'all'} tasks of {args.split}, mean length "
          f"{sum(len(r.input_ids) for r in rows) / len(rows):.0f} tokens")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.0)
    model.train()
    order = list(range(len(rows)))
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        batches = row_batches(rows, order, args.batch_rows, args.by_length)
        total, count = 0.0, 0
        for part in tqdm(batches, desc=f"epoch {epoch + 1}", leave=False):
            batch = collate_rows([rows[i] for i in part], tokenizer.pad_token_id)
            logp = response_logprobs(model, batch)  # (b, T), 0 on padding
            n = batch["response_len"].sum()
            loss = -logp.sum() / n  # token-mean negative log-likelihood of the expert's answers
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total, count = total + loss.item() * int(n), count + int(n)
        print(f"epoch {epoch + 1}: NLL per response token {total / count:.3f} ({time.perf_counter() - t0:.0f}s)")
    save_adapter(model, out)
    (out / "warmstart_config.json").write_text(json.dumps(asdict(args), indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    run(main)
