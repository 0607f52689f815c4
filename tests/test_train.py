"""The training loop on CPU with the tiny model: each algorithm runs, updates move the LoRA
weights, lam = 0 equals GRPO, resuming reproduces the uninterrupted run, ids are exact."""
import json
import re

import pytest
import torch

import train
from advantage import segment_multipliers
from baselines import ALGORITHMS
from envs.make import draw_tasks
import report
import rollout
from infra import metrics
from infra.cli import UserError
from infra.models import load_policy
from rollout import ModelPolicy, play_episodes
from speed import response_logprobs
from segments import build_row
from speed import collate_rows
from stub_env import StubEnv
from tiny_runs import flags

TIMING_KEYS = ("seconds/", "tokens_per_s", "peak_memory")


def _args(tmp_path, **kw):
    base = dict(model="tiny", preset="none", iterations=1, groups=2, group_size=4, max_steps=2, max_new_tokens=8,
                lr=1e-2, lora_r=4, lora_alpha=8, minibatches=2, micro_batch_rows=3, eval_every=0,
                output_dir=str(tmp_path / "run"), hindsight="expert", kl_coef=0.01, seed=3)
    base.update(kw)
    return train.parse_args([f"--{k.replace('_', '-')}={v}" for k, v in base.items()])


def _lora_state(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def _trainer(args):
    model, tok = load_policy("tiny", lora_r=args.lora_r, lora_alpha=args.lora_alpha, seed=args.seed, dtype=args.dtype)
    return train.Trainer(args, model=model, tokenizer=tok, env=StubEnv(args.max_steps))


@pytest.mark.parametrize("algo", tuple(ALGORITHMS))
def test_one_iteration_of_each_algo_moves_the_lora_weights(tmp_path, algo):
    """With rewards that differ inside groups and weight decay 0, one iteration of every
    --algo changes the LoRA weights, and the metrics line has the documented fields."""
    args = _args(tmp_path, algo=algo, weight_decay=0.0)
    trainer = _trainer(args)
    before = _lora_state(trainer.model)
    metrics, samples = trainer.iteration()
    after = _lora_state(trainer.model)
    assert metrics["groups_with_spread"] > 0
    assert any(not torch.equal(before[n], after[n]) for n in before)
    assert metrics["update/optimizer_steps"] == 2 and metrics["update/skipped_steps"] == 0
    for key in ("success", "mean_reward", "invalid_rate", "tokens_generated", "seconds/rollout", "peak_memory_gb"):
        assert key in metrics
    if algo in ("sharpo", "stepopsd", "rlsd"):  # the algorithms that scale advantages log what they applied
        assert {"mult_mean", "mult_std", "mult_at_bound", "gap_mean"} <= metrics.keys()
    else:  # grpo and sdar apply no multiplier, so they log none
        assert "mult_mean" not in metrics
    assert samples and samples[0]["segments"] and "multiplier" in samples[0]["segments"][0]


def test_sharpo_with_lam_zero_gives_the_grpo_update(tmp_path):
    """lam = 0 makes SHARPO's token advantage equal A everywhere, so after one iteration from
    the same seed the LoRA weights are identical to GRPO's."""
    states = []
    for algo, lam in (("sharpo", 0.0), ("grpo", 0.5)):
        trainer = _trainer(_args(tmp_path / algo, algo=algo, lam=lam))
        trainer.iteration()
        states.append(_lora_state(trainer.model))
    assert all(torch.equal(states[0][n], states[1][n]) for n in states[0])
    # and SHARPO with lam > 0 does differ (the teacher changes the update)
    trainer = _trainer(_args(tmp_path / "sharpo-on", algo="sharpo", lam=1.0, eps_m=0.5))
    trainer.iteration()
    other = _lora_state(trainer.model)
    assert any(not torch.equal(states[1][n], other[n]) for n in other)


def test_resume_reproduces_the_uninterrupted_run(tmp_path):
    """Two iterations straight, versus one iteration, a checkpoint, a fresh process state and
    --resume RUN_DIR for the second (the policy loaded from the checkpoint alone): the second
    iteration's metrics and final weights are the same, and the log holds each iteration once."""
    straight = _args(tmp_path / "a", iterations=2)
    t1 = _trainer(straight)
    full = train.train(straight, t1)

    first = _args(tmp_path / "b", iterations=1)
    train.train(first, _trainer(first))
    torch.manual_seed(12345)  # scramble the global RNG: the checkpoint must restore it
    resumed = train.parse_args(["--resume", str(tmp_path / "b" / "run"), "--iterations", "2"])
    t2 = train.Trainer(resumed, env=StubEnv(resumed.max_steps))
    assert t2.iteration_done == 1
    second = train.train(resumed, t2)
    strip = lambda m: {k: v for k, v in m.items() if not k.startswith(TIMING_KEYS)}  # noqa: E731
    assert strip(second[0]) == strip(full[1])
    a, b = _lora_state(t1.model), _lora_state(t2.model)
    assert all(torch.equal(a[n], b[n]) for n in a)
    lines = (tmp_path / "b" / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["iteration"] for line in lines] == [1, 2]


def test_in_loop_evaluations_are_saved_and_the_moving_success_spans_iterations(tmp_path):
    """--eval-every writes each evaluation into the run folder in eval.py's format (every game's
    outcome, the iteration, the limits), and success_recent is the mean success of the last
    report.RECENT iterations, the resumed ones included."""
    args = _args(tmp_path, iterations=3, eval_every=2, eval_games=2)
    trainer = _trainer(args)
    trainer.make_env = lambda episodes: StubEnv(args.max_steps)  # the held-out games' env, as RunLog makes it
    lines = train.train(args, trainer)
    run = tmp_path / "run"
    record = json.loads((run / "eval_alfworld_test_iter-000002.json").read_text())
    assert record["success"] == lines[1]["eval/success"] and len(record["games"]) == 2
    assert record["config"]["iteration"] == 2 and record["config"]["max_steps"] == args.max_steps
    assert sum(g["won"] for g in record["games"].values()) / 2 == record["success"]
    assert not (run / "eval_alfworld_test_iter-000001.json").exists() and "eval/success" not in lines[0]
    assert lines[1]["seconds/eval"] > 0 and "seconds/eval" not in lines[2]
    successes = [m["success"] for m in lines]
    assert [m["success_recent"] for m in lines] == pytest.approx(
        [sum(successes[max(0, i + 1 - report.RECENT):i + 1]) / min(i + 1, report.RECENT) for i in range(3)])
    assert "last 5" in report.progress_line(lines[2])


def test_samples_skip_an_episode_that_has_no_steps():
    """An episode whose worker crashed at reset starts done with no steps: the samples show the
    others instead of failing on its missing rows (it has the lowest index, and everything tied)."""
    from types import SimpleNamespace

    from segments import Row, Step, Trajectory

    step = Step([{"role": "user", "content": "Current observation: a room\nAdmissible actions: look"}], [1, 2], [3, 4],
                "<action>look</action>", "look", 0.0)
    crashed, played = Trajectory("t0", 0, "x", hindsight="plan"), Trajectory("t1", 0, "x", steps=[step], hindsight="plan")
    from advantage import Advantages, Credit
    from rollout import LogProbs
    from segments import Rows

    rows = Rows(torch.tensor([1]), [step], [Row([1, 2, 3, 4], 2)], [None], torch.ones(1, 2, dtype=torch.bool), None,
                torch.zeros(1, dtype=torch.bool), torch.tensor([True]))
    no = torch.tensor([False])
    adv = Advantages(torch.zeros(1), no, no)
    stages = report.Stages([crashed, played], rows, adv, LogProbs(torch.zeros(1, 2), torch.zeros(1, 2)),
                            Credit(torch.zeros(1, 2), torch.zeros(1), torch.ones(1)), {}, None, None)
    tok = SimpleNamespace(decode=lambda ids: "t")
    records = report.sample_records(stages, ALGORITHMS["sharpo"], tok, 2, 1)
    assert [r["task_id"] for r in records] == ["t1"] and records[0]["segments"][0]["multiplier"] is None


def test_existing_run_needs_resume(tmp_path):
    """Starting over a folder that holds a run is refused with the fix in the message, and
    the run's files are left as they were."""
    args = _args(tmp_path)
    train.train(args, _trainer(args))
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    with pytest.raises(UserError, match="--resume"):
        train.train(args, None)
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before
    assert (tmp_path / "run" / "latest" / "state.json").exists()


def test_trained_ids_are_the_sampled_ids(tmp_path, monkeypatch):
    """Every step's row is exactly the ids the decoding was fed (without padding) followed by
    the ids it sampled (up to and including the end-of-turn token)."""
    model, tok = load_policy("tiny", lora_r=4, lora_alpha=8)
    policy = ModelPolicy(model, tok, max_new_tokens=6)
    fed, sampled = [], []
    real_decode = rollout.decode

    def spy(model, ids, mask, config, cache=None):
        out = real_decode(model, ids, mask, config, cache)
        for b in range(len(out)):
            fed.append(ids[b][mask[b].bool()].tolist())
            sampled.append(out[b])
        return out

    monkeypatch.setattr(rollout, "decode", spy)
    trajs = play_episodes(StubEnv(2), ["task-a"] * 3, policy, 2)
    steps = [s for t in trajs for s in t.steps]
    assert len(steps) == len(fed)
    by_prompt = {}
    for f, s in zip(fed, sampled):
        by_prompt.setdefault(tuple(f), []).append(s)
    for step in steps:
        row = build_row(tok, step.messages, step.response_ids)
        assert row.input_ids == step.prompt_ids + step.response_ids
        candidates = by_prompt[tuple(step.prompt_ids)]
        assert any(s[: len(step.response_ids)] == step.response_ids for s in candidates)


def test_chunked_logprobs_match_a_full_forward():
    """response_logprobs (chunked, response positions only) equals log_softmax of the full
    logits at the shifted positions, for rows of different prompt and response lengths."""
    model, tok = load_policy("tiny", lora_r=4, lora_alpha=8)
    msgs = [[{"role": "user", "content": "short"}], [{"role": "user", "content": "a longer prompt here"}]]
    rows = [build_row(tok, m, r) for m, r in zip(msgs, [[5, 6, 7, 8], [9, 10]])]
    batch = collate_rows(rows, tok.pad_token_id)
    fast = response_logprobs(model, batch, max_logit_elems=3 * tok.vocab_size)  # forces chunks of 1 token
    full = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.log_softmax(-1)
    for b, r in enumerate(rows):
        for j, token in enumerate(r.response_ids):
            assert fast[b, j].item() == pytest.approx(full[b, r.num_prompt + j - 1, token].item(), abs=1e-5)
    assert fast[1, 2:].abs().sum() == 0  # padding positions are 0


def test_non_finite_loss_skips_the_step(tmp_path, monkeypatch):
    """A NaN loss does not reach the weights: the step is skipped, counted, and training goes on."""
    args = _args(tmp_path)
    trainer = _trainer(args)
    before = _lora_state(trainer.model)
    real = train.policy_loss
    monkeypatch.setattr(train, "policy_loss", lambda *a, **k: real(*a, **k) * float("nan"))
    metrics, _ = trainer.iteration()
    assert metrics["update/skipped_steps"] == 2 and metrics["update/optimizer_steps"] == 0
    after = _lora_state(trainer.model)
    assert all(torch.equal(before[n], after[n]) for n in before)


def test_bad_flags_are_clear_errors(capsys):
    """Bad settings stop before any loading with a UserError naming the flag (a value outside a
    flag's choices names its allowed values too; range checks name the range)."""
    for argv, needle in ((["--algo", "ppo"], "--algo"), (["--hindsight", "oracle"], "--hindsight")):
        with pytest.raises(UserError, match=needle) as err:
            train.parse_args(argv)
        assert "choose one of" in str(err.value) and "\n" not in str(err.value)
    for argv, needle in ((["--lam", "2"], "--lam"), (["--history", "x"], "--history"), (["--eps-m", "1.5"], "--eps-m")):
        with pytest.raises(UserError, match=needle):
            train.parse_args(argv)


@pytest.mark.parametrize("algo", ["sharpo", "rlsd", "sdar", "grpo"])
def test_multiplier_metrics_are_what_the_algorithm_applies(tmp_path, algo):
    """mult_* summarises the multiplier each algorithm really applies: per segment for sharpo,
    per trained token for rlsd (its mean differs from the segment view), none for sdar/grpo."""
    args = train.parse_args(flags(model="tiny", preset="none", algo=algo, groups=2, group_size=4, max_steps=2,
                                   max_new_tokens=8, eval_every=0, hindsight="expert", eps_m=0.9,
                                   output_dir=str(tmp_path / "r")))
    model, tok = load_policy("tiny", lora_r=4, lora_alpha=8, seed=3)
    trainer = train.Trainer(args, model=model, tokenizer=tok, env=StubEnv(2))
    trajs = trainer.rollout(1)
    rows = trainer.segments(trajs)
    adv = trainer.advantage(trajs, rows)
    adv.row = torch.where(adv.row == 0, torch.ones_like(adv.row), adv.row)
    adv.trained = torch.ones_like(rows.has_hindsight)  # every row carries credit
    adv.taught = rows.has_hindsight & ALGORITHMS[algo].uses_teacher(args)  # so the teacher scores every hindsight row
    logp = trainer.logprobs(rows, adv)
    with torch.no_grad():  # a teacher that disagrees with the student, so multipliers move
        logp.teacher = logp.teacher + torch.linspace(-0.5, 0.5, logp.teacher.shape[1])
    credit = trainer.credit(rows, adv, logp)
    m = report.teacher_metrics(ALGORITHMS[algo], rows, adv, credit, args.eps_m, lambda values: values)
    sel = rows.has_hindsight & (adv.row != 0)
    if algo == "sharpo":
        assert m["mult_mean"] == pytest.approx(float(credit.mults[sel].mean()))
    elif algo == "rlsd":
        delta = logp.teacher - logp.student  # RLSD's multiplier, token by token, written out here
        per_token = torch.exp(torch.sign(adv.row)[:, None] * delta).clamp(1 - args.eps_m, 1 + args.eps_m)
        tokens = per_token[sel][rows.response_mask[sel]]
        assert m["mult_mean"] == pytest.approx(float(tokens.mean()))
        assert torch.equal(credit.mults[rows.response_mask], per_token[rows.response_mask])  # computed once
        segment_view = segment_multipliers(adv.row, credit.gaps, args.eps_m)  # (B,)
        assert m["mult_mean"] != pytest.approx(float(segment_view[sel].mean()))  # not the segment view
    else:
        assert "mult_mean" not in m and credit.mults is None  # grpo and sdar scale no advantage


def test_tasks_of_an_iteration_are_distinct_while_there_are_enough(tmp_path):
    args = train.parse_args(flags(model="tiny", preset="none", groups=2, eval_every=0, output_dir=str(tmp_path / "r")))
    model, tok = load_policy("tiny", lora_r=4, lora_alpha=8)
    trainer = train.Trainer(args, model=model, tokenizer=tok, env=StubEnv(2))  # the stub has 2 tasks
    for _ in range(20):
        assert sorted(draw_tasks(trainer.rng, trainer.tasks, 2)) == ["task-a", "task-b"]
    assert sorted(set(draw_tasks(trainer.rng, trainer.tasks, 5))) == ["task-a", "task-b"]


def test_win_spread_counts_only_groups_where_some_won_and_some_did_not():
    """groups_with_spread counts any reward difference; groups_with_win_spread only a difference in
    success: a group of losses told apart by one 0.1 invalid-answer penalty has the first, not the second."""
    from report import rollout_metrics
    from segments import Step, Trajectory

    def episode(group, won, invalid=False):
        step = Step([], [], [], "", None if invalid else "look", (10.0 if won else 0.0) - (0.1 if invalid else 0.0))
        return Trajectory(f"t{group}", group, "pick", [step], won=won)

    trajs = [episode(0, True), episode(0, False),  # success spread
             episode(1, False), episode(1, False, invalid=True),  # a penalty alone
             episode(2, False), episode(2, False)]  # all alike
    out = rollout_metrics(trajs, [t.group for t in trajs])
    assert out["groups_with_spread"] == pytest.approx(2 / 3) and out["groups_with_win_spread"] == pytest.approx(1 / 3)


def test_shuffle_rewards_hands_the_same_advantages_to_other_episodes(tmp_path):
    """--shuffle-rewards (the placebo run): per group the advantages are the real run's, permuted; the
    episodes' own rewards (what the metrics report) are untouched."""
    def advantages_of(shuffle: bool):
        args = train.parse_args(flags(model="tiny", preset="none", groups=2, group_size=4, max_steps=2,
                                      max_new_tokens=8, eval_every=0, hindsight="expert",
                                      output_dir=str(tmp_path / f"r{shuffle}")) + ["--shuffle-rewards"] * shuffle)
        model, tok = load_policy("tiny", lora_r=4, lora_alpha=8, seed=3)
        trainer = train.Trainer(args, model=model, tokenizer=tok, env=StubEnv(2))
        trajs = trainer.rollout(1)
        for i, t in enumerate(trajs):  # rewards that differ within each group
            for k, step in enumerate(t.steps):
                step.reward = float(i % 4) if k == 0 else 0.0
        rows = trainer.segments(trajs)
        adv = trainer.advantage(trajs, rows)
        first = {}  # each trajectory's advantage, from its first row
        for row, i in enumerate(rows.traj.tolist()):
            first.setdefault(i, float(adv.row[row]))
        return [first[i] for i in sorted(first)], [t.reward for t in trajs], [t.group for t in trajs]

    real, rewards, groups = advantages_of(False)
    placebo, rewards_after, _ = advantages_of(True)
    assert rewards_after == rewards  # the episodes keep their rewards
    for g in set(groups):
        idx = [i for i, x in enumerate(groups) if x == g]
        assert sorted(placebo[i] for i in idx) == pytest.approx(sorted(real[i] for i in idx))
    assert placebo != pytest.approx(real)  # seed 0, iteration 1: the draw moves at least one


def test_the_first_step_takes_a_ratio_of_exactly_one(tmp_path):
    """bf16 log-probs depend on how a pass lays out its rows, so the student pass (the context cache) and the
    update's pass can disagree before any step (up to 0.2 nats a token on SmolLM2). The first optimizer step of an
    iteration takes its ratio as exactly 1, since no weight has moved: here the student log-probs are shifted by
    +-0.3 nats on purpose, and still nothing is clipped and the KL(old, new) estimate is 0 (one minibatch); with a
    second minibatch the shifted log-probs are the old ones again (the ratio moves)."""
    for minibatches in (1, 2):
        args = _args(tmp_path / str(minibatches), minibatches=minibatches, ppo_epochs=1, kl_coef=0.0, groups=2,
                     group_size=4)
        trainer = _trainer(args)
        trajs = trainer.rollout(1)
        for i, t in enumerate(trajs):  # rewards that differ within each group: every row moves
            t.steps[-1].reward = float(i % 2) * 10
        rows = trainer.segments(trajs)
        adv = trainer.advantage(trajs, rows)
        logp = trainer.logprobs(rows, adv)
        noise = torch.where(torch.rand(logp.student.shape, generator=torch.Generator().manual_seed(0)) > 0.5, 0.3, -0.3)
        logp.student = torch.where(rows.response_mask, logp.student + noise, logp.student)
        stats = trainer.update(rows, adv, logp, trainer.credit(rows, adv, logp))
        if minibatches == 1:
            assert stats["update/clip_frac"] == 0.0 and stats["update/approx_kl_old"] == 0.0
        else:
            assert stats["update/clip_frac"] > 0.0


def test_action_only_gaps_count_their_fallbacks_and_rlsd_refuses_the_flag(tmp_path):
    """--gap-tokens action: the rows whose response held no <action> block (the stub's random text holds none) take
    their gap over the whole response, and the line says how many (never a silent multiplier of 1); RLSD, whose
    multiplier is per token, reads no gap and refuses the flag."""
    args = _args(tmp_path, gap_tokens="action", algo="sharpo")
    line, _ = _trainer(args).iteration()
    assert line["gap_action_fallback"] == 1.0 and line["gap_abs_mean"] > 0
    with pytest.raises(UserError, match="--gap-tokens action"):
        _args(tmp_path / "r", gap_tokens="action", algo="rlsd")


@pytest.mark.slow
def test_the_watch_preset_runs_and_its_lines_carry_the_curve_and_the_label(tmp_path):
    """--preset cpu-watch, on the tiny model for two iterations: it plays every one of its 4 games each
    iteration (task_wins), says at start that its success is on the games it trains on, prints each
    iteration's text curve and change since iteration 1 beside the invalid rate, and draws curves.png."""
    import subprocess
    import sys
    from pathlib import Path

    root, run = Path(__file__).resolve().parent.parent, tmp_path / "watch"
    done = subprocess.run([sys.executable, "train.py", "--preset", "cpu-watch", "--model", "tiny", "--iterations", "2",
                           "--output-dir", str(run)], cwd=root, capture_output=True, text=True,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "its success on the games it trains on" in out and "held-out games are --preset cpu-learn's" in out
    lines = [line for line in out.splitlines() if line.startswith("iter ")]
    assert len(lines) == 2
    assert re.search(r"^iter 1 \| train success \d\.\d\d \S \+0\.00 \| invalid \d\.\d\d \|", lines[0]), lines[0]
    assert re.search(r"^iter 2 \| train success \d\.\d\d \S\S [+-]\d\.\d\d \| invalid \d\.\d\d \|", lines[1]), lines[1]
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(len(m["task_wins"]) == 4 and all(p == 4 for _, p in m["task_wins"].values()) for m in logged)
    assert sorted(logged[0]["task_wins"]) == sorted(logged[1]["task_wins"])  # the same 4 games
    assert (run / "curves.png").stat().st_size > 0 and f"{run / 'curves.png'}" in out


def test_the_text_curve_draws_each_iteration_and_the_change_since_the_first():
    """One bar an iteration from the lowest (0) to the highest (1), the latest CURVE_WIDTH, then the change;
    ASCII where the output cannot write the bars."""
    assert metrics.text_curve([0.25, 0.5, 1.0], "utf-8") == "\u2583\u2585\u2588 +0.75"
    assert metrics.text_curve([0.5, 0.0], "ascii") == "-_ -0.50"
    long = metrics.text_curve([0.0] * (metrics.CURVE_WIDTH + 3) + [1.0], "utf-8")
    assert long.startswith("~") and len(long.split()[0]) == metrics.CURVE_WIDTH + 1 and long.endswith("+1.00")


@pytest.mark.parametrize("plain", [False, True])
def test_an_update_without_signal_moves_no_weight(tmp_path, plain):
    """Every group tied (the tiny model never buys the right product) and --kl-coef 0.01: 4 iterations at
    lr 1e-2 leave every LoRA weight exactly as it started, on the default (batched) path as with --plain.
    At b60459e the reference's log-probs came from another pass than the update's, so the KL's gradient
    was float noise (~1e-8) that AdamW turned into full-sized steps on the default path."""
    args = train.parse_args(flags(model="tiny", preset="none", env="webshop", groups=1, group_size=2, max_steps=2,
                                  max_new_tokens=8, lora_r=4, lora_alpha=8, eval_every=0, hindsight="expert",
                                  lr=1e-2, seed=3, iterations=4, kl_coef=0.01, plain=plain,
                                  output_dir=str(tmp_path / "run")))
    trainer = train.Trainer(args)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    lines = train.train(args, trainer)
    assert all(line["groups_with_spread"] == 0 for line in lines)  # every group tied: no learning signal
    assert all("update/kl_ref" in line and line["seconds/reference"] > 0 for line in lines)  # the KL term ran
    for name, p in trainer.model.named_parameters():
        if p.requires_grad:
            assert torch.equal(p.detach(), before[name]), name
