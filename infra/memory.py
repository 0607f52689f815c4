"""Memory: what a training run holds on one GPU in each phase, from the model's shape and the flags.

One calculator serves docs/scaling.md's per-card table (`card_table`, checked by tests/test_docs.py)
and train.py's check before it loads a model on a GPU (`fit_problem`: a setting that cannot fit is
one line naming the flag to change). All figures in GiB (2^30 bytes). Each term says where it comes
from: computed from the shape, or calibrated on the device check's peaks on one H200 (the 7B shape in
nf4, results/gpu-h200/; tests/test_memory.py holds every peak within 10%).

Phases, each held at its own time (the engine of --rollout vllm sleeps while the trainer computes):
  rollout   weights + LoRA state + generate's prefill and KV cache (hf), or vLLM's share of the card
  passes    weights + LoRA state + one micro-batch's no-grad pass (student, teacher, reference)
  update    weights + LoRA state + one micro-batch's activations (gradient checkpointing) + the head
"""
from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30
HEADROOM = 0.9  # a plan may use 90% of the card: the allocator's fragmentation and what it does not count
PROMPT_TOKENS_PER_HISTORY_PAIR = 150  # what one more observation/action pair adds (estimated)
ACTIVATION_TERMS = 5  # (H + I)-sized tensors a token keeps while one checkpointed layer recomputes and runs its
# backward: calibrated (the H200's update peak, 4 x 4,096 tokens: 0.43 MB a token at 7B with the checkpoints)
PREFILL_TERMS = 5  # I-sized tensors a token holds in a no-grad forward (the MLP's gate and up, their LoRA outputs,
# the product): calibrated (the H200's prefill peaks, 32 and 128 prompts of 780 tokens: 0.24 MB a token with its KV)
HEAD_GIB = 0.5  # the head's float32 slice (256 MiB) and its logits chunk (256 MiB): speed.head_chunks
VLLM_BATCHED_TOKENS = 8192  # vLLM's max_num_batched_tokens: the size of the forward it reserves for


@dataclass(frozen=True)
class Shape:
    """What the plan needs of a decoder's config."""

    vocab: int
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool  # the output head shares the embeddings' weights

    @classmethod
    def of(cls, config) -> "Shape":
        """From a transformers config (Qwen2 / Llama style)."""
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(config.vocab_size, config.hidden_size, config.num_hidden_layers, config.intermediate_size,
                   config.num_attention_heads, config.num_key_value_heads, head_dim,
                   bool(getattr(config, "tie_word_embeddings", False)))

    def linear_params(self) -> int:
        """The decoder's projection weights (what nf4 quantizes): q, k, v, o and the gated MLP."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        per_layer = self.hidden * q + 2 * self.hidden * kv + q * self.hidden + 3 * self.hidden * self.intermediate
        return self.layers * per_layer

    def lora_params(self, r: int) -> int:
        """LoRA r on the seven projections: r * (in + out) each."""
        q, kv, h, i = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.hidden, self.intermediate
        return self.layers * r * ((h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h))

    def kv_bytes_per_token(self) -> int:
        """bf16 keys and values of every layer: 2 x layers x kv heads x head dim x 2 bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2


QWEN = {  # the Qwen2.5 Instruct shapes this project plans for (their config.json)
    "Qwen/Qwen2.5-7B-Instruct": Shape(152064, 3584, 28, 18944, 28, 4, 128, False),
    "Qwen/Qwen2.5-3B-Instruct": Shape(151936, 2048, 36, 11008, 16, 2, 128, True),
    "Qwen/Qwen2.5-1.5B-Instruct": Shape(151936, 1536, 28, 8960, 12, 2, 128, True),
}


@dataclass(frozen=True)
class Setting:
    """The flags that set a run's memory (train.py's names)."""

    load_in_4bit: bool = True
    fp32: bool = False  # float32 weights (--dtype fp32), on a GPU without bf16
    lora_r: int = 64
    micro_batch_rows: int = 4
    episodes: int = 128  # --groups x --group-size
    rollout_batch: int = 0  # 0: every live episode in one generate call
    prompt_tokens: int = 780
    max_new_tokens: int = 256
    kl: bool = True
    rollout: str = "hf"
    vllm_gpu_memory: float = 0.35
    gradient_checkpointing: bool = True
    optimizer: str = "held"  # what the LoRA holds beside its float32 weights: "held" (training: gradients and
    # Adam's two moments in every phase), "first" (a run's first iteration: nothing before its first step), "none"
    # (no optimizer, the device check's parts: gradients in the update only)
    prefill_prompts: int = 0  # prompts a generate call prefills in full (0: each of them); [speed] prefills a prefix
    # shared by several prompts once (speed.shared_prefix_generate), so identical prompts count once


