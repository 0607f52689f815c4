"""tools/credit.py and tools/compare.py: labels, ROC AUC with ties, the game bootstrap and paired differences,
seed statistics; checked on values small enough to work out by hand."""
import copy
import dataclasses
import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from infra.cli import UserError
from segments import Step, Trajectory
from tools import compare, credit


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


def test_bootstrap_of_an_empty_part_is_nan():
    """No steps (e.g. no won episode): the interval is (nan, nan), not a crash."""
    low, high = credit.bootstrap_auc([], [], [], 50, 0)
    assert math.isnan(low) and math.isnan(high)


def test_labels_follow_the_expert():
    steps = [Step([], [], [], "", "Go to desk 1", 0.0, "", "go to desk 1"),  # same action, other case: agrees
             Step([], [], [], "", None, -0.1, "", "go to desk 1"),  # invalid: a mistake
             Step([], [], [], "", "open drawer 1", 0.0, "", "go to desk 1"),  # other action: a mistake
             Step([], [], [], "", "search[red shoes]", 0.0, "", "search[blue mug]")]  # a search agrees with a search
    assert credit.step_labels([Trajectory("t", 0, "x", steps)]) == [[True, False, False, True]]


def test_planner_label_accepts_any_shortest_plan():
    """A valid step is good when the planner's remaining plan got shorter; an invalid step, or a
    step after which the plan is as long or longer, is a mistake; no plan = unlabelled."""
    steps = [Step([], [], [], "", a, 0.0) for a in ("go to desk 1", None, "look", "take pen 1 from desk 1", "go to bed 1")]
    plans = [["a", "b", "c"], ["b", "c"], ["b", "c"], ["c"], None]  # start, then after each valid action
    assert credit.shortens_plan(Trajectory("t", 0, "x", steps), plans) == [True, False, False, True, None]


def test_placebo_blocks():
    """Each task gets its own plan, another task's plan of the closest length, its plan shuffled
    (never left in order) and as many filler lines."""
    plans = {"a": ["x1", "x2", "x3"], "b": ["y1", "y2"], "c": ["z1", "z2", "z3", "z4"]}
    blocks = credit.placebo_plans(plans, seed=0)
    assert blocks["a"]["plan"] == plans["a"] and blocks["a"]["other_task"] in (plans["b"], plans["c"])
    assert sorted(blocks["c"]["shuffled"]) == plans["c"] and blocks["c"]["shuffled"] != plans["c"]
    assert len(blocks["b"]["filler"]) == 2 and "y1" not in blocks["b"]["filler"]


