"""--dtype auto on a CPU (infra/precision.py): the precision that is faster here, measured once and kept,
float32 where the two are within the timing's noise; a resumed run keeps the precision it started with.
No test runs the measurement on a real model: the timings are faked, or the tiny MLP shape is timed."""
import json

import pytest

import train
from infra import config, precision
from tiny_runs import tiny_run_folder


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SHARPO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(precision, "AUTO_CHOSEN", {})


def fake(bf16_s, fp32_s):
    """A timer that says bf16 takes bf16_s and float32 fp32_s a repeat (a little jitter), counting calls."""
    calls = []

    def measure(bf16):
        calls.append(bf16)
        base = bf16_s if bf16 else fp32_s
        return [base, base * 1.01, base * 0.99]
    return measure, calls


@pytest.mark.parametrize("bf16_s, fp32_s, expected", [(0.81, 1.0, "bf16"), (1.5, 1.0, "fp32"), (0.98, 1.0, "fp32")])
def test_the_faster_precision_is_chosen_and_a_tie_keeps_float32(bf16_s, fp32_s, expected):
    """bf16 0.81x float32's time: bf16; 1.5x: float32; within 5% (a tie, for the timing): float32."""
    measure, _ = fake(bf16_s, fp32_s)
    record = precision.measured_cpu_dtype("smollm2", measure)
    assert record["dtype"] == expected and record["ratio"] == pytest.approx(bf16_s / fp32_s, rel=0.02)


def test_noisy_timings_keep_float32():
    """A 20% faster median inside a 40% spread of the repeats is noise: float32."""
    assert precision.choose_dtype([0.6, 0.8, 1.0], [1.0, 1.0, 1.0])[0] == "fp32"
    assert precision.choose_dtype([0.79, 0.8, 0.81], [1.0, 1.0, 1.0])[0] == "bf16"


def test_the_choice_is_kept_and_a_damaged_cache_is_rewritten():
    """Measured once per CPU, threads, torch and model; read back after; a damaged file is ignored,
    measured anew and rewritten; another model is measured apart."""
    measure, calls = fake(0.8, 1.0)
    first = precision.measured_cpu_dtype("smollm2", measure)
    n = len(calls)
    again = precision.measured_cpu_dtype("smollm2", measure)
    assert len(calls) == n and again["cached"] and again["dtype"] == first["dtype"] == "bf16"
    path = precision.cache_file()
    path.write_text("{not json")
    redone = precision.measured_cpu_dtype("smollm2", fake(1.5, 1.0)[0])
    assert redone["dtype"] == "fp32" and not redone["cached"]
    assert json.loads(path.read_text())[precision.machine_key("smollm2")]["dtype"] == "fp32"
    precision.measured_cpu_dtype("other-model", fake(0.8, 1.0)[0])
    assert len(json.loads(path.read_text())) == 2


def test_the_real_timer_runs_in_well_under_a_second_at_a_small_shape():
    """mlp_seconds times what it says at a small shape (the real model's is the same code, ~0.6 s)."""
    out = precision.mlp_seconds(64, 128, bf16=True, tokens=64, repeats=2)
    assert len(out) == 2 and all(0 < s < 1 for s in out)


def test_the_run_says_what_auto_chose_and_a_resumed_run_keeps_its_precision(tmp_path, monkeypatch):
    """The demo's first lines say what --dtype auto took and why; a run started in bf16 resumes in bf16
    even where the measurement now says float32 (config.json holds the precision)."""
    monkeypatch.setattr(precision, "measured_cpu_dtype", lambda model, measure=None: {
        "dtype": "bf16", "ratio": 0.81, "cached": False, "measured": "now", "bf16_s": 0.81, "fp32_s": 1.0})
    args = train.parse_args(["--preset", "cpu-demo", "--output-dir", str(tmp_path / "demo")])
    assert args.dtype == "bf16"
    assert "--dtype auto: bf16: bf16 takes 0.81x float32's time on this CPU" in config.describe(args)
    run = tiny_run_folder(tmp_path, dtype="bf16")
    monkeypatch.setattr(precision, "measured_cpu_dtype", lambda model, measure=None: {
        "dtype": "fp32", "ratio": 1.3, "cached": True, "measured": "now", "bf16_s": 1.3, "fp32_s": 1.0})
    assert train.parse_args(["--resume", str(run), "--iterations", "2"]).dtype == "bf16"
