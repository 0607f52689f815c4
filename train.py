"""Train: one loop on one GPU (or CPU) that turns episodes into SHARPO updates of a LoRA policy.

Each iteration (METHOD.md; the numbers are the stages below):
  1. rollout    G rollouts of each of --groups tasks, one batched generate per turn
  2. segments   one training row per step (context c_k, response a_k = one segment);
                the hindsight teacher's rows (--hindsight sibling | expert)
  3. teacher    log-probs of the sampled tokens: student (recomputed, before the update),
                teacher (same policy, hindsight context), reference (adapter off, for the KL)
  4. advantage  A_i = GRPO over each group; Ahat = A_i * ((1 - lam) + lam * m_{i,k})
  5. update     PPO-clip on Ahat, --minibatches optimizer steps x --ppo-epochs, token-mean
  6. log / checkpoint / eval

--algo picks the credit assignment, all in the same code: sharpo (segment multiplier),
grpo (lam = 0), rlsd (per-token multiplier), stepopsd (2 * sigmoid multiplier), sdar (GRPO
advantage plus the gated self-distillation term in the loss), gigpo (no teacher: step groups
of the same state, A_i + omega * A_step).

Under torchrun / accelerate launch the same loop runs in N processes (distributed.py); the
lines that take part are marked [distributed] and do nothing in a plain run.

Deviations from the paper: see advantage.py; the teacher is the policy itself with the
hindsight block in its first user message, and rows without hindsight use multiplier 1.

Run: python train.py --env alfworld            (the CPU demo preset when no GPU is present)
"""
from __future__ import annotations

import json
import random
import resource
import sys
import time
import types
import typing
from collections import defaultdict
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Literal

import torch

from advantage import (
    gigpo_step_advantages,
    gigpo_token_advantages,
    grpo_advantages,
    policy_loss,
    segment_multipliers,
    sharpo_token_advantages,
    token_multipliers,
)
from cli import UserError
from distributed import DataParallel
from envs import alfworld, history_length, resolve_workers, webshop
from segments import (
    EXPERT_HEADLINE,
    Row,
    Trajectory,
    action_token_mask,
    build_row,
    build_teacher_row,
    collate_rows,
    format_plan,
    response_segment_ids,
    sibling_hindsight,
)

@dataclass
class TrainArgs:
    """Command-line flags of train.py (defaults: the GPU setting; --preset cpu-demo shrinks them)."""

    env: Literal["alfworld", "webshop"] = "alfworld"  # environment
    algo: Literal["sharpo", "grpo", "rlsd", "stepopsd", "sdar", "gigpo"] = "sharpo"  # credit assignment (METHOD.md)
    preset: Literal["auto", "gpu", "cpu-demo", "none"] = "auto"  # auto: cpu-demo without a GPU, else gpu
    model: str | None = None  # HF id or local path, "smollm2" (embedded) or "tiny"; default per device
    load_in_4bit: bool | None = None  # 4-bit nf4 weights; default: on for HF models on CUDA
    lora_r: int = 64  # LoRA rank (verl-agent: 64)
    lora_alpha: int = 64  # LoRA alpha (verl-agent: 64)
    init_adapter: str | None = None  # a LoRA adapter merged into the base first (warmstart.py output); none = no warm start
    data_dir: str | None = None  # env data folder; default: $ALFWORLD_DATA / $WEBSHOP_DATA, else the shipped data
    env_workers: int = 0  # ALFWorld: processes the episodes run in; 0 = CPU cores, capped by the batch; 1 = in-process
    split: str = "train"  # split the training tasks come from
    max_plan_len: int = 0  # keep only tasks whose expert plan has at most this many steps (0 = all)
    iterations: int = 100  # training iterations (one rollout batch each)
    groups: int = 16  # tasks per iteration (distinct while the split has enough)
    group_size: int = 8  # rollouts per task (G)
    max_steps: int = 0  # env steps per episode; 0 = the env's default (ALFWorld 50, WebShop 15)
    max_new_tokens: int = 256  # response length limit per turn
    history: str = "2"  # observation/action pairs in the prompt: an integer or "all"
    temperature: float = 1.0  # rollout sampling temperature (log-probs use the same)
    hindsight: Literal["sibling", "expert"] = "sibling"  # teacher's hindsight: a successful group mate | the env expert
    lam: float = 0.5  # mixing weight of the multiplier: Ahat = A * ((1 - lam) + lam * m)
    mult_eps: float = 0.2  # multiplier bound eps_m: m in [1 - eps_m, 1 + eps_m]
    gap_tokens: Literal["all", "action"] = "all"  # tokens averaged into the segment gap: all | inside <action>
    ppo_clip: float = 0.2  # PPO ratio clip
    kl_coef: float = 0.01  # k3 KL to the reference (adapter off); 0 skips the reference pass
    sdar_coef: float = 0.01  # --algo sdar: weight of the gated self-distillation term
    sdar_beta: float = 5.0  # --algo sdar: gate sharpness, sigmoid(beta * delta)
    gigpo_gamma: float = 0.95  # --algo gigpo: discount of the step return R_t
    gigpo_omega: float = 1.0  # --algo gigpo: weight of the step-group advantage, A_i + omega * A_step
    gigpo_norm: Literal["std", "mean"] = "std"  # --algo gigpo: step advantage (R - mean) / std, or R - mean
    lr: float = 3e-6  # AdamW learning rate (verl-agent LoRA: 3e-6)
    weight_decay: float = 0.0  # AdamW weight decay
    grad_clip: float = 1.0  # max gradient norm
    minibatches: int = 2  # optimizer steps per rollout batch and epoch
    ppo_epochs: int = 1  # passes over the rollout batch
    micro_batch_rows: int = 4  # rows per forward/backward (gradients accumulate over them)
    gradient_checkpointing: bool | None = None  # recompute activations in backward; default: on for CUDA
    eval_every: int = 10  # greedy evaluation every N iterations (0 = never)
    eval_split: str | None = None  # evaluation split; default: the env's (ALFWorld: valid_unseen, WebShop: test)
    eval_games: int = 32  # games per evaluation
    save_every: int = 1  # checkpoint every N iterations
    keep_checkpoints: int = 2  # complete checkpoints kept in RUN_DIR/checkpoints (the newest ones)
    samples_per_iter: int = 2  # sample trajectories written to samples.jsonl per iteration
    output_dir: str | None = None  # the run folder; default runs/<env>-<algo>[-cpu-demo]; with --resume: that run's
    resume: str | None = None  # a run folder (or one of its checkpoints) to continue, in that run folder
    seed: int = 0  # seed for task sampling, generation and LoRA init
    min_new_tokens: int = 0  # forced response length, for bench.py only: train.py refuses it (off-policy)


