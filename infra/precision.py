"""Precision: what `--dtype auto` means on the machine at hand, measured once, not guessed from CPU flags.

A GPU computes in bf16. On a CPU, whether bf16 is faster than float32 does not follow from its flags: two
hosts with AVX512-BF16 and no AMX gave opposite answers (docs/scaling.md). So the first run of a model on a
CPU times the model's own kind of work in both precisions (a forward and backward of its MLP block, the
bulk of the passes' FLOPs, over a micro-batch of tokens, under bf16 autocast as training runs it) and takes
the faster; where the two are within the timing's own noise it keeps float32, the precise one. The answer
is kept per CPU model, thread count, torch version and model in $SHARPO_CACHE/dtype.json (default
~/.cache/sharpo): measured in ~1 s once, read in milliseconds after. A damaged file is ignored and
rewritten. `--dtype bf16` and `--dtype fp32` are taken as given, and a resumed run keeps its own.

The test model ("tiny") is float32: nothing about its speed says anything, and tests stay exact.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from errors import UserError
from infra import memory

AUTO_CHOSEN: dict[str, dict] = {}  # model -> the record --dtype auto was resolved from in this process
SMOLLM2_SHAPE = (576, 1536)  # hidden and MLP sizes of the embedded SmolLM2-135M
MARGIN = 0.05  # bf16 must be at least this much faster, and by more than the timing's spread


def choose_dtype(bf16_s: list[float], fp32_s: list[float]) -> tuple[str, float]:
    """The rule, from repeated timings of the same work in each precision: (dtype, bf16 / fp32 time).

    bf16 only where its median time is below float32's by more than the timings' own spread (the
    larger relative range of the two), and by at least MARGIN; otherwise float32, the precise one."""
    b, f = statistics.median(bf16_s), statistics.median(fp32_s)
    spread = max((max(x) - min(x)) / statistics.median(x) for x in (bf16_s, fp32_s))
    ratio = b / f
    return ("bf16" if ratio < 1.0 - max(MARGIN, spread) else "fp32"), ratio


def mlp_seconds(hidden: int, intermediate: int, bf16: bool, tokens: int = 1024, repeats: int = 5,
                clock=time.perf_counter) -> list[float]:
    """Seconds of `repeats` forward + backward passes of one MLP block (hidden -> intermediate ->
    hidden, SiLU-gated as in Llama and Qwen) over `tokens` tokens: frozen base weights in the
    precision asked, activations that need gradients, bf16 autocast for bf16 (as training runs)."""
    g = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16 if bf16 else torch.float32
    gate, up = (torch.randn(intermediate, hidden, generator=g).to(dtype) for _ in range(2))
    down = torch.randn(hidden, intermediate, generator=g).to(dtype)
    x = torch.randn(tokens, hidden, generator=g, requires_grad=True)

    def once():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            h = torch.nn.functional.silu(x @ gate.T) * (x @ up.T)  # (tokens, intermediate)
            y = h @ down.T  # (tokens, hidden)
        y.float().sum().backward()
        x.grad = None

    once()  # warm-up
    out = []
    for _ in range(repeats):
        start = clock()
        once()
        out.append(clock() - start)
    return out


def model_shape(model: str) -> tuple[int, int]:
    """(hidden, intermediate) of the model, from its config; the embedded model's own sizes where a
    config cannot be read without the network."""
    shape = None if model == "smollm2" else memory.local_shape(model)
    # no local config (a hub id not yet downloaded) or an odd one: the embedded shape
    return SMOLLM2_SHAPE if shape is None else (shape.hidden, shape.intermediate)


def cache_file() -> Path:
    return Path(os.environ.get("SHARPO_CACHE") or Path.home() / ".cache" / "sharpo") / "dtype.json"


def machine_key(model: str) -> str:
    """What a measurement holds for: this CPU model, its thread count, this torch, this model."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    return f"{name} | {torch.get_num_threads()} threads | torch {torch.__version__} | {model}"


def read_cache(path: Path) -> dict:
    """The measurements kept so far; {} for a missing or damaged file (it is rewritten)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def measured_cpu_dtype(model: str, measure=None) -> dict:
    """The record of `--dtype auto` on this CPU for `model`: {"dtype", "ratio" (bf16 / fp32 time),
    "bf16_s", "fp32_s", "measured"}, from the cache or measured now (and kept). measure(bf16) ->
    seconds per repeat: the timing (a fake one in tests); default: mlp_seconds at the model's shape."""
    path, key = cache_file(), machine_key(model)
    cached = read_cache(path)
    record = cached.get(key)
    if isinstance(record, dict) and record.get("dtype") in ("bf16", "fp32") and isinstance(
            record.get("ratio"), (int, float)):
        return {**record, "cached": True}
    hidden, intermediate = model_shape(model)
    measure = measure or (lambda bf16: mlp_seconds(hidden, intermediate, bf16))
    bf16_s, fp32_s = [], []
    for _ in range(2):  # interleaved, so that a slow moment of the machine falls on both
        fp32_s += measure(False)
        bf16_s += measure(True)
    dtype, ratio = choose_dtype(bf16_s, fp32_s)
    record = {"dtype": dtype, "ratio": ratio, "bf16_s": statistics.median(bf16_s),
              "fp32_s": statistics.median(fp32_s), "measured": time.strftime("%Y-%m-%d %H:%M")}
    try:  # kept for the next run; a cache that cannot be written costs a measurement next time
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**cached, key: record}, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass
    return {**record, "cached": False}


def resolve_dtype(dtype: str, device: str, model: str | None = None) -> str:
    """--dtype auto: bf16 on a GPU that has it; on a CPU, the faster of the two as measured for `model` (float32
    for the tiny test model, or when no model is named); other values as given."""
    if dtype not in ("auto", "bf16", "fp32"):
        raise UserError(f"--dtype {dtype!r}: use auto, bf16 or fp32")
    if dtype != "auto":
        return dtype
    if device.startswith("cuda"):  # a GPU without bf16 (compute capability below 8: a T4) computes float32
        return "bf16" if torch.cuda.get_device_capability()[0] >= 8 else "fp32"
    if model in (None, "tiny"):
        return "fp32"
    AUTO_CHOSEN[model] = measured_cpu_dtype(model)
    return AUTO_CHOSEN[model]["dtype"]


def auto_choice_line(model: str) -> str | None:
    """One line for a run's start, when --dtype auto was resolved on this CPU in this process: what it
    chose and from what (None otherwise)."""
    record = AUTO_CHOSEN.get(model)
    if record is None:
        return None
    how = "measured now" if not record["cached"] else f"measured {record['measured']}"
    return (f"--dtype auto: {record['dtype']}: bf16 takes {record['ratio']:.2f}x float32's time on this CPU "
            f"for this model's MLP block ({how}; kept in {cache_file()})")
