"""plots.py turns a run folder into the segment view (HTML, PNG) and the learning curves."""
import pytest

from cli import UserError
from PIL import Image

import train
from plots import make_plots, multiplier_color
from rollout import load_policy
from stub_env import StubEnv


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
