"""Train: one loop on one GPU (or CPU) that turns episodes into SHARPO updates of a LoRA policy.

Each iteration is seven stages in METHOD.md's order, `Trainer.iteration` below: 1. rollout,
2. segments, 3. advantage, 4. logprobs, 5. credit, 6. update, 7. log; each a method (marked by its
number) that returns what it computes. Stages 2-7 ask --algo (advantage.py's SHARPO or GRPO, or a
baseline of baselines.py). `train()` runs the iterations, their evaluations and checkpoints.
Lines marked [run] (run folder, logs, checks: infra/, report.py), [distributed] (several processes;
the identity in one) and [speed] (speed.py, which a run uses: rollout.py's numbers, batched;
--plain runs rollout.py's) compute nothing of the method; what they set (the iteration to start
from, a step's go-ahead) the loop reads.

Run: python train.py --env alfworld            (the CPU demo preset when no GPU is present)
"""
from __future__ import annotations

import errors  # [run] first: a Ctrl-C or kill while the imports below load is one line

errors.quiet_start(__name__)  # [run]
# isort: split

import random
from dataclasses import asdict

import torch

import report
import rollout
from advantage import Advantages, Credit, kl_loss, policy_loss
from baselines import ALGORITHMS, action_masks, shuffled_within_groups
from envs.answer import history_length
from envs.make import draw_tasks, make_env, resolve_workers, training_tasks
from flags import TrainArgs
from flags.parse import check_tasks, describe, parse_args  # [run]
from infra.checkpoint import RunFolder, find_checkpoint, resume_state, run_policy, stream_seed
from infra.cli import run
from infra.distributed import DataParallel
from infra.metrics import Stopwatch, timed
from rollout import LogProbs, ModelPolicy, play_episodes
from segments import (EXPERT_HEADLINE, Rows, Trajectory, format_plan, length_batches, make_rows,
                      sibling_hindsight)
from speed import FastPath
from vllm_rollout import vllm_policy


