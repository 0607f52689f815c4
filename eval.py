"""Evaluation: success rates on held-out games, overall and per task type.

Policies: `expert` follows the env's expert (an upper bound), `random` picks uniformly among
the admissible actions (a lower bound; a WebShop search uses three random words of the task),
`model` is the LLM policy (base model, or a trained LoRA adapter with --checkpoint), greedy unless
--temperature > 0.
Games: --num-games chosen round-robin over task types (sorted within each type), so a small
N still covers every type.

Metrics (printed as a table and written as JSON):
  success           share of episodes won (WebShop: share of purchases with score 1.0)
  success/<type>    the same per task type (WebShop: per product category)
  mean_score        WebShop only: mean purchase score in 0..1 (papers report it x 100 as "score")
  mean_reward       mean episode reward R_i (10 * won - 0.1 * invalid actions)
  mean_steps        mean episode length in env steps
  invalid_rate      invalid actions / all steps
  env_ms_per_step   engine milliseconds per (valid) step; env_ms_per_reset likewise per reset
  games             (JSON only) each game's outcome: won, steps (for intervals paired over
                    games); with --samples-per-game K > 1, won is the share of its K episodes
                    won, steps their mean

Run: python eval.py --env alfworld --policy expert   (the shipped games; real ones: --data-dir DIR)
     python eval.py --policy model --model smollm2 --init-adapter data/warmstart/smollm2-alfworld
     python eval.py --env webshop --policy random
"""
from __future__ import annotations

import errors  # first: a Ctrl-C or kill while the imports below load is one line

errors.quiet_start(__name__)
# isort: split

import json
import random
import re
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import torch

from envs import ENVS
from envs.answer import history_length, history_problems
from envs.make import make_env, resolve_workers
from flags import MethodArgs, RunArgs
from infra.checkpoint import (STATE, check_writable, claim_record, file_system_problem,
                              find_checkpoint, give_back, load_checkpoint_policy, read_config,
                              read_json, run_dir_of, write_atomic)
from infra.cli import (OutputLost, Stopped, UserError, check_domains, choice_of, float_in,
                       parse_dataclass, run)
from infra.models import load_policy
from rollout import ModelPolicy, play_episodes
from segments import Trajectory


@dataclass
class EvalArgs:
    """Command-line flags of eval.py."""

    env: choice_of(ENVS) | None = None
    """which environment (envs.ENVS); default: a --checkpoint's own, else train.py's"""
    policy: Literal["expert", "random", "model"] = "expert"
    """who plays"""
    split: str | None = None
    """the split; default: the env's eval split (ALFWorld: valid_unseen, WebShop: test)"""
    data_dir: str | None = None
    """env data folder; default: a --checkpoint's own, else $ALFWORLD_DATA / $WEBSHOP_DATA, else
    the shipped data"""
    num_games: int = 0
    """games to play, round-robin over task types; 0 = the whole split"""
    max_steps: int | None = None
    """steps per episode; default: a --checkpoint's own, else the env's (ALFWorld 50, WebShop 15)"""
    history: str | None = None
    """observation/action pairs in the prompt, an integer or "all"; default: a --checkpoint's own,
    else train.py's"""
    batch_size: int = 16
    """episodes played in one batch"""
    env_workers: int = 0
    """ALFWorld: processes the episodes run in; 0 = CPU cores, capped by the batch; 1 = in this
    process"""
    model: str | None = None
    """model for --policy model without --checkpoint; default per device"""
    init_adapter: str | None = None
    """with --model: a warm start merged in first (e.g. data/warmstart/smollm2-alfworld)"""
    dtype: Literal["auto", "bf16", "fp32"] = "auto"
    """with --model: precision (train.py's --dtype); a checkpoint keeps its run's"""
    checkpoint: str | None = None
    """a train.py run folder (its newest checkpoint) or checkpoints/iter-* folder"""
    temperature: float_in("[0.01, 100]", also=0.0) = 0.0
    """sampling temperature for --policy model; 0 = greedy"""
    samples_per_game: int = 1
    """episodes per game (with --temperature > 0): each game's success is the share won"""
    max_new_tokens: int | None = None
    """response length limit for --policy model; default: a --checkpoint's own, else train.py's"""
    seed: int = 0
    """seed for the random policy and sampling"""
    out: str | None = None
    """JSON output path; default: runs/eval/<env>_<policy>_<split>.json, or in the run folder"""


