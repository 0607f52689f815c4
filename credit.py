"""Credit: does the segment multiplier land on the steps that made or broke an episode?

Plays groups of G episodes with a policy (the training settings), scores every step with the
hindsight teacher, and compares each method's per-step weight with labels from the env's
expert, which knows the right action at every state:
  - a step of a failed trajectory (A < 0) is a *mistake* when its answer was invalid or its
    action differs from the expert's action at the state it acted from; *blame* = the weight
    its tokens get relative to the group's uniform share:
        sharpo, stepopsd: the segment multiplier m;  rlsd: the mean of its per-token m over the
        segment (over the gap tokens);  gigpo: Ahat / A_i = 1 + omega * A_step / A_i;  grpo: 1
  - a step of a successful trajectory (A > 0) *agrees* when it is valid and equals the expert's
    action; *credit* = the same weight.
    (WebShop: any search agrees with an expert search; the query text is not judged.)
  - ROC AUC of blame vs mistake and of credit vs agreement, per method and per gap-token set
    (all response tokens, or only those inside <action>), with a 95% bootstrap interval over
    trajectories (steps of one trajectory are resampled together), the number of labelled steps
    and the share of segments at the multiplier bound. 0.5 = no better than chance; GRPO's
    weight is constant, so its AUC is 0.5 by construction: the reference line.
Only steps of trajectories that have hindsight and A != 0 are labelled (elsewhere every
teacher method gives 1). Output in --out: credit.json, roc.png and the table on stdout.

Run: python credit.py --env alfworld        (CPU: the embedded SmolLM2 with the warm start)
     python credit.py --env alfworld --model Qwen/Qwen2.5-7B-Instruct --data-dir DIR --max-plan-len 0 --groups 16 --group-size 8 --max-steps 50 --max-new-tokens 256
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from advantage import gigpo_step_advantages, segment_multipliers, token_multipliers
from checkpoint import json_safe
from cli import UserError
from segments import Trajectory, action_token_mask

METHODS = ("sharpo", "stepopsd", "rlsd", "gigpo", "grpo")


@dataclass
class CreditArgs:
    """Command-line flags of credit.py."""

    env: Literal["alfworld", "webshop"] = "alfworld"  # environment
    model: str | None = None  # HF id or path, "smollm2" or "tiny"; default: smollm2 without a GPU, else Qwen2.5-7B
    init_adapter: str | None = None  # warm start merged first; default: the shipped one for smollm2 on alfworld
    checkpoint: str | None = None  # score with a train.py run's policy instead (a run folder or checkpoint)
    data_dir: str | None = None  # env data folder; default: the shipped data
    env_workers: int = 0  # ALFWorld: processes the episodes run in; 0 = CPU cores, capped by the batch; 1 = in-process
    split: str = "train"  # tasks the episodes come from
    max_plan_len: int = 4  # only tasks whose expert plan has at most this many steps (0 = all)
    groups: int = 8  # tasks (groups) to play
    group_size: int = 4  # episodes per task (G)
    max_steps: int = 4  # env steps per episode (0 = the env's default)
    max_new_tokens: int = 64  # response length limit per turn
    history: str = "2"  # observation/action pairs in the prompt
    hindsight: Literal["sibling", "expert"] = "expert"  # the teacher's hindsight
    mult_eps: float = 0.2  # multiplier bound eps_m
    gigpo_gamma: float = 0.95  # GiGPO's discount (for its weight)
    gigpo_omega: float = 1.0  # GiGPO's step-advantage weight
    bootstrap: int = 1000  # bootstrap resamples for the intervals
    seed: int = 0  # tasks, sampling, bootstrap
    out: str | None = None  # output folder; default runs/credit-<env>


# ----------------------------------------------------------------------------- labels and AUC
def agrees_with_expert(action: str | None, expert: str | None) -> bool:
    """A valid action equal to the expert's (case-insensitive); a search agrees with a search."""
    if action is None or expert is None:
        return False
    a, e = action.lower().strip(), expert.lower().strip()
    return a == e or (a.startswith("search[") and e.startswith("search["))


def step_labels(trajs: list[Trajectory]) -> list[list[bool]]:
    """Per trajectory, per step: True = the step agrees with the expert (else a mistake)."""
    return [[agrees_with_expert(s.action, s.expert_action) for s in t.steps] for t in trajs]


def roc_auc(scores, labels) -> float:
    """P(score of a positive > score of a negative), ties counting half (Mann-Whitney U / n_pos n_neg).
    nan when one class is empty."""
    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):  # average ranks over ties
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def roc_curve(scores, labels) -> tuple[list[float], list[float]]:
    """(false positive rates, true positive rates) at every threshold, from (0, 0) to (1, 1)."""
    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    fpr, tpr = [0.0], [0.0]
    n_pos, n_neg = max(int(labels.sum()), 1), max(int((~labels).sum()), 1)
    for threshold in sorted(set(scores.tolist()), reverse=True):
        above = scores >= threshold
        fpr.append(float((above & ~labels).sum() / n_neg))
        tpr.append(float((above & labels).sum() / n_pos))
    return fpr, tpr