ALGOS = typing.get_args(typing.get_type_hints(TrainArgs)["algo"])  # ("sharpo", "grpo", ...)
WARMSTART = Path(__file__).resolve().parent / "data" / "warmstart" / "smollm2-alfworld"
PRESETS = {
    "gpu": {},
    "cpu-demo": dict(  # minutes on 2 CPU cores with the embedded SmolLM2-135M; still exercises SHARPO
        model="smollm2", lora_r=8, lora_alpha=16, lr=1e-4, kl_coef=0.0, iterations=2, groups=2, group_size=4,
        max_new_tokens=64, hindsight="expert", minibatches=2, micro_batch_rows=4, eval_every=2, eval_games=2,
    ),
    "none": {},
}
CPU_DEMO_PER_ENV = {  # the shipped warm start is ALFWorld's, for SmolLM2; short games keep episodes to 4 steps
    "alfworld": dict(init_adapter=str(WARMSTART), max_plan_len=4, max_steps=4),
    "webshop": dict(max_steps=6),
}
# Flags a resumed run may change: they do not change what is learned, only how long, how often
# it is evaluated or logged, and how memory is traded for time. Every other flag is the run's.
RESUME_MAY_CHANGE = ("iterations", "eval_every", "eval_split", "eval_games", "save_every", "keep_checkpoints",
                     "samples_per_iter", "micro_batch_rows", "gradient_checkpointing", "env_workers", "resume",
                     "output_dir", "preset")
SPLITS = {"alfworld": alfworld.SPLITS, "webshop": webshop.SPLITS}  # checked before anything loads


# ----------------------------------------------------------------------------- config
def preset_defaults(preset: str, env: str) -> tuple[str, dict]:
    """(resolved preset name, the defaults it sets for this env)."""
    if preset == "auto":
        preset = "gpu" if torch.cuda.is_available() else "cpu-demo"
    return preset, {**PRESETS[preset], **(CPU_DEMO_PER_ENV.get(env, {}) if preset == "cpu-demo" else {})}


def parse_args(argv: list[str] | None = None) -> TrainArgs:
    """Flags over the preset's defaults over the dataclass's defaults; with --resume, the saved
    run's flags, of which only RESUME_MAY_CHANGE may be changed. Every value is checked here,
    before anything loads."""
    from cli import build_parser, given_flags

    argv = sys.argv[1:] if argv is None else argv
    given = given_flags(TrainArgs, argv)  # also rejects unknown flags and bad choices, in one line
    if given.get("resume"):
        return resume_args(given)
    preset, defaults = preset_defaults(given.get("preset", "auto"), given.get("env", "alfworld"))
    args = TrainArgs(**vars(build_parser(TrainArgs, __doc__, defaults).parse_args(argv)))
    args.preset = preset
    if "init_adapter" in defaults and "init_adapter" not in given and args.model != defaults.get("model"):
        args.init_adapter = None  # a preset's warm start is for the preset's model only
    resolve_defaults(args)
    check_args(args)
    return args


def resolve_defaults(args: TrainArgs) -> None:
    """Write the device-dependent defaults into the config, so config.json says what ran."""
    cuda = torch.cuda.is_available()
    if args.model is None:
        from rollout import default_model_name

        args.model = default_model_name()
    if args.load_in_4bit is None:
        args.load_in_4bit = cuda and args.model not in ("tiny", "smollm2") and args.init_adapter is None
    if args.gradient_checkpointing is None:
        args.gradient_checkpointing = cuda
    if args.output_dir is None:
        args.output_dir = f"runs/{args.env}-{args.algo}" + ("-cpu-demo" if args.preset == "cpu-demo" else "")


def resume_args(given: dict) -> TrainArgs:
    """The saved run's flags, with the allowed changes; refuse the others, naming the flag. A run
    folder stopped before its first checkpoint restarts from iteration 1 with its saved flags."""
    from checkpoint import find_checkpoint, read_config, read_json, run_checkpoints, run_dir_of

    folder = Path(given["resume"])
    fresh = (folder / "config.json").is_file() and not (folder / "state.json").is_file() and not run_checkpoints(folder)
    if fresh:  # killed before its first checkpoint: nothing to restore but the flags
        ckpt, run_dir, saved = None, folder, read_json(folder / "config.json", "the run's training flags")
    else:
        ckpt = find_checkpoint(folder)
        run_dir = run_dir_of(ckpt)
        newest = find_checkpoint(run_dir) if run_dir != ckpt else ckpt
        if newest != ckpt:
            raise UserError(f"--resume {ckpt} would redo the iterations after it, but {run_dir} holds the newer "
                            f"{newest.name}; resume the run folder, or copy {ckpt.name} into a new run folder to branch")
        saved = read_config(ckpt)
    problems = config_type_errors(saved)
    if problems:
        raise UserError(f"{(ckpt or run_dir) / 'config.json'}: " + "; ".join(problems))
    if "output_dir" in given and Path(given["output_dir"]).resolve() != run_dir.resolve():
        raise UserError(f"--resume continues {run_dir} in that folder; drop --output-dir (or pass {run_dir})")
    known = {f.name for f in fields(TrainArgs)}
    changed = [k for k, v in given.items() if k not in RESUME_MAY_CHANGE and k in saved and saved[k] != v]
    if changed:
        flags = ", ".join(f"--{k.replace('_', '-')} (run: {saved[k]!r}, given: {given[k]!r})" for k in changed)
        raise UserError(f"--resume continues the same experiment; these flags would change it: {flags}. "
                        "Start a new run (another --output-dir) to change them.")
    args = TrainArgs(**{**{k: v for k, v in saved.items() if k in known}, **given})
    args.output_dir, args.resume = str(run_dir), None if ckpt is None else str(ckpt)
    check_args(args)
    return args


