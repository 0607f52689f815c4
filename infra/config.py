"""Configuration of train.py: presets applied, parsing, the rules for a resumed run's flags, validation.

The flags are flags.py's `TrainArgs`, which extends infra/run_args.py's `RunArgs`, the flags that say
how a run is executed (model and precision, data, run folder, logging, evaluation). Resolution:
flags given on the command line, over the preset's defaults (`--preset cpu-demo` shrinks the
GPU setting to minutes on a CPU), over the dataclass's defaults. With `--resume RUN`, the run's
saved flags, of which only RESUME_MAY_CHANGE may be changed. Every value is checked here,
before anything loads; config.json in the run folder records the resolved flags.
"""
from __future__ import annotations

import json
import math
import os
import sys
import types
import typing
from dataclasses import fields
from pathlib import Path
from typing import Literal

import torch

from envs import SPLITS
from advantage import check_mixing
from infra import dashboard, memory
from infra.checkpoint import find_checkpoint, read_config, read_iteration, read_json, run_checkpoints, run_dir_of
from infra.cli import UserError, check_domains, history_problems, given_flags, parse_dataclass, with_current_names
from infra.models import check_available, default_model_name
from infra.precision import auto_choice_line, resolve_dtype
from flags import CPU_DEMO_ENV_CHANGES, DATA, LEARN_WARMSTART, PRESET_CHANGES, WARMSTART, WEBSHOP_WARMSTART  # noqa: F401
from infra.run_args import RunArgs  # noqa: F401  (re-exported)
from vllm_rollout import missing as vllm_missing


PRESETS = {name: {k: v for k, (v, _) in changes.items()} for name, changes in PRESET_CHANGES.items()}
CPU_DEMO_PER_ENV = {env: {k: v for k, (v, _) in changes.items()} for env, changes in CPU_DEMO_ENV_CHANGES.items()}
ALFWORLD_ONLY = {"cpu-learn": "data/alfworld-learn", "cpu-watch": "data/alfworld's"}  # presets -> the games they need
GPU_PRESETS = ("gpu", "course")  # presets that train on real data and refuse to start without it
# Flags a resumed run may change: they do not change what is learned, only how long, how often
# it is evaluated or logged, and how memory is traded for time. Every other flag is the run's.
RESUME_MAY_CHANGE = ("env_timeout", "iterations", "eval_every", "eval_split", "eval_games", "save_every", "keep_checkpoints",
                     "samples_per_iter", "rollout_batch", "micro_batch_rows", "plain", "gradient_checkpointing", "env_workers", "resume",
                     "output_dir", "report_to")  # not --preset: a resumed run keeps its flags, presets apply to new runs
SESSION_ONLY = ("plain",)  # a resume that does not give these takes their default, not the last session's
MAX_EPISODES, MAX_STEPS, MAX_NEW_TOKENS = 4096, 1000, 16384  # sizes refused: no run of them finishes soon
MAX_OPTIMIZER_STEPS = 4096  # --minibatches x --ppo-epochs an iteration (the paper's: 2 x 1)
DATA_VARIABLE = {"alfworld": "ALFWORLD_DATA", "webshop": "WEBSHOP_DATA"}
REAL_DATA = {  # where each env's real data comes from (docs/environments.md)
    "alfworld": "on a connected machine, pip install alfworld==0.4.2 and run alfworld-download, then set ALFWORLD_DATA "
                "(or --data-dir) to the folder that holds json_2.1.1",
    "webshop": "fetch upstream WebShop's items_shuffle.json, items_ins_v2.json and items_human_ins.json (its "
               "setup.sh), then set WEBSHOP_DATA (or --data-dir) to their folder",
}


def preset_changes(preset: str, env: str) -> dict[str, tuple]:
    """What the (resolved) preset changes for this env: flag -> (value, reason)."""
    return {**PRESET_CHANGES[preset], **(CPU_DEMO_ENV_CHANGES.get(env, {}) if preset == "cpu-demo" else {})}


def preset_defaults(preset: str, env: str) -> tuple[str, dict]:
    """(resolved preset name, the defaults it sets for this env)."""
    if preset == "auto":
        preset = "gpu" if torch.cuda.is_available() else "cpu-demo"
    if preset in ALFWORLD_ONLY and env != "alfworld":
        raise UserError(f"--preset {preset} is ALFWorld's (its games are {ALFWORLD_ONLY[preset]}); drop it for --env {env}")
    return preset, {k: v for k, (v, _) in preset_changes(preset, env).items()}


def preset_lines(args) -> list[str]:
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


