"""Checkpoints load as exactly the policy that was trained (resume, eval, plain peft on the plain
base, the warm start folded in), and loading one never runs code or accepts non-finite weights."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file, save_file

import eval as eval_script
import train
from cli_runs import one_line as _one_line
from cli_runs import run_cli as _cli
from flags import WARMSTART
from infra import checkpoint
from infra.checkpoint import find_checkpoint, load_checkpoint_policy, save_policy
from infra.cli import UserError
from infra.models import build_tiny_model, build_tiny_tokenizer, load_policy, smollm2_gguf
from stub_env import StubEnv
from tiny_runs import flags, tiny_args, tiny_run_folder, tiny_train

ROOT = Path(__file__).resolve().parent.parent


def _logits(model, ids=(5, 9, 14, 3, 77, 12)) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor([list(ids)])).logits


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_eval_and_plain_peft_reproduce_a_tiny_run(tmp_path, dtype):
    """A tiny run with seed 7: eval.py's policy, the policy rebuilt for resume and plain peft on
    the base built with the run's seed (in the run's --dtype) all give the trained policy's logits exactly."""
    args = train.parse_args(flags(model="tiny", preset="none", iterations=1, groups=2, group_size=2, max_steps=2,
                                   max_new_tokens=6, lora_r=4, lora_alpha=8, eval_every=0, lr=5e-2, seed=7,
                                   dtype=dtype, output_dir=str(tmp_path / "run")))
    trainer = train.Trainer(args, env=StubEnv(2))
    train.train(args, trainer)
    trained = _logits(trainer.model)
    ckpt = find_checkpoint(tmp_path / "run")
    policy = eval_script.load_model_policy(eval_script.EvalArgs(policy="model", checkpoint=str(ckpt)), ckpt)
    assert torch.equal(_logits(policy.model), trained)
    assert torch.equal(_logits(load_checkpoint_policy(ckpt)[0]), trained)
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    base = build_tiny_model(build_tiny_tokenizer(), seed=7).to(torch_dtype)
    assert torch.equal(_logits(PeftModel.from_pretrained(base, str(ckpt))), trained)
    other_seed = PeftModel.from_pretrained(build_tiny_model(build_tiny_tokenizer(), seed=0).to(torch_dtype), str(ckpt))
    assert not torch.allclose(_logits(other_seed), trained)  # the seed matters: eval must use the run's


def test_warm_started_checkpoint_loads_in_plain_peft_on_the_plain_base(tmp_path):
    """With a warm start (merged into the base before training), the saved adapter folds the warm
    start in: plain peft on the *un-warm-started* base reproduces the trained logits; resume and
    eval (warm start merged, trained adapter on top) reproduce them exactly; the model card and
    adapter_config name the base and the warm start."""
    tok = build_tiny_tokenizer()
    warm, _ = load_policy("tiny", lora_r=4, lora_alpha=16, seed=3)  # a stand-in warm start: random non-zero B
    with torch.no_grad():
        for n, p in warm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    warm.save_pretrained(tmp_path / "warm")
    args = train.parse_args(flags(model="tiny", preset="none", iterations=1, groups=2, group_size=2, max_steps=2,
                                   max_new_tokens=6, lora_r=2, lora_alpha=8, eval_every=0, lr=5e-2, seed=3,
                                   init_adapter=str(tmp_path / "warm"), dtype="fp32",  # float32: compared at 1e-5
                                   output_dir=str(tmp_path / "run")))
    trainer = train.Trainer(args, env=StubEnv(2))
    train.train(args, trainer)
    trained = _logits(trainer.model)
    ckpt = find_checkpoint(tmp_path / "run")
    assert torch.equal(_logits(load_checkpoint_policy(ckpt)[0]), trained)
    plain = PeftModel.from_pretrained(build_tiny_model(tok, seed=3), str(ckpt))
    assert torch.allclose(_logits(plain), trained, atol=1e-5)
    no_fold = PeftModel.from_pretrained(build_tiny_model(tok, seed=3), str(ckpt / "trained"))
    assert not torch.allclose(_logits(no_fold), trained, atol=1e-3)  # the warm start is what the fold adds
    card = (ckpt / "README.md").read_text()
    assert "--algo sharpo" in card and "warm" in card and "rank 6" in card
    assert json.loads((ckpt / "adapter_config.json").read_text())["r"] == 6


