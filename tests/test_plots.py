"""tools/plots.py turns a run folder into the segment view (HTML, PNG) and the learning curves."""
import html as html_lib
import json

import pytest
from PIL import Image

import train
from infra.cli import UserError
from infra.curves import draw_curves
from infra.models import load_policy
from stub_env import StubEnv
from tools.plots import make_plots, multiplier_color, segments_html


def test_plots_from_a_run_folder(tmp_path):
    """A two-iteration run (tiny model, scripted env) gives four files: the HTML names every
    saved segment's multiplier, and the PNGs are real images."""
    args = train.parse_args(["--model=tiny", "--preset=none", "--iterations=2", "--groups=2", "--group-size=2",
                             "--max-steps=2", "--max-new-tokens=6", "--lora-r=4", "--eval-every=0",
                             "--hindsight=expert", f"--output-dir={tmp_path}/run"])
    model, tok = load_policy("tiny", lora_r=4, lora_alpha=8)
    train.train(args, train.Trainer(args, model=model, tokenizer=tok, env=StubEnv(2)))
    files = make_plots(tmp_path / "run")
    html = files["segments.html"].read_text()
    assert html.count("multiplier m =") >= 2 and "title='delta" in html
    for name in ("segments.png", "curves.png", "per_type.png"):
        with Image.open(files[name]) as im:
            assert im.size[0] > 300 and im.size[1] > 100


def test_multiplier_colors():
    """White at m = 1, red below, blue above, saturating at the scale."""
    assert multiplier_color(1.0) == (1.0, 1.0, 1.0)
    r, g, b = multiplier_color(0.8, 0.2)
    assert r == 1.0 and g < 0.5 and b < 0.5
    r, g, b = multiplier_color(1.5, 0.2)
    assert b == 1.0 and r < 0.5 and multiplier_color(1.5, 0.2) == pytest.approx(multiplier_color(1.2, 0.2))


def test_missing_run_folder_says_what_to_pass(tmp_path):
    with pytest.raises(UserError, match="run folder"):
        make_plots(tmp_path)


def test_hostile_logs_are_drawn_as_text(tmp_path):
    """A null where a number was non-finite, a `$...$` query (matplotlib math syntax), markup in
    every text field and a line that is not UTF-8: all four files are written, the markup is
    escaped wherever it appears, and the null shows as n/a."""
    run = tmp_path / "run"
    run.mkdir()
    sample = {"iteration": "<b>1</b>", "task_id": "<i>t</i>", "task_type": "<x>", "won": "<script>", "reward": None,
              "advantage": 1.0, "hindsight": "<h>", "segments": [
                  {"observation": "o", "response": "r", "action": "search[$x_y_z$]", "reward": None, "gap": None,
                   "multiplier": None, "tokens": ["<t>", "$a_b$"], "token_delta": [None, 0.1]}]}
    (run / "samples.jsonl").write_bytes(json.dumps(sample).encode() + b"\n\xff\xfe not utf-8\n")
    metrics = {"iteration": 1, "success": None, "mean_reward": 0.0, "invalid_rate": 0.0, "mult_std": None,
               "success/$a_b$": 0.5}
    (run / "metrics.jsonl").write_text(json.dumps(metrics) + "\n")
    files = make_plots(run)
    html = files["segments.html"].read_text()
    for raw in ("<b>1</b>", "<i>t</i>", "<x>", "<script>", "<h>", "<t>"):
        assert raw not in html and html_lib.escape(raw) in html
    assert "multiplier m = n/a" in html
    for name in ("segments.png", "curves.png", "per_type.png"):
        assert files[name].stat().st_size > 1000


def test_plots_escape_task_types():
    sample = {"iteration": 1, "task_id": "t", "task_type": "<script>x</script>", "won": False, "reward": 0.0,
              "advantage": 0.0, "hindsight": None, "segments": []}
    html = segments_html([sample], 0.2)
    assert "<script>x" not in html and "&lt;script&gt;" in html


def test_a_broken_matplotlib_costs_a_complete_run_nothing(tmp_path, monkeypatch, capsys):
    """A matplotlib failure other than OSError (ImportError, RuntimeError) ended a complete run with a
    traceback and exit 1, so tools.compare reported it FAILED."""
    from infra import curves

    (tmp_path / "metrics.jsonl").write_text(json.dumps({"iteration": 1, "success": 0.5}) + "\n")

    def broken(*args):
        raise RuntimeError("no backend")

    monkeypatch.setattr(curves, "curves_png", broken)
    assert draw_curves(tmp_path) is None and "RuntimeError: no backend" in capsys.readouterr().err


def test_plots_of_a_log_with_an_iteration_beyond_float_draw_the_others(tmp_path):
    from tools import plots

    lines = [{"iteration": 1, "success": 0.5}, {"iteration": 10**400, "success": 0.7}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    out = plots.make_plots(tmp_path)
    assert out["curves.png"].stat().st_size > 0
