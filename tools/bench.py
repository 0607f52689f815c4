"""Benchmark: seconds per training stage, generated tokens/s, the SHARPO / GRPO time ratio, and
what each way of running an iteration costs against another.

A synthetic environment (fixed observations of a set length; in --tied-groups of the groups
every episode gets reward 0, in the others the rewards alternate 10, 0, so they have spread)
and forced response lengths (min_new_tokens = max_new_tokens) make the work per iteration the
same for every algorithm; the env packages are not imported, so it also runs on a GPU machine
without alfworld. Way by way: one warm-up iteration, then --repeats timed iterations of each
algorithm, alternating (A B, then B A, ...), each figure their median; the ratios compare timed
iterations of one run. When the ways were interleaved, the first iteration after each switch of
model (float32 to bf16) ran slower: in results/bench-faster-loop/bench-interleaved.json (git history, e287449) the SHARPO /
GRPO ratio of the two repeats came out 1.237 and 0.935, each time high for the algorithm that ran
first after the switch. Hence the warm-up per way; the alternation
gives each algorithm each place equally often (use an even --repeats). The SHARPO / GRPO ratio is
also printed per repeat, each from two adjacent iterations. --ways (WAYS below):
  new          train.py's way: --dtype auto, the teacher continuing from the student's context
               cache, the rows whose Ahat is 0 skipped;
  old          before --dtype and the shared context: float32, each teacher row computed whole;
  no-skipping  new, with every row scored and in the update (the same result);
  bf16, fp32   new, in that precision whatever --dtype auto picks on this machine (auto times the
               model's decoder layer in both, infra/precision.py: `--ways bf16,fp32` checks it stage by stage).
The default --kl-coef 0 is the CPU demo's: with a KL term every row stays in the update and
only the teacher pass skips rows.

Models: --model tiny | smollm2 | qwen7b-shape (a Qwen2.5-7B-shaped model with random weights
in 4-bit nf4 on CUDA, built from its config with no download; timings do not depend on the weights' values).

`--demo-rollouts alfworld` (or webshop) times the CPU demo's own rollout (its model, games and batch,
sampled): rows of a generate call that share a prompt prefix (a group's episodes share their task and
older history) with the plain generate and with each shared prefix prefilled once (speed.py), the two
alternating after a warm-up, from the same tasks and seed; prints the cached / plain ratio.

`--env alfworld --policy random` times the ALFWorld engine alone (no model): the same episodes
(random admissible actions, seeded) played with 1 worker (in-process) and with N worker
processes, in one run; prints env seconds per reset and per turn and the N/1 ratio.

`--demo-decode alfworld` (or webshop) replays the generate calls of one cpu-demo rollout (its prompts, as
the demo played them) three ways: the plain generate; speed.py's shared prefixes without the cache
written in place (`in_place=False`) and without packed weights; and as they are now (FastPath.generate). Each call
runs with 1 new token (its first step: the prefill and the head) and with --new-tokens + 1 (end of turn
blocked), a round's decode step being the difference over --new-tokens; after a warm-up round the ways
take turns, the order rotated each round, each call from the same seed; prints each way's medians, the
after / before ratios, and whether every round sampled what the plain generate and the before way did
(in bf16 after = before exactly, and the shared prefixes round otherwise than the plain generate, so those
two may part after a few tokens; in float32 after's packed products may round otherwise than before's).
Use --repeats 3 (or a multiple) to give each way each place equally.

Run: python -m tools.bench --model tiny
     python -m tools.bench --model smollm2 --episodes 8 --steps 4 --new-tokens 64     (the CPU demo's sizes)
     python -m tools.bench --model smollm2 --episodes 8 --steps 4 --new-tokens 64 --ways new,no-skipping
     python -m tools.bench --model qwen7b-shape --episodes 16 --steps 3 --new-tokens 128 --obs-words 700
     python -m tools.bench --env alfworld --episodes 128 --policy random --steps 5
     python -m tools.bench --demo-rollouts alfworld --repeats 2
     python -m tools.bench --demo-decode alfworld --repeats 3 --new-tokens 64
"""
from __future__ import annotations

