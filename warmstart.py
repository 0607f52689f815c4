"""Warm start: teach a small model the answer format by behaviour cloning the env's expert.

RL needs reward spread inside a group. A 135M model sampled at temperature 1 almost never
writes <think>...</think><action>...</action> (measured on the shipped games: no valid
answer in 40 samples), so every rollout is invalid, all rewards tie and every advantage
is 0. This script replays the expert's plan of each training game, turns each step into a
row (the env's context, then "<think>...</think><action>expert action</action>" and the
end-of-turn token), and fits a LoRA adapter by maximum likelihood on the response tokens:

    L_BC = - (1 / n_tokens) * sum_{rows, t in response} log pi(a_t | c, a_<t)

train.py --init-adapter merges the result into the base weights before RL (the CPU demo
preset does, with the adapter shipped in data/warmstart/), so the reference model of the
KL term is the warm-started policy. Large models (Qwen2.5-7B-Instruct) need no warm start.

Run: python warmstart.py --model smollm2 --out data/warmstart/smollm2-alfworld
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from segments import Row, build_row, collate_rows


@dataclass
class WarmstartArgs:
    """Command-line flags of warmstart.py."""

    env: str = "alfworld"  # environment whose expert is cloned
    model: str = "smollm2"  # base model: "smollm2", "tiny", an HF id or a local path
    data_dir: str | None = None  # env data folder; default: the shipped games
    split: str = "train"  # games the expert plays
    history: str = "2"  # observation/action pairs in the prompt (as in train.py)
    epochs: int = 3  # passes over the expert rows
    batch_rows: int = 4  # rows per optimizer step
    lr: float = 1e-3  # AdamW learning rate of the LoRA weights
    lora_r: int = 4  # LoRA rank of the warm-start adapter (small: it is shipped)
    lora_alpha: int = 8  # LoRA alpha
    seed: int = 0  # seed for the row order and LoRA init
    out: str = "data/warmstart/smollm2-alfworld"  # where the adapter is saved


def expert_answer(task: str, action: str) -> str:
    """The answer the model is taught: a one-line thought, then the expert's action."""
    return f"<think>My task is to {task}. The next step is to {action}.</think><action>{action}</action>"


def expert_rows(env, tokenizer, split: str, history_len: int | None) -> list[Row]:
    """One row per step of each game's expert plan (env.expert_plan: the stored walkthrough, a
    shortest plan for the short shipped games): the env's context at that step, then the
    expert's answer and the end-of-turn token."""
    rows = []
    for task_id in env.tasks(split):
        state = env.reset([task_id])[0]
        history: list[tuple[str, str]] = []
        for action in env.expert_plan(task_id):
            messages = env.build_messages(state, history, history_len)
            ids = tokenizer.encode(expert_answer(state.task, action), add_special_tokens=False)
            rows.append(build_row(tokenizer, messages, ids + [tokenizer.eos_token_id]))
            history.append((state.observation, action))
            state = env.step([f"<think>-</think><action>{action}</action>"])[0]
            if state.done:
                break
    return rows


def main(argv: list[str] | None = None) -> None:
    from tqdm.auto import tqdm

    from cli import parse_dataclass
    from envs import history_length, make_env
    from rollout import load_policy, response_logprobs, save_adapter

    args = parse_dataclass(WarmstartArgs, argv, description=__doc__)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    model, tokenizer = load_policy(args.model, lora_r=args.lora_r, lora_alpha=args.lora_alpha, seed=args.seed)
    env = make_env(args.env, data_dir=args.data_dir)
    rows = expert_rows(env, tokenizer, args.split, history_length(args.history))
    env.close()
    print(f"{len(rows)} expert rows, mean length {sum(len(r.input_ids) for r in rows) / len(rows):.0f} tokens")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.0)
    model.train()
    order = list(range(len(rows)))
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        random.shuffle(order)
        total, count = 0.0, 0
        for s in tqdm(range(0, len(order), args.batch_rows), desc=f"epoch {epoch + 1}", leave=False):
            batch = collate_rows([rows[i] for i in order[s : s + args.batch_rows]], tokenizer.pad_token_id)
            logp = response_logprobs(model, batch)  # (b, T), 0 on padding
            n = batch["response_len"].sum()
            loss = -logp.sum() / n  # token-mean negative log-likelihood of the expert's answers
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total, count = total + loss.item() * int(n), count + int(n)
        print(f"epoch {epoch + 1}: NLL per response token {total / count:.3f} ({time.perf_counter() - t0:.0f}s)")
    out = Path(args.out)
    save_adapter(model, out)
    (out / "warmstart_config.json").write_text(json.dumps(asdict(args), indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    from cli import run

    run(main)
