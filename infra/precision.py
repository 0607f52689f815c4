"""Precision: what `--dtype auto` means on the machine at hand, measured, not guessed from CPU flags.

A GPU computes in bf16. On a CPU, whether bf16 is faster than float32 does not follow from its flags: two
hosts with AVX512-BF16 and no AMX gave opposite answers (docs/scaling.md). So the first run of a model on a
CPU times one of the model's decoder layers (attention and MLP, LoRA r 8 on its seven projections, frozen
base weights, forward and backward over a micro-batch of tokens, under bf16 autocast as training runs it)
in both precisions, one repeat of each in turn, until the two medians' confidence intervals settle the
question or a few seconds have passed (`measure`). The decision is a function of those timings alone
(`decide`): bf16 where it is clearly at least MARGIN faster, float32 where it is clearly not faster by
2 x MARGIN (a tie keeps the precise one), and float32 for this run only, not kept, where the timings are
too noisy to tell. A slow moment of the machine widens an interval and costs repeats; it does not turn a
clear difference into float32. The layer runs on one thread whatever the run's count: bf16's gain is the
core's arithmetic, and on 2 cores beside one busy process, 2-thread repeats came out 2-30x slow at random
and never settled, where one thread's settled in 5 repeats (docs/scaling.md).

A decision is kept per CPU model, torch version and model in $SHARPO_CACHE/dtype.json (default
~/.cache/sharpo) and read in milliseconds after. A record the rule cannot vouch for (another rule's, a
missing field, a ratio that is not a finite positive number, a verdict its own figures contradict) is
measured anew; other keys' records are left as they were, whatever wrote them. A damaged or oversized file
is ignored and rewritten; one that is not a regular file (a FIFO, a folder) is opened without blocking,
ignored and never written over. `--dtype bf16` and `--dtype fp32` are taken as given, and a resumed run
keeps its own. Where torch has no bf16 kernels for the CPU at all (`bf16_kernels`: an AVX2-only CPU), there
is nothing to measure: float32.

The test model ("tiny") is float32: nothing about its speed says anything, and tests stay exact.
"""
from __future__ import annotations

import fcntl
import json
import math
import os
import platform
import stat
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from errors import UserError
from infra import memory

AUTO_CHOSEN: dict[str, dict] = {}  # model -> the record --dtype auto was resolved from in this process
SMOLLM2 = memory.Shape(49152, 576, 30, 1536, 9, 3, 64, True)  # the embedded SmolLM2-135M's config
RULE = 2  # kept records of another rule (1: an MLP block and a spread test) are measured anew
MARGIN = 0.05  # bf16 is taken where it is clearly at least 5% faster; float32 where clearly under 10%
CONFIDENCE = 0.90  # of each median's interval (order statistics: no assumption on the timings' spread)
MIN_REPEATS = 5  # per precision: the fewest for a 90% interval of a median
MAX_REPEATS = 30  # per precision, and
CAP_S = 3.0  # seconds of repeats at most: past either, what is measured is decided (or called noisy)
FLOP_BUDGET = 4e9  # forward FLOPs of the projections in one repeat: 512 tokens of SmolLM2 (~0.1 s)
MAX_READ = 1 << 20  # a dtype.json larger than this is not ours


@dataclass(frozen=True)
class Verdict:
    """What the timings say: the dtype to run, bf16's median time over float32's (`ratio`), the bounds
    of that ratio from the two medians' intervals, and whether that is a decision (`settled`) or float32
    for want of one."""

    dtype: str
    ratio: float
    low: float
    high: float
    settled: bool