def parse_train_args(cls, argv: list[str] | None = None, description: str | None = None):
    """train.py's flags (an instance of `cls`, its TrainArgs), resolved and checked."""
    argv = sys.argv[1:] if argv is None else argv
    given = given_flags(cls, argv)  # also rejects unknown flags and bad choices, in one line
    if given.get("resume"):
        return resume_args(cls, given)
    preset, defaults = preset_defaults(given.get("preset", "auto"), given.get("env", "alfworld"))
    args = parse_dataclass(cls, argv, description, defaults)
    args.preset = preset
    if "init_adapter" in defaults and "init_adapter" not in given and args.model != defaults.get("model"):
        args.init_adapter = None  # a preset's warm start is for the preset's model only
    resolve_defaults(args)
    check_args(args)
    return args


def resolve_defaults(args) -> None:
    """Write the device-dependent defaults into the config, so config.json says what ran."""
    cuda = torch.cuda.is_available()
    if args.model is None:
        args.model = default_model_name()
    if args.load_in_4bit is None:
        args.load_in_4bit = cuda and args.model not in ("tiny", "smollm2") and args.init_adapter is None
    if args.gradient_checkpointing is None:
        args.gradient_checkpointing = cuda
    args.dtype = resolve_dtype(args.dtype, "cuda" if cuda else "cpu", args.model)  # config.json says which ran
    if args.output_dir is None:
        args.output_dir = (f"runs/{args.env}-{args.algo}" + (f"-{args.preset}" if args.preset.startswith("cpu-") else "")
                           + ("-shuffled" if args.shuffle_rewards else ""))  # a placebo beside its run
    if args.data_dir is None and os.environ.get(DATA_VARIABLE[args.env]):  # config.json says which data it played
        args.data_dir = os.environ[DATA_VARIABLE[args.env]]
    if args.data_dir is not None:  # absolute: the same folder for every later reader, from any working folder
        args.data_dir = str(Path(args.data_dir).expanduser().resolve())


# Flags added after some runs were saved: a config.json without one takes its default, said in one line.
# A config.json without any other flag is not a complete train.py config and is refused.
LATER_FLAGS = ("episode_stats", "lora_layers", "rollout_batch", "demo_data", "env_timeout")


def resume_args(cls, given: dict):
    """The saved run's flags, with the allowed changes; refuse the others, naming the flag. A run
    folder stopped before its first checkpoint restarts from iteration 1 with its saved flags.
    --resume CHECKPOINT --output-dir NEW branches: a new run folder that continues from that checkpoint
    (any of the run's, the newest or an older one), with the run's logs up to it copied in."""
    folder = Path(given["resume"])
    fresh = (folder / "config.json").is_file() and not (folder / "state.json").is_file() and not run_checkpoints(folder)
    if fresh:  # killed before its first checkpoint: nothing to restore but the flags
        ckpt, run_dir = None, folder
        saved = with_current_names(read_json(folder / "config.json", "the run's training flags"))
    else:
        ckpt = find_checkpoint(folder)
        run_dir = run_dir_of(ckpt)
        saved = read_config(ckpt)
    out = Path(given["output_dir"]) if "output_dir" in given else run_dir
    branching = out.expanduser().resolve() != run_dir.expanduser().resolve()
    if branching and ckpt is None:
        raise UserError(f"{folder} holds no checkpoint to branch from; continue it with --resume {folder} alone")
    if branching and (run_checkpoints(out) or (out / "config.json").exists()):
        raise UserError(f"--output-dir {out} already holds a run: a branch starts a new run folder; choose another")
    if not branching and ckpt is not None and ckpt == run_dir:
        raise UserError(f"{ckpt} is a checkpoint on its own, not a run folder: branch a new run from it with "
                        f"python train.py --resume {ckpt} --output-dir NEW_FOLDER")
    if not branching and ckpt is not None and find_checkpoint(run_dir) != ckpt:
        raise UserError(f"--resume {ckpt} would redo the iterations after it, but {run_dir} holds the newer "
                        f"{find_checkpoint(run_dir).name}; resume the run folder, or branch a new run from that "
                        f"checkpoint with --output-dir NEW_FOLDER")
    if not branching and ckpt is not None:
        check_unedited(run_dir, ckpt, saved)
    problems = config_type_errors(cls, saved)
    known = {f.name for f in fields(cls)}
    absent = [k for k in known if k not in saved and k not in RESUME_MAY_CHANGE]
    problems += [f"field {k!r} is missing" for k in absent if k not in LATER_FLAGS]
    if problems:
        raise UserError(f"{(ckpt or run_dir) / 'config.json'}: " + "; ".join(problems) + " (not a complete train.py config)")
    for k in absent:
        print(f"note: {(ckpt or run_dir) / 'config.json'} has no {k!r} (a run from before that flag): taking "
              f"{getattr(cls, k)!r}", file=sys.stderr)
    if given.get("preset") == "auto":  # auto is what the run resolved it to when it started
        given = {k: v for k, v in given.items() if k != "preset"}
    if "dtype" in given and given["dtype"] == "auto":  # auto is what it resolves to here
        given = {**given, "dtype": resolve_dtype("auto", "cuda" if torch.cuda.is_available() else "cpu",
                                                 saved.get("model"))}
    if given.get("data_dir") is not None:  # the run recorded it absolute
        given = {**given, "data_dir": str(Path(given["data_dir"]).expanduser().resolve())}
    changed = [k for k, v in given.items() if k not in RESUME_MAY_CHANGE and k in saved and saved[k] != v]
    if changed:
        flags = ", ".join(f"--{k.replace('_', '-')} (run: {saved[k]!r}, given: {given[k]!r})" for k in changed)
        raise UserError(f"--resume continues the same experiment; these flags would change it: {flags}. "
                        "Start a new run (another --output-dir) to change them.")
    once = {f.name: f.default for f in fields(cls) if f.name in SESSION_ONLY and f.name not in given}
    args = cls(**{**{k: v for k, v in saved.items() if k in known}, **once, **given})
    args.output_dir, args.resume = str(out), None if ckpt is None else str(ckpt)
    done = read_iteration(ckpt) if ckpt is not None else 0
    if "iterations" in given and given["iterations"] <= done:
        raise UserError(f"--iterations {given['iterations']}: {ckpt} is at iteration {done} already, so nothing would "
                        f"run; pass more than {done} to continue it")
    check_resumed_data(args)
    try:
        check_args(args)
    except UserError as err:  # a value the user did not give is the saved config's, not a flag's
        own = [k for k in saved if k not in given and f"--{k.replace('_', '-')} " in f"{err} "]
        if not own:
            raise
        raise UserError(f"{(ckpt or run_dir) / 'config.json'} holds a value train.py refuses (edited or damaged: "
                        f"{', '.join(own)}): {err}") from None
    return args


