"""Beside TRL: seconds per GRPO iteration, ours (train.py's loop) against TRL's GRPOTrainer, on the same work.

The work, on both sides (the decode issue's "aligned work"):
  model       the embedded SmolLM2-135M-Instruct in float32, loaded by infra.models.load_policy, with a new
              LoRA adapter of rank 8 and alpha 16 on every linear of all 30 decoder layers (the same seed,
              so the same starting adapter); --dtype bf16: bf16 weights, and TRL's bf16=True
  prompt      one: tools/bench.py's synthetic first observation (~--obs-words words) in the chat template,
              the token ids ours feeds, given to TRL as their text (the tool checks that it tokenizes back
              to the same ids)
  completions --completions of exactly --new-tokens tokens (the end of turn blocked until then), sampled
              at temperature 1 with no top-p or top-k; rewards 10, 0, 10, 0, ... (the group has spread)
  update      GRPO's clipped loss without a KL term, micro-batches of --micro-batch-rows rows, one AdamW
              step (learning rate 1e-5, constant) an iteration; activations kept for the backward, not
              recomputed (TRL's GRPOConfig recomputes them by default: turned off here, as ours on a CPU)
Ours: train.Trainer with --algo grpo on tools/bench.py's synthetic env, one step an episode: it samples
(speed.py's decoding), scores the sampled tokens once more with the adapter as it is (the PPO baseline), and
updates. TRL: trl.GRPOTrainer on the same model, sampling with transformers' generate; with one update per
generation it takes the baseline from its loss's own pass, so it skips that pass (less work than ours).
An iteration's seconds: ours, one train.Trainer.iteration; TRL's, from its step's start to its end (the
generation, the loss's passes and the optimizer step), timed by a callback.

Each side runs in a process of its own (--side ours or trl): --warmup iterations, then --iterations timed.
With --side both (the default) the tool alternates processes: ours, TRL, ours, TRL, ... (--rounds of each),
and prints each side's iterations, their medians and ours / TRL's (and the same ratio round by round).

TRL is not a dependency of this project: install it beside it to run the TRL side (pip install trl;
docs/scaling.md's figures are trl 1.13.0's). The tool says so, and stops, where it is missing.

Run: python -m tools.beside_trl --rounds 2 --out beside-trl.json      (~7 minutes on a 2-core EPYC)
     python -m tools.beside_trl --side ours --iterations 1              (ours alone: no TRL needed)
"""
from __future__ import annotations

import errors  # first: a Ctrl-C or kill while the imports below load is one line

errors.quiet_start(__name__)
# isort: split

import importlib.metadata
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import infra.models  # noqa: F401  first: it quiets two third-party notices before peft loads bitsandbytes
# isort: split
import torch

import train
from infra.checkpoint import check_writable, write_atomic
from infra.cli import UserError, check_domains, parse_dataclass, run
from infra.models import load_policy
from tools.bench import BenchTrainer, SyntheticEnv, forced_lengths

LEARNING_RATE = 1e-5
LORA = dict(lora_r=8, lora_alpha=16)  # on every layer: load_policy's lora_layers 0


@dataclass
class BesideTrlArgs:
    """Command-line flags of tools/beside_trl.py."""

    side: Literal["both", "ours", "trl"] = "both"  # the side this process times; both: alternate processes of each
    rounds: int = 2  # with --side both: processes of each side, alternating
    warmup: int = 1  # iterations run first, not timed, in each process
    iterations: int = 3  # timed iterations in each process
    completions: int = 8  # completions of the one prompt an iteration (one group)
    new_tokens: int = 64  # each completion's length, exactly
    obs_words: int = 200  # the prompt's observation, in words (tools/bench.py's synthetic env)
    micro_batch_rows: int = 4  # rows per forward/backward in the update
    dtype: Literal["fp32", "bf16"] = "fp32"  # the model's precision on both sides
    model: str = "smollm2"  # smollm2 | tiny (the test model: the tool's own check, not a timing)
    prompt_from: str | None = None  # --side trl: our side's JSON (its prompt_ids); none: ours plays one iteration first
    out: str | None = None  # also write the figures as JSON here