import errors  # first: a Ctrl-C or kill while the imports below load is one line

errors.quiet_start(__name__)
# isort: split

import copy
import json
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import infra.models  # noqa: F401  first: it quiets two third-party notices before peft loads bitsandbytes
# isort: split
import torch

import train
from envs import ENVS, Env, EnvStep
from envs.make import env_class, make_env, resolve_workers
from eval import RandomPolicy
from flags import PRESETS, MethodArgs
from infra import metrics
from infra.cli import UserError, check_domains, flag_type, float_in, parse_dataclass, run
from infra.models import load_policy, qwen7b_shape_model, resolve_dtype
import rollout
from speed import FastPath, collate_rows, prefix_clusters, response_logprobs, shared_prefix_generate
from rollout import LogProbs
from segments import length_batches


TEACHER_COST = ("sharpo", "grpo")  # the pair whose time ratio is the teacher pass's cost: the same work but it


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
    kl_coef: flag_type(MethodArgs, "kl_coef") = PRESETS["cpu-demo"]["kl_coef"]  # KL coefficient (the CPU demo's: 0 skips the reference pass)
    tied_groups: float_in("[0, 1]") = 0.5  # share of groups whose rewards all tie (A_i = 0: rows that can be skipped)
    env: str = "synthetic"  # synthetic (model stages) | an env of envs.ENVS that plays in workers (--policy random: its engine alone, 1 vs N workers)
    policy: str = "model"  # model | random (with --env alfworld: no model, random admissible actions)
    env_workers: int = 0  # with --env alfworld: the N of "1 vs N worker processes"; 0 = CPU cores
    repeats: int = 1  # timed iterations per way and algorithm (alternating); the figures are their medians
    ways: str = "new,old"  # how each iteration runs, comma-separated (WAYS): new (train.py's), old (float32, teacher rows whole), no-skipping
    ratio_noise: bool = False  # instead of timing: the PPO ratio before any step, from numerics alone, per way
    preset: str = ""  # with --ratio-noise: a train.py preset (cpu-demo, cpu-learn) on its real env, not the synthetic one
    demo_rollouts: str = ""  # alfworld | webshop: instead, the cpu-demo's rollout on that env, plain generate vs shared prefixes
    demo_decode: str = ""  # alfworld | webshop: instead, the cpu-demo's generate calls replayed: prefill and decode step, before/after
    out: str | None = None  # also write the figures as JSON here


class SyntheticEnv(Env):
    """Fixed-length observations; every episode lasts `max_steps`; the first `tied` share of the
    groups of each batch all get reward 0, the others 10, 0, 10, 0, ... (spread)."""

    name = "synthetic"
    splits = ("train", "test")
    default_eval_split = "test"
    default_max_steps = 3
    prompt_tokens = 780

    def __init__(self, max_steps: int, obs_words: int, group_size: int = 4, tied: float = 0.5):
        super().__init__(max_steps=max_steps)
        self.obs_words, self.group_size, self.tied = obs_words, group_size, tied

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

    def valid(self, state, text):
        return True


def bench_env(args: BenchArgs) -> dict:
    """Seconds per reset and per turn of --env's engine, in-process vs N workers."""
    n = resolve_workers(args.env_workers, args.episodes)
    results = {}
    for workers in (1, n):
        env = make_env(args.env, max_steps=args.steps, workers=workers)
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
    print(f"\n{args.env} engine, {args.episodes} episodes (random admissible actions), {args.steps} turns at most")
    print(f"  {'workers':>7s} {'reset (s)':>10s} {'per turn (s)':>13s}")
    for workers, r in results.items():
        print(f"  {workers:7d} {r['reset_s']:10.2f} {r['turn_s']:13.3f}")
    ratio = {k: results[n][k] / results[1][k] for k in ("reset_s", "turn_s")}
    print(f"  {n} workers / 1: reset {ratio['reset_s']:.2f}x, per turn {ratio['turn_s']:.2f}x")
    return {"workers": n, "results": results, "ratio": ratio}


