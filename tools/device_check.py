"""Device check: what one GPU does with Qwen2.5-7B's shape (SHARPO's model), in one call of a few minutes.

Measures, for a Qwen2.5-7B-shaped model in nf4 4-bit with LoRA r 64 (random weights, built from its config:
no download; timings do not depend on the weights' values), built as training loads the real one (bitsandbytes
Linear4bit layers under peft's bitsandbytes LoRA layers, bf16 compute, non-reentrant gradient checkpointing),
the parts --parts names, in its order (the default: the first four, the call of results/gpu-h200/):
  decode     generated tokens/s of `generate` with the rollout's sampling config (rollout.py), lengths forced,
             at each --decode-batches batch size;
  prefill    the peak memory of one generate over --prefill-batches prompts of exactly --prefill-tokens
             ids (fed as ids; the JSON records the length measured), all at once and in --rollout-batch
             chunks (train.py's --rollout-batch);
  passes     tokens/s of the no-grad student pass (no KV cache kept) and of a forward + backward of the loss;
  iteration  one train.py iteration at the GPU default (SHARPO, --kl-coef 0.01: the reference pass over
             every row; --rollout hf; tools.bench's synthetic env: fixed observations, half the groups
             tied), seconds per stage and peak memory;
  compare    at each --decode-batches batch size, after one warm-up call, the same prompts decoded five ways:
             plain `generate` (greedy: no sampling processors, no log-prob scoring, no autocast), the same
             under bf16 autocast, the rollout's sampling config (the decode part), the rollout's own call
             (rollout.ModelPolicy with speed's shared prefixes, as train.py decodes), and plain at
             --short-prompt-tokens prompts: where the decode time goes;
  bf16-compare, bf16-prefill, bf16-passes, bf16-iteration: the same parts on the 7B shape in bf16 (no nf4),
             as an 80 GB or H200 run loads it (under "bf16" in the JSON);
  course-iteration: one iteration of the course card's model (the Qwen2.5-1.5B shape in bf16, LoRA r 32) at
             --preset course's sizes (16 episodes, 192 tokens a turn), --course-steps steps (under "course").
One model is held at a time, built when a part first needs it (the previous one freed). Each part's figures
are written to the JSON as soon as they are measured (replaced whole, never half-written), so a crash in a
later part keeps the earlier ones; a part that would start past --budget-s is recorded as skipped. Beside each
peak the JSON holds infra/memory.py's figure for it (`planned_gb`). The machine needs torch, transformers,
peft and bitsandbytes: no alfworld, no WebShop packages.

`--model tiny` runs the same code on a CPU in seconds, bitsandbytes' 4-bit layers included (CI's dry run).
`--slim-wheel DIR` cuts the bitsandbytes wheel in DIR to the libraries a CUDA 13 machine loads and prints the
carry arithmetic of the device call (docs/scaling.md gives the whole command, and the next calls' --parts).

Run (on the GPU machine): python -m tools.device_check --out $OUT/device_check.json
     (a dry run here):      python -m tools.device_check --model tiny --parts all --out /tmp/device_check.json
"""
from __future__ import annotations

import errors  # first: a Ctrl-C or kill while the imports below load is one line

errors.quiet_start(__name__)
# isort: split

import gc
import json
import os
import platform
import re
import subprocess
import sys
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

import infra.models  # noqa: F401  first: it quiets two third-party notices before peft loads bitsandbytes
# isort: split
import torch
from transformers import GenerationConfig

from infra import memory
from infra.cli import UserError, check_domains, float_in, given_flags, parse_dataclass, run
from infra.metrics import peak_memory_gb, reset_peak_memory
from infra.models import QWEN1_5B_SHAPE, QWEN7B_SHAPE, TINY_SHAPE, shape_model
from rollout import ModelPolicy, autocast, generation_prompt_ids, sampling_config
from segments import Row
from speed import FastPath, collate_rows, response_logprobs

CARRY_LIMIT_MIB = 64  # what one device call may carry: the working tree and the carried paths together
COURSE = dict(groups=4, group_size=4, max_new_tokens=192, lora_r=32)  # --preset course (tests/test_device_check.py)