class OurTrainer(BenchTrainer):
    """tools/bench.py's trainer, keeping each iteration's rows (the prompt's ids, the responses' lengths)."""

    def segments(self, trajs):
        self.rows = super().segments(trajs)
        return self.rows


def our_trainer(args: BesideTrlArgs) -> OurTrainer:
    """train.Trainer (--algo grpo) over one group of --completions episodes of one step each, every
    response exactly --new-tokens long, the rewards 10, 0, 10, ..."""
    model, tokenizer = load_policy(args.model, dtype=args.dtype, announce=lambda *_: None, **LORA)
    flags = dict(preset="none", model=args.model, algo="grpo", groups=1, group_size=args.completions, max_steps=1,
                 max_new_tokens=args.new_tokens, dtype=args.dtype, micro_batch_rows=args.micro_batch_rows,
                 kl_coef=0.0, minibatches=1, ppo_epochs=1, lr=LEARNING_RATE, temperature=1.0, eval_every=0,
                 iterations=args.warmup + args.iterations, output_dir=str(Path(tempfile.gettempdir()) / "sharpo-trl"))
    targs = train.parse_args([f"--{k.replace('_', '-')}={v}" for k, v in flags.items()])
    env = SyntheticEnv(1, args.obs_words, args.completions, tied=0.0)
    return forced_lengths(OurTrainer(targs, model=model, tokenizer=tokenizer, env=env), args.new_tokens)


def time_ours(args: BesideTrlArgs) -> dict:
    """Our loop's seconds per iteration (train.Trainer.iteration) and per stage, and what it did: the prompt's
    ids (for TRL's side), the rows and their responses' lengths."""
    trainer = our_trainer(args)
    seconds, stages = [], []
    for i in range(args.warmup + args.iterations):
        clock = time.perf_counter()
        line, _ = trainer.iteration()
        if i >= args.warmup:
            seconds.append(time.perf_counter() - clock)
            stages.append({k.split("/")[1]: round(v, 2) for k, v in line.items() if k.startswith("seconds/")})
    rows = trainer.rows.rows
    return {"seconds": seconds, "stages": stages, "prompt_ids": rows[0].input_ids[: rows[0].num_prompt],
            "rows": len(rows), "response_lengths": sorted({len(row.response_ids) for row in rows})}


def check_trl() -> None:
    """TRL importable here, or a line that says how to have it."""
    if importlib.util.find_spec("trl") is None:
        raise UserError("TRL is not installed: it is not a dependency of this project, only the other side of this "
                        "benchmark. Install it beside it (pip install trl; docs/scaling.md measured trl 1.13.0), or "
                        "time our side alone with --side ours")


