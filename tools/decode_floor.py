"""The decode step beside its floor: how far a CPU rollout's decoding is from what the machine allows.

A decode step of the rollouts samples one token for each of B rows: it reads every weight of the
decoder and the output head once, and each row's KV cache, and does 2 x (matrix parameters) x B
multiply-adds' FLOPs. On the host it runs on, this tool measures the floor's parts, then times the
step the way train.py decodes (speed.py's `FastPath.generate`, the model and LoRA of the CPU presets):

  bandwidth   the best of a 1 GiB tensor summed and copied (bytes moved / seconds), 2 threads
  matmul      a (1024 x H) @ (H x 4H) product in the dtype, H the model's width: its FLOP/s
  floor       weight bytes / bandwidth + FLOPs / matmul rate, the floor of the issue that asked for this
              tool; `floor_kv` adds the rows' KV cache read once at the bandwidth
  step        (seconds of --new-tokens + 1 new tokens - seconds of 1) / --new-tokens, from the same
              prompts and seed, the end of turn blocked; the median of --repeats after a warm-up

Rows: the demo's 6 (2 tasks x 3) and cpu-watch's 16 (4 x 4) episodes, their prompts 0.75 to 1.25 x
--prompt-tokens long, as a rollout's differ (random ids: the step's cost depends on the lengths, not the
ids; prompts of one length would take another attention kernel than a rollout's padded rows do).
--dtype both times float32 and bf16; auto takes what `--dtype auto` takes on this machine
(infra/precision.py). The ratio step / floor is what the issue's "within 1.5x of its floor" asks about.

Run: python -m tools.decode_floor                       (both dtypes, rows 6 and 16; ~2 minutes on 2 cores)
     python -m tools.decode_floor --dtype auto --out results/decode-floor/floor.json
"""
from __future__ import annotations

import errors  # first: a Ctrl-C or kill while the imports below load is one line

errors.quiet_start(__name__)
# isort: split

import copy
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import infra.models  # noqa: F401  first: it quiets two third-party notices before peft loads bitsandbytes
# isort: split
import torch

from flags import preset_defaults
from infra.checkpoint import check_writable, write_atomic
from infra.cli import check_domains, parse_dataclass, run
from infra.models import load_policy, resolve_dtype
from rollout import autocast, sampling_config
from speed import FastPath


@dataclass
class DecodeFloorArgs:
    """Command-line flags of tools/decode_floor.py."""

    dtype: Literal["auto", "bf16", "fp32", "both"] = "both"  # the precision timed; auto: --dtype auto's choice here
    rows: str = "6,16"  # batch sizes timed, comma-separated: the demo's episodes and cpu-watch's
    prompt_tokens: int = 400  # each row's prompt (the demo's prompts run 180-600 tokens)
    new_tokens: int = 32  # decode steps timed per call
    repeats: int = 3  # timed calls per setting after a warm-up; the step is their median
    threads: int = 0  # torch threads (0: torch's default, one per core)
    out: str | None = None  # also write the figures as JSON here