def bootstrap_auc(scores, labels, traj_of, n: int, seed: int) -> tuple[float, float]:
    """95% percentile interval of the AUC, resampling whole trajectories with replacement."""
    scores, labels, traj_of = np.asarray(scores, float), np.asarray(labels, bool), np.asarray(traj_of)
    trajs = np.unique(traj_of)
    rows_of = {t: np.flatnonzero(traj_of == t) for t in trajs}
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(n):
        rows = np.concatenate([rows_of[t] for t in rng.choice(trajs, size=len(trajs), replace=True)])
        auc = roc_auc(scores[rows], labels[rows])
        if not np.isnan(auc):
            values.append(auc)
    if not values:
        return float("nan"), float("nan")
    return float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))


# ----------------------------------------------------------------------------- weights
def method_weights(method: str, adv_row, logp_teacher, logp_student, segment_ids, gap_mask, eps: float,
                   step_adv=None, omega: float = 1.0) -> torch.Tensor:
    """The weight each row's segment gets relative to the group's uniform share: (B,)."""
    if method in ("sharpo", "stepopsd"):
        shape = "exp" if method == "sharpo" else "sigmoid"
        return segment_multipliers(adv_row, logp_teacher, logp_student, segment_ids, eps, shape, gap_mask)[1][:, 0]
    if method == "rlsd":
        m = token_multipliers(adv_row, logp_teacher, logp_student, segment_ids, eps, "token", "exp")  # (B, T)
        counted = (segment_ids >= 0) if gap_mask is None else (gap_mask & (segment_ids >= 0))  # (B, T)
        return (m * counted).sum(1) / counted.sum(1).clamp(min=1)  # (B,) mean over the counted tokens
    if method == "gigpo":
        safe = torch.where(adv_row == 0, torch.ones_like(adv_row), adv_row)
        return 1.0 + omega * step_adv / safe  # (B,) Ahat / A_i
    if method == "grpo":
        return torch.ones_like(adv_row)
    raise ValueError(f"unknown method {method!r}")


def score_steps(trainer, trajs: list[Trajectory], args: CreditArgs) -> dict:
    """Every step's labels and every method's weight (one row per step, in trajectory order):
    traj (B,) trajectory index; adv (B,) A_i; agree (B,) the expert label; scored (B,) has
    hindsight and A != 0; weights {"<method>/<all|action>": (B,) list}."""
    batch = trainer.make_rows(trajs)
    trainer.score(batch)
    trainer.advantages(batch)  # A_i of each row, as training computes it
    steps, adv_row = batch.steps, batch.adv_row  # (B,)
    rows_traj = torch.tensor([i for i, _ in steps])  # (B,)
    step_adv, _ = gigpo_step_advantages(torch.tensor([s.reward for _, s in steps]), rows_traj,
                                        [trajs[i].group for i, _ in steps], [s.anchor for _, s in steps], args.gigpo_gamma)
    T = batch.segment_ids.shape[1]
    action_mask = torch.zeros(len(batch.rows), T, dtype=torch.bool)  # (B, T) tokens inside <action>
    for b, r in enumerate(batch.rows):
        action_mask[b, : len(r.response_ids)] = torch.tensor(action_token_mask(trainer.tokenizer, r.response_ids))
    weights = {}
    for gap_tokens, mask in (("all", None), ("action", action_mask)):
        for method in METHODS:
            weights[f"{method}/{gap_tokens}"] = method_weights(
                method, adv_row, batch.logp_teacher, batch.logp_old, batch.segment_ids, mask, args.mult_eps,
                step_adv, args.gigpo_omega).tolist()
    return {"traj": rows_traj.tolist(), "adv": adv_row.tolist(),
            "agree": [a for labels in step_labels(trajs) for a in labels],
            "scored": (batch.has_hindsight & (adv_row != 0)).tolist(), "weights": weights}


def auc_table(scored: dict, args: CreditArgs) -> tuple[dict, dict]:
    """Per method and gap-token set: blame AUC on failed trajectories, credit AUC on won ones
    (with bootstrap intervals and step counts), the share at the bound; and the ROC curves."""
    sel = {"blame": [s and a < 0 for s, a in zip(scored["scored"], scored["adv"])],
           "credit": [s and a > 0 for s, a in zip(scored["scored"], scored["adv"])]}
    label = {"blame": [not a for a in scored["agree"]], "credit": scored["agree"]}
    table, curves = {}, {}
    for key, w in scored["weights"].items():
        row = {}
        for part in ("blame", "credit"):
            idx = [b for b in range(len(w)) if sel[part][b]]
            scores, labels = [w[b] for b in idx], [label[part][b] for b in idx]
            low, high = bootstrap_auc(scores, labels, [scored["traj"][b] for b in idx], args.bootstrap, args.seed)
            row[part] = {"auc": roc_auc(scores, labels), "low": low, "high": high, "steps": len(idx),
                         "positives": int(sum(labels))}
            curves[f"{key}/{part}"] = roc_curve(scores, labels)
        if key.split("/")[0] in ("sharpo", "stepopsd", "rlsd"):
            chosen = [w[b] for b in range(len(w)) if scored["scored"][b]]
            row["at_bound"] = float(np.mean([abs(x - 1) >= args.mult_eps - 1e-6 for x in chosen])) if chosen else None
        table[key] = row
    return table, curves


