"""Reading train.py's command line: the flags (flags/__init__.py) resolved, a resumed run's taken
back, every value checked before anything loads, and what a run says of its flags when it starts.

A new run: the flags the command line gives, over the preset's (`--preset auto`: `cpu-demo` without a
GPU, else `gpu`), over the dataclasses' defaults; the device-dependent defaults then written in
(model, precision, run folder), so that config.json says what ran. A resumed run: the flags its
checkpoint recorded, of which only RESUME_MAY_CHANGE may change (infra/config.py's mechanics).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from baselines import ALGORITHMS
from envs.answer import history_problems
from envs.make import env_class
from errors import UserError
from flags import (GPU_PRESETS, LATER_FLAGS, MAX_EPISODES, MAX_NEW_TOKENS, MAX_OPTIMIZER_STEPS, MAX_STEPS,
                   RESUME_MAY_CHANGE, SESSION_ONLY, TrainArgs, preset_defaults, preset_lines)
from infra import dashboard, memory
from infra.cli import check_domains, given_flags, parse_dataclass
from infra.config import ResumeRules, resume_args
from infra.models import check_available, default_load_in_4bit, default_model_name
from infra.precision import auto_choice_line, resolve_dtype
from vllm_rollout import missing as vllm_missing


def parse_args(argv: list[str] | None = None, description: str | None = None) -> TrainArgs:
    """train.py's flags, resolved and checked: a new run's (command line over preset over defaults),
    or a resumed run's."""
    argv = list(sys.argv[1:] if argv is None else argv)
    given, asks_help = given_flags(TrainArgs, argv)  # rejects unknown flags and bad choices in one line
    if given.get("resume") is not None and not asks_help:  # --resume none: no resume, a new run
        return resume_args(TrainArgs, given, RESUME_RULES)  # (an empty --resume: refused by the parse)
    preset, defaults = preset_defaults(given.get("preset", TrainArgs.preset), given.get("env", TrainArgs.env))
    args = parse_dataclass(TrainArgs, argv, description, defaults)  # --help: printed, with these defaults
    args.preset = preset
    if "init_adapter" in defaults and "init_adapter" not in given and args.model != defaults.get("model"):
        args.init_adapter = None  # a preset's warm start is for the preset's model only
    resolve_defaults(args)
    check(args)
    return args


RESOLVED_AT_START = ("model", "load_in_4bit", "gradient_checkpointing", "output_dir")  # their None: filled below


def resolve_defaults(args: TrainArgs) -> None:
    """Write the device-dependent defaults into the config, so config.json says what ran."""
    cuda = torch.cuda.is_available()
    if args.model is None:
        args.model = default_model_name()
    if args.load_in_4bit is None:
        args.load_in_4bit = default_load_in_4bit(args.model, "cuda" if cuda else "cpu", args.init_adapter)
    if args.gradient_checkpointing is None:
        args.gradient_checkpointing = cuda
    args.dtype = resolve_dtype(args.dtype, "cuda" if cuda else "cpu", args.model)  # config.json says which ran
    if args.output_dir is None:
        args.output_dir = (f"runs/{args.env}-{args.algo}" + (f"-{args.preset}" if args.preset.startswith("cpu-") else "")
                           + ("-shuffled" if args.shuffle_rewards else ""))  # a placebo beside its run
    variable = env_class(args.env).data_variable
    if args.data_dir is None and variable and os.environ.get(variable):  # config.json says which data it played
        args.data_dir = os.environ[variable]
    if args.data_dir is not None:  # absolute: the same folder for every later reader, from any working folder
        args.data_dir = str(Path(args.data_dir).expanduser().resolve())


def resumed_values(given: dict, saved: dict) -> dict:
    """Flags given to a resume, as the run recorded such values: `--preset auto` and `--dtype auto` as
    what they resolve to, --data-dir absolute; `none` for a flag whose None the run resolved as it
    started (RESOLVED_AT_START) as that flag left out: the run's own value (--output-dir: its folder)."""
    given = {k: v for k, v in given.items() if v is not None or k not in RESOLVED_AT_START}
    if given.get("preset") == "auto":  # auto is what the run resolved it to when it started
        given = {k: v for k, v in given.items() if k != "preset"}
    if given.get("dtype") == "auto":  # auto is what it resolves to here
        device = "cuda" if torch.cuda.is_available() else "cpu"
        given = {**given, "dtype": resolve_dtype("auto", device, saved.get("model"))}
    if given.get("data_dir") is not None:  # the run recorded it absolute
        given = {**given, "data_dir": str(Path(given["data_dir"]).expanduser().resolve())}
    return given


def check_resumed(args: TrainArgs) -> None:
    """A resumed run's flags pass a new run's checks, and it plays the data it trained on: the folder
    config.json recorded (--data-dir, or the $ALFWORLD_DATA / $WEBSHOP_DATA it was started with), or
    the shipped data when it recorded none."""
    variable = env_class(args.env).data_variable
    now = os.environ.get(variable) if variable else None
    if args.data_dir is None and now:
        raise UserError(f"the run trained on the shipped {args.env} data, and ${variable} is set now "
                        f"({now}): unset it to continue the run, or start a new run on that data")
    if args.data_dir is not None and now and Path(now).expanduser().resolve() != Path(args.data_dir).expanduser().resolve():
        print(f"note: the run continues on the data it trained on, {args.data_dir}, not ${variable} "
              f"({now})", file=sys.stderr)
    check(args)


RESUME_RULES = ResumeRules(RESUME_MAY_CHANGE, SESSION_ONLY, LATER_FLAGS, resumed_values, check_resumed)


