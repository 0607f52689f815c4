"""Flags: the method's flags with their defaults (the GPU setting), and what each --preset changes.

`--preset auto` (the default) is `cpu-demo` without a GPU, else `gpu`. A flag given on the command
line wins over its preset's value; a run prints the changes in force, with their reasons, when it
starts. A resumed run keeps the flags it started with (infra/config.py applies these and checks
every value).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from baselines import BaselineArgs
from infra.run_args import RunArgs


@dataclass
class MethodArgs:
    """The method's flags (METHOD.md), their defaults the GPU setting."""

    env: Literal["alfworld", "webshop"] = "alfworld"
    """the environment the agent acts in"""
    algo: Literal["sharpo", "grpo", "rlsd", "stepopsd", "sdar", "gigpo"] = "sharpo"
    """credit assignment: SHARPO, GRPO, or a baseline (baselines.py)"""
    iterations: int = 100
    """training iterations, one rollout batch each"""
    groups: int = 16
    """groups per iteration: each a task (distinct while there are enough) played G times"""
    group_size: int = 8
    """rollouts per task: G, the group GRPO compares"""
    max_steps: int = 0
    """env steps per episode; 0 = the env's default (ALFWorld 50, WebShop 15)"""
    max_new_tokens: int = 256
    """response length limit per turn"""
    history: str = "2"
    """observation/action pairs in the prompt: an integer H, or "all" """
    temperature: float = 1.0
    """rollout sampling temperature (the log-probs divide the logits by the same)"""
    hindsight: Literal["sibling", "expert"] = "sibling"
    """the teacher's hindsight block: a successful group mate's actions, or the env's own plan"""
    episode_stats: Literal["trajectory", "step"] = "trajectory"
    """GRPO's group mean and std over trajectories, or over step rows (verl-agent)"""
    lam: float = 0.5
    """the multiplier's weight: Ahat = A * ((1 - lam) + lam * m) (Eq. 5); 0 = GRPO, no teacher"""
    eps_m: float = 0.2
    """the multiplier's bound: m in [1 - eps_m, 1 + eps_m] (Eq. 4)"""
    gap_tokens: Literal["all", "action"] = "all"
    """the tokens the segment gap averages: all of the response, or those inside <action>"""
    ppo_clip: float = 0.2
    """PPO's ratio clip (Eq. 6)"""
    kl_coef: float = 0.01
    """the k3 KL to the reference, the adapter off (Eq. 7); 0 skips the reference pass"""
    shuffle_rewards: bool = False
    """a control, not a method: each group's rewards dealt out among its episodes by chance"""
    lr: float = 3e-6
    """AdamW's learning rate (verl-agent's LoRA setting: 3e-6)"""
    weight_decay: float = 0.0
    """AdamW's weight decay"""
    grad_clip: float = 1.0
    """the largest gradient norm an optimizer step takes"""
    minibatches: int = 2
    """optimizer steps per rollout batch and epoch"""
    ppo_epochs: int = 1
    """passes over the rollout batch"""
    seed: int = 0
    """the seed of task sampling, generation and the LoRA's initial weights"""


@dataclass
class TrainArgs(MethodArgs, BaselineArgs, RunArgs):
    """train.py's flags: the method's (above), the baselines' (baselines.py) and the run's (model,
    data, run folder, logs: infra/run_args.py), each a section of --help."""



