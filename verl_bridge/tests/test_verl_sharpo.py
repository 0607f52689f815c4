"""integrations/verl_sharpo.py against the installed verl package (run in verl's own
environment, see README): DataProtos built by hand give advantage.py's numbers on the same
inputs, in both layouts; segment ids come from the runs of response_mask."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
torch.set_num_threads(1)

from verl import DataProto  # noqa: E402  (the real package: these tests need it)

from advantage import grpo_advantages, segment_gap, segment_multipliers, token_advantages  # noqa: E402
from baselines import rlsd_token_advantages  # noqa: E402
from verl_bridge.verl_sharpo import hindsight_messages, needs_teacher, runs_of_ones, sharpo_advantages  # noqa: E402


def _proto(tensors: dict, non_tensors: dict) -> DataProto:
    return DataProto.from_dict(tensors=tensors, non_tensors={k: np.array(v, dtype=object) for k, v in non_tensors.items()})


def test_runs_of_ones_by_hand_and_against_a_loop():
    mask = torch.tensor([[1, 1, 0, 0, 1, 0, 1, 1], [0, 1, 1, 1, 0, 0, 0, 0]])
    assert runs_of_ones(mask).tolist() == [[0, 0, -1, -1, 1, -1, 2, 2], [-1, 0, 0, 0, -1, -1, -1, -1]]
    g = torch.Generator().manual_seed(0)
    mask = (torch.rand(20, 30, generator=g) > 0.4).long()
    fast = runs_of_ones(mask)
    for b in range(20):
        run, prev = -1, 0
        for t in range(30):
            if mask[b, t] and not prev:
                run += 1
            assert fast[b, t] == (run if mask[b, t] else -1)
            prev = int(mask[b, t])


def test_per_step_layout_equals_advantage_py():
    """verl-agent's layout: 2 groups, trajectories of 1-3 step samples; each sample carries its
    episode reward. The result equals grpo_advantages over trajectories, then
    train.py's token_advantages per step sample (one segment each)."""
    g = torch.Generator().manual_seed(1)
    traj_uid = ["a", "a", "b", "c", "c", "c", "d", "e", "e"]
    uid = ["g1", "g1", "g1", "g1", "g1", "g1", "g2", "g2", "g2"]
    episode = {"a": 10.0, "b": 0.0, "c": -0.2, "d": 0.0, "e": 10.0}
    B, T = len(traj_uid), 6
    mask = torch.ones(B, T, dtype=torch.long)
    mask[:, 4:] = torch.randint(0, 2, (B, 2), generator=g)  # some padding at the end
    mask[:, 4:] = mask[:, 4:].cummin(dim=1).values  # padding only after the response
    rewards = torch.zeros(B, T)
    rewards[:, 0] = torch.tensor([episode[t] for t in traj_uid])
    student = -torch.rand(B, T, generator=g)
    teacher = student + 0.3 * torch.randn(B, T, generator=g)
    data = _proto({"response_mask": mask, "token_level_rewards": rewards, "old_log_probs": student,
                   "teacher_log_probs": teacher}, {"uid": uid, "traj_uid": traj_uid})
    got = sharpo_advantages(data, layout="per_step", lam=0.5, eps_m=0.2, episode_stats="trajectory")
    order = ["a", "b", "c", "d", "e"]
    adv_traj = grpo_advantages(torch.tensor([episode[t] for t in order], dtype=torch.float64),
                               torch.tensor([0, 0, 0, 1, 1]))
    adv_row = adv_traj[[order.index(t) for t in traj_uid]].float()
    response = mask.bool()
    want = token_advantages(adv_row, segment_gap(teacher, student, response), response, lam=0.5, eps_m=0.2)[0]
    assert torch.equal(got, want)
    assert got.abs().sum() > 0 and (got[mask == 0] == 0).all()