def median_interval(xs: list[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """A distribution-free interval for the median of xs: the k-th smallest and k-th largest, with k
    the largest for which the interval covers the median with at least `confidence` (binomial tails).
    None for too few values (under 5 at 90%). One outlier moves only the outermost order statistic."""
    n, xs = len(xs), sorted(xs)
    tail, k, cumulative = (1 - confidence) / 2, 0, 0.0
    while k < n // 2:
        cumulative += math.comb(n, k) / 2**n  # P(fewer than k + 1 of n below the median)
        if cumulative > tail:
            break
        k += 1
    return (xs[k - 1], xs[n - k]) if k else None


def decide(bf16_s: list[float], fp32_s: list[float]) -> Verdict:
    """The rule, a pure function of repeated timings of the same work in each precision.

    ratio = median(bf16) / median(fp32); its bounds divide the ends of the medians' intervals. bf16 where
    even the high bound is under 1 - MARGIN (clearly faster by at least 5%); float32, decided, where even
    the low bound is over 1 - 2 x MARGIN (clearly not 10% faster: a tie keeps the precise one); otherwise
    float32 for now, not a decision."""
    ratio = statistics.median(bf16_s) / statistics.median(fp32_s)
    b, f = median_interval(bf16_s), median_interval(fp32_s)
    if b is None or f is None:
        low, high = min(bf16_s) / max(fp32_s), max(bf16_s) / min(fp32_s)
        return Verdict("fp32", ratio, low, high, False)
    low, high = b[0] / f[1], b[1] / f[0]
    if high < 1 - MARGIN:
        return Verdict("bf16", ratio, low, high, True)
    return Verdict("fp32", ratio, low, high, low > 1 - 2 * MARGIN)


def model_shape(model: str) -> memory.Shape:
    """The model's shape: the embedded model's, a planned Qwen's, or its local config's; the embedded
    model's where no config can be read without the network."""
    if model == "smollm2":
        return SMOLLM2
    return memory.QWEN.get(model) or memory.local_shape(model) or SMOLLM2


def layer_tokens(shape: memory.Shape) -> int:
    """Tokens a repeat runs: FLOP_BUDGET of projections forward (512 for SmolLM2), 32 at least."""
    per_token = 2 * shape.linear_params() / shape.layers
    return max(32, min(512, int(FLOP_BUDGET / per_token) // 32 * 32))


def work_words(shape: memory.Shape) -> str:
    """What one repeat is, in the line's words."""
    return f"a decoder layer's forward + backward, {layer_tokens(shape)} tokens, one thread"


def layer_timer(shape: memory.Shape, tokens: int | None = None, lora_r: int = 8, clock=time.perf_counter):
    """once(bf16) -> seconds of one forward + backward of one decoder layer of `shape` (Llama / Qwen2:
    RMSNorm, rotary attention with grouped keys and values, SiLU-gated MLP, two residuals), over `tokens`
    tokens in rows of up to 256: base weights frozen in the precision asked, LoRA weights float32 with
    gradients, the input needing its gradient (as the layers of a model do), bf16 autocast for bf16.
    Both precisions are built and run once before it returns (the first call pays one-time costs)."""
    F = torch.nn.functional
    tokens = tokens or layer_tokens(shape)
    T = min(tokens, 256)
    rows = max(1, tokens // T)
    heads, kv_heads, hd, h = shape.heads, shape.kv_heads, shape.head_dim, shape.hidden
    q, kv = heads * hd, kv_heads * hd
    g = torch.Generator().manual_seed(0)
    sizes = {"q": (q, h), "k": (kv, h), "v": (kv, h), "o": (h, q), "gate": (shape.intermediate, h),
             "up": (shape.intermediate, h), "down": (h, shape.intermediate)}
    base = {n: torch.randn(*s, generator=g) / s[1] ** 0.5 for n, s in sizes.items()}
    lora = {n: (torch.randn(lora_r, s[1], generator=g).div_(s[1] ** 0.5).requires_grad_(),
                torch.randn(s[0], lora_r, generator=g).mul_(0.01).requires_grad_()) for n, s in sizes.items()}
    angle = torch.outer(torch.arange(T, dtype=torch.float32),
                        1e4 ** -(torch.arange(0, hd, 2, dtype=torch.float32) / hd)).repeat(1, 2)
    x0 = torch.randn(rows, T, h, generator=g)
    built = {}
    for bf16 in (False, True):
        dt = torch.bfloat16 if bf16 else torch.float32
        built[bf16] = ({n: w.to(dt) for n, w in base.items()}, torch.ones(h, dtype=dt),
                       x0.to(dt).requires_grad_(), angle.cos().to(dt), angle.sin().to(dt))

    def linear(x, w, name):
        a, b = lora[name]
        return x @ w[name].T + (x @ a.T) @ b.T

    def norm(x, weight):
        v = x.float()
        return weight * (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)

    def rotary(x, cos, sin):
        x1, x2 = x.chunk(2, -1)
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def layer(x, w, weight, cos, sin):
        y = norm(x, weight)
        qh, kh, vh = (linear(y, w, n).view(rows, T, -1, hd).transpose(1, 2) for n in ("q", "k", "v"))
        qh, kh = rotary(qh, cos, sin), rotary(kh, cos, sin)
        kh, vh = (t.repeat_interleave(heads // kv_heads, 1) for t in (kh, vh))
        a = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True).transpose(1, 2).reshape(rows, T, q)
        x = x + linear(a, w, "o")
        y = norm(x, weight)
        return x + linear(F.silu(linear(y, w, "gate")) * linear(y, w, "up"), w, "down")

    def once(bf16: bool) -> float:
        w, weight, x, cos, sin = built[bf16]
        start = clock()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = layer(x, w, weight, cos, sin)
        out.float().square().mean().backward()
        elapsed = clock() - start
        x.grad = None
        for a, b in lora.values():
            a.grad = b.grad = None
        return elapsed

    once(False), once(True)  # warm-up: kernels chosen, memory allocated
    return once


def measure(once, cap_s: float = CAP_S, clock=time.monotonic) -> tuple[list[float], list[float], Verdict]:
    """Interleaved repeats (bf16 and float32 in turn, the order alternating, so that a slow moment of the
    machine falls on both) until `decide` settles, or MAX_REPEATS or cap_s is reached after the
    MIN_REPEATS every interval needs. once(bf16) -> seconds of one repeat. (bf16_s, fp32_s, verdict)."""
    bf16_s: list[float] = []
    fp32_s: list[float] = []
    start = clock()
    while True:
        for bf16 in ((True, False) if len(bf16_s) % 2 else (False, True)):
            (bf16_s if bf16 else fp32_s).append(once(bf16))
        verdict = decide(bf16_s, fp32_s)
        n = len(bf16_s)
        if n >= MIN_REPEATS and (verdict.settled or n >= MAX_REPEATS or clock() - start >= cap_s):
            return bf16_s, fp32_s, verdict


def cache_file() -> Path:
    return Path(os.environ.get("SHARPO_CACHE") or Path.home() / ".cache" / "sharpo") / "dtype.json"


ISA_CAPS = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")  # instruction-set caps


def machine_key(model: str) -> str:
    """What a measurement holds for: this CPU model, this torch, this model (it is taken on one thread), and
    the instruction-set caps in the environment, which emulate another class of CPU (docs/scaling.md)."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    caps = " ".join(f"{v}={os.environ[v]}" for v in ISA_CAPS if os.environ.get(v))  # an emulated class
    return f"{name} | torch {torch.__version__} | {model}" + (f" | {caps}" if caps else "")


def read_cache(path: Path) -> tuple[dict, str | None]:
    """(the records kept so far, why the file cannot be used or None). A missing, damaged or oversized
    file gives {} (it is rewritten); one that is not a regular file gives {} and its reason (it is left
    alone). Opened without blocking, so a FIFO cannot hold the run."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:  # missing or unreadable: measured, and the write says whether it can be kept
        return {}, None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {}, f"{path} is not a regular file"
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(MAX_READ + 1)
        data = json.loads(raw.decode("utf-8")) if len(raw) <= MAX_READ else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return {}, None
    finally:
        os.close(fd)
    return (data if isinstance(data, dict) else {}), None


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def valid_record(record) -> bool:
    """A kept decision this rule can use: its rule, every field present and sane, and a verdict its
    own bounds imply (a record that says bf16 where its bounds say float32 was not written by this rule)."""
    if not (isinstance(record, dict) and record.get("rule") == RULE and record.get("dtype") in ("bf16", "fp32")
            and all(_positive(record.get(k)) for k in ("ratio", "low", "high", "bf16_s", "fp32_s"))
            and isinstance(record.get("measured"), str) and record["measured"]
            and isinstance(record.get("work"), str) and record["work"]):
        return False
    if not record["low"] <= record["ratio"] <= record["high"]:
        return False
    return record["high"] < 1 - MARGIN if record["dtype"] == "bf16" else record["low"] > 1 - 2 * MARGIN


def write_cache(path: Path, key: str, record: dict) -> str | None:
    """Keep `record` under `key` beside the file's other records; None when kept, else why not. Under
    an exclusive lock (a sibling .lock file), the file is read afresh and rewritten atomically (a
    temporary file renamed over it), so two runs measuring at once keep both their records. A path
    that exists and is not a regular file is not written over."""
    try:
        if path.exists() and not path.is_file():
            return f"{path} is not a regular file"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(f".{path.name}.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            records, unusable = read_cache(path)  # what the others kept since this run read it
            if unusable:
                return unusable
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump({**records, key: record}, f, indent=1)
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
    except OSError as e:
        return f"{path}: {e.strerror or e}"
    return None


def measured_cpu_dtype(model: str, once=None, cap_s: float = CAP_S) -> dict:
    """The record of `--dtype auto` on this CPU for `model`: {"dtype", "ratio" (bf16 / float32 time),
    "low", "high" (its bounds), "bf16_s", "fp32_s" (medians), "repeats", "work", "measured", "rule"},
    plus "cached" (read, not measured), "settled" (a decision, not float32 for want of one) and
    "not_kept" (None where the record is in the cache file, else why not). From the cache where it holds
    a valid record, else measured now; a settled measurement is kept, a noisy one is not (the next run
    measures again). once(bf16) -> seconds of one repeat: the timing (a fake one in tests); default:
    layer_timer at the model's shape."""
    path, key = cache_file(), machine_key(model)
    cached, unusable = read_cache(path)
    if valid_record(record := cached.get(key)):
        return {**record, "cached": True, "settled": True, "not_kept": None}
    shape, threads = model_shape(model), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        bf16_s, fp32_s, verdict = measure(once or layer_timer(shape), cap_s)
    finally:
        torch.set_num_threads(threads)
    record = {"rule": RULE, "dtype": verdict.dtype, "ratio": verdict.ratio, "low": verdict.low,
              "high": verdict.high, "bf16_s": statistics.median(bf16_s), "fp32_s": statistics.median(fp32_s),
              "repeats": len(bf16_s), "work": work_words(shape), "measured": time.strftime("%Y-%m-%d %H:%M")}
    if not verdict.settled:
        not_kept = "too noisy to decide"
    else:  # a file that is not a regular file is left alone
        not_kept = unusable or write_cache(path, key, record)  # others' records as they are now
    return {**record, "cached": False, "settled": verdict.settled, "not_kept": not_kept}


def resolve_dtype(dtype: str, device: str, model: str | None = None) -> str:
    """--dtype auto: bf16 on a GPU that has it; on a CPU, the faster of the two as measured for `model` (float32
    for the tiny test model, when no model is named, or where torch has no bf16 kernels for the CPU); other
    values as given."""
    if dtype not in ("auto", "bf16", "fp32"):
        raise UserError(f"--dtype {dtype!r}: use auto, bf16 or fp32")
    if dtype != "auto":
        return dtype
    if device.startswith("cuda"):  # a GPU without bf16 (compute capability below 8: a T4) computes float32
        return "bf16" if torch.cuda.get_device_capability()[0] >= 8 else "fp32"
    if model in (None, "tiny"):
        return "fp32"
    if not bf16_kernels():  # not timed: a 7B layer's bf16 repeats alone would take minutes there
        AUTO_CHOSEN[model] = {"dtype": "fp32", "no_bf16_kernels": True}
        return "fp32"
    AUTO_CHOSEN[model] = measured_cpu_dtype(model)
    return AUTO_CHOSEN[model]["dtype"]


def bf16_kernels() -> bool:
    """Whether torch's oneDNN has bf16 kernels for this CPU (AVX512 or AVX-NE-CONVERT). Without them, as on an
    AVX2-only CPU, bf16 products take a slow generic path: 13.67x float32's time on a 2-core AVX2 EPYC."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def shown(path: Path) -> str:
    """A path as the line shows it: under the home folder as ~/..."""
    try:
        return "~/" + str(path.relative_to(Path.home()))
    except ValueError:
        return str(path)


def auto_choice_line(model: str) -> str | None:
    """One line for a run's start, when --dtype auto was resolved on this CPU in this process: the verdict
    first, then bf16's time as a share of float32's and what that share was measured on, then whether the
    decision is kept (None when auto was not resolved on a CPU here)."""
    r = AUTO_CHOSEN.get(model)
    if r is None:
        return None
    if r.get("no_bf16_kernels"):
        return "--dtype auto: float32: torch has no bf16 kernels for this CPU (AVX512 or AVX-NE-CONVERT); not measured"
    share, work = f"{r['ratio']:.2f}x float32's time", r["work"]
    if not r["settled"]:
        return (f"--dtype auto: float32 for this run: too noisy to decide, bf16 {share} ({r['low']:.2f}x to "
                f"{r['high']:.2f}x; {work}, {r['repeats']} repeats each); not kept: measured again next run")
    how = f"measured {r['measured']}" if r["cached"] else f"measured now, {r['repeats']} repeats each"
    where = (f"kept in {shown(cache_file())}" if r["not_kept"] is None
             else f"not kept ({r['not_kept']}): measured again next run")
    if r["dtype"] == "bf16":
        return f"--dtype auto: bf16, {share} on this CPU ({work}; {how}; {where})"
    slower = "slower" if r["ratio"] >= 1 else "not clearly faster"
    return f"--dtype auto: float32: bf16 is {slower} on this CPU, {share} ({work}; {how}; {where})"