def bandwidth(gib: float = 1.0) -> dict:
    """Bytes per second of a sum (reads) and a copy (a read and a write) over a `gib` GiB tensor, best of 5."""
    x = torch.rand(int(gib * 2**30) // 4)
    y = torch.empty_like(x)
    out = {}
    for name, work, moved in (("sum", lambda: x.sum(), x.nbytes), ("copy", lambda: y.copy_(x), 2 * x.nbytes)):
        work()
        best = min(timed(work) for _ in range(5))
        out[name] = moved / best
    return out


def matmul_rate(width: int, dtype: torch.dtype) -> float:
    """FLOP/s of a compute-bound product of the model's width in `dtype`: (1024 x H) @ (H x 4H), best of 5."""
    a, w = torch.randn(1024, width, dtype=dtype), torch.randn(4 * width, width, dtype=dtype)
    work = lambda: torch.nn.functional.linear(a, w)  # noqa: E731
    work()
    return 2 * a.shape[0] * w.numel() / min(timed(work) for _ in range(5))


def timed(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def step_bytes_and_flops(model, rows: int, context: int) -> dict:
    """What one decode step of `rows` rows at `context` tokens reads and computes: every matrix of the
    decoder and the head once (the embedding is a gather: one row per token), the KV cache of each row,
    and 2 x parameters x rows FLOPs for the matrices (plus attention's 4 x context x width a row a layer)."""
    head = model.get_output_embeddings().weight
    embed = model.get_input_embeddings().weight
    matrices = [p for n, p in model.named_parameters() if p.dim() == 2 and p is not embed and p is not head]
    config = model.config
    kv_width = config.num_key_value_heads * (config.hidden_size // config.num_attention_heads)
    element = 2 if matrices[0].dtype == torch.bfloat16 else 4  # bytes
    kv_bytes = 2 * config.num_hidden_layers * rows * context * kv_width * element
    params = sum(p.numel() for p in matrices) + head.numel()
    return {"weight_bytes": sum(p.nbytes for p in matrices) + head.nbytes, "kv_bytes": kv_bytes,
            "flops": 2 * params * rows + 4 * rows * context * config.hidden_size * config.num_hidden_layers}


def decode_step(model, tokenizer, rows: int, args: DecodeFloorArgs) -> list[float]:
    """Seconds of one decode step of FastPath.generate over `rows` prompts: one per timed call."""
    g = torch.Generator().manual_seed(0)
    lengths = [int(args.prompt_tokens * (3 + 2 * b / max(rows - 1, 1)) / 4) for b in range(rows)]  # 0.75-1.25 x
    prompts = [torch.randint(100, len(tokenizer) - 100, (n,), generator=g).tolist() for n in lengths]
    fast, base = FastPath(tokenizer.pad_token_id), sampling_config(tokenizer, model, args.new_tokens + 1)

    def call(n: int) -> float:
        config = copy.deepcopy(base)
        config.max_new_tokens = config.min_new_tokens = n  # the end of turn blocked: every row decodes n
        torch.manual_seed(0)
        with torch.no_grad(), autocast(model):
            return timed(lambda: fast.generate(model=model, prompts=prompts, config=config))
    call(2)  # warm-up
    return [(call(args.new_tokens + 1) - call(1)) / args.new_tokens for _ in range(args.repeats)]


def main(argv: list[str] | None = None) -> dict:
    args = parse_dataclass(DecodeFloorArgs, argv, description=__doc__)
    problems = check_domains(args, positive=("prompt_tokens", "new_tokens", "repeats"), non_negative=("threads",))
    try:
        rows = [int(r) for r in args.rows.split(",") if r.strip()]
    except ValueError:
        rows = []
    if not rows or min(rows) < 1:
        problems.append(f"--rows must be comma-separated positive integers; got {args.rows!r}")
    if problems:
        raise errors.UserError("; ".join(problems))
    if args.out:  # before minutes of timing, not after them
        check_writable(Path(args.out))
    if args.threads:
        torch.set_num_threads(args.threads)
    demo = preset_defaults("cpu-demo", "alfworld")[1]  # the CPU presets' model, warm start and LoRA
    dtypes = ["fp32", "bf16"] if args.dtype == "both" else [resolve_dtype(args.dtype, "cpu", demo["model"])]
    band = bandwidth()
    bw = max(band.values())
    print(f"memory bandwidth: sum {band['sum'] / 1e9:.1f} GB/s, copy {band['copy'] / 1e9:.1f} GB/s "
          f"({torch.get_num_threads()} threads)")
    out = {"args": asdict(args), "threads": torch.get_num_threads(), "bandwidth": band, "by_dtype": {}}
    for dtype in dtypes:
        model, tokenizer = load_policy(demo["model"], dtype=dtype, init_adapter=demo["init_adapter"],
                                       lora_r=demo["lora_r"], lora_alpha=demo["lora_alpha"],
                                       lora_layers=demo["lora_layers"], announce=lambda *_: None)
        model.eval()
        rate = matmul_rate(model.config.hidden_size, torch.bfloat16 if dtype == "bf16" else torch.float32)
        print(f"{dtype}: matmul {rate / 1e9:.0f} GFLOP/s")
        out["by_dtype"][dtype] = {"matmul_flops_per_s": rate, "rows": {}}
        for b in rows:
            work = step_bytes_and_flops(model, b, args.prompt_tokens + args.new_tokens // 2)
            floor = work["weight_bytes"] / bw + work["flops"] / rate
            floor_kv = floor + work["kv_bytes"] / bw
            steps = decode_step(model, tokenizer, b, args)
            step = statistics.median(steps)
            out["by_dtype"][dtype]["rows"][b] = {**work, "floor_s": floor, "floor_kv_s": floor_kv, "steps_s": steps,
                                                 "step_s": step, "over_floor": step / floor,
                                                 "over_floor_kv": step / floor_kv}
            print(f"  {b:3d} rows: decode step {1000 * step:6.1f} ms, floor {1000 * floor:5.1f} ms "
                  f"(weights {work['weight_bytes'] / 2**20:.0f} MiB, {work['flops'] / 1e9:.2f} GFLOP) -> "
                  f"{step / floor:.2f}x; with the KV cache read ({work['kv_bytes'] / 2**20:.0f} MiB) "
                  f"{1000 * floor_kv:.1f} ms -> {step / floor_kv:.2f}x")
        del model
    if args.out:
        write_atomic(Path(args.out), json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    run(main)