def test_per_trajectory_layout_equals_advantage_py():
    """verl's multi-turn loop: one sample per trajectory, segments are the runs of
    response_mask (environment tokens between them are 0)."""
    g = torch.Generator().manual_seed(2)
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 1, 0], [1, 0, 1, 1, 0, 1, 0, 0], [1, 1, 1, 0, 0, 1, 1, 1]])
    rewards = torch.zeros(3, 8)
    rewards[:, -1] = torch.tensor([10.0, 0.0, -0.1])
    student = -torch.rand(3, 8, generator=g)
    teacher = student + 0.3 * torch.randn(3, 8, generator=g)
    data = _proto({"response_mask": mask, "token_level_rewards": rewards, "old_log_probs": student,
                   "teacher_log_probs": teacher}, {"uid": ["g", "g", "g"]})
    for algo, shape in (("sharpo", "exp"), ("stepopsd", "sigmoid"), ("rlsd", None), ("grpo", None)):
        got = sharpo_advantages(data, layout="per_trajectory", algo=algo, lam=0.5, eps_m=0.2, episode_stats="trajectory")
        adv = grpo_advantages(torch.tensor([10.0, 0.0, -0.1], dtype=torch.float64), torch.tensor([0, 0, 0])).float()
        if algo == "rlsd":
            want = rlsd_token_advantages(adv, teacher, student, mask.bool(), 0.5, 0.2)[0]
        elif algo == "grpo":  # lam 0: Ahat = A on every segment token
            want = torch.where(mask.bool(), adv[:, None], torch.zeros(()))
        else:  # segment by segment, with advantage.py's functions, in a plain loop
            seg, want = runs_of_ones(mask), torch.zeros(3, 8)
            for b in range(3):
                for s in set(seg[b].tolist()) - {-1}:
                    here = seg[b] == s
                    g = (teacher[b][here] - student[b][here]).mean()
                    want[b][here] = adv[b] * (0.5 + 0.5 * segment_multipliers(adv[b], g, 0.2, shape))
        assert torch.allclose(got, want, atol=1e-6)
    got, seg = sharpo_advantages(data, layout="per_trajectory", lam=0.5, eps_m=0.2, episode_stats="trajectory"), runs_of_ones(mask)[0]
    first, second = got[0][seg == 0], got[0][seg == 1]
    assert (first == first[0]).all() and (second == second[0]).all()  # constant within a segment (segment form)


