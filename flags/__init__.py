"""Flags: every flag of train.py, its default (the GPU setting), what each --preset changes, and why.

Resolution (flags/parse.py): a flag given on the command line wins over its preset's value
(`--preset auto`, the default, is `cpu-demo` without a GPU, else `gpu`), which wins over the
dataclasses' defaults below. A run prints the preset's changes in force, with their reasons, when
it starts. `--resume RUN` keeps the flags the run started with: only RESUME_MAY_CHANGE may change,
and SESSION_ONLY's (--plain) hold for the session that gives them. Every value is checked before
anything loads (flags/parse.py's `check`); config.json in the run folder records the resolved
flags. This file is the flags' one home: a function elsewhere that needs one of these values takes
it as an argument.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

import torch

from baselines import ALGORITHMS
from envs import ENVS
from errors import UserError
from infra.cli import choice_of, float_in


# ------------------------------------------------------------------ the flags
# A float flag's type names the values it computes with (infra/cli.py's float_in, shown by --help): a
# weight of a loss term or an advantage at most 100, a learning rate at most 1 (an AdamW step moves each
# weight by about lr), a temperature in [0.01, 100] (the logits over T overflow near 0). Any other value
# is refused in one line before anything loads.
@dataclass
class MethodArgs:
    """The method's flags (METHOD.md), their defaults the GPU setting."""

    env: choice_of(ENVS) = "alfworld"
    """the environment the agent acts in (envs.ENVS)"""
    algo: choice_of(ALGORITHMS) = "sharpo"
    """credit assignment: SHARPO, GRPO, or a baseline (baselines.ALGORITHMS)"""
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
    temperature: float_in("[0.01, 100]") = 1.0
    """rollout sampling temperature (the log-probs divide the logits by the same)"""
    hindsight: Literal["sibling", "expert"] = "sibling"
    """the teacher's hindsight block: a successful group mate's actions, or the env's own plan"""
    episode_stats: Literal["trajectory", "step"] = "trajectory"
    """GRPO's group mean and std over trajectories, or over step rows (verl-agent)"""
    lam: float_in("[0, 1]") = 0.5
    """the multiplier's weight: Ahat = A * ((1 - lam) + lam * m) (Eq. 5); 0 = GRPO, no teacher (sdar
    scales no advantage: it ignores lam)"""
    eps_m: float_in("(0, 1)") = 0.2
    """the multiplier's bound: m in [1 - eps_m, 1 + eps_m] (Eq. 4)"""
    gap_tokens: Literal["all", "action"] = "all"
    """the tokens the segment gap averages: all of the response, or those of its last
    <action>...</action> block, tags included"""
    ppo_clip: float_in("(0, 1)") = 0.2
    """PPO's ratio clip (Eq. 6)"""
    kl_coef: float_in("[0, 100]") = 0.01
    """the k3 KL to the reference, the adapter off (Eq. 7); 0 skips the reference pass"""
    shuffle_rewards: bool = False
    """a control, not a method: each group's rewards dealt out among its episodes by chance"""
    lr: float_in("(0, 1]") = 3e-6
    """AdamW's learning rate (verl-agent's LoRA setting: 3e-6)"""
    weight_decay: float_in("[0, 1]") = 0.0
    """AdamW's weight decay"""
    grad_clip: float_in("(0, inf)") = 1.0
    """the largest gradient norm an optimizer step takes"""
    minibatches: int = 2
    """optimizer steps per rollout batch and epoch"""
    ppo_epochs: int = 1
    """passes over the rollout batch"""
    seed: int = 0
    """the seed of task sampling, generation and the LoRA's initial weights"""


@dataclass
class BaselineArgs:
    """The baselines' own flags (baselines.py)."""

    gigpo_gamma: float_in("[0, 1]") = 0.95
    """--algo gigpo: the discount of the step return R_t (Eq. 11)"""
    gigpo_omega: float_in("[0, 100]") = 1.0
    """--algo gigpo: the step advantage's weight, A_i + omega * A_step (Eq. 13)"""
    gigpo_norm: Literal["std", "mean"] = "std"
    """--algo gigpo: both advantages (R - mean) / std, or R - mean (verl-agent's mean_norm)"""
    sdar_coef: float_in("[0, 100]") = 0.01
    """--algo sdar: the weight of the gated self-distillation term (Eq. 10)"""
    sdar_beta: float_in("[0, 100]") = 5.0
    """--algo sdar: the gate's sharpness, sigmoid(beta * delta) (Eq. 10)"""