def _scored(logp_teacher_of, n_games=12, steps_per_game=8, seed=0):
    """A synthetic set of failed steps: the student's log-probs are random; every other step is a
    mistake; each teacher's log-probs come from logp_teacher_of(student, mistake, rng)."""
    gen = torch.Generator().manual_seed(seed)
    B, T = n_games * steps_per_game, 6
    student = -torch.rand(B, T, generator=gen)  # (B, T)
    mistake = torch.tensor([b % 2 == 0 for b in range(B)])  # (B,)
    response, action = torch.ones(B, T, dtype=torch.bool), torch.ones(B, T, dtype=torch.bool)  # one whole segment a row
    teachers = {name: logp_teacher_of(name, student, mistake, gen) for name in credit.TEACHERS}
    scores = credit.step_scores(student, teachers, response, action, -torch.ones(B), 0.2)
    return {"game": [b // steps_per_game for b in range(B)], "won": [False] * B,
            "label": (~mistake).tolist(), "label_expert": (~mistake).tolist(),
            "scores": {**{k: v.tolist() for k, v in scores.items()},
                       **{n: torch.rand(B, generator=gen).tolist() for n in credit.NO_TEACHER}}}


def test_a_teacher_equal_to_the_student_scores_one_half():
    """teacher == student: every gap is 0, every multiplier 1, so the blame AUC is exactly 0.5."""
    data = _scored(lambda name, student, mistake, gen: student.clone())
    table = credit.auc_table(data, n_boot=50)
    assert table["scores"]["plan/all"]["blame/label"]["auc"] == 0.5
    assert table["scores"]["plan/rlsd"]["blame/label"]["auc"] == 0.5


def test_an_informative_teacher_beats_the_placebos():
    """A teacher that lowers the log-prob of mistakes (by 0.1 nats a token, plus noise) beats
    placebos that only add noise: blame AUC near 1, and the paired difference to each placebo
    has its whole interval above 0."""
    def teacher(name, student, mistake, gen):
        noise = 0.02 * torch.randn(student.shape, generator=gen)
        shift = -0.1 * mistake[:, None].float() if name == "plan" else 0.0
        return student + noise + shift

    table = credit.auc_table(_scored(teacher), n_boot=200)
    assert table["scores"]["plan/all"]["blame/label"]["auc"] > 0.95
    for placebo in credit.PLACEBOS:
        d = table["paired"][f"blame/plan/all - {placebo}/all"]
        assert d["low"] > 0, (placebo, d)


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


def test_held_out_success_before_and_after_in_the_summary():
    """With --eval-split, each run's held-out success after training sits beside the start policy's,
    and `learned` is their difference, with its interval over seeds."""
    metrics = [{"iteration": 1, "success": 0.5, "seconds/rollout": 1.0}]
    runs = {"sharpo": {0: metrics, 1: metrics, 2: metrics}}
    held_out = {"start": 0.25, ("sharpo", 0): 0.25, ("sharpo", 1): 0.5, ("sharpo", 2): 0.75}
    row = compare.summarize(runs, 1, held_out)["sharpo"]
    assert row["start_success"] == [0.25, 0.25, 0.25]
    assert row["learned"][0] == pytest.approx(0.25) and row["learned"][1] < 0 < row["learned"][2]
    assert "| held-out start | held-out after | learned |" in compare.markdown_table({"sharpo": row})
    assert compare.summarize(runs, 1)["sharpo"]["learned"] is None


def test_gather_reads_only_evaluations_of_the_last_checkpoint(tmp_path):
    """--gather-only summarises the evaluations on disk (a run folder may hold no checkpoint, as in
    results/), but one of an earlier iteration's checkpoint (the run was extended since) is not its last."""
    def write_eval(path, success, checkpoint):
        path.write_text(json.dumps({"success": success, "config": {"checkpoint": checkpoint}}))

    write_eval(tmp_path / "eval_start_valid_seen.json", 0.25, None)
    for seed, iteration in ((0, 3), (1, 2)):
        run = tmp_path / f"sharpo-seed{seed}"
        run.mkdir()
        (run / "config.json").write_text(json.dumps({"env": "alfworld", "model": "smollm2", "data_dir": None}))
        (run / "metrics.jsonl").write_text("".join(json.dumps({"iteration": i, "success": 0.5}) + "\n" for i in (1, 2, 3)))
        write_eval(run / "eval_valid_seen_final.json", 0.5 + seed / 4, f"{run}/checkpoints/iter-{iteration:06d}")
    table = compare.main(["--algos", "sharpo", "--seeds", "0,1", "--out", str(tmp_path), "--gather-only",
                          "--eval-split", "valid_seen", "--", "--env", "alfworld", "--iterations", "3"])
    assert table["sharpo"]["held_out_after"] == [0.5, 0.5, 0.5]  # seed 1's evaluation is of iteration 2: left out
    assert table["sharpo"]["learned"][0] == pytest.approx(0.25)
    assert compare.evaluated_iteration(tmp_path / "sharpo-seed1" / "eval_valid_seen_final.json") == 2


def test_the_start_is_evaluated_in_the_runs_precision(tmp_path, monkeypatch):
    """The start policy's held-out evaluation runs eval.py in the dtype the runs resolved (config.json):
    left to eval.py's own `auto`, a run trained in bf16 elsewhere would be set against a float32 start,
    and greedy play differs between the two (the learning set's warm start won 8 of 32 games in bf16, 7 in float32)."""
    run = tmp_path / "sharpo-seed0"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"env": "alfworld", "model": "smollm2", "data_dir": str(tmp_path / "d"),
                                                 "init_adapter": "w", "dtype": "bf16"}))
    calls = []
    monkeypatch.setattr(compare.subprocess, "run", lambda argv, **k: calls.append(argv))
    args = compare.CompareArgs(eval_split="valid_seen")
    compare.evaluate(tmp_path, {("sharpo", 0): run}, args, iterations=4)
    start = next(argv for argv in calls if str(tmp_path / "eval_start_valid_seen.json") in argv)
    assert start[start.index("--dtype") + 1] == "bf16" and start[start.index("--init-adapter") + 1] == "w"