def check_unedited(run_dir: Path, ckpt: Path, saved: dict) -> None:
    """The run folder's config.json says what its checkpoint's does, but for the flags a resume may
    change: a hand edit would otherwise be discarded without a word (a resume takes the checkpoint's)."""
    path = run_dir / "config.json"
    if not path.exists():
        return
    try:
        edited = with_current_names(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        edited = None
    if not isinstance(edited, dict):
        raise UserError(f"{path} is not a JSON object of flags (edited or damaged): a resume continues from "
                        f"{ckpt / 'config.json'}; copy that file back over it to resume")
    differ = sorted(k for k in set(edited) | set(saved)
                    if k not in RESUME_MAY_CHANGE and edited.get(k) != saved.get(k))
    if differ:
        shown = ", ".join(f"{k}: {edited.get(k)!r} (checkpoint: {saved.get(k)!r})" for k in differ[:3])
        raise UserError(f"{path} was edited ({shown}): a resume continues with its checkpoint's flags, "
                        f"{ckpt / 'config.json'}. Copy that file back to resume, or start a new run with the "
                        "changed flags (--iterations and the other flags a resume may change go on the command line)")


def check_resumed_data(args) -> None:
    """A resumed run plays the data it trained on: the folder config.json recorded (--data-dir, or the
    $ALFWORLD_DATA / $WEBSHOP_DATA it was started with), or the shipped data when it recorded none."""
    now = os.environ.get(DATA_VARIABLE[args.env])
    if args.data_dir is None and now:
        raise UserError(f"the run trained on the shipped {args.env} data, and ${DATA_VARIABLE[args.env]} is set now "
                        f"({now}): unset it to continue the run, or start a new run on that data")
    if args.data_dir is not None and now and Path(now).expanduser().resolve() != Path(args.data_dir).expanduser().resolve():
        print(f"note: the run continues on the data it trained on, {args.data_dir}, not ${DATA_VARIABLE[args.env]} "
              f"({now})", file=sys.stderr)


def config_type_errors(cls, saved: dict) -> list[str]:
    """Each saved flag whose JSON value does not fit its type in `cls` (a hand-edited or crafted config.json)."""
    hints, problems = typing.get_type_hints(cls), []
    for name, value in saved.items():
        if name not in hints:
            continue
        union = typing.get_origin(hints[name]) in (typing.Union, types.UnionType)
        kinds = typing.get_args(hints[name]) if union else (hints[name],)
        ok = False
        for kind in kinds:
            if kind is type(None):
                ok |= value is None
            elif typing.get_origin(kind) is Literal:
                ok |= value in typing.get_args(kind)
            elif kind in (int, float):  # JSON writes 1e-4 as a float and 2 as an int; a bool is neither
                ok |= isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool)
            else:
                ok |= isinstance(value, kind)
        if not ok:
            problems.append(f"field {name!r} should be {hints[name]}, found {value!r:.40}")
    return problems


