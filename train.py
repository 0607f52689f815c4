"""Train: one loop on one GPU (or CPU) that turns episodes into SHARPO updates of a LoRA policy.

Each iteration is seven stages, in METHOD.md's order; each returns what it computes:
  1. rollout    G rollouts of each of --groups tasks, one batched generate per turn  -> trajectories
  2. segments   one training row per step (context c_k, response a_k = one segment),
                and the hindsight teacher's row (--hindsight sibling | expert)       -> Rows
  3. advantage  A_i = GRPO over each group, from the rewards alone: the direction
                (Eq. 1); which rows the next stages must compute (section 4)          -> Advantages
  4. logprobs   log-probs of the sampled tokens: the student's (before the update),
                its teacher's (same policy, hindsight context), the reference's (KL)  -> LogProbs
  5. credit     Ahat = A_i * ((1 - lam) + lam * m_i,k): the teacher sets the size
                (Eq. 2-5)                                                             -> Credit
  6. update     PPO-clip on Ahat (+ KL), --minibatches optimizer steps x --ppo-epochs,
                token-mean (Eq. 6-7)
  7. log        the metrics line and a few sample trajectories (infra/metrics.py)

--algo picks the credit assignment, all through the same functions (advantage.ALGORITHMS):
sharpo, grpo (lam = 0), rlsd (per-token multiplier), stepopsd (2 * sigmoid), sdar (GRPO's
advantage plus a term in the loss), gigpo (no teacher: A_i + omega * A_step of step groups).

Lines a reader of the method may skip are marked: [distributed] take part in a multi-process run
(torchrun / accelerate launch; infra/distributed.py) and do nothing in a plain one; [run] keep the
run folder (infra/checkpoint.py), the logs and timings (infra/metrics.py); [speed] speed.py's
batched log-probs (--plain: rollout.py's plain ones). The run's own flags (model, precision, data,
run folder, logging) are infra/config.py's RunArgs.

Deviations from the paper: see advantage.py; the teacher is the policy itself with the hindsight
block as one more user turn after the student's context (so stage 4 scores both from one pass
over that context), and rows without hindsight use multiplier 1.

Run: python train.py --env alfworld            (the CPU demo preset when no GPU is present)
"""
from __future__ import annotations

import errors  # [run] first: a Ctrl-C or kill while the imports below load is one line

errors.quiet_start(__name__)  # [run]
# isort: split

import random
import time
from dataclasses import asdict, dataclass
from typing import Literal

import torch

from advantage import (ALGORITHMS, gigpo_step_advantages, gigpo_token_advantages, grpo_advantages,
                       kl_loss, moving_rows, needed_rows, policy_loss, rlsd_token_advantages,
                       sdar_loss, segment_gap, shuffled_within_groups, token_advantages)
from envs import draw_tasks, history_length, make_env, resolve_workers, training_tasks
from eval import greedy_evaluation
from infra import config, dashboard, metrics
from infra.checkpoint import (RunFolder, find_checkpoint, restore_training_state, run_policy,
                              run_warmstart)
from infra.cli import OutputLost, Stopped, UserError, run
from infra.config import RunArgs
from infra.distributed import DataParallel
from rollout import (ModelPolicy, batch_logprobs, play_episodes, rows_logprobs,
                     student_teacher_logprobs)
from segments import (EXPERT_HEADLINE, Advantages, Credit, LogProbs, Rows, Trajectory, format_plan,
                      length_batches, make_rows, sibling_hindsight)
from speed import FastPath
from vllm_rollout import vllm_policy