@dataclass
class DeviceCheckArgs:
    """Command-line flags of device_check.py."""

    model: str = "qwen7b-shape"  # qwen7b-shape (CUDA) | tiny (the CPU dry run, the same layers at a tiny shape)
    parts: str = "decode,prefill,passes,iteration"  # the parts to run, in order, comma-separated (PARTS; all: every one)
    decode_batches: str = "64,128"  # batch sizes timed for decoding, comma-separated
    prompt_tokens: int = 1024  # prompt length of each decoded sequence (a few turns of ALFWorld)
    short_prompt_tokens: int = 400  # compare: the prompt length of its plain-at-short-prompts way (ALFWorld's mean)
    new_tokens: int = 128  # generated tokens per sequence (forced: min = max)
    compare_repeats: int = 1  # compare: timed calls of each way after the one warm-up call; the figure is the best
    prefill_batches: str = "32,128"  # batch sizes whose generate peak memory is measured, comma-separated
    prefill_tokens: int = 780  # prompt length in that measurement (the memory plan's: 128 x 780 at 24 GB)
    rollout_batch: int = 32  # the chunk train.py's --rollout-batch would generate at once, in that measurement
    rows: int = 4  # rows per no-grad and update pass (train.py's --micro-batch-rows)
    row_tokens: int = 4096  # tokens per row in those passes
    response_tokens: int = 256  # of which the response (the tokens scored)
    repeats: int = 2  # timed calls per part after one warm-up; the figure is the best
    iteration_episodes: int = 16  # the iteration: episodes (groups of 4)
    iteration_steps: int = 3  # env steps per episode
    iteration_new_tokens: int = 128  # forced response length per turn
    iteration_obs_words: int = 700  # words per observation (course-iteration's too)
    course_steps: int = 20  # course-iteration: env steps per episode (--preset course's --max-steps)
    budget_s: float_in("[0, inf)") = 480.0  # stop starting parts once this many seconds have passed
    out: str | None = None  # the JSON, written part by part; default $OUT/device_check.json where $OUT is set
    slim_wheel: str = ""  # a folder holding the bitsandbytes wheel: cut it to CUDA 13's libraries, print the carry


TINY = dict(decode_batches="4,8", prompt_tokens=64, short_prompt_tokens=24, new_tokens=8, prefill_batches="8,32",
            prefill_tokens=48, rollout_batch=8, rows=2, row_tokens=128, response_tokens=16, repeats=1,
            iteration_episodes=8, iteration_steps=2, iteration_new_tokens=4, iteration_obs_words=20, course_steps=2)
# The models a part runs on: (section of the JSON, None = its top level; shape; LoRA r; 4-bit), at full size and tiny.
MODELS = {
    "nf4": (None, QWEN7B_SHAPE, 64, True),
    "bf16": ("bf16", QWEN7B_SHAPE, 64, False),
    "course": ("course", QWEN1_5B_SHAPE, COURSE["lora_r"], False),
}
TINY_MODELS = {"nf4": (TINY_SHAPE, 8), "bf16": (TINY_SHAPE, 8), "course": ({**TINY_SHAPE, "tie_word_embeddings": True}, 8)}
# --parts: each part's model and what it measures (the parts of a per-batch kind run once a --decode-batches size).
PARTS = {
    "decode": "nf4", "prefill": "nf4", "passes": "nf4", "iteration": "nf4", "compare": "nf4",
    "bf16-compare": "bf16", "bf16-prefill": "bf16", "bf16-passes": "bf16", "bf16-iteration": "bf16",
    "course-iteration": "course",
}
# The two calls docs/scaling.md plans after results/gpu-h200/ (the dry run runs every part: --parts all).
NEXT_CALLS = {
    1: "course-iteration,bf16-compare,bf16-passes,bf16-prefill,compare",  # --decode-batches 64 --course-steps 5
    2: "bf16-iteration,bf16-compare",  # --decode-batches 128 --iteration-episodes 64 --iteration-steps 4
}