def test_per_step_scores_as_verl_agent_writes_them():
    """verl-agent's forks put an invalid action's 0.1 penalty on that step's own sample: a 2-step win (10, then
    9.9 on its invalid step) and a 3-step loss (0, 0, -0.1) in one group. Each sample gets (its own score - mean)
    / (std + 1e-6), the statistics over every step sample ("step", verl-agent's default) or over each
    trajectory's first sample ("trajectory"), worked out by hand here."""
    scores = [10.0, 9.9, 0.0, 0.0, -0.1]
    data = _proto({"response_mask": torch.ones(5, 3, dtype=torch.long),
                   "token_level_rewards": torch.tensor([[s, 0, 0] for s in scores]),
                   "old_log_probs": torch.zeros(5, 3), "teacher_log_probs": torch.zeros(5, 3)},
                  {"uid": ["g"] * 5, "traj_uid": ["a", "a", "b", "b", "b"]})
    x = torch.tensor(scores, dtype=torch.float64)
    step = (x - x.mean()) / (x.std() + 1e-6)  # the five samples' statistics
    first = torch.tensor([10.0, 0.0], dtype=torch.float64)  # each trajectory's first sample
    traj = (x - first.mean()) / (first.std() + 1e-6)
    for stats, want in (("step", step), ("trajectory", traj)):
        got = sharpo_advantages(data, layout="per_step", lam=0.0, eps_m=0.2, episode_stats=stats)[:, 0]  # lam 0: A
        assert torch.allclose(got, want.float(), atol=1e-5), stats
    assert not torch.allclose(step.float(), traj.float())  # the choice matters
    with pytest.raises(ValueError, match="episode_stats"):
        sharpo_advantages(data, lam=0.5, eps_m=0.2, episode_stats="row")
    messages = hindsight_messages([{"role": "system", "content": "s"}, {"role": "user", "content": "task"}], ["look", "go"])
    assert messages[:2] == [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    assert messages[2]["role"] == "user" and messages[2]["content"].endswith("1. look\n2. go")


def test_the_teacher_is_needed_only_where_the_advantage_is_not_zero():
    """needs_teacher marks exactly the samples whose A_i != 0 (a tied group has none), in both layouts;
    whatever finite teacher log-probs the other samples hold, Ahat is the same."""
    g = torch.Generator().manual_seed(3)
    traj_uid = ["a", "a", "b", "c", "d", "d", "e"]
    uid = ["tied", "tied", "tied", "tied", "spread", "spread", "spread"]
    episode = {"a": 0.0, "b": 0.0, "c": 0.0, "d": 10.0, "e": 0.0}
    B, T = len(traj_uid), 5
    mask = torch.ones(B, T, dtype=torch.long)
    rewards = torch.zeros(B, T)
    rewards[:, 0] = torch.tensor([episode[t] for t in traj_uid])
    student = -torch.rand(B, T, generator=g)
    teacher = student + 0.3 * torch.randn(B, T, generator=g)
    tensors = {"response_mask": mask, "token_level_rewards": rewards, "old_log_probs": student,
               "teacher_log_probs": teacher}
    data = _proto(tensors, {"uid": uid, "traj_uid": traj_uid})
    needed = needs_teacher(data, episode_stats="trajectory")
    assert needed.tolist() == [False, False, False, False, True, True, True]
    skipped = _proto({**tensors, "teacher_log_probs": torch.where(needed[:, None], teacher, student)},
                     {"uid": uid, "traj_uid": traj_uid})
    assert torch.equal(sharpo_advantages(skipped, lam=0.5, eps_m=0.2, episode_stats="trajectory"), sharpo_advantages(data, lam=0.5, eps_m=0.2, episode_stats="trajectory"))
    per_traj = _proto({"response_mask": mask[:3], "token_level_rewards": rewards[:3]}, {"uid": ["g", "g", "h"]})
    assert needs_teacher(per_traj, layout="per_trajectory", episode_stats="trajectory").tolist() == [False, False, False]  # g ties, h is alone


def test_grpo_agrees_with_verls_own_over_random_groupings():
    """advantage.grpo_advantages against verl 0.9.1's compute_grpo_outcome_advantage on 200 random batches (groups
    of 2-8, rewards 10 * won - 0.1 * invalid): equal up to verl's float32 cancellation, except where this code
    departs on purpose (a group of one: 0, verl its raw reward; a group whose rewards tie: exactly 0). Prints the
    largest difference and the group it came from (docs/scaling.md quotes them)."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    g = torch.Generator().manual_seed(0)
    worst, where = 0.0, None
    for _ in range(200):
        sizes = torch.randint(2, 9, (4,), generator=g).tolist()
        groups = torch.tensor([k for k, n in enumerate(sizes) for _ in range(n)])
        won = torch.rand(len(groups), generator=g) < 0.4
        invalid = torch.randint(0, 3, (len(groups),), generator=g)
        rewards = 10.0 * won - 0.1 * invalid
        ties = torch.tensor([len(set(rewards[groups == k].tolist())) == 1 for k in groups.tolist()])
        scores = torch.zeros(len(groups), 3)
        scores[:, -1] = rewards
        theirs, _ = compute_grpo_outcome_advantage(scores, torch.ones(len(groups), 3), np.array(groups.tolist()))
        ours = grpo_advantages(rewards.double(), groups).float()
        diff = (theirs[:, 0] - ours).abs().masked_fill(ties, 0.0)  # ties: verl's rounding noise, ours exactly 0
        if diff.max() > worst:
            k = int(groups[diff.argmax()])
            worst, where = float(diff.max()), [round(r, 1) for r in rewards[groups == k].tolist()]
    print(f"largest |verl - ours| over 200 random batches: {worst:.2e}, in the group {where}")
    assert worst < 1e-4


def test_a_name_the_table_does_not_give_the_bridge_is_refused():
    """The function that branches on the algorithm refuses a name it does not compute (a case of one, a
    word of the old settings, an algorithm of the table the bridge cannot compute) instead of computing
    SHARPO's segment credit; every name it takes comes from train.py's table (baselines.ALGORITHMS)."""
    from baselines import ALGORITHMS
    from verl_bridge.verl_sharpo import BRIDGED, token_advantages

    assert set(BRIDGED) <= set(ALGORITHMS) and {"sharpo", "stepopsd", "rlsd", "grpo"} <= set(BRIDGED)
    adv, logp, seg = torch.tensor([1.0]), torch.zeros(1, 3), torch.tensor([[0, 0, -1]])
    for name in ("Sharpo", "tokens", "token", "sigmoid", "gigpo", "sdar"):
        with pytest.raises(ValueError, match="algo must be one of"):
            token_advantages(adv, logp, logp, seg, 0.5, 0.2, algo=name)