class BenchTrainer(train.Trainer):
    """train.Trainer with its two shortcuts switchable, to time each and to test that neither changes the update.

    skip_rows = False: every row is scored and sits in the update (train.py leaves out the rows whose Ahat
    is 0, whose policy-gradient term is exactly 0); reuse_context = False: each teacher row is computed
    whole, not continued from its student row's context cache."""

    skip_rows, reuse_context = True, True

    def advantage(self, trajs, rows):
        adv = super().advantage(trajs, rows)
        if not self.skip_rows:
            adv.trained = torch.ones_like(adv.trained)  # every row in the student pass and the update
            adv.taught = rows.has_hindsight & self.algo.uses_teacher(self.args)  # every row with hindsight in the teacher pass
        return adv

    def logprobs(self, rows, adv, watch=None):
        if self.reuse_context:
            return super().logprobs(rows, adv, watch)
        args, T = self.args, rows.response_mask.shape[1]
        self.model.eval()
        with metrics.timed(watch, "student"):
            fast = FastPath(self.tokenizer.pad_token_id, args.micro_batch_rows)
            student = fast.pass_logprobs(self.model, rows=rows.rows, T=T, temperature=args.temperature,
                                         only=adv.trained)  # (B, T)
        with metrics.timed(watch, "teacher"):
            teacher = fast.pass_logprobs(self.model, rows=rows.teacher_rows, T=T, temperature=args.temperature,
                                         only=adv.taught)  # (B, T) each teacher row whole
        return LogProbs(student, torch.where(adv.taught[:, None], teacher, student))  # the reference: in the update


@torch.no_grad()
def ratio_noise(trainer) -> dict:
    """The PPO ratio exp(logp_new - logp_student) before any optimizer step, which is 1 in exact arithmetic:
    one iteration's stages 1-5, then the update's own pass (response_logprobs over its micro-batches) on the
    first minibatch's trained tokens. Returns the share of them outside [1 - clip, 1 + clip] (what would be
    clipped from noise alone) and the mean and max |log ratio|."""
    args = trainer.args
    trajs = trainer.rollout(trainer.iteration_done + 1)
    rows = trainer.segments(trajs)
    adv = trainer.advantage(trajs, rows)
    logp = trainer.logprobs(rows, adv)
    order = torch.Generator().manual_seed(train.stream_seed("minibatches", args.seed, trainer.iteration_done))
    idx = next(train.minibatches(len(rows.rows), args.minibatches, args.ppo_epochs, order))
    device = trainer.model.get_input_embeddings().weight.device
    diffs = []
    for part in length_batches([i for i in idx if adv.trained[i]], rows.rows, args.micro_batch_rows):
        micro = {k: v.to(device) for k, v in collate_rows([rows.rows[i] for i in part], trainer.tokenizer.pad_token_id).items()}
        new = response_logprobs(trainer.model, micro, temperature=args.temperature).float().cpu()  # (b, t)
        mask = rows.response_mask[part, : new.shape[1]]  # (b, t)
        diffs.append((new - logp.student[part, : new.shape[1]])[mask])
    d = torch.cat(diffs) if diffs else torch.zeros(0)
    outside = ((d.exp() - 1).abs() > args.ppo_clip).float()
    return {"tokens": int(d.numel()), "outside_clip": float(outside.mean()) if d.numel() else 0.0,
            "mean_abs_log_ratio": float(d.abs().mean()) if d.numel() else 0.0,
            "max_abs_log_ratio": float(d.abs().max()) if d.numel() else 0.0}


def forced_lengths(trainer, new_tokens: int):
    """Every response exactly `new_tokens` long (end-of-turn blocked until then): the same work for every
    algorithm, for timing only (off-policy: never in training)."""
    trainer.actor.config.min_new_tokens = new_tokens
    return trainer


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