def minibatches(B: int, per_epoch: int, epochs: int, generator: torch.Generator):
    """Row indices of each optimizer step: --ppo-epochs passes, each a new random order of the
    B rows cut in --minibatches."""
    for _ in range(epochs):
        order = torch.randperm(B, generator=generator).tolist()
        for m in range(per_epoch):
            yield order[m * B // per_epoch : (m + 1) * B // per_epoch]


def rows_of(x: torch.Tensor, part: list[int], like: torch.Tensor) -> torch.Tensor:
    """The rows `part` of a (B, T) tensor, cut to like's t columns, on like's device: (b, t)."""
    return x[part, : like.shape[1]].to(like.device)


class Trainer:
    """The model, optimizer, envs and run state; `iteration()` is the loop body."""

    def __init__(self, args: TrainArgs, model=None, tokenizer=None, env=None,
                 dist: DataParallel | None = None):
        self.dist = dist or DataParallel()  # [distributed] world 1 in a plain run
        self.args, self.algo = args, ALGORITHMS[args.algo]
        self.rng = random.Random(args.seed)  # task sampling
        torch.manual_seed(args.seed)
        ckpt = find_checkpoint(args.resume) if args.resume else None  # [run] to continue from
        self.env = env or self.make_env(args.groups * args.group_size)  # checks the data first
        self.tasks = training_tasks(self.env, args.split, args.max_plan_len)
        check_tasks(args, self.env)  # [run] the evaluation split holds the games asked for
        if model is None:  # a new LoRA over the (warm-started) base, or [run] the checkpoint's
            model, tokenizer = run_policy(args, ckpt, self.dist.device)
        self.model, self.tokenizer = model, tokenizer
        self.history_len = history_length(args.history)
        # the log-prob passes and generate: rollout.py's plain ones, or [speed] the same, batched
        self.passes = rollout if args.plain else FastPath(tokenizer.pad_token_id,
                                                          args.micro_batch_rows)
        self.params = [p for p in model.parameters() if p.requires_grad]  # the LoRA weights
        self.optimizer = torch.optim.AdamW(self.params, lr=args.lr, weight_decay=args.weight_decay)
        if args.rollout == "hf":
            self.actor = ModelPolicy(model, tokenizer, args.max_new_tokens, args.temperature,
                                     args.rollout_batch, self.passes.generate)
        else:  # [run] vLLM decodes, behind the same act()
            self.actor = vllm_policy(model, tokenizer, args)
        # [run] a resume's iteration, optimizer and random states (a new run: iteration 0)
        self.iteration_done, self.warmstart, self.data = resume_state(
            ckpt, self.optimizer, self.rng, self.env.data_digest(), args.init_adapter, args.seed,
            self.dist.rank)

    def iteration(self) -> tuple[dict, list[dict]]:
        """One iteration: (metrics line, sample trajectories)."""
        it = self.iteration_done + 1
        watch = Stopwatch(self.env)  # [run] seconds per stage, the env's share
        with watch("rollout"):
            trajs = self.rollout(it)  # 1. rollout
        with watch("segments"):
            rows = self.segments(trajs)  # 2. segments
        adv = self.advantage(trajs, rows)  # 3. advantage
        logp = self.logprobs(rows, adv, watch)  # 4. logprobs: student, teacher
        credit = self.credit(rows, adv, logp)  # 5. credit
        with watch("update"):
            update = self.update(rows, adv, logp, credit, watch)  # 6. update
        self.iteration_done = it
        done = report.Stages(trajs, rows, adv, logp, credit, update, watch, self.actor)  # 7. log
        return report.line_and_samples(done, self, it)

    # 1. rollout: G copies of each drawn task
    def rollout(self, it: int) -> list[Trajectory]:
        args = self.args
        chosen = draw_tasks(self.rng, self.tasks, args.groups)
        mine = range(self.dist.rank, args.groups, self.dist.world)  # [distributed] whole groups
        task_ids = [chosen[g] for g in mine for _ in range(args.group_size)]
        group_ids = [g for g in mine for _ in range(args.group_size)]  # each episode's group
        with self.actor.serving(self.model, it):  # the policy of this moment decodes
            return play_episodes(self.env, task_ids, self.actor, self.history_len, group_ids,
                                 desc=f"iter {it} rollout")

    # 2. segments: a row per step for the student; the teacher's where there is hindsight (sec. 2)
    def segments(self, trajs: list[Trajectory]) -> Rows:
        if not self.algo.uses_teacher(self.args):  # GRPO, GiGPO, lam 0: no teacher, no hindsight
            hindsight = [None] * len(trajs)
        elif self.args.hindsight == "sibling":  # a successful group mate's actions, not its own
            hindsight = sibling_hindsight(trajs)
        else:  # the env's own plan, for every trajectory
            plans = [self.env.expert_plan(t.task_id) for t in trajs]
            hindsight = [format_plan(EXPERT_HEADLINE, plan) for plan in plans]
        for traj, text in zip(trajs, hindsight):
            traj.hindsight = text
        rows = make_rows(self.tokenizer, trajs, hindsight)
        if self.args.gap_tokens == "action":  # the gap over <action>...</action> (baselines.py)
            T = rows.response_mask.shape[1]
            rows.gap_mask, rows.gap_fallback = action_masks(self.tokenizer, rows.rows, T)  # (B, T)
        return rows

    # 3. advantage: A_i over each group, from the rewards alone: the direction (Eq. 1); and which
    # rows the next stages compute (section 4)
    def advantage(self, trajs: list[Trajectory], rows: Rows) -> Advantages:
        groups = torch.tensor([t.group for t in trajs])  # (N,) the group of each trajectory
        rewards = torch.tensor([t.reward for t in trajs])  # (N,) R_i
        if self.args.shuffle_rewards:  # the placebo: a group's rewards dealt out by chance
            seed = stream_seed("placebo", self.args.seed, self.iteration_done)
            rewards = shuffled_within_groups(rewards, groups, torch.Generator().manual_seed(seed))
        return self.algo.advantages(rewards, groups, rows, self.args)  # advantage.py's SHARPO

    # 4. logprobs: of the sampled tokens, by the student before the update, and by its teacher
    def logprobs(self, rows: Rows, adv: Advantages, watch=None) -> LogProbs:
        self.model.eval()
        student, teacher = self.passes.student_teacher_logprobs(
            self.model, rows=rows, student=adv.trained, taught=adv.taught,
            temperature=self.args.temperature, desc=f"iter {self.iteration_done + 1}",
            watch=watch)  # (B, T) each
        teacher = torch.where(adv.taught[:, None], teacher, student)  # not taught: m = 1
        return LogProbs(student, teacher)

    # 5. credit: Ahat = A_i * ((1 - lam) + lam * m_i,k), from A_i and the teacher's gap (Eq. 2-5)
    def credit(self, rows: Rows, adv: Advantages, logp: LogProbs) -> Credit:
        return self.algo.credit(adv, logp, rows, self.args)  # advantage.py's SHARPO.credit

    # 6. update: PPO-clip on Ahat (+ KL to the reference, the adapter off), --minibatches optimizer
    # steps per epoch, token-mean (Eq. 6-7, section 5)
    def update(self, rows: Rows, adv: Advantages, logp: LogProbs, credit: Credit,
               watch=None) -> dict:
        args, it = self.args, self.iteration_done + 1
        order = torch.Generator().manual_seed(stream_seed("minibatches", args.seed, it - 1,
                                                          self.dist.rank))
        log = report.UpdateLog(it, self.dist, args, self.algo)  # [run] each step's statistics
        moved = False  # no optimizer step yet: the weights are the student pass's (section 5)
        self.model.train()
        for idx in log.progress(minibatches(len(rows.rows), args.minibatches, args.ppo_epochs,
                                            order)):
            counts = self.token_counts(rows, adv, idx)  # the minibatch's token-mean denominators
            if counts["tokens"] == 0:
                continue
            trained = [i for i in idx if adv.trained[i]]  # the rows the update reads (section 4)
            finite = True  # every loss of the minibatch so far; a non-finite one: no step
            for part in length_batches(trained, rows.rows, args.micro_batch_rows):
                batch = [rows.rows[i] for i in part]
                logp_ref = self.reference(batch, watch)  # (b, t) the KL's, or None
                logp_new = self.passes.micro_batch_logprobs(self.model, rows=batch,
                                                            temperature=args.temperature)  # (b, t)
                # PPO's old log-probs: the student's, once a step has moved the weights; before
                # that logp_new itself, so the ratio is exactly 1 (section 5)
                logp_old = rows_of(logp.student, part, logp_new) if moved else logp_new.detach()
                loss = self.loss(logp_new, logp_old, logp_ref, part, rows, logp, credit, counts,
                                 log)
                finite = bool(torch.isfinite(loss))
                if not finite:
                    break
                loss.backward()
            step = self.dist.all(finite)  # [distributed] a non-finite loss anywhere: none
            if step:
                self.dist.sum_grads(self.params)  # [distributed] summed over processes
                norm = torch.nn.utils.clip_grad_norm_(self.params, args.grad_clip)
                step = bool(torch.isfinite(norm))
            if step:
                self.optimizer.step()
                moved = True
            self.optimizer.zero_grad(set_to_none=True)
            log.step(float(norm) if step else None)  # [run] the step's statistics, or a skip
            if step:  # [run] a step that left the policy unsampleable stops the run, in one line
                report.check_finite_policy(self.model, self.passes, rows.rows[idx[0]], args, it)
        return log.means()

    def reference(self, batch: list, watch=None) -> torch.Tensor | None:
        """The KL's reference log-probs of a micro-batch (Eq. 7), by the update's own pass
        (METHOD.md section 5)."""
        if self.args.kl_coef == 0:
            return None
        with torch.no_grad(), self.model.disable_adapter(), timed(watch, "reference"):
            return self.passes.micro_batch_logprobs(self.model, rows=batch,
                                                    temperature=self.args.temperature)  # (b, t)

    def loss(self, logp_new: torch.Tensor, logp_old: torch.Tensor, logp_ref, part: list[int],
             rows: Rows, logp: LogProbs, credit: Credit, counts: dict, log) -> torch.Tensor:
        """One micro-batch's loss: PPO-clip (Eq. 6) + kl_coef * KL (Eq. 7) + the algorithm's own
        terms, each a token-mean over the whole minibatch."""
        args = self.args
        mask = rows_of(rows.response_mask, part, logp_new)  # (b, t) a micro-batch's rows all train
        ahat = rows_of(credit.token_adv, part, logp_new)  # (b, t)
        pg = policy_loss(logp_new, logp_old, ahat, mask, counts["tokens"], args.ppo_clip)  # (Eq. 6)
        loss, terms = pg, {"pg_loss": pg}
        if logp_ref is not None:
            kl = kl_loss(logp_ref, logp_new, mask, counts["tokens"])  # (Eq. 7)
            loss, terms["kl_ref"] = loss + args.kl_coef * kl, kl
        for name, (weight, term) in self.algo.loss_terms(logp_new, logp_old, part, rows, logp,
                                                          counts, args).items():  # baselines.py
            loss, terms[name] = loss + weight * term, term
        log.record(terms, loss, logp_new, logp_old, ahat, mask, counts)  # [run] the statistics
        return loss

    def token_counts(self, rows: Rows, adv: Advantages, idx: list[int]) -> dict[str, int]:
        """A minibatch's token counts over every process: "tokens", its response tokens (the token-
        mean's denominator, section 5); "trained", those the update reads; "hindsight", those of
        trained rows with hindsight (SDAR's)."""
        response = rows.response_mask[idx]  # (m, T)
        trained = response & adv.trained[idx, None]  # (m, T)
        hindsight = trained & rows.has_hindsight[idx, None]  # (m, T)
        masks = {"tokens": response, "trained": trained, "hindsight": hindsight}
        return {name: self.dist.sum(int(m.sum())) for name, m in masks.items()}

    def make_env(self, episodes: int):
        """An env of --env on the run's data, with workers for `episodes` at a time."""
        args = self.args
        return make_env(args.env, data_dir=args.data_dir, max_steps=args.max_steps,
                        workers=resolve_workers(args.env_workers, episodes),
                        timeout=args.env_timeout)

    def close(self) -> None:
        self.env.close()


def train(args: TrainArgs, trainer: Trainer | None = None) -> list[dict]:
    """Run (or resume) training; returns the metrics of the iterations run now. A kill loses at
    most the iterations since the last checkpoint (--save-every)."""
    dist = trainer.dist if trainer else DataParallel()
    with RunFolder(args.output_dir, main=dist.main) as folder:  # [run] one writer: RUN/.lock
        folder.check(resuming=bool(args.resume))  # [run] never overwrite a run
        dist.barrier()  # [distributed] every process has looked before the main one writes
        trainer = trainer or Trainer(args, dist=dist)
        folder.start(asdict(args), trainer.iteration_done, trainer.data)  # [run] config.json
        log, history = report.RunLog(folder, trainer), []  # [run] logs, evaluations, checkpoints
        while trainer.iteration_done < args.iterations:
            line, samples = trainer.iteration()
            it = trainer.iteration_done
            if args.eval_every and it % args.eval_every == 0 and dist.main:
                line.update(log.evaluate())  # held-out games
            log.write(line, samples)  # [run] metrics.jsonl, samples.jsonl, the tracker
            if it % args.save_every == 0 or it == args.iterations:
                log.save()  # a checkpoint
            log.show(line)  # [run] the progress line
            dist.barrier()  # [distributed]
            history.append(line)
        log.close()
        trainer.close()
    return history


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv, __doc__)
    print(describe(args))  # [run] what runs, and where it writes
    train(args)
    report.closing_summary(args.output_dir)  # [run] where the credit went; what to run next


if __name__ == "__main__":
    run(main)