def measure(trainer, trajs: list[Trajectory], args: CreditArgs) -> tuple[dict, dict]:
    """AUC table and ROC curves for every method and gap-token set, from played trajectories."""
    return auc_table(score_steps(trainer, trajs, args), args)


def print_table(table: dict, info: dict) -> None:
    print(f"\ncredit localization: {info['trajectories']} trajectories ({info['won']} won), {info['labelled_steps']} "
          f"labelled steps, hindsight {info['hindsight']}, model {info['model']}")
    print(f"  {'method / gap tokens':22s} {'blame AUC [95% CI]':>26s} {'steps':>6s} {'credit AUC [95% CI]':>26s} "
          f"{'steps':>6s} {'at bound':>9s}")

    def cell(x):
        return f"{x['auc']:.3f} [{x['low']:.3f}, {x['high']:.3f}]" if x["auc"] == x["auc"] else "n/a (one class empty)"

    for key, row in table.items():
        bound = "" if row.get("at_bound") is None else f"{row['at_bound']:.2f}"
        print(f"  {key:22s} {cell(row['blame']):>26s} {row['blame']['steps']:6d} {cell(row['credit']):>26s} "
              f"{row['credit']['steps']:6d} {bound:>9s}")
    print("  (0.5 = chance; grpo gives every step the same weight, so 0.5 is its value by construction)")


def roc_png(curves: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4))
    for ax, part, title in ((axes[0], "blame", "failed trajectories: blame vs mistake"),
                            (axes[1], "credit", "won trajectories: credit vs agreement")):
        for c, method in enumerate(METHODS):
            for gap_tokens, style in (("all", "-"), ("action", ":")):
                fpr, tpr = curves[f"{method}/{gap_tokens}/{part}"]
                ax.plot(fpr, tpr, style, color=f"C{c}", label=f"{method} ({gap_tokens})")
        ax.plot([0, 1], [0, 1], color="grey", lw=0.8)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
    axes[1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ----------------------------------------------------------------------------- main
def build_trainer(args: CreditArgs):
    """A train.Trainer with the settings of a training run, used for its rollout and scoring stages."""
    import train

    flags = dict(env=args.env, preset="none", algo="sharpo", split=args.split, env_workers=args.env_workers, max_plan_len=args.max_plan_len,
                 groups=args.groups, group_size=args.group_size, max_steps=args.max_steps,
                 max_new_tokens=args.max_new_tokens, history=args.history, hindsight=args.hindsight,
                 mult_eps=args.mult_eps, kl_coef=0.0, eval_every=0, seed=args.seed, output_dir="runs/credit-unused")
    if args.checkpoint:
        from checkpoint import find_checkpoint, load_checkpoint_policy, read_config

        ckpt = find_checkpoint(args.checkpoint)
        flags["model"] = read_config(ckpt)["model"]
        model, tokenizer = load_checkpoint_policy(ckpt)
    else:
        model_name = args.model or ("smollm2" if not torch.cuda.is_available() else None)
        flags["model"] = model_name
        init = args.init_adapter
        if init is None and model_name == "smollm2" and args.env == "alfworld":
            init = str(train.WARMSTART)
        flags["init_adapter"] = init if init else "none"
        model, tokenizer = None, None
    targs = train.parse_args([f"--{k.replace('_', '-')}={v}" for k, v in flags.items() if v is not None])
    return train.Trainer(targs, model=model, tokenizer=tokenizer)


def main(argv: list[str] | None = None) -> dict:
    from cli import check_domains, parse_dataclass

    args = parse_dataclass(CreditArgs, argv, description=__doc__)
    problems = check_domains(args, positive=("groups", "group_size", "max_new_tokens", "bootstrap", "mult_eps"),
                             non_negative=("max_steps", "max_plan_len", "gigpo_omega"))
    if args.group_size < 2:
        problems.append("--group-size must be >= 2: a group of one has advantage 0 and nothing to blame")
    if problems:
        raise UserError("; ".join(problems))
    out = Path(args.out or f"runs/credit-{args.env}")
    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    trainer = build_trainer(args)
    trajs, _ = trainer.rollout(1)
    table, curves = measure(trainer, trajs, args)
    info = {"trajectories": len(trajs), "won": sum(t.won for t in trajs), "model": trainer.args.model,
            "hindsight": args.hindsight, "labelled_steps": table["grpo/all"]["blame"]["steps"] + table["grpo/all"]["credit"]["steps"],
            "seconds": time.perf_counter() - t0}
    trainer.close()
    out.mkdir(parents=True, exist_ok=True)
    roc_png(curves, out / "roc.png")
    (out / "credit.json").write_text(json.dumps(json_safe({"config": asdict(args), "info": info, "table": table}), indent=1))
    print_table(table, info)
    print(f"wrote {out / 'credit.json'} and {out / 'roc.png'} ({info['seconds']:.0f} s)")
    return table


if __name__ == "__main__":
    from cli import run

    run(main)
