"""Compute only where credit flows: a row whose Ahat is 0 gets no teacher pass, and, when no KL
or SDAR term reads it, no student pass and no place in the update. That must change no result
(train.py stages 3-6; METHOD.md section 4)."""
import json

import pytest
import torch

from types import SimpleNamespace

import train
from baselines import ALGORITHMS
import report
from infra.metrics import Stopwatch
from infra.models import load_policy
from stub_env import StubEnv
from tiny_runs import flags
from tools.bench import BenchTrainer

torch.set_num_threads(1)

# three groups of four: groups 0 and 2 tie (every A_i = 0), group 1 has spread
REWARDS = [0.0] * 4 + [10.0, 0.0, 0.0, 10.0] + [0.0] * 4


def one_update(tmp_path, algo: str, kl: float, skip: bool, trajs=None, **kw):
    """One iteration's stages 2-6 on the tiny model, from the same start; returns what they made."""
    args = train.parse_args(flags(**{
        **dict(model="tiny", preset="none", algo=algo, groups=3, group_size=4, max_steps=2, max_new_tokens=8, lr=1e-2,
               lora_r=4, lora_alpha=8, eval_every=0, hindsight="expert", kl_coef=kl, seed=5, micro_batch_rows=2,
               minibatches=64, ppo_epochs=2,  # one row a minibatch: some minibatches hold only skipped rows
               output_dir=str(tmp_path / "run")), **kw}))
    model, tok = load_policy("tiny", lora_r=4, lora_alpha=8, seed=3)
    trainer = BenchTrainer(args, model=model, tokenizer=tok, env=StubEnv(2))
    trainer.skip_rows = skip
    if trajs is None:
        trajs = trainer.rollout(1)
        for traj, reward in zip(trajs, REWARDS):  # set the outcomes, so the test knows which groups tie
            for s in traj.steps:
                s.reward = 0.0
            traj.steps[-1].reward = reward
    rows = trainer.segments(trajs)
    adv = trainer.advantage(trajs, rows)
    logp = trainer.logprobs(rows, adv)
    credit = trainer.credit(rows, adv, logp)
    stats = trainer.update(rows, adv, logp, credit)
    weights = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    batch = SimpleNamespace(trajs=trajs, rows=rows, adv=adv, logp=logp, credit=credit, update=stats)
    return trajs, batch, stats, weights, trainer


@pytest.mark.parametrize("kl", [0.0, 0.01])
@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_skipping_leaves_the_update_unchanged(tmp_path, algo, kl):
    trajs, full, full_stats, full_w, _ = one_update(tmp_path / "all", algo, kl, skip=False)
    _, part, part_stats, part_w, _ = one_update(tmp_path / "skip", algo, kl, skip=True, trajs=trajs)
    tied = torch.tensor([trajs[i].group != 1 for i in part.rows.traj.tolist()])  # (B,) rows of the tied groups
    assert tied.any() and (~tied).any()
    # the same advantages, the same weights after the update, the same update statistics; the
    # advantages up to float rounding only: the student+teacher pass pads each micro-batch to its own
    # widest context (rollout.student_teacher_logprobs), so which rows share a micro-batch moves the last bits
    assert torch.allclose(full.credit.token_adv, part.credit.token_adv, atol=1e-6, rtol=0)
    assert torch.equal(full.credit.token_adv == 0, part.credit.token_adv == 0)  # and exactly the same rows move
    assert full_stats["update/optimizer_steps"] == part_stats["update/optimizer_steps"] > 0
    for n in full_w:  # 128 Adam steps at lr 1e-2 carry those last bits (~5e-7 in a log-prob) to ~3e-6
        assert torch.allclose(full_w[n], part_w[n], atol=1e-5, rtol=0), n
    start = {n: p for n, p in load_policy("tiny", lora_r=4, lora_alpha=8, seed=3)[0].named_parameters() if p.requires_grad}
    assert any(not torch.allclose(start[n], part_w[n]) for n in part_w), "the update moved nothing: the test is vacuous"
    for k in full_stats:  # approx_kl_old is the mean over the tokens in the loss: without skipping, every row's
        if k != "update/approx_kl_old":
            assert part_stats[k] == pytest.approx(full_stats[k], abs=1e-6), k
    if ALGORITHMS[algo].uses_teacher(SimpleNamespace(lam=0.5)):  # and the teacher metrics a run logs
        m_full, m_part = (report.teacher_metrics(ALGORITHMS[algo], b.rows, b.adv, b.credit, 0.2, lambda v: v)
                          for b in (full, part))
        assert m_full.keys() == m_part.keys()
        for k in m_full:
            assert m_part[k] == pytest.approx(m_full[k], abs=1e-6), k
    assert full.adv.trained.all() and torch.equal(full.adv.taught, full.rows.has_hindsight & ALGORITHMS[algo].uses_teacher(SimpleNamespace(lam=0.5)))