def build(args: DeviceCheckArgs, kind: str = "nf4"):
    """(model, tokenizer, device): a part's model (MODELS) on CUDA, or the same build at a tiny shape on the CPU."""
    if args.model == "qwen7b-shape":
        if not torch.cuda.is_available():
            raise UserError("--model qwen7b-shape needs a CUDA GPU (about 6 GB of weights in 4-bit); "
                            "--model tiny dry-runs this check on a CPU")
        _, shape, lora_r, four_bit = MODELS[kind]
        return (*shape_model("cuda", shape, lora_r, load_in_4bit=four_bit), "cuda")
    if args.model != "tiny":
        raise UserError(f"--model must be qwen7b-shape or tiny; got {args.model}")
    shape, lora_r = TINY_MODELS[kind]
    return (*shape_model("cpu", shape, lora_r, load_in_4bit=MODELS[kind][3]), "cpu")


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn) -> float:
    """Seconds of one call, the GPU's work included."""
    sync()
    clock = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - clock


def best_seconds(fn, repeats: int) -> float:
    """One warm-up call, then the fastest of `repeats` timed calls."""
    fn()
    return min(timed(fn) for _ in range(repeats))


def random_ids(n: int, vocab: int, gen: torch.Generator) -> list[int]:
    return torch.randint(10, vocab, (n,), generator=gen).tolist()  # clear of the special ids at the start


def built(model) -> dict:
    """What training will run on: the LoRA layer and base layer types, bytes of weights, the flags that matter."""
    lora = {type(m).__module__ + "." + type(m).__name__ for m in model.modules() if hasattr(m, "base_layer")}
    base = {type(m.base_layer).__module__ + "." + type(m.base_layer).__name__ for m in model.modules()
            if hasattr(m, "base_layer")}
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"lora_layers": sorted(lora), "base_layers": sorted(base), "weights_gb": weights / 2**30,
            "gradient_checkpointing": checkpointing(model.get_base_model()),
            "compute_dtype": str(model.get_input_embeddings().weight.dtype)}


def decode_rate(model, tokenizer, device: str, batch: int, args: DeviceCheckArgs, gen) -> float:
    """Generated tokens/s of one batched `generate` of `batch` prompts, lengths forced."""
    vocab = model.get_input_embeddings().weight.shape[0]
    ids = torch.tensor([random_ids(args.prompt_tokens, vocab, gen) for _ in range(batch)], device=device)
    config = sampling_config(tokenizer, model, args.new_tokens, 1.0)
    config.min_new_tokens = args.new_tokens  # forced lengths: timing only

    def call():
        with torch.no_grad(), autocast(model):
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)

    model.eval()
    return batch * args.new_tokens / best_seconds(call, args.repeats)


