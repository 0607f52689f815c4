"""Train: one loop on one GPU (or CPU) that turns episodes into SHARPO updates of a LoRA policy.

Each iteration is seven stages, in METHOD.md's order; each returns what it computes:
  1. rollout    G rollouts of each of --groups tasks, one batched generate per turn      -> trajectories
  2. segments   one training row per step (context c_k, response a_k = one segment), and
                the hindsight teacher's row (--hindsight sibling | expert)                -> Rows
  3. advantage  A_i = GRPO over each group, from the rewards alone: the direction (Eq. 1) -> Advantages
  4. teacher    log-probs of the sampled tokens: student (before the update), teacher (same
                policy, hindsight context), reference (adapter off, for the KL); only for
                the rows whose Ahat can be != 0 (and the rows a KL or SDAR term reads)    -> LogProbs
  5. credit     Ahat = A_i * ((1 - lam) + lam * m_i,k): the teacher sets the size (Eq. 2-5) -> Credit
  6. update     PPO-clip on Ahat, --minibatches optimizer steps x --ppo-epochs, token-mean (Eq. 6-7)
  7. log        the metrics line and a few sample trajectories (infra/metrics.py)

--algo picks the credit assignment, all through the same functions (advantage.ALGORITHMS):
sharpo, grpo (lam = 0), rlsd (per-token multiplier), stepopsd (2 * sigmoid), sdar (GRPO's
advantage plus a term in the loss), gigpo (no teacher: A_i + omega * A_step of step groups).

Lines a reader of the method may skip are marked: [distributed] take part in a multi-process run
(torchrun / accelerate launch; infra/distributed.py) and do nothing in a plain one; [run] keep the
run folder (infra/checkpoint.py), the logs and timings (infra/metrics.py). The run's own flags
(model, precision, data, run folder, logging) are infra/config.py's RunArgs.

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

from advantage import (ALGORITHMS, gigpo_step_advantages, gigpo_token_advantages, grpo_advantages, moving_rows,
                       policy_loss, rlsd_token_advantages, segment_gap, segment_multipliers, shuffled_within_groups,
                       token_advantages)
from envs import draw_tasks, history_length, make_env, resolve_workers, training_tasks
from eval import greedy_evaluation
from infra import config, dashboard, metrics
from infra.checkpoint import RunFolder, find_checkpoint, restore_training_state, run_policy, run_warmstart
from infra.cli import run
from infra.config import RunArgs
from infra.distributed import DataParallel
from rollout import ModelPolicy, logprobs, play_episodes, rows_logprobs, student_teacher_logprobs
from segments import (EXPERT_HEADLINE, Advantages, Credit, LogProbs, Rows, Trajectory, format_plan, length_batches,
                      make_rows, sibling_hindsight)
from speed import FastPath
from vllm_rollout import vllm_policy


@dataclass
class TrainArgs(RunArgs):
    """The method's flags (METHOD.md); the run's are RunArgs. Defaults: the GPU setting (--preset cpu-demo shrinks them)."""

    env: Literal["alfworld", "webshop"] = "alfworld"  # environment
    algo: Literal["sharpo", "grpo", "rlsd", "stepopsd", "sdar", "gigpo"] = "sharpo"  # credit assignment (METHOD.md)
    iterations: int = 100  # training iterations (one rollout batch each)
    groups: int = 16  # tasks per iteration (distinct while the split has enough)
    group_size: int = 8  # rollouts per task (G)
    max_steps: int = 0  # env steps per episode; 0 = the env's default (ALFWorld 50, WebShop 15)
    max_new_tokens: int = 256  # response length limit per turn
    history: str = "2"  # observation/action pairs in the prompt: an integer or "all"
    temperature: float = 1.0  # rollout sampling temperature (log-probs use the same)
    hindsight: Literal["sibling", "expert"] = "sibling"  # teacher's hindsight: a successful group mate | the env expert
    episode_stats: Literal["trajectory", "step"] = "trajectory"  # GRPO's group mean/std over trajectories, or over step rows (verl-agent)
    lam: float = 0.5  # mixing weight of the multiplier: Ahat = A * ((1 - lam) + lam * m)
    mult_eps: float = 0.2  # multiplier bound eps_m: m in [1 - eps_m, 1 + eps_m]
    gap_tokens: Literal["all", "action"] = "all"  # tokens averaged into the segment gap: all | inside <action>
    gigpo_gamma: float = 0.95  # --algo gigpo: discount of the step return R_t
    gigpo_omega: float = 1.0  # --algo gigpo: weight of the step-group advantage, A_i + omega * A_step
    gigpo_norm: Literal["std", "mean"] = "std"  # --algo gigpo: both advantages (R - mean) / std, or R - mean (verl-agent's mean_norm)
    ppo_clip: float = 0.2  # PPO ratio clip
    kl_coef: float = 0.01  # k3 KL to the reference (adapter off); 0 skips the reference pass
    sdar_coef: float = 0.01  # --algo sdar: weight of the gated self-distillation term
    sdar_beta: float = 5.0  # --algo sdar: gate sharpness, sigmoid(beta * delta)
    shuffle_rewards: bool = False  # a control, not a method: each group's episode rewards permuted among its episodes
    lr: float = 3e-6  # AdamW learning rate (verl-agent LoRA: 3e-6)
    weight_decay: float = 0.0  # AdamW weight decay
    grad_clip: float = 1.0  # max gradient norm
    minibatches: int = 2  # optimizer steps per rollout batch and epoch
    ppo_epochs: int = 1  # passes over the rollout batch
    seed: int = 0  # seed for task sampling, generation and LoRA init


def parse_args(argv: list[str] | None = None) -> TrainArgs:
    """Flags over the preset's over TrainArgs's defaults, or a resumed run's; all checked (infra/config.py)."""
    return config.parse_train_args(TrainArgs, argv, __doc__)


