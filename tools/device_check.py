"""Device check: what one GPU does with the paper's model shape, in one call of a few minutes.

Measures, for a Qwen2.5-7B-shaped model in nf4 4-bit with LoRA r 64 (random weights, built from its config:
no download; timings do not depend on the weights' values), built as training loads the real one (bitsandbytes
Linear4bit layers under peft's bitsandbytes LoRA layers, bf16 compute, non-reentrant gradient checkpointing):
  - build:   the layer types training will use, the weights' memory;
  - decode:  generated tokens/s of plain `generate` (rollout.py's sampling config, lengths forced) at each
             --decode-batches batch size;
  - prefill: the peak memory of one generate over --prefill-batches prompts of exactly --prefill-tokens
             ids (fed as ids; the JSON records the length measured), all at once and in --rollout-batch
             chunks (train.py's --rollout-batch);
  - passes:  tokens/s of the no-grad student pass (no KV cache kept) and of a forward + backward of the loss;
  - iteration: one train.py iteration at the GPU default (SHARPO, --kl-coef 0.01: the reference pass over
             every row; --rollout hf; tools.bench's synthetic env: fixed observations, half the groups
             tied), seconds per stage and peak memory.
Each part's figures are written to the JSON as soon as they are measured (replaced whole, never half-written),
so a crash in a later part keeps the earlier ones; a part that would start past --budget-s is recorded as
skipped. The machine needs torch, transformers, peft and bitsandbytes: no alfworld, no WebShop packages.

`--model tiny` runs the same code on a CPU in seconds, bitsandbytes' 4-bit layers included (CI's dry run).
`--slim-wheel DIR` cuts the bitsandbytes wheel in DIR to the libraries a CUDA 13 machine loads and prints the
carry arithmetic of the device call (docs/scaling.md gives the whole command).

Run (on the GPU machine): python -m tools.device_check --out $OUT/device_check.json
     (a dry run here):      python -m tools.device_check --model tiny --out /tmp/device_check.json
"""
from __future__ import annotations

import errors  # first: a Ctrl-C or kill while the imports below load is one line

errors.quiet_start(__name__)
# isort: split

import json
import os
import platform
import subprocess
import sys
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

import infra.models  # noqa: F401  first: it quiets two third-party notices before peft loads bitsandbytes
# isort: split
import torch

from infra.cli import UserError, given_flags, parse_dataclass, run
from infra.metrics import peak_memory_gb, reset_peak_memory
from infra.models import TINY_SHAPE, qwen7b_shape_model
from rollout import ModelPolicy, autocast, sampling_config
from speed import collate_rows, response_logprobs
from segments import Row

CARRY_LIMIT_MIB = 64  # what one device call may carry: the working tree and the carried paths together


@dataclass
class DeviceCheckArgs:
    """Command-line flags of device_check.py."""

    model: str = "qwen7b-shape"  # qwen7b-shape (CUDA) | tiny (the CPU dry run, the same 4-bit layers)
    decode_batches: str = "64,128"  # batch sizes timed for decoding, comma-separated
    prompt_tokens: int = 1024  # prompt length of each decoded sequence (a few turns of ALFWorld)
    new_tokens: int = 128  # generated tokens per sequence (forced: min = max)
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
    iteration_obs_words: int = 700  # words per observation
    budget_s: float = 480.0  # stop starting parts once this many seconds have passed
    out: str | None = None  # the JSON, written part by part; default $OUT/device_check.json where $OUT is set
    slim_wheel: str = ""  # a folder holding the bitsandbytes wheel: cut it to CUDA 13's libraries, print the carry


TINY = dict(decode_batches="4,8", prompt_tokens=64, new_tokens=8, prefill_batches="8,32", prefill_tokens=48,
            rollout_batch=8, rows=2, row_tokens=128, response_tokens=16, repeats=1, iteration_episodes=8,
            iteration_steps=2, iteration_new_tokens=4, iteration_obs_words=20)


def build(args: DeviceCheckArgs):
    """(model, tokenizer, device): the 7B shape in nf4 on CUDA, or the same build at a tiny shape on the CPU."""
    if args.model == "qwen7b-shape":
        if not torch.cuda.is_available():
            raise UserError("--model qwen7b-shape needs a CUDA GPU (about 6 GB of weights in 4-bit); "
                            "--model tiny dry-runs this check on a CPU")
        return (*qwen7b_shape_model("cuda"), "cuda")
    if args.model != "tiny":
        raise UserError(f"--model must be qwen7b-shape or tiny; got {args.model}")
    return (*qwen7b_shape_model("cpu", TINY_SHAPE, lora_r=8), "cpu")


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def best_seconds(fn, repeats: int) -> float:
    """One warm-up call, then the fastest of `repeats` timed calls."""
    fn()
    times = []
    for _ in range(repeats):
        sync()
        clock = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - clock)
    return min(times)


def random_ids(n: int, vocab: int, gen: torch.Generator) -> list[int]:
    return torch.randint(10, vocab, (n,), generator=gen).tolist()  # clear of the special ids at the start


def built(model) -> dict:
    """What training will run on: the LoRA layer and base layer types, bytes of weights, the flags that matter."""
    lora = {type(m).__module__ + "." + type(m).__name__ for m in model.modules() if hasattr(m, "base_layer")}
    base = {type(m.base_layer).__module__ + "." + type(m.base_layer).__name__ for m in model.modules()
            if hasattr(m, "base_layer")}
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"lora_layers": sorted(lora), "base_layers": sorted(base), "weights_gb": weights / 2**30,
            "gradient_checkpointing": bool(getattr(model.get_base_model(), "is_gradient_checkpointing", False)),
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


