"""Evaluation records and logs, and what reads them. eval.py claims its result's name in a run folder
before the first game (two at once keep two results; a failed one gives its name back) and never takes or
replaces the name of a run's own in-loop evaluation; tools.compare takes a record only where it measured
what compare asks (all the games, that checkpoint) and reads a damaged record, config.json or log line
in one line naming it; tools.plots skips a log line it cannot read, naming it. If these fail, a result is
lost or overwritten, compare reports a number that measured something else, or a reader ends in a
traceback."""
import json

import pytest

import eval as eval_script
from cli_runs import run_cli as _cli
from infra import checkpoint
from infra.cli import UserError
from tiny_runs import tiny_run_folder


# ----------------------------------------------------------------------------- eval.py's records in a run folder
def test_two_evaluations_of_one_checkpoint_claim_two_names(tmp_path):
    """Two `eval.py --checkpoint RUN` at once both picked the first free name, and one result was lost: the
    name is claimed (a hidden claim file beside it, created exclusively) before any game, so the second takes
    the next."""
    run = tiny_run_folder(tmp_path)
    ckpt = run / "checkpoints" / "iter-000001"
    first = eval_script.claim_out_path("alfworld", "model", "test", ckpt)
    second = eval_script.claim_out_path("alfworld", "model", "test", ckpt)
    assert first != second and checkpoint.claim_of(first).is_file() and checkpoint.claim_of(second).is_file()
    assert second.name == "evalpy_alfworld_test_iter-000001-2.json"


def test_an_evaluation_that_fails_gives_its_claimed_name_back(tmp_path, monkeypatch):
    run = tiny_run_folder(tmp_path)

    def broken(*args, **kw):
        raise UserError("the policy would not load")

    monkeypatch.setattr(eval_script, "load_model_policy", broken)
    with pytest.raises(UserError, match="would not load"):
        eval_script.main(["--policy", "model", "--checkpoint", str(run), "--num-games", "1"])
    assert not list(run.glob("evalpy_*.json"))


def test_eval_refuses_an_out_named_as_a_runs_own_evaluation(tmp_path):
    """`eval.py --out RUN/eval_..._iter-000004.json` on a run at iteration 2 was accepted, and compare then
    took iteration 2's checkpoint for the final one."""
    run = tiny_run_folder(tmp_path)
    with pytest.raises(UserError, match="name of a run's own evaluation"):
        eval_script.main(["--policy", "model", "--checkpoint", str(run),
                          "--out", str(run / "eval_alfworld_test_iter-000004.json")])


@pytest.mark.slow
def test_eval_never_replaces_the_run_s_own_evaluation(tmp_path):
    """eval.py --checkpoint RUN after the run's in-loop evaluation of the same iteration leaves that
    record byte-identical and writes its own beside it; a second eval.py writes a third file; --out
    aimed at the run's record is refused. At b60459e it replaced the record without a word."""
    run = tiny_run_folder(tmp_path, iterations=1, eval_every=1, eval_games=2, env="webshop")
    record = run / "eval_webshop_test_iter-000001.json"
    before = record.read_bytes()
    for _ in range(2):
        done = _cli("eval.py", "--policy", "model", "--checkpoint", str(run), "--num-games", "1", "--max-steps", "1")
        assert done.returncode == 0, done.stderr[-2000:]
    assert record.read_bytes() == before
    assert (run / "evalpy_webshop_test_iter-000001.json").is_file() and (run / "evalpy_webshop_test_iter-000001-2.json").is_file()
    done = _cli("eval.py", "--policy", "model", "--checkpoint", str(run), "--num-games", "1", "--out", str(record))
    assert done.returncode == 2 and "name of a run's own evaluation" in done.stderr and record.read_bytes() == before


# ----------------------------------------------------------------------------- tools.compare's and tools.plots' reading
def test_compare_takes_a_runs_own_evaluation_only_where_it_measured_the_same(tmp_path):
    """compare took a run's in-loop record as its held-out result whatever games it played (2 against the
    start's 17): only the limits were matched."""
    from tools import compare

    args = compare.CompareArgs(eval_split="valid_seen", eval_max_steps=4, eval_new_tokens=8)
    config = {"split": "valid_seen", "iteration": 3, "max_steps": 4, "max_new_tokens": 8}
    all_games = {f"g{k}": {"won": False, "steps": 4} for k in range(5)}
    record = {"success": 0.0, "games": dict(list(all_games.items())[:2]), "config": config}
    path = tmp_path / "eval_alfworld_valid_seen_iter-000003.json"
    path.write_text(json.dumps(record))
    assert compare.in_loop_evaluation(tmp_path, "valid_seen", 3, args, set(all_games)) is None  # 2 of 5 games
    path.write_text(json.dumps({**record, "games": all_games}))
    assert compare.in_loop_evaluation(tmp_path, "valid_seen", 3, args, set(all_games)) == path
    path.write_text(json.dumps({**record, "games": all_games, "config": {**config, "iteration": 2}}))
    assert compare.in_loop_evaluation(tmp_path, "valid_seen", 3, args, set(all_games)) is None  # another checkpoint


