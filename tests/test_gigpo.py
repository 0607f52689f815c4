"""GiGPO (--algo gigpo, METHOD.md section 6): step returns, anchor-state groups, the step
advantage and the token advantage, checked on a group worked out by hand; and in the loop."""
from types import SimpleNamespace

import pytest
import torch

import train
from advantage import grpo_advantages
from baselines import GiGPO, anchor_groups, discounted_returns, gigpo_token_advantages
from infra.models import load_policy
from stub_env import StubEnv

# One group of three trajectories (gamma = 0.5), rows in step order:
#   T0: acts from s0, s1, s2; rewards 0, 0, 10 (wins at its third step)
#   T1: acts from s0, s1, s1; rewards 0, -0.1, 0 (its second answer is invalid, so its third
#       step acts from the same state s1 again)
#   T2: acts from s0, s3; rewards 0, 0
REWARDS = [0.0, 0.0, 10.0, 0.0, -0.1, 0.0, 0.0, 0.0]
TRAJ = [0, 0, 0, 1, 1, 1, 2, 2]
ANCHORS = ["s0", "s1", "s2", "s0", "s1", "s1", "s0", "s3"]


def test_returns_groups_and_step_advantages_by_hand():
    """Returns, R_t = r_t + 0.5 R_{t+1}:
        T0: 2.5, 5, 10    T1: -0.05, -0.1, 0    T2: 0, 0
    Step groups: s0 = {T0.1, T1.1, T2.1} (returns 2.5, -0.05, 0), s1 = {T0.2, T1.2, T1.3}
    (5, -0.1, 0), s2 = {T0.3} and s3 = {T2.2} are singletons (advantage 0).
    s0: mean 0.816667, unbiased std sqrt((1.683333^2 + 0.866667^2 + 0.816667^2) / 2) = 1.458017,
        A_step = 1.154528, -0.594414, -0.560114. s1 is s0 scaled by 2: the same A_step.
    Episode rewards 10, -0.1, 0: mean 3.3, std 5.802586, A = 1.154657, -0.585946, -0.568711.
    Token advantage of T0's first step (omega 1): 1.154657 + 1.154528 = 2.309185."""
    R = discounted_returns(torch.tensor(REWARDS, dtype=torch.float64), torch.tensor(TRAJ), 0.5)
    assert R.tolist() == pytest.approx([2.5, 5.0, 10.0, -0.05, -0.1, 0.0, 0.0, 0.0])
    groups = anchor_groups([0] * 8, ANCHORS)
    assert groups.tolist() == [0, 1, 2, 0, 1, 1, 0, 3]
    step_adv = grpo_advantages(R, groups)
    want = [1.154528, 1.154528, 0.0, -0.594414, -0.594414, -0.560114, -0.560114, 0.0]
    assert step_adv.tolist() == pytest.approx(want, abs=1e-5)
    adv = grpo_advantages(torch.tensor([10.0, -0.1, 0.0], dtype=torch.float64), torch.tensor([0, 0, 0]))
    assert adv.tolist() == pytest.approx([1.154657, -0.585946, -0.568711], abs=1e-5)
    adv_row = adv[TRAJ]  # (B,)
    mask = torch.tensor([[True, True, False]] * 8)  # (B, T) two response tokens, then padding
    tok = gigpo_token_advantages(adv_row, step_adv, mask, omega=1.0)
    assert tok[0, 0].item() == pytest.approx(2.309185, abs=1e-5) and tok[0, 1] == tok[0, 0] and tok[0, 2] == 0
    stats = GiGPO().metrics(SimpleNamespace(step_groups=groups, step=step_adv), lambda v: v)
    assert stats["gigpo/step_group_share"] == pytest.approx(6 / 8) and stats["gigpo/step_group_size"] == pytest.approx(2.0)


def test_mean_norm_gamma_zero_and_omega_zero():
    """--gigpo-norm mean gives R - mean; gamma = 0 makes R_t the step reward; omega = 0 (with
    any gamma) is GRPO's token advantage exactly; steps of another group never share a step group."""
    R = discounted_returns(torch.tensor(REWARDS), torch.tensor(TRAJ), 0.0)
    assert R.tolist() == pytest.approx(REWARDS)
    groups = anchor_groups([0] * 8, ANCHORS)
    centered = grpo_advantages(discounted_returns(torch.tensor(REWARDS), torch.tensor(TRAJ), 0.5), groups, norm_by_std=False)
    assert centered[0].item() == pytest.approx(2.5 - 0.816667, abs=1e-5)
    adv = torch.tensor([1.0, -2.0, 0.5])[TRAJ]
    mask = torch.tensor([[True, False]] * 8)
    tok = gigpo_token_advantages(adv, torch.randn(8), mask, omega=0.0)
    assert torch.equal(tok[:, 0], adv) and torch.equal(tok[:, 1], torch.zeros(8))
    assert anchor_groups([0, 1], ["s0", "s0"]).tolist() == [0, 1]