# The ways an iteration can be run, each timed in the same bench run (all give the same update up to rounding).
WAYS = {
    "new": dict(dtype="auto", reuse_context=True, skip_rows=True),  # train.py's way
    "old": dict(dtype="fp32", reuse_context=False, skip_rows=True),  # before --dtype and the shared context: float32, teacher rows whole
    "no-skipping": dict(dtype="auto", reuse_context=True, skip_rows=False),  # every row scored and in the update
    "bf16": dict(dtype="bf16", reuse_context=True, skip_rows=True),  # new, in bf16 whatever auto picks here
    "fp32": dict(dtype="fp32", reuse_context=True, skip_rows=True),  # new, in float32 whatever auto picks here
}


def median_timing(runs: list[dict]) -> dict:
    """The median of each number over repeated timed iterations (the last run's other fields)."""
    out = dict(runs[-1])
    for key, value in out.items():
        if isinstance(value, (int, float)):
            out[key] = statistics.median(r[key] for r in runs)
    return out


def demo_rollouts(env: str, repeats: int) -> dict:
    """Seconds of the cpu-demo preset's rollout (its model, warm start, games and batch; sampled, not forced)
    with the plain generate and with each shared prompt prefix prefilled once (speed.py), in one run: after a
    warm-up, the two alternate, each from the same tasks and seed, so both play the same episodes (to float
    rounding). Also the prompt tokens the rows of a generate call share with another row of it."""
    unused = str(Path(tempfile.gettempdir()) / "sharpo-bench-rollouts")  # a Trainer alone writes no run folder
    trainer = train.Trainer(train.parse_args(["--preset", "cpu-demo", "--env", env, "--output-dir", unused]))
    fast, seconds, played = FastPath(trainer.tokenizer.pad_token_id), {"plain": [], "shared prefixes": []}, {}
    calls, shared = [], []  # every generate call's prompts, and the tokens of each row in a shared prefix
    real = fast.generate

    def recording(model, prompts, config):
        cluster_of, lengths = prefix_clusters(prompts)
        counts = [cluster_of.count(c) for c in range(len(lengths))]
        calls.append(sum(len(p) for p in prompts))
        shared.append(sum(lengths[c] for c in cluster_of if counts[c] > 1))
        return real(model, prompts, config)
    order = [("plain", rollout.generate), ("shared prefixes", recording)]
    for r in range(repeats + 1):  # the first round warms up, and is not counted
        for way, actor_fast in (order if r % 2 == 0 else order[::-1]):
            trainer.actor.sample, trainer.rng = actor_fast, random.Random(0)
            torch.manual_seed(0)
            clock = time.perf_counter()
            trajs = trainer.rollout(1)
            if r:
                seconds[way].append(time.perf_counter() - clock)
            played[way] = [[s.action for s in t.steps] for t in trajs]
    trainer.close()
    out = {"env": env, "repeats": repeats, "seconds": seconds,
           "median": {w: statistics.median(s) for w, s in seconds.items()},
           "same_actions": played["plain"] == played["shared prefixes"],
           "prompt_tokens_in_shared_prefixes": sum(shared) / max(sum(calls), 1)}
    out["shared_over_plain"] = out["median"]["shared prefixes"] / out["median"]["plain"]
    print(f"\ncpu-demo rollouts on {env}, median of {repeats} each (alternating, after a warm-up): plain generate "
          f"{out['median']['plain']:.1f} s, shared prefixes {out['median']['shared prefixes']:.1f} s: "
          f"{out['shared_over_plain']:.2f}x; {out['prompt_tokens_in_shared_prefixes']:.0%} of the prompt tokens "
          f"sat in a prefix shared within a call; the same actions both ways: {out['same_actions']}")
    return out