LORA_BYTES = {  # bytes a LoRA parameter holds (rollout and passes, update): float32 weights, gradients, 2 moments
    "held": (16, 16), "first": (4, 16), "none": (4, 8)}


def weight_bytes(shape: Shape, load_in_4bit: bool, fp32: bool = False) -> float:
    """nf4 stores the projections at ~0.52 byte a parameter (with its quantization constants); the
    embeddings and the output head stay bf16; without 4-bit everything is bf16, or float32 (computed)."""
    other = shape.vocab * shape.hidden * (1 if shape.tied else 2)
    linear = shape.linear_params()
    return 0.52 * linear + 2 * other if load_in_4bit else (4 if fp32 else 2) * (linear + other)


def parameter_bytes(shape: Shape, s: Setting) -> float:
    """What tools/device_check.py's build reports as weights (the parameters' bytes): nf4's packed 0.5 byte a
    projection parameter (its quantization constants are not parameters), the rest in bf16 (or float32), and
    the LoRA's float32 weights (computed)."""
    other = shape.vocab * shape.hidden * (1 if shape.tied else 2)
    base = 0.5 * shape.linear_params() + 2 * other if s.load_in_4bit else (4 if s.fp32 else 2) * (
        shape.linear_params() + other)
    return base + 4 * shape.lora_params(s.lora_r)


def prompt_tokens(at_history_2: int, history: str, max_steps: int) -> int:
    """The longest prompt to plan for, from the env's longest at --history 2 (its `prompt_tokens`:
    ALFWorld 780, WebShop 900, docs/scaling.md): one pair more or less a step of it. max_steps: the
    episode's steps, which "all" keeps."""
    pairs = max_steps if history == "all" else int(history)
    return at_history_2 + (pairs - 2) * PROMPT_TOKENS_PER_HISTORY_PAIR


def plan(shape: Shape, s: Setting, card_gib: float | None = None) -> dict:
    """GiB of each term and each phase's total; `peak` is the largest phase. card_gib: the card's
    memory, which --rollout vllm takes its share of."""
    if s.optimizer not in LORA_BYTES:
        raise ValueError(f"optimizer must be one of {sorted(LORA_BYTES)}; got {s.optimizer!r}")
    weights = weight_bytes(shape, s.load_in_4bit, s.fp32) / GIB
    lora = 16 * shape.lora_params(s.lora_r) / GIB  # float32 weights, gradients and Adam's two moments
    lora_other, lora_update = (b * shape.lora_params(s.lora_r) / GIB for b in LORA_BYTES[s.optimizer])
    row = s.prompt_tokens + s.max_new_tokens
    tokens = s.micro_batch_rows * row  # one micro-batch
    width = 4 if s.fp32 else 2  # bytes an activation: bf16 under autocast, or float32
    kv_token = shape.kv_bytes_per_token() * width // 2
    forward_token = PREFILL_TERMS * shape.intermediate * width  # a no-grad forward's transient, a token (calibrated)
    per_token = ACTIVATION_TERMS * (shape.hidden + shape.intermediate) * width  # one layer recomputed (calibrated)
    layers = width * shape.layers * shape.hidden if s.gradient_checkpointing else per_token * (shape.layers - 1)
    activations = tokens * (per_token + layers) / GIB  # 0.43 MB a token at 7B (measured, H200)
    passes = tokens * (kv_token + forward_token + 2 * width * shape.hidden) / GIB + HEAD_GIB  # no grad: the cache
    out = {"weights": weights, "lora_state": lora, "activations": activations, "head": HEAD_GIB,
           "passes": passes, "prefill": 0.0, "kv_cache": 0.0, "vllm_engine": 0.0}
    if s.rollout == "hf":
        at_once = s.rollout_batch or s.episodes
        prefilled = min(s.prefill_prompts or at_once, at_once)
        out["prefill"] = prefilled * s.prompt_tokens * forward_token / GIB  # the MLP's intermediates, calibrated
        out["kv_cache"] = at_once * row * kv_token / GIB  # left-padded to the longest prompt
        rollout = weights + lora_other + out["prefill"] + out["kv_cache"]
    else:
        engine = s.vllm_gpu_memory * (card_gib or 0.0)  # what vLLM claims; its weights, reserve and KV inside
        out["vllm_engine"] = engine
        out["vllm_weights"] = weight_bytes(shape, False) / GIB  # vLLM 0.33 serves bf16 (no nf4 loader)
        out["vllm_reserve"] = (VLLM_BATCHED_TOKENS * 3 * shape.intermediate * 2 + 0.5 * GIB) / GIB  # + CUDA graphs
        out["vllm_kv"] = engine - out["vllm_weights"] - out["vllm_reserve"]
        rollout = weights + lora_other + engine
    out["phases"] = {"rollout": rollout, "passes": weights + lora_other + passes,
                     "update": weights + lora_update + activations + HEAD_GIB}
    out["peak"] = max(out["phases"].values())
    return out