# ------------------------------------------------------------------ the checks
def check(args: TrainArgs) -> None:
    """Reject bad settings before anything loads, each naming its flag and what to do."""
    problems = check_domains(  # every float flag: the range its type declares (flags/__init__.py)
        args,
        positive=("iterations", "groups", "group_size", "max_new_tokens", "minibatches", "ppo_epochs",
                  "micro_batch_rows", "save_every", "keep_checkpoints", "lora_r", "lora_alpha", "eval_games"),
        non_negative=("env_workers", "max_steps", "max_plan_len", "eval_every", "samples_per_iter", "rollout_batch",
                      "lora_layers"),
    )
    if args.algo not in ALGORITHMS:
        problems.append(f"--algo {args.algo!r} is no algorithm of this project: choose one of {', '.join(ALGORITHMS)}")
    for flag, value, limit in (("--groups x --group-size (episodes per iteration)", args.groups * args.group_size,
                                MAX_EPISODES), ("--max-steps", args.max_steps, MAX_STEPS),
                               ("--max-new-tokens", args.max_new_tokens, MAX_NEW_TOKENS),
                               ("--minibatches x --ppo-epochs (optimizer steps per iteration)",
                                args.minibatches * args.ppo_epochs, MAX_OPTIMIZER_STEPS)):
        if value > limit:
            problems.append(f"{flag} is {value}, above this project's limit of {limit}: an iteration that size "
                            "would not finish in a day on one GPU (verl-agent's setting is 16 x 8, 50 steps, 256 tokens)")
    problems += history_problems(args.history)
    try:  # the env's class (its module imported now): an unknown name is envs/make.py's one line
        splits = env_class(args.env).splits
    except UserError as err:
        raise UserError("; ".join(problems + [str(err)])) from None
    for flag, split in (("--split", args.split), ("--eval-split", args.eval_split)):
        if split is not None and split not in splits:
            problems.append(f"{flag} for {args.env} must be one of {', '.join(splits)}; got {split!r}")
    if missing := dashboard.missing_package(args.report_to):
        problems.append(missing)
    algorithm = ALGORITHMS.get(args.algo)
    if algorithm is not None and algorithm.per_token and args.gap_tokens != "all":
        problems.append(f"--gap-tokens action is for the algorithms with a segment gap: {args.algo}'s multiplier is per "
                        f"token and reads no gap; drop the flag for --algo {args.algo}")
    if args.rollout == "vllm" and (problem := vllm_missing()):
        problems.append(problem)
    if args.init_adapter and args.load_in_4bit:
        problems.append("--init-adapter merges into full-precision weights: add --load-in-4bit False")
    if args.init_adapter and not (Path(args.init_adapter) / "adapter_config.json").is_file() and not args.resume:
        problems.append(f"--init-adapter {args.init_adapter}: no adapter_config.json there (pass a "
                        "tools/warmstart.py output folder, or none)")
    if args.load_in_4bit and args.model == "tiny":
        problems.append("--load-in-4bit: the tiny test model is built from its config and loads in float32 or bf16 only")
    env = env_class(args.env)
    given_data = args.data_dir or (env.data_variable and os.environ.get(env.data_variable))
    if args.preset in GPU_PRESETS and env.real_data and not args.demo_data and not given_data:
        problems.append(f"--preset {args.preset} trains on {args.env}'s real data, and none is given: "
                        f"{env.real_data}; or pass --demo-data to train on the shipped demo games on purpose")
    if problems:
        raise UserError("; ".join(problems))
    check_gpu(args)  # a GPU without bf16, or a setting it cannot hold: one line, before a model loads
    check_available(args.model)  # a model that cannot be had is one line, in seconds, before anything is made
    if args.group_size == 1:
        print("warning: --group-size 1 gives every trajectory advantage 0 (no group to compare with): "
              "nothing will be learned", file=sys.stderr)


def check_gpu(args: TrainArgs, card_gib: float | None = None, capability: tuple | None = None) -> None:
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
    env = env_class(args.env)
    prompt = memory.prompt_tokens(env.prompt_tokens, args.history, args.max_steps or env.default_max_steps)
    setting = memory.Setting(
        load_in_4bit=bool(args.load_in_4bit), fp32=args.dtype == "fp32", lora_r=args.lora_r,
        micro_batch_rows=args.micro_batch_rows, episodes=args.groups * args.group_size,
        rollout_batch=args.rollout_batch, prompt_tokens=prompt, max_new_tokens=args.max_new_tokens,
        kl=args.kl_coef > 0, rollout=args.rollout, vllm_gpu_memory=args.vllm_gpu_memory,
        gradient_checkpointing=bool(args.gradient_checkpointing))
    if problem := memory.fit_problem(shape, setting, card_gib, args.model):
        raise UserError(problem)


def check_tasks(args: TrainArgs, env) -> None:
    """The evaluation split holds the games --eval-games asks for: with --preset gpu (and not --demo-data) one
    line that stops the run before a model loads; elsewhere a warning that says how many each evaluation plays."""
    if not args.eval_every:
        return
    split = args.eval_split or env.default_eval_split
    have = len(env.tasks(split))
    if have < args.eval_games:
        short = f"the {split} split of {args.env}'s data holds {have} games, fewer than --eval-games {args.eval_games}"
        if args.preset in GPU_PRESETS and env.real_data and not args.demo_data:
            raise UserError(f"{short}: {env.real_data}; or lower --eval-games")
        print(f"warning: {short}: each evaluation plays those {have}", file=sys.stderr)


# ------------------------------------------------------------------ what a run says of its flags
def precision(dtype: str) -> str:
    """What --dtype means, in words (a resumed run keeps its saved dtype; runs before the flag were fp32)."""
    return {"bf16": "bf16 weights, float32 LoRA, head and loss", "fp32": "float32"}.get(dtype, dtype)


def describe(args: TrainArgs) -> str:
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