def check_args(args) -> None:
    """Reject bad settings before anything loads, each naming its flag and what to do."""
    problems = check_domains(
        args,
        positive=("iterations", "groups", "group_size", "max_new_tokens", "minibatches", "ppo_epochs",
                  "micro_batch_rows", "save_every", "keep_checkpoints", "lora_r", "lora_alpha", "lr",
                  "temperature", "ppo_clip", "grad_clip", "eval_games", "env_timeout"),
        non_negative=("env_workers", "max_steps", "max_plan_len", "kl_coef", "sdar_coef", "sdar_beta", "weight_decay",
                      "eval_every", "samples_per_iter", "gigpo_omega", "rollout_batch", "lora_layers"),
        finite=("gigpo_gamma",),
    )
    if math.isfinite(args.ppo_clip) and not args.ppo_clip < 1:  # r in [1 - clip, 1 + clip]: a ratio stays > 0
        problems.append(f"--ppo-clip must be in (0, 1) (PPO's window is [1 - clip, 1 + clip]); got {args.ppo_clip}")
    if math.isfinite(args.gigpo_gamma) and not 0 <= args.gigpo_gamma <= 1:  # a nan or inf is said once, above
        problems.append(f"--gigpo-gamma must be in [0, 1]; got {args.gigpo_gamma}")
    try:  # lam and eps_m: advantage.py's one check, its message
        check_mixing(args.lam, args.eps_m)
    except ValueError as err:
        problems.append(str(err))
    for flag, value, limit in (("--groups x --group-size (episodes per iteration)", args.groups * args.group_size,
                                MAX_EPISODES), ("--max-steps", args.max_steps, MAX_STEPS),
                               ("--max-new-tokens", args.max_new_tokens, MAX_NEW_TOKENS),
                               ("--minibatches x --ppo-epochs (optimizer steps per iteration)",
                                args.minibatches * args.ppo_epochs, MAX_OPTIMIZER_STEPS)):
        if value > limit:
            problems.append(f"{flag} is {value}, above this project's limit of {limit}: an iteration that size "
                            "would not finish in a day on one GPU (the paper's setting is 16 x 8, 50 steps, 256 tokens)")
    problems += history_problems(args.history)
    for flag, split in (("--split", args.split), ("--eval-split", args.eval_split)):
        if split is not None and split not in SPLITS[args.env]:
            problems.append(f"{flag} for {args.env} must be one of {', '.join(SPLITS[args.env])}; got {split!r}")
    if missing := dashboard.missing_package(args.report_to):
        problems.append(missing)
    if args.algo == "rlsd" and args.gap_tokens != "all":
        problems.append("--gap-tokens action is for the algorithms with a segment gap: RLSD's multiplier is per token "
                        "and reads no gap; drop the flag for --algo rlsd")
    if args.rollout == "vllm" and (problem := vllm_missing()):
        problems.append(problem)
    if not 0 < args.vllm_gpu_memory < 1:
        problems.append(f"--vllm-gpu-memory is a share of the GPU's memory, between 0 and 1; got {args.vllm_gpu_memory}")
    if args.init_adapter and args.load_in_4bit:
        problems.append("--init-adapter merges into full-precision weights: add --load-in-4bit False")
    if args.init_adapter and not (Path(args.init_adapter) / "adapter_config.json").is_file() and not args.resume:
        problems.append(f"--init-adapter {args.init_adapter}: no adapter_config.json there (pass a "
                        "tools/warmstart.py output folder, or none)")
    if args.load_in_4bit and args.model == "tiny":
        problems.append("--load-in-4bit: the tiny test model is built from its config and loads in float32 or bf16 only")
    if args.preset in GPU_PRESETS and not args.demo_data and not args.data_dir and \
            not os.environ.get(DATA_VARIABLE[args.env]):
        problems.append(f"--preset {args.preset} trains on {args.env}'s real data, and none is given: {REAL_DATA[args.env]}; "
                        f"or pass --demo-data to train on the shipped demo games on purpose")
    if problems:
        raise UserError("; ".join(problems))
    check_gpu(args)  # a GPU without bf16, or a setting it cannot hold: one line, before a model loads
    check_available(args.model)  # a model that cannot be had is one line, in seconds, before anything is made
    if args.group_size == 1:
        print("warning: --group-size 1 gives every trajectory advantage 0 (no group to compare with): "
              "nothing will be learned", file=sys.stderr)