@pytest.mark.parametrize("wins", [[0, 0], [1], "x", [2, 1], [True, 1]])
def test_compare_reads_damaged_task_wins_in_one_line(tmp_path, wins):
    from tools import compare

    line = {"iteration": 1, "success": 0.5, "task_wins": {"t": wins}}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(line) + "\n")
    with pytest.raises(UserError, match="task_wins"):
        compare.read_metrics(tmp_path)


@pytest.mark.parametrize("damage, needle", [
    (lambda run: (run / "eval_alfworld_valid_seen_iter-000004.json").write_text('{"success": 0.5, "ga'),
     "is not valid JSON"),
    (lambda run: (run / "eval_alfworld_valid_seen_iter-000004.json").write_text('{"games": {}}'),
     "'success' should be a number"),
    (lambda run: (run / "eval_alfworld_valid_seen_iter-000004.json").write_text("[1, 2]"),
     "should hold a JSON object"),
    (lambda run: (run / "config.json").write_text('{"env": "alf'), "is not valid JSON"),
    (lambda run: (run / "eval_alfworld_valid_seen_iter-best.json").write_text('{"success": 1.0}'), None),
])
def test_compare_reads_damaged_records_in_one_line(tmp_path, damage, needle):
    """tools.compare --gather-only over a run whose records are damaged: a truncated evaluation or
    config.json, a record without `success`, one that is a list: one line naming the file (at b60459e
    a JSONDecodeError, KeyError or TypeError traceback); a copy under another name
    (eval_..._iter-best.json, a ValueError at b60459e) is not one of the run's records, and is passed by."""
    from tools import compare

    record = {"success": 0.5, "games": {"valid_seen/g0": {"won": True, "steps": 3}},
              "config": {"env": "alfworld", "split": "valid_seen", "iteration": 4, "checkpoint": None,
                         "max_steps": 6, "max_new_tokens": 64}}
    (tmp_path / "eval_start_valid_seen.json").write_text(json.dumps(record))
    run = tmp_path / "sharpo-seed0"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"env": "alfworld", "model": "smollm2", "data_dir": None}))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"iteration": i, "success": 0.5, "seconds/rollout": 1.0})
                                               + "\n" for i in (1, 2, 3, 4)))
    (run / "eval_alfworld_valid_seen_iter-000004.json").write_text(json.dumps(record))
    damage(run)
    argv = ["--algos", "sharpo", "--seeds", "0", "--out", str(tmp_path), "--gather-only", "--eval-split",
            "valid_seen", "--eval-max-steps", "6", "--", "--env", "alfworld", "--iterations", "4"]
    if needle is None:
        assert compare.main(argv)["sharpo"]["held_out_after"] is not None
    else:
        with pytest.raises(UserError, match=needle):
            compare.main(argv)


def test_logs_and_tools_name_a_line_they_cannot_read(tmp_path, capsys):
    """tools.plots on a samples line whose segments is a string (an AttributeError traceback): skipped and
    named; tools.compare's gather on a metrics line without success (a KeyError): one line naming it; tools.credit
    --env webshop took ALFWorld's split as its default and refused it after loading the model: now its own."""
    from tools import compare, credit, plots

    run = tiny_run_folder(tmp_path)
    samples = run / "samples.jsonl"
    records = [json.loads(line) for line in samples.read_text().splitlines()]
    records[0]["segments"] = "oops"
    samples.write_text("".join(json.dumps(r) + "\n" for r in records))
    plots.make_plots(run)
    assert f"{samples} line 1 is not a train.py log record: skipped" in capsys.readouterr().err
    (run / "metrics.jsonl").write_text(json.dumps({"iteration": 1}) + "\n")
    with pytest.raises(UserError, match="metrics.jsonl line 1 is not a train.py metrics line"):
        compare.read_metrics(run)
    with pytest.raises(UserError) as err:
        credit.main(["--env", "webshop", "--seeds", "x"])
    assert "--seeds" in str(err.value) and "--split" not in str(err.value)
    with pytest.raises(UserError, match="--split for webshop must be one of train, test"):
        credit.main(["--env", "webshop", "--split", "valid_seen"])
