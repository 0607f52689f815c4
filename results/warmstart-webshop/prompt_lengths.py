"""Why WebShop's CPU demo takes longer than ALFWorld's: the policy's prompt, in SmolLM2 tokens, at
each step of the expert's plan, for WebShop at one and at zero observations of history and for the
ALFWorld demo's games at its two. Counted, not timed; no model is loaded.

    python results/warmstart-webshop/prompt_lengths.py   (from the repository root; writes prompt_lengths.json)

WebShop: the first 20 train goals of data/webshop. ALFWorld: the CPU demo's training games
(--max-plan-len 4 of data/alfworld). Step k is the prompt the policy reads before its k-th action.
"""
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from envs.make import make_env, training_tasks  # noqa: E402
from infra.models import load_tokenizer  # noqa: E402
from segments import generation_prompt_ids  # noqa: E402

# (env, --history, the tasks: the first 20 train goals, or 0: the train games of expert plans <= 4 steps)
CASES = [("webshop", 1, 20), ("webshop", 0, 20), ("alfworld", 2, 0)]


def prompt_lengths(env, tokenizer, tasks: list[str], history_len: int) -> dict[int, list[int]]:
    """{step: [prompt tokens, one per task]} along each task's expert plan."""
    lengths: dict[int, list[int]] = {}
    for task_id in tasks:
        state, history = env.reset([task_id])[0], []
        for k, action in enumerate(env.expert_plan(task_id)):
            prompt = generation_prompt_ids(tokenizer, env.build_messages(state, history, history_len))
            lengths.setdefault(k + 1, []).append(len(prompt))
            history.append((state.observation, action))
            state = env.step([f"<think>-</think><action>{action}</action>"])[0]
            if state.done:
                break
    return lengths


def main() -> None:
    tokenizer = load_tokenizer("smollm2", announce=lambda *_: None)
    out = {}
    for name, history_len, first in CASES:
        env = make_env(name)
        tasks = env.tasks("train")[:first] if first else training_tasks(env, "train", 4)
        lengths = prompt_lengths(env, tokenizer, tasks, history_len)
        every = [n for ns in lengths.values() for n in ns]
        out[f"{name}, history {history_len}"] = {
            "tasks": len(tasks), "mean": round(statistics.mean(every)),
            "mean_by_step": {k: round(statistics.mean(ns)) for k, ns in sorted(lengths.items())}}
        print(f"{name:8s} history {history_len}: mean {statistics.mean(every):4.0f} tokens over {len(every)} prompts;"
              " by step " + ", ".join(f"{k}: {statistics.mean(ns):.0f}" for k, ns in sorted(lengths.items())))
    (HERE / "prompt_lengths.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
