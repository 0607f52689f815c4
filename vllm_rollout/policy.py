"""vLLM rollouts (train.py --rollout vllm): rollout.ModelPolicy's `act` contract, decoded by vLLM.

What stays the same as --rollout hf (METHOD.md section 7):
  - the prompts go in as token ids (`TokensPrompt`: nothing is re-tokenized) and the sampled ids
    come back exactly, cut after the first end-of-turn id, as ModelPolicy cuts them;
  - the sampling: temperature --temperature, no top-p / top-k / min-p, no repetition penalty,
    a seed per prompt drawn from the run's torch generator (so a seeded run repeats);
  - the trainer recomputes logp_student before the update (stage 4); vLLM's own log-probs of
    its samples are kept only to log how far they are from the trainer's (`rollout/logp_diff_*`,
    as verl logs its rollout-vs-trainer difference), so that a mismatch is seen, not guessed.

How the adapter reaches the engine: the engine starts once per run on the base weights (with a
warm start, the warm-started base, saved once as a model folder; a 4-bit run serves the model
itself with vLLM's bitsandbytes loader). Before each rollout the trainer saves the LoRA adapter
it has now and the engine serves it as a new `LoRARequest` (as OpenPipe ART does): the 4-bit
weights are never merged into, and vLLM never serves a stale adapter (tested).

Installed apart (bash vllm_rollout/install_vllm.sh): vLLM pins transformers < 5.20 and torch.
On CPU the engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, set below) and is for
testing the integration, not for speed (docs/scaling.md). The GPU settings (--vllm-gpu-memory,
sleep mode while training, 4-bit serving) are wired but have not yet run on a GPU.
"""
from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process, no spawned workers
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on a CPU (the default 4 is more than a test needs)

import shutil
import sys
from pathlib import Path

import torch

from infra.cli import UserError
from rollout import default_model_name, sampling_config, save_adapter, until_end_of_turn
from segments import generation_prompt_ids
from vllm_rollout import missing


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
    """An actor with ModelPolicy's `act`, decoding with one vLLM engine started once per run.

    model: the trainer's peft model (its base weights are served; `serve` hands over the adapter);
    folder: where the base folder and each served adapter are written (the run folder's vllm/).
    """

    def __init__(self, model, tokenizer, folder: str | os.PathLike, max_new_tokens: int, temperature: float,
                 lora_r: int, seed: int, base_name: str | None = None, gpu_memory: float = 0.35,
                 max_model_len: int = 8192):
        if problem := missing():
            raise UserError(problem)
        self.tokenizer, self.folder = tokenizer, Path(folder)
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.eos = sorted(sampling_config(tokenizer, model, max_new_tokens, temperature).eos_token_id)
        cuda = torch.cuda.is_available()
        load_in_4bit = bool(getattr(model.get_base_model(), "is_loaded_in_4bit", False))
        if load_in_4bit:  # vLLM quantizes the model itself: nothing merged, nothing saved
            source, quant = base_name or default_model_name(), "bitsandbytes"
        else:
            source, quant = str(save_base(model, self.folder / "base")), None
        self.llm = _start_engine(
            model=source, skip_tokenizer_init=True,  # ids in, ids out: the trainer's tokenizer is the only one
            enable_lora=True, max_lora_rank=lora_r, max_loras=1,
            dtype="bfloat16" if model.get_input_embeddings().weight.dtype == torch.bfloat16 or load_in_4bit
            else "float32",
            quantization=quant, seed=seed, max_model_len=max_model_len,
            logprobs_mode="processed_logprobs",  # after the temperature, as the trainer computes them
            **(dict(gpu_memory_utilization=gpu_memory, enable_sleep_mode=True) if cuda else {}),
        )
        self.sleeps, self.asleep = cuda, False  # on a GPU the engine frees its memory while the trainer computes
        self.lora = None
        self.tokens_generated = 0
        self.sampled: dict[tuple, list[float]] = {}  # (prompt ids, response ids) -> vLLM's log-prob of each token

    def serve(self, model, iteration: int) -> None:
        """Serve the adapter `model` holds now (saved to folder/adapter-<iteration>) from the next act on."""
        from vllm.lora.request import LoRARequest

        path = self.folder / f"adapter-{iteration:06d}"
        save_adapter(model, path)
        if self.lora is not None:
            shutil.rmtree(self.lora.lora_path, ignore_errors=True)  # the adapter served before: never again
        self.lora = LoRARequest(f"iter-{iteration}", iteration, str(path))  # a new id: vLLM loads it afresh
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False
        self.tokens_generated, self.sampled = 0, {}

    def rest(self) -> None:
        """The rollout is over: on a GPU, free the engine's memory (weights kept in host memory) for the update."""
        if self.sleeps:
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

    def metrics(self, batch) -> dict:
        """rollout/logp_diff_mean and _max: |vLLM's log-prob - the trainer's logp_student| over the
        sampled tokens of the rows the student pass computed."""
        diffs = []
        for b, row in enumerate(batch.rows):
            logps = self.sampled.get((tuple(row.input_ids[: row.num_prompt]), tuple(row.response_ids)))
            if logps is None or not bool(batch.logp_student[b].any()):
                continue  # a row the student pass left out (its Ahat is 0)
            trainer = batch.logp_student[b, : len(logps)]
            diffs.append((torch.tensor(logps) - trainer).abs())
        if not diffs:
            return {}
        d = torch.cat(diffs)
        return {"rollout/logp_diff_mean": float(d.mean()), "rollout/logp_diff_max": float(d.max())}