def iteration_stages(model, tokenizer, args: DeviceCheckArgs) -> dict:
    """Seconds per stage of one train.py iteration (SHARPO, --rollout hf) on tools.bench's synthetic env."""
    import train
    from tools.bench import SyntheticEnv, forced_lengths, timed_iteration

    group_size = 4
    flags = dict(preset="none", model="tiny", algo="sharpo", groups=max(1, args.iteration_episodes // group_size),
                 group_size=group_size, max_steps=args.iteration_steps, max_new_tokens=args.iteration_new_tokens,
                 dtype="bf16", hindsight="expert", eval_every=0, iterations=2, rollout="hf",
                 output_dir="/tmp/sharpo-device-check")  # the model is passed in: --model only names a placeholder
    # the GPU default --kl-coef 0.01: a reference pass over every row, the one stage the plan estimates alone
    targs = train.parse_args([f"--{k.replace('_', '-')}={v}" for k, v in flags.items()])
    env = SyntheticEnv(args.iteration_steps, args.iteration_obs_words, group_size, 0.5)
    trainer = forced_lengths(train.Trainer(targs, model=model, tokenizer=tokenizer, env=env), args.iteration_new_tokens)
    return timed_iteration(trainer)  # no warm-up: the decode and pass parts above warmed the kernels


def write_json(path: Path | None, found: dict) -> None:
    """The figures so far, replacing the file whole (a temporary name, then a rename)."""
    if path is None:
        return
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(found, indent=1))
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- the carry
def slim_bitsandbytes(folder: Path) -> Path:
    """The bitsandbytes wheel in `folder`, rewritten without the libraries a CUDA 13 machine does not load
    (other CUDA versions, ROCm, XPU): bitsandbytes picks libbitsandbytes_cuda<major><minor>.so by torch's CUDA
    version, and the GPU machine's torch 2.11 is built for CUDA 13. Replaces the wheel in place."""
    wheels = sorted(folder.glob("bitsandbytes-*.whl"))
    if len(wheels) != 1:
        raise UserError(f"{folder}: expected one bitsandbytes wheel, found {len(wheels)} (pip download it there first)")
    wheel = wheels[0]
    tmp = wheel.with_suffix(".slim")
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
    os.replace(tmp, wheel)
    print(f"{wheel.name}: {dropped} libraries for other CUDA, ROCm and XPU versions dropped")
    return wheel


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
def main(argv: list[str] | None = None) -> dict:
    args = parse_dataclass(DeviceCheckArgs, argv, description=__doc__)
    if args.slim_wheel:
        slim_bitsandbytes(Path(args.slim_wheel))
        return carry_arithmetic([Path(args.slim_wheel)])
    if args.model == "tiny":
        given = given_flags(DeviceCheckArgs, sys.argv[1:] if argv is None else argv)
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
            args.rollout_batch, args.prefill_tokens) < 1:
        raise UserError("device_check: batch sizes, rows, lengths and --repeats must be >= 1, "
                        "and --response-tokens below --row-tokens")
    out = Path(args.out) if args.out else (Path(os.environ["OUT"]) / "device_check.json" if os.environ.get("OUT") else None)
    if out is None:
        print("device check: no --out and no $OUT: the figures are printed only")
    start = time.perf_counter()
    elapsed = lambda: time.perf_counter() - start  # noqa: E731
    import transformers

    found = {"model": args.model, "torch": torch.__version__, "transformers": transformers.__version__,
             "python": platform.python_version(), "args": asdict(args), "done": [], "skipped": []}
    write_json(out, found)  # the versions, even if the build fails
    model, tokenizer, device = build(args)
    found["device"] = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"
    found["build"] = {**built(model), "seconds": elapsed(), "peak_memory_gb": peak_memory_gb()}
    found["done"].append("build")
    write_json(out, found)
    print(f"device check: {args.model} on {found['device']} (torch {torch.__version__}, transformers "
          f"{transformers.__version__}), budget {args.budget_s:.0f}s; built in {elapsed():.1f}s: "
          f"{', '.join(found['build']['lora_layers'])}")
    gen = torch.Generator().manual_seed(0)
    parts = [(f"decode batch {b}", lambda b=b: {f"decode_tok_s_batch{b}": decode_rate(model, tokenizer, device, b, args, gen)})
             for b in batches]
    parts += [("prefill", lambda: prefill_peaks(model, tokenizer, args, gen)),
              ("no-grad and update passes", lambda: pass_rates(model, tokenizer, device, args, gen)),
              ("one iteration", lambda: {"iteration": iteration_stages(model, tokenizer, args)})]
    for name, part in parts:
        if elapsed() > args.budget_s:
            found["skipped"].append(name)
            write_json(out, found)
            print(f"  {name}: skipped (past the {args.budget_s:.0f}s budget)")
            continue
        clock = time.perf_counter()
        reset_peak_memory()
        result = part()
        found.update(result)
        found[f"peak_memory_gb_after_{name.replace(' ', '_')}"] = peak_memory_gb()
        found["done"].append(name)
        write_json(out, found)  # this part's figures are kept, whatever the next part does
        shown = {k: v for k, v in result.items() if k != "iteration"} or {
            k: round(v, 2) for k, v in result["iteration"].items() if k.startswith("seconds/")}
        print(f"  {name} ({time.perf_counter() - clock:.0f}s): " + ", ".join(
            f"{k} {v:,.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in shown.items())
            + f"; peak {peak_memory_gb():.2f} GB", flush=True)
    found["seconds"] = elapsed()
    write_json(out, found)
    print(f"device check done in {found['seconds']:.0f}s" + (f": {out}" if out else ""))
    return found


if __name__ == "__main__":
    run(main)
