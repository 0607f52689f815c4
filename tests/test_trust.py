"""A run resumes, evaluates and loads in plain peft as exactly the policy it trained; every
flag means what it says (issue: trustworthy runs)."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft import PeftModel

import eval as eval_script
import train
from envs import draw_tasks
from infra import config, metrics
from infra.checkpoint import find_checkpoint, load_checkpoint_policy, save_policy
from infra.cli import UserError
from envs import step_prompt
from envs.alfworld import build_messages as alfworld_messages
from envs.webshop import build_messages as webshop_messages
from rollout import build_tiny_model, build_tiny_tokenizer, load_policy, smollm2_gguf
from segments import action_token_mask, add_hindsight
from stub_env import StubEnv

ROOT = Path(__file__).resolve().parent.parent


def _flags(**kw) -> list[str]:
    return [f"--{k.replace('_', '-')}={v}" for k, v in kw.items()]


def _tiny_run(tmp_path, name="run", **kw) -> Path:
    """A finished 1-iteration tiny run on the stub env; returns its folder."""
    base = dict(model="tiny", preset="none", iterations=1, groups=2, group_size=2, max_steps=2, max_new_tokens=6,
                lora_r=4, lora_alpha=8, eval_every=0, hindsight="expert", lr=1e-2, seed=7,
                output_dir=str(tmp_path / name))
    base.update(kw)
    args = train.parse_args(_flags(**base))
    train.train(args, train.Trainer(args, env=StubEnv(args.max_steps)))
    return tmp_path / name


def _logits(model, ids=(5, 9, 14, 3, 77, 12)) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor([list(ids)])).logits


# ----------------------------------------------------------------------------- 1-2 resume
def test_resume_writes_into_the_folder_it_resumes(tmp_path, monkeypatch):
    """`--resume runs/X` without --output-dir continues in runs/X: its checkpoint and log move
    on; the default folder runs/<env>-<algo> is never created."""
    monkeypatch.chdir(tmp_path)
    run = _tiny_run(tmp_path, "X")
    args = train.parse_args(["--resume", str(run), "--iterations", "2"])
    assert Path(args.output_dir).resolve() == run.resolve()
    train.train(args, train.Trainer(args, env=StubEnv(args.max_steps)))
    assert json.loads((run / "latest" / "state.json").read_text())["iteration"] == 2
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    assert not (tmp_path / "runs").exists()
    with pytest.raises(UserError, match="--output-dir"):
        train.parse_args(["--resume", str(run), "--output-dir", str(tmp_path / "elsewhere")])


def test_resume_restores_every_saved_setting_and_refuses_changes(tmp_path):
    """Every saved flag comes back (not the command line's defaults); a flag that would change
    the experiment is refused by name; --iterations and eval/logging flags may change."""
    run = _tiny_run(tmp_path, algo="rlsd", lam=0.3, kl_coef=0.05, hindsight="expert", group_size=2)
    args = train.parse_args(["--resume", str(run), "--iterations", "3", "--eval-every", "5"])
    saved = json.loads((run / "config.json").read_text())
    for key in ("algo", "lam", "kl_coef", "hindsight", "group_size", "lora_r", "seed", "model", "load_in_4bit",
                "init_adapter", "preset", "max_steps"):
        assert getattr(args, key) == saved[key], key
    assert args.iterations == 3 and args.eval_every == 5
    for flag, value in (("--algo", "sharpo"), ("--lam", "0.5"), ("--kl-coef", "0.01"), ("--model", "smollm2")):
        with pytest.raises(UserError, match=re.escape(flag)):
            train.parse_args(["--resume", str(run), flag, value])
    train.parse_args(["--resume", str(run), "--algo", "rlsd"])  # the same value is no change


# ----------------------------------------------------------------------------- 3 history
@pytest.mark.parametrize("builder", [alfworld_messages, webshop_messages])
def test_history_shows_min_of_h_and_steps_pairs(builder):
    """For every H in 0..6 and every episode length 0..8, the prompt holds exactly min(H, steps)
    observation/action pairs, the most recent ones, numbered from the right step; the teacher's
    row (hindsight added) holds the same pairs."""
    for n in range(9):
        history = [(f"obs-{j}", f"act-{j}") for j in range(1, n + 1)]
        for h in list(range(7)) + [None]:
            messages = builder("a task", history, "now", ["look"], h)
            for text in (messages[0]["content"], add_hindsight(messages, "1. look")[0]["content"]):
                shown = re.findall(r"\[Step (\d+)\] Action: act-(\d+)", text)
                want = n if h is None else min(h, n)
                assert len(shown) == want, (n, h)
                assert [int(a) for a, _ in shown] == list(range(n - want + 1, n + 1))
                assert all(a == b for a, b in shown)
                assert f"[Step {n + 1}] Current observation: now" in text


def test_step_prompt_with_more_history_than_steps():
    """The case that was wrong: H = 3 after 2 steps shows both pairs (it showed 1)."""
    text = step_prompt("intro", [("o1", "a1"), ("o2", "a2")], "o3", "Actions", ["x"], "x", 3)[0]["content"]
    assert "[Step 1] Action: a1" in text and "[Step 2] Action: a2" in text


# ----------------------------------------------------------------------------- 4 + 7 loading exactly
def test_eval_and_plain_peft_reproduce_a_tiny_run(tmp_path):
    """A tiny run with seed 7: eval.py's policy, the policy rebuilt for resume and plain peft on
    the base built with the run's seed all give the trained policy's logits exactly."""
    args = train.parse_args(_flags(model="tiny", preset="none", iterations=1, groups=2, group_size=2, max_steps=2,
                                   max_new_tokens=6, lora_r=4, lora_alpha=8, eval_every=0, lr=5e-2, seed=7,
                                   output_dir=str(tmp_path / "run")))
    trainer = train.Trainer(args, env=StubEnv(2))
    train.train(args, trainer)
    trained = _logits(trainer.model)
    ckpt = find_checkpoint(tmp_path / "run")
    policy = eval_script.load_model_policy(eval_script.EvalArgs(policy="model", checkpoint=str(ckpt)), ckpt)
    assert torch.equal(_logits(policy.model), trained)
    assert torch.equal(_logits(load_checkpoint_policy(ckpt)[0]), trained)
    base = build_tiny_model(build_tiny_tokenizer(), seed=7)
    assert torch.equal(_logits(PeftModel.from_pretrained(base, str(ckpt))), trained)
    other_seed = PeftModel.from_pretrained(build_tiny_model(build_tiny_tokenizer(), seed=0), str(ckpt))
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
    args = train.parse_args(_flags(model="tiny", preset="none", iterations=1, groups=2, group_size=2, max_steps=2,
                                   max_new_tokens=6, lora_r=2, lora_alpha=8, eval_every=0, lr=5e-2, seed=3,
                                   init_adapter=str(tmp_path / "warm"), output_dir=str(tmp_path / "run")))
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


def test_smollm2_checkpoint_with_the_shipped_warm_start(tmp_path):
    """The embedded SmolLM2 with the shipped warm start: the saved checkpoint gives the same
    logits through eval/resume loading (exactly) and through plain peft on the GGUF base
    (folded); adapter_config names the Hugging Face id and the card says how to load the file."""
    model, _ = load_policy("smollm2", lora_r=4, lora_alpha=8, init_adapter=config.WARMSTART, announce=lambda s: None)
    with torch.no_grad():  # stands in for training: a non-zero adapter
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02, generator=torch.Generator().manual_seed(0))
    trained = _logits(model)
    flags = {**vars(train.TrainArgs(model="smollm2", init_adapter=str(config.WARMSTART), load_in_4bit=False,
                                    lora_r=4, lora_alpha=8))}
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    save_policy(model, ckpt, flags, config.WARMSTART)
    (ckpt / "config.json").write_text(json.dumps(flags))
    assert torch.equal(_logits(load_checkpoint_policy(ckpt)[0]), trained)
    from transformers import AutoModelForCausalLM

    gguf = smollm2_gguf()
    base = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    assert torch.allclose(_logits(PeftModel.from_pretrained(base, str(ckpt))), trained, atol=2e-4)
    assert json.loads((ckpt / "adapter_config.json").read_text())["base_model_name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert "gguf_file" in (ckpt / "README.md").read_text()


# ----------------------------------------------------------------------------- 5-6 the command line
def test_explicit_model_beats_the_presets_warm_start():
    """The cpu-demo preset's warm start is SmolLM2's: with --model tiny it is dropped (it made a
    size-mismatch crash); with the preset's own model it stays; an explicit one is kept."""
    args = train.parse_args(["--preset", "cpu-demo", "--env", "alfworld", "--model", "tiny"])
    assert args.model == "tiny" and args.init_adapter is None
    assert train.parse_args(["--preset", "cpu-demo"]).init_adapter == str(config.WARMSTART)
    assert train.parse_args(["--preset", "cpu-demo", "--init-adapter", "none"]).init_adapter is None


def test_an_adapter_for_another_model_is_a_clear_error():
    with pytest.raises(UserError, match="another base model"):
        load_policy("tiny", init_adapter=config.WARMSTART)


def test_help_shows_the_presets_defaults_and_bad_values_stop_before_loading():
    """`train.py --help` prints the defaults the chosen preset will use; a misspelt env is one
    line, exit 2, before any model or env is imported."""
    out = subprocess.run([sys.executable, "train.py", "--preset", "cpu-demo", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "--iterations ITERATIONS training iterations (one rollout batch each) (default: 2)" in text
    assert "--model MODEL" in text and "(default: smollm2)" in text
    bad = subprocess.run([sys.executable, "-c", "import sys, train; from infra.cli import run; "
                          "run(lambda: train.main(['--env', 'alfwrld'])); "],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1].startswith("error: argument --env: invalid choice: 'alfwrld'")
    assert "Traceback" not in bad.stderr


# ----------------------------------------------------------------------------- 8 4-bit
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
    args = train.parse_args(["--load-in-4bit"] + _flags(
        model=str(tmp_path / "tiny-qwen2"), preset="none", groups=2, group_size=2, max_steps=2, max_new_tokens=6,
        lr=1e-2, eval_every=0, hindsight="expert", output_dir=str(tmp_path / "run")))
    trainer = train.Trainer(args, model=model, tokenizer=tok, env=StubEnv(2))
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    metrics, _ = trainer.iteration()
    assert metrics["rows"] > 0 and metrics["update/optimizer_steps"] == 2
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters() if "lora_" in n)


# ----------------------------------------------------------------------------- 9 smaller ones
def test_min_new_tokens_is_refused_in_training():
    with pytest.raises(UserError, match="--min-new-tokens"):
        train.parse_args(["--min-new-tokens", "8"])


@pytest.mark.parametrize("algo", ["sharpo", "rlsd", "sdar", "grpo"])
def test_multiplier_metrics_are_what_the_algorithm_applies(tmp_path, algo):
    """mult_* summarises the multiplier each algorithm really applies: per segment for sharpo,
    per trained token for rlsd (its mean differs from the segment view), none for sdar/grpo."""
    args = train.parse_args(_flags(model="tiny", preset="none", algo=algo, groups=2, group_size=4, max_steps=2,
                                   max_new_tokens=8, eval_every=0, hindsight="expert", mult_eps=0.9,
                                   output_dir=str(tmp_path / "r")))
    model, tok = load_policy("tiny", lora_r=4, lora_alpha=8, seed=3)
    trainer = train.Trainer(args, model=model, tokenizer=tok, env=StubEnv(2))
    trajs, _ = trainer.rollout(1)
    batch = trainer.make_rows(trajs)
    trainer.score(batch)
    with torch.no_grad():  # a teacher that disagrees with the student, so multipliers move
        batch.logp_teacher = batch.logp_teacher + torch.linspace(-0.5, 0.5, batch.logp_teacher.shape[1])
    trainer.advantages(batch)
    batch.adv_row = torch.where(batch.adv_row == 0, torch.ones_like(batch.adv_row), batch.adv_row)
    m = metrics.teacher_metrics(batch, algo, args.mult_eps)
    sel = batch.has_hindsight & (batch.adv_row != 0)
    if algo == "sharpo":
        assert m["mult_mean"] == pytest.approx(float(batch.mults[sel].mean()))
    elif algo == "rlsd":
        tokens = batch.token_mults[sel][batch.segment_ids[sel] >= 0]
        assert m["mult_mean"] == pytest.approx(float(tokens.mean()))
    else:
        assert "mult_mean" not in m


def test_action_mask_finds_the_action_in_any_case(tiny_tokenizer):
    """--gap-tokens action finds <ACTION>...</Action> as the parser accepts it."""
    ids = tiny_tokenizer.encode("<think>x</think><ACTION>look</Action>")
    mask = action_token_mask(tiny_tokenizer, ids)
    assert any(mask) and not mask[0]


def test_tasks_of_an_iteration_are_distinct_while_there_are_enough(tmp_path):
    args = train.parse_args(_flags(model="tiny", preset="none", groups=2, eval_every=0, output_dir=str(tmp_path / "r")))
    model, tok = load_policy("tiny", lora_r=4, lora_alpha=8)
    trainer = train.Trainer(args, model=model, tokenizer=tok, env=StubEnv(2))  # the stub has 2 tasks
    for _ in range(20):
        assert sorted(draw_tasks(trainer.rng, trainer.tasks, 2)) == ["task-a", "task-b"]
    assert sorted(set(draw_tasks(trainer.rng, trainer.tasks, 5))) == ["task-a", "task-b"]


def test_eval_writes_into_runs_not_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    eval_script.main(["--env", "webshop", "--policy", "random", "--num-games", "2"])
    assert (tmp_path / "runs" / "eval" / "webshop_random_test.json").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["runs"]


def test_install_script_shows_progress():
    """install.sh says what it is doing (pip's progress is not silenced with -q)."""
    text = (ROOT / "install.sh").read_text()
    assert " -q" not in text and text.count("echo ") >= 3


# ----------------------------------------------------------------------------- 10 method text
def test_every_cited_file_and_section_exists():
    """Every 'METHOD.md section N' (or 'sections N-M') cited in code, notebooks, tests and docs
    names a section METHOD.md has, and no text points outside the repository for the method."""
    sections = {int(n) for n in re.findall(r"^## (\d+)\. ", (ROOT / "METHOD.md").read_text(), re.M)}
    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, text=True).stdout.split()  # the repository's files, no venvs or runs
    files = [ROOT / p for p in tracked if p.endswith((".py", ".md", ".ipynb"))]
    assert any(p.name == "METHOD.md" for p in files)
    cited = 0
    for path in files:
        text = path.read_text()
        if path == Path(__file__):
            continue  # this test names the strings it forbids
        assert "../shared" not in text and "SHARPO.md" not in text, path
        for a, b in re.findall(r"METHOD\.md,? sections? (\d+)(?:-(\d+))?", text):
            for n in range(int(a), int(b or a) + 1):
                assert n in sections, f"{path}: METHOD.md section {n}"
                cited += 1
        for name in re.findall(r"\b([A-Z]+\.md)\b", text):
            assert (ROOT / name).exists(), f"{path} cites {name}"
    assert cited >= 10
