"""Model loading and evaluation end to end: the embedded SmolLM2, the fit check, eval.py."""
import json

import pytest
import torch

import eval as eval_script
import train
from envs.alfworld import AlfWorldEnv
from flags import DATA, WARMSTART
from infra.cli import UserError
from infra.models import build_tiny_model, build_tiny_tokenizer, check_fits, load_policy, smollm2_folder, smollm2_gguf
from rollout import ModelPolicy, play_episodes
from stub_env import StubEnv
from tiny_runs import flags


def test_embedded_smollm2_plays_a_short_episode():
    """The real SmolLM2-135M-Instruct loads from the installed package (with the shipped warm
    start merged in) and plays one short ALFWorld episode; every step holds sampled ids."""
    model, tok = load_policy("smollm2", lora_r=4, lora_alpha=8, init_adapter=WARMSTART, announce=lambda s: None)
    assert model.get_base_model().config.model_type == "llama"
    env = AlfWorldEnv(max_steps=2)
    task = [t for t in env.tasks("train") if "DeskLamp" in t][0]
    trajs = play_episodes(env, [task, task], ModelPolicy(model, tok, max_new_tokens=24), history_len=2)
    env.close()
    for traj in trajs:
        assert 1 <= len(traj.steps) <= 2
        for step in traj.steps:
            assert 1 <= len(step.response_ids) <= 24 and step.prompt_ids


@pytest.mark.slow
def test_the_embedded_model_folder_holds_the_gguf_weights_and_tokenizer(tmp_path, monkeypatch):
    """The folder made once from the GGUF file loads to the very weights, config and tokenizer that
    reading the GGUF gives; it is made whole (no partial folder left) and then only read."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("SHARPO_CACHE", str(tmp_path))
    said = []
    folder = smollm2_folder(announce=said.append)
    assert folder.parent == tmp_path and [p.name for p in tmp_path.iterdir()] == [folder.name]
    assert len(said) == 1 and "converting" in said[0]
    assert smollm2_folder(announce=said.append) == folder and len(said) == 1  # made once
    gguf = smollm2_gguf()
    direct = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    cached = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    a, b = direct.state_dict(), cached.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert cached.config.tie_word_embeddings == direct.config.tie_word_embeddings
    tok_direct = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tok_cached = AutoTokenizer.from_pretrained(folder)
    text = (DATA.parent / "README.md").read_text() + " ünïcödé 日本語 <|im_end|>\n\n  x"
    messages = [{"role": "user", "content": "go to desk 1"}, {"role": "assistant", "content": "<action>look</action>"}]
    assert tok_cached(text)["input_ids"] == tok_direct(text)["input_ids"]
    assert tok_cached.apply_chat_template(messages, tokenize=False) == tok_direct.apply_chat_template(messages, tokenize=False)
    assert (tok_cached.eos_token_id, tok_cached.pad_token_id, len(tok_cached)) == \
        (tok_direct.eos_token_id, tok_direct.pad_token_id, len(tok_direct))


def test_an_unwritable_model_cache_reads_the_gguf_file(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("SHARPO_CACHE", str(tmp_path / "a-file" / "cache"))
    said = []
    assert smollm2_folder(announce=said.append) == smollm2_gguf()
    assert "SHARPO_CACHE" in said[0]
    assert smollm2_folder(announce=said.append) == smollm2_gguf() and len(said) == 1  # a load's second call: said once


def test_a_failed_conversion_is_tried_once_per_process(tmp_path, monkeypatch):
    """A conversion that fails (a full disk) falls back to the GGUF file once: the tokenizer's load
    and the model's load of one run do not convert twice, and the line is said once; no partial folder stays."""
    from infra import models

    monkeypatch.setenv("SHARPO_CACHE", str(tmp_path))
    tries = []

    def full_disk(*args, **kwargs):
        tries.append(1)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(models.AutoTokenizer, "from_pretrained", full_disk)
    said = []
    assert smollm2_folder(announce=said.append) == smollm2_gguf()
    assert len(said) == 2 and "converting" in said[0] and "no space left" in said[1].lower()
    assert smollm2_folder(announce=said.append) == smollm2_gguf()
    assert len(tries) == 1 and len(said) == 2
    assert list(tmp_path.iterdir()) == []


def test_fit_check_refuses_a_model_too_big(tmp_path):
    """Before loading, a model whose weights exceed the device's memory is a clear error
    (a 405B-shaped config on this machine), with the size it would need."""
    from transformers import LlamaConfig

    LlamaConfig(hidden_size=16384, intermediate_size=53248, num_hidden_layers=126, num_attention_heads=128,
                num_key_value_heads=8, vocab_size=128256).save_pretrained(tmp_path)
    with pytest.raises(MemoryError, match="GiB"):
        check_fits(str(tmp_path), "cpu", load_in_4bit=True)


def test_eval_expert_and_a_trained_checkpoint(tmp_path):
    """eval.py plays the expert on the shipped valid_unseen games (all won) and evaluates a
    train.py checkpoint with --policy model, writing the documented JSON keys."""
    out = tmp_path / "expert.json"  # (eval's default is runs/eval/...; keep the checkout clean)
    metrics = eval_script.main(["--policy", "expert", "--out", str(out)])
    assert metrics["success"] == 1.0 and json.loads(out.read_text())["episodes"] == 3
    for key in ("success", "mean_reward", "mean_steps", "invalid_rate", "env_ms_per_step", "env_ms_per_reset"):
        assert key in metrics
    args = train.parse_args(["--model=tiny", "--preset=none", "--iterations=1", "--groups=1", "--group-size=2",
                             "--max-steps=2", "--max-new-tokens=4", "--lora-r=4", "--eval-every=0",
                             f"--output-dir={tmp_path / 'run'}"])
    train.train(args)
    torch.manual_seed(0)
    m = eval_script.main(["--policy", "model", "--checkpoint", str(tmp_path / "run"),
                          "--num-games", "2", "--max-steps", "2", "--max-new-tokens", "4"])
    assert m["episodes"] == 2 and m["invalid_rate"] == 1.0  # a random tiny model cannot answer validly
    assert (tmp_path / "run" / "evalpy_alfworld_valid_unseen_iter-000001.json").exists()


