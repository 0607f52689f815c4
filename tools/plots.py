"""Plots: see credit assignment in a run folder, segment by segment, and its learning curves.

From a train.py run folder (metrics.jsonl, samples.jsonl) this writes:
  segments.html   every saved sample trajectory, each segment (one response) colored by its
                  SHARPO multiplier m (red < 1: more blame / less credit than GRPO gives,
                  blue > 1: more), with its gap g and multiplier beside it and each token's
                  teacher-student gap delta_t on hover
  segments.png    the same for the last iteration's sample trajectories (with hindsight first), as a picture
                  (full color at the largest deviation shown, so that small ones stay visible)
  curves.png      success (and over the last 5 iterations), mean reward, invalid-action rate and
                  multiplier spread per whole iteration
  per_type.png    success per task type (training rollouts, and evaluation when it ran)

Run: python -m tools.plots runs/alfworld-sharpo-cpu-demo
"""
from __future__ import annotations

import errors  # first: a Ctrl-C or kill while the imports below load is one line

errors.quiet_start(__name__)
# isort: split

import html
import json
import sys
from pathlib import Path

from errors import file_system_problem
from flags import MethodArgs
from infra.cli import UserError, run, with_current_names
from infra.curves import curves_png, num, read_jsonl


def fmt(value, spec: str) -> str:
    """A logged number formatted with `spec`, or n/a when it is not a finite number."""
    x = num(value)
    return format(x, spec) if x == x and abs(x) != float("inf") else "n/a"


def multiplier_color(m: float, eps: float = 0.2) -> tuple[float, float, float]:
    """RGB for a multiplier in [1 - eps, 1 + eps]: red below 1, white at 1, blue above (white when not a number)."""
    m = num(m)
    if m != m:
        return (1.0, 1.0, 1.0)
    x = max(-1.0, min(1.0, (m - 1.0) / eps))  # -1 at the lower bound, +1 at the upper
    if x < 0:
        return (1.0, 1.0 + 0.65 * x, 1.0 + 0.65 * x)
    return (1.0 - 0.65 * x, 1.0 - 0.45 * x, 1.0)


def short_task(task_id) -> str:
    """ALFWorld ids are split/task-folder/trial: show the task folder; other ids as they are."""
    parts = str(task_id).split("/")
    return parts[1] if len(parts) == 3 else task_id


def _hex(rgb) -> str:
    return "#" + "".join(f"{int(255 * c):02x}" for c in rgb)


def segments_html(samples: list[dict], eps: float) -> str:
    """An HTML page: one block per sample trajectory, one colored line per segment."""
    parts = ["<html><head><meta charset='utf-8'><title>SHARPO segments</title><style>",
             "body{font-family:sans-serif;max-width:1100px;margin:auto} .seg{padding:6px;margin:3px 0;border:1px solid #ccc}",
             ".meta{font-size:12px;color:#333} .tok:hover{outline:1px solid #000} pre{white-space:pre-wrap;margin:0}",
             "</style></head><body><h2>Segments colored by the SHARPO multiplier</h2>",
             f"<p>red: m &lt; 1, white: m = 1, blue: m &gt; 1 (bounds {1 - eps:.2f}..{1 + eps:.2f}). "
             "Hover a token for its teacher-student gap delta_t.</p>"]
    esc = lambda x: html.escape(str(x))  # noqa: E731  every logged field is text to escape
    for s in samples:
        parts.append(f"<h3>iteration {esc(s.get('iteration'))}: {esc(s.get('task_id'))}</h3>")
        parts.append(f"<p class='meta'>type {esc(s.get('task_type'))}, won {esc(s.get('won'))}, reward "
                     f"{fmt(s.get('reward'), '+.2f')}, advantage A = {fmt(s.get('advantage'), '+.3f')}</p>")
        if s.get("hindsight"):
            parts.append(f"<pre class='meta'>hindsight: {esc(s['hindsight'])}</pre>")
        for k, seg in enumerate(s.get("segments") or [], start=1):
            color = _hex(multiplier_color(seg.get("multiplier"), eps))
            tokens = "".join(f"<span class='tok' title='delta {fmt(d, '+.3f')}'>{esc(t)}</span>"
                             for t, d in zip(seg.get("tokens") or [], seg.get("token_delta") or []))
            parts.append(f"<div class='seg' style='background:{color}'><div class='meta'>step {k}: "
                         f"gap g = {fmt(seg.get('gap'), '+.4f')}, multiplier m = {fmt(seg.get('multiplier'), '.4f')}, "
                         f"action {esc(seg.get('action'))}, step reward {fmt(seg.get('reward'), '+.1f')}</div>"
                         f"<pre>{tokens}</pre></div>")
    parts.append("</body></html>")
    return "\n".join(parts)