def config_type_errors(saved: dict) -> list[str]:
    """Each saved flag whose JSON value does not fit its TrainArgs type (a hand-edited or crafted config.json)."""
    hints, problems = typing.get_type_hints(TrainArgs), []
    for name, value in saved.items():
        if name not in hints:
            continue
        kinds = typing.get_args(hints[name]) if typing.get_origin(hints[name]) in (typing.Union, types.UnionType) \
            else (hints[name],)
        ok = False
        for kind in kinds:
            if kind is type(None):
                ok |= value is None
            elif typing.get_origin(kind) is Literal:
                ok |= value in typing.get_args(kind)
            elif kind is float:
                ok |= isinstance(value, (int, float)) and not isinstance(value, bool)
            elif kind is int:
                ok |= isinstance(value, int) and not isinstance(value, bool)
            else:
                ok |= isinstance(value, kind)
        if not ok:
            problems.append(f"field {name!r} should be {hints[name]}, found {value!r:.40}")
    return problems


def check_args(args: TrainArgs) -> None:
    """Reject bad settings before anything loads, each naming its flag and what to do."""
    from cli import check_domains

    problems = check_domains(
        args,
        positive=("iterations", "groups", "group_size", "max_new_tokens", "minibatches", "ppo_epochs",
                  "micro_batch_rows", "save_every", "keep_checkpoints", "lora_r", "lora_alpha", "lr",
                  "temperature", "ppo_clip", "grad_clip", "eval_games"),
        non_negative=("env_workers", "max_steps", "max_plan_len", "kl_coef", "sdar_coef", "sdar_beta", "weight_decay",
                      "eval_every", "samples_per_iter", "min_new_tokens", "gigpo_omega"),
        finite=("lam", "mult_eps"),
    )
    if not 0 <= args.gigpo_gamma <= 1:
        problems.append(f"--gigpo-gamma must be in [0, 1]; got {args.gigpo_gamma}")
    if not 0 <= args.lam <= 1:
        problems.append(f"--lam must be in [0, 1]; got {args.lam}")
    if not 0 < args.mult_eps < 1:
        problems.append(f"--mult-eps must be in (0, 1); got {args.mult_eps}")
    try:
        history_length(args.history)
    except ValueError as err:
        problems.append(str(err))
    for flag, split in (("--split", args.split), ("--eval-split", args.eval_split)):
        if split is not None and split not in SPLITS[args.env]:
            problems.append(f"{flag} for {args.env} must be one of {', '.join(SPLITS[args.env])}; got {split!r}")
    if args.min_new_tokens > 0:
        problems.append("--min-new-tokens is for bench.py only: blocking end-of-turn while sampling makes "
                        "the PPO ratio off-policy; leave it at 0 for training")
    if args.init_adapter and args.load_in_4bit:
        problems.append("--init-adapter merges into full-precision weights: add --no-load-in-4bit")
    if args.init_adapter and not (Path(args.init_adapter) / "adapter_config.json").is_file() and not args.resume:
        problems.append(f"--init-adapter {args.init_adapter}: no adapter_config.json there (pass a warmstart.py "
                        "output folder, or none)")
    if problems:
        raise UserError("; ".join(problems))
    if args.group_size == 1:
        print("warning: --group-size 1 gives every trajectory advantage 0 (no group to compare with): "
              "nothing will be learned", file=sys.stderr)


def algo_settings(args: TrainArgs) -> dict:
    """How --algo maps onto the shared functions (advantage.py)."""
    return {
        "sharpo": dict(lam=args.lam, granularity="segment", shape="exp", sdar_coef=0.0),
        "grpo": dict(lam=0.0, granularity="segment", shape="exp", sdar_coef=0.0),
        "rlsd": dict(lam=args.lam, granularity="token", shape="exp", sdar_coef=0.0),
        "stepopsd": dict(lam=args.lam, granularity="segment", shape="sigmoid", sdar_coef=0.0),
        "sdar": dict(lam=0.0, granularity="segment", shape="exp", sdar_coef=args.sdar_coef),
        "gigpo": dict(lam=0.0, granularity="segment", shape="exp", sdar_coef=0.0),  # + the step-group term
    }[args.algo]


# ----------------------------------------------------------------------------- batched log-probs
def rows_logprobs(model, rows: list[Row], pad_id: int, micro_batch_rows: int, temperature: float, T: int,
                  desc: str = "log-probs") -> torch.Tensor:
    """No-grad response log-probs of many rows, micro-batch by micro-batch: (B, T)."""
    from tqdm.auto import tqdm

    from rollout import response_logprobs

    device = model.get_input_embeddings().weight.device
    out = torch.zeros(len(rows), T)
    with torch.no_grad():
        for s in tqdm(range(0, len(rows), micro_batch_rows), desc=desc, unit="batch", leave=False):
            batch = {k: v.to(device) for k, v in collate_rows(rows[s : s + micro_batch_rows], pad_id).items()}
            logp = response_logprobs(model, batch, temperature=temperature).float().cpu()  # (b, t)
            out[s : s + logp.shape[0], : logp.shape[1]] = logp
    return out