def demo_decode(env: str, repeats: int, new_tokens: int) -> dict:
    """The cpu-demo's generate calls, replayed plain, before and after (see the module's docstring)."""
    unused = str(Path(tempfile.gettempdir()) / "sharpo-bench-decode")  # a Trainer alone writes no run folder
    trainer = train.Trainer(train.parse_args(["--preset", "cpu-demo", "--env", env, "--output-dir", unused]))
    model, pad_id, calls = trainer.model, trainer.tokenizer.pad_token_id, []
    real = trainer.actor.sample

    def recording(model, prompts, config):
        calls.append(prompts)
        return real(model=model, prompts=prompts, config=config)
    trainer.actor.sample, trainer.rng = recording, random.Random(0)
    torch.manual_seed(0)
    trainer.rollout(1)
    trainer.close()
    ways = {"plain": rollout.generate,
            "before": lambda **kw: shared_prefix_generate(**kw, pad_id=pad_id, in_place=False),
            "after": FastPath(pad_id).generate}

    def replay(way: str, n: int) -> tuple[float, list]:
        config = copy.deepcopy(trainer.actor.config)
        config.max_new_tokens = config.min_new_tokens = n
        seconds, sampled = 0.0, []
        model.eval()
        with torch.no_grad(), rollout.autocast(model):
            for prompts in calls:
                torch.manual_seed(0)
                clock = time.perf_counter()
                sampled.append(ways[way](model=model, prompts=prompts, config=config))
                seconds += time.perf_counter() - clock
        return seconds, sampled
    prefill, whole, step, samples = ({w: [] for w in ways} for _ in range(4))
    names = list(ways)
    for r in range(repeats + 1):  # the first round warms up, and is not counted
        for way in names[r % len(names) :] + names[: r % len(names)]:  # rotated: each way in each place in turn
            (first, _), (full, sampled) = replay(way, 1), replay(way, new_tokens + 1)
            if r:
                prefill[way].append(first)
                whole[way].append(full)
                step[way].append(1000 * (full - first) / new_tokens / len(calls))  # ms a decode step, this round
                samples[way].append(sampled)
    med = {w: {"prefill_s": statistics.median(prefill[w]), "calls_s": statistics.median(whole[w]),
               "decode_step_ms": statistics.median(step[w])} for w in ways}
    for w in ways:  # every round's samples; rounding may part them (the module's docstring)
        med[w]["same_samples_as_plain"] = samples[w] == samples["plain"]
        med[w]["same_samples_as_before"] = samples[w] == samples["before"]
    out = {"env": env, "repeats": repeats, "new_tokens": new_tokens, "calls": len(calls),
           "rows": [len(c) for c in calls], "prompt_tokens": sum(len(p) for c in calls for p in c),
           "prefill_s": prefill, "calls_s": whole, "decode_step_ms": step, "median": med,
           "after_over_before": {k: med["after"][k] / med["before"][k] for k in ("prefill_s", "decode_step_ms", "calls_s")},
           "after_over_plain": {k: med["after"][k] / med["plain"][k] for k in ("prefill_s", "decode_step_ms", "calls_s")}}
    print(f"\ncpu-demo generate calls on {env} ({len(calls)} calls, {out['prompt_tokens']} prompt tokens, "
          f"{new_tokens} + 1 new tokens), median of {repeats} each, the order rotated after a warm-up:")
    print("| way | first step (prefill, head) | decode step | the calls | samples = plain's | samples = before's |\n"
          "|---|---|---|---|---|---|")
    for w in ways:
        m = med[w]
        print(f"| {w} | {m['prefill_s']:.2f} s | {m['decode_step_ms']:.1f} ms | {m['calls_s']:.2f} s | "
              f"{m['same_samples_as_plain']} | {m['same_samples_as_before']} |")
    ratio = out["after_over_before"]
    print(f"after / before: first step {ratio['prefill_s']:.2f}x, decode step {ratio['decode_step_ms']:.2f}x, "
          f"the calls {ratio['calls_s']:.2f}x")
    return out


