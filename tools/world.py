"""A controlled world: when does segment credit help, and by how much?

A world small enough to see whole, trained with the project's own credit path. K tasks; an episode is
L decisions, each a choice among A actions; a task has one right action per decision (its plan), and
an episode is won (reward 10) when every *critical* decision is right (the first `--critical` of the
L; the others change nothing). The policy is a table of logits (K, L, A), softmax per decision. Each
iteration draws --groups tasks, plays --group-size episodes of each, and updates the table with
train.py's functions on one row per decision (a segment of one token):
    A_i  = grpo_advantages(rewards, groups)                               (METHOD.md Eq. 1)
    g    = segment_gap(logp_teacher, logp_student, response_mask)         (Eq. 2-3)
    Ahat = token_advantages(A_i, g, response_mask, lam, eps_m, shape)     (Eq. 4-5; RLSD: Eq. 8)
    loss = policy_loss(logp_new, logp_student, Ahat, mask)                (Eq. 6), Adam, --minibatches steps
GiGPO's step advantage (Eq. 11-13) uses the decision's index as the anchor state.

The teacher is a knob. Its gap on a decision is +gap when the action is the plan's and -gap when it is
not, plus Gaussian noise of std sigma, so it tells right from wrong with ROC AUC = Phi(sqrt(2) gap /
sigma); --aucs sets the AUCs and sigma follows. The placebo teacher's gaps are the AUC-0.92 teacher's,
shuffled among the batch's decisions: the same spread, no information (AUC 0.5). The teacher judges
every decision against the plan, critical or not, as a hindsight teacher shown a plan does.

What is measured: the policy's exact success (the mean over tasks of the product, over critical
decisions, of the probability of the plan's action) after each iteration; iterations to reach
--threshold; and, per seed (the same start and draws for every algorithm), SHARPO's iterations over
GRPO's: the speed-up ratio (below 1: faster). A run that never reaches the threshold counts as
--iterations + 1. Seeds give the interval (a bootstrap over seeds of the mean ratio).

`decompose_log_m` splits a batch's log-multiplier variance into the part an episode's steps share (a
rescaling of the episode, mostly following sign(A)) and the part that differs between its steps (the
credit assignment); `--decompose FILES` reads it from train.py's samples.jsonl files.

Run: python -m tools.world --out results/world                      (the full study, a few minutes on 2 cores)
     python -m tools.world --decompose RUN/samples.jsonl [...]       (what log m follows in real runs)
"""
from __future__ import annotations

import errors  # first: a Ctrl-C or kill while the imports below load is one line

errors.quiet_start(__name__)
# isort: split

import json
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Literal

import torch

from advantage import grpo_advantages, policy_loss
from baselines import ALGORITHMS
from flags import BaselineArgs, MethodArgs
from infra.cli import UserError, check_domains, float_in, parse_dataclass, run
from segments import Rows, Step

PLACEBO_AUC = 0.92  # the placebo shuffles this teacher's gaps