def minibatches(B: int, per_epoch: int, epochs: int, generator: torch.Generator):
    """Row indices of each optimizer step: --ppo-epochs passes, each a new random order of the B rows cut in --minibatches."""
    for _ in range(epochs):
        order = torch.randperm(B, generator=generator).tolist()
        for m in range(per_epoch):
            yield order[m * B // per_epoch : (m + 1) * B // per_epoch]


class Trainer:
    """Holds the model, optimizer, envs and run state; `iteration()` is the loop body, stage by stage."""

    def __init__(self, args: TrainArgs, model=None, tokenizer=None, env=None, dist: DataParallel | None = None):
        self.dist = dist or DataParallel()  # [distributed] world 1 in a plain run
        self.args, self.algo = args, ALGORITHMS[args.algo]
        self.rng = random.Random(args.seed)  # task sampling
        torch.manual_seed(args.seed)
        ckpt = find_checkpoint(args.resume) if args.resume else None  # [run] the checkpoint to continue from
        self.env = env or make_env(args.env, data_dir=args.data_dir, max_steps=args.max_steps,  # data checked first
                                   workers=resolve_workers(args.env_workers, args.groups * args.group_size),
                                   timeout=args.env_timeout)
        self.eval_env = None
        self.tasks = training_tasks(self.env, args.split, args.max_plan_len)
        config.check_tasks(args, self.env)  # [run] the evaluation split holds the games asked for
        if model is None:  # a new LoRA over the (warm-started) base, or [run] the checkpoint's policy exactly
            model, tokenizer = run_policy(args, ckpt, self.dist.device)
        self.model, self.tokenizer, self.pad_id = model, tokenizer, tokenizer.pad_token_id
        self.history_len = history_length(args.history)
        self.fast = None if args.plain else FastPath(self.pad_id, args.micro_batch_rows)  # [speed] speed.py
        self.params = [p for p in model.parameters() if p.requires_grad]  # the LoRA weights
        self.optimizer = torch.optim.AdamW(self.params, lr=args.lr, weight_decay=args.weight_decay)
        self.actor = (ModelPolicy(model, tokenizer, args.max_new_tokens, args.temperature, args.rollout_batch)
                      if args.rollout == "hf" else vllm_policy(model, tokenizer, args))  # [run] vLLM: the same act()
        self.warmstart = run_warmstart(args, ckpt)  # [run] the warm start each checkpoint carries a copy of
        self.iteration_done = restore_training_state(ckpt, self.optimizer, self.rng) if ckpt else 0  # [run]
        if self.dist.rank:  # [distributed] the same tasks (self.rng) everywhere, other samples per process
            torch.manual_seed(args.seed + 100_003 * self.dist.rank + self.iteration_done)

    def iteration(self) -> tuple[dict, list[dict]]:
        """One iteration, stage by stage; returns (metrics line, sample trajectories)."""
        it, watch = self.iteration_done + 1, metrics.Stopwatch(self.env)  # [run] seconds per stage, env time, crashes
        with watch("rollout"):
            trajs = self.rollout(it)  # 1. rollout
        with watch("segments"):
            rows = self.segments(trajs)  # 2. segments
        adv = self.advantage(trajs, rows)  # 3. advantage
        logp = self.teacher(rows, adv, watch)  # 4. teacher (and the student's and reference's log-probs)
        credit = self.credit(rows, adv, logp)  # 5. credit
        with watch("update"):
            update = self.update(rows, adv, logp, credit)  # 6. update
        self.iteration_done = it
        done = metrics.Stages(trajs, rows, adv, logp, credit, update, watch, self.actor)  # 7. log (the caller writes it)
        return (metrics.iteration_metrics(done, self.args, self.dist, it),
                metrics.sample_records(done, self.tokenizer, self.args.samples_per_iter, it))

    # 1. rollout: G copies of each drawn task, every live episode in one generate per turn
    def rollout(self, it: int) -> list[Trajectory]:
        args = self.args
        chosen = draw_tasks(self.rng, self.tasks, args.groups)
        mine = range(self.dist.rank, args.groups, self.dist.world)  # [distributed] whole groups per process
        task_ids = [chosen[g] for g in mine for _ in range(args.group_size)]
        group_ids = [g for g in mine for _ in range(args.group_size)]
        with self.actor.serving(self.model, it):  # the policy of this moment decodes ([run] vLLM: its adapter)
            return play_episodes(self.env, task_ids, self.actor, self.history_len, group_ids, desc=f"iter {it} rollout")

    # 2. segments: one row per step for the student; the teacher's row where there is hindsight (section 2)
    def segments(self, trajs: list[Trajectory]) -> Rows:
        hindsight = sibling_hindsight(trajs) if self.args.hindsight == "sibling" else \
            [format_plan(EXPERT_HEADLINE, self.env.expert_plan(traj.task_id)) for traj in trajs]
        for traj, text in zip(trajs, hindsight):
            traj.hindsight = text
        return make_rows(self.tokenizer, trajs, hindsight, action_only=self.args.gap_tokens == "action")

    # 3. advantage: A_i over each group, from the rewards alone; which rows that leaves anything to do (section 4)
    def advantage(self, trajs: list[Trajectory], rows: Rows) -> Advantages:
        args = self.args
        rewards, groups = torch.tensor([t.reward for t in trajs]), torch.tensor([t.group for t in trajs])  # (N,)
        if args.shuffle_rewards:  # a placebo run: the same advantages, handed to episodes by chance
            draw = torch.Generator().manual_seed(args.seed * 1_000_003 + self.iteration_done)  # resumes exactly
            rewards = shuffled_within_groups(rewards, groups, draw)  # (N,)
        std = not (self.algo.step_groups and args.gigpo_norm == "mean")  # GiGPO's mean norm: R - mean, both halves
        if args.episode_stats == "trajectory":  # one sample per trajectory (GiGPO paper)
            adv = grpo_advantages(rewards, groups, norm_by_std=std)[rows.traj]  # (B,) each row its A_i  (Eq. 1)
        else:  # one sample per step row (verl-agent's default): long episodes weigh more in the statistics
            adv = grpo_advantages(rewards[rows.traj], groups[rows.traj], norm_by_std=std)  # (B,)       (Eq. 1)
        step_adv = step_groups = None
        if self.algo.step_groups:  # section 6: steps from the same state, compared by their return (Eq. 11-12)
            step_adv, step_groups = gigpo_step_advantages(
                torch.tensor([s.reward for s in rows.steps]), rows.traj, groups[rows.traj].tolist(),
                [s.anchor for s in rows.steps], args.gigpo_gamma, norm_by_std=std)  # (B,), (B,)
        moves = moving_rows(args.algo, adv, step_adv, args.gigpo_omega)  # (B,) Ahat can be != 0
        in_loss = moves | (args.kl_coef > 0 or self.algo.sdar)  # (B,) KL and SDAR act on rows with Ahat = 0 too
        taught = rows.has_hindsight & (in_loss if self.algo.sdar else moves) & self.algo.teacher  # (B,)
        return Advantages(adv, step_adv, step_groups, moves, in_loss, taught)

    # 4. teacher: student (before the update), teacher (taught rows) and reference log-probs, where needed
    def teacher(self, rows: Rows, adv: Advantages, watch=None) -> LogProbs:
        args, T, it = self.args, rows.response_mask.shape[1], self.iteration_done + 1
        self.model.eval()
        student, teacher = student_teacher_logprobs(self.model, rows, adv.in_loss, adv.taught, args.temperature, self.fast,
                                                    desc=f"iter {it}", watch=watch)  # (B, T), (B, T)
        ref = None
        if args.kl_coef > 0:
            with metrics.timed(watch, "reference"), self.model.disable_adapter():  # the base weights, no second copy
                ref = rows_logprobs(self.model, rows.rows, T, args.temperature, adv.in_loss, self.fast,
                                    desc=f"iter {it} reference")  # (B, T)
        return LogProbs(student, torch.where(adv.taught[:, None], teacher, student), ref)  # no hindsight: m = 1

    # 5. credit: the token advantage Ahat of --algo, from A_i and the teacher's gap (section 4)
    def credit(self, rows: Rows, adv: Advantages, logp: LogProbs) -> Credit:
        args, algo, mask = self.args, self.algo, rows.response_mask
        lam = args.lam if algo.mixes else 0.0  # GRPO and SDAR keep the advantage as it is
        gaps = segment_gap(logp.teacher, logp.student, mask, rows.gap_mask)  # (B,) g                  (Eq. 2-3)
        if algo.step_groups:
            token_adv = gigpo_token_advantages(adv.row, adv.step, mask, args.gigpo_omega)  # (B, T)  (Eq. 13)
        elif algo.granularity == "token":
            token_adv = rlsd_token_advantages(adv.row, logp.teacher, logp.student, mask, lam, args.mult_eps)  # (Eq. 8)
        else:
            token_adv = token_advantages(adv.row, gaps, mask, lam, args.mult_eps, algo.shape)  # (B, T)  (Eq. 4-5)
        return Credit(token_adv, gaps, segment_multipliers(adv.row, gaps, args.mult_eps, algo.shape))

    # 6. update: PPO-clip on Ahat, --minibatches optimizer steps per epoch, token-mean (section 5)
    def update(self, rows: Rows, adv: Advantages, logp: LogProbs, credit: Credit) -> dict:
        args, B, device = self.args, len(rows.rows), self.model.get_input_embeddings().weight.device
        response = rows.response_mask  # (B, T) every response token: the token-mean's denominator counts them all
        trained = response & adv.in_loss[:, None]  # (B, T) the tokens the loss reads (the others add exactly 0)
        sdar = trained & rows.has_hindsight[:, None] & self.algo.sdar  # (B, T) the SDAR term's tokens
        order = torch.Generator().manual_seed(args.seed * 100003 + self.iteration_done + 7919 * self.dist.rank)
        log = metrics.UpdateLog(self.iteration_done + 1, kl=args.kl_coef > 0, sdar=self.algo.sdar)  # [run]
        fresh = True  # no weight has moved yet this iteration
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        for idx in log.progress(minibatches(B, args.minibatches, args.ppo_epochs, order), args.ppo_epochs * args.minibatches):
            n_tokens, n_trained, n_sdar = (self.dist.sum(int(m[idx].sum())) for m in (response, trained, sdar))  # [distributed] whole minibatch
            if n_tokens == 0:
                continue
            finite, stats = True, []
            for part in length_batches([i for i in idx if adv.in_loss[i]], rows.rows, args.micro_batch_rows):
                logp_new = logprobs(self.model, [rows.rows[i] for i in part], args.temperature, self.fast)  # (b, t)
                sel = lambda x: None if x is None else x[part, : logp_new.shape[1]].to(device)  # noqa: E731  (b, t)
                old = logp_new.detach() if fresh else sel(logp.student)  # fresh: r = 1 exactly, not bf16's noise
                loss, s = policy_loss(logp_new, old, sel(credit.token_adv), sel(trained),  # (Eq. 6-7, 10)
                                      num_tokens=n_tokens, ppo_clip=args.ppo_clip, logp_ref=sel(logp.ref),
                                      kl_coef=args.kl_coef, logp_teacher=sel(logp.teacher), sdar_mask=sel(sdar),
                                      num_sdar_tokens=n_sdar, sdar_coef=args.sdar_coef if self.algo.sdar else 0.0,
                                      sdar_beta=args.sdar_beta, num_kl_tokens=n_trained)
                finite = finite and bool(torch.isfinite(loss))
                if not finite:  # a non-finite loss: this step is skipped below, on every process
                    break
                loss.backward()
                stats.append(s)
            step = self.dist.step(self.optimizer, self.params, args.grad_clip, finite, log.total(stats))  # [distributed]
            fresh = fresh and step is None  # a skipped step moved nothing
            log.add(step)
        return log.means()

    def evaluate(self) -> tuple[dict, dict]:
        """(the eval/... metrics of the line, the record eval.py would write: metrics, each game, config)."""
        args = self.args
        self.eval_env = self.eval_env or make_env(args.env, data_dir=args.data_dir, max_steps=args.max_steps,
                                                  workers=resolve_workers(args.env_workers, args.eval_games),
                                                  timeout=args.env_timeout)
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
    print(f"where the last iteration's credit went (each segment's gap g and multiplier m):\n"
          f"{metrics.segments_table(metrics.last_samples(args.output_dir))}")  # [run]
    print(f"done: metrics in {args.output_dir}/metrics.jsonl, checkpoints in {args.output_dir}/checkpoints; draw the "
          f"segments with python -m tools.plots {args.output_dir}, evaluate with python eval.py --policy model "
          f"--checkpoint {args.output_dir}")


if __name__ == "__main__":
    run(main)
