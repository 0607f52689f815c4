"""Device check: what one GPU does with the paper's model shape, in one call of a few minutes.

Prints, for a Qwen2.5-7B-shaped model in nf4 4-bit with LoRA r 64 (random weights, built from its
config: no download; timings do not depend on the weights' values):
  - decode: generated tokens/s of plain `generate` (rollout.py's sampling config, lengths forced)
    at each --decode-batches batch size;
  - no-grad: tokens/s of the student pass (response log-probs of whole rows, no gradient);
  - update: tokens/s of a forward + backward of the token-mean loss over the same rows;
  - one train.py-shaped iteration (tools.bench's synthetic env: fixed observations, half the
    groups tied), seconds per stage, SHARPO;
  - peak memory after each part.
Every part is timed against --budget-s: a part that would start past it is reported as skipped,
so the call ends inside a device machine's limit with what it measured. The machine needs only
torch, transformers, peft and bitsandbytes (no alfworld, no registry: carry the bitsandbytes wheel).

`--model tiny` runs the same code on a CPU in seconds (CI's dry run), with the sizes scaled down.

Run (on the GPU machine): pip install --no-index BITSANDBYTES_WHEEL && python -m tools.device_check --out device_check.json
     (a dry run here):      python -m tools.device_check --model tiny
"""
from __future__ import annotations

import errors  # first: a Ctrl-C or kill while the imports below load is one line

errors.quiet_start(__name__)
# isort: split

import json
import platform
import time
from dataclasses import asdict, dataclass

import infra.models  # noqa: F401  first: it quiets two third-party notices before peft loads bitsandbytes
# isort: split
import torch

from infra.cli import UserError, parse_dataclass, run
from infra.metrics import peak_memory_gb
from infra.models import load_policy
from rollout import autocast, response_logprobs, sampling_config
from segments import Row, collate_rows


@dataclass
class DeviceCheckArgs:
    """Command-line flags of device_check.py."""

    model: str = "qwen7b-shape"  # qwen7b-shape (CUDA) | tiny (the CPU dry run)
    decode_batches: str = "64,128"  # batch sizes timed for decoding, comma-separated
    prompt_tokens: int = 1024  # prompt length of each decoded sequence (a few turns of ALFWorld)
    new_tokens: int = 128  # generated tokens per sequence (forced: min = max)
    rows: int = 4  # rows per no-grad and update pass (train.py's --micro-batch-rows)
    row_tokens: int = 4096  # tokens per row in those passes
    response_tokens: int = 256  # of which the response (the tokens scored)
    repeats: int = 2  # timed calls per part after one warm-up; the figure is the best
    iteration_episodes: int = 16  # the iteration: episodes (groups of 4)
    iteration_steps: int = 3  # env steps per episode
    iteration_new_tokens: int = 128  # forced response length per turn
    iteration_obs_words: int = 700  # words per observation
    budget_s: float = 480.0  # stop starting parts once this many seconds have passed
    out: str | None = None  # also write the figures as JSON here


TINY = dict(decode_batches="4,8", prompt_tokens=64, new_tokens=8, rows=2, row_tokens=128, response_tokens=16,
            repeats=1, iteration_episodes=8, iteration_steps=2, iteration_new_tokens=4, iteration_obs_words=20)


def build(args: DeviceCheckArgs):
    """(model, tokenizer, device): the 7B shape in nf4 on CUDA, or the tiny model in float32."""
    if args.model == "qwen7b-shape":
        if not torch.cuda.is_available():
            raise UserError("--model qwen7b-shape needs a CUDA GPU (about 6 GB of weights in 4-bit); "
                            "--model tiny dry-runs this check on a CPU")
        from tools.bench import qwen7b_shape_model

        model, tokenizer = qwen7b_shape_model()
        return model, tokenizer, "cuda"
    if args.model != "tiny":
        raise UserError(f"--model must be qwen7b-shape or tiny; got {args.model}")
    model, tokenizer = load_policy("tiny", seed=0, dtype="fp32")
    return model, tokenizer, "cpu"


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


def decode_rate(model, tokenizer, device: str, batch: int, args: DeviceCheckArgs, gen) -> float:
    """Generated tokens/s of one batched `generate` of `batch` prompts, lengths forced."""
    vocab = model.get_input_embeddings().weight.shape[0]
    ids = torch.tensor([random_ids(args.prompt_tokens, vocab, gen) for _ in range(batch)], device=device)
    config = sampling_config(tokenizer, model, args.new_tokens, 1.0)
    config.min_new_tokens = args.new_tokens  # forced lengths: timing only
    model.eval()

    def call():
        with torch.no_grad(), autocast(model):
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)

    return batch * args.new_tokens / best_seconds(call, args.repeats)