def test_slow_loop_matches_discounted_returns():
    """discounted_returns against the definition, sum_{k>=t} gamma^(k-t) r_k, on random data."""
    g = torch.Generator().manual_seed(0)
    rewards, traj = torch.randn(40, generator=g, dtype=torch.float64), torch.tensor(sorted([i // 7 for i in range(40)]))
    fast = discounted_returns(rewards, traj, 0.9)
    for b in range(40):
        same = [k for k in range(b, 40) if traj[k] == traj[b]]
        assert fast[b].item() == pytest.approx(sum(0.9 ** (k - b) * rewards[k].item() for k in same))


def test_gigpo_iteration_runs_no_teacher_and_logs_step_signal(tmp_path, monkeypatch):
    """One gigpo iteration: the teacher pass is skipped (never called, timed as 0), the
    step-group metrics are logged, and the weights move."""
    args = train.parse_args(["--model=tiny", "--preset=none", "--algo=gigpo", "--groups=2", "--group-size=4",
                             "--max-steps=2", "--max-new-tokens=8", "--eval-every=0", "--lr=1e-2",
                             f"--output-dir={tmp_path}/run"])
    model, tok = load_policy("tiny", lora_r=4, lora_alpha=8, seed=3)
    trainer = train.Trainer(args, model=model, tokenizer=tok, env=StubEnv(2))
    passes = []  # the teacher rows each student-teacher pass was asked to score
    real = trainer.passes.student_teacher_logprobs
    monkeypatch.setattr(trainer.passes, "student_teacher_logprobs",
                        lambda *a, taught, **k: passes.append(int(taught.sum())) or real(*a, taught=taught, **k))
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    metrics, samples = trainer.iteration()
    assert passes == [0] and metrics["seconds/teacher"] == 0.0
    assert metrics["gigpo/step_group_share"] > 0  # every group starts from the same state
    assert {"gigpo/step_group_size", "gigpo/step_adv_std"} <= metrics.keys() and "mult_mean" not in metrics
    assert "step_advantage" in samples[0]["segments"][0]
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters() if "lora_" in n)


def _advantages_of(tmp_path, flags_, episodes):
    """Stage 3 of train.py on hand-made trajectories: episodes = [(group, [(step reward, anchor), ...]), ...]."""
    from segments import Rows, Step, Trajectory

    args = train.parse_args(["--model=tiny", "--preset=none", "--eval-every=0", f"--output-dir={tmp_path}/run"] + flags_)
    model, tok = load_policy("tiny", lora_r=4, lora_alpha=8, seed=3)
    trainer = train.Trainer(args, model=model, tokenizer=tok, env=StubEnv(2))
    trajs = [Trajectory(f"t{g}", g, "x", [Step([], [], [], "", "a", r, anchor) for r, anchor in steps])
             for g, steps in episodes]
    traj = torch.tensor([i for i, t in enumerate(trajs) for _ in t.steps])
    rows = Rows(traj, [s for t in trajs for s in t.steps], [None] * len(traj), [None] * len(traj),
                torch.ones(len(traj), 1, dtype=torch.bool), None, torch.zeros(len(traj), dtype=torch.bool),
                torch.zeros(len(traj), dtype=torch.bool))
    return trainer.advantage(trajs, rows)


def test_mean_norm_is_verl_agents_mean_norm_on_both_halves(tmp_path):
    """--gigpo-norm mean (verl-agent's mean_norm, its default) leaves the std out of the episode half too: a win
    (R = 10) and a loss, 2 steps each, gamma 0.95, both from the same states. Row 0 of the win: episode 10 - 5 = 5,
    step 9.5 - 4.75 = 4.75 (the returns from the first state), so 9.75; with --gigpo-norm std: 0.707 + 0.707."""
    episodes = [(0, [(0.0, "s0"), (10.0, "s1")]), (0, [(0.0, "s0"), (0.0, "s1")])]
    adv = _advantages_of(tmp_path / "m", ["--algo=gigpo", "--gigpo-norm=mean"], episodes)
    assert adv.row.tolist() == pytest.approx([5.0, 5.0, -5.0, -5.0])
    assert (adv.row + adv.step).tolist()[0] == pytest.approx(5 + 4.75)
    adv = _advantages_of(tmp_path / "s", ["--algo=gigpo", "--gigpo-norm=std"], episodes)
    assert (adv.row + adv.step).tolist()[0] == pytest.approx(0.7071 + 0.7071, abs=1e-3)


def test_episode_stats_per_trajectory_or_per_step_row(tmp_path):
    """A 5-step win and a 20-step loss: per trajectory (the GiGPO paper) +-0.707; per step row (verl-agent's
    compute_mean_std_cross_steps) the 25 rows are the samples: mean 2, std 4.08, so +1.96 and -0.49."""
    episodes = [(0, [(0.0, "w")] * 4 + [(10.0, "w")]), (0, [(0.0, "l")] * 20)]
    per_traj = _advantages_of(tmp_path / "t", ["--episode-stats=trajectory"], episodes).row
    per_step = _advantages_of(tmp_path / "s", ["--episode-stats=step"], episodes).row
    assert per_traj[0].item() == pytest.approx(0.7071, abs=1e-3) and per_traj[-1].item() == pytest.approx(-0.7071, abs=1e-3)
    assert per_step[0].item() == pytest.approx(1.9596, abs=1e-3) and per_step[-1].item() == pytest.approx(-0.4899, abs=1e-3)