def test_a_sampled_held_out_evaluation_asks_eval_py_for_it_and_keeps_its_own_files(tmp_path, monkeypatch):
    """--eval-samples K --eval-temperature T: the start and each finished run are evaluated by eval.py
    with those flags, into files of their own (a greedy evaluation on disk is not read for them, nor is
    the run's greedy in-loop one), and the shares won per game are what the bootstrap pairs."""
    run = tmp_path / "grpo-seed0"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"env": "alfworld", "model": "smollm2", "data_dir": None}))
    lines = [{"iteration": i, "success": 0.5, "seconds/rollout": 9.0} for i in (1, 2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    greedy = {"success": 1.0, "games": {"g0": {"won": True}, "g1": {"won": True}},
              "config": {"max_steps": 8, "max_new_tokens": 64, "checkpoint": None}}
    (run / "eval_alfworld_valid_seen_iter-000002.json").write_text(json.dumps(greedy))
    (tmp_path / "eval_start_valid_seen.json").write_text(json.dumps(greedy))
    shares = {"start": {"g0": 0.25, "g1": 0.5}, "run": {"g0": 0.75, "g1": 0.5}}
    calls, real_run = [], compare.subprocess.run

    def fake_eval(argv, **kwargs):
        if "--out" not in argv:  # not compare's eval.py (platform.processor() runs `uname -p` this way)
            return real_run(argv, **kwargs)
        calls.append(argv)
        out = Path(argv[argv.index("--out") + 1])
        won = shares["start" if "start" in out.name else "run"]
        out.write_text(json.dumps({"success": sum(won.values()) / 2, "games": {g: {"won": w} for g, w in won.items()},
                                   "config": {"checkpoint": f"{run}/checkpoints/iter-000002"}}))

    monkeypatch.setattr(compare.subprocess, "run", fake_eval)
    monkeypatch.setattr(compare, "run_state", lambda run, iterations: "done")
    table = compare.main(["--algos", "grpo", "--seeds", "0", "--out", str(tmp_path), "--eval-split", "valid_seen",
                          "--eval-samples", "4", "--eval-temperature", "0.6", "--", "--env", "alfworld", "--iterations", "2"])
    assert len(calls) == 2 and all(a[a.index("--samples-per-game") + 1] == "4" and a[a.index("--temperature") + 1] == "0.6"
                                   for a in calls)
    assert (tmp_path / "eval_start_valid_seen_t0.6x4.json").is_file() and (run / "eval_valid_seen_final_t0.6x4.json").is_file()
    assert table["grpo"]["learned_boot"][0] == pytest.approx(0.25)  # (0.75 - 0.25 + 0.5 - 0.5) / 2 games
    with pytest.raises(UserError, match="--eval-temperature"):
        compare.main(["--algos", "grpo", "--seeds", "0", "--out", str(tmp_path), "--eval-split", "valid_seen",
                      "--eval-samples", "4", "--", "--env", "alfworld"])


def test_learned_bootstrap_pairs_games_and_seeds():
    """after - before per game, resampling games and seeds: no change gives exactly 0; every game
    turning from lost to won gives 1 with a zero-width interval; a mixed change a proper interval."""
    start = {f"g{i}": i < 2 for i in range(8)}
    assert compare.learned_bootstrap(start, {0: dict(start), 1: dict(start)}) == [0.0, 0.0, 0.0]
    none_won = {g: False for g in start}
    assert compare.learned_bootstrap(none_won, {0: {g: True for g in start}}) == [1.0, 1.0, 1.0]
    after = {0: {g: w or g in ("g2", "g3", "g4") for g, w in start.items()},
             1: {g: w or g == "g5" for g, w in start.items()}}
    mean, low, high = compare.learned_bootstrap(start, after)
    assert mean == pytest.approx(4 / 16) and low < mean < high and low >= 0


def test_paired_bootstrap_pairs_each_seed_with_the_same_seed():
    """Algorithm minus GRPO per seed and game: seed k of one is set against seed k of the other
    (not against another seed's games), so two algorithms that win the same games of each seed
    differ by exactly 0 even when the seeds differ from each other."""
    games = [f"g{i}" for i in range(6)]
    grpo = {0: {g: g in ("g0", "g1") for g in games}, 1: {g: g in ("g4", "g5") for g in games}}
    assert compare.paired_bootstrap({k: dict(v) for k, v in grpo.items()}, grpo) == [0.0, 0.0, 0.0]
    swapped = {0: grpo[1], 1: grpo[0]}  # the same wins, on the other seed: 8 of 12 pairs disagree
    mean, low, high = compare.paired_bootstrap(swapped, grpo)
    assert mean == 0.0 and low < 0 < high
    better = {k: {g: w or g == "g2" for g, w in v.items()} for k, v in grpo.items()}
    assert compare.paired_bootstrap(better, grpo)[0] == pytest.approx(1 / 6)
    assert compare.paired_bootstrap(better, {2: grpo[0]}) is None  # no seed in common


def test_held_out_means_are_taken_at_the_iterations_every_seed_evaluated():
    """A seed evaluated at iteration 6 as well as 2, 4, 8 is not averaged with the others' 8."""
    often = [(0, 0.25, 0.0), (2, 0.3, 1.0), (4, 0.4, 2.0), (6, 0.2, 3.0), (8, 0.5, 4.0)]
    rarely = [(0, 0.25, 0.0), (2, 0.3, 1.0), (4, 0.4, 2.0), (8, 0.3, 4.0)]
    aligned = compare.at_common_iterations([often, rarely])
    assert [p[0] for p in aligned[0]] == [p[0] for p in aligned[1]] == [0, 2, 4, 8]
    reach = compare.reach_ratio({"grpo": [often, rarely], "sharpo": [rarely, rarely]})
    assert reach["grpo_final_held_out"] == pytest.approx(0.4)  # (0.5 + 0.3) / 2 at iteration 8, not 6's 0.2
    assert reach["sharpo"] == pytest.approx(0.5)  # its mean 0.4 at iteration 4 reaches GRPO's final: 4 / 8


def test_gather_reads_the_runs_own_evaluations_into_the_learning_picture(tmp_path):
    """A run's in-loop evaluations (eval_<env>_<split>_iter-N.json) give its held-out curve; the one
    of its last iteration stands for the final evaluation when its limits match --eval-*; the
    summary carries the paired bootstrap and how soon each algorithm reaches GRPO's final success."""
    games = [f"valid_seen/g{i}" for i in range(8)]

    def record(won: int, iteration=None, max_steps=6):
        return {"success": won / len(games), "games": {g: {"won": i < won, "steps": 3} for i, g in enumerate(games)},
                "config": {"env": "alfworld", "split": "valid_seen", "iteration": iteration, "checkpoint": None,
                           "max_steps": max_steps, "max_new_tokens": 64}}

    (tmp_path / "eval_start_valid_seen.json").write_text(json.dumps(record(1)))
    for algo, wins in (("sharpo", (3, 5)), ("grpo", (2, 4))):
        for seed in (0, 1):
            run = tmp_path / f"{algo}-seed{seed}"
            run.mkdir()
            (run / "config.json").write_text(json.dumps({"env": "alfworld", "model": "smollm2", "data_dir": None}))
            lines = [{"iteration": i, "success": 0.25 * i, "success_recent": 0.2 * i, "seconds/rollout": 60.0}
                     for i in (1, 2, 3, 4)]
            (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
            for it, won in zip((2, 4), wins):
                (run / f"eval_alfworld_valid_seen_iter-{it:06d}.json").write_text(json.dumps(record(won + seed, it)))
    placebo = tmp_path / "placebo-seed0"  # the control ran seed 0 only: its contrast pairs that seed alone
    shutil.copytree(tmp_path / "grpo-seed0", placebo)
    (placebo / "eval_alfworld_valid_seen_iter-000004.json").write_text(json.dumps(record(1, 4)))
    table = compare.main(["--algos", "sharpo,grpo,placebo", "--seeds", "0,1", "--out", str(tmp_path), "--gather-only",
                          "--eval-split", "valid_seen", "--eval-max-steps", "6",
                          "--", "--env", "alfworld", "--iterations", "4"])
    assert table["sharpo"]["held_out_after"][0] == pytest.approx((5 + 6) / 16)  # the runs' own last evaluations
    assert table["sharpo"]["learned_boot"][0] == pytest.approx((4 + 5) / 16)
    assert table["sharpo"]["vs_placebo_boot"][0] == pytest.approx((5 - 1) / 8)  # seed 0's games only
    assert table["grpo"]["vs_placebo_boot"][0] == pytest.approx((4 - 1) / 8)
    assert "vs_placebo_boot" not in table["placebo"]
    assert "after - placebo's" in (tmp_path / "summary.md").read_text()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["held_out_curves"]["grpo"][0][0] == [0, 1 / 8, 0.0]  # the start, at iteration 0 and minute 0
    assert summary["held_out_curves"]["grpo"][0][1] == [2, 2 / 8, 2.0]
    reach = summary["reach_vs_grpo"]  # GRPO ends at 4.5 / 8; SHARPO's mean is 3.5 / 8 at 2, 5.5 / 8 at 4
    assert reach["grpo"] == 1.0 and reach["sharpo"] == pytest.approx((2 + 2 * (1 / 8) / (2 / 8)) / 4)
    assert (tmp_path / "learning.png").exists()
    # other limits than asked: the run's own evaluation is not the final one, and --gather-only runs none
    table = compare.main(["--algos", "sharpo,grpo", "--seeds", "0,1", "--out", str(tmp_path), "--gather-only",
                          "--eval-split", "valid_seen", "--eval-max-steps", "8",
                          "--", "--env", "alfworld", "--iterations", "4"])
    assert table["sharpo"]["held_out_after"] is None


def test_compare_refuses_flags_it_sets():
    with pytest.raises(compare.UserError, match="--seed"):
        compare.main(["--out", "/tmp/x", "--", "--seed", "3"])
    with pytest.raises(compare.UserError, match="unknown algorithm"):
        compare.main(["--algos", "ppo", "--out", "/tmp/x"])
    with pytest.raises(compare.UserError, match="--eval-split"):
        compare.main(["--eval-split", "dev", "--out", "/tmp/x"])


def test_credit_end_to_end_on_the_stub_env():
    """play -> placebo blocks -> labels -> score_steps -> auc_table with the tiny model: every
    score is reported for both parts, identical steps are counted once, and GRPO's constant
    weight gives 0.5 (or nan where a part has one class)."""
    from infra.models import load_policy
    from stub_env import StubEnv

    model, tok = load_policy("tiny", lora_r=4, lora_alpha=8, seed=3)
    env = StubEnv(2)
    args = credit.CreditArgs(group_size=4, max_new_tokens=8, bootstrap=20)
    trajs = credit.play(model, tok, env, ["task-a", "task-b"], args, seeds=[0, 1])
    blocks = credit.placebo_plans({t: env.expert_plan(t) for t in ("task-a", "task-b")}, seed=0)
    data = credit.score_steps(model, tok, trajs, blocks, credit.step_labels(trajs), args)
    assert len(data["won"]) + data["copies"] == sum(len(t.steps) for t in trajs)
    # copies whose labels differ (their states differ beyond the history the context shows) stay two
    twin = copy.deepcopy(trajs[0])
    labels = credit.step_labels([trajs[0], twin])
    labels[1] = [not x for x in labels[1]]
    both = credit.score_steps(model, tok, [trajs[0], twin], blocks, labels, args)
    alone = credit.score_steps(model, tok, [trajs[0]], blocks, labels[:1], args)
    assert len(both["won"]) == 2 * len(alone["won"])
    assert sorted(both["label"]) == sorted(alone["label"] + [not x for x in alone["label"]])
    cooler = credit.score_steps(model, tok, trajs, blocks, credit.step_labels(trajs),
                                dataclasses.replace(args, temperature=0.5))  # the log-probs of a policy sampled at 0.5
    assert cooler["label"] == data["label"] and cooler["scores"]["surprise"] != data["scores"]["surprise"]
    with pytest.raises(UserError, match="temperature"):
        credit.main(["--temperature", "0"])
    table = credit.auc_table(data, n_boot=20)
    for kind, name in credit.SCORE_ROWS:
        for part in ("blame/label", "credit/label", "blame/label_expert"):
            assert part in table["scores"][name]
    grpo = table["scores"]["grpo"]["blame/label"]["auc"]
    assert math.isnan(grpo) or grpo == 0.5


def test_compare_starts_runs_seed_by_seed_and_passes_a_stop_on(tmp_path, monkeypatch):
    """Every algorithm of seed 0 starts before any of seed 1 (a set stopped halfway compares like
    with like); a Ctrl-C stops the runs it started and says the same command resumes them."""
    import signal
    import subprocess
    import sys

    started, procs = [], []

    def fake_launch(algo, seed, run, train_flags, threads, state):
        started.append((algo, seed))
        # the fake run says when its interpreter is up: a SIGINT that lands during Python's own start-up ends it
        # with exit code 1, not -SIGINT (a slow start on a loaded machine made this test fail at random)
        # and it takes SIGINT as train.py does (quiet_start, then catch_sigterm, install their own handler): a
        # process started as a shell's background job inherits SIGINT ignored, and so would the fake runs of a
        # pytest started that way, which would then sleep through compare's stop and exit 0
        fake_run = ("import signal, time; signal.signal(signal.SIGINT, signal.default_int_handler); "
                    "print('up', flush=True); time.sleep(300)")
        procs.append(subprocess.Popen([sys.executable, "-c", fake_run],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
        assert procs[-1].stdout.readline().strip() == "up"
        return procs[-1]

    real_sleep, stops = compare.time.sleep, []

    def ctrl_c_once_all_started(seconds):  # compare.py's poll: the Ctrl-C lands there, once
        # only when compare.py's own loop calls it: the patch is on the time module, which every thread and
        # library shares, and a KeyboardInterrupt raised elsewhere would never reach compare
        if len(started) == 4 and not stops and sys._getframe(1).f_globals.get("__name__") == compare.__name__:
            stops.append(1)
            raise KeyboardInterrupt()
        real_sleep(min(seconds, 0.05))

    monkeypatch.setattr(compare, "launch", fake_launch)
    monkeypatch.setattr(compare.time, "sleep", ctrl_c_once_all_started)
    with pytest.raises(compare.errors.Stopped, match="the same command resumes them") as stopped:
        compare.main(["--algos", "sharpo,grpo", "--seeds", "0,1", "--jobs", "4", "--out", str(tmp_path),
                      "--", "--model", "tiny"])
    returncodes = [p.returncode for p in procs]  # 0 would mean a sleep ran out: the stop never reached that run
    assert started == [("sharpo", 0), ("grpo", 0), ("sharpo", 1), ("grpo", 1)]
    assert "sharpo seed 0, grpo seed 0, sharpo seed 1, grpo seed 1" in str(stopped.value)
    assert not stopped.value.terminated  # and every fake run was stopped by the SIGINT compare.py sent:
    assert all(code == -signal.SIGINT for code in returncodes), returncodes


def test_the_placebo_runs_grpo_on_shuffled_rewards(tmp_path, monkeypatch):
    """--algos placebo is a run of train.py with --algo grpo --shuffle-rewards, in OUT/placebo-seed<k>."""
    seen = []

    class Done:
        returncode = 0

        def poll(self):
            return 0

    monkeypatch.setattr(compare.subprocess, "Popen", lambda argv, **kw: seen.append(argv) or Done())
    with pytest.raises(compare.UserError, match="no run .* has metrics"):  # the fake run wrote none
        compare.main(["--algos", "placebo", "--seeds", "3", "--out", str(tmp_path), "--", "--model", "tiny",
                      "--iterations", "1"])
    argv = seen[0]
    assert argv[argv.index("--algo") + 1] == "grpo" and "--shuffle-rewards" in argv
    assert argv[argv.index("--seed") + 1] == "3" and argv[argv.index("--output-dir") + 1] == str(tmp_path / "placebo-seed3")
    with pytest.raises(compare.UserError, match="--shuffle-rewards"):
        compare.main(["--algos", "grpo", "--out", str(tmp_path), "--", "--shuffle-rewards"])


def test_the_training_rise_and_its_placebo_comparison(tmp_path):
    """train_rise: the mean training success of the last 2 iterations minus iteration 1's; train_rise_boot the
    same from each task's [won, played], resampled over seeds and tasks; rise_vs_placebo-sharpo_boot the rise
    minus the placebo's, paired per seed and task; invalid_change the same difference of the invalid rate."""
    tasks = ["a", "b"]

    def lines(wins_by_iteration, invalid):
        return [{"iteration": i + 1, "success": sum(w) / 8, "mean_reward": 0.0, "invalid_rate": invalid[i],
                 "groups_with_spread": 1.0, "seconds/rollout": 1.0,
                 "task_wins": {t: [w[k], 4] for k, t in enumerate(tasks)}} for i, w in enumerate(wins_by_iteration)]

    runs = {"sharpo": [[1, 1], [2, 3], [4, 3], [4, 4]], "placebo-sharpo": [[1, 1], [1, 2], [1, 1], [1, 1]]}
    for algo, wins in runs.items():
        for seed in (0, 1):
            run = tmp_path / f"{algo}-seed{seed}"
            run.mkdir()
            (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n"
                                                       for m in lines(wins, [0.2, 0.1, 0.1, 0.1])))
    table = compare.main(["--algos", "sharpo,placebo-sharpo", "--seeds", "0,1", "--out", str(tmp_path), "--gather-only"])
    rise = (3.5 + 4) / 8 - 2 / 8  # iterations 3 and 4 averaged (7 and 8 wins of 8), minus iteration 1's 2 of 8
    assert table["sharpo"]["train_rise"][0] == pytest.approx(rise)
    assert table["sharpo"]["train_rise_boot"][0] == pytest.approx(rise)
    assert table["placebo-sharpo"]["train_rise"][0] == pytest.approx(0.0)
    assert table["sharpo"]["rise_vs_placebo-sharpo_boot"][0] == pytest.approx(rise)
    assert table["sharpo"]["invalid_change"][0] == pytest.approx(-0.1)
    assert "training rise (last 2 - first)" in (tmp_path / "summary.md").read_text()
    assert compare.task_rise(lines([[1, 1], [2, 2]], [0, 0])) is None  # too few iterations for a rise


@pytest.mark.parametrize("which", ["start", "last"])
@pytest.mark.parametrize("games", [{"valid_seen/g0": 1}, {"valid_seen/g0": [1, 3]}, [1, 2],
                                   {"valid_seen/g0": {"won": "yes", "steps": 3}}])
def test_compare_reads_damaged_games_in_one_line(tmp_path, which, games):
    """tools.compare --gather-only over a start or last evaluation whose `games` holds numbers or lists
    where each game's outcome belongs: one line naming the file and the field (a TypeError, "argument of
    type 'int' is not iterable", before: the record's one reader checked `success`, not `games`)."""
    record = {"success": 0.5, "games": {"valid_seen/g0": {"won": True, "steps": 3}},
              "config": {"env": "alfworld", "split": "valid_seen", "iteration": 4, "checkpoint": None,
                         "max_steps": 6, "max_new_tokens": 64}}
    run = tmp_path / "sharpo-seed0"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"env": "alfworld", "model": "smollm2", "data_dir": None}))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"iteration": i, "success": 0.5, "seconds/rollout": 1.0})
                                               + "\n" for i in (1, 2, 3, 4)))
    damaged = tmp_path / "eval_start_valid_seen.json" if which == "start" else run / "eval_alfworld_valid_seen_iter-000004.json"
    for path in (tmp_path / "eval_start_valid_seen.json", run / "eval_alfworld_valid_seen_iter-000004.json"):
        path.write_text(json.dumps({**record, "games": games} if path == damaged else record))
    with pytest.raises(UserError, match=f"{damaged.name}: 'games' should map each game to its outcome"):
        compare.main(["--algos", "sharpo", "--seeds", "0", "--out", str(tmp_path), "--gather-only", "--eval-split",
                      "valid_seen", "--eval-max-steps", "6", "--", "--env", "alfworld", "--iterations", "4"])
