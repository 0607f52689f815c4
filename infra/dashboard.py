"""Live dashboard: `--report-to tensorboard | trackio | wandb` sends each metrics.jsonl line to a
tracker, through accelerate's tracker API, at step = the iteration. The trackers are optional
extras (the base install stays offline and small); asking for one that is not installed is a
one-line error saying what to install.

  tensorboard  event files in RUN_DIR/tensorboard/<run name>: `tensorboard --logdir runs`
  trackio      a local dashboard (`trackio show`), project "sharpo", run = the run folder's name
  wandb        Weights & Biases, project "sharpo", run = the run folder's name (needs a login)
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from accelerate import PartialState
from accelerate.tracking import TensorBoardTracker, TrackioTracker, WandBTracker

PACKAGES = {"tensorboard": "tensorboard", "trackio": "trackio", "wandb": "wandb"}  # what to pip install


def missing_package(report_to: str) -> str | None:
    """The one-line problem when --report-to names a tracker that is not installed, else None."""
    package = PACKAGES.get(report_to)
    if package and importlib.util.find_spec(package) is None:
        return f"--report-to {report_to} needs the {package} package, which is not installed: pip install {package}"
    return None


def open_tracker(report_to: str, run_dir: str | Path, config: dict):
    """The started tracker for --report-to, with the run's flags stored, or None for "none"."""
    if report_to == "none":
        return None
    PartialState()  # accelerate's trackers log through its logging, which needs its state (a no-op when it exists)
    name = Path(run_dir).name
    if report_to == "tensorboard":
        tracker = TensorBoardTracker(name, Path(run_dir) / "tensorboard")
    elif report_to == "trackio":
        tracker = TrackioTracker("sharpo", name=name)
    else:
        tracker = WandBTracker("sharpo", name=name)
    tracker.start()
    tracker.store_init_configuration({k: v if isinstance(v, (bool, int, float, str)) else str(v)
                                      for k, v in config.items()})
    return tracker


def log(tracker, line: dict) -> None:
    """One metrics line (its numbers; text such as a run's path is left out), at its iteration."""
    if tracker is None:
        return
    numbers = {k: float(v) for k, v in line.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "iteration"}
    tracker.log(numbers, step=int(line["iteration"]))
    if hasattr(tracker.tracker, "flush"):  # tensorboard: on disk now, so a dashboard shows it live
        tracker.tracker.flush()


def close(tracker) -> None:
    if tracker is not None:
        tracker.finish()