@dataclass
class RunArgs:
    """How a run of train.py is executed: model and precision, data, run folder, logs, evaluation.
    They change where and how fast the method runs, not what it computes."""

    preset: Literal["auto", "gpu", "course", "cpu-demo", "cpu-learn", "cpu-watch", "none"] = "auto"  # auto: cpu-demo without a GPU, else gpu; course: a 24 GB GPU
    model: str | None = None  # HF id or local path, "smollm2" (embedded) or "tiny"; default per device
    load_in_4bit: bool | None = None  # 4-bit nf4 weights; default: infra.models.default_load_in_4bit's rule
    dtype: Literal["auto", "bf16", "fp32"] = "auto"  # compute precision; auto: bf16 on a GPU, on a CPU the faster, measured
    lora_r: int = 64  # LoRA rank (verl-agent: 64)
    lora_alpha: int = 64  # LoRA alpha (verl-agent: 64)
    lora_layers: int = 0  # LoRA on the last N decoder layers only (0 = all); the update computes only those N
    init_adapter: str | None = None  # LoRA merged into the base first (tools/warmstart.py output); none = no warm start
    data_dir: str | None = None  # env data folder; default: $ALFWORLD_DATA / $WEBSHOP_DATA, else the shipped data
    split: str = "train"  # split the training tasks come from
    max_plan_len: int = 0  # keep only tasks whose expert plan has at most this many steps (0 = all)
    env_workers: int = 0  # ALFWorld: processes the episodes run in; 0 = CPU cores, capped by the batch; 1 = in-process
    env_timeout: float_in("(0, inf)") = 600.0  # seconds an env worker may take for one reset or step (a frozen one: 20 s without a heartbeat)
    rollout: Literal["hf", "vllm"] = "hf"  # who decodes the rollouts: hf (generate) | vllm (installed apart: vllm_rollout/)
    rollout_batch: int = 0  # --rollout hf: episodes per generate call (0 = every live one); bounds the prefill's memory
    vllm_gpu_memory: float_in("(0, 1)") = 0.35  # --rollout vllm on a GPU: the share of its memory vLLM may take beside training
    micro_batch_rows: int = 4  # rows per forward/backward (gradients accumulate over them)
    plain: bool = False  # only rollout.py's plain passes (one forward per row), not speed.py's: slower, equal to rounding; for this session only (a resume without it runs speed.py's)
    gradient_checkpointing: bool | None = None  # recompute activations in backward; default: on for CUDA
    eval_every: int = 10  # greedy evaluation every N iterations (0 = never)
    eval_split: str | None = None  # evaluation split; default: the env's (ALFWorld: valid_unseen, WebShop: test)
    eval_games: int = 32  # games per evaluation
    save_every: int = 1  # checkpoint every N iterations
    keep_checkpoints: int = 2  # complete checkpoints kept in RUN_DIR/checkpoints (the newest ones)
    samples_per_iter: int = 2  # sample trajectories written to samples.jsonl per iteration
    report_to: Literal["none", "tensorboard", "trackio", "wandb"] = "none"  # live dashboard (an optional extra)
    demo_data: bool = False  # with --preset gpu: train on the shipped demo games on purpose (else the real data is required)
    output_dir: str | None = None  # the run folder; default runs/<env>-<algo>[-<cpu preset>][-shuffled]; with --resume: that run's
    resume: str | None = None  # a run folder (or one of its checkpoints) to continue, in that run folder


@dataclass
class TrainArgs(MethodArgs, BaselineArgs, RunArgs):
    """train.py's flags: the method's, the baselines' and the run's (model, data, run folder,
    logs), each a section of --help."""