# ----------------------------------------------------------------------------- one iteration
@dataclass
class RowBatch:
    """What one iteration builds, stage by stage (B rows, one per step; T response positions)."""

    trajs: list[Trajectory]  # the rollouts, in group order
    steps: list  # (trajectory index, Step) per row
    rows: list[Row]  # student rows: prompt ids + response ids
    teacher_rows: list[Row]  # the hindsight rows, for the rows of trajectories with hindsight
    segment_ids: torch.Tensor  # (B, T) long: 0 on response tokens, -1 on padding
    gap_mask: torch.Tensor | None  # (B, T) bool: tokens counted in the gap (None = all)
    has_hindsight: torch.Tensor  # (B,) bool
    group_ids: list[int]  # group of each trajectory
    logp_old: torch.Tensor | None = None  # (B, T) student log-probs before the update
    logp_teacher: torch.Tensor | None = None  # (B, T) teacher log-probs (= logp_old without hindsight)
    logp_ref: torch.Tensor | None = None  # (B, T) reference log-probs (adapter off), when kl_coef > 0
    adv_row: torch.Tensor | None = None  # (B,) A_i of each row's trajectory
    token_adv: torch.Tensor | None = None  # (B, T) Ahat
    gaps: torch.Tensor | None = None  # (B,) segment gap g
    mults: torch.Tensor | None = None  # (B,) segment multiplier m
    token_mults: torch.Tensor | None = None  # (B, T) the multiplier each token's advantage gets (RLSD: per token)
    step_adv: torch.Tensor | None = None  # (B,) GiGPO: each step's advantage within its step group
    step_groups: torch.Tensor | None = None  # (B,) GiGPO: step-group id of each row (same group, same anchor state)


