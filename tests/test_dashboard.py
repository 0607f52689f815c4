"""--report-to: the metrics.jsonl lines, live in a tracker (infra/dashboard.py)."""
import importlib.util
import json

import pytest
import torch

import train
from infra import dashboard
from infra.cli import UserError
from tiny_runs import flags, tiny_args, tiny_train

torch.set_num_threads(1)


def test_tensorboard_gets_every_metric_of_every_iteration(tmp_path):
    # tensorboard is an optional extra: CI installs it, elsewhere this test is reported as skipped
    EventAccumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator").EventAccumulator

    args = tiny_args(tmp_path / "run", iterations=2, report_to="tensorboard")
    tiny_train(args)
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    runs = list((tmp_path / "run" / "tensorboard").iterdir())
    assert len(runs) == 1
    events = EventAccumulator(str(runs[0]))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for key in ("success", "mean_reward", "update/loss", "seconds/rollout", "skipped/student"):
        assert key in tags, key
        logged = [(e.step, e.value) for e in events.Scalars(key)]
        assert logged == [(m["iteration"], pytest.approx(m[key], rel=1e-6, abs=1e-6)) for m in lines], key


def test_a_tracker_that_is_not_installed_is_a_one_line_error(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(UserError, match="--report-to wandb needs the wandb package.*pip install wandb"):
        train.parse_args(flags(model="tiny", preset="none", report_to="wandb", output_dir=str(tmp_path / "r")))
    assert dashboard.missing_package("none") is None
