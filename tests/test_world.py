"""The controlled world (tools/world.py) on train.py's own credit path: a better teacher makes SHARPO reach
the threshold sooner, a placebo teacher (AUC 0.5) learns at GRPO's speed, and the variance split of log m
adds up. Small settings: seconds on one thread."""
import pytest
import torch

from tools import world

torch.set_num_threads(1)
SMALL = dict(tasks=8, groups=4, group_size=8, decisions=6, lr=0.2, iterations=60, seeds=6, threshold=0.5)


def iterations(algo, auc, eps_m, lam, args):
    return [world.iterations_to(world.run_world(algo, auc, eps_m, lam, s, args), args.threshold) for s in range(args.seeds)]


def test_a_better_teacher_makes_sharpo_faster_and_a_placebo_does_not():
    args = world.WorldArgs(**SMALL)
    grpo = iterations("grpo", 0.92, 0.5, 1.0, args)
    assert max(grpo) < args.iterations + 1  # every seed reaches the threshold: the comparison is not censored
    by_auc = {auc: iterations("sharpo", auc, 0.5, 1.0, args) for auc in (0.6, 1.0)}
    assert sum(by_auc[1.0]) < sum(by_auc[0.6])  # iterations to the threshold fall as the teacher's AUC rises
    perfect = world.mean_interval([s / g for s, g in zip(by_auc[1.0], grpo)])
    assert perfect[2] < 1.0  # a perfect teacher is faster than GRPO, the whole interval below 1
    placebo = world.mean_interval([p / g for p, g in zip(iterations("placebo", 0.92, 0.5, 1.0, args), grpo)])
    assert placebo[1] <= 1.0 <= placebo[2]  # the placebo's speed is GRPO's within the seeds' interval


def test_grpo_and_the_placebo_teacher_differ_only_by_the_gaps():
    """lam = 0 is GRPO whatever the teacher says: the same seed gives the same curve."""
    args = world.WorldArgs(**{**SMALL, "iterations": 10})
    assert world.run_world("grpo", 0.92, 0.2, 0.5, 3, args) == world.run_world("sharpo", 0.92, 0.2, 0.0, 3, args)
    assert world.run_world("grpo", 0.92, 0.2, 0.5, 3, args) != world.run_world("sharpo", 1.0, 0.2, 0.5, 3, args)


def test_teacher_noise_gives_the_asked_auc():
    """The gap's noise is set so that right and wrong decisions are told apart with the chosen ROC AUC."""
    g = torch.Generator().manual_seed(0)
    sigma = world.teacher_sigma(0.76, 0.3)
    right = 0.3 + sigma * torch.randn(20000, generator=g)
    wrong = -0.3 + sigma * torch.randn(20000, generator=g)
    auc = float((right[:, None][:2000] > wrong[None, :2000]).float().mean())
    assert auc == pytest.approx(0.76, abs=0.02)
    with pytest.raises(ValueError):
        world.teacher_sigma(0.5, 0.3)


def test_the_log_m_split_adds_up_by_hand():
    """Two episodes of two segments: log m = (a, a) and (b, -b) -> episode part ((a - mu)^2 ...) + within part."""
    m = torch.exp(torch.tensor([0.2, 0.2, 0.1, -0.1]))
    out = world.decompose_log_m(m, torch.tensor([0, 0, 1, 1]))
    # episode means 0.2 and 0; overall mean 0.1: episode part 0.01; within: (0 + 0 + 0.01 + 0.01) / 4 = 0.005
    assert out["episode"] == pytest.approx(0.01) and out["within"] == pytest.approx(0.005)
    assert out["total"] == pytest.approx(out["episode"] + out["within"]) and out["within_share"] == pytest.approx(1 / 3)


def test_power_analysis_by_hand():
    """((1.96 + 0.8416) * 1 / 0.1)^2 = 784.9 pairs for a difference of 0.1 with std 1."""
    assert world.power_pairs(0.1, 1.0) == pytest.approx(784.9, rel=1e-3)


def test_the_optimizer_study_runs_both_optimizers_on_the_same_seeds():
    """--optimizers: SHARPO/GRPO at AUC 1 under Adam and under plain SGD (notebook 05's last section); the
    optimizer is really switched (SGD's curve differs from Adam's on the same seed)."""
    from tools import world

    args = world.WorldArgs(seeds=2, iterations=30, tasks=4, groups=2, threshold=0.1, bounds="0.2:0.5")
    adam = world.run_world("grpo", 0.5, 0.2, 0.5, 0, args)
    sgd = world.run_world("grpo", 0.5, 0.2, 0.5, 0, world.WorldArgs(**{**world.asdict(args), "optimizer": "sgd"}))
    assert adam[0] == sgd[0] and adam[-1] != sgd[-1]  # the same start, other steps
    out = world.optimizer_study(args)["by_optimizer"]
    assert set(out) == {"adam", "sgd"} and out["sgd"]["lr"] == args.sgd_lr
    assert all(len(r["ratio"]["eps_m 0.2, lam 0.5"]) == 3 for r in out.values())
