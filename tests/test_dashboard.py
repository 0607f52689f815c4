"""--report-to: the metrics.jsonl lines, live in a tracker (infra/dashboard.py)."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import train
from infra import dashboard
from infra.cli import UserError
from tiny_runs import flags, tiny_args, tiny_train

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parent.parent


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


def _wandb_history(run_file) -> list[dict]:
    """The history records of an offline wandb run file: a LevelDB-style log (7-byte file header, 32 KiB blocks
    of chunks, each with a 7-byte header: crc, length, kind 1 full / 2 first / 3 middle / 4 last) of protobuf
    Records."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, pos, block, buf, out = run_file.read_bytes(), 7, 32768, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        buf, pos = buf + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(buf)
            if record.WhichOneof("record_type") == "history":
                out.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.history.item})
            buf = b""
    return out


def _tiny_run_with(tracker: str, out, env: dict) -> list[dict]:
    """A 2-iteration tiny run with --report-to `tracker`, in a process of its own (a tracker reads its settings
    from the environment when it is imported); returns the run's metrics lines."""
    code = ("import sys; sys.path[:0] = ['tests', '.']; from tiny_runs import tiny_args, tiny_train; "
            f"tiny_train(tiny_args({str(out)!r}, iterations=2, report_to={tracker!r}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_wandb_offline_gets_every_metric_of_every_iteration(tmp_path):
    """--report-to wandb with WANDB_MODE=offline (local files, synced later): the run file holds each line."""
    pytest.importorskip("wandb")  # an optional extra: CI installs it
    lines = _tiny_run_with("wandb", tmp_path / "run", {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path),
                                                       "WANDB_SILENT": "true"})
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    history = _wandb_history(run_file)
    assert [h["_step"] for h in history] == [m["iteration"] for m in lines]
    for h, m in zip(history, lines):
        for key in ("success", "mean_reward", "update/loss", "seconds/rollout"):
            assert h[key] == pytest.approx(m[key], rel=1e-6, abs=1e-6), key


def test_trackio_gets_every_metric_of_every_iteration(tmp_path):
    """--report-to trackio: its local SQLite store holds each line, at its iteration."""
    pytest.importorskip("trackio")  # an optional extra: CI installs it
    import sqlite3

    lines = _tiny_run_with("trackio", tmp_path / "run", {"TRACKIO_DIR": str(tmp_path / "trackio")})
    db = sqlite3.connect(tmp_path / "trackio" / "sharpo.db")
    logged = [(step, json.loads(metrics)) for step, metrics in db.execute("select step, metrics from metrics order by id")]
    assert [step for step, _ in logged] == [m["iteration"] for m in lines]
    for (_, got), m in zip(logged, lines):
        for key in ("success", "mean_reward", "update/loss", "seconds/rollout"):
            assert got[key] == pytest.approx(m[key], rel=1e-6, abs=1e-6), key