# where no flag is given: a --checkpoint's own setting, else train.py's (max_steps 0: the env's)
PLAYED_AS_TRAINED = {k: getattr(MethodArgs, k) for k in ("history", "max_steps", "max_new_tokens")}


# ------------------------------------------------------------------ baseline policies
def format_answer(action: str, thought: str) -> str:
    return f"<think>{thought}</think><action>{action}</action>"


class ExpertPolicy:
    """Follows the env's expert; when it has no advice, looks around."""

    def act(self, contexts, states):
        answers = [format_answer(s.expert_action or "look", "following the expert") for s in states]
        return [([], [], answer) for answer in answers]


QUERY = "<your query>"  # WebShop's free-text slot, search[<your query>]: any words make it valid


def fill_query(action: str, task: str, rng: random.Random) -> str:
    """The action with its free-text slot (if any) filled by three words drawn from the task."""
    if QUERY not in action:
        return action
    words = task.split() or ["item"]
    return action.replace(QUERY, " ".join(rng.choice(words) for _ in range(3)))


class RandomPolicy:
    """Picks uniformly among the admissible actions; a free-text slot (WebShop's
    search[<your query>]) gets three words drawn from the task text."""

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)

    def act(self, contexts, states):
        out = []
        for s in states:
            action = fill_query(self.rng.choice(s.admissible), s.task, self.rng)
            out.append(([], [], format_answer(action, "random choice")))
        return out


# ------------------------------------------------------------------ games and metrics
def summarize(trajs: list[Trajectory]) -> dict:
    """Success, reward, length and invalid rate of finished episodes, overall and per task type
    (the docstring above defines each)."""
    steps = sum(len(t.steps) for t in trajs)
    invalid = sum(s.action is None for t in trajs for s in t.steps)
    by_type: dict[str, list[bool]] = defaultdict(list)
    for t in trajs:
        by_type[t.task_type].append(t.won)
    out = {
        "episodes": len(trajs),
        "success": sum(t.won for t in trajs) / max(len(trajs), 1),
        "mean_reward": sum(t.reward for t in trajs) / max(len(trajs), 1),
        "mean_steps": steps / max(len(trajs), 1),
        "invalid_rate": invalid / max(steps, 1),
    }
    if any("score" in t.info for t in trajs):
        out["mean_score"] = sum(t.info.get("score", 0.0) for t in trajs) / len(trajs)
    out.update({f"success/{k}": sum(v) / len(v) for k, v in sorted(by_type.items())})
    out.update({f"episodes/{k}": len(v) for k, v in sorted(by_type.items())})
    return out


def pick_games(env, split: str, num_games: int) -> list[str]:
    """num_games task ids, round-robin over task types (sorted ids within each type)."""
    by_type: dict[str, list[str]] = defaultdict(list)
    for task_id in env.tasks(split):
        by_type[env.task_type(task_id)].append(task_id)
    queues = [sorted(ids) for _, ids in sorted(by_type.items())]
    total = sum(len(q) for q in queues)
    if total == 0:  # an evaluation of no game is no result
        raise UserError(f"the {split} split of {env.name}'s data holds no game to play: check "
                        "--data-dir, or choose another --split")
    n = total if num_games <= 0 else min(num_games, total)
    picked, k = [], 0
    while len(picked) < n:
        for q in queues:
            if k < len(q) and len(picked) < n:
                picked.append(q[k])
        k += 1
    return picked


def evaluate(env, policy, task_ids: list[str], history_len: int | None, batch_size: int,
             desc: str = "eval") -> tuple[dict, list]:
    """Play task_ids in batches; return (metrics, trajectories)."""
    trajs = []
    for start in range(0, len(task_ids), batch_size):
        chunk = task_ids[start : start + batch_size]
        done = f"{desc} {start + len(chunk)}/{len(task_ids)}"
        trajs += play_episodes(env, chunk, policy, history_len, desc=done)
    metrics = summarize(trajs)
    metrics["env_ms_per_step"] = 1000 * env.seconds["step"] / max(env.counts["step"], 1)
    metrics["env_ms_per_reset"] = 1000 * env.seconds["reset"] / max(env.counts["reset"], 1)
    return metrics, trajs