def check_gpu(args, card_gib: float | None = None, capability: tuple | None = None) -> None:
    """On a GPU (or given its memory and compute capability, as tests do): refuse bf16 and 4-bit on a
    card without bf16 (compute capability below 8, e.g. a T4), and a setting whose plan does not fit
    the card (infra/memory.py), each in one line naming the flag to change."""
    if card_gib is None:
        if not torch.cuda.is_available():
            return
        card_gib, capability = torch.cuda.mem_get_info()[1] / memory.GIB, torch.cuda.get_device_capability()
    if capability is not None and capability[0] < 8 and (args.dtype == "bf16" or args.load_in_4bit):
        raise UserError(f"this GPU (compute capability {capability[0]}.{capability[1]}, e.g. a T4) has no bf16, "
                        "which --dtype bf16 and the 4-bit layers' compute need: pass --dtype fp32 --load-in-4bit False "
                        "with a model whose float32 weights fit (--model Qwen/Qwen2.5-1.5B-Instruct: 5.8 GiB), or "
                        "use a GPU of compute capability 8 or more (L4, A10, A100, H100)")
    shape = memory.shape_of(args.model)
    if shape is None:
        return
    setting = memory.Setting(
        load_in_4bit=bool(args.load_in_4bit), fp32=args.dtype == "fp32", lora_r=args.lora_r,
        micro_batch_rows=args.micro_batch_rows, episodes=args.groups * args.group_size,
        rollout_batch=args.rollout_batch, prompt_tokens=memory.prompt_tokens(args.env, args.history, args.max_steps),
        max_new_tokens=args.max_new_tokens, kl=args.kl_coef > 0, rollout=args.rollout,
        vllm_gpu_memory=args.vllm_gpu_memory, gradient_checkpointing=bool(args.gradient_checkpointing))
    if problem := memory.fit_problem(shape, setting, card_gib, args.model):
        raise UserError(problem)


def check_tasks(args, env) -> None:
    """The evaluation split holds the games --eval-games asks for: with --preset gpu (and not --demo-data) one
    line that stops the run before a model loads; elsewhere a warning that says how many each evaluation plays."""
    if not args.eval_every:
        return
    split = args.eval_split or env.default_eval_split
    have = len(env.tasks(split))
    if have < args.eval_games:
        short = f"the {split} split of {args.env}'s data holds {have} games, fewer than --eval-games {args.eval_games}"
        if args.preset in GPU_PRESETS and not args.demo_data:
            raise UserError(f"{short}: {REAL_DATA[args.env]}; or lower --eval-games")
        print(f"warning: {short}: each evaluation plays those {have}", file=sys.stderr)


def precision(dtype: str) -> str:
    """What --dtype means, in words (a resumed run keeps its saved dtype; runs before the flag were fp32)."""
    return {"bf16": "bf16 weights, float32 LoRA, head and loss", "fp32": "float32"}.get(dtype, dtype)


def describe(args) -> str:
    """The lines train.py prints before it starts: resumed or new, the preset, what runs where."""
    lines = [f"resuming {args.output_dir} from {args.resume}"] if args.resume else []
    if not args.resume and not torch.cuda.is_available() and args.preset == "cpu-demo":
        lines.append("no GPU found: using the cpu-demo preset (a few short episodes on the shipped games); "
                     "pass --preset gpu on a GPU machine for the full setting")
    if not args.resume:  # what the preset changed from the GPU setting, and why
        lines += preset_lines(args)
    if not args.resume and (line := auto_choice_line(args.model)):
        lines.append(line)
    lines.append(f"training {args.algo} on {args.env} with {args.model} ({precision(args.dtype)}): {args.iterations} "
                 f"iterations x {args.groups} tasks x {args.group_size} rollouts -> {args.output_dir}")
    lines.append("each iteration's line: its success on the games it trains on, with a text curve of the iterations "
                 "so far and the change since iteration 1, then the invalid-answer rate; held-out games: "
                 + (f"an evaluation every {args.eval_every} iterations" if args.eval_every else
                    f"python eval.py --policy model --checkpoint {args.output_dir}"))
    return "\n".join(lines)
