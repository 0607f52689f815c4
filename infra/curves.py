"""The run's learning curves as one picture, curves.png: what train.py draws when a run completes
(report.py's closing summary) and tools/plots.py draws with its other pictures."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from errors import UserError


def num(value) -> float:
    """A logged number as a float: null (how the logs write a non-finite number), junk or an integer
    beyond float's range (10**400 in an edited log) becomes nan."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return float("nan")
    try:
        return float(value)
    except OverflowError:
        return float("nan")


def is_iteration(value) -> bool:
    """An iteration number a picture can place: a non-negative integer below 2**53 (a float holds it exactly)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**53


def read_jsonl(path: Path) -> list[dict]:
    """The log's records; a line that is none (half-written by a kill, edited, a sample whose segments are
    not a list of segments) is skipped and named on stderr."""
    if not path.exists():
        raise UserError(f"{path} not found: pass a train.py run folder (it holds metrics.jsonl and samples.jsonl)")
    records = []
    for n, line in enumerate(path.read_bytes().splitlines(), 1):
        try:
            record = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            record = None
        segments = record.get("segments", []) if isinstance(record, dict) else None
        if isinstance(segments, list) and all(isinstance(s, dict) for s in segments):
            records.append(record)
        else:
            print(f"note: {path} line {n} is not a train.py log record: skipped", file=sys.stderr)
    return records


def curves_png(metrics: list[dict], path: Path) -> None:
    """Success, mean reward, invalid rate and multiplier spread per iteration."""
    # deferred: matplotlib only when drawing (and its backend is set first)
    import matplotlib

    matplotlib.use("Agg")
    # deferred: matplotlib only when drawing (and its backend is set first)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    metrics = [m for m in metrics if is_iteration(m.get("iteration"))]
    its = [m["iteration"] for m in metrics]
    panels = [("success", "success (rollouts)"), ("mean_reward", "mean reward R"), ("invalid_rate", "invalid-action rate"),
              ("mult_std", "multiplier std over segments")]
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.2))
    for ax, (key, title) in zip(axes, panels):
        ax.plot(its, [num(m.get(key)) for m in metrics], marker="o")
        if key == "success" and any("success_recent" in m for m in metrics):
            ax.plot(its, [num(m.get("success_recent")) for m in metrics], label="last 5 iterations")
        if key == "success" and any("eval/success" in m for m in metrics):
            ev = [(m["iteration"], num(m["eval/success"])) for m in metrics if "eval/success" in m]
            ax.plot(*zip(*ev), marker="s", label="eval (greedy)")
        if key == "success" and len(ax.lines) > 1:
            ax.legend(fontsize=8)
        if key in ("success", "invalid_rate"):
            ax.set_ylim(-0.03, 1.03)  # shares
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("iteration")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # whole iterations
        if its:
            ax.set_xlim(min(its) - 0.5, max(its) + 0.5)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_curves(out: Path) -> Path | None:
    """The run folder's curves.png from its metrics.jsonl, or None (and why, on stderr) where it cannot be
    drawn: a picture not drawn costs the run nothing."""
    try:  # a line edited or cut short is named on stderr: the picture shows the others
        curves_png(read_jsonl(out / "metrics.jsonl"), out / "curves.png")
    except Exception as err:  # a full disk, a broken matplotlib (ImportError, RuntimeError): the run stays complete
        print(f"warning: the curves were not drawn ({type(err).__name__}: {err}); python -m tools.plots {out} "
              "draws them", file=sys.stderr)
        return None
    return out / "curves.png"