@dataclass
class TrainArgs(RunArgs):
    """The method's flags (METHOD.md). The run's flags (model, precision, data, run folder, logs)
    are infra/config.py's RunArgs; --help lists the two apart. Defaults: the GPU setting; a preset
    (--preset) changes some of them and prints which, and why, when the run starts."""

    env: Literal["alfworld", "webshop"] = "alfworld"
    """the environment the agent acts in"""
    algo: Literal["sharpo", "grpo", "rlsd", "stepopsd", "sdar", "gigpo"] = "sharpo"
    """credit assignment: SHARPO or a baseline (METHOD.md sections 4 and 6)"""
    iterations: int = 100
    """training iterations, one rollout batch each"""
    groups: int = 16
    """tasks per iteration (distinct while the split has enough)"""
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
    """lam, the multiplier's weight: Ahat = A * ((1 - lam) + lam * m) (Eq. 5)"""
    eps_m: float = 0.2
    """eps_m, the multiplier's bound: m in [1 - eps_m, 1 + eps_m] (Eq. 4)"""
    gap_tokens: Literal["all", "action"] = "all"
    """the tokens the segment gap averages: all of the response, or those inside <action>"""
    gigpo_gamma: float = 0.95
    """--algo gigpo: the discount of the step return R_t (Eq. 11)"""
    gigpo_omega: float = 1.0
    """--algo gigpo: the step advantage's weight, A_i + omega * A_step (Eq. 13)"""
    gigpo_norm: Literal["std", "mean"] = "std"
    """--algo gigpo: both advantages (R - mean) / std, or R - mean (verl-agent's mean_norm)"""
    ppo_clip: float = 0.2
    """PPO's ratio clip (Eq. 6)"""
    kl_coef: float = 0.01
    """the k3 KL to the reference, the adapter off (Eq. 7); 0 skips the reference pass"""
    sdar_coef: float = 0.01
    """--algo sdar: the weight of the gated self-distillation term (Eq. 10)"""
    sdar_beta: float = 5.0
    """--algo sdar: the gate's sharpness, sigmoid(beta * delta) (Eq. 10)"""
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


def parse_args(argv: list[str] | None = None) -> TrainArgs:
    """Flags over the preset's over TrainArgs's defaults, or a resumed run's; all checked
    (infra/config.py)."""
    return config.parse_train_args(TrainArgs, argv, __doc__)