def greedy_evaluation(env, model, tokenizer, split: str | None, num_games: int,
                      history_len: int | None, max_new_tokens: int) -> tuple[dict, dict]:
    """train.py's periodic evaluation: greedy play of num_games games of `split` (None: the env's
    eval split), round-robin over task types; returns (the metrics keyed "eval/<name>", each
    game's outcome as eval.py's JSON has it). The caller's RNG state is left as it was."""
    games = pick_games(env, split or env.default_eval_split, num_games)
    policy = ModelPolicy(model, tokenizer, max_new_tokens, temperature=0.0)
    with torch.random.fork_rng(devices=[]):
        metrics, trajs = evaluate(env, policy, games, history_len, batch_size=max(len(games), 1))
    line = {f"eval/{k}": v for k, v in metrics.items() if isinstance(v, (int, float))}
    return line, game_outcomes(trajs)


def in_loop_evaluation(env, model, tokenizer, args, iteration: int,
                       history_len: int | None) -> tuple[dict, dict]:
    """train.py's --eval-every evaluation after `iteration`: (the eval/... metrics of its line, with
    seconds/eval; the record eval.py would write: metrics, each game, config)."""
    split = args.eval_split or env.default_eval_split
    start = time.perf_counter()
    line, games = greedy_evaluation(env, model, tokenizer, split, args.eval_games, history_len,
                                    args.max_new_tokens)
    setting = {"env": args.env, "split": split, "policy": "model", "checkpoint": None,
               "iteration": iteration, "max_steps": args.max_steps,
               "max_new_tokens": args.max_new_tokens}
    record = {**{k.removeprefix("eval/"): v for k, v in line.items()}, "games": games,
              "config": setting}
    line["seconds/eval"] = record["wall_seconds"] = time.perf_counter() - start
    return line, record


def game_outcomes(trajs) -> dict:
    """Each game's outcome, as eval.py's JSON holds it (for intervals paired over games): won and
    steps; a game played K > 1 times gets the share of its episodes won and their mean steps. And
    what was done: `actions`, one list per episode of the actions taken (null: an invalid answer),
    so that a lost episode can be read afterwards (what it took, where it went)."""
    by_game = defaultdict(list)
    for t in trajs:
        by_game[t.task_id].append(t)
    out = {}
    for game, ts in by_game.items():
        if len(ts) == 1:
            out[game] = {"won": ts[0].won, "steps": len(ts[0].steps)}
        else:
            out[game] = {"won": sum(t.won for t in ts) / len(ts),
                         "steps": sum(len(t.steps) for t in ts) / len(ts), "samples": len(ts)}
        out[game]["actions"] = [[s.action for s in t.steps] for t in ts]
    return out


def print_table(metrics: dict, title: str) -> None:
    print(f"\n{title}")
    types = [k.split("/", 1)[1] for k in metrics if k.startswith("success/")]
    print(f"  {'task type':34s} {'games':>5s} {'success':>8s}")
    for t in types:
        print(f"  {t:34s} {metrics['episodes/' + t]:5d} {100 * metrics['success/' + t]:7.1f}%")
    print(f"  {'all':34s} {metrics['episodes']:5d} {100 * metrics['success']:7.1f}%")
    for k in ("mean_score", "mean_reward", "mean_steps", "invalid_rate", "env_ms_per_step",
              "env_ms_per_reset"):
        if k in metrics:
            print(f"  {k:20s} {metrics[k]:.3f}")


