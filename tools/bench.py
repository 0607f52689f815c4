"""Benchmark: seconds per training stage, generated tokens/s, the SHARPO / GRPO time ratio, and
what skipping the rows whose Ahat is 0 saves.

A synthetic environment (fixed observations of a set length; in --tied-groups of the groups
every episode gets reward 0, in the others the rewards alternate 10, 0, so they have spread)
and forced response lengths (min_new_tokens = max_new_tokens) make the work per iteration the
same for every algorithm; the env packages are not imported, so it also runs on a GPU machine
without alfworld. One warm-up iteration, then one timed iteration per algorithm, with skipping
(train.py's way) and without it (every row scored and in the update, the same result); the
ratios compare timed iterations of one run. The default --kl-coef 0 is the CPU demo's: with a
KL term every row stays in the update and only the teacher pass skips rows.

Models: --model tiny | smollm2 | qwen7b-shape (a Qwen2.5-7B-shaped model with random weights
in 4-bit nf4 on CUDA, built from its config with no download; timings do not depend on the weights' values).

`--env alfworld --policy random` times the ALFWorld engine alone (no model): the same episodes
(random admissible actions, seeded) played with 1 worker (in-process) and with N worker
processes, in one run; prints env seconds per reset and per turn and the N/1 ratio.

Run: python -m tools.bench --model tiny
     python -m tools.bench --model smollm2 --episodes 8 --steps 4 --new-tokens 64     (the CPU demo's sizes)
     python -m tools.bench --model qwen7b-shape --episodes 16 --steps 3 --new-tokens 128 --obs-words 700
     python -m tools.bench --env alfworld --episodes 128 --policy random --steps 5
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

import infra  # noqa: F401  first: its __init__ quiets two third-party notices before peft loads bitsandbytes
# isort: split
import torch
from peft import LoraConfig, get_peft_model
from transformers import Qwen2Config, Qwen2ForCausalLM

import train
from envs import EnvStep, make_env, resolve_workers
from eval import RandomPolicy
from infra.cli import UserError, parse_dataclass, run
from rollout import LORA_TARGETS, build_tiny_tokenizer, load_policy


@dataclass
class BenchArgs:
    """Command-line flags of bench.py."""

    model: str = "tiny"  # tiny | smollm2 | qwen7b-shape
    algos: str = "sharpo,grpo"  # algorithms to time, comma-separated (the ratio needs sharpo and grpo)
    episodes: int = 8  # episodes per iteration (groups x group size)
    group_size: int = 4  # rollouts per task
    steps: int = 2  # env steps per episode
    new_tokens: int = 32  # forced response length per turn
    obs_words: int = 200  # words per observation (sets the context length)
    micro_batch_rows: int = 4  # rows per forward/backward
    kl_coef: float = 0.0  # KL coefficient (0, the CPU demo's, skips the reference pass)
    tied_groups: float = 0.5  # share of groups whose rewards all tie (A_i = 0: rows that can be skipped)
    env: str = "synthetic"  # synthetic (model stages) | alfworld (--policy random: the env alone, 1 vs N workers)
    policy: str = "model"  # model | random (with --env alfworld: no model, random admissible actions)
    env_workers: int = 0  # with --env alfworld: the N of "1 vs N worker processes"; 0 = CPU cores
    out: str | None = None  # also write the figures as JSON here


class SyntheticEnv:
    """Fixed-length observations; every episode lasts `max_steps`; the first `tied` share of the
    groups of each batch all get reward 0, the others 10, 0, 10, 0, ... (spread)."""

    name = "synthetic"
    default_eval_split = "test"

    def __init__(self, max_steps: int, obs_words: int, group_size: int = 4, tied: float = 0.5):
        self.max_steps, self.obs_words, self.group_size, self.tied = max_steps, obs_words, group_size, tied
        self.seconds = {"reset": 0.0, "step": 0.0}
        self.counts = {"reset": 0, "step": 0}

    def tasks(self, split):
        return [f"task-{k}" for k in range(64)]

    def task_type(self, task_id):
        return "synthetic"

    def expert_plan(self, task_id):
        return ["go to countertop 1", "take mug 1 from countertop 1", "go to coffeemachine 1"]

    def _obs(self, k):
        words = ["you", "see", "a", "mug", "1", "on", "the", "countertop", "2", "and"]
        return " ".join(words[(k + j) % len(words)] for j in range(self.obs_words))

    def build_messages(self, state, history, history_len):
        return [{"role": "user", "content": f"Task: {state.task}\nObservation: {state.observation}\nAnswer:"}]

    def reset(self, task_ids):
        self.steps = [0] * len(task_ids)
        groups = len(task_ids) // self.group_size
        tied = round(self.tied * groups)  # groups 0 .. tied-1 tie
        self.final = [0.0 if k // self.group_size < tied else 10.0 * (k % 2 == 0) for k in range(len(task_ids))]
        return [EnvStep(self._obs(0), ["look"], 0.0, False, False, False, "put a mug in coffeemachine", "synthetic", None)
                for _ in task_ids]

    def step(self, responses):
        out = []
        for i, text in enumerate(responses):
            if text is None:
                out.append(None)
                continue
            self.steps[i] += 1
            done = self.steps[i] >= self.max_steps
            out.append(EnvStep(self._obs(self.steps[i]), ["look"], self.final[i] if done else 0.0, done,
                               done and self.final[i] > 0, False, "put a mug in coffeemachine", "synthetic", None, "look"))
        return out

    def close(self):
        pass


def qwen7b_shape_model():
    """A Qwen2.5-7B-shaped model with random weights, linear layers swapped for nf4 4-bit."""
    # deferred: bitsandbytes only for 4-bit weights on a CPU
    import bitsandbytes as bnb


    config = Qwen2Config(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                         num_attention_heads=28, num_key_value_heads=4, rope_theta=1e6, rms_norm_eps=1e-6,
                         tie_word_embeddings=False, max_position_embeddings=32768)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(config)
    torch.set_default_dtype(torch.float32)
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear) and child_name != "lm_head":
                q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                      compute_dtype=torch.bfloat16, quant_type="nf4")
                q.weight = bnb.nn.Params4bit(child.weight.data.cpu(), requires_grad=False, quant_type="nf4").to("cuda")
                if child.bias is not None:
                    q.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
                setattr(module, child_name, q)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    tokenizer = build_tiny_tokenizer()  # ids decode to little text; the synthetic env ignores it
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    peft_model = get_peft_model(model, LoraConfig(r=64, lora_alpha=64, target_modules=LORA_TARGETS, task_type="CAUSAL_LM"))
    return peft_model, tokenizer


def bench_env(args: BenchArgs) -> dict:
    """Seconds per reset and per turn of the ALFWorld engine, in-process vs N workers."""
    n = resolve_workers(args.env_workers, args.episodes)
    results = {}
    for workers in (1, n):
        env = make_env("alfworld", max_steps=args.steps, workers=workers)
        tasks = env.tasks("train")
        task_ids = [tasks[(k // args.group_size) % len(tasks)] for k in range(args.episodes)]
        env.reset(task_ids)  # warm-up: engines are built once per game and episode slot, then pooled
        policy = RandomPolicy(0)
        clock = time.perf_counter()
        states = env.reset(task_ids)
        reset_s = time.perf_counter() - clock
        turns, step_s = 0, 0.0
        while not all(s.done for s in states):
            actions = policy.act(None, states)
            responses = [None if s.done else a[2] for s, a in zip(states, actions)]
            clock = time.perf_counter()
            out = env.step(responses)
            step_s += time.perf_counter() - clock
            states = [o if o is not None else s for s, o in zip(states, out)]
            turns += 1
        env.close()
        results[workers] = {"reset_s": reset_s, "turn_s": step_s / max(turns, 1), "turns": turns}
    print(f"\nALFWorld engine, {args.episodes} episodes (random admissible actions), {args.steps} turns at most")
    print(f"  {'workers':>7s} {'reset (s)':>10s} {'per turn (s)':>13s}")
    for workers, r in results.items():
        print(f"  {workers:7d} {r['reset_s']:10.2f} {r['turn_s']:13.3f}")
    ratio = {k: results[n][k] / results[1][k] for k in ("reset_s", "turn_s")}
    print(f"  {n} workers / 1: reset {ratio['reset_s']:.2f}x, per turn {ratio['turn_s']:.2f}x")
    return {"workers": n, "results": results, "ratio": ratio}


def timed_iteration(trainer) -> dict:
    """One timed training iteration: its seconds per stage, tokens, memory and skipped rows."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    clock = time.perf_counter()
    metrics, _ = trainer.iteration()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    metrics["seconds/iteration"] = time.perf_counter() - clock
    out = {k: v for k, v in metrics.items() if k.startswith(("seconds/", "tokens", "peak", "rows"))}
    out["skipped"] = f"{metrics['skipped/student']}/{metrics.get('skipped/teacher', '-')} of {metrics['rows']}"
    return out


