"""Train: one loop on one GPU (or CPU) that turns episodes into SHARPO updates of a LoRA policy.

Each iteration (METHOD.md; the numbers are the stages below):
  1. rollout    G rollouts of each of --groups tasks, one batched generate per turn
  2. segments   one training row per step (context c_k, response a_k = one segment);
                the hindsight teacher's rows (--hindsight sibling | expert)
  3. advantage  A_i = GRPO over each group, from the rewards alone: the direction
  4. teacher    log-probs of the sampled tokens: student (recomputed, before the update), teacher
                (same policy, hindsight context), reference (adapter off, for the KL); only for
                rows whose Ahat can be != 0 (and, with a KL or SDAR term, the rows it reads)
  5. credit     Ahat = A_i * ((1 - lam) + lam * m_{i,k}): the teacher sets the size
  6. update     PPO-clip on Ahat, --minibatches optimizer steps x --ppo-epochs, token-mean
  7. log / checkpoint / eval

--algo picks the credit assignment, all in the same code (the table advantage.ALGORITHMS):
sharpo, grpo (lam = 0), rlsd (per-token multiplier), stepopsd (2 * sigmoid), sdar (GRPO's
advantage plus a term in the loss), gigpo (no teacher: A_i + omega * A_step of step groups).

Lines a reader of the method may skip are marked: [distributed] take part in a multi-process
run (torchrun / accelerate launch; infra/distributed.py) and do nothing in a plain one; [run]
keep the run folder (infra/checkpoint.py), the logs (infra/metrics.py) and the timings.

Deviations from the paper: see advantage.py; the teacher is the policy itself with the
hindsight block as one more user turn after the student's context (so stage 4 scores both from
one pass over that context), and rows without hindsight use multiplier 1.

Run: python train.py --env alfworld            (the CPU demo preset when no GPU is present)
"""
from __future__ import annotations

import errors  # [run] first: a Ctrl-C or kill while the imports below load is one line

errors.quiet_start(__name__)  # [run]
# isort: split

import random
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Literal

import torch
from tqdm.auto import tqdm

from advantage import (ALGORITHMS, credit_assignment, gigpo_step_advantages, grpo_advantages, moving_rows, policy_loss,
                       shuffled_within_groups)
from envs import draw_tasks, history_length, make_env, resolve_workers, training_tasks
from eval import greedy_evaluation
from infra import config, dashboard, metrics
from infra.checkpoint import RunFolder, find_checkpoint, restore_training_state, run_policy, run_warmstart
from infra.cli import run
from infra.distributed import DataParallel
from rollout import ModelPolicy, play_episodes, response_logprobs, rows_logprobs, student_teacher_logprobs
from segments import (EXPERT_HEADLINE, Row, Trajectory, action_masks, build_row, build_teacher_row,  # isort: skip
                      collate_rows, format_plan, length_batches, response_segment_ids, sibling_hindsight)


@dataclass
class TrainArgs:
    """Command-line flags of train.py (defaults: the GPU setting; --preset cpu-demo shrinks them)."""

    env: Literal["alfworld", "webshop"] = "alfworld"  # environment
    algo: Literal["sharpo", "grpo", "rlsd", "stepopsd", "sdar", "gigpo"] = "sharpo"  # credit assignment (METHOD.md)
    preset: Literal["auto", "gpu", "cpu-demo", "cpu-learn", "none"] = "auto"  # auto: cpu-demo without a GPU, else gpu; cpu-learn: a CPU run that learns
    model: str | None = None  # HF id or local path, "smollm2" (embedded) or "tiny"; default per device
    load_in_4bit: bool | None = None  # 4-bit nf4 weights; default: on for HF models on CUDA
    dtype: Literal["auto", "bf16", "fp32"] = "auto"  # compute precision; auto: bf16 on a GPU or a CPU with AMX, else fp32
    lora_r: int = 64  # LoRA rank (verl-agent: 64)
    lora_alpha: int = 64  # LoRA alpha (verl-agent: 64)
    init_adapter: str | None = None  # LoRA merged into the base first (tools/warmstart.py output); none = no warm start
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
    rollout: Literal["hf", "vllm"] = "hf"  # who decodes the rollouts: hf (generate) | vllm (installed apart: vllm_rollout/)
    vllm_gpu_memory: float = 0.35  # --rollout vllm on a GPU: the share of its memory vLLM may take beside training
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
    shuffle_rewards: bool = False  # a control, not a method: each group's episode rewards permuted among its episodes
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
    report_to: Literal["none", "tensorboard", "trackio", "wandb"] = "none"  # live dashboard (an optional extra)
    output_dir: str | None = None  # the run folder; default runs/<env>-<algo>[-cpu-demo|-cpu-learn]; with --resume: that run's
    resume: str | None = None  # a run folder (or one of its checkpoints) to continue, in that run folder
    seed: int = 0  # seed for task sampling, generation and LoRA init
    min_new_tokens: int = 0  # forced response length, for tools/bench.py only: train.py refuses it (off-policy)