def test_eval_samples_each_game_several_times(tmp_path):
    """--samples-per-game K plays each game K times and records the share of them won; a greedy
    policy would replay one episode K times, so K > 1 needs sampling."""
    from segments import Step, Trajectory

    trajs = [Trajectory("a", 0, "t", won=w) for w in (True, False, True, False)] + [Trajectory("b", 0, "t", won=True)]
    trajs[-1].steps = [Step([], [], [], "", a, 0.0, "", None) for a in ("go to desk 1", None)]
    outcomes = eval_script.game_outcomes(trajs)
    assert outcomes["a"] == {"won": 0.5, "steps": 0.0, "samples": 4, "actions": [[], [], [], []]}
    assert outcomes["b"] == {"won": True, "steps": 2, "actions": [["go to desk 1", None]]}
    out = tmp_path / "sampled.json"
    m = eval_script.main(["--policy", "model", "--model", "tiny", "--temperature", "1", "--samples-per-game", "3",
                          "--num-games", "2", "--max-steps", "1", "--max-new-tokens", "4", "--out", str(out)])
    games = json.loads(out.read_text())["games"]
    assert m["episodes"] == 6 and len(games) == 2 and all(g["samples"] == 3 for g in games.values())
    assert all(len(g["actions"]) == 3 and all(len(a) == 1 for a in g["actions"]) for g in games.values())
    with pytest.raises(UserError, match="--temperature > 0"):
        eval_script.main(["--policy", "model", "--model", "tiny", "--samples-per-game", "3"])


def test_eval_rejects_a_folder_that_is_not_a_checkpoint(tmp_path):
    """--checkpoint on a folder without a checkpoint says so."""
    with pytest.raises(UserError, match="no complete checkpoint"):
        eval_script.main(["--policy", "model", "--checkpoint", str(tmp_path)])


def test_four_bit_loading_rolls_out_and_updates_on_cpu(tmp_path):
    """A tiny Qwen2 saved to a folder loads through load_policy(..., load_in_4bit=True,
    device='cpu') as nf4 + LoRA, plays a rollout and takes an update step that moves the LoRA
    weights (with the bitsandbytes CPU workaround in place)."""
    import bitsandbytes as bnb

    tok = build_tiny_tokenizer()
    build_tiny_model(tok, seed=0).save_pretrained(tmp_path / "tiny-qwen2")
    tok.save_pretrained(tmp_path / "tiny-qwen2")
    model, tok = load_policy(str(tmp_path / "tiny-qwen2"), load_in_4bit=True, device="cpu", lora_r=4, lora_alpha=8,
                             announce=lambda s: None)
    assert any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())
    args = train.parse_args(["--load-in-4bit", "True"] + flags(
        model=str(tmp_path / "tiny-qwen2"), preset="none", groups=2, group_size=4, max_steps=2, max_new_tokens=6,
        lr=1e-2, eval_every=0, hindsight="expert", output_dir=str(tmp_path / "run")))
    trainer = train.Trainer(args, model=model, tokenizer=tok, env=StubEnv(2))
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    metrics, _ = trainer.iteration()
    assert metrics["rows"] > 0 and metrics["update/optimizer_steps"] == 2
    assert metrics["groups_with_spread"] > 0  # a group that won and lost: a signal for the update to follow
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters() if "lora_" in n)


def test_dtype_auto_is_bf16_on_a_gpu_that_has_it_and_the_given_value_otherwise(monkeypatch):
    """--dtype auto: bf16 on a GPU of compute capability 8 or more, float32 on one without bf16 (a T4,
    7.5); fp32 for the tiny test model on a CPU (tests stay exact); a given value is kept (the CPU
    measurement itself: tests/test_precision.py)."""
    from infra.models import resolve_dtype

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 9))
    assert resolve_dtype("auto", "cuda", "smollm2") == "bf16" and resolve_dtype("auto", "cpu", "tiny") == "fp32"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 5))
    assert resolve_dtype("auto", "cuda", "smollm2") == "fp32"
    assert resolve_dtype("fp32", "cpu", "smollm2") == "fp32" and resolve_dtype("bf16", "cpu") == "bf16"


def test_a_full_disk_under_the_model_cache_falls_back_to_the_model_file(tmp_path, monkeypatch):
    """The embedded model's one-time conversion on a full file system (safetensors says so as its own error
    type: a SafetensorError traceback before) says why and reads the GGUF file instead."""
    import transformers
    from safetensors import SafetensorError

    from infra import models

    monkeypatch.setenv("SHARPO_CACHE", str(tmp_path / "cache"))
    tiny = models.build_tiny_model(models.build_tiny_tokenizer())
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: tiny)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: models.build_tiny_tokenizer())

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                              "\"No space left on device\" })")

    monkeypatch.setattr(type(tiny), "save_pretrained", full)
    said = []
    source = models.smollm2_folder(announce=said.append)
    assert source.suffix == ".gguf" and "no space left on the device" in said[-1]