def main(argv: list[str] | None = None) -> dict:
    args = parse_dataclass(BenchArgs, argv, description=__doc__)
    if args.env == "alfworld":
        if args.policy != "random":
            raise UserError("--env alfworld times the engine alone: pass --policy random")
        results = bench_env(args)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)
        return results
    algos = args.algos.split(",")
    if args.model == "qwen7b-shape":
        if not torch.cuda.is_available():
            raise UserError("--model qwen7b-shape needs a CUDA GPU (about 6 GB of weights in 4-bit)")
        model, tokenizer = qwen7b_shape_model()
    else:
        model, tokenizer = load_policy(args.model, lora_r=8, lora_alpha=16)
    groups = max(1, args.episodes // args.group_size)
    results, warm = {}, False
    for algo in algos:
        flags = dict(preset="none", model=args.model, algo=algo, groups=groups, group_size=args.group_size,
                     max_steps=args.steps, max_new_tokens=args.new_tokens,
                     micro_batch_rows=args.micro_batch_rows, kl_coef=args.kl_coef, hindsight="expert",
                     eval_every=0, iterations=2, output_dir="/tmp/sharpo-bench")
        targs = train.parse_args([f"--{k.replace('_', '-')}={v}" for k, v in flags.items()])
        targs.min_new_tokens = args.new_tokens  # forced lengths: fine for timing, refused by train.py's flags
        trainer = train.Trainer(targs, model=model, tokenizer=tokenizer,
                                env=SyntheticEnv(args.steps, args.obs_words, args.group_size, args.tied_groups))
        if not warm:
            trainer.iteration()  # warm-up
            warm = True
        for skip in (True, False):
            trainer.skip_rows = skip
            results[algo if skip else f"{algo} (no skipping)"] = timed_iteration(trainer)
    print(f"\nbenchmark: model {args.model}, {args.episodes} episodes x {args.steps} steps x {args.new_tokens} new tokens, "
          f"~{args.obs_words}-word observations, {args.tied_groups:.0%} of {groups} groups tied, kl_coef {args.kl_coef}")
    stages = ["rollout", "segments", "student", "teacher", "reference", "update", "iteration"]
    print(f"  {'algo':22s}" + "".join(f"{s:>11s}" for s in stages) + f"{'gen tok/s':>11s}{'peak GB':>9s}"
          + f"{'skipped rows':>14s}")
    for algo, r in results.items():
        print(f"  {algo:22s}" + "".join(f"{r['seconds/' + s]:10.2f}s" for s in stages)
              + f"{r['tokens_per_s_generate']:11.1f}{r['peak_memory_gb']:9.2f}{r['skipped']:>14s}")
    for algo in algos:
        ratio = results[algo]["seconds/iteration"] / results[f"{algo} (no skipping)"]["seconds/iteration"]
        results[f"{algo}_skip_over_no_skip_time"] = ratio
        print(f"  {algo}: with skipping / without: {ratio:.2f}x")
    if "sharpo" in results and "grpo" in results:
        for mode in ("", " (no skipping)"):
            ratio = results["sharpo" + mode]["seconds/iteration"] / results["grpo" + mode]["seconds/iteration"]
            results["sharpo_over_grpo_time" + mode.replace(" (no skipping)", "_no_skipping")] = ratio
            print(f"  SHARPO / GRPO iteration time{mode}: {ratio:.2f}x (the teacher pass is the difference)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    run(main)