def check_args(args: EvalArgs) -> None:
    """Reject bad flags before anything loads, naming the flag."""
    problems = check_domains(args, positive=("batch_size", "max_new_tokens", "samples_per_game"),
                             non_negative=("num_games", "max_steps", "env_workers"))
    problems += history_problems(args.history or PLAYED_AS_TRAINED["history"])
    if args.checkpoint and args.policy != "model":
        problems.append(f"--checkpoint is for --policy model (got --policy {args.policy}): add "
                        "--policy model")
    if args.checkpoint and args.model:
        problems.append("--model and --checkpoint: the checkpoint names its own base model; drop "
                        "--model")
    if args.init_adapter and (args.checkpoint or args.policy != "model"):
        problems.append("--init-adapter is for --policy model without --checkpoint (a checkpoint "
                        "carries its own)")
    if args.samples_per_game > 1 and not (args.policy == "model" and args.temperature > 0):
        problems.append(f"--samples-per-game {args.samples_per_game} replays a game's episode; "
                        "only a model sampling (--policy model --temperature > 0) plays it "
                        "differently: add those, or drop the flag")
    if problems:
        raise UserError("; ".join(problems))


def main(argv: list[str] | None = None) -> dict:
    args = parse_dataclass(EvalArgs, argv, description=__doc__)
    check_args(args)
    ckpt, data_of_run = None, False
    if args.checkpoint is not None:
        ckpt = find_checkpoint(args.checkpoint)
        trained = read_config(ckpt)  # before any env or model loads: no config.json stops here
        if args.env is not None and args.env != trained["env"]:
            raise UserError(f"{ckpt} was trained on {trained['env']}: drop --env (it defaults to "
                            f"the checkpoint's) or pass --env {trained['env']}")
        args.env = trained["env"]
        data_of_run = args.data_dir is None  # the data it trained on, held-out splits and all
        if data_of_run and isinstance(trained.get("data_dir"), str):
            args.data_dir = trained["data_dir"]
        played = {k: trained.get(k) for k in PLAYED_AS_TRAINED if getattr(args, k) is None}
        for k, v in played.items():  # where no flag is given: the setting the run trained with
            setattr(args, k, v)
        if played:
            print(f"playing as {run_dir_of(ckpt)} trained: " + ", ".join(
                f"--{k.replace('_', '-')} {v}" for k, v in played.items()))
    args.env = args.env or MethodArgs.env
    for key, default in PLAYED_AS_TRAINED.items():
        if getattr(args, key) is None:
            setattr(args, key, default)
    history_len = history_length(args.history)
    try:
        env = make_env(args.env, data_dir=args.data_dir, max_steps=args.max_steps,
                       workers=resolve_workers(args.env_workers, args.batch_size))
        split = args.split or env.default_eval_split
        games = pick_games(env, split, args.num_games)
        task_ids = [g for g in games for _ in range(args.samples_per_game)]
    except (FileNotFoundError, ValueError) as err:
        raise UserError(str(err)) from None
    if data_of_run:
        check_trained_data(ckpt, env, args.data_dir)
    if args.out is not None:
        out = Path(args.out)
        if IN_LOOP_RECORD.fullmatch(out.name):
            raise UserError(f"--out {out}: eval_<env>_<split>_iter-N.json is the name of a run's "
                            "own evaluation (train.py --eval-every), which says what it measured "
                            "by that name: pass another --out, or none (a checkpoint's run folder "
                            "gets evalpy_...)")
        check_writable(out)  # before any game: a path that cannot take the JSON costs nothing
    else:
        out = claim_out_path(args.env, args.policy, split, ckpt)  # claimed: no other eval.py's
    try:
        metrics = play(args, env, task_ids, history_len, ckpt, split)
        try:  # the JSON first: an output stream that closes or fills below loses no result
            write_atomic(out, json.dumps(metrics, indent=1))
        except OSError as err:
            why = file_system_problem(err, out.parent) or err.strerror or err
            print_table(metrics, f"{args.env} / {split} / policy {args.policy}")
            lost = f"cannot write {out} ({why}); the results are the table above"
            raise UserError(lost) from None
    finally:  # however it ends, the claim given back: the record is written, or none is coming
        if args.out is None:
            give_back(out)
    title = f"{args.env} / {split} / policy {args.policy}" + (f" / {ckpt}" if ckpt else "")
    try:
        print_table(metrics, title)
        print(f"wrote {out}")
    except OutputLost as err:
        raise Stopped(f"every game was played and the results are in {out}", err) from None
    return metrics