class Trainer:
    """Holds the model, optimizer, envs and run state; `iteration()` is the numbered loop body."""

    def __init__(self, args: TrainArgs, model=None, tokenizer=None, env=None, dist: DataParallel | None = None):
        from checkpoint import (
            checkpoint_adapters,
            find_checkpoint,
            load_checkpoint_policy,
            load_optimizer_state,
            read_iteration,
            restore_rng,
        )
        from envs import make_env
        from rollout import load_policy

        self.dist = dist or DataParallel()  # [distributed] world 1 in a plain run
        self.args = args
        self.out = Path(args.output_dir)
        self.rng = random.Random(args.seed)  # task sampling
        torch.manual_seed(args.seed)
        ckpt = find_checkpoint(args.resume) if args.resume else None
        self.env = env or make_env(args.env, data_dir=args.data_dir, max_steps=args.max_steps,  # data checked before the model loads
                                   workers=resolve_workers(args.env_workers, args.groups * args.group_size))
        self.eval_env = None
        self.tasks = self._training_tasks()
        if model is None and ckpt is not None:  # the policy exactly as saved: base, warm start, adapter
            model, tokenizer = load_checkpoint_policy(ckpt, device=self.dist.device,
                                                      gradient_checkpointing=args.gradient_checkpointing)
        elif model is None:
            model, tokenizer = load_policy(
                args.model, device=self.dist.device, load_in_4bit=args.load_in_4bit, lora_r=args.lora_r,
                lora_alpha=args.lora_alpha, init_adapter=args.init_adapter,
                gradient_checkpointing=args.gradient_checkpointing, seed=args.seed,
            )
        self.model, self.tokenizer = model, tokenizer
        self.pad_id = tokenizer.pad_token_id
        self.history_len = history_length(args.history)
        self.params = [p for p in model.parameters() if p.requires_grad]  # the LoRA weights
        self.optimizer = torch.optim.AdamW(self.params, lr=args.lr, weight_decay=args.weight_decay)
        self.iteration_done = 0
        # the warm start saved with each checkpoint: the checkpoint's own copy, else --init-adapter
        self.warmstart = checkpoint_adapters(ckpt)[1] if ckpt else Path(args.init_adapter) if args.init_adapter else None
        if ckpt is not None:  # optimizer, RNG states and iteration; tensors and JSON only
            try:
                self.optimizer.load_state_dict(load_optimizer_state(ckpt))
            except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as err:
                raise UserError(f"{ckpt / 'optimizer.pt'} does not fit this run's LoRA weights ({err}); "
                                "resume from another checkpoint") from None
            restore_rng(ckpt, self.rng)
            self.iteration_done = read_iteration(ckpt)
        if self.dist.rank:  # [distributed] the same tasks (self.rng) everywhere, other samples per process
            torch.manual_seed(args.seed + 100_003 * self.dist.rank + self.iteration_done)

    def _training_tasks(self) -> list[str]:
        tasks = self.env.tasks(self.args.split)
        if self.args.max_plan_len > 0:
            tasks = [t for t in tasks if len(self.env.expert_plan(t)) <= self.args.max_plan_len]
            if not tasks:
                raise UserError(f"no {self.args.split} task has an expert plan of <= {self.args.max_plan_len} steps")
        return tasks

    # -- the loop body
    def iteration(self) -> tuple[dict, list[dict]]:
        """One iteration, stage by stage; returns (metrics line, sample trajectories)."""
        from checkpoint import crash_point

        it, t = self.iteration_done + 1, {}
        clock = time.perf_counter()
        env_before, crashes_before = sum(self.env.seconds.values()), getattr(self.env, "crashes", 0)
        trajs, policy = self.rollout(it)  # 1. rollout
        t["rollout"], clock = time.perf_counter() - clock, time.perf_counter()
        if not any(traj.steps for traj in trajs):
            raise UserError(f"iteration {it}: no episode played a step (every one ended in an env crash; "
                            "see the warnings above for the game files)")
        t["env"] = sum(self.env.seconds.values()) - env_before  # the env's share of the rollout
        crash_point("rollout")
        batch = self.make_rows(trajs)  # 2. segments
        t["segments"], clock = time.perf_counter() - clock, time.perf_counter()
        crash_point("segments")
        t.update(self.score(batch))  # 3. teacher (and the student's and reference's log-probs)
        crash_point("teacher")
        self.advantages(batch)  # 4. advantage
        crash_point("advantage")
        clock = time.perf_counter()
        update = self.update(batch)  # 5. update
        t["update"] = time.perf_counter() - clock
        crash_point("update")
        self.iteration_done = it  # 6. log (the caller writes it and checkpoints)
        all_trajs = self.dist.gather(trajs)  # [distributed] metrics over every process's episodes
        metrics = {"iteration": it, **rollout_metrics(all_trajs, [traj.group for traj in all_trajs])}
        if self.needs_teacher:
            metrics.update(teacher_metrics(batch, self.args.algo, self.args.mult_eps, self.dist.gather))
        if self.args.algo == "gigpo":
            metrics.update(gigpo_metrics(batch, self.dist.gather))
        metrics.update(update)
        metrics["rows"] = int(self.dist.sum(len(batch.rows)))
        metrics["env_crashes"] = int(self.dist.sum(getattr(self.env, "crashes", 0) - crashes_before))
        metrics["tokens_generated"] = int(self.dist.sum(policy.tokens_generated))
        metrics["tokens_per_s_generate"] = metrics["tokens_generated"] / max(t["rollout"], 1e-9)
        metrics["processes"] = self.dist.world
        metrics.update({f"seconds/{k}": v for k, v in t.items()})
        metrics["peak_memory_gb"] = peak_memory_gb()
        return metrics, sample_records(batch, self.tokenizer, self.args.samples_per_iter, it)

    @property
    def needs_teacher(self) -> bool:
        settings = algo_settings(self.args)
        return settings["lam"] > 0 or settings["sdar_coef"] > 0

    # 1. rollout: G copies of each sampled task, every live episode in one generate per turn
    def rollout(self, it: int):
        from rollout import ModelPolicy, play_episodes

        args = self.args
        chosen = self.draw_tasks(args.groups)
        mine = range(self.dist.rank, args.groups, self.dist.world)  # [distributed] whole groups per process
        task_ids = [chosen[g] for g in mine for _ in range(args.group_size)]
        group_ids = [g for g in mine for _ in range(args.group_size)]
        policy = ModelPolicy(self.model, self.tokenizer, args.max_new_tokens, args.temperature, args.min_new_tokens)
        trajs = play_episodes(self.env, task_ids, policy, self.history_len, group_ids, desc=f"iter {it} rollout")
        return trajs, policy

    def draw_tasks(self, n: int) -> list[str]:
        """n tasks for one iteration: distinct while the split has enough, then again from a fresh draw."""
        chosen = []
        while len(chosen) < n:
            chosen += self.rng.sample(self.tasks, min(n - len(chosen), len(self.tasks)))
        return chosen

    # 2. segments: one row per step for the student; the teacher's row where there is hindsight
    def make_rows(self, trajs: list[Trajectory]) -> "RowBatch":
        self._assign_hindsight(trajs)
        steps = [(i, s) for i, traj in enumerate(trajs) for s in traj.steps]  # (trajectory index, step)
        rows = [build_row(self.tokenizer, s.messages, s.response_ids) for _, s in steps]
        for row, (_, s) in zip(rows, steps):  # the trained ids are exactly the fed and sampled ids
            assert row.input_ids == s.prompt_ids + s.response_ids
        teacher_rows = [build_teacher_row(self.tokenizer, s.messages, s.response_ids, trajs[i].hindsight)
                        for i, s in steps if trajs[i].hindsight is not None]
        T = max(len(r.response_ids) for r in rows)
        seg = response_segment_ids(torch.tensor([len(r.response_ids) for r in rows]), T)  # (B, T) 0 or -1
        gap_mask = None
        if self.args.gap_tokens == "action":
            gap_mask = torch.zeros(len(rows), T, dtype=torch.bool)  # (B, T) True = inside <action>...</action>
            for b, r in enumerate(rows):
                gap_mask[b, : len(r.response_ids)] = torch.tensor(action_token_mask(self.tokenizer, r.response_ids))
        return RowBatch(
            trajs=trajs, steps=steps, rows=rows, teacher_rows=teacher_rows, segment_ids=seg, gap_mask=gap_mask,
            has_hindsight=torch.tensor([trajs[i].hindsight is not None for i, _ in steps]),
            group_ids=[traj.group for traj in trajs],
        )

    def _assign_hindsight(self, trajs: list[Trajectory]) -> None:
        """METHOD.md section 2: sibling (a successful group mate's actions) or the env expert's plan."""
        if self.args.hindsight == "sibling":
            for traj, text in zip(trajs, sibling_hindsight(trajs)):
                traj.hindsight = text
        else:
            for traj in trajs:
                traj.hindsight = format_plan(EXPERT_HEADLINE, self.env.expert_plan(traj.task_id))

    # 3. teacher: student (before the update), teacher (hindsight rows) and reference log-probs
    def score(self, batch: "RowBatch") -> dict:
        """Fill logp_old, logp_teacher and logp_ref; returns the seconds of each pass (teacher 0
        when --algo needs none: grpo and gigpo run no teacher pass)."""
        args, mb, T = self.args, self.args.micro_batch_rows, batch.segment_ids.shape[1]
        it, seconds = self.iteration_done + 1, {"student": 0.0, "teacher": 0.0, "reference": 0.0}
        self.model.eval()
        clock = time.perf_counter()
        batch.logp_old = rows_logprobs(self.model, batch.rows, self.pad_id, mb, args.temperature, T,
                                       desc=f"iter {it} student")  # (B, T)
        seconds["student"] = time.perf_counter() - clock
        batch.logp_teacher = batch.logp_old.clone()  # (B, T) rows without hindsight: teacher = student, m = 1
        if batch.teacher_rows and self.needs_teacher:
            clock = time.perf_counter()
            batch.logp_teacher[batch.has_hindsight] = rows_logprobs(
                self.model, batch.teacher_rows, self.pad_id, mb, args.temperature, T, desc=f"iter {it} teacher")
            seconds["teacher"] = time.perf_counter() - clock
        clock = time.perf_counter()
        if args.kl_coef > 0:
            with self.model.disable_adapter():  # the reference model: base weights, no second copy
                batch.logp_ref = rows_logprobs(self.model, batch.rows, self.pad_id, mb, args.temperature, T,
                                               desc=f"iter {it} reference")  # (B, T)
        seconds["reference"] = time.perf_counter() - clock
        return seconds

    # 4. advantage: A_i over each group, then the per-token Ahat of --algo
    def advantages(self, batch: "RowBatch") -> None:
        args, settings = self.args, algo_settings(self.args)
        rewards = torch.tensor([traj.reward for traj in batch.trajs])  # (N,)
        adv_traj = grpo_advantages(rewards, torch.tensor(batch.group_ids))  # (N,)
        batch.adv_row = adv_traj[[i for i, _ in batch.steps]]  # (B,) each row carries its trajectory's A_i
        batch.token_adv = sharpo_token_advantages(
            batch.adv_row, batch.logp_teacher, batch.logp_old, batch.segment_ids, lam=settings["lam"],
            clip_eps=args.mult_eps, granularity=settings["granularity"], shape=settings["shape"], gap_mask=batch.gap_mask,
        )  # (B, T)
        gaps, mults = segment_multipliers(batch.adv_row, batch.logp_teacher, batch.logp_old, batch.segment_ids,
                                          args.mult_eps, settings["shape"], batch.gap_mask)  # (B, 1): one segment a row
        batch.gaps, batch.mults = gaps[:, 0], mults[:, 0]  # (B,)
        batch.token_mults = token_multipliers(
            batch.adv_row, batch.logp_teacher, batch.logp_old, batch.segment_ids, args.mult_eps,
            settings["granularity"], settings["shape"], batch.gap_mask)  # (B, T)
        if args.algo == "gigpo":  # METHOD.md section 6: steps from the same state, compared by return
            batch.step_adv, batch.step_groups = gigpo_step_advantages(
                torch.tensor([s.reward for _, s in batch.steps]), torch.tensor([i for i, _ in batch.steps]),
                [batch.trajs[i].group for i, _ in batch.steps], [s.anchor for _, s in batch.steps],
                args.gigpo_gamma, norm_by_std=args.gigpo_norm == "std")  # (B,), (B,)
            batch.token_adv = gigpo_token_advantages(batch.adv_row, batch.step_adv, batch.segment_ids, args.gigpo_omega)

    # 5. update: PPO-clip on Ahat, --minibatches optimizer steps per epoch, token-mean
    def update(self, batch: "RowBatch") -> dict:
        self.model.train()
        return self._update(batch.rows, batch.logp_old, batch.logp_teacher, batch.logp_ref, batch.token_adv,
                            batch.segment_ids >= 0, batch.has_hindsight, algo_settings(self.args))

    def _update(self, rows, logp_old, logp_teacher, logp_ref, token_adv, trained, has_hindsight, settings) -> dict:
        """--ppo-epochs passes of --minibatches optimizer steps; micro-batches accumulate."""
        from tqdm.auto import tqdm

        from rollout import response_logprobs

        args = self.args
        device = self.model.get_input_embeddings().weight.device
        B = len(rows)
        sums, steps_taken, skipped = defaultdict(float), 0, 0
        sdar_mask = has_hindsight[:, None] & trained  # (B, T) trained tokens of rows with hindsight
        stat_keys = ["pg_loss", "clip_frac", "approx_kl_old", "loss"] + (["kl_ref"] if args.kl_coef > 0 else []) \
            + (["sdar_loss"] if settings["sdar_coef"] > 0 else [])
        order_rng = torch.Generator().manual_seed(args.seed * 100003 + self.iteration_done + 7919 * self.dist.rank)
        bar = tqdm(total=args.ppo_epochs * args.minibatches, desc=f"iter {self.iteration_done + 1} update", leave=False)
        for _ in range(args.ppo_epochs):
            perm = torch.randperm(B, generator=order_rng).tolist()
            for m in range(args.minibatches):
                idx = perm[m * B // args.minibatches : (m + 1) * B // args.minibatches]
                # the minibatch's trained tokens (over all processes): the token-mean denominator
                n_tokens = int(self.dist.sum(int(trained[idx].sum()) if idx else 0))
                n_sdar = int(self.dist.sum(int(sdar_mask[idx].sum()) if idx else 0))  # the SDAR term's own denominator
                if n_tokens == 0:
                    continue
                self.optimizer.zero_grad(set_to_none=True)
                finite, mb_stats = True, dict.fromkeys(stat_keys, 0.0)
                for s in range(0, len(idx), args.micro_batch_rows):
                    part = idx[s : s + args.micro_batch_rows]
                    batch = {k: v.to(device) for k, v in collate_rows([rows[i] for i in part], self.pad_id).items()}
                    logp_new = response_logprobs(self.model, batch, temperature=args.temperature).float()  # (b, t)
                    tt = logp_new.shape[1]
                    sel = lambda x: None if x is None else x[part, :tt].to(device)  # noqa: E731
                    loss, stats = policy_loss(
                        logp_new, sel(logp_old), sel(token_adv), sel(trained), num_tokens=n_tokens,
                        ppo_clip=args.ppo_clip, logp_ref=sel(logp_ref), kl_coef=args.kl_coef,
                        logp_teacher=sel(logp_teacher), sdar_mask=sel(sdar_mask),
                        num_sdar_tokens=n_sdar, sdar_coef=settings["sdar_coef"], sdar_beta=args.sdar_beta,
                    )
                    if not torch.isfinite(loss):
                        finite = False
                        break
                    loss.backward()
                    for k, v in stats.items():
                        mb_stats[k] += float(v)  # each is already divided by the minibatch count: sums add up
                finite = self.dist.sum(0.0 if finite else 1.0) == 0  # [distributed] skip together
                if finite:
                    self.dist.sum_grads(self.params)  # [distributed] sum of per-process token-mean pieces
                    mb_stats = {k: self.dist.sum(v) for k, v in mb_stats.items()}
                    norm = torch.nn.utils.clip_grad_norm_(self.params, args.grad_clip)
                    if torch.isfinite(norm):
                        self.optimizer.step()
                        steps_taken += 1
                        mb_stats["grad_norm"] = float(norm)
                        for k, v in mb_stats.items():
                            sums[k] += v
                    else:
                        finite = False
                if not finite:  # a non-finite loss or gradient: skip this step, log it, go on
                    skipped += 1
                    print(f"warning: iteration {self.iteration_done + 1}: non-finite loss or gradient, step skipped", file=sys.stderr)
                self.optimizer.zero_grad(set_to_none=True)
                bar.update(1)
        bar.close()
        out = {f"update/{k}": v / max(steps_taken, 1) for k, v in sums.items()}
        out["update/optimizer_steps"] = steps_taken
        out["update/skipped_steps"] = skipped
        return out

    # -- evaluation
    def evaluate(self) -> dict:
        from envs import make_env
        from eval import evaluate, pick_games
        from rollout import ModelPolicy

        args = self.args
        if self.eval_env is None:
            self.eval_env = make_env(args.env, data_dir=args.data_dir, max_steps=args.max_steps,
                                     workers=resolve_workers(args.env_workers, args.eval_games))
        split = args.eval_split or self.eval_env.default_eval_split
        games = pick_games(self.eval_env, split, args.eval_games)
        policy = ModelPolicy(self.model, self.tokenizer, args.max_new_tokens, temperature=0.0)
        with torch.random.fork_rng(devices=[]):  # evaluation leaves the training RNG where it was
            metrics, _ = evaluate(self.eval_env, policy, games, self.history_len, batch_size=max(len(games), 1), desc="eval")
        return {f"eval/{k}": v for k, v in metrics.items() if isinstance(v, (int, float))}

    # -- checkpoints
    def save(self) -> Path:
        """A complete numbered checkpoint, then the `latest` pointer (checkpoint.py)."""
        from checkpoint import rng_state, save_checkpoint

        final = save_checkpoint(self.out, self.iteration_done, self.model, self.optimizer, rng_state(self.rng),
                                asdict(self.args), self.warmstart, self.args.keep_checkpoints)
        if self.warmstart is not None:
            self.warmstart = final / "warmstart"  # the newest copy: older checkpoints may be pruned
        return final

    def close(self) -> None:
        self.env.close()
        if self.eval_env is not None:
            self.eval_env.close()


# ----------------------------------------------------------------------------- metrics
def rollout_metrics(trajs: list[Trajectory], group_ids: list[int]) -> dict:
    """Success (overall, per task type), reward, invalid rate, share of groups with reward spread."""
    from eval import summarize

    summary = summarize(trajs)
    by_group: dict[int, set] = defaultdict(set)
    for traj, g in zip(trajs, group_ids):
        by_group[g].add(round(traj.reward, 6))
    out = {k: v for k, v in summary.items() if not k.startswith("episodes/")}
    out["groups_with_spread"] = sum(len(v) > 1 for v in by_group.values()) / len(by_group)
    return out


def _same(items: list) -> list:
    return items


def teacher_metrics(batch: RowBatch, algo: str, eps: float, gather=_same) -> dict:
    """What the teacher found and what --algo applied of it.

    gap_mean, gap_abs_mean: the segment gap g over rows with hindsight (every teacher algo).
    mult_mean, mult_std, mult_at_bound: the multiplier the algorithm really applies, over the
    units it applies it to, where it can differ from 1 (hindsight and A != 0): segments for
    sharpo and stepopsd, tokens for rlsd. grpo and sdar scale no advantage and log none.
    gather: combines the values of every process ([distributed]; the identity in a plain run)."""
    hind, adv = batch.has_hindsight, batch.adv_row  # (B,), (B,)
    sel = hind & (adv != 0)  # (B,) rows whose multiplier can differ from 1
    if algo in ("sharpo", "stepopsd"):
        m = batch.mults[sel]  # (n,) one per segment
    elif algo == "rlsd":
        m = batch.token_mults[sel][batch.segment_ids[sel] >= 0]  # (n,) one per trained token
    else:
        m = torch.zeros(0)
    hind_all = torch.tensor(gather(hind.tolist()), dtype=torch.bool)  # (B_all,)
    g = torch.tensor(gather(batch.gaps[hind].tolist()))  # (n_hind,)
    m = torch.tensor(gather(m.tolist()))  # (n,)
    out = {"hindsight_share": float(hind_all.float().mean()), "segments_scored": sum(gather([int(sel.sum())]))}
    if g.numel():
        out.update({"gap_mean": float(g.mean()), "gap_abs_mean": float(g.abs().mean())})
    if algo in ("sharpo", "stepopsd", "rlsd") and m.numel():
        at_bound = ((m <= 1 - eps + 1e-6) | (m >= 1 + eps - 1e-6)).float()
        out.update({"mult_mean": float(m.mean()), "mult_std": float(m.std()) if m.numel() > 1 else 0.0,
                    "mult_at_bound": float(at_bound.mean())})
    return out


def gigpo_metrics(batch: RowBatch, gather=_same) -> dict:
    """How much step-level signal GiGPO found: the share of steps in a step group of size >= 2,
    the mean step-group size, and the spread (std) of the step advantage."""
    _, inverse, counts = torch.unique(batch.step_groups, return_inverse=True, return_counts=True)
    row_sizes = torch.tensor(gather(counts[inverse].tolist()))  # (B_all,) size of each row's step group
    group_sizes = torch.tensor(gather(counts.tolist()), dtype=torch.float)  # (groups_all,)
    step_adv = torch.tensor(gather(batch.step_adv.tolist()))  # (B_all,)
    return {"gigpo/step_group_share": float((row_sizes >= 2).float().mean()),
            "gigpo/step_group_size": float(group_sizes.mean()),
            "gigpo/step_adv_std": float(step_adv.std()) if step_adv.numel() > 1 else 0.0}


def peak_memory_gb() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


def sample_records(batch: RowBatch, tokenizer, k: int, it: int) -> list[dict]:
    """A few trajectories (those with hindsight first) with each segment's gap and multiplier."""
    trajs, steps = batch.trajs, batch.steps
    delta = batch.logp_teacher - batch.logp_old  # (B, T) per-token teacher - student gap
    picked = sorted(range(len(trajs)), key=lambda i: (trajs[i].hindsight is None, i))[:k]
    records = []
    for i in picked:
        mine = [b for b, (j, _) in enumerate(steps) if j == i]
        segs = []
        for b in mine:
            s, n = steps[b][1], len(batch.rows[b].response_ids)
            segs.append({
                "observation": s.messages[-1]["content"].split("Current observation: ")[-1].split("\nAdmissible")[0],
                "response": s.response_text, "action": s.action, "reward": s.reward,
                "gap": float(batch.gaps[b]), "multiplier": float(batch.mults[b]),
                **({"step_advantage": float(batch.step_adv[b])} if batch.step_adv is not None else {}),
                "tokens": [tokenizer.decode([t]) for t in batch.rows[b].response_ids],
                "token_delta": [round(float(x), 4) for x in delta[b, :n]],
            })
        traj = trajs[i]
        records.append({"iteration": it, "task_id": traj.task_id, "task_type": traj.task_type, "won": traj.won,
                        "reward": traj.reward, "advantage": float(batch.adv_row[mine[0]]),
                        "hindsight": traj.hindsight, "segments": segs})
    return records


# ----------------------------------------------------------------------------- main
def train(args: TrainArgs, trainer: Trainer | None = None) -> list[dict]:
    """Run (or resume) training; returns the metrics of the iterations run now.

    What a kill at any moment costs: at most the iterations since the last checkpoint. The
    logs are append-only; at resume, lines after the checkpoint's iteration (and a torn last
    line) are dropped, so the resumed run's log reads as if it had never stopped."""
    from checkpoint import append_jsonl, check_latest, crash_point, run_checkpoints, trim_log, write_atomic

    out = Path(args.output_dir)
    dist = trainer.dist if trainer else DataParallel()
    check_latest(out)  # a `latest` that is no pointer into this run: stop before any work, not after
    if not args.resume and run_checkpoints(out):
        raise UserError(f"{out} already holds a run; continue it with `python train.py --resume {out}`, "
                        "or choose another --output-dir")
    if not args.resume and any((out / name).exists() for name in ("metrics.jsonl", "config.json")) and dist.main:
        print(f"{out} holds no checkpoint yet (a run stopped before its first one): starting it from iteration 1")
    dist.barrier()  # [distributed] every process has looked before the main one writes
    trainer = trainer or Trainer(args, dist=dist)
    metrics_path, samples_path = out / "metrics.jsonl", out / "samples.jsonl"
    if dist.main:  # [distributed] one writer
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / "config.json", json.dumps(asdict(args), indent=1))
        trim_log(metrics_path, trainer.iteration_done)
        trim_log(samples_path, trainer.iteration_done)
    history = []
    while trainer.iteration_done < args.iterations:
        metrics, samples = trainer.iteration()
        it = trainer.iteration_done
        if args.eval_every and it % args.eval_every == 0 and dist.main:
            metrics.update(trainer.evaluate())
        if dist.main:
            crash_point("iteration done")
            append_jsonl(metrics_path, [metrics])
            crash_point("metrics logged")
            append_jsonl(samples_path, samples)
            crash_point("samples logged")
            if it % args.save_every == 0 or it == args.iterations:
                trainer.save()
            print(progress_line(metrics), flush=True)
        dist.barrier()
        history.append(metrics)
    trainer.close()
    return history