@pytest.mark.slow
def test_smollm2_checkpoint_with_the_shipped_warm_start(tmp_path):
    """The embedded SmolLM2 with the shipped warm start: the saved checkpoint gives the same
    logits through eval/resume loading (exactly) and through plain peft on the GGUF base
    (folded); adapter_config names the Hugging Face id and the card says how to load the file."""
    model, _ = load_policy("smollm2", lora_r=4, lora_alpha=8, init_adapter=WARMSTART, announce=lambda s: None)
    with torch.no_grad():  # stands in for training: a non-zero adapter
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02, generator=torch.Generator().manual_seed(0))
    trained = _logits(model)
    flags = {**vars(train.TrainArgs(model="smollm2", init_adapter=str(WARMSTART), load_in_4bit=False,
                                    lora_r=4, lora_alpha=8, dtype="fp32"))}  # the dtype load_policy used above
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    save_policy(model, ckpt, flags, WARMSTART)
    (ckpt / "config.json").write_text(json.dumps(flags))
    assert torch.equal(_logits(load_checkpoint_policy(ckpt)[0]), trained)
    from transformers import AutoModelForCausalLM

    gguf = smollm2_gguf()
    base = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # float32 rounding only: one path merges the warm start into the base weights, the other applies it
    # as LoRA on the fly; over 30 layers that moves logits of size ~30 by ~3e-4 (1e-5 of their scale)
    assert torch.allclose(_logits(PeftModel.from_pretrained(base, str(ckpt))), trained, atol=5e-4, rtol=1e-5)
    assert json.loads((ckpt / "adapter_config.json").read_text())["base_model_name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert "gguf_file" in (ckpt / "README.md").read_text()


def test_an_adapter_for_another_model_is_a_clear_error():
    with pytest.raises(UserError, match="another base model"):
        load_policy("tiny", init_adapter=WARMSTART)


class _Payload:
    """Unpickling this would create a file: the proof that code ran."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_a_crafted_run_folder_runs_no_code_on_resume(tmp_path):
    """optimizer.pt holding a pickled call (what a crafted folder could ship) is refused with a
    clear error and the call never runs; rng.json is plain JSON, a bad one is an error."""
    tiny_train(tiny_args(tmp_path / "run", iterations=1))
    ckpt = checkpoint.find_checkpoint(tmp_path / "run")
    marker = tmp_path / "pwned"
    torch.save({"state": {}, "param_groups": [], "x": _Payload(marker)}, ckpt / "optimizer.pt")
    with pytest.raises(UserError, match="tensors only"):
        train.Trainer(train.parse_args(["--resume", str(tmp_path / "run"), "--iterations", "2"]), env=StubEnv(2))
    assert not marker.exists()
    assert not (ckpt / "rng.pt").exists()  # RNG state is JSON, not a pickle
    json.loads((ckpt / "rng.json").read_text())


# ----------------------------------------------------------------------------- 2. kills
# After each stage of the loop (the Trainer method, wrapped here), and between the writes of the
# run folder (checkpoint.crash_hook, called where infra/checkpoint.py writes).


def test_samples_stay_valid_json_and_nan_weights_are_refused(tmp_path):
    """A non-finite number is written as null (strict JSON parses every line); an adapter or an
    optimizer state holding NaN is refused at load with a clear message."""
    path = tmp_path / "log.jsonl"
    checkpoint.append_jsonl(path, [{"iteration": 1, "gap": float("nan"), "xs": [1.0, float("inf")]}])
    record = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"bare {c} in JSON"))
    assert record["gap"] is None and record["xs"] == [1.0, None]

    tiny_train(tiny_args(tmp_path / "run", iterations=1))
    ckpt = checkpoint.find_checkpoint(tmp_path / "run")
    from safetensors.torch import load_file, save_file

    weights = load_file(ckpt / "adapter_model.safetensors")
    name = next(iter(weights))
    weights[name][0, 0] = float("nan")
    save_file(weights, ckpt / "adapter_model.safetensors")
    with pytest.raises(UserError, match="non-finite"):
        checkpoint.load_checkpoint_policy(ckpt)
    state = torch.load(ckpt / "optimizer.pt", weights_only=True)
    next(iter(state["state"].values()))["exp_avg"].fill_(float("nan"))
    torch.save(state, ckpt / "optimizer.pt")
    with pytest.raises(UserError, match="non-finite"):
        checkpoint.load_optimizer_state(ckpt)


# ----------------------------------------------------------------------------- a checkpoint is what it claims
def _resume_trainer(run):
    args = train.parse_args(["--resume", str(run), "--iterations", "2"])
    return train.Trainer(args, env=StubEnv(args.max_steps))


@pytest.mark.parametrize("damage", ["no lora_B", "renamed", "empty", "wrong shape"])
def test_an_adapter_that_does_not_match_its_config_is_one_line(tmp_path, damage):
    """peft loads an adapter file missing tensors with fresh LoRA weights in their place (a warning only): resume
    and eval.py refuse it, naming the file."""
    run = tiny_run_folder(tmp_path)
    weights = run / "checkpoints" / "iter-000001" / "adapter_model.safetensors"
    state = load_file(weights)
    if damage == "no lora_B":
        state = {k: v for k, v in state.items() if "lora_B" not in k}
    elif damage == "renamed":
        state = {k.replace("q_proj", "qq_proj"): v for k, v in state.items()}
    elif damage == "empty":
        state = {}
    else:
        key = next(k for k in state if "lora_A" in k)
        state[key] = torch.zeros(3, 3)
    save_file(state, weights)
    said = "another base model" if damage == "wrong shape" else "adapter_model.safetensors"
    with pytest.raises(UserError, match=said):
        _resume_trainer(run)
    done = _cli("eval.py", "--policy", "model", "--checkpoint", str(run), "--num-games", "1", "--max-steps", "1")
    _one_line(done, said)


def test_a_diverged_policy_is_named_at_the_step_that_made_it_and_at_load(tmp_path):
    """A learning rate of 1e30 (past --lr's range): the first optimizer step makes the logits overflow; the run
    stops in one line naming it, and no checkpoint of that iteration is written. A checkpoint whose weights are
    near 1e30 (they pass the finite check) is refused at resume and at eval, naming the checkpoint to go back to."""
    import train

    args = train.parse_args(flags(model="tiny", preset="none", iterations=2, groups=1, group_size=4, max_steps=2,
                                  max_new_tokens=8, lr=1e-2, lora_r=4, lora_alpha=8, eval_every=0,
                                  hindsight="expert", output_dir=str(tmp_path / "div")))
    args.lr = 1e30  # past the range --lr takes on a command line: a step made to overflow
    with pytest.raises(UserError, match="iteration 1: an optimizer step made the policy's sampling distribution "
                                        "non-finite.*no checkpoint yet"):
        train.train(args, train.Trainer(args, env=StubEnv(2)))
    assert not list((tmp_path / "div").glob("checkpoints/iter-*"))
    run = tiny_run_folder(tmp_path, "ok", iterations=2, keep_checkpoints=2)
    ckpt = run / "checkpoints" / "iter-000002"
    tensors = load_file(str(ckpt / "adapter_model.safetensors"))
    save_file({k: v * 1e30 if "lora_B" in k else v for k, v in tensors.items()}, str(ckpt / "adapter_model.safetensors"))
    with pytest.raises(UserError, match=r"iter-000002: its policy's sampling distribution is not finite.*go back to "
                                        r".*iter-000001"):
        train.Trainer(train.parse_args(["--resume", str(run), "--iterations", "3"]), env=StubEnv(2))
    done = subprocess.run([sys.executable, "eval.py", "--policy", "model", "--checkpoint", str(run), "--num-games",
                           "1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "sampling distribution is not finite" in done.stderr.strip().splitlines()[-1]


def test_a_checkpoint_removed_while_it_loads_is_one_line(tmp_path, monkeypatch):
    """eval.py on a checkpoint a running run prunes as it loads: HFValidationError ('Repo id must be...')
    before; now one line saying so and what to load instead."""
    import shutil

    from infra import checkpoint

    run = tiny_run_folder(tmp_path)
    ckpt = checkpoint.find_checkpoint(run)

    def pruned(name, **kwargs):
        shutil.rmtree(ckpt)
        raise ValueError("Repo id must be in the form 'repo_name' or 'namespace/repo_name'")

    monkeypatch.setattr(checkpoint, "load_policy", pruned)
    with pytest.raises(UserError, match="was removed while it loaded .*load the run folder"):
        checkpoint.load_checkpoint_policy(ckpt)


def test_latest_names_the_newest_complete_checkpoint_after_a_kill_between_rename_and_link(tmp_path, monkeypatch):
    """A kill after the final checkpoint's rename and before `latest` is updated left `latest` at the
    one before: a resume of the finished run is refused (nothing would run), so nothing wrote the link
    again, and eval.py --checkpoint RUN/latest scored the older checkpoint. Now RUN/latest is read as
    the run's newest complete checkpoint, and a resume, refused or not, points the link at it."""
    class Killed(BaseException):  # kill -9: no handler runs
        pass

    def kill_at_the_final_rename(name):
        if name == "checkpoint renamed" and (tmp_path / "run" / "checkpoints" / "iter-000002").is_dir():
            raise Killed

    monkeypatch.setattr(checkpoint, "crash_hook", kill_at_the_final_rename)
    with pytest.raises(Killed):
        tiny_train(tiny_args(tmp_path / "run", iterations=2))
    monkeypatch.undo()
    run = tmp_path / "run"
    assert os.readlink(run / "latest") == "checkpoints/iter-000001"  # what the kill left
    assert find_checkpoint(run / "latest").name == "iter-000002"  # what eval.py --checkpoint RUN/latest scores
    with pytest.raises(UserError, match="is at iteration 2 already"):
        train.parse_args(["--resume", str(run), "--iterations", "2"])
    assert os.readlink(run / "latest") == "checkpoints/iter-000002"