@pytest.mark.parametrize("kl", [0.0, 0.01])
@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_the_skipped_rows_are_exactly_those_that_may_be_skipped(tmp_path, algo, kl):
    _, batch, _, _, trainer = one_update(tmp_path, algo, kl, skip=True)
    adv, rows, logp = batch.adv, batch.rows, batch.logp
    spec = ALGORITHMS[algo]
    if algo == "gigpo":  # GiGPO's Ahat = A_i + omega * A_step
        zero = (adv.row + adv.step) == 0
    else:
        zero = adv.row == 0
    assert zero.any() and (~zero).any()
    reads_all = kl > 0 or spec.reads_every_row  # the KL and SDAR terms act on rows whose Ahat is 0
    expected_student = torch.zeros_like(zero) if reads_all else zero
    assert torch.equal(~adv.trained, expected_student)
    line = report.iteration_metrics(report.Stages(batch.trajs, rows, adv, logp, batch.credit, batch.update,
                                                  Stopwatch(), trainer.actor), spec, trainer.args, trainer.dist, 1)
    assert line["skipped/student"] == int(expected_student.sum())
    if spec.uses_teacher(trainer.args):
        expected_teacher = rows.has_hindsight & (torch.zeros_like(zero) if spec.reads_every_row else zero)
        assert line["skipped/teacher"] == int(expected_teacher.sum())
        assert torch.equal(adv.taught, rows.has_hindsight & ~expected_teacher)
    # a skipped row's log-probs were never computed (0), a scored row's were (< 0)
    tokens = rows.response_mask
    assert (logp.student[~adv.trained] == 0).all()
    assert (logp.student[adv.trained][tokens[adv.trained]] < 0).all()
    if spec.uses_teacher(trainer.args):
        left = rows.has_hindsight & ~adv.taught & adv.trained  # scored as student, not as teacher
        assert torch.equal(logp.teacher[left], logp.student[left])


def test_the_token_mean_still_counts_the_skipped_rows(tmp_path, monkeypatch):
    """The denominator is every response token of the minibatch, skipped rows included: the same
    number the loss divides by when nothing is skipped."""
    seen = []
    real = train.policy_loss

    def spy(logp_new, logp_old, token_adv, mask, num_tokens, ppo_clip):
        seen.append(num_tokens)
        return real(logp_new, logp_old, token_adv, mask, num_tokens, ppo_clip)

    monkeypatch.setattr(train, "policy_loss", spy)
    _, batch, _, _, _ = one_update(tmp_path, "sharpo", 0.0, skip=True, minibatches=1, ppo_epochs=1)  # one minibatch
    assert (~batch.adv.trained).sum() > 0
    assert seen and set(seen) == {sum(len(r.response_ids) for r in batch.rows.rows)}


def test_bench_times_both_ways_at_half_the_groups_tied(tmp_path):
    """tools/bench.py: in one run, each algorithm with and without skipping; with half of 2 groups
    tied, the skipped run leaves out the tied group's rows and the other leaves out none."""
    from tools import bench

    results = bench.main(["--model", "tiny", "--episodes", "8", "--group-size", "4", "--steps", "2", "--new-tokens", "4",
                          "--obs-words", "20", "--ways", "new,no-skipping", "--out", str(tmp_path / "bench.json")])
    assert results["new sharpo"]["skipped"] == "8/8 of 16" and results["no-skipping sharpo"]["skipped"] == "0/0 of 16"
    assert results["new grpo"]["skipped"] == "8/- of 16"
    for key in ("sharpo_over_grpo_time_new", "sharpo_over_grpo_time_no-skipping", "sharpo_new_over_no-skipping_time"):
        assert results[key] > 0
    assert (tmp_path / "bench.json").is_file()