def parse_args(argv: list[str] | None = None) -> TrainArgs:
    """Flags over the preset's over TrainArgs's defaults, or a resumed run's; all checked (infra/config.py)."""
    return config.parse_train_args(TrainArgs, argv, __doc__)


@dataclass
class RowBatch:
    """What one iteration builds, stage by stage (B rows, one per step; T response positions)."""

    trajs: list[Trajectory]  # the rollouts, in group order
    steps: list  # (trajectory index, Step) per row
    rows: list[Row]  # student rows: prompt ids + response ids
    teacher_rows: list[Row | None]  # each row with the hindsight block (None: its trajectory has none)
    segment_ids: torch.Tensor  # (B, T) long: 0 on response tokens, -1 on padding
    gap_mask: torch.Tensor | None  # (B, T) bool: tokens counted in the gap (None = all)
    has_hindsight: torch.Tensor  # (B,) bool
    logp_student: torch.Tensor | None = None  # (B, T) the policy's log-probs before the update (PPO's "old")
    logp_teacher: torch.Tensor | None = None  # (B, T) teacher log-probs (= logp_student without hindsight)
    logp_ref: torch.Tensor | None = None  # (B, T) reference log-probs (adapter off), when kl_coef > 0
    adv_row: torch.Tensor | None = None  # (B,) A_i of each row's trajectory
    moves: torch.Tensor | None = None  # (B,) bool: Ahat can be != 0 (A_i != 0; GiGPO: A_i + omega A_step != 0)
    in_loss: torch.Tensor | None = None  # (B,) bool: rows the loss reads (moves; every row with KL or SDAR)
    taught: torch.Tensor | None = None  # (B,) bool: rows whose teacher log-probs are needed
    skipped: dict | None = None  # rows each pass left out, by pass
    token_adv: torch.Tensor | None = None  # (B, T) Ahat
    gaps: torch.Tensor | None = None  # (B,) segment gap g
    mults: torch.Tensor | None = None  # (B,) segment multiplier m
    token_mults: torch.Tensor | None = None  # (B, T) the multiplier each token's advantage gets (RLSD: per token)
    step_adv: torch.Tensor | None = None  # (B,) GiGPO: each step's advantage within its step group
    step_groups: torch.Tensor | None = None  # (B,) GiGPO: step-group id of each row (same group, same anchor state)