def play(args: EvalArgs, env, task_ids: list[str], history_len: int | None, ckpt: Path | None,
         split: str) -> dict:
    """Every game played by --policy: the metrics, each game's outcome, the settings."""
    if args.policy == "expert":
        policy = ExpertPolicy()
    elif args.policy == "random":
        policy = RandomPolicy(args.seed)
    else:
        policy = load_model_policy(args, ckpt)
    t0 = time.perf_counter()
    metrics, trajs = evaluate(env, policy, task_ids, history_len, args.batch_size)
    metrics["wall_seconds"] = time.perf_counter() - t0
    metrics["games"] = game_outcomes(trajs)
    metrics["config"] = {**asdict(args), "split": split, "checkpoint": str(ckpt) if ckpt else None}
    env.close()
    return metrics


def check_trained_data(ckpt: Path, env, data_dir: str | None) -> None:
    """The env plays the tasks `ckpt`'s run trained on, as the digest its state.json recorded
    says: a --data-dir that an older run recorded relative to the folder it was started in (runs
    before a5b416d) names another folder from here, and data edited since holds other games. Either
    is one line, before any game; a --data-dir on the command line evaluates other data on
    purpose."""
    recorded = read_json(ckpt / STATE, "the checkpoint's iteration").get("data")
    now = env.data_digest()
    if isinstance(recorded, str) and now == recorded:
        return
    if data_dir is not None and not Path(data_dir).is_absolute():
        which = "holds other tasks" if isinstance(recorded, str) else "nothing can check"
        here = Path(data_dir).resolve()
        raise UserError(f"{ckpt / 'config.json'} records --data-dir {data_dir!r}, relative to the "
                        "folder its run was started in (runs before data folders were recorded "
                        f"absolute), and from here it is {here}, which {which}: pass --data-dir "
                        "with the folder the run trained on")
    if isinstance(recorded, str) and now is not None:
        where = data_dir or "the default data folder"
        raise UserError(f"the data at {where} holds other tasks than {ckpt} trained on (their "
                        f"digest {now}, the run's {recorded}): restore it, or pass --data-dir to "
                        "evaluate on other data on purpose")


IN_LOOP_RECORD = re.compile(r"eval_.+_iter-(\d{6,})\.json")  # train.py's own (--eval-every)


def claim_out_path(env: str, policy: str, split: str, ckpt: Path | None = None) -> Path:
    """runs/eval/<env>_<policy>_<split>.json; for a checkpoint, evalpy_<env>_<split>_<iter-N>.json
    in its run folder, or -2, -3, ... after the name where one is there: an evaluation of eval.py
    never replaces another, nor the run's own (eval_<env>_<split>_iter-N.json, train.py's). A
    checkpoint's name is claimed now, before any game (infra/checkpoint.py's claim_record: a hidden
    file beside it, named like no record), so that two eval.py at once never pick the same one."""
    if ckpt is None:
        path = Path("runs") / "eval" / f"{env}_{policy}_{split}.json"
        check_writable(path)
        return path
    folder, stem = run_dir_of(ckpt), f"evalpy_{env}_{split}_{ckpt.name}"
    check_writable(folder / f"{stem}.json")
    return claim_record(folder, stem)


def load_model_policy(args: EvalArgs, ckpt: Path | None):
    """The LLM policy for --policy model: the base model, or a checkpoint's policy exactly as it
    was trained (base model, 4-bit or not, warm start and, for `tiny`, its seed, all read from
    the checkpoint)."""
    torch.manual_seed(args.seed)
    if ckpt is not None:
        model, tokenizer = load_checkpoint_policy(ckpt)
    else:
        model, tokenizer = load_policy(args.model, seed=args.seed, init_adapter=args.init_adapter,
                                       dtype=args.dtype, lora_r=RunArgs.lora_r,
                                       lora_alpha=RunArgs.lora_alpha)  # a new adapter: it adds 0
    return ModelPolicy(model, tokenizer, args.max_new_tokens, args.temperature)


if __name__ == "__main__":
    run(main)