# ------------------------------------------------------------------ the presets
DATA = Path(__file__).resolve().parent.parent / "data"
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
# made from them (preset_tables below, checked by tests/test_docs.py).
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
        "groups": (2, "2 tasks x 3 rollouts: 6 episodes an iteration, each group still able to hold a win and a loss"),
        "group_size": (3, "2 tasks x 3 rollouts: 6 episodes an iteration, each group still able to hold a win and a loss"),
        "lr": (1e-4, "a 135M model and 2 iterations: a larger step than the 7B setting's 3e-6"),
        "lora_layers": (4, "LoRA on the last 4 of the model's 30 layers: the update's passes compute only those "
                             "(speed.py keeps each row's input to them from the student pass); a demo, not learning"),
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
    "cpu-watch": {  # learning to watch in about 10 minutes on 2 CPU cores (results/watch-xeon): the demo's
        # model, warm start and short games, all 4 of them every iteration (results/watch-xeon: 3 seeds and 3
        # placebos). Pilots, seed 0: lr 3e-4 at temperature 1 and 4 steps won 0.25, 0.31, 0.25, 0.06 (no group
        # held a win and a loss); at temperature 0.6 and 6 steps, lr 3e-4 won 0.38 -> 0.56 by iteration 5, lr
        # 1e-3 0.38 -> 0.88
        **SMOLLM2_ON_CPU,
        "init_adapter": (str(WARMSTART), "the demo's behaviour-cloned warm start: at temperature 0.6 it wins about "
                                         "1 episode in 3 of these games"),
        "max_plan_len": (4, "the 4 shipped train games whose expert needs at most 4 steps: each iteration plays all 4, "
                            "so the curve follows the policy, not which games were drawn"),
        "groups": (4, "4 tasks x 4 rollouts: every one of the 4 games, 16 episodes an iteration"),
        "group_size": (4, "4 tasks x 4 rollouts: every one of the 4 games, 16 episodes an iteration"),
        "max_steps": (5, "5 steps for plans of at most 4: room for a wrong step, so more groups hold a win and a "
                         "loss; a sixth turn costs about a sixth of the rollout"),
        "temperature": (0.6, "at temperature 1 the warm start wins only the one 3-step game; at 0.6 it wins some "
                             "of the others"),
        "iterations": (8, "7m44s (seed 0) on a 2-core AMD EPYC without AMX (bf16; results/watch-epyc); 9m48s "
                          "(seed 0) on a 2-core Xeon without AMX (float32; results/watch-xeon); 22m05s (seed 0) on a "
                          "2-core EPYC with AVX2 only (float32; results/decode-floor); each seed of "
                          "results/watch-xeon, watch-cpu and watch-epyc ended higher than it began"),
        "lr": (1e-3, "a step that moves a 135M model's success within a few iterations (3e-4 moved it half as far)"),
        "minibatches": (4, "4 optimizer steps an iteration, each row read once: the 4 steps of 2 epochs x 2 "
                           "minibatches in half the update's time"),
        "lora_layers": (10, "LoRA on the last 10 of the model's 30 layers: the update's passes compute only those "
                              "(speed.py keeps each row's input to them from the student pass)"),
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

PRESETS = {name: {k: v for k, (v, _) in changes.items()} for name, changes in PRESET_CHANGES.items()}
CPU_DEMO_PER_ENV = {env: {k: v for k, (v, _) in changes.items()} for env, changes in CPU_DEMO_ENV_CHANGES.items()}
GAMES_OF = {"cpu-learn": ("alfworld", "data/alfworld-learn"), "cpu-watch": ("alfworld", "data/alfworld's")}  # preset ->
# the env and the games it is made for
GPU_PRESETS = ("gpu", "course")  # presets that train on real data and refuse to start without it


def preset_changes(preset: str, env: str) -> dict[str, tuple]:
    """What the (resolved) preset changes for this env: flag -> (value, reason)."""
    return {**PRESET_CHANGES[preset], **(CPU_DEMO_ENV_CHANGES.get(env, {}) if preset == "cpu-demo" else {})}


def preset_defaults(preset: str, env: str) -> tuple[str, dict]:
    """(resolved preset name, the defaults it sets for this env)."""
    if preset == "auto":
        preset = "gpu" if torch.cuda.is_available() else "cpu-demo"
    if preset in GAMES_OF and env != GAMES_OF[preset][0]:
        made_for, games = GAMES_OF[preset]
        raise UserError(f"--preset {preset} is {made_for}'s (its games are {games}); drop it for --env {env}")
    return preset, {k: v for k, (v, _) in preset_changes(preset, env).items()}


def preset_lines(args: TrainArgs) -> list[str]:
    """What the run's preset changed from the GPU setting and is still in force (a flag given on the
    command line wins), each with its reason; flags that share a reason share a line."""
    kept = [(flag, value, why) for flag, (value, why) in preset_changes(args.preset, args.env).items()
            if getattr(args, flag) == value]
    if not kept:
        return []
    lines, flags = [f"the {args.preset} preset changes, from the GPU setting:"], []
    for i, (flag, value, why) in enumerate(kept):
        flags.append(f"--{flag.replace('_', '-')} {shown(value)}")
        if i + 1 == len(kept) or kept[i + 1][2] != why:
            lines.append(f"  {' '.join(flags)}: {why}")
            flags = []
    return lines


def shown(value) -> str:
    """A flag's value as a reader would type it: paths relative to the repository."""
    text = str(value)
    return text.replace(str(DATA.parent) + os.sep, "") if isinstance(value, str) else text


def preset_tables() -> str:
    """docs/training.md's preset tables: what each preset changes, to what, and why."""
    out = []
    for name, changes in PRESET_CHANGES.items():
        if not changes:
            continue
        out += [f"`--preset {name}`:", "", "| flag | value | why |", "|---|---|---|"]
        out += [f"| `--{k.replace('_', '-')}` | {shown(v)} | {why} |" for k, (v, why) in changes.items()]
        out.append("")
        if name == "cpu-demo":
            for env, extra in CPU_DEMO_ENV_CHANGES.items():
                out += [f"`--preset cpu-demo` adds, with `--env {env}`:", "", "| flag | value | why |",
                        "|---|---|---|"]
                out += [f"| `--{k.replace('_', '-')}` | {shown(v)} | {why} |" for k, (v, why) in extra.items()]
                out.append("")
    return "\n".join(out)


TABLE_ROWS = (("temperature",), ("hindsight",), ("lam",), ("eps_m",), ("ppo_clip",), ("kl_coef",), ("lr",),
              ("model",))  # what the method reads, and the policy


def table_cell(value) -> str:
    """A value as the table of defaults shows it: none, a warm start by its folder's name, else as typed."""
    if value is None:
        return "none"
    return Path(value).name if isinstance(value, str) and value.startswith(str(DATA)) else shown(value)


def default_table(env: str = MethodArgs.env) -> str:
    """METHOD.md's table of what runs by default: the flags the method's equations and teacher read,
    and the model, under the GPU setting and each CPU preset (with --env `env`), so that a reader of
    the method sees which hindsight, KL and temperature ran."""
    from infra.models import QWEN_DEFAULT  # deferred: only the docs' test asks (the model code is heavy)

    cpu = [p for p in PRESET_CHANGES if p.startswith("cpu-")]
    values = {"gpu": {f.name: getattr(TrainArgs, f.name) for f in fields(TrainArgs)}}
    values["gpu"]["model"] = f"{QWEN_DEFAULT} (4-bit)"
    for p in cpu:
        values[p] = {**values["gpu"], **preset_defaults(p, env)[1]}
    out = ["| flag | GPU (`gpu`) | " + " | ".join(f"`{p}`" for p in cpu) + " |", "|---" * (len(cpu) + 2) + "|"]
    for row in TABLE_ROWS:
        cells = [", ".join(table_cell(values[p][n]) for n in row) for p in ["gpu", *cpu]]
        out.append("| " + ", ".join(f"`--{n.replace('_', '-')}`" for n in row) + " | " + " | ".join(cells) + " |")
    return "\n".join(out)


# A resumed run keeps its flags, but for these: they do not change what is learned, only how long, how
# often it is evaluated or logged, and how memory is traded for time. Not --preset: presets make new runs.
RESUME_MAY_CHANGE = ("env_timeout", "iterations", "eval_every", "eval_split", "eval_games", "save_every",
                     "keep_checkpoints", "samples_per_iter", "rollout_batch", "micro_batch_rows", "plain",
                     "gradient_checkpointing", "env_workers", "resume", "output_dir", "report_to")
SESSION_ONLY = ("plain",)  # a resume that does not give these takes their default, not the last session's
# Flags added after some runs were saved: a config.json without one takes its default, said in one line.
# A config.json without any other flag is not a complete train.py config and is refused.
LATER_FLAGS = ("episode_stats", "lora_layers", "rollout_batch", "demo_data", "env_timeout")
MAX_EPISODES, MAX_STEPS, MAX_NEW_TOKENS = 4096, 1000, 16384  # sizes refused: no run of them finishes soon
MAX_OPTIMIZER_STEPS = 4096  # --minibatches x --ppo-epochs an iteration (verl-agent's: 2 x 1)