def progress_line(m: dict) -> str:
    parts = [f"iter {m['iteration']}", f"success {m['success']:.2f}", f"reward {m['mean_reward']:+.2f}",
             f"invalid {m['invalid_rate']:.2f}", f"spread {m['groups_with_spread']:.2f}"]
    if "mult_mean" in m:
        parts.append(f"mult {m['mult_mean']:.3f}±{m['mult_std']:.3f} bound {m['mult_at_bound']:.2f}")
    if "update/loss" in m:
        parts.append(f"loss {m['update/loss']:+.4f}")
    if "eval/success" in m:
        parts.append(f"eval {m['eval/success']:.2f}")
    parts.append(f"{sum(v for k, v in m.items() if k.startswith('seconds/') and k != 'seconds/env'):.0f}s")
    return " | ".join(parts)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.resume:
        print(f"resuming {args.output_dir} from {args.resume}")
    elif not torch.cuda.is_available() and args.preset == "cpu-demo":
        print("no GPU found: using the cpu-demo preset (a few short episodes on the shipped games); "
              "pass --preset gpu on a GPU machine for the full setting")
    print(f"training {args.algo} on {args.env} with {args.model}: {args.iterations} iterations x {args.groups} tasks "
          f"x {args.group_size} rollouts -> {args.output_dir}")
    train(args)
    print(f"done: metrics in {args.output_dir}/metrics.jsonl, checkpoints in {args.output_dir}/checkpoints "
          f"(evaluate with: python eval.py --policy model --checkpoint {args.output_dir})")


if __name__ == "__main__":
    from cli import run

    run(main)