class Trainer:
    """Holds the model, optimizer, envs and run state; `iteration()` is the numbered loop body."""

    skip_rows = True  # leave out the rows whose work would add zeros (False: tests and bench, same result)
    reuse_context = True  # the teacher continues from the student's context cache (False: tests and bench, same result)

    def __init__(self, args: TrainArgs, model=None, tokenizer=None, env=None, dist: DataParallel | None = None):
        self.dist = dist or DataParallel()  # [distributed] world 1 in a plain run
        self.args, self.algo = args, ALGORITHMS[args.algo]
        self.rng = random.Random(args.seed)  # task sampling
        torch.manual_seed(args.seed)
        ckpt = find_checkpoint(args.resume) if args.resume else None  # [run] the checkpoint to continue from
        self.env = env or make_env(args.env, data_dir=args.data_dir, max_steps=args.max_steps,  # data checked first
                                   workers=resolve_workers(args.env_workers, args.groups * args.group_size))
        self.eval_env = None
        self.tasks = training_tasks(self.env, args.split, args.max_plan_len)
        if model is None:  # a new LoRA over the (warm-started) base, or [run] the checkpoint's policy exactly
            model, tokenizer = run_policy(args, ckpt, self.dist.device)
        self.model, self.tokenizer, self.pad_id = model, tokenizer, tokenizer.pad_token_id
        self.history_len = history_length(args.history)
        self.params = [p for p in model.parameters() if p.requires_grad]  # the LoRA weights
        self.optimizer = torch.optim.AdamW(self.params, lr=args.lr, weight_decay=args.weight_decay)
        self.warmstart = run_warmstart(args, ckpt)  # [run] the warm start each checkpoint carries a copy of
        self.iteration_done = restore_training_state(ckpt, self.optimizer, self.rng) if ckpt else 0  # [run]
        self.vllm = None  # [run] --rollout vllm: its engine, started by the first rollout
        if self.dist.rank:  # [distributed] the same tasks (self.rng) everywhere, other samples per process
            torch.manual_seed(args.seed + 100_003 * self.dist.rank + self.iteration_done)

    # -- the loop body
    def iteration(self) -> tuple[dict, list[dict]]:
        """One iteration, stage by stage; returns (metrics line, sample trajectories)."""
        it, watch = self.iteration_done + 1, metrics.Stopwatch(self.env)  # [run] seconds per stage, env time, crashes
        with watch("rollout"):
            trajs, policy = self.rollout(it)  # 1. rollout
        with watch("segments"):
            batch = self.make_rows(trajs)  # 2. segments
        self.advantages(batch)  # 3. advantage
        self.score(batch, watch)  # 4. teacher (and the student's and reference's log-probs)
        self.credit(batch)  # 5. credit
        with watch("update"):
            update = self.update(batch)  # 6. update
        self.iteration_done = it
        return (metrics.iteration_metrics(self, batch, policy, update, watch),  # 7. log (the caller writes it)
                metrics.sample_records(batch, self.tokenizer, self.args.samples_per_iter, it))

    # 1. rollout: G copies of each sampled task, every live episode in one generate per turn
    def rollout(self, it: int):
        args = self.args
        chosen = draw_tasks(self.rng, self.tasks, args.groups)
        mine = range(self.dist.rank, args.groups, self.dist.world)  # [distributed] whole groups per process
        task_ids = [chosen[g] for g in mine for _ in range(args.group_size)]
        group_ids = [g for g in mine for _ in range(args.group_size)]
        if args.rollout == "vllm":  # [run] the same episodes, decoded by vLLM
            return self.vllm_rollout(it, task_ids, group_ids)
        policy = ModelPolicy(self.model, self.tokenizer, args.max_new_tokens, args.temperature, args.min_new_tokens)
        return play_episodes(self.env, task_ids, policy, self.history_len, group_ids, desc=f"iter {it} rollout"), policy

    def vllm_rollout(self, it: int, task_ids: list[str], group_ids: list[int]):  # [run] vllm_rollout/policy.py
        """Stage 1 with --rollout vllm: one engine per run (started at the first rollout), serving the
        adapter of this moment; on a GPU it sleeps while the trainer computes."""
        from vllm_rollout.policy import VLLMPolicy  # deferred: an optional extra

        args = self.args
        if self.vllm is None:
            self.vllm = VLLMPolicy(self.model, self.tokenizer, f"{args.output_dir}/vllm", args.max_new_tokens,
                                   args.temperature, args.lora_r, args.seed, base_name=args.model,
                                   gpu_memory=args.vllm_gpu_memory)
        self.vllm.serve(self.model, it)
        trajs = play_episodes(self.env, task_ids, self.vllm, self.history_len, group_ids, desc=f"iter {it} rollout")
        self.vllm.rest()
        return trajs, self.vllm

    # 2. segments: one row per step for the student; the teacher's row where there is hindsight
    def make_rows(self, trajs: list[Trajectory]) -> RowBatch:
        hindsight = sibling_hindsight(trajs) if self.args.hindsight == "sibling" else \
            [format_plan(EXPERT_HEADLINE, self.env.expert_plan(traj.task_id)) for traj in trajs]  # METHOD.md section 2
        for traj, text in zip(trajs, hindsight):
            traj.hindsight = text
        steps = [(i, s) for i, traj in enumerate(trajs) for s in traj.steps]  # (trajectory index, step)
        rows = [build_row(self.tokenizer, s.messages, s.response_ids) for _, s in steps]
        for row, (_, s) in zip(rows, steps):  # the trained ids are exactly the fed and sampled ids
            assert row.input_ids == s.prompt_ids + s.response_ids
        teacher_rows = [build_teacher_row(self.tokenizer, s.messages, s.response_ids, trajs[i].hindsight)
                        if trajs[i].hindsight is not None else None for i, s in steps]
        T = max(len(r.response_ids) for r in rows)
        seg = response_segment_ids(torch.tensor([len(r.response_ids) for r in rows]), T)  # (B, T) 0 or -1
        gap_mask = action_masks(self.tokenizer, rows, T) if self.args.gap_tokens == "action" else None  # (B, T)
        has_hindsight = torch.tensor([trajs[i].hindsight is not None for i, _ in steps])  # (B,)
        return RowBatch(trajs, steps, rows, teacher_rows, seg, gap_mask, has_hindsight)

    # 3. advantage: A_i over each group, from the rewards alone; which rows that leaves anything to do
    def advantages(self, batch: RowBatch) -> None:
        args = self.args
        rewards, groups = torch.tensor([t.reward for t in batch.trajs]), torch.tensor([t.group for t in batch.trajs])  # (N,)
        if args.shuffle_rewards:  # a placebo run: the same advantages, handed to episodes by chance
            draw = torch.Generator().manual_seed(args.seed * 1_000_003 + self.iteration_done)  # resumes exactly
            rewards = shuffled_within_groups(rewards, groups, draw)  # (N,)
        adv_traj = grpo_advantages(rewards, groups)  # (N,) METHOD.md section 1
        batch.adv_row = adv_traj[[i for i, _ in batch.steps]]  # (B,) each row carries its trajectory's A_i
        if self.algo.step_groups:  # METHOD.md section 6: steps from the same state, compared by return
            batch.step_adv, batch.step_groups = gigpo_step_advantages(
                torch.tensor([s.reward for _, s in batch.steps]), torch.tensor([i for i, _ in batch.steps]),
                [batch.trajs[i].group for i, _ in batch.steps], [s.anchor for _, s in batch.steps],
                args.gigpo_gamma, norm_by_std=args.gigpo_norm == "std")  # (B,), (B,)
        batch.moves = moving_rows(args.algo, batch.adv_row, batch.step_adv, args.gigpo_omega)  # (B,)
        batch.in_loss = batch.moves | (args.kl_coef > 0 or self.algo.sdar)  # KL and SDAR act on rows with Ahat = 0 too
        batch.taught = batch.has_hindsight & (batch.in_loss if self.algo.sdar else batch.moves) & self.algo.teacher

    # 4. teacher: student (before the update), teacher (hindsight rows) and reference log-probs, where needed
    def score(self, batch: RowBatch, watch=None) -> None:
        """Fill logp_student (the rows the loss reads), logp_teacher (the taught rows; = logp_student
        elsewhere) and logp_ref (kl_coef > 0); rows left out hold 0 and are never read."""
        args, mb, T = self.args, self.args.micro_batch_rows, batch.segment_ids.shape[1]
        it, watch = self.iteration_done + 1, watch or metrics.Stopwatch()  # [run]
        student = batch.in_loss if self.skip_rows else torch.ones_like(batch.in_loss)  # (B,) without skipping: all
        taught = batch.taught if self.skip_rows else batch.has_hindsight & self.algo.teacher  # (B,)
        self.model.eval()
        if self.reuse_context:  # one pass over each row's context serves the student and its teacher
            batch.logp_student, logp_teacher = student_teacher_logprobs(
                self.model, batch.rows, batch.teacher_rows, self.pad_id, mb, args.temperature, T, student, taught,
                desc=f"iter {it} student+teacher", watch=watch)  # (B, T), (B, T)
        else:  # [run] the same figures, each teacher row computed whole (tests and bench only)
            with watch("student"):
                batch.logp_student = rows_logprobs(self.model, batch.rows, self.pad_id, mb, args.temperature, T,
                                                   desc=f"iter {it} student", only=student)  # (B, T)
            with watch("teacher"):
                logp_teacher = rows_logprobs(self.model, batch.teacher_rows, self.pad_id, mb, args.temperature, T,
                                             desc=f"iter {it} teacher", only=taught)  # (B, T)
        batch.logp_teacher = torch.where(taught[:, None], logp_teacher, batch.logp_student)  # (B, T) no hindsight: m = 1
        if args.kl_coef > 0:
            with watch("reference"), self.model.disable_adapter():  # the reference: base weights, no second copy
                batch.logp_ref = rows_logprobs(self.model, batch.rows, self.pad_id, mb, args.temperature, T,
                                               desc=f"iter {it} reference", only=student)  # (B, T)
        batch.skipped = {"student": int((~student).sum()), "teacher": int((batch.has_hindsight & ~taught).sum())
                         * self.algo.teacher}  # rows each pass left out (the update leaves out the student's)

    # 5. credit: the per-token Ahat of --algo, from A_i and the teacher's gap
    def credit(self, batch: RowBatch) -> None:
        args = self.args
        credit = credit_assignment(args.algo, batch.adv_row, batch.logp_teacher, batch.logp_student, batch.segment_ids,
                                   lam=args.lam, mult_eps=args.mult_eps, gap_mask=batch.gap_mask,
                                   step_adv=batch.step_adv, omega=args.gigpo_omega)  # METHOD.md section 4
        batch.token_adv, batch.gaps, batch.mults, batch.token_mults = \
            credit.token_adv, credit.gaps, credit.mults, credit.token_mults

    # 6. update: PPO-clip on Ahat, --minibatches optimizer steps per epoch, token-mean
    def update(self, batch: RowBatch) -> dict:
        """--ppo-epochs passes of --minibatches optimizer steps; micro-batches accumulate."""
        args, rows, tokens = self.args, batch.rows, batch.segment_ids >= 0  # (B, T) response tokens
        trained = tokens & batch.in_loss[:, None]  # (B, T) the tokens the loss reads
        self.model.train()
        device = self.model.get_input_embeddings().weight.device
        sdar_coef = args.sdar_coef if self.algo.sdar else 0.0
        sdar_mask = batch.has_hindsight[:, None] & trained  # (B, T) trained tokens of rows with hindsight
        B, sums, steps_taken, skipped = len(rows), defaultdict(float), 0, 0
        stat_keys = ["pg_loss", "clip_frac", "approx_kl_old", "loss"] + (["kl_ref"] if args.kl_coef > 0 else []) \
            + (["sdar_loss"] if sdar_coef > 0 else [])
        order_rng = torch.Generator().manual_seed(args.seed * 100003 + self.iteration_done + 7919 * self.dist.rank)
        desc = f"iter {self.iteration_done + 1} update"
        for step in tqdm(range(args.ppo_epochs * args.minibatches), desc=desc, leave=False):  # epochs x minibatches
            m = step % args.minibatches
            if m == 0:  # a new epoch: a new order of the rows
                perm = torch.randperm(B, generator=order_rng).tolist()
            idx = perm[m * B // args.minibatches : (m + 1) * B // args.minibatches]
            # the minibatch's response tokens (over all processes, skipped rows too): the token-mean denominator
            n_tokens = int(self.dist.sum(int(tokens[idx].sum()) if idx else 0))
            n_sdar = int(self.dist.sum(int(sdar_mask[idx].sum()) if idx else 0))  # the SDAR term's own denominator
            n_trained = int(self.dist.sum(int(trained[idx].sum()) if idx else 0))  # approx_kl_old's: the tokens it averages
            if n_tokens == 0:
                continue
            self.optimizer.zero_grad(set_to_none=True)
            finite, mb_stats = True, dict.fromkeys(stat_keys, 0.0)
            run_idx = [i for i in idx if batch.in_loss[i] or not self.skip_rows]  # membership as without skipping
            for part in length_batches(run_idx, rows, args.micro_batch_rows):  # rows of similar length together
                micro = {k: v.to(device) for k, v in collate_rows([rows[i] for i in part], self.pad_id).items()}
                logp_new = response_logprobs(self.model, micro, temperature=args.temperature).float()  # (b, t)
                sel = lambda x: None if x is None else x[part, : logp_new.shape[1]].to(device)  # noqa: E731
                loss, stats = policy_loss(
                    logp_new, sel(batch.logp_student), sel(batch.token_adv), sel(trained), num_tokens=n_tokens,
                    ppo_clip=args.ppo_clip, logp_ref=sel(batch.logp_ref), kl_coef=args.kl_coef,
                    logp_teacher=sel(batch.logp_teacher), sdar_mask=sel(sdar_mask),
                    num_sdar_tokens=n_sdar, sdar_coef=sdar_coef, sdar_beta=args.sdar_beta, num_kl_tokens=n_trained,
                )
                if not torch.isfinite(loss):
                    finite = False
                    break
                loss.backward()
                for k, v in stats.items():
                    mb_stats[k] += float(v)  # each is already divided by the minibatch count: sums add up
            for p in self.params:  # a minibatch of skipped rows still steps: Adam's momentum moves the weights
                p.grad = torch.zeros_like(p) if p.grad is None else p.grad
            finite = self.dist.sum(0.0 if finite else 1.0) == 0  # [distributed] skip together
            if finite:
                self.dist.sum_grads(self.params)  # [distributed] sum of per-process token-mean pieces
                mb_stats = {k: self.dist.sum(v) for k, v in mb_stats.items()}  # [distributed]
                norm = torch.nn.utils.clip_grad_norm_(self.params, args.grad_clip)
                finite = bool(torch.isfinite(norm))
            if finite:
                self.optimizer.step()
                steps_taken += 1
                for k, v in {**mb_stats, "grad_norm": float(norm)}.items():
                    sums[k] += v
            else:  # a non-finite loss or gradient: skip this step, log it, go on
                skipped += 1
                print(f"warning: iteration {self.iteration_done + 1}: non-finite loss or gradient, step skipped",
                      file=sys.stderr)
            self.optimizer.zero_grad(set_to_none=True)
        return {**{f"update/{k}": v / max(steps_taken, 1) for k, v in sums.items()},
                "update/optimizer_steps": steps_taken, "update/skipped_steps": skipped}

    def evaluate(self) -> tuple[dict, dict]:
        """(the eval/... metrics of the line, the record eval.py would write: metrics, each game, config)."""
        args = self.args
        self.eval_env = self.eval_env or make_env(args.env, data_dir=args.data_dir, max_steps=args.max_steps,
                                                  workers=resolve_workers(args.env_workers, args.eval_games))
        split, start = args.eval_split or self.eval_env.default_eval_split, time.perf_counter()
        line, games = greedy_evaluation(self.eval_env, self.model, self.tokenizer, split, args.eval_games,
                                        self.history_len, args.max_new_tokens)
        record = {**{k.removeprefix("eval/"): v for k, v in line.items()}, "games": games,
                  "config": {"env": args.env, "split": split, "policy": "model", "iteration": self.iteration_done,
                             "checkpoint": None, "max_steps": args.max_steps, "max_new_tokens": args.max_new_tokens}}
        line["seconds/eval"] = record["wall_seconds"] = time.perf_counter() - start
        return line, record

    def close(self) -> None:
        self.env.close()
        if self.eval_env is not None:
            self.eval_env.close()


def train(args: TrainArgs, trainer: Trainer | None = None) -> list[dict]:
    """Run (or resume) training; returns the metrics of the iterations run now.

    What a kill at any moment costs: at most the iterations since the last checkpoint; the logs
    keep only whole lines of iterations up to the checkpoint a run resumes from."""
    dist = trainer.dist if trainer else DataParallel()
    with RunFolder(args.output_dir, main=dist.main) as run:  # [run] one writer: RUN/.lock, held until the end
        run.check(resuming=bool(args.resume))  # [run] refuse to overwrite a run, before anything loads
        dist.barrier()  # [distributed] every process has looked before the main one writes
        trainer = trainer or Trainer(args, dist=dist)
        run.start(asdict(args), trainer.iteration_done)  # [run]
        tracker = dashboard.open_tracker(args.report_to, args.output_dir, asdict(args)) if dist.main else None  # [run]
        history = []
        recent = [m["success"] for m in run.logged()[-metrics.RECENT:]] if dist.main else []  # [run] resumed: its last
        while trainer.iteration_done < args.iterations:
            line, samples = trainer.iteration()
            it = trainer.iteration_done
            recent = (recent + [line["success"]])[-metrics.RECENT:]  # [run] over more tasks than one iteration draws
            line["success_recent"] = sum(recent) / len(recent)
            if args.eval_every and it % args.eval_every == 0 and dist.main:
                evaluation, record = trainer.evaluate()
                line.update(evaluation)
                run.save_evaluation(it, record)  # [run] each game's outcome, in eval.py's format
            run.log(line, samples)  # [run]
            dashboard.log(tracker, line)  # [run] --report-to: the same line, live
            if it % args.save_every == 0 or it == args.iterations:  # [run] a checkpoint, then `latest`
                trainer.warmstart = run.save(it, trainer.model, trainer.optimizer, trainer.rng, asdict(args),
                                             trainer.warmstart, args.keep_checkpoints)
            if dist.main:
                print(metrics.progress_line(line), flush=True)
            dist.barrier()  # [distributed]
            history.append(line)
        trainer.close()
        dashboard.close(tracker)  # [run]
    return history


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(config.describe(args))  # [run] what runs, and where it writes
    train(args)
    print(f"done: metrics in {args.output_dir}/metrics.jsonl, checkpoints in {args.output_dir}/checkpoints "
          f"(evaluate with: python eval.py --policy model --checkpoint {args.output_dir})")


if __name__ == "__main__":
    run(main)