def pass_rates(model, tokenizer, device: str, args: DeviceCheckArgs, gen) -> dict:
    """Tokens/s of the no-grad student pass and of one forward + backward over the same rows."""
    vocab = model.get_input_embeddings().weight.shape[0]
    prompt = args.row_tokens - args.response_tokens
    rows = [Row(ids, prompt)
            for ids in (random_ids(args.row_tokens, vocab, gen) for _ in range(args.rows))]
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
    out["update_tok_s"] = tokens / best_seconds(update, args.repeats)
    return out


def iteration_stages(model, tokenizer, args: DeviceCheckArgs) -> dict:
    """Seconds per stage of one train.py iteration (SHARPO) on tools.bench's synthetic env."""
    import train
    from tools.bench import SyntheticEnv, forced_lengths, timed_iteration

    group_size = 4
    flags = dict(preset="none", model=args.model, algo="sharpo", groups=max(1, args.iteration_episodes // group_size),
                 group_size=group_size, max_steps=args.iteration_steps, max_new_tokens=args.iteration_new_tokens,
                 dtype="bf16" if args.model == "qwen7b-shape" else "fp32", kl_coef=0.0, hindsight="expert",
                 eval_every=0, iterations=2, output_dir="/tmp/sharpo-device-check")
    targs = train.parse_args([f"--{k.replace('_', '-')}={v}" for k, v in flags.items()])
    env = SyntheticEnv(args.iteration_steps, args.iteration_obs_words, group_size, 0.5)
    trainer = forced_lengths(train.Trainer(targs, model=model, tokenizer=tokenizer, env=env), args.iteration_new_tokens)
    return timed_iteration(trainer)  # no warm-up: the decode and pass parts above warmed the kernels


def main(argv: list[str] | None = None) -> dict:
    args = parse_dataclass(DeviceCheckArgs, argv, description=__doc__)
    if args.model == "tiny":
        for key, value in TINY.items():  # the dry run's sizes, unless a flag says otherwise
            if getattr(args, key) == DeviceCheckArgs.__dataclass_fields__[key].default:
                setattr(args, key, value)
    try:
        batches = [int(b) for b in args.decode_batches.split(",") if b.strip()]
    except ValueError:
        raise UserError(f"--decode-batches takes integers separated by commas; got {args.decode_batches}") from None
    if not batches or min(batches) < 1 or args.response_tokens >= args.row_tokens or min(
            args.rows, args.row_tokens, args.response_tokens, args.new_tokens, args.prompt_tokens, args.repeats) < 1:
        raise UserError("device_check: batch sizes, rows, lengths and --repeats must be >= 1, "
                        "and --response-tokens below --row-tokens")
    start = time.perf_counter()
    elapsed = lambda: time.perf_counter() - start  # noqa: E731
    model, tokenizer, device = build(args)
    gen = torch.Generator().manual_seed(0)
    found = {"device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
             "torch": torch.__version__, "args": asdict(args), "skipped": []}
    import transformers

    found["transformers"] = transformers.__version__
    print(f"device check: {args.model} on {found['device']} (torch {torch.__version__}, transformers "
          f"{transformers.__version__}), budget {args.budget_s:.0f}s; built in {elapsed():.1f}s, "
          f"{peak_memory_gb():.1f} GB")
    parts = [(f"decode batch {b}", lambda b=b: {f"decode_tok_s_batch{b}": decode_rate(model, tokenizer, device, b, args, gen)})
             for b in batches]
    parts += [("no-grad and update passes", lambda: pass_rates(model, tokenizer, device, args, gen)),
              ("one iteration", lambda: {"iteration": iteration_stages(model, tokenizer, args)})]
    for name, part in parts:
        if elapsed() > args.budget_s:
            found["skipped"].append(name)
            print(f"  {name}: skipped (past the {args.budget_s:.0f}s budget)")
            continue
        clock = time.perf_counter()
        result = part()
        found.update(result)
        found[f"peak_memory_gb_after_{name.replace(' ', '_')}"] = peak_memory_gb()
        shown = {k: v for k, v in result.items() if k != "iteration"} or {
            k: round(v, 2) for k, v in result["iteration"].items() if k.startswith("seconds/")}
        print(f"  {name} ({time.perf_counter() - clock:.0f}s): " + ", ".join(
            f"{k} {v:,.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in shown.items())
            + f"; peak {peak_memory_gb():.1f} GB")
    found["seconds"] = elapsed()
    print(f"device check done in {found['seconds']:.0f}s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(found, f, indent=1)
    return found


if __name__ == "__main__":
    run(main)