def segments_png(samples: list[dict], eps: float, path: Path, max_trajectories: int = 2) -> None:
    """A picture of the last iteration's sample trajectories (those with hindsight first): one line per segment,
    colored by its multiplier, the iteration in the title line."""
    # deferred: matplotlib only when drawing (and its backend is set first)
    import matplotlib

    matplotlib.use("Agg")
    # deferred: matplotlib only when drawing (and its backend is set first)
    import matplotlib.pyplot as plt

    last = max((s.get("iteration") for s in samples if isinstance(s.get("iteration"), int)), default=None)
    pool = [s for s in samples if s.get("iteration") == last] or samples
    chosen = [s for s in pool if s.get("hindsight")][:max_trajectories] or pool[:max_trajectories]
    lines = sum(len(s.get("segments") or []) + 1 for s in chosen)
    # color scale: the largest deviation shown (at least 0.01), so small multipliers stay visible
    scale = max([abs(num(seg.get("multiplier")) - 1) for s in chosen for seg in s.get("segments") or []
                 if num(seg.get("multiplier")) == num(seg.get("multiplier"))] + [0.01])
    fig, ax = plt.subplots(figsize=(12, 0.45 * lines + 0.8))
    ax.set_axis_off()
    y = lines
    for s in chosen:
        ax.text(0, y, f"iteration {s.get('iteration')}  {short_task(s.get('task_id'))[:60]}  won={s.get('won')}  "
                f"R={fmt(s.get('reward'), '+.1f')}  "
                f"A={fmt(s.get('advantage'), '+.2f')}", fontsize=9, weight="bold", va="center",
                parse_math=False)  # logged text is shown as it is: "$x$" in a query is no formula
        y -= 1
        for k, seg in enumerate(s.get("segments") or [], start=1):
            color = multiplier_color(seg.get("multiplier"), scale)
            ax.text(0.01, y, f"step {k}  m={fmt(seg.get('multiplier'), '.3f')}  g={fmt(seg.get('gap'), '+.3f')}  | "
                    f"{seg.get('action') or '(invalid)'}", fontsize=9, va="center", family="monospace", parse_math=False,
                    bbox=dict(boxstyle="round,pad=0.3", facecolor=color, edgecolor="#888"))
            y -= 1
    ax.set_xlim(0, 1)
    ax.set_ylim(0, lines + 1)
    ax.set_title(f"segments colored by the SHARPO multiplier m: red < 1 < blue, full color at 1 ± {scale:.3f} "
                 f"(the bounds are 1 ± {eps})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def per_type_png(metrics: list[dict], path: Path) -> None:
    """Success per task type over the whole run (rollouts) and at the last evaluation."""
    # deferred: matplotlib only when drawing (and its backend is set first)
    import matplotlib

    matplotlib.use("Agg")
    # deferred: matplotlib only when drawing (and its backend is set first)
    import matplotlib.pyplot as plt

    types = sorted({k.rsplit("success/", 1)[1] for m in metrics for k in m if k.startswith(("success/", "eval/success/"))})
    roll = [sum(num(m[f"success/{t}"]) for m in metrics if f"success/{t}" in m) /
            max(1, sum(f"success/{t}" in m for m in metrics)) for t in types]
    evals = [m for m in metrics if "eval/success" in m]
    fig, ax = plt.subplots(figsize=(8, 3.2))
    xs = range(len(types))
    ax.bar([x - 0.2 for x in xs], roll, width=0.4, label="rollouts (mean over iterations)")
    if evals:
        last = evals[-1]
        ax.bar([x + 0.2 for x in xs], [num(last.get(f"eval/success/{t}", 0)) for t in types], width=0.4,
               label="last evaluation")
    for container in ax.containers:
        ax.bar_label(container, fmt="%.2f", fontsize=8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([t.replace("_", " ") for t in types], rotation=20, ha="right", fontsize=8, parse_math=False)
    ax.set_ylim(0, 1)
    ax.set_ylabel("success")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def make_plots(run_dir: str | Path) -> dict[str, Path]:
    """Write the four files into the run folder (the curves alone where it kept no samples); returns their paths."""
    run = Path(run_dir)
    metrics = read_jsonl(run / "metrics.jsonl")
    samples = read_jsonl(run / "samples.jsonl") if (run / "samples.jsonl").exists() else []  # --samples-per-iter 0
    eps = MethodArgs.eps_m  # train.py's default, where the run's config.json does not say
    if (run / "config.json").exists():
        try:
            config = json.loads((run / "config.json").read_text(encoding="utf-8"))
            eps = num(with_current_names(config).get("eps_m", MethodArgs.eps_m))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, AttributeError):
            raise UserError(f"{run / 'config.json'} is not a JSON object of train.py flags") from None
        if not 0 < eps < 1:
            eps = MethodArgs.eps_m
    names = ("segments.html", "segments.png") if samples else ()
    if not samples:
        print(f"{run} holds no sample trajectories (a run with --samples-per-iter 0 keeps none): the segment "
              "pictures are left out", file=sys.stderr)
    out = {name: run / name for name in (*names, "curves.png", "per_type.png")}
    try:
        if samples:
            out["segments.html"].write_text(segments_html(samples, eps), encoding="utf-8")
            segments_png(samples, eps, out["segments.png"])
        curves_png(metrics, out["curves.png"])
        per_type_png(metrics, out["per_type.png"])
    except OSError as err:
        raise UserError(f"cannot write the pictures into {run} ({file_system_problem(err, run) or err.strerror or err}): "
                        "copy the run folder somewhere writable and draw there") from None
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv in (["-h"], ["--help"]):
        print(__doc__)
        return
    if len(argv) != 1 or argv[0].startswith("-"):
        raise UserError("usage: python -m tools.plots RUN_DIR")
    for p in make_plots(argv[0]).values():
        print(f"wrote {p}")


if __name__ == "__main__":
    run(main)