def test_bench_times_the_old_way_beside_the_new(tmp_path, monkeypatch):
    """tools/bench.py --ways new,old: the old way runs in float32 with whole teacher rows, the new
    one in the resolved --dtype; both time a teacher pass (medians of 2 repeats; way by way, the
    algorithms in turn, A B then B A), and the ratios are reported, SHARPO / GRPO also per repeat."""
    from tools import bench
    from infra.models import resolve_dtype

    order, timed = [], bench.timed_iteration
    monkeypatch.setattr(bench, "timed_iteration", lambda trainer: order.append(trainer) or timed(trainer))
    results = bench.main(["--model", "tiny", "--episodes", "4", "--group-size", "2", "--steps", "1", "--new-tokens", "4",
                          "--obs-words", "20", "--repeats", "2"])
    a, b, c, d = order[0], order[1], order[4], order[5]  # way by way, the algorithms alternating
    assert order == [a, b, b, a, c, d, d, c] and len({id(a), id(b), id(c), id(d)}) == 4
    assert len(results["sharpo_over_grpo_time_new_per_repeat"]) == 2
    assert results["sharpo_over_grpo_time_new_pooled"] > 1  # SHARPO pays a teacher pass, GRPO none
    assert results["old sharpo"]["dtype"] == "fp32" and results["new sharpo"]["dtype"] == resolve_dtype("auto", "cpu", "tiny")
    assert results["old sharpo"]["seconds/teacher"] > 0 and results["new sharpo"]["seconds/teacher"] > 0
    assert results["new grpo"]["seconds/teacher"] == 0
    for key in ("sharpo_over_grpo_time_new", "sharpo_over_grpo_time_old", "sharpo_new_over_old_time"):
        assert results[key] > 0


def test_samples_show_the_trajectories_that_move_first_and_null_where_the_teacher_was_not_asked(tmp_path):
    _, batch, _, _, trainer = one_update(tmp_path, "sharpo", 0.0, skip=True, minibatches=1, ppo_epochs=1)
    stages = report.Stages(batch.trajs, batch.rows, batch.adv, batch.logp, batch.credit, batch.update, None, None)
    records = report.sample_records(stages, ALGORITHMS["sharpo"], trainer.tokenizer, 12, 1)
    moving = [r for r in records if r["advantage"] != 0]
    assert moving and records[: len(moving)] == moving  # those whose advantage is not 0 come first
    assert all(isinstance(s["gap"], float) and s["token_delta"] for r in moving for s in r["segments"])
    assert all(s["gap"] is None and s["multiplier"] is None for r in records[len(moving):] for s in r["segments"])


def test_bench_measures_the_ratio_before_any_step_from_numerics_alone(tmp_path):
    """tools/bench.py --ratio-noise: one iteration's student pass against the update's own pass, before any
    optimizer step; in float32 the two agree to rounding (nothing near the PPO window), and the figures are
    written where --out says."""
    from tools import bench

    noise = bench.main(["--model", "tiny", "--episodes", "4", "--group-size", "2", "--steps", "2", "--new-tokens", "6",
                        "--obs-words", "20", "--ways", "fp32,bf16", "--algos", "sharpo", "--ratio-noise",
                        "--out", str(tmp_path / "noise.json")])
    fp32, bf16 = noise["fp32 sharpo"], noise["bf16 sharpo"]
    assert fp32["dtype"] == "fp32" and bf16["dtype"] == "bf16"
    assert fp32["tokens"] > 0 and fp32["outside_clip"] == 0.0 and fp32["max_abs_log_ratio"] < 1e-4
    assert bf16["tokens"] > 0 and bf16["max_abs_log_ratio"] >= fp32["max_abs_log_ratio"]
    assert json.loads((tmp_path / "noise.json").read_text()) == noise