def decode_compared(model, tokenizer, device: str, batch: int, args: DeviceCheckArgs, gen) -> dict:
    """Generated tokens/s of the same `batch` prompts decoded five ways (the compare part), each timed
    --compare-repeats times after one warm-up call of the plain way; every call's seconds are kept."""
    vocab = model.get_input_embeddings().weight.shape[0]
    prompts = [random_ids(args.prompt_tokens, vocab, gen) for _ in range(batch)]
    ids = torch.tensor(prompts, device=device)
    short = ids[:, -args.short_prompt_tokens:]
    # plain: greedy, no logits processor or warper, no scores kept, lengths by max_new_tokens alone (no end id)
    plain = GenerationConfig(max_new_tokens=args.new_tokens, do_sample=False, eos_token_id=None,
                             pad_token_id=tokenizer.pad_token_id, use_cache=True)
    sampled = sampling_config(tokenizer, model, args.new_tokens, 1.0)
    sampled.min_new_tokens = args.new_tokens  # forced lengths, as the decode part
    policy = ModelPolicy(model, tokenizer, args.new_tokens, 1.0, batch=0, generate=FastPath(tokenizer.pad_token_id).generate)
    policy.config.min_new_tokens = args.new_tokens  # the rollout's own call, lengths forced (tools.bench's way)
    steps = {}

    def generate(x, config, cast: bool):
        def call():
            model.generation_config = config  # installed, so that no default of the model's is merged in
            with torch.no_grad(), autocast(model) if cast else torch.autocast(device, enabled=False):
                out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), generation_config=config)
            steps[id(config)] = out.shape[1] - x.shape[1]  # columns decoded (the batch runs to its longest row)
        return call

    def rollout():
        policy.generate(prompts)
        steps[id(policy)] = args.new_tokens

    ways = {"plain": (generate(ids, plain, False), plain, batch), "autocast": (generate(ids, plain, True), plain, batch),
            "sampled": (generate(ids, sampled, True), sampled, batch), "rollout": (rollout, policy, batch),
            f"plain_prompt{args.short_prompt_tokens}": (generate(short, plain, False), plain, batch)}
    model.eval()
    out = {"prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "warmup_s": timed(ways["plain"][0])}
    seconds = {}
    for name, (call, key, rows) in ways.items():
        seconds[name] = [timed(call) for _ in range(args.compare_repeats)]
        out[f"{name}_tok_s"] = rows * steps[id(key)] / min(seconds[name])
    out["seconds"] = seconds
    out["steps"] = {name: steps[id(key)] for name, (_, key, _) in ways.items()}  # decoding steps each call ran
    out["peak_memory_gb"] = peak_memory_gb()
    return out


def warm_up(model, tokenizer, device: str, gen) -> None:
    """One short generate and one forward + backward, untimed: a part that runs first on its model (a fresh
    process, CUDA's kernels not yet loaded) times the work, not the start. (The nf4 parts keep the way of
    results/gpu-h200/: the decode parts ran first there, each after a warm-up call of its own.)"""
    vocab = model.get_input_embeddings().weight.shape[0]
    ids = torch.tensor([random_ids(64, vocab, gen) for _ in range(4)], device=device)
    config = GenerationConfig(max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=tokenizer.pad_token_id)
    model.generation_config = config
    model.eval()
    with torch.no_grad(), autocast(model):
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
    model.train()
    batch = {k: v.to(device) for k, v in collate_rows([Row(r, 48) for r in ids.tolist()], tokenizer.pad_token_id).items()}
    response_logprobs(model, batch).sum().backward()
    model.zero_grad(set_to_none=True)
    sync()


def prefill_peaks(model, tokenizer, args: DeviceCheckArgs, gen) -> dict:
    """Peak memory (GB) of one rollout generate (ModelPolicy.generate) over each --prefill-batches count of
    prompts of exactly --prefill-tokens ids, all at once and in --rollout-batch chunks: generate's prefill
    runs every prompt of a call in one forward. The prompts go in as ids (text would re-tokenize to
    another length); the JSON records the prompt length measured."""
    vocab = model.get_input_embeddings().weight.shape[0]
    out = {}
    for n in [int(b) for b in args.prefill_batches.split(",") if b.strip()]:
        prompts = [random_ids(args.prefill_tokens, vocab, gen) for _ in range(n)]
        for name, chunk in (("at_once", 0), (f"in_chunks_of_{args.rollout_batch}", args.rollout_batch)):
            policy = ModelPolicy(model, tokenizer, max_new_tokens=1, batch=chunk)
            sync()
            reset_peak_memory()
            played = policy.generate(prompts)
            sync()
            out[f"prefill_peak_gb_batch{n}_{name}"] = peak_memory_gb()
            out["prefill_prompt_tokens"] = sum(len(p) for p, _, _ in played) / len(played)
    return out


def pass_rates(model, tokenizer, device: str, args: DeviceCheckArgs, gen) -> dict:
    """Tokens/s of the no-grad student pass and of one forward + backward over the same rows."""
    vocab = model.get_input_embeddings().weight.shape[0]
    prompt = args.row_tokens - args.response_tokens
    rows = [Row(ids, prompt) for ids in (random_ids(args.row_tokens, vocab, gen) for _ in range(args.rows))]
    batch = {k: v.to(device) for k, v in collate_rows(rows, tokenizer.pad_token_id).items()}
    tokens = args.rows * args.row_tokens

    def no_grad():
        with torch.no_grad():
            response_logprobs(model, batch)

    def update():
        logp = response_logprobs(model, batch)
        (-logp.sum() / batch["response_len"].sum()).backward()
        model.zero_grad(set_to_none=True)

    model.eval()
    out = {"no_grad_tok_s": tokens / best_seconds(no_grad, args.repeats)}
    model.train()
    reset_peak_memory()
    out["update_tok_s"] = tokens / best_seconds(update, args.repeats)
    out["update_peak_gb"] = peak_memory_gb()
    return out


def synthetic_prompt_tokens(tokenizer, obs_words: int) -> int:
    """The prompt length of every turn of tools.bench's synthetic env (each turn's prompt is the same length)."""
    from tools.bench import SyntheticEnv

    env = SyntheticEnv(1, obs_words)
    state = env.reset(["task-0"])[0]
    return len(generation_prompt_ids(tokenizer, env.build_messages(state, [], 2)))


def iteration_stages(model, tokenizer, args: DeviceCheckArgs, course: bool = False) -> dict:
    """Seconds per stage of one train.py iteration (SHARPO, --rollout hf) on tools.bench's synthetic env: at
    --iteration-* sizes, or (course) at --preset course's with --course-steps steps."""
    import train
    from tools.bench import SyntheticEnv, forced_lengths, timed_iteration

    group_size = COURSE["group_size"] if course else 4
    groups = COURSE["groups"] if course else max(1, args.iteration_episodes // group_size)
    steps = args.course_steps if course else args.iteration_steps
    new_tokens = COURSE["max_new_tokens"] if course else args.iteration_new_tokens
    flags = dict(preset="none", model="tiny", algo="sharpo", groups=groups, group_size=group_size, max_steps=steps,
                 max_new_tokens=new_tokens, dtype="bf16", hindsight="expert", eval_every=0, iterations=2,
                 rollout="hf", output_dir="/tmp/sharpo-device-check")  # the model is passed in: --model only names a placeholder
    # the GPU default --kl-coef 0.01: a reference pass over every row, the one stage the plan estimates alone
    targs = train.parse_args([f"--{k.replace('_', '-')}={v}" for k, v in flags.items()])
    env = SyntheticEnv(steps, args.iteration_obs_words, group_size, 0.5)
    trainer = forced_lengths(train.Trainer(targs, model=model, tokenizer=tokenizer, env=env), new_tokens)
    out = timed_iteration(trainer)  # no warm-up: the decode and pass parts above warmed the kernels
    # what the memory plan needs of it: every prompt of a turn is the same (prefilled once), its length
    out.update(episodes=groups * group_size, steps=steps, new_tokens=new_tokens, micro_batch_rows=targs.micro_batch_rows,
               prompt_tokens=synthetic_prompt_tokens(tokenizer, args.iteration_obs_words))
    return out


def planned_peaks(found: dict, args: dict, shape: memory.Shape, load_in_4bit: bool = True, lora_r: int = 64,
                  tokenizer=None) -> dict:
    """infra/memory.py's figure (GiB) for each peak one model's figures hold (`found`: the JSON's top level, or
    its "bf16" or "course" section), from the device check's args: {key of the peak: GiB}. Each part holds no
    optimizer state ("none"); the iteration is a run's first ("first"), its prompts all alike, prefilled once.
    tests/test_memory.py holds the H200's peaks to these within 10%."""
    base = memory.Setting(load_in_4bit=load_in_4bit, lora_r=lora_r, optimizer="none")

    def phase(name: str, **changes) -> float:
        return memory.plan(shape, memory.Setting(**{**base.__dict__, **changes}))["phases"][name]

    out = {}
    if "build" in found:
        out["build.weights_gb"] = memory.parameter_bytes(shape, base) / memory.GIB
    for key, value in found.items():
        if m := re.fullmatch(r"prefill_peak_gb_batch(\d+)_(?:at_once|in_chunks_of_(\d+))", key):
            out[key] = phase("rollout", episodes=int(m[1]), rollout_batch=int(m[2] or 0),
                             prompt_tokens=args["prefill_tokens"], max_new_tokens=1)
        elif m := re.fullmatch(r"peak_memory_gb_after_decode(?:_compared)?_batch_(\d+)", key):
            out[key] = phase("rollout", episodes=int(m[1]), prompt_tokens=args["prompt_tokens"],
                             max_new_tokens=args["new_tokens"])
    if "update_peak_gb" in found:
        out["update_peak_gb"] = phase("update", micro_batch_rows=args["rows"], max_new_tokens=args["response_tokens"],
                                      prompt_tokens=args["row_tokens"] - args["response_tokens"])
    if isinstance(found.get("iteration"), dict) and "peak_memory_gb" in found["iteration"]:
        it = found["iteration"]
        prompt = it.get("prompt_tokens") or synthetic_prompt_tokens(
            tokenizer or infra.models.build_tiny_tokenizer(), args["iteration_obs_words"])
        s = memory.Setting(**{**base.__dict__, "optimizer": "first", "prefill_prompts": 1,
                              "episodes": it.get("episodes", max(1, args["iteration_episodes"] // 4) * 4),
                              "micro_batch_rows": it.get("micro_batch_rows", 4), "prompt_tokens": prompt,
                              "max_new_tokens": it.get("new_tokens", args["iteration_new_tokens"])})
        out["iteration.peak_memory_gb"] = memory.plan(shape, s)["peak"]
    return out


def write_json(path: Path | None, found: dict) -> None:
    """The figures so far, replacing the file whole (a temporary name, then a rename)."""
    if path is None:
        return
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(found, indent=1))
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- the carry
def checkpointing(model) -> bool:
    """Whether the model recomputes activations in the backward (transformers 5.24's name, or the older one:
    infra/models.checkpoint_activations sets it by either)."""
    if hasattr(model, "is_activation_checkpointing"):
        return bool(model.is_activation_checkpointing)
    return bool(getattr(model, "is_gradient_checkpointing", False))


def slim_bitsandbytes(folder: Path) -> Path:
    """The bitsandbytes wheel in `folder`, rewritten without the libraries a CUDA 13 machine does not load
    (other CUDA versions, ROCm, XPU): bitsandbytes picks libbitsandbytes_cuda<major><minor>.so by torch's CUDA
    version, and the GPU machine's torch 2.11 is built for CUDA 13. Replaces the wheel in place."""
    wheels = sorted(folder.glob("bitsandbytes-*.whl"))
    if len(wheels) != 1:
        raise UserError(f"{folder}: expected one bitsandbytes wheel, found {len(wheels)} (pip download it there first)")
    wheel = wheels[0]
    tmp = wheel.with_suffix(".slim")
    try:
        dropped = write_slim(wheel, tmp)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, UnicodeDecodeError) as err:
        tmp.unlink(missing_ok=True)
        raise UserError(f"{wheel} is not a whole wheel ({type(err).__name__}: a damaged or partial download): "
                        f"pip download bitsandbytes==0.50.2 into {folder} again") from None
    os.replace(tmp, wheel)
    print(f"{wheel.name}: {dropped} libraries for other CUDA, ROCm and XPU versions dropped")
    return wheel


def write_slim(wheel: Path, tmp: Path) -> int:
    """The wheel's files into `tmp`, less the libraries slim_bitsandbytes drops; returns how many it dropped."""
    dropped = 0
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            name = Path(item.filename).name
            if name.startswith("libbitsandbytes_") and not (name.startswith("libbitsandbytes_cuda13")
                                                             or name.startswith("libbitsandbytes_cpu")):
                dropped += 1
                continue
            data = src.read(item)
            if item.filename.endswith(".dist-info/RECORD"):  # the dropped files leave the record too
                keep = [line for line in data.decode().splitlines() if not (
                    Path(line.split(",")[0]).name.startswith("libbitsandbytes_")
                    and not Path(line.split(",")[0]).name.startswith(("libbitsandbytes_cuda13", "libbitsandbytes_cpu")))]
                data = ("\n".join(keep) + "\n").encode()
            dst.writestr(item, data)
    return dropped


def carry_arithmetic(carried: list[Path]) -> dict:
    """MiB of what a device call sends: the files git tracks and the untracked ones it does not ignore, and the
    carried paths; against the limit."""
    root = Path(__file__).resolve().parent.parent
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    tree = sum((root / p).stat().st_size for p in listed if p and (root / p).is_file())
    extra = sum(f.stat().st_size for c in carried for f in ([c] if c.is_file() else c.rglob("*")) if f.is_file())
    out = {"tree_mib": tree / 2**20, "carried_mib": extra / 2**20, "total_mib": (tree + extra) / 2**20,
           "limit_mib": CARRY_LIMIT_MIB}
    print(f"carry: the tree {out['tree_mib']:.1f} MiB + carried {out['carried_mib']:.1f} MiB = {out['total_mib']:.1f} MiB "
          f"of the {CARRY_LIMIT_MIB} MiB a device call may carry")
    if out["total_mib"] > CARRY_LIMIT_MIB:
        raise UserError(f"{out['total_mib']:.1f} MiB is over the {CARRY_LIMIT_MIB} MiB a device call carries")
    return out


# ----------------------------------------------------------------------------- the check
def part_list(args: DeviceCheckArgs, batches: list[int]) -> list[tuple[str, str, str]]:
    """(name, kind, model) of each part --parts asks for, in its order; a per-batch kind once a batch size."""
    kinds = list(PARTS) if args.parts.strip() == "all" else [k.strip() for k in args.parts.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in PARTS]
    if unknown or not kinds:
        raise UserError(f"--parts takes some of {', '.join(PARTS)} (or all), comma-separated; got {args.parts!r}")
    names = {"decode": "decode batch {}", "prefill": "prefill", "passes": "no-grad and update passes",
             "iteration": "one iteration", "compare": "decode compared batch {}"}
    out = []
    for kind in kinds:
        model = PARTS[kind]
        base = names[kind.split("-", 1)[-1]]
        prefix = "" if model == "nf4" else f"{model} "
        out += [(prefix + base.format(b), kind, model) for b in (batches if "{}" in base else [None])]
    return out


def main(argv: list[str] | None = None) -> dict:
    args = parse_dataclass(DeviceCheckArgs, argv, description=__doc__)
    if problems := check_domains(args):
        raise UserError("; ".join(problems))
    if args.slim_wheel:
        slim_bitsandbytes(Path(args.slim_wheel))
        return carry_arithmetic([Path(args.slim_wheel)])
    if args.model == "tiny":
        given, _ = given_flags(DeviceCheckArgs, sys.argv[1:] if argv is None else argv)
        for key, value in TINY.items():  # the dry run's sizes, unless a flag says otherwise
            if key not in given:
                setattr(args, key, value)
    try:
        batches = [int(b) for b in args.decode_batches.split(",") if b.strip()]
        [int(b) for b in args.prefill_batches.split(",") if b.strip()]
    except ValueError:
        raise UserError("--decode-batches and --prefill-batches take integers separated by commas") from None
    if not batches or min(batches) < 1 or args.response_tokens >= args.row_tokens or min(
            args.rows, args.row_tokens, args.response_tokens, args.new_tokens, args.prompt_tokens, args.repeats,
            args.rollout_batch, args.prefill_tokens, args.compare_repeats, args.short_prompt_tokens,
            args.course_steps) < 1:
        raise UserError("device_check: batch sizes, rows, lengths and --repeats must be >= 1, "
                        "and --response-tokens below --row-tokens")
    parts = part_list(args, batches)
    if args.model not in ("qwen7b-shape", "tiny"):
        raise UserError(f"--model must be qwen7b-shape or tiny; got {args.model}")
    if args.model == "qwen7b-shape" and not torch.cuda.is_available():
        build(args)  # says what is missing, in one line
    out = Path(args.out) if args.out else (Path(os.environ["OUT"]) / "device_check.json" if os.environ.get("OUT") else None)
    if out is None:
        print("device check: no --out and no $OUT: the figures are printed only")
    start = time.perf_counter()
    elapsed = lambda: time.perf_counter() - start  # noqa: E731
    import transformers

    device = "cuda" if args.model == "qwen7b-shape" else "cpu"
    found = {"model": args.model, "torch": torch.__version__, "transformers": transformers.__version__,
             "python": platform.python_version(), "args": asdict(args), "done": [], "skipped": [],
             "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"}
    write_json(out, found)  # the versions, even if the build fails
    print(f"device check: {args.model} on {found['device']} (torch {torch.__version__}, transformers "
          f"{transformers.__version__}), budget {args.budget_s:.0f}s: {', '.join(name for name, _, _ in parts)}",
          flush=True)
    gen = torch.Generator().manual_seed(0)
    held = {}  # the one model held: kind -> (model, tokenizer, shape)

    def model_for(kind: str):
        if kind not in held:
            held.clear()  # the previous model's memory freed before the next one is built
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
            clock = time.perf_counter()
            reset_peak_memory()
            model, tokenizer, _ = build(args, kind)
            section = found if MODELS[kind][0] is None else found.setdefault(MODELS[kind][0], {})
            section["build"] = {**built(model), "seconds": time.perf_counter() - clock, "peak_memory_gb": peak_memory_gb()}
            if kind == "nf4":
                found["done"].append("build")
            write_json(out, found)
            print(f"  built {kind} in {time.perf_counter() - clock:.1f}s: {', '.join(section['build']['lora_layers'])}",
                  flush=True)
            held[kind] = [model, tokenizer, memory.Shape.of(model.get_base_model().config), False]  # False: not run yet
        return held[kind][:3]

    for name, kind, which in parts:
        if elapsed() > args.budget_s:
            found["skipped"].append(name)
            write_json(out, found)
            print(f"  {name}: skipped (past the {args.budget_s:.0f}s budget)")
            continue
        model = tokenizer = None  # the last part's model is not kept alive while another is built
        model, tokenizer, shape = model_for(which)
        if not held[which][3] and which != "nf4":  # its first part: kernels warmed before anything is timed
            warm_up(model, tokenizer, device, gen)
        held[which][3] = True
        section = found if MODELS[which][0] is None else found[MODELS[which][0]]
        batch = int(name.rsplit(" ", 1)[1]) if "batch" in name else None
        clock = time.perf_counter()
        reset_peak_memory()
        base = kind.split("-", 1)[-1]
        if base == "decode":
            result = {f"decode_tok_s_batch{batch}": decode_rate(model, tokenizer, device, batch, args, gen)}
        elif base == "compare":
            result = {f"decode_compared_batch{batch}": decode_compared(model, tokenizer, device, batch, args, gen)}
        elif base == "prefill":
            result = prefill_peaks(model, tokenizer, args, gen)
        elif base == "passes":
            result = pass_rates(model, tokenizer, device, args, gen)
        else:
            result = {"iteration": iteration_stages(model, tokenizer, args, course=which == "course")}
        section.update(result)
        short = name.removeprefix(f"{which} ") if which != "nf4" else name
        section[f"peak_memory_gb_after_{short.replace(' ', '_')}"] = peak_memory_gb()
        _, _, lora_r, four_bit = MODELS[which]
        section["planned_gb"] = planned_peaks(section, asdict(args), shape, four_bit,
                                              TINY_MODELS[which][1] if args.model == "tiny" else lora_r, tokenizer)
        found["done"].append(name)
        write_json(out, found)  # this part's figures are kept, whatever the next part does
        shown = {k: v for k, v in result.items() if isinstance(v, float)}
        for v in result.values():
            if isinstance(v, dict):
                shown.update({k: x for k, x in v.items() if k.endswith("_tok_s") or k.startswith("seconds/")})
        print(f"  {name} ({time.perf_counter() - clock:.0f}s): " + ", ".join(
            f"{k} {v:,.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in shown.items())
            + f"; peak {peak_memory_gb():.2f} GB", flush=True)
    found["seconds"] = elapsed()
    write_json(out, found)
    print(f"device check done in {found['seconds']:.0f}s" + (f": {out}" if out else ""))
    return found


if __name__ == "__main__":
    run(main)