def fit_problem(shape: Shape, s: Setting, card_gib: float, name: str = "the model") -> str | None:
    """None when every phase fits HEADROOM of the card; else one line: the phase over, and the flag to
    change (with a value that fits, where one does)."""
    p = plan(shape, s, card_gib)
    room = HEADROOM * card_gib
    if s.rollout == "vllm" and p["vllm_kv"] <= 0:
        return (f"--rollout vllm --vllm-gpu-memory {s.vllm_gpu_memory}: vLLM's {p['vllm_engine']:.1f} GiB "
                f"cannot hold {name}'s bf16 weights ({p['vllm_weights']:.1f} GiB) and its reserve; raise it, "
                f"or use --rollout hf")
    over = [phase for phase, gib in p["phases"].items() if gib > room]
    if not over:
        return None
    worst = max(p["phases"], key=p["phases"].get)
    head = (f"{name} needs ~{p['peak']:.1f} GiB in its {worst} phase (weights {p['weights']:.1f}, LoRA state "
            f"{p['lora_state']:.1f}, ...) and the card has {card_gib:.1f} GiB (a plan may use {HEADROOM:.0%})")
    if p["weights"] + p["lora_state"] + HEAD_GIB > room:
        fix = ("--load-in-4bit" if not s.load_in_4bit else "a smaller --model") + " or a smaller --lora-r"
        return f"{head}: the weights alone do not fit; use {fix}"
    fixes = {}
    if "rollout" in over and s.rollout == "vllm":
        fixes["--vllm-gpu-memory"] = "lower"
    elif "rollout" in over:
        sizes = [n for n in (64, 32, 16, 8, 4, 2, 1) if n < (s.rollout_batch or s.episodes)]
        fixes["--rollout-batch"] = next((n for n in sizes if plan(shape, _with(s, rollout_batch=n))["phases"][
            "rollout"] <= room), None)
    if "update" in over or "passes" in over:
        rows = range(s.micro_batch_rows - 1, 0, -1)
        fixes["--micro-batch-rows"] = next((n for n in rows if max(
            plan(shape, _with(s, micro_batch_rows=n), card_gib)["phases"][k] for k in ("update", "passes"))
            <= room), None)
    if None in fixes.values():
        return f"{head}: even one episode or one row at a time does not fit; lower --max-new-tokens or use a " \
               "smaller --model"
    return f"{head}: use " + " ".join(f"{flag} {value}" for flag, value in fixes.items())


def _with(s: Setting, **changes) -> Setting:
    return Setting(**{**s.__dict__, **changes})