def minibatches(B: int, per_epoch: int, epochs: int, generator: torch.Generator):
    """Row indices of each optimizer step: --ppo-epochs passes, each a new random order of the
    B rows cut in --minibatches."""
    for _ in range(epochs):
        order = torch.randperm(B, generator=generator).tolist()
        for m in range(per_epoch):
            yield order[m * B // per_epoch : (m + 1) * B // per_epoch]


# The random streams of a run, each seeded per iteration (and per process) with
# seed * a + iteration + b * rank, so that a resumed run draws what an uninterrupted one would.
STREAMS = {"sampling": (1, 100_003), "placebo": (1_000_003, 0), "minibatches": (100_003, 7919)}


def stream_seed(stream: str, seed: int, iteration: int, rank: int = 0) -> int:
    """The seed of the random stream `stream` after `iteration` iterations, on process `rank`."""
    a, b = STREAMS[stream]
    return seed * a + iteration + b * rank


def rows_of(x: torch.Tensor, part: list[int], like: torch.Tensor) -> torch.Tensor:
    """The rows `part` of a (B, T) tensor, cut to like's t columns, on like's device: (b, t)."""
    return x[part, : like.shape[1]].to(like.device)


class Trainer:
    """The model, optimizer, envs and run state; `iteration()` is the loop body, stage by stage."""

    def __init__(self, args: TrainArgs, model=None, tokenizer=None, env=None,
                 dist: DataParallel | None = None):
        self.dist = dist or DataParallel()  # [distributed] world 1 in a plain run
        self.args, self.algo = args, ALGORITHMS[args.algo]
        self.rng = random.Random(args.seed)  # task sampling
        torch.manual_seed(args.seed)
        ckpt = find_checkpoint(args.resume) if args.resume else None  # [run] to continue from
        self.env = env or self.make_env(args.groups * args.group_size)  # checks the data first
        self.eval_env = None
        self.tasks = training_tasks(self.env, args.split, args.max_plan_len)
        config.check_tasks(args, self.env)  # [run] the evaluation split holds the games asked for
        if model is None:  # a new LoRA over the (warm-started) base, or [run] the checkpoint's
            model, tokenizer = run_policy(args, ckpt, self.dist.device)
        self.model, self.tokenizer = model, tokenizer
        self.history_len = history_length(args.history)
        self.fast = None if args.plain else FastPath(tokenizer.pad_token_id,
                                                     args.micro_batch_rows)  # [speed] speed.py
        self.params = [p for p in model.parameters() if p.requires_grad]  # the LoRA weights
        self.optimizer = torch.optim.AdamW(self.params, lr=args.lr, weight_decay=args.weight_decay)
        if args.rollout == "hf":
            self.actor = ModelPolicy(model, tokenizer, args.max_new_tokens, args.temperature,
                                     args.rollout_batch, self.fast)
        else:  # [run] vLLM decodes, behind the same act()
            self.actor = vllm_policy(model, tokenizer, args)
        self.warmstart = run_warmstart(args, ckpt)  # [run] the warm start each checkpoint carries
        self.data = getattr(self.env, "data_digest", lambda: None)()  # [run] the tasks, in a hash
        self.iteration_done = 0
        if ckpt:  # [run] a checkpoint of these tasks: its optimizer and random states
            self.iteration_done = restore_training_state(ckpt, self.optimizer, self.rng, self.data)
        if self.dist.rank:  # [distributed] the same tasks (self.rng), other samples per process
            rank_seed = stream_seed("sampling", args.seed, self.iteration_done, self.dist.rank)
            torch.manual_seed(rank_seed)

    def iteration(self) -> tuple[dict, list[dict]]:
        """One iteration, stage by stage; returns (metrics line, sample trajectories)."""
        it = self.iteration_done + 1
        watch = metrics.Stopwatch(self.env)  # [run] seconds per stage, the env's share
        with watch("rollout"):
            trajs = self.rollout(it)  # 1. rollout
        with watch("segments"):
            rows = self.segments(trajs)  # 2. segments
        adv = self.advantage(trajs, rows)  # 3. advantage
        logp = self.logprobs(rows, adv, watch)  # 4. logprobs: student, teacher, reference
        credit = self.credit(rows, adv, logp)  # 5. credit
        with watch("update"):
            update = self.update(rows, adv, logp, credit)  # 6. update
        self.iteration_done = it
        done = metrics.Stages(trajs, rows, adv, logp, credit, update, watch, self.actor)  # 7. log
        return (metrics.iteration_metrics(done, self.args, self.dist, it),
                metrics.sample_records(done, self.tokenizer, self.args.samples_per_iter, it))

    # 1. rollout: G copies of each drawn task, every live episode in one generate per turn
    def rollout(self, it: int) -> list[Trajectory]:
        args = self.args
        chosen = draw_tasks(self.rng, self.tasks, args.groups)
        mine = range(self.dist.rank, args.groups, self.dist.world)  # [distributed] whole groups
        task_ids = [chosen[g] for g in mine for _ in range(args.group_size)]
        group_ids = [g for g in mine for _ in range(args.group_size)]
        with self.actor.serving(self.model, it):  # the policy of this moment decodes
            return play_episodes(self.env, task_ids, self.actor, self.history_len, group_ids,
                                 desc=f"iter {it} rollout")

    # 2. segments: a row per step for the student; the teacher's where there is hindsight (sec. 2)
    def segments(self, trajs: list[Trajectory]) -> Rows:
        if self.args.hindsight == "sibling":  # a successful group mate's actions, never one's own
            hindsight = sibling_hindsight(trajs)
        else:  # the env's own plan, for every trajectory
            plans = [self.env.expert_plan(t.task_id) for t in trajs]
            hindsight = [format_plan(EXPERT_HEADLINE, plan) for plan in plans]
        for traj, text in zip(trajs, hindsight):
            traj.hindsight = text
        action_only = self.args.gap_tokens == "action"
        return make_rows(self.tokenizer, trajs, hindsight, action_only=action_only)

    # 3. advantage: A_i over each group, from the rewards alone: the direction (sections 1 and 4)
    def advantage(self, trajs: list[Trajectory], rows: Rows) -> Advantages:
        args = self.args
        groups = torch.tensor([t.group for t in trajs])  # (N,) the group of each trajectory
        rewards = self.rewards(trajs, groups)  # (N,) R_i
        std = self.norm_by_std  # divide by the group's std (GiGPO's `mean` norm does not)
        if args.episode_stats == "trajectory":  # one sample a trajectory (the GiGPO paper)
            adv = grpo_advantages(rewards, groups, norm_by_std=std)[rows.traj]  # (B,) A_i  (Eq. 1)
        else:  # one sample a step row (verl-agent's default): a long episode weighs more
            adv = grpo_advantages(rewards[rows.traj], groups[rows.traj], norm_by_std=std)  # (Eq. 1)
        step, step_groups = None, None
        if self.algo.step_groups:  # GiGPO: steps from one state compared (Eq. 11-12)
            step, step_groups = self.gigpo_steps(rows, groups)  # (B,), (B,)
        moves = moving_rows(args.algo, adv, step, args.gigpo_omega)  # (B,) Ahat can be != 0
        trained, taught = needed_rows(args.algo, moves, rows.has_hindsight, args.kl_coef > 0)
        return Advantages(adv, step, step_groups, trained, taught)

    # 4. logprobs: of the sampled tokens, by the student before the update, its teacher, the ref
    def logprobs(self, rows: Rows, adv: Advantages, watch=None) -> LogProbs:
        args, T = self.args, rows.response_mask.shape[1]
        desc = f"iter {self.iteration_done + 1}"
        self.model.eval()
        student, teacher = student_teacher_logprobs(self.model, rows, adv.trained, adv.taught,
                                                    args.temperature, self.fast, desc, watch=watch)
        ref = None
        if args.kl_coef > 0:  # the reference of the KL term: the same weights, adapter off (Eq. 7)
            with metrics.timed(watch, "reference"), self.model.disable_adapter():
                ref = rows_logprobs(self.model, rows.rows, T, args.temperature, adv.trained,
                                    self.fast, desc=f"{desc} reference")  # (B, T)
        teacher = torch.where(adv.taught[:, None], teacher, student)  # no hindsight: m = 1
        return LogProbs(student, teacher, ref)

    # 5. credit: the token advantage Ahat of --algo, from A_i and the teacher's gap (section 4)
    def credit(self, rows: Rows, adv: Advantages, logp: LogProbs) -> Credit:
        args, algo, mask = self.args, self.algo, rows.response_mask
        gaps = segment_gap(logp.teacher, logp.student, mask, rows.gap_mask)  # (B,) g  (Eq. 2-3)
        if algo.step_groups:  # GiGPO: no teacher, no multiplier
            token_adv = gigpo_token_advantages(adv.row, adv.step, mask, args.gigpo_omega)  # Eq. 13
            return Credit(token_adv, gaps, None)
        lam = args.lam if algo.mixes else 0.0  # GRPO and SDAR keep the advantage as it is
        if algo.granularity == "token":  # RLSD: one multiplier a token (Eq. 8)
            token_adv, mults = rlsd_token_advantages(adv.row, logp.teacher, logp.student, mask,
                                                     lam, args.eps_m)  # (B, T), (B, T)
        else:  # one multiplier a segment, shared by its tokens (Eq. 4-5)
            token_adv, mults = token_advantages(adv.row, gaps, mask, lam, args.eps_m,
                                                algo.shape)  # (B, T), (B,)
        return Credit(token_adv, gaps, mults if algo.mixes else None)

    # 6. update: PPO-clip on Ahat, --minibatches optimizer steps per epoch, token-mean (section 5)
    def update(self, rows: Rows, adv: Advantages, logp: LogProbs, credit: Credit) -> dict:
        args, it, B = self.args, self.iteration_done + 1, len(rows.rows)
        seed = stream_seed("minibatches", args.seed, it - 1, self.dist.rank)
        order = torch.Generator().manual_seed(seed)
        steps = minibatches(B, args.minibatches, args.ppo_epochs, order)
        log = metrics.UpdateLog(it, kl=args.kl_coef > 0, sdar=self.algo.sdar)  # [run]
        moved = False  # no weight has moved yet: PPO's ratio is exactly 1 (section 5)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        for idx in log.progress(steps, args.ppo_epochs * args.minibatches):
            counts = self.token_counts(rows, adv, idx)  # the minibatch's token-mean denominators
            if counts["tokens"] == 0:
                continue
            finite, stats = True, []
            trained = [i for i in idx if adv.trained[i]]
            for part in length_batches(trained, rows.rows, args.micro_batch_rows):
                logp_new = batch_logprobs(self.model, [rows.rows[i] for i in part],
                                          args.temperature, self.fast)  # (b, t) with gradient
                logp_old = logp.old(part, logp_new, moved)  # (b, t) PPO's old log-probs
                loss, terms = self.loss(logp_new, logp_old, part, rows, logp, credit, counts)
                finite = finite and bool(torch.isfinite(loss))
                if not finite:  # a non-finite loss: this step is skipped below, on every process
                    break
                loss.backward()
                stats.append(terms)
            step = self.dist.step(self.optimizer, self.params, args.grad_clip, finite,
                                  log.total(stats))  # [distributed] the gradients summed first
            moved = moved or step is not None  # a skipped step moved nothing
            log.add(step)
            if step is not None:  # [run] a diverged policy stops here, before it is checkpointed
                self.check_sampling(rows.rows[idx[0]], it)
        return log.means()

    def loss(self, logp_new: torch.Tensor, logp_old: torch.Tensor, part: list[int], rows: Rows,
             logp: LogProbs, credit: Credit, counts: dict) -> tuple[torch.Tensor, dict]:
        """One micro-batch's loss: PPO-clip (Eq. 6), + kl_coef * KL (Eq. 7), + sdar_coef * SDAR's
        term (Eq. 10), each a token-mean over the whole minibatch; and its statistics ([run])."""
        args = self.args
        mask = rows_of(rows.response_mask, part, logp_new)  # (b, t) a micro-batch's rows all train
        ahat = rows_of(credit.token_adv, part, logp_new)  # (b, t)
        pg = policy_loss(logp_new, logp_old, ahat, mask, counts["tokens"], args.ppo_clip)  # (Eq. 6)
        loss, terms = pg, {"pg_loss": pg.detach()}
        if args.kl_coef > 0:  # stay near the reference (the adapter off)
            ref = rows_of(logp.ref, part, logp_new)  # (b, t)
            kl = kl_loss(ref, logp_new, mask, counts["tokens"])  # (Eq. 7)
            loss, terms["kl_ref"] = loss + args.kl_coef * kl, kl.detach()
        if self.algo.sdar and args.sdar_coef > 0:  # SDAR: toward the teacher, gated (Eq. 10)
            hind = mask & rows.has_hindsight[part, None].to(mask.device)  # (b, t) with hindsight
            teacher = rows_of(logp.teacher, part, logp_new)  # (b, t)
            sdar = sdar_loss(logp_new, teacher, logp_old, hind, counts["sdar"], args.sdar_beta)
            loss, terms["sdar_loss"] = loss + args.sdar_coef * sdar, sdar.detach()
        ppo = metrics.loss_stats(logp_new, logp_old, ahat, mask, counts["tokens"],
                                 counts["trained"], args.ppo_clip)  # [run] clip_frac, approx_kl_old
        return loss, {**terms, **ppo, "loss": loss.detach()}

    @torch.no_grad()
    def check_sampling(self, row, it: int) -> None:
        """[run] After an optimizer step, the policy can still be sampled: a row's log-probs are
        finite. A step that made them NaN or infinite (an update that diverged) stops the run in one
        line, and nothing of the iteration is checkpointed."""
        logp = batch_logprobs(self.model, [row], self.args.temperature, self.fast)  # (1, t)
        if not torch.isfinite(logp).all():
            kept = f"the run keeps iteration {it - 1}" if it > 1 else "no checkpoint yet"
            raise UserError(f"iteration {it}: an optimizer step made the policy's sampling "
                            "distribution non-finite (NaN or infinite log-probs: the update "
                            f"diverged; --lr {self.args.lr:g} too large?). Nothing of iteration "
                            f"{it} is checkpointed; {kept}. Start a new run with a smaller --lr")

    # what the stages above call: the rewards (or a placebo's), GiGPO's steps, the token counts
    def rewards(self, trajs: list[Trajectory], groups: torch.Tensor) -> torch.Tensor:
        """R_i of each trajectory, (N,). --shuffle-rewards (a control, not a method): each group's
        rewards dealt out among its episodes by chance, so the update's size stays what it was
        while what it teaches is cut from what was done."""
        rewards = torch.tensor([t.reward for t in trajs])  # (N,)
        if not self.args.shuffle_rewards:
            return rewards
        seed = stream_seed("placebo", self.args.seed, self.iteration_done)
        return shuffled_within_groups(rewards, groups, torch.Generator().manual_seed(seed))  # (N,)

    @property
    def norm_by_std(self) -> bool:
        """Whether an advantage is divided by its group's std: yes, but with GiGPO's `mean` norm."""
        return not (self.algo.step_groups and self.args.gigpo_norm == "mean")

    def gigpo_steps(self, rows: Rows, groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """GiGPO's step advantages and step groups, (B,) each: the steps of a group that act from
        the same state, compared by their discounted returns (Eq. 11-12)."""
        step_rewards = torch.tensor([s.reward for s in rows.steps])  # (B,)
        anchors = [s.anchor for s in rows.steps]  # the state each row acted from
        return gigpo_step_advantages(step_rewards, rows.traj, groups[rows.traj].tolist(), anchors,
                                     self.args.gigpo_gamma, norm_by_std=self.norm_by_std)

    def token_counts(self, rows: Rows, adv: Advantages, idx: list[int]) -> dict[str, int]:
        """A minibatch's token counts, over every process ([distributed]): its response tokens (the
        token-mean's denominator; rows left out count too, section 5), those of trained rows, and
        those of trained rows with hindsight (SDAR's term)."""
        response = rows.response_mask[idx]  # (m, T)
        trained = response & adv.trained[idx, None]  # (m, T)
        sdar = trained & rows.has_hindsight[idx, None] & self.algo.sdar  # (m, T)
        masks = {"tokens": response, "trained": trained, "sdar": sdar}
        return {name: self.dist.sum(int(m.sum())) for name, m in masks.items()}

    def make_env(self, episodes: int):
        """An env of --env on the run's data, with worker processes for `episodes` at a time."""
        args = self.args
        return make_env(args.env, data_dir=args.data_dir, max_steps=args.max_steps,
                        workers=resolve_workers(args.env_workers, episodes),
                        timeout=args.env_timeout)

    def evaluate(self) -> tuple[dict, dict]:
        """(the eval/... metrics of the line, the record eval.py would write: metrics, each game,
        config)."""
        args = self.args
        self.eval_env = self.eval_env or self.make_env(args.eval_games)
        split = args.eval_split or self.eval_env.default_eval_split
        start = time.perf_counter()
        line, games = greedy_evaluation(self.eval_env, self.model, self.tokenizer, split,
                                        args.eval_games, self.history_len, args.max_new_tokens)
        setting = {"env": args.env, "split": split, "policy": "model", "checkpoint": None,
                   "iteration": self.iteration_done, "max_steps": args.max_steps,
                   "max_new_tokens": args.max_new_tokens}
        record = {**{k.removeprefix("eval/"): v for k, v in line.items()}, "games": games,
                  "config": setting}
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
    with RunFolder(args.output_dir, main=dist.main) as run:  # [run] one writer: RUN/.lock
        run.check(resuming=bool(args.resume))  # [run] never overwrite a run; before any loading
        dist.barrier()  # [distributed] every process has looked before the main one writes
        trainer = trainer or Trainer(args, dist=dist)
        run.start(asdict(args), trainer.iteration_done, trainer.data)  # [run]
        tracker = None
        if dist.main:  # [run] --report-to: a live dashboard
            tracker = dashboard.open_tracker(args.report_to, args.output_dir, asdict(args))
        history = []
        recent = [m["success"] for m in run.logged()[-metrics.RECENT:]] if dist.main else []
        while trainer.iteration_done < args.iterations:
            line, samples = trainer.iteration()
            it = trainer.iteration_done
            recent = (recent + [line["success"]])[-metrics.RECENT:]  # [run] over more tasks
            line["success_recent"] = sum(recent) / len(recent)
            if args.eval_every and it % args.eval_every == 0 and dist.main:
                evaluation, record = trainer.evaluate()
                line.update(evaluation)
                run.save_evaluation(it, record)  # [run] each game's outcome, in eval.py's format
            run.log(line, samples)  # [run]
            dashboard.log(tracker, line)  # [run] --report-to: the same line, live
            if it % args.save_every == 0 or it == args.iterations:  # [run] a checkpoint, `latest`
                trainer.warmstart = run.save(it, trainer.model, trainer.optimizer, trainer.rng,
                                             asdict(args), trainer.warmstart, args.keep_checkpoints)
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
    out = args.output_dir
    table = metrics.segments_table(metrics.last_samples(out))  # [run]
    try:  # [run] the run is complete: a closed or full output loses only these lines
        print(f"where the last iteration's credit went (each segment's gap g and multiplier m):\n"
              f"{table}")
        print(f"done: metrics in {out}/metrics.jsonl, checkpoints in {out}/checkpoints; draw the "
              f"segments with python -m tools.plots {out}, evaluate with python eval.py --policy "
              f"model --checkpoint {out}")
    except OutputLost as err:
        raise Stopped(f"{out} is complete; only its closing summary was not printed", err) from None


if __name__ == "__main__":
    run(main)
