"""tools/beside_trl.py: our side plays the work it claims (one group, every completion exactly its length,
one optimizer step), and a missing TRL or a bad flag is one line that says what to do."""
import importlib.util

import pytest
import torch

from infra.cli import UserError
from tools import beside_trl

torch.set_num_threads(1)

TINY = ["--model", "tiny", "--completions", "4", "--micro-batch-rows", "2", "--new-tokens", "5", "--obs-words", "10"]


def test_our_side_plays_one_group_of_completions_of_the_set_length(tmp_path):
    out = beside_trl.main(["--side", "ours", *TINY, "--warmup", "1", "--iterations", "2",
                           "--out", str(tmp_path / "ours.json")])
    assert len(out["seconds"]) == 2 and all(s > 0 for s in out["seconds"])  # the warm-up not among them
    assert out["rows"] == 4  # 4 completions of one prompt, one step each
    assert out["response_lengths"] == [5]  # every one exactly --new-tokens
    assert len(out["prompt_ids"]) > 10 and (tmp_path / "ours.json").exists()


def test_our_side_takes_one_optimizer_step_an_iteration():
    trainer = beside_trl.our_trainer(beside_trl.BesideTrlArgs(model="tiny", completions=4, micro_batch_rows=2,
                                                              new_tokens=5, obs_words=10, iterations=1, warmup=0))
    steps = []
    step = trainer.optimizer.step
    trainer.optimizer.step = lambda *a, **k: (steps.append(1), step(*a, **k))[1]
    trainer.iteration()
    assert len(steps) == 1  # as TRL's one step per generation


@pytest.mark.parametrize("side", ["trl", "both"])
def test_a_missing_trl_says_how_to_have_it(monkeypatch, side):
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trl" else find(name, *a))
    with pytest.raises(UserError, match="pip install trl"):
        beside_trl.main(["--side", side, *TINY])


def test_completions_that_do_not_fill_micro_batches_are_refused():
    with pytest.raises(UserError, match="multiple of --micro-batch-rows"):
        beside_trl.main(["--side", "ours", *TINY, "--completions", "5"])