DATA = Path(__file__).resolve().parent / "data"
WARMSTART = DATA / "warmstart" / "smollm2-alfworld"
WEBSHOP_WARMSTART = DATA / "warmstart" / "smollm2-webshop"  # cloned on the 51 train goals (tools/warmstart.py)
LEARN_WARMSTART = DATA / "warmstart" / "smollm2-alfworld-learn"  # cloned on data/alfworld-learn-warmstart
SMOLLM2_ON_CPU = {  # the rows the CPU presets share: the embedded model, its warm start's answers, its adapter
    "model": ("smollm2", "the embedded SmolLM2-135M-Instruct: it installs offline and runs on a CPU"),
    "max_new_tokens": (64, "the warm start answers in ~40 tokens"),
    "hindsight": ("expert", "the 135M model rarely has a winning sibling: the expert's plan gives "
                            "every trajectory a hindsight block"),
    "kl_coef": (0.0, "no KL term: no reference pass, and rows whose Ahat is 0 sit out the student "
                     "pass and the update"),
    "lora_r": (8, "a small adapter for a small model"),
    "lora_alpha": (16, "a small adapter for a small model"),
}
# What each preset changes from TrainArgs's and RunArgs's defaults (the GPU setting), and why:
# flag -> (value, reason). The run prints these at start; docs/training.md's preset tables are
# made from them (infra/config.py's preset_tables, checked by tests/test_docs.py).
PRESET_CHANGES = {
    "gpu": {},
    "course": {  # a 24 GB GPU (L4, A10, RTX 4090) at a pace a lab session can watch (docs/scaling.md)
        "model": ("Qwen/Qwen2.5-1.5B-Instruct", "a 1.5B model: 2.9 GiB of bf16 weights, room on a 24 GB card for "
                                                "every episode's rollout at once (infra/memory.py)"),
        "load_in_4bit": (False, "bf16 weights: a 1.5B model fits without nf4, and no pass dequantizes"),
        "lora_r": (32, "a smaller adapter for a smaller model"),
        "lora_alpha": (32, "a smaller adapter for a smaller model"),
        "groups": (4, "4 tasks x 4 rollouts: 16 episodes, ~4-8 minutes an iteration on an L4 (estimated from the H200, docs/scaling.md)"),
        "group_size": (4, "4 tasks x 4 rollouts: 16 episodes, ~4-8 minutes an iteration on an L4 (estimated from the H200, docs/scaling.md)"),
        "max_steps": (20, "20 steps, not 50: failed episodes end sooner; the longest tasks are cut"),
        "max_new_tokens": (192, "a think and an action fit in 192 tokens"),
        "iterations": (30, "two hours of a lab, not days"),
        "eval_every": (5, "a held-out point every ~20 minutes"),
        "eval_games": (16, "16 held-out games: a coarse curve, quickly played"),
    },
    "cpu-demo": {  # minutes on 2 CPU cores with the embedded SmolLM2-135M; still exercises SHARPO
        **SMOLLM2_ON_CPU,
        "iterations": (2, "a demo of minutes: two iterations show the loop, not learning"),
        "groups": (2, "2 tasks x 4 rollouts: 8 episodes an iteration"),
        "group_size": (4, "2 tasks x 4 rollouts: 8 episodes an iteration"),
        "lr": (1e-4, "a 135M model and 2 iterations: a larger step than the 7B setting's 3e-6"),
        "lora_layers": (10, "LoRA on the last 10 of the model's 30 layers: a third of the backward"),
        "eval_every": (0, "the run ends with its segments table, not an evaluation"),
    },
    "cpu-learn": {  # the CPU run meant to learn (data/alfworld-learn): recipe K of the pilot sweep
        # (results/learning-cpu/sweep, in git history at e287449): 4 tasks x 4 rollouts for 8 iterations, 4
        # optimizer steps each, saw 8-15 groups holding both a win and a loss; 2 x 8 for 4 iterations saw 2-5
        **SMOLLM2_ON_CPU,
        "data_dir": (str(DATA / "alfworld-learn"), "the learning set: 64 train games, 32 held out"),
        "init_adapter": (str(LEARN_WARMSTART), "a warm start cloned on 16 other games"),
        "temperature": (0.6, "at temperature 1 the 135M policy won 0 of 16 rollouts; at 0.6 it wins some"),
        "iterations": (8, "recipe K of the pilot sweep: the gain is there by iteration 4"),
        "groups": (4, "4 tasks x 4 rollouts: more groups with both a win and a loss than 2 x 8"),
        "group_size": (4, "4 tasks x 4 rollouts: more groups with both a win and a loss than 2 x 8"),
        "max_steps": (6, "short episodes: 6 steps"),
        "lr": (3e-4, "recipe K of the pilot sweep"),
        "minibatches": (4, "recipe K: 4 optimizer steps an iteration"),
        "eval_every": (8, "one held-out evaluation, at the end"),
        "eval_split": ("valid_seen", "the learning set's held-out games"),
    },
    "cpu-watch": {  # learning to watch in a quarter-hour on 2 CPU cores: the demo's model, warm start and
        # short games, all 4 of them every iteration (results/watch-cpu: 3 seeds and 3 placebos). Pilots, seed 0:
        # lr 3e-4 at temperature 1 and 4 steps won 0.25, 0.31, 0.25, 0.06 (no group held a win and a loss); at
        # temperature 0.6 and 6 steps, lr 3e-4 won 0.38 -> 0.56 by iteration 5, lr 1e-3 0.38 -> 0.88
        **SMOLLM2_ON_CPU,
        "init_adapter": (str(WARMSTART), "the demo's behaviour-cloned warm start: at temperature 0.6 it wins about "
                                         "1 episode in 3 of these games"),
        "max_plan_len": (4, "the 4 shipped train games whose expert needs at most 4 steps: each iteration plays all 4, "
                            "so the curve follows the policy, not which games were drawn"),
        "groups": (4, "4 tasks x 4 rollouts: every one of the 4 games, 16 episodes an iteration"),
        "group_size": (4, "4 tasks x 4 rollouts: every one of the 4 games, 16 episodes an iteration"),
        "max_steps": (6, "6 steps for plans of at most 4: room for a wrong step, so more groups hold a win and a loss"),
        "temperature": (0.6, "at temperature 1 the warm start wins only the one 3-step game; at 0.6 it wins some "
                             "of the others"),
        "iterations": (8, "about 15 minutes on 2 cores (bf16): the pilots' success rose over iterations 3-6"),
        "lr": (1e-3, "a step that moves a 135M model's success within a few iterations (3e-4 moved it half as far)"),
        "ppo_epochs": (2, "two passes over each batch: more learning from each iteration's 16 episodes"),
        "lora_layers": (10, "LoRA on the last 10 of the model's 30 layers: a third of the backward"),
        "eval_every": (0, "its success is on the 4 games it trains on; held-out games are --preset cpu-learn's "
                          "question (docs/evidence.md)"),
    },
    "none": {},
}
CPU_DEMO_ENV_CHANGES = {  # each env's shipped warm start, for SmolLM2
    "alfworld": {
        "init_adapter": (str(WARMSTART), "a behaviour-cloned warm start: without one the 135M model "
                                         "cannot write the answer format"),
        "max_plan_len": (4, "the shipped games whose expert needs at most 4 steps"),
        "max_steps": (4, "short episodes: 4 steps"),
    },
    "webshop": {
        "init_adapter": (str(WEBSHOP_WARMSTART), "a behaviour-cloned warm start: without one the 135M "
                                                 "model cannot write the answer format"),
        "max_steps": (6, "expert plans are 4-5 steps"),
        "history": ("1", "a results page is ~470 tokens: one observation of history, not two"),
        "max_new_tokens": (96, "a search answer repeats the goal's words (up to 85 tokens)"),
    },
}