def shuffled_gaps(g: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """The same gaps, handed to the batch's decisions by chance: (N, L) -> (N, L)."""
    return g.flatten()[torch.randperm(g.numel(), generator=gen)].reshape(g.shape)


def centred_gaps(g: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Each gap minus its episode's mean: only what differs between an episode's steps. (N, L)."""
    return g - g.mean(1, keepdim=True)


# The world's own teachers of SHARPO beside the algorithms of baselines.ALGORITHMS: name -> (the AUC of
# the teacher whose gaps it takes, None: the AUC asked for; what it does to them)
TEACHERS = {"placebo": (PLACEBO_AUC, shuffled_gaps), "centred": (None, centred_gaps)}


@dataclass
class WorldArgs:
    """Command-line flags of tools/world.py."""

    tasks: int = 16  # tasks (K), each with its own plan
    decisions: int = 6  # decisions per episode (L)
    critical: int = 0  # decisions that decide the outcome (the first ones); 0 = all of them
    actions: int = 4  # actions per decision (A)
    groups: int = 4  # tasks per iteration
    group_size: int = 8  # episodes per task (G)
    iterations: int = 150  # iterations per run
    start: float_in("(0, 1)") = 0.016  # the start policy's success (a warm start): p(plan action) = start^(1/critical), at least 1/A
    lr: float_in("(0, 100]") = 0.05  # Adam learning rate on the logits
    optimizer: Literal["adam", "sgd"] = "adam"  # the optimizer on the logits: Adam (--lr) or plain SGD (--sgd-lr)
    sgd_lr: float_in("(0, 1e4]") = 20.0  # plain SGD's learning rate (GRPO reaches the threshold in about as many iterations)
    minibatches: int = 2  # optimizer steps per iteration (PPO's ratio leaves 1 after the first)
    gap: float_in("(0, 100]") = 0.3  # the teacher's mean |gap| on a decision, nats
    threshold: float_in("(0, 1]") = 0.5  # the success whose reaching is timed
    seeds: int = 12  # seeds per setting
    aucs: str = "0.6,0.76,0.92,1.0"  # teacher AUCs studied (the placebo is AUC 0.5)
    bounds: str = f"{MethodArgs.eps_m}:{MethodArgs.lam},0.5:1.0"  # (eps_m:lam) settings, comma-separated; the first: train.py's
    real_auc: float_in("(0.5, 1]") = 0.588  # the CPU teacher's blame AUC on the learning set (results/credit-learn-cpu)
    slope: float_in("[0, 1]") = 0.0104  # GRPO's held-out greedy success gained per iteration on the learning preset
    budget: int = 8  # the learning preset's iterations
    pair_sd: float_in("(0, 1]") = 0.52  # std of a (seed, game) paired SHARPO - GRPO held-out difference (results/learning-cpu)
    regimes: bool = True  # also sweep episode length, critical decisions and group size
    decompose: str = ""  # samples.jsonl files (comma-separated): print what log m follows in them, and stop
    optimizers: bool = False  # instead of the study: SHARPO/GRPO at AUC 1 under Adam and plain SGD; optimizers.json
    out: str | None = None  # write summary.json and world.png here


# ----------------------------------------------------------------------------- the world
def teacher_sigma(auc: float, gap: float) -> float:
    """The noise std that makes a teacher of mean |gap| `gap` tell right from wrong with ROC AUC `auc`."""
    if auc >= 1.0:
        return 0.0
    if auc <= 0.5:
        raise ValueError("a teacher of AUC 0.5 knows nothing: that is the placebo (its gaps shuffled)")
    return math.sqrt(2.0) * gap / float(torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(auc)))


def run_world(algo: str, auc: float, eps_m: float, lam: float, seed: int, args: WorldArgs) -> list[float]:
    """One training run of `algo` (a name in baselines.ALGORITHMS, or one of TEACHERS) in the world; returns
    the exact success after each iteration (index 0: the start)."""
    K, L, A, G = args.tasks, args.decisions, args.actions, args.group_size
    critical = L if args.critical <= 0 else min(args.critical, L)
    gen = torch.Generator().manual_seed(seed)
    plan = torch.randint(0, A, (K, L), generator=gen)  # (K, L) the right action of each decision
    p0 = max(args.start ** (1 / critical), 1 / A)  # the start's probability of the plan's action, every decision
    logits = torch.zeros(K, L, A)  # (K, L, A) the policy: p(plan action) = p0, the rest uniform
    logits.scatter_(2, plan[..., None], math.log(p0 * (A - 1) / (1 - p0)))
    logits.requires_grad_(True)
    method = ALGORITHMS["sharpo" if algo in TEACHERS else algo]  # its stages 3 and 5, as train.py calls them
    if algo in TEACHERS:
        teacher_auc = TEACHERS[algo][0] or auc
    else:  # without a teacher the gaps go unused, but are drawn all the same
        teacher_auc = auc if method.uses_teacher(SETTINGS) else PLACEBO_AUC
    opt = torch.optim.Adam([logits], lr=args.lr) if args.optimizer == "adam" else torch.optim.SGD([logits], lr=args.sgd_lr)
    curve = [success(logits, plan, critical)]
    for _ in range(args.iterations):
        tasks = torch.randperm(K, generator=gen)[: args.groups].repeat_interleave(G)  # (N,) G episodes per task
        N = len(tasks)
        with torch.no_grad():
            probs = torch.softmax(logits[tasks], -1)  # (N, L, A)
            acts = torch.multinomial(probs.reshape(-1, A), 1, generator=gen).reshape(N, L)  # (N, L)
        right = acts == plan[tasks]  # (N, L)
        won = right[:, :critical].all(1)  # (N,)
        rewards = 10.0 * won.float()  # (N,)
        groups = torch.arange(args.groups).repeat_interleave(G)  # (N,)
        adv = grpo_advantages(rewards, groups)  # (N,) A_i                              (Eq. 1)
        sigma = teacher_sigma(teacher_auc, args.gap)
        g = torch.where(right, args.gap, -args.gap) + sigma * torch.randn(N, L, generator=gen)  # (N, L) the gap
        if algo in TEACHERS:  # the world's own teacher: the gaps changed
            g = TEACHERS[algo][1](g, gen)
        rows = dict(task=tasks.repeat_interleave(L), step=torch.arange(L).repeat(N), act=acts.flatten(),
                    adv=adv.repeat_interleave(L), gap=g.flatten())  # one row per decision (B = N * L)
        mask = torch.ones(N * L, 1, dtype=torch.bool)  # (B, 1) each row's segment: one token
        with torch.no_grad():
            logp_old = torch.log_softmax(logits[rows["task"], rows["step"]], -1).gather(1, rows["act"][:, None])  # (B, 1)
        logp_teacher = logp_old + rows["gap"][:, None]  # (B, 1) a teacher whose gap is g
        token_adv = credit(method, rows, logp_old, logp_teacher, mask, eps_m, lam, L, groups, rewards)
        order = torch.randperm(N * L, generator=gen)
        for m in range(args.minibatches):
            idx = order[m * N * L // args.minibatches : (m + 1) * N * L // args.minibatches]
            logp_new = torch.log_softmax(logits[rows["task"][idx], rows["step"][idx]], -1).gather(1, rows["act"][idx, None])
            loss = policy_loss(logp_new, logp_old[idx], token_adv[idx], mask[idx], int(mask[idx].sum()),
                               MethodArgs.ppo_clip)  # (Eq. 6)
            opt.zero_grad()
            loss.backward()
            opt.step()
        curve.append(success(logits, plan, critical))
    return curve


# The flags an algorithm reads, at train.py's defaults; lam and eps_m are each run's
SETTINGS = SimpleNamespace(**asdict(MethodArgs()), **asdict(BaselineArgs()))


def credit(method, rows, logp_old, logp_teacher, mask, eps_m, lam, L, groups, rewards) -> torch.Tensor:
    """Ahat (B, 1) of an algorithm of baselines.ALGORITHMS, by its own stages 3 and 5 as train.py calls
    them, on one row per decision (its segment: one token). GiGPO's anchor state is the decision's
    index (every episode of a group passes through it), its step reward the outcome at the last."""
    B = len(rows["adv"])
    traj = torch.arange(B) // L  # (B,) each row's episode
    step_rewards = (rows["step"] == L - 1).float() * rewards[traj]  # (B,)
    steps = [Step([], [], [], "", None, float(r), str(k)) for r, k in zip(step_rewards, rows["step"].tolist())]
    batch = Rows(traj, steps, [], [], mask, None, torch.zeros(B, dtype=torch.bool), torch.ones(B, dtype=torch.bool))
    settings = SimpleNamespace(**{**vars(SETTINGS), "lam": lam, "eps_m": eps_m})
    adv = method.advantages(rewards, groups, batch, settings)  # (Eq. 1; GiGPO: Eq. 11-12)
    logp = SimpleNamespace(student=logp_old, teacher=logp_teacher)  # rollout.LogProbs' fields (no model code)
    return method.credit(adv, logp, batch, settings).token_adv  # (Eq. 4-5; 8; 13)


@torch.no_grad()
def success(logits: torch.Tensor, plan: torch.Tensor, critical: int) -> float:
    """The policy's exact success: the mean over tasks of prod over critical decisions of p(plan action)."""
    p = torch.softmax(logits, -1).gather(2, plan[..., None]).squeeze(-1)  # (K, L)
    return float(p[:, :critical].prod(1).mean())


def iterations_to(curve: list[float], threshold: float) -> int:
    """The first iteration whose success reaches `threshold` (len(curve) when none does)."""
    return next((i for i, s in enumerate(curve) if s >= threshold), len(curve))


# ----------------------------------------------------------------------------- statistics
def mean_interval(values: list[float], seed: int = 0, n_boot: int = 2000) -> list[float]:
    """[mean, low, high]: the mean and a 95% bootstrap interval over the values (seeds)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.tensor(values, dtype=torch.float64)
    means = x[torch.randint(0, len(x), (n_boot, len(x)), generator=g)].mean(1)
    return [float(x.mean()), float(means.quantile(0.025)), float(means.quantile(0.975))]


def speed_ratio(algo: str, auc: float, eps_m: float, lam: float, args: WorldArgs, grpo: dict) -> dict:
    """`algo`'s iterations to the threshold over GRPO's, seed by seed (the same start and draws)."""
    curves = [run_world(algo, auc, eps_m, lam, s, args) for s in range(args.seeds)]
    its = [iterations_to(c, args.threshold) for c in curves]
    ratios = [i / grpo["iterations"][s] for s, i in enumerate(its)]
    return {"iterations": its, "ratio": mean_interval(ratios), "curve": mean_curve(curves)}


def mean_curve(curves: list[list[float]]) -> dict:
    x = torch.tensor(curves)  # (seeds, iterations + 1)
    return {"mean": x.mean(0).tolist(), "low": x.quantile(0.1, 0).tolist(), "high": x.quantile(0.9, 0).tolist()}


def power_pairs(delta: float, sd: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """Paired (seed, game) comparisons a two-sided test at `alpha` needs to see a mean difference `delta`
    with `power`, when one pair's difference has std `sd`: ((z_{1-alpha/2} + z_power) * sd / delta)^2."""
    z = torch.distributions.Normal(0.0, 1.0).icdf
    return float(((z(torch.tensor(1 - alpha / 2)) + z(torch.tensor(power))) * sd / abs(delta)) ** 2)


def interpolate(x: float, xs: list[float], ys: list[float]) -> float:
    """ys at x, linear between the nearest xs (sorted); held constant past the ends."""
    if x <= xs[0]:
        return ys[0]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1]


# ----------------------------------------------------------------------------- what log m follows in a real batch
def decompose_log_m(mults: torch.Tensor, traj: torch.Tensor, scored: torch.Tensor | None = None) -> dict:
    """Split the variance of log m over segments in two (the law of total variance, population variances):
    `episode`, the variance of each episode's mean log m (shared by all its steps: a rescaling of the whole
    episode, which mostly follows sign(A)), and `within`, the mean variance of log m inside an episode (what
    differs between the steps of one episode: the credit assignment). total = episode + within.

    mults (B,) each segment's multiplier, traj (B,) its episode, scored (B,) bool the segments to count
    (default all). Returns total, episode, within, within_share (within / total; 0 when total is 0) and segments."""
    keep = torch.ones_like(traj, dtype=torch.bool) if scored is None else scored.bool()
    x, ep = mults[keep].double().log(), traj[keep]  # (n,), (n,)
    if x.numel() == 0:
        return {"total": 0.0, "episode": 0.0, "within": 0.0, "within_share": 0.0, "segments": 0}
    _, idx = torch.unique(ep, return_inverse=True)  # (n,) episode index
    k = int(idx.max()) + 1
    count = torch.zeros(k, dtype=x.dtype).index_add(0, idx, torch.ones_like(x))  # (k,)
    mean = torch.zeros(k, dtype=x.dtype).index_add(0, idx, x) / count  # (k,) each episode's mean log m
    total = float(((x - x.mean()) ** 2).mean())
    within = float(((x - mean[idx]) ** 2).mean())
    episode = float(((mean[idx] - x.mean()) ** 2).mean())
    return {"total": total, "episode": episode, "within": within,
            "within_share": within / total if total > 0 else 0.0, "segments": int(x.numel())}


def decompose_samples(paths: list[str]) -> dict:
    """decompose_log_m over the scored segments of train.py's samples.jsonl files (each record one episode)."""
    mults, traj, positive = [], [], 0
    for path in paths:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as err:
            raise UserError(f"cannot read {path}: {err.strerror or err}") from None
        for line in lines:
            record = json.loads(line)
            ms = [s["multiplier"] for s in record["segments"] if s["multiplier"] is not None]
            if record["advantage"] != 0 and ms:
                positive += record["advantage"] > 0
                mults += ms
                traj += [len(set(traj)) if not traj else max(traj) + 1] * len(ms)
    out = decompose_log_m(torch.tensor(mults), torch.tensor(traj))
    return {**out, "episodes": len(set(traj)), "episodes_with_positive_advantage": positive}


# ----------------------------------------------------------------------------- the study
def study(args: WorldArgs) -> dict:
    aucs = [float(a) for a in args.aucs.split(",") if a]
    bounds = [tuple(float(x) for x in b.split(":")) for b in args.bounds.split(",") if b]
    eps0, lam0 = bounds[0]
    grpo_curves = [run_world("grpo", 0.5, eps0, lam0, s, args) for s in range(args.seeds)]
    grpo = {"iterations": [iterations_to(c, args.threshold) for c in grpo_curves], "curve": mean_curve(grpo_curves)}
    out = {"args": asdict(args), "grpo": grpo, "by_auc": {}, "algos": {}, "regimes": {}}
    for eps, lam in bounds:
        key = f"eps_m {eps}, lam {lam}"
        out["by_auc"][key] = {"0.5": speed_ratio("placebo", PLACEBO_AUC, eps, lam, args, grpo),  # the placebo
                              **{str(a): speed_ratio("sharpo", a, eps, lam, args, grpo) for a in aucs}}
        print(f"  SHARPO/GRPO iterations to {args.threshold}, {key}: " + ", ".join(
            f"AUC {a}: {r['ratio'][0]:.2f} [{r['ratio'][1]:.2f}, {r['ratio'][2]:.2f}]"
            for a, r in out["by_auc"][key].items()) + " (AUC 0.5: the placebo)", flush=True)
    out["algos"]["placebo"] = out["by_auc"][f"eps_m {bounds[-1][0]}, lam {bounds[-1][1]}"]["0.5"]
    for algo in ("stepopsd", "rlsd", "gigpo", "centred"):
        out["algos"][algo] = speed_ratio(algo, PLACEBO_AUC, *bounds[-1], args, grpo)
        r = out["algos"][algo]["ratio"]
        print(f"  {algo} / GRPO (AUC {PLACEBO_AUC}, eps_m {bounds[-1][0]}, lam {bounds[-1][1]}): "
              f"{r[0]:.2f} [{r[1]:.2f}, {r[2]:.2f}]", flush=True)
    out["algos"]["sharpo"] = out["by_auc"][f"eps_m {bounds[-1][0]}, lam {bounds[-1][1]}"].get(str(PLACEBO_AUC))
    default = out["by_auc"][f"eps_m {eps0}, lam {lam0}"]
    xs = sorted(float(a) for a in default)
    predicted = interpolate(args.real_auc, xs, [default[str(a)]["ratio"][0] for a in xs])
    delta = args.slope * args.budget * (1 / predicted - 1)  # held-out success gained by learning 1/ratio faster
    out["real"] = {"auc": args.real_auc, "predicted_ratio": predicted, "success_difference": delta,
                   "pairs_for_80_percent_power": power_pairs(delta, args.pair_sd) if delta else float("inf"),
                   "pairs_per_seed": 32, "a_perfect_teacher": {}}
    for key, by in out["by_auc"].items():  # the most a teacher can give at each bound: AUC 1
        best = max(by, key=float)
        d = args.slope * args.budget * (1 / by[best]["ratio"][0] - 1)
        out["real"]["a_perfect_teacher"][key] = {"ratio": by[best]["ratio"][0], "success_difference": d,
                                                 "pairs_for_80_percent_power": power_pairs(d, args.pair_sd)}
    if args.regimes:
        out["regimes"] = regimes(args, bounds[-1])
    return out


def optimizer_study(args: WorldArgs) -> dict:
    """SHARPO's iterations over GRPO's with a perfect teacher (AUC 1), at each --bounds, under Adam and under
    plain SGD. Adam divides each parameter's step by its own running gradient scale, so it absorbs much of a
    rescaling that SHARPO applies to whole segments; SGD takes the gradient as it comes."""
    bounds = [tuple(float(x) for x in b.split(":")) for b in args.bounds.split(",") if b]
    out = {}
    for optimizer in ("adam", "sgd"):
        a = WorldArgs(**{**asdict(args), "optimizer": optimizer})
        curves = [run_world("grpo", 0.5, *bounds[0], s, a) for s in range(a.seeds)]
        grpo = {"iterations": [iterations_to(c, a.threshold) for c in curves]}
        out[optimizer] = {"lr": a.lr if optimizer == "adam" else a.sgd_lr,
                          "grpo_iterations": statistics.mean(grpo["iterations"]), "ratio": {}}
        for eps, lam in bounds:
            r = speed_ratio("sharpo", 1.0, eps, lam, a, grpo)["ratio"]
            out[optimizer]["ratio"][f"eps_m {eps}, lam {lam}"] = r
            print(f"  {optimizer}: SHARPO/GRPO at AUC 1, eps_m {eps}, lam {lam}: {r[0]:.3f} [{r[1]:.3f}, {r[2]:.3f}] "
                  f"(GRPO: {out[optimizer]['grpo_iterations']:.0f} iterations to {a.threshold})", flush=True)
    return {"args": asdict(args), "by_optimizer": out}


def regimes(args: WorldArgs, bound: tuple) -> dict:
    """SHARPO/GRPO at AUC 0.92 as one thing changes at a time: episode length, critical decisions, group size."""
    changes = {"decisions": [3, 6, 12], "critical": [1, 3, 6], "group_size": [4, 8, 16]}
    out = {}
    for name, values in changes.items():
        for v in values:
            a = WorldArgs(**{**asdict(args), name: v, "regimes": False})
            g = [iterations_to(run_world("grpo", 0.5, *bound, s, a), a.threshold) for s in range(a.seeds)]
            r = speed_ratio("sharpo", PLACEBO_AUC, *bound, a, {"iterations": g})
            out[f"{name}={v}"] = {"ratio": r["ratio"], "grpo_iterations": statistics.mean(g)}
            print(f"  {name} = {v}: SHARPO/GRPO {r['ratio'][0]:.2f} [{r['ratio'][1]:.2f}, {r['ratio'][2]:.2f}], "
                  f"GRPO needs {statistics.mean(g):.0f} iterations", flush=True)
    return out


def picture(result: dict, path: Path) -> None:
    """Learning curves (GRPO, SHARPO at both bounds, the placebo), and SHARPO/GRPO against the teacher's AUC."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6), dpi=90)
    series = [("GRPO", result["grpo"]["curve"], "k")]
    keys = list(result["by_auc"])
    for key, color in zip(keys, ("tab:blue", "tab:green")):
        series.append((f"SHARPO, AUC 0.92, {key}", result["by_auc"][key][str(PLACEBO_AUC)]["curve"], color))
    series.append(("placebo teacher (AUC 0.5)", result["algos"]["placebo"]["curve"], "tab:red"))
    for name, c, color in series:
        x = range(len(c["mean"]))
        left.plot(x, c["mean"], color=color, label=name, lw=1.2)
        left.fill_between(x, c["low"], c["high"], color=color, alpha=0.12)
    left.axhline(result["args"]["threshold"], color="grey", ls=":", lw=0.8)
    left.set(xlabel="iteration", ylabel="success (exact)", title="learning curves (band: 10-90% of seeds)")
    left.legend(fontsize=7)
    for key, color in zip(keys, ("tab:blue", "tab:green")):
        aucs = sorted(result["by_auc"][key], key=float)  # 0.5: the placebo
        r = [result["by_auc"][key][a]["ratio"] for a in aucs]
        xs, ys, lo, hi = [float(a) for a in aucs], [v[0] for v in r], [v[1] for v in r], [v[2] for v in r]
        right.errorbar(xs, ys, yerr=[[y - a for y, a in zip(ys, lo)], [b - y for y, b in zip(ys, hi)]], color=color,
                       marker="o", ms=3, capsize=2, label=key)
    real = result["real"]
    right.axvline(real["auc"], color="tab:orange", ls="--", lw=1)
    right.annotate(f" CPU teacher, AUC {real['auc']:.2f}", (real["auc"], right.get_ylim()[0]), fontsize=7,
                   color="tab:orange", va="bottom")
    right.axhline(1.0, color="grey", ls=":", lw=0.8)
    right.set(xlabel="teacher's AUC (right vs wrong decisions)", ylabel="SHARPO / GRPO iterations to 0.5",
              title="speed-up against teacher quality (95% over seeds)")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def check(args: WorldArgs) -> None:
    problems = check_domains(args, positive=("tasks", "decisions", "actions", "groups", "group_size", "iterations",
                                             "minibatches", "seeds", "budget"), non_negative=("critical",))
    try:
        aucs = [float(a) for a in args.aucs.split(",") if a]
        bounds = [tuple(float(x) for x in b.split(":")) for b in args.bounds.split(",") if b]
    except ValueError:
        problems.append("--aucs takes numbers, --bounds eps_m:lam pairs, each comma-separated")
        aucs, bounds = [], []
    if aucs and not all(0.5 < a <= 1.0 for a in aucs):
        problems.append("--aucs must lie in (0.5, 1] (the placebo is the 0.5 point)")
    if not all(len(b) == 2 and 0 < b[0] < 1 and 0 <= b[1] <= 1 for b in bounds) or not bounds:
        problems.append("--bounds: eps_m:lam pairs with 0 < eps_m < 1 and 0 <= lam <= 1")
    if not 0 < args.start < args.threshold:
        problems.append(f"--start (the start's success) must be in (0, --threshold); got {args.start}")
    if args.groups > args.tasks:
        problems.append(f"--groups {args.groups} is more than the {args.tasks} tasks")
    if problems:
        raise UserError("; ".join(problems))


def main(argv: list[str] | None = None) -> dict:
    args = parse_dataclass(WorldArgs, argv, description=__doc__)
    torch.set_num_threads(1)
    if args.decompose:
        out = decompose_samples([p for p in args.decompose.split(",") if p])
        print(f"log m over {out['segments']} scored segments of {out['episodes']} episodes: variance {out['total']:.5f} "
              f"= {out['episode']:.5f} shared by an episode's steps + {out['within']:.5f} between its steps "
              f"({out['within_share']:.0%} within)")
        return out
    check(args)
    if args.optimizers:
        result = optimizer_study(args)
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "optimizers.json").write_text(json.dumps(result, indent=1))
            print(f"wrote {Path(args.out) / 'optimizers.json'}")
        return result
    print(f"world: {args.tasks} tasks, {args.decisions} decisions ({args.critical or args.decisions} critical), "
          f"{args.actions} actions, {args.groups} x {args.group_size} episodes an iteration, {args.seeds} seeds", flush=True)
    result = study(args)
    real = result["real"]
    print(f"  the CPU teacher (AUC {real['auc']:.3f}): predicted SHARPO/GRPO {real['predicted_ratio']:.3f}; after "
          f"{args.budget} iterations that is {real['success_difference']:+.4f} held-out success; seeing it at 80% power "
          f"takes {real['pairs_for_80_percent_power']:,.0f} (seed, game) pairs")
    for key, p in real["a_perfect_teacher"].items():
        print(f"  a perfect teacher, {key}: ratio {p['ratio']:.3f}, {p['success_difference']:+.4f} held-out success after "
              f"{args.budget} iterations, {p['pairs_for_80_percent_power']:,.0f} pairs for 80% power")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(result, indent=1))
        picture(result, out / "world.png")
        print(f"wrote {out / 'summary.json'} and {out / 'world.png'}")
    return result


if __name__ == "__main__":
    run(main)