def main(argv: list[str] | None = None) -> dict:
    args = parse_dataclass(BenchArgs, argv, description=__doc__)
    if problems := check_domains(args):
        raise UserError("; ".join(problems))
    if args.demo_decode:
        if args.demo_decode not in ENVS:
            raise UserError(f"--demo-decode is one of {', '.join(ENVS)}; got {args.demo_decode!r}")
        if args.new_tokens < 1 or args.repeats < 1:
            raise UserError("--demo-decode needs --new-tokens and --repeats of at least 1")
        results = demo_decode(args.demo_decode, args.repeats, args.new_tokens)
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1))
        return results
    if args.demo_rollouts:
        if args.demo_rollouts not in ENVS:
            raise UserError(f"--demo-rollouts is one of {', '.join(ENVS)}; got {args.demo_rollouts!r}")
        results = demo_rollouts(args.demo_rollouts, max(args.repeats, 1))
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1))
        return results
    if args.env in ENVS:  # an env's engine alone, in-process and in workers
        if args.policy != "random" or not env_class(args.env).in_workers:
            raise UserError(f"--env {args.env} times the engine of an env that plays in worker processes alone "
                            f"({', '.join(e for e in ENVS if env_class(e).in_workers)}): pass --policy random")
        results = bench_env(args)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)
        return results
    algos, ways = args.algos.split(","), args.ways.split(",")
    if args.repeats < 1:
        raise UserError(f"--repeats must be at least 1; got {args.repeats}")
    if unknown := [w for w in ways if w not in WAYS]:
        raise UserError(f"--ways: unknown {', '.join(unknown)}; choose from {', '.join(WAYS)}")
    groups = max(1, args.episodes // args.group_size)
    trainers, models = {}, {}
    for way in ways if not (args.ratio_noise and args.preset) else []:
        setting = WAYS[way]
        if args.model == "qwen7b-shape":  # bf16 with nf4 weights whatever the way: only the teacher pass differs
            if not torch.cuda.is_available():
                raise UserError("--model qwen7b-shape needs a CUDA GPU (about 6 GB of weights in 4-bit)")
            dtype = "bf16"
            models[dtype] = models.get(dtype) or qwen7b_shape_model()
        else:
            dtype = resolve_dtype(setting["dtype"], "cuda" if torch.cuda.is_available() else "cpu", args.model)
            models[dtype] = models.get(dtype) or load_policy(args.model, lora_r=8, lora_alpha=16, dtype=dtype)
        model, tokenizer = models[dtype]
        for algo in algos:
            flags = dict(preset="none", model=args.model, algo=algo, groups=groups, group_size=args.group_size,
                         max_steps=args.steps, max_new_tokens=args.new_tokens, dtype=dtype,
                         micro_batch_rows=args.micro_batch_rows, kl_coef=args.kl_coef, hindsight="expert",
                         eval_every=0, iterations=2, output_dir="/tmp/sharpo-bench")
            targs = train.parse_args([f"--{k.replace('_', '-')}={v}" for k, v in flags.items()])
            trainer = forced_lengths(BenchTrainer(targs, model=model, tokenizer=tokenizer, env=SyntheticEnv(
                args.steps, args.obs_words, args.group_size, args.tied_groups)), args.new_tokens)
            trainer.skip_rows, trainer.reuse_context = setting["skip_rows"], setting["reuse_context"]
            trainers[f"{way} {algo}"] = (dtype, trainer)
    if args.ratio_noise and args.preset:  # train.py's preset itself, on its env, in each way's precision
        trainers = {}
        for way in ways:
            unused = str(Path(tempfile.gettempdir()) / "sharpo-bench-noise")  # a Trainer alone writes no run folder
            targs = train.parse_args(["--preset", args.preset, "--algo", algos[0], "--dtype", WAYS[way]["dtype"],
                                      "--eval-every", "0", "--output-dir", unused])
            trainers[f"{way} {algos[0]}"] = (targs.dtype, train.Trainer(targs))
    if args.ratio_noise:  # no timing: each way's ratio before any step
        noise = {name: {"dtype": dtype, **ratio_noise(trainer)} for name, (dtype, trainer) in trainers.items()}
        for name, r in noise.items():
            print(f"  {name:22s} {r['dtype']:>5s}: {r['outside_clip']:.2%} of {r['tokens']} first-minibatch tokens outside "
                  f"the PPO window from noise; |log ratio| mean {r['mean_abs_log_ratio']:.2e}, max {r['max_abs_log_ratio']:.2e}")
        if args.out:
            Path(args.out).write_text(json.dumps(noise, indent=1))
        return noise
    timings = {name: [] for name in trainers}
    for way in ways:  # way by way, each after its own warm-up; within a way the algorithms alternate (see below)
        trainers[f"{way} {algos[0]}"][1].iteration()  # warm-up: the first iteration after a switch of way runs slower
        for r in range(args.repeats):
            for algo in (algos if r % 2 == 0 else algos[::-1]):  # every other repeat backwards: A B, B A, ...
                timings[f"{way} {algo}"].append(timed_iteration(trainers[f"{way} {algo}"][1]))
    results = {name: {"dtype": trainers[name][0], **median_timing(runs)} for name, runs in timings.items()}
    print(f"\nbenchmark: model {args.model}, {args.episodes} episodes x {args.steps} steps x {args.new_tokens} new tokens, "
          f"~{args.obs_words}-word observations, {args.tied_groups:.0%} of {groups} groups tied, kl_coef {args.kl_coef}, "
          f"median of {args.repeats} timed iteration(s) each")
    print("  ways: " + "; ".join(f"{w} = {WAYS[w]}" for w in ways))
    stages = ["rollout", "segments", "student", "teacher", "reference", "update", "iteration"]
    print(f"  {'way / algo':22s}{'dtype':>6s}" + "".join(f"{s:>11s}" for s in stages) + f"{'gen tok/s':>11s}"
          f"{'peak GB':>9s}{'skipped rows':>14s}")
    for name, r in results.items():
        print(f"  {name:22s}{r['dtype']:>6s}" + "".join(f"{r['seconds/' + s]:10.2f}s" for s in stages)
              + f"{r['tokens_per_s_generate']:11.1f}{r['peak_memory_gb']:9.2f}{r['skipped']:>14s}")
    for way in ways[1:]:  # each way against the first one named
        for algo in algos:
            ratio = results[f"{ways[0]} {algo}"]["seconds/iteration"] / results[f"{way} {algo}"]["seconds/iteration"]
            results[f"{algo}_{ways[0]}_over_{way}_time"] = ratio
            print(f"  {algo}: {ways[0]} / {way} iteration time: {ratio:.2f}x")
    taught, plain = TEACHER_COST
    if taught in algos and plain in algos:
        for way in ways:
            ratio = results[f"{way} {taught}"]["seconds/iteration"] / results[f"{way} {plain}"]["seconds/iteration"]
            paired = [s["seconds/iteration"] / g["seconds/iteration"]
                      for s, g in zip(timings[f"{way} {taught}"], timings[f"{way} {plain}"])]  # one per repeat
            # Both algorithms do the same work but the teacher pass (forced lengths, the same env and skipped
            # rows), so their other seconds are one quantity measured 2 x repeats times: pooled, they give
            # the ratio without the run-to-run noise of a shared stage (its median over every timed iteration).
            shared = statistics.median(r["seconds/iteration"] - r["seconds/teacher"]
                                       for r in timings[f"{way} {taught}"] + timings[f"{way} {plain}"])
            pooled = 1 + results[f"{way} {taught}"]["seconds/teacher"] / shared
            results[f"{taught}_over_{plain}_time_{way}"] = ratio
            results[f"{taught}_over_{plain}_time_{way}_per_repeat"] = paired
            results[f"{taught}_over_{plain}_time_{way}_pooled"] = pooled
            print(f"  SHARPO / GRPO iteration time, {way}: {ratio:.3f}x (the teacher pass is the difference); "
                  f"per repeat " + ", ".join(f"{x:.3f}" for x in paired)
                  + f"; 1 + teacher / the shared stages pooled over both: {pooled:.3f}x")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    run(main)
