"""Model loading and evaluation end to end: the embedded SmolLM2, the fit check, eval.py."""
import json

import pytest
import torch

import eval as eval_script
import train
from envs.alfworld import AlfWorldEnv
from infra import config
from infra.cli import UserError
from rollout import ModelPolicy, build_tiny_model, build_tiny_tokenizer, check_fits, load_policy, play_episodes
from stub_env import StubEnv
from tiny_runs import flags


def test_embedded_smollm2_plays_a_short_episode():
    """The real SmolLM2-135M-Instruct loads from the installed package (with the shipped warm
    start merged in) and plays one short ALFWorld episode; every step holds sampled ids."""
    model, tok = load_policy("smollm2", lora_r=4, lora_alpha=8, init_adapter=config.WARMSTART, announce=lambda s: None)
    assert model.get_base_model().config.model_type == "llama"
    env = AlfWorldEnv(max_steps=2)
    task = [t for t in env.tasks("train") if "DeskLamp" in t][0]
    trajs = play_episodes(env, [task, task], ModelPolicy(model, tok, max_new_tokens=24), history_len=2)
    env.close()
    for traj in trajs:
        assert 1 <= len(traj.steps) <= 2
        for step in traj.steps:
            assert 1 <= len(step.response_ids) <= 24 and step.prompt_ids


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
    assert (tmp_path / "run" / "eval_alfworld_valid_unseen_iter-000001.json").exists()


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
    args = train.parse_args(["--load-in-4bit"] + flags(
        model=str(tmp_path / "tiny-qwen2"), preset="none", groups=2, group_size=2, max_steps=2, max_new_tokens=6,
        lr=1e-2, eval_every=0, hindsight="expert", output_dir=str(tmp_path / "run")))
    trainer = train.Trainer(args, model=model, tokenizer=tok, env=StubEnv(2))
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    metrics, _ = trainer.iteration()
    assert metrics["rows"] > 0 and metrics["update/optimizer_steps"] == 2
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters() if "lora_" in n)


@pytest.mark.parametrize("amx, avx512_bf16, expected", [(True, True, "bf16"), (False, True, "fp32"), (False, False, "fp32")])
def test_dtype_auto_takes_bf16_on_a_cpu_only_with_amx(monkeypatch, amx, avx512_bf16, expected):
    """--dtype auto on a CPU: bf16 where AMX tiles are present; float32 on a CPU with AVX512-BF16 alone,
    where the demo's iteration measured 1.5x slower in bf16 (docs/scaling.md); a GPU always bf16."""
    from rollout import resolve_dtype

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    assert resolve_dtype("auto", "cpu") == expected
    assert resolve_dtype("auto", "cuda") == "bf16" and resolve_dtype("fp32", "cpu") == "fp32"