def time_trl(args: BesideTrlArgs, prompt_ids: list[int]) -> dict:
    """TRL's GRPOTrainer's seconds per step (one generation of --completions and one optimizer step)."""
    check_trl()
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    model, tokenizer = load_policy(args.model, dtype=args.dtype, announce=lambda *_: None, **LORA)
    prompt = tokenizer.decode(prompt_ids)
    if tokenizer(text=prompt)["input_ids"] != list(prompt_ids):  # TRL tokenizes a text prompt this way
        raise RuntimeError("beside_trl: the prompt's text does not tokenize back to our prompt's ids")

    class Clock(TrainerCallback):
        def __init__(self):
            self.seconds = []

        def on_step_begin(self, *_, **__):
            self.start = time.perf_counter()

        def on_step_end(self, *_, **__):
            self.seconds.append(time.perf_counter() - self.start)

    def rewards(completions, **_):
        return [10.0 * (i % 2 == 0) for i in range(len(completions))]

    steps = args.warmup + args.iterations
    config = GRPOConfig(
        output_dir=str(Path(tempfile.gettempdir()) / "sharpo-trl-side"), use_cpu=True, bf16=args.dtype == "bf16",
        per_device_train_batch_size=args.micro_batch_rows,
        gradient_accumulation_steps=max(1, args.completions // args.micro_batch_rows),  # one step per generation
        num_generations=args.completions, max_completion_length=args.new_tokens,
        generation_kwargs={"min_new_tokens": args.new_tokens}, temperature=1.0, top_p=1.0, top_k=0,
        beta=0.0, num_iterations=1, epsilon=0.2, learning_rate=LEARNING_RATE, lr_scheduler_type="constant",
        gradient_checkpointing=False,  # TRL's default recomputes activations in the backward; ours on a CPU does not
        max_steps=steps, logging_steps=1, report_to="none", save_strategy="no", disable_dropout=True, seed=0,
        dataloader_num_workers=0)
    clock = Clock()
    trainer = GRPOTrainer(model=model, reward_funcs=rewards, args=config, processing_class=tokenizer,
                          train_dataset=Dataset.from_dict({"prompt": [prompt] * steps}), callbacks=[clock])
    trainer.train()
    return {"seconds": clock.seconds[args.warmup :], "prompt_tokens": len(prompt_ids),
            "trl": importlib.metadata.version("trl")}


def alternate(args: BesideTrlArgs) -> dict:
    """Processes of each side in turn (ours first), --rounds each; each side's iterations, medians, ratio."""
    check_trl()
    sides, ours = {"ours": [], "trl": []}, None
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for side in ("ours", "trl"):
                out = Path(tmp) / f"{side}-{r}.json"
                flags = {**asdict(args), "side": side, "out": str(out), "prompt_from": ours}
                argv = [f"--{k.replace('_', '-')}={v}" for k, v in flags.items() if v is not None]
                print(f"beside_trl: round {r + 1} of {args.rounds}, {side}", flush=True)
                subprocess.run([sys.executable, "-m", "tools.beside_trl", *argv], check=True)
                sides[side].append(json.loads(out.read_text()))
                ours = ours or str(out)  # the first of our side's: its prompt, for every TRL process
    return summary(args, sides)


def summary(args: BesideTrlArgs, sides: dict) -> dict:
    """Each side's seconds per iteration, their medians, and ours / TRL's (overall and per round)."""
    med = {side: statistics.median(s for run in runs for s in run["seconds"]) for side, runs in sides.items()}
    per_round = [statistics.median(o["seconds"]) / statistics.median(t["seconds"])
                 for o, t in zip(sides["ours"], sides["trl"])]
    out = {"args": asdict(args), "threads": torch.get_num_threads(), "sides": sides,
           "median_s": med, "ours_over_trl": med["ours"] / med["trl"], "ours_over_trl_per_round": per_round}
    trl = sides["trl"][0]
    print(f"\nbeside TRL {trl['trl']}: {args.model} {args.dtype}, {args.completions} completions of {args.new_tokens} "
          f"tokens after a {trl['prompt_tokens']}-token prompt, LoRA r8 on every layer")
    for side, runs in sides.items():
        print(f"  {side:5s} " + "; ".join(", ".join(f"{s:.1f}" for s in run["seconds"]) for run in runs)
              + f" s -> median {med[side]:.1f} s an iteration")
    print(f"  ours / TRL: {out['ours_over_trl']:.3f} (per round: {', '.join(f'{x:.3f}' for x in per_round)})")
    return out


def main(argv: list[str] | None = None) -> dict:
    args = parse_dataclass(BesideTrlArgs, argv, description=__doc__)
    problems = check_domains(args, positive=("rounds", "iterations", "completions", "new_tokens", "obs_words",
                                             "micro_batch_rows"), non_negative=("warmup",))
    if args.completions % args.micro_batch_rows:
        problems.append(f"--completions ({args.completions}) must be a multiple of --micro-batch-rows "
                        f"({args.micro_batch_rows}): TRL's step takes whole micro-batches")
    if problems:
        raise UserError("; ".join(problems))
    if args.out:
        check_writable(Path(args.out))
    if args.side == "both":
        results = alternate(args)
    elif args.side == "ours":
        results = time_ours(args)
    else:
        check_trl()
        if args.prompt_from:
            ids = json.loads(Path(args.prompt_from).read_text())["prompt_ids"]
        else:
            ids = time_ours(BesideTrlArgs(**{**asdict(args), "warmup": 0, "iterations": 1}))["prompt_ids"]
        results = time_trl(args, ids)
    if args.out:
        write_atomic(Path(args.out), json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    run(main)