# ----------------------------------------------------------------------------- the per-card table
CARDS = {  # usable GiB of each card (what torch sees, less the CUDA context)
    "T4 (16 GB)": 14.6,
    "24 GB (L4, A10, RTX 4090)": 21.5,
    "48 GB (L40S, A6000)": 43.5,
    "80 GB (A100, H100)": 78.5,
    "H200 (141 GB)": 138.0,
}
CARD_SETTINGS = [  # (card, model, setting, what it is): the rows of docs/scaling.md's table
    ("24 GB (L4, A10, RTX 4090)", "Qwen/Qwen2.5-7B-Instruct", Setting(rollout_batch=32), "nf4, generate 32 at a time"),
    ("24 GB (L4, A10, RTX 4090)", "Qwen/Qwen2.5-7B-Instruct", Setting(load_in_4bit=False, rollout_batch=8),
     "bf16, generate 8 at a time"),
    ("24 GB (L4, A10, RTX 4090)", "Qwen/Qwen2.5-1.5B-Instruct",  # tests/test_gpu_path.py: the preset's own
     Setting(load_in_4bit=False, lora_r=32, episodes=16, prompt_tokens=780, max_new_tokens=192),
     "bf16, the course card (--preset course)"),
    ("T4 (16 GB)", "Qwen/Qwen2.5-1.5B-Instruct",
     Setting(load_in_4bit=False, fp32=True, lora_r=32, episodes=16, max_new_tokens=192),
     "float32 (a T4 has no bf16), the course's sizes"),
    ("48 GB (L40S, A6000)", "Qwen/Qwen2.5-7B-Instruct", Setting(rollout_batch=64), "nf4, generate 64 at a time"),
    ("48 GB (L40S, A6000)", "Qwen/Qwen2.5-7B-Instruct", Setting(rollout="vllm", vllm_gpu_memory=0.45),
     "nf4 trainer, bf16 vLLM engine"),
    ("80 GB (A100, H100)", "Qwen/Qwen2.5-7B-Instruct", Setting(load_in_4bit=False, rollout="vllm"),
     "bf16 trainer and engine"),
    ("80 GB (A100, H100)", "Qwen/Qwen2.5-7B-Instruct", Setting(load_in_4bit=False), "bf16, generate all 128"),
    ("H200 (141 GB)", "Qwen/Qwen2.5-7B-Instruct", Setting(load_in_4bit=False, rollout="vllm", vllm_gpu_memory=0.5),
     "bf16 trainer and engine"),
    ("H200 (141 GB)", "Qwen/Qwen2.5-7B-Instruct", Setting(load_in_4bit=False), "bf16, generate all 128"),
]


def card_table() -> str:
    """docs/scaling.md's per-card table, row by row from `plan`."""
    lines = ["| card (usable GiB) | model, setting | weights | LoRA state | update | rollout | peak | fits |",
             "|---|---|---|---|---|---|---|---|"]
    for card, model, s, what in CARD_SETTINGS:
        gib = CARDS[card]
        p = plan(QWEN[model], s, gib)
        if s.rollout == "hf":
            rollout = (f"{p['phases']['rollout']:.1f} (prefill {p['prefill']:.1f}, KV {p['kv_cache']:.1f}, "
                       f"{s.rollout_batch or s.episodes} at once)")
        else:
            rollout = (f"{p['phases']['rollout']:.1f} (vLLM {p['vllm_engine']:.1f}: bf16 weights "
                       f"{p['vllm_weights']:.1f}, reserve {p['vllm_reserve']:.1f}, KV {p['vllm_kv']:.1f})")
        fits = "yes" if fit_problem(QWEN[model], s, gib) is None else "no"
        short = model.split("/")[1].removesuffix("-Instruct")
        lines.append(f"| {card} ({gib}) | {short}, {what} | {p['weights']:.1f} | {p['lora_state']:.1f} | "
                     f"{p['phases']['update']:.1f} | {rollout} | {p['peak']:.1f} | {fits} |")
    return "\n".join(lines)


def shape_of(name: str) -> Shape | None:
    """The shape of a model by name: the planned Qwen shapes, else its local config (None if unreadable)."""
    return QWEN[name] if name in QWEN else local_shape(name)


def local_shape(name: str) -> Shape | None:
    """The shape in a model's config.json as found on this machine, without the network (None when
    there is none, or it is not a Qwen2 / Llama-style config)."""
    try:
        from transformers import AutoConfig  # deferred: only a model outside the table needs it

        return Shape.of(AutoConfig.from_pretrained(name, trust_remote_code=False, local_files_only=True))
    except Exception:  # no local config: the load itself will say what is missing
        return None
