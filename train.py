"""Train: one loop on one GPU (or CPU) that turns episodes into SHARPO updates of a LoRA policy.

Each iteration (SHARPO.md; the numbers are the stages below):
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
advantage plus the gated self-distillation term in the loss).

Deviations from the paper: see advantage.py; the teacher is the policy itself with the
hindsight block in its first user message, and rows without hindsight use multiplier 1.

Run: python train.py --env alfworld            (the CPU demo preset when no GPU is present)
"""
from __future__ import annotations

import json
import random
import resource
import shutil
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from advantage import grpo_advantages, policy_loss, segment_multipliers, sharpo_token_advantages
from envs import history_length
from segments import (
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

ALGOS = ("sharpo", "grpo", "rlsd", "stepopsd", "sdar")


@dataclass
class TrainArgs:
    """Command-line flags of train.py (defaults: the GPU setting; --preset cpu-demo shrinks them)."""

    env: str = "alfworld"  # environment: alfworld | webshop
    algo: str = "sharpo"  # sharpo | grpo | rlsd | stepopsd | sdar
    preset: str = "auto"  # auto (cpu-demo without a GPU, else gpu) | gpu | cpu-demo | none
    model: str | None = None  # HF id or local path, "smollm2" (embedded) or "tiny"; default per device
    load_in_4bit: bool | None = None  # 4-bit nf4 weights; default: on for HF models on CUDA
    lora_r: int = 64  # LoRA rank (verl-agent: 64)
    lora_alpha: int = 64  # LoRA alpha (verl-agent: 64)
    init_adapter: str | None = None  # a LoRA adapter merged into the base first (warmstart.py output)
    data_dir: str | None = None  # env data folder; default: $ALFWORLD_DATA / $WEBSHOP_DATA, else the shipped data
    split: str = "train"  # split the training tasks come from
    max_plan_len: int = 0  # keep only tasks whose expert plan has at most this many steps (0 = all)
    iterations: int = 100  # training iterations (one rollout batch each)
    groups: int = 16  # tasks per iteration
    group_size: int = 8  # rollouts per task (G)
    max_steps: int = 0  # env steps per episode; 0 = the env's default (ALFWorld 50, WebShop 15)
    max_new_tokens: int = 256  # response length limit per turn
    min_new_tokens: int = 0  # force at least this many new tokens per turn (benchmarks only)
    history: str = "2"  # observation/action pairs in the prompt: an integer or "all"
    temperature: float = 1.0  # rollout sampling temperature (log-probs use the same)
    hindsight: str = "sibling"  # teacher's hindsight: sibling (a successful group mate) | expert
    lam: float = 0.5  # mixing weight of the multiplier: Ahat = A * ((1 - lam) + lam * m)
    mult_eps: float = 0.2  # multiplier bound eps_m: m in [1 - eps_m, 1 + eps_m]
    gap_tokens: str = "all"  # tokens averaged into the segment gap: all | action (inside <action>)
    ppo_clip: float = 0.2  # PPO ratio clip
    kl_coef: float = 0.01  # k3 KL to the reference (adapter off); 0 skips the reference pass
    sdar_coef: float = 0.01  # --algo sdar: weight of the gated self-distillation term
    sdar_beta: float = 5.0  # --algo sdar: gate sharpness, sigmoid(beta * delta)
    lr: float = 3e-6  # AdamW learning rate (verl-agent LoRA: 3e-6)
    weight_decay: float = 0.0  # AdamW weight decay
    grad_clip: float = 1.0  # max gradient norm
    minibatches: int = 2  # optimizer steps per rollout batch and epoch
    ppo_epochs: int = 1  # passes over the rollout batch
    micro_batch_rows: int = 4  # rows per forward/backward (gradients accumulate over them)
    gradient_checkpointing: bool | None = None  # recompute activations in backward; default: on for CUDA
    eval_every: int = 10  # greedy evaluation every N iterations (0 = never)
    eval_split: str | None = None  # evaluation split; default: the env's (ALFWorld: valid_unseen)
    eval_games: int = 32  # games per evaluation
    save_every: int = 1  # checkpoint every N iterations
    samples_per_iter: int = 2  # sample trajectories written to samples.jsonl per iteration
    output_dir: str | None = None  # where metrics, samples and checkpoints go; default runs/<env>-<algo>[-cpu-demo]
    resume: str | None = None  # a run folder (or its checkpoint) to continue from
    seed: int = 0  # seed for task sampling, generation and LoRA init


WARMSTART = Path(__file__).resolve().parent / "data" / "warmstart" / "smollm2-alfworld"
PRESETS = {
    "gpu": {},
    "cpu-demo": dict(  # minutes on 2 CPU cores with the embedded SmolLM2-135M; still exercises SHARPO
        model="smollm2", lora_r=8, lora_alpha=16, lr=1e-4, kl_coef=0.0, iterations=2, groups=2, group_size=4,
        max_new_tokens=64, hindsight="expert", minibatches=2, micro_batch_rows=4, eval_every=2, eval_games=2,
    ),
    "none": {},
}
CPU_DEMO_PER_ENV = {  # the shipped warm start is ALFWorld's; short games keep episodes to 4 steps
    "alfworld": dict(init_adapter=str(WARMSTART), max_plan_len=4, max_steps=4),
    "webshop": dict(max_steps=6),
}


# ----------------------------------------------------------------------------- config
def parse_args(argv: list[str] | None = None) -> TrainArgs:
    """Flags over the preset's defaults over the dataclass's defaults."""
    from cli import build_parser

    argv = sys.argv[1:] if argv is None else argv
    known = build_parser(TrainArgs).parse_known_args(argv)[0]
    pre = known.preset
    if pre == "auto":
        pre = "gpu" if torch.cuda.is_available() else "cpu-demo"
    if pre not in PRESETS:
        raise SystemExit(f"--preset must be auto, {', '.join(PRESETS)}; got {pre!r}")
    parser = build_parser(TrainArgs, __doc__)
    parser.set_defaults(**PRESETS[pre], **(CPU_DEMO_PER_ENV.get(known.env, {}) if pre == "cpu-demo" else {}))
    args = TrainArgs(**vars(parser.parse_args(argv)))
    args.preset = pre
    if args.output_dir is None:
        args.output_dir = f"runs/{args.env}-{args.algo}" + ("-cpu-demo" if pre == "cpu-demo" else "")
    check_args(args)
    return args


def check_args(args: TrainArgs) -> None:
    """Reject bad settings early, saying what to do."""
    problems = []
    if args.algo not in ALGOS:
        problems.append(f"--algo must be one of {', '.join(ALGOS)}")
    if args.hindsight not in ("sibling", "expert"):
        problems.append("--hindsight must be sibling or expert")
    if args.gap_tokens not in ("all", "action"):
        problems.append("--gap-tokens must be all or action")
    if not 0 <= args.lam <= 1:
        problems.append("--lam must be in [0, 1]")
    if not 0 < args.mult_eps < 1:
        problems.append("--mult-eps must be in (0, 1)")
    try:
        history_length(args.history)
    except ValueError as err:
        problems.append(str(err))
    if args.temperature <= 0:
        problems.append("--temperature must be > 0 for training (sampling from the policy)")
    for name in ("iterations", "groups", "group_size", "max_new_tokens", "minibatches",
                 "ppo_epochs", "micro_batch_rows", "save_every"):
        if getattr(args, name) < 1:
            problems.append(f"--{name.replace('_', '-')} must be >= 1")
    if problems:
        raise SystemExit("error: " + "; ".join(problems))


def algo_settings(args: TrainArgs) -> dict:
    """How --algo maps onto the shared functions (advantage.py)."""
    return {
        "sharpo": dict(lam=args.lam, granularity="segment", shape="exp", sdar_coef=0.0),
        "grpo": dict(lam=0.0, granularity="segment", shape="exp", sdar_coef=0.0),
        "rlsd": dict(lam=args.lam, granularity="token", shape="exp", sdar_coef=0.0),
        "stepopsd": dict(lam=args.lam, granularity="segment", shape="sigmoid", sdar_coef=0.0),
        "sdar": dict(lam=0.0, granularity="segment", shape="exp", sdar_coef=args.sdar_coef),
    }[args.algo]


# ----------------------------------------------------------------------------- batched log-probs
def rows_logprobs(model, rows: list[Row], pad_id: int, micro_batch_rows: int, temperature: float, T: int) -> torch.Tensor:
    """No-grad response log-probs of many rows, micro-batch by micro-batch: (B, T)."""
    from rollout import response_logprobs

    device = model.get_input_embeddings().weight.device
    out = torch.zeros(len(rows), T)
    with torch.no_grad():
        for s in range(0, len(rows), micro_batch_rows):
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


class Trainer:
    """Holds the model, optimizer, envs and run state; `iteration()` is the numbered loop body."""

    def __init__(self, args: TrainArgs, model=None, tokenizer=None, env=None):
        from envs import make_env
        from rollout import load_policy

        self.args = args
        self.out = Path(args.output_dir)
        self.rng = random.Random(args.seed)  # task sampling
        torch.manual_seed(args.seed)
        cuda = torch.cuda.is_available()
        ckpt = find_checkpoint(args.resume) if args.resume else None
        if model is None:
            grad_ckpt = cuda if args.gradient_checkpointing is None else args.gradient_checkpointing
            model, tokenizer = load_policy(
                args.model, load_in_4bit=args.load_in_4bit, lora_r=args.lora_r, lora_alpha=args.lora_alpha,
                adapter=ckpt / "adapter" if ckpt else None, init_adapter=args.init_adapter,
                gradient_checkpointing=grad_ckpt, seed=args.seed,
            )
        self.model, self.tokenizer = model, tokenizer
        self.pad_id = tokenizer.pad_token_id
        self.history_len = history_length(args.history)
        self.env = env or make_env(args.env, data_dir=args.data_dir, max_steps=args.max_steps)
        self.eval_env = None
        self.tasks = self._training_tasks()
        self.params = [p for p in model.parameters() if p.requires_grad]  # the LoRA weights
        self.optimizer = torch.optim.AdamW(self.params, lr=args.lr, weight_decay=args.weight_decay)
        self.iteration_done = 0
        if ckpt:
            self._load(ckpt)

    def _training_tasks(self) -> list[str]:
        tasks = self.env.tasks(self.args.split)
        if self.args.max_plan_len > 0:
            tasks = [t for t in tasks if len(self.env.expert_plan(t)) <= self.args.max_plan_len]
            if not tasks:
                raise SystemExit(f"error: no {self.args.split} task has an expert plan of <= {self.args.max_plan_len} steps")
        return tasks

    # -- the loop body
    def iteration(self) -> tuple[dict, list[dict]]:
        """One iteration, stage by stage; returns (metrics line, sample trajectories)."""
        it, t = self.iteration_done + 1, {}
        clock = time.perf_counter()
        trajs, policy = self.rollout(it)  # 1. rollout
        t["rollout"], clock = time.perf_counter() - clock, time.perf_counter()
        batch = self.make_rows(trajs)  # 2. segments
        t["segments"], clock = time.perf_counter() - clock, time.perf_counter()
        self.score(batch)  # 3. teacher
        t["teacher"] = time.perf_counter() - clock
        self.advantages(batch)  # 4. advantage
        clock = time.perf_counter()
        update = self.update(batch)  # 5. update
        t["update"] = time.perf_counter() - clock
        self.iteration_done = it  # 6. log (the caller writes it and checkpoints)
        metrics = {"iteration": it, **rollout_metrics(trajs, batch.group_ids)}
        if self.needs_teacher:
            metrics.update(multiplier_metrics(batch.gaps, batch.mults, batch.has_hindsight, batch.adv_row, self.args.mult_eps))
        metrics.update(update)
        metrics["rows"] = len(batch.rows)
        metrics["tokens_generated"] = policy.tokens_generated
        metrics["tokens_per_s_generate"] = policy.tokens_generated / max(t["rollout"], 1e-9)
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
        chosen = [self.rng.choice(self.tasks) for _ in range(args.groups)]
        task_ids = [task for task in chosen for _ in range(args.group_size)]
        group_ids = [g for g in range(args.groups) for _ in range(args.group_size)]
        policy = ModelPolicy(self.model, self.tokenizer, args.max_new_tokens, args.temperature, args.min_new_tokens)
        trajs = play_episodes(self.env, task_ids, policy, self.history_len, group_ids, desc=f"iter {it} rollout")
        return trajs, policy

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
        """SHARPO.md section 2: sibling (a successful group mate's actions) or the env expert's plan."""
        if self.args.hindsight == "sibling":
            for traj, text in zip(trajs, sibling_hindsight(trajs)):
                traj.hindsight = text
        else:
            for traj in trajs:
                traj.hindsight = format_plan("The expert's plan for this task, from the start:", self.env.expert_plan(traj.task_id))

    # 3. teacher: student (before the update), teacher (hindsight rows) and reference log-probs
    def score(self, batch: "RowBatch") -> None:
        args, mb, T = self.args, self.args.micro_batch_rows, batch.segment_ids.shape[1]
        self.model.eval()
        batch.logp_old = rows_logprobs(self.model, batch.rows, self.pad_id, mb, args.temperature, T)  # (B, T)
        batch.logp_teacher = batch.logp_old.clone()  # (B, T) rows without hindsight: teacher = student, m = 1
        if batch.teacher_rows and self.needs_teacher:
            batch.logp_teacher[batch.has_hindsight] = rows_logprobs(
                self.model, batch.teacher_rows, self.pad_id, mb, args.temperature, T)
        if args.kl_coef > 0:
            with self.model.disable_adapter():  # the reference model: base weights, no second copy
                batch.logp_ref = rows_logprobs(self.model, batch.rows, self.pad_id, mb, args.temperature, T)  # (B, T)

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
        order_rng = torch.Generator().manual_seed(args.seed * 100003 + self.iteration_done)
        bar = tqdm(total=args.ppo_epochs * args.minibatches, desc=f"iter {self.iteration_done + 1} update", leave=False)
        for _ in range(args.ppo_epochs):
            perm = torch.randperm(B, generator=order_rng).tolist()
            for m in range(args.minibatches):
                idx = perm[m * B // args.minibatches : (m + 1) * B // args.minibatches]
                if not idx:
                    continue
                n_tokens = int(trained[idx].sum())  # the minibatch's trained tokens: the token-mean denominator
                n_sdar = int(sdar_mask[idx].sum())  # the SDAR term's own denominator
                self.optimizer.zero_grad(set_to_none=True)
                finite, mb_stats = True, defaultdict(float)
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
                if finite:
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
            self.eval_env = make_env(args.env, data_dir=args.data_dir, max_steps=args.max_steps)
        split = args.eval_split or self.eval_env.default_eval_split
        games = pick_games(self.eval_env, split, args.eval_games)
        policy = ModelPolicy(self.model, self.tokenizer, args.max_new_tokens, temperature=0.0)
        with torch.random.fork_rng(devices=[]):  # evaluation leaves the training RNG where it was
            metrics, _ = evaluate(self.eval_env, policy, games, self.history_len, batch_size=max(len(games), 1), desc="eval")
        return {f"eval/{k}": v for k, v in metrics.items() if isinstance(v, (int, float))}

    # -- checkpoints
    def save(self) -> Path:
        """Adapter, optimizer, RNG states, iteration and config, written to a temp folder and
        renamed into place, so a kill mid-save leaves the previous checkpoint intact."""
        final, tmp, old = self.out / "checkpoint", self.out / "checkpoint.tmp", self.out / "checkpoint.old"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        from rollout import save_adapter

        save_adapter(self.model, tmp / "adapter")
        torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
        rng = {"torch": torch.get_rng_state(), "python": random.getstate(), "tasks": self.rng.getstate()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        torch.save(rng, tmp / "rng.pt")
        (tmp / "state.json").write_text(json.dumps({"iteration": self.iteration_done}))
        (tmp / "config.json").write_text(json.dumps(asdict(self.args), indent=1))
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
        return final

    def _load(self, ckpt: Path) -> None:
        """Restore optimizer, RNG states and iteration (the adapter was loaded with the model)."""
        self.optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", weights_only=False))
        rng = torch.load(ckpt / "rng.pt", weights_only=False)
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        self.rng.setstate(rng["tasks"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        self.iteration_done = json.loads((ckpt / "state.json").read_text())["iteration"]

    def close(self) -> None:
        self.env.close()
        if self.eval_env is not None:
            self.eval_env.close()


def find_checkpoint(path: str) -> Path:
    """--resume takes a run folder or its checkpoint folder."""
    p = Path(path)
    for candidate in (p, p / "checkpoint"):
        if (candidate / "adapter" / "adapter_config.json").exists() and (candidate / "state.json").exists():
            return candidate
    raise SystemExit(f"error: no checkpoint in {p} (expected {p / 'checkpoint'}/adapter and state.json)")


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


def multiplier_metrics(gaps, mults, has_hindsight, adv_row, eps) -> dict:
    """Multiplier mean, spread (std) and share at a clip bound, over segments with hindsight
    and a non-zero advantage (elsewhere m = 1 by construction); gap mean and |gap| mean."""
    sel = has_hindsight & (adv_row != 0)  # (B,)
    out = {"hindsight_share": float(has_hindsight.float().mean()), "segments_scored": int(sel.sum())}
    if sel.any():
        m, g = mults[sel], gaps[has_hindsight]
        at_bound = ((m <= 1 - eps + 1e-6) | (m >= 1 + eps - 1e-6)).float()
        out.update({"mult_mean": float(m.mean()), "mult_std": float(m.std()) if m.numel() > 1 else 0.0,
                    "mult_at_bound": float(at_bound.mean()), "gap_mean": float(g.mean()), "gap_abs_mean": float(g.abs().mean())})
    return out


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
    """Run (or resume) training; returns the metrics of the iterations run now."""
    out = Path(args.output_dir)
    if not args.resume and (out / "checkpoint").exists():
        raise SystemExit(f"error: {out} already holds a run; pass --resume {out} to continue it, or another --output-dir")
    trainer = trainer or Trainer(args)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(asdict(args), indent=1))
    metrics_path, samples_path = out / "metrics.jsonl", out / "samples.jsonl"
    keep_logged_up_to(metrics_path, trainer.iteration_done)  # a resumed run redoes what came after its checkpoint
    keep_logged_up_to(samples_path, trainer.iteration_done)
    history = []
    while trainer.iteration_done < args.iterations:
        metrics, samples = trainer.iteration()
        it = trainer.iteration_done
        if args.eval_every and it % args.eval_every == 0:
            metrics.update(trainer.evaluate())
        with metrics_path.open("a") as f:
            f.write(json.dumps(metrics) + "\n")
        with samples_path.open("a") as f:
            for record in samples:
                f.write(json.dumps(record) + "\n")
        if it % args.save_every == 0 or it == args.iterations:
            trainer.save()
        print(progress_line(metrics), flush=True)
        history.append(metrics)
    trainer.close()
    return history


def keep_logged_up_to(path: Path, iteration: int) -> None:
    if path.exists():
        lines = [line for line in path.read_text().splitlines() if line and json.loads(line)["iteration"] <= iteration]
        path.write_text("".join(line + "\n" for line in lines))


def progress_line(m: dict) -> str:
    parts = [f"iter {m['iteration']}", f"success {m['success']:.2f}", f"reward {m['mean_reward']:+.2f}",
             f"invalid {m['invalid_rate']:.2f}", f"spread {m['groups_with_spread']:.2f}"]
    if "mult_mean" in m:
        parts.append(f"mult {m['mult_mean']:.3f}±{m['mult_std']:.3f} bound {m['mult_at_bound']:.2f}")
    if "update/loss" in m:
        parts.append(f"loss {m['update/loss']:+.4f}")
    if "eval/success" in m:
        parts.append(f"eval {m['eval/success']:.2f}")
    parts.append(f"{sum(v for k, v in m.items() if k.startswith('seconds/')):.0f}s")
    return " | ".join(parts)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not torch.cuda.is_available() and args.preset == "cpu-demo":
        print("no GPU found: using the cpu-demo preset (a few short episodes on the shipped games); "
              "pass --preset gpu on a GPU machine for the full setting")
    if args.resume:
        saved = json.loads((find_checkpoint(args.resume) / "config.json").read_text())
        args.model = args.model or saved.get("model")
    if args.model is None:
        from rollout import default_model_name

        args.model = default_model_name()
    print(f"training {args.algo} on {args.env}: {args.iterations} iterations x {args.groups} tasks x {args.group_size} rollouts -> {args.output_dir}")
    train(args)
    print(f"done: metrics in {args.output_dir}/metrics.jsonl, checkpoint in {args.output_dir}/checkpoint "
          f"(evaluate with: python eval.py --policy model --checkpoint {args.output_dir}/checkpoint)")


if __name__ == "__main__":
    main()
