"""credit.py and compare.py: labels, ROC AUC with ties, bootstrap, each method's weight, the
seed statistics; checked on values small enough to work out by hand."""
import json
import math

import pytest
import torch

import compare
import credit
import train
from rollout import load_policy
from segments import Step, Trajectory
from stub_env import StubEnv


def test_auc_of_perfect_inverted_constant_and_tied_scorers():
    """A perfect blamer gives 1, an inverted one 0, a constant one 0.5; ties count half:
    scores (1, 2, 2, 3) with labels (F, T, F, T): pairs (pos, neg) = (2,1) win, (2,2) tie,
    (3,1) win, (3,2) win -> (3 + 0.5) / 4 = 0.875."""
    labels = [False, False, True, True]
    assert credit.roc_auc([0.1, 0.2, 0.8, 0.9], labels) == 1.0
    assert credit.roc_auc([0.9, 0.8, 0.2, 0.1], labels) == 0.0
    assert credit.roc_auc([1.0, 1.0, 1.0, 1.0], labels) == 0.5
    assert credit.roc_auc([1, 2, 2, 3], [False, True, False, True]) == 0.875
    assert math.isnan(credit.roc_auc([1, 2], [True, True]))


def test_roc_curve_and_bootstrap():
    fpr, tpr = credit.roc_curve([0.1, 0.2, 0.8, 0.9], [False, False, True, True])
    assert (fpr[0], tpr[0]) == (0.0, 0.0) and (fpr[-1], tpr[-1]) == (1.0, 1.0) and tpr[2] == 1.0 and fpr[2] == 0.0
    low, high = credit.bootstrap_auc([0.1, 0.2, 0.8, 0.9] * 5, [False, False, True, True] * 5, list(range(20)), 200, 0)
    assert low == high == 1.0  # a perfect scorer stays perfect under resampling
    low, high = credit.bootstrap_auc([0.1, 0.9, 0.2, 0.8] * 5, [False, False, True, True] * 5, list(range(20)), 300, 0)
    assert low < 0.5 < high


def test_labels_follow_the_expert():
    steps = [Step([], [], [], "", "Go to desk 1", 0.0, "", "go to desk 1"),  # same action, other case: agrees
             Step([], [], [], "", None, -0.1, "", "go to desk 1"),  # invalid: a mistake
             Step([], [], [], "", "open drawer 1", 0.0, "", "go to desk 1"),  # other action: a mistake
             Step([], [], [], "", "search[red shoes]", 0.0, "", "search[blue mug]")]  # a search agrees with a search
    assert credit.step_labels([Trajectory("t", 0, "x", steps)]) == [[True, False, False, True]]


def test_method_weights():
    """SHARPO: the clipped exp(sign(A) g) of the segment; RLSD: the mean of per-token multipliers
    over the segment; GiGPO: 1 + omega * A_step / A; GRPO: 1."""
    adv = torch.tensor([-1.0, 2.0])
    student = torch.zeros(2, 3)
    teacher = torch.tensor([[-0.1, -0.1, 0.0], [0.3, 0.0, 0.0]])
    seg = torch.tensor([[0, 0, -1], [0, 0, 0]])
    w = credit.method_weights("sharpo", adv, teacher, student, seg, None, 0.2)
    assert w.tolist() == pytest.approx([math.exp(0.1), math.exp(0.1)])
    r = credit.method_weights("rlsd", adv, teacher, student, seg, None, 0.2)
    assert r.tolist() == pytest.approx([math.exp(0.1), (1.2 + 1 + 1) / 3])
    g = credit.method_weights("gigpo", adv, teacher, student, seg, None, 0.2, step_adv=torch.tensor([0.5, 1.0]))
    assert g.tolist() == pytest.approx([0.5, 1.5])
    assert credit.method_weights("grpo", adv, teacher, student, seg, None, 0.2).tolist() == [1.0, 1.0]


def test_measure_on_the_stub_env(tmp_path):
    """measure() labels the stub's steps (its expert says 'win', the policy plays 'look': every
    step a mistake) and gives GRPO its 0.5 or nan; every method and gap-token set is reported."""
    args = train.parse_args(["--model=tiny", "--preset=none", "--groups=2", "--group-size=4", "--max-steps=2",
                             "--max-new-tokens=8", "--eval-every=0", "--hindsight=expert", f"--output-dir={tmp_path}"])
    model, tok = load_policy("tiny", lora_r=4, lora_alpha=8, seed=3)
    trainer = train.Trainer(args, model=model, tokenizer=tok, env=StubEnv(2))
    trajs, _ = trainer.rollout(1)
    table, curves = credit.measure(trainer, trajs, credit.CreditArgs(bootstrap=20))
    assert set(table) == {f"{m}/{g}" for m in credit.METHODS for g in ("all", "action")}
    for row in table.values():
        assert row["blame"]["positives"] == row["blame"]["steps"]  # every failed step is a mistake here
        assert math.isnan(row["blame"]["auc"]) or row["blame"]["auc"] == 0.5


def test_seed_intervals_and_summary(tmp_path):
    """mean +- t_{0.975, n-1} sd / sqrt(n): for (0, 1, 2) that is 1 +- 4.303 * 1 / sqrt(3); the
    summary gathers run folders and reports time relative to GRPO."""
    mean, low, high = compare.mean_interval([0.0, 1.0, 2.0])
    assert mean == 1.0 and high - mean == pytest.approx(4.303 / math.sqrt(3))
    assert compare.mean_interval([0.4]) == (0.4, 0.4, 0.4)
    for algo, succ, secs in (("sharpo", [0.0, 0.5, 1.0], 20.0), ("grpo", [0.0, 0.0, 0.5], 10.0)):
        for seed in (0, 1):
            run = tmp_path / f"{algo}-seed{seed}"
            run.mkdir()
            lines = [{"iteration": i + 1, "success": s, "mean_reward": 0.0, "invalid_rate": 0.0,
                      "groups_with_spread": 1.0, "seconds/rollout": secs} for i, s in enumerate(succ)]
            (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines) + '{"torn')
    table = compare.main(["--algos", "sharpo,grpo", "--seeds", "0,1", "--out", str(tmp_path), "--gather-only",
                          "--final-window", "2"])
    assert table["sharpo"]["final_success"][0] == pytest.approx(0.75)
    assert table["sharpo"]["auc_success"][0] == pytest.approx(0.5)
    assert table["sharpo"]["time_vs_grpo"] == pytest.approx(2.0)
    assert (tmp_path / "curves.png").exists() and "| sharpo | 2 | 3 |" in (tmp_path / "summary.md").read_text()


def test_compare_refuses_flags_it_sets():
    with pytest.raises(compare.UserError, match="--seed"):
        compare.main(["--out", "/tmp/x", "--", "--seed", "3"])
    with pytest.raises(compare.UserError, match="unknown algorithm"):
        compare.main(["--algos", "ppo", "--out", "/tmp/x"])
