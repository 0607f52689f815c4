"""--dtype auto on a CPU (infra/precision.py): bf16 where it is clearly faster, float32 where it is clearly
not, and float32 for one run, not kept, where the timings cannot tell; the decision is a pure function of
the timings (`decide`), the cache is validated where it is read, and a resumed run keeps the precision it
started with. No test times a real model: the timings are faked, or a tiny layer is timed."""
import json
import math
import multiprocessing as mp
import os
import threading

import pytest
import torch

import train
from flags.parse import describe
from infra import memory, precision
from tiny_runs import tiny_run_folder


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SHARPO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(precision, "AUTO_CHOSEN", {})
    torch.set_num_threads(1)


def jitter(base, n, spread=0.02):
    """n timings around base, within +-spread, deterministic."""
    return [base * (1 + spread * math.sin(1.7 * i + 0.3)) for i in range(n)]


def fake(bf16, fp32, slow=None):
    """A timer (once(bf16) -> seconds) from two lists, cycled; slow: {(bf16, call index): seconds}
    for a slow moment of the machine. Counts its calls, in order."""
    calls = []

    def once(is_bf16):
        own = [c for c in calls if c == is_bf16]
        calls.append(is_bf16)
        seq = bf16 if is_bf16 else fp32
        return (slow or {}).get((is_bf16, len(own)), seq[len(own) % len(seq)])
    return once, calls


# the rule, fed timings


def test_one_slow_outlier_does_not_veto_a_clear_2x_gap():
    """bf16 at half float32's time, one bf16 repeat 5x slow (a slow moment): bf16, decided. The old rule
    (float32 unless bf16 wins by more than the spread) chose float32 here, as it did on a 2.4x gap."""
    bf16, fp32 = jitter(0.5, 7) + [2.5], jitter(1.0, 8)
    verdict = precision.decide(bf16, fp32)
    assert verdict.dtype == "bf16" and verdict.settled and verdict.ratio == pytest.approx(0.5, rel=0.05)
    assert verdict.low <= verdict.ratio <= verdict.high < 1 - precision.MARGIN
    # the timings (0.030 s against 0.072 s), a spread of 0.6 from one slow repeat on each side
    assert precision.decide(jitter(0.030, 7) + [0.048], jitter(0.072, 7) + [0.115]).dtype == "bf16"


def test_timings_within_noise_are_float32_and_not_a_decision():
    """Medians 10% apart inside a 60% spread: float32 for now, not settled (so not kept)."""
    bf16 = [0.6, 1.0, 0.7, 1.1, 0.8, 0.9, 1.2, 0.75]
    fp32 = [0.9, 1.0, 0.8, 1.2, 0.7, 1.1, 0.95, 0.85]
    verdict = precision.decide(bf16, fp32)
    assert verdict.dtype == "fp32" and not verdict.settled and verdict.low < 1 - 2 * precision.MARGIN


@pytest.mark.parametrize("bf16_s, fp32_s, dtype, settled", [
    (0.81, 1.0, "bf16", True),   # 19% faster, tight: bf16
    (1.5, 1.0, "fp32", True),    # slower: float32, decided
    (0.98, 1.0, "fp32", True),   # a tie: the precise one, decided
    (0.93, 1.0, "fp32", False),  # 7% faster, +-2% noise: cannot tell 5% from 10%
])
def test_clear_differences_are_decided_and_a_tie_keeps_float32(bf16_s, fp32_s, dtype, settled):
    verdict = precision.decide(jitter(bf16_s, 9), jitter(fp32_s, 9))
    assert (verdict.dtype, verdict.settled) == (dtype, settled)


def test_too_few_timings_decide_nothing_and_the_interval_drops_the_outermost():
    """A 90% interval of a median needs 5 values; at 8, one outlier falls outside it."""
    assert precision.median_interval([1, 2, 3, 4]) is None
    assert precision.median_interval([5, 1, 3, 2, 4]) == (1, 5)
    assert precision.median_interval([1, 2, 3, 4, 5, 6, 7, 100]) == (2, 7)
    assert not precision.decide([0.5] * 4, [1.0] * 4).settled


# the measurement


def test_the_repeats_interleave_and_stop_once_the_answer_is_clear():
    """bf16 and float32 in turn, the order alternating; a clear answer stops at the 5 repeats a median's
    interval needs; a slow first bf16 repeat costs repeats, not the verdict."""
    once, calls = fake(jitter(0.5, 5), jitter(1.0, 5))
    bf16_s, fp32_s, verdict = precision.measure(once)
    assert verdict.dtype == "bf16" and len(bf16_s) == len(fp32_s) == precision.MIN_REPEATS
    assert calls[:4] == [False, True, True, False]
    once, calls = fake(jitter(0.5, 5), jitter(1.0, 5), slow={(True, 0): 5.0, (False, 3): 4.0})
    bf16_s, _, verdict = precision.measure(once)
    assert verdict.dtype == "bf16" and verdict.settled and len(bf16_s) > precision.MIN_REPEATS


def test_noisy_timings_run_to_the_cap_keep_float32_and_are_measured_again_next_run():
    """Timings that cannot tell: float32 for this run, not in the cache, measured again by the next run,
    and the line says so (and does not say "kept in")."""
    bf16, fp32 = [0.6, 1.0, 0.7, 1.1, 0.8, 0.9, 1.2, 0.75], [0.9, 1.0, 0.8, 1.2, 0.7, 1.1, 0.95, 0.85]
    once, calls = fake(bf16, fp32)
    record = precision.measured_cpu_dtype("smollm2", once)
    assert record["dtype"] == "fp32" and not record["settled"] and record["not_kept"]
    assert record["repeats"] == precision.MAX_REPEATS and not precision.cache_file().exists()
    n = len(calls)
    assert precision.measured_cpu_dtype("smollm2", once)["repeats"] and len(calls) > n
    precision.AUTO_CHOSEN["smollm2"] = record
    line = precision.auto_choice_line("smollm2")
    assert line.startswith("--dtype auto: float32 for this run: too noisy to decide, bf16 ")
    assert "measured again next run" in line and "kept in" not in line
    # past the time cap, the repeats stop at the 5 a median's interval needs
    bf16_s, _, verdict = precision.measure(fake(bf16, fp32)[0], cap_s=0)
    assert not verdict.settled and len(bf16_s) == precision.MIN_REPEATS


def test_the_real_timer_times_a_decoder_layer_quickly_at_a_small_shape():
    """layer_timer runs one layer's forward and backward in each precision (the model's own is the same
    code: 512 tokens of SmolLM2, ~0.1 s a repeat on one thread)."""
    once = precision.layer_timer(memory.Shape(512, 64, 2, 128, 4, 2, 16, True), tokens=64)
    times = [once(bf16) for bf16 in (False, True, False, True)]
    assert all(0 < s < 1 for s in times)
    assert precision.layer_tokens(precision.SMOLLM2) == 512
    assert precision.layer_tokens(memory.QWEN["Qwen/Qwen2.5-7B-Instruct"]) == 32
    assert precision.work_words(precision.SMOLLM2) == "a decoder layer's forward + backward, 512 tokens, one thread"


# the cache


def test_a_decision_is_kept_read_back_and_a_damaged_cache_is_rewritten():
    """Measured once per CPU, torch and model (on one thread, the run's count restored after); read back
    after; a damaged file is ignored, measured anew and rewritten; another model is measured apart."""
    once, calls = fake(jitter(0.5, 5), jitter(1.0, 5))
    threads = []
    torch.set_num_threads(2)
    first = precision.measured_cpu_dtype("smollm2", lambda bf16: threads.append(torch.get_num_threads())
                                         or once(bf16))
    assert set(threads) == {1} and torch.get_num_threads() == 2
    torch.set_num_threads(1)
    assert first["dtype"] == "bf16" and first["settled"] and first["not_kept"] is None
    n = len(calls)
    again = precision.measured_cpu_dtype("smollm2", once)
    assert len(calls) == n and again["cached"] and again["dtype"] == "bf16"
    path = precision.cache_file()
    path.write_text("{not json")
    redone = precision.measured_cpu_dtype("smollm2", fake(jitter(1.5, 5), jitter(1.0, 5))[0])
    assert redone["dtype"] == "fp32" and redone["settled"] and not redone["cached"]
    assert json.loads(path.read_text())[precision.machine_key("smollm2")]["dtype"] == "fp32"
    precision.measured_cpu_dtype("other-model", fake(jitter(0.5, 5), jitter(1.0, 5))[0])
    assert len(json.loads(path.read_text())) == 2


@pytest.mark.parametrize("change", [
    {"measured": None},            # no `measured`: was a KeyError in every run
    {"ratio": float("nan")},       # was taken, and the run trained in bf16
    {"ratio": float("inf")},
    {"ratio": True},
    {"rule": None},                # a record of the first rule (an MLP block, vetoed by its spread)
    {"ratio": 1.5, "low": 1.4, "high": 1.6},  # says bf16 where its own figures say float32
    {"dtype": "fp16"},
])
def test_a_record_the_rule_cannot_vouch_for_is_measured_again(change):
    once, calls = fake(jitter(1.5, 5), jitter(1.0, 5))
    good = {"rule": precision.RULE, "dtype": "bf16", "ratio": 0.5, "low": 0.45, "high": 0.55, "bf16_s": 0.5,
            "fp32_s": 1.0, "repeats": 5, "work": "a layer", "measured": "2026-12-04 12:00"}
    record = {k: v for k, v in {**good, **change}.items() if v is not None}
    path = precision.cache_file()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({precision.machine_key("smollm2"): record}))
    assert precision.measured_cpu_dtype("smollm2", once)["cached"] is False and calls
    assert json.loads(path.read_text())[precision.machine_key("smollm2")]["dtype"] == "fp32"
    path.write_text(json.dumps({precision.machine_key("smollm2"): good}))  # the same record, sound: read
    assert precision.measured_cpu_dtype("smollm2", once)["cached"] is True


def test_a_fifo_for_the_cache_is_ignored_without_blocking_and_left_alone():
    """$SHARPO_CACHE/dtype.json as a FIFO: measured, not blocked (it used to wait for a writer until
    killed), not written over, and the line says the decision was not kept."""
    path = precision.cache_file()
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    out = {}
    worker = threading.Thread(target=lambda: out.update(
        precision.measured_cpu_dtype("smollm2", fake(jitter(0.5, 5), jitter(1.0, 5))[0])), daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "blocked on the FIFO"
    assert out["dtype"] == "bf16" and "not a regular file" in out["not_kept"] and path.is_fifo()
    precision.AUTO_CHOSEN["smollm2"] = out
    line = precision.auto_choice_line("smollm2")
    assert "not kept (" in line and "measured again next run" in line and "kept in" not in line


def test_kept_in_is_said_only_when_the_write_succeeded(tmp_path, monkeypatch):
    """A cache folder that cannot be made (a file stands in its place): the decision holds for this run,
    and the line says it was not kept."""
    (tmp_path / "blocker").write_text("")
    monkeypatch.setenv("SHARPO_CACHE", str(tmp_path / "blocker" / "cache"))
    record = precision.measured_cpu_dtype("smollm2", fake(jitter(0.5, 5), jitter(1.0, 5))[0])
    assert record["dtype"] == "bf16" and record["not_kept"]
    precision.AUTO_CHOSEN["smollm2"] = record
    line = precision.auto_choice_line("smollm2")
    assert line.startswith("--dtype auto: bf16, 0.50x float32's time on this CPU (a decoder layer's forward")
    assert "not kept (" in line and "kept in" not in line


# the line and the run


def test_the_line_puts_the_verdict_first_and_its_ratio_agrees():
    """bf16 is followed by bf16's share of float32's time; float32 by why bf16 was not taken. Never the
    old "fp32: bf16 takes 0.41x"."""
    base = {"rule": precision.RULE, "bf16_s": 1, "fp32_s": 1, "repeats": 7, "work": "a decoder layer's forward "
            "+ backward, 512 tokens, one thread", "measured": "2026-12-04 12:00", "cached": False, "settled": True,
            "not_kept": None}
    lines = {}
    for dtype, ratio in (("bf16", 0.41), ("fp32", 1.3), ("fp32", 0.97)):
        precision.AUTO_CHOSEN["smollm2"] = {**base, "dtype": dtype, "ratio": ratio, "low": ratio, "high": ratio}
        lines[dtype, ratio] = precision.auto_choice_line("smollm2")
    assert lines["bf16", 0.41].startswith("--dtype auto: bf16, 0.41x float32's time on this CPU (a decoder layer's "
                                          "forward + backward, 512 tokens, one thread; measured now, 7 repeats each; "
                                          "kept in ")
    assert lines["fp32", 1.3].startswith("--dtype auto: float32: bf16 is slower on this CPU, 1.30x float32's time")
    assert lines["fp32", 0.97].startswith("--dtype auto: float32: bf16 is not clearly faster on this CPU, 0.97x")


def test_the_run_says_what_auto_chose_and_a_resumed_run_keeps_its_precision(tmp_path, monkeypatch):
    """The demo's first lines say what --dtype auto took and why; a run started in bf16 resumes in bf16
    even where the measurement now says float32 (config.json holds the precision)."""
    record = {"rule": precision.RULE, "dtype": "bf16", "ratio": 0.81, "low": 0.78, "high": 0.84, "bf16_s": 0.81,
              "fp32_s": 1.0, "repeats": 5, "work": "a decoder layer's forward + backward, 512 tokens",
              "measured": "now", "cached": False, "settled": True, "not_kept": None}
    monkeypatch.setattr(precision, "measured_cpu_dtype", lambda model, once=None: record)
    monkeypatch.setattr(precision, "bf16_kernels", lambda: True)  # a CPU with them, whatever this one is
    args = train.parse_args(["--preset", "cpu-demo", "--output-dir", str(tmp_path / "demo")])
    assert args.dtype == "bf16"
    assert "--dtype auto: bf16, 0.81x float32's time on this CPU" in describe(args)
    run = tiny_run_folder(tmp_path, dtype="bf16")
    monkeypatch.setattr(precision, "measured_cpu_dtype", lambda model, once=None: {
        **record, "dtype": "fp32", "ratio": 1.3, "low": 1.2, "high": 1.4, "cached": True})
    assert train.parse_args(["--resume", str(run), "--iterations", "2"]).dtype == "bf16"


def test_a_cpu_without_bf16_kernels_runs_float32_unmeasured(monkeypatch):
    """Where torch has no bf16 kernels for the CPU (an AVX2-only one), --dtype auto is float32 at once: nothing
    is timed (a 7B layer's bf16 repeats took minutes there) and the run's line says why."""
    def timed(*args, **kwargs):
        raise AssertionError("measured on a CPU without bf16 kernels")

    monkeypatch.setattr(precision, "measured_cpu_dtype", timed)
    monkeypatch.setattr(precision, "bf16_kernels", lambda: False)
    for model in ("smollm2", "Qwen/Qwen2.5-7B-Instruct"):
        assert precision.resolve_dtype("auto", "cpu", model) == "fp32"
        assert "float32: torch has no bf16 kernels for this CPU" in precision.auto_choice_line(model)
    assert precision.resolve_dtype("bf16", "cpu", "smollm2") == "bf16"  # asked for: as given


# the cache shared by processes: a lock, a fresh read

def _measure(cache: str, model: str) -> None:
    os.environ["SHARPO_CACHE"] = cache
    import time as clock

    from infra import precision as p

    def once(bf16: bool) -> float:  # a clear verdict, slowly: both processes read the file before either writes
        clock.sleep(0.05)
        return 0.01 if bf16 else 0.03

    p.measured_cpu_dtype(model, once=once, cap_s=1.0)


def test_two_measurements_at_once_keep_both_records(tmp_path):
    """Two processes measuring into one fresh $SHARPO_CACHE both said "kept in dtype.json" and one record
    remained: each read at start and rewrote the whole file at the end."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_measure, args=(str(tmp_path), model)) for model in ("tiny", "smollm2")]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
    records = json.loads((tmp_path / "dtype.json").read_text())
    assert sorted(key.rsplit("| ", 1)[1] for key in records) == ["smollm2", "tiny"]


def test_the_cache_keeps_what_another_process_wrote_since_it_was_read(tmp_path):
    path = tmp_path / "dtype.json"
    path.write_text(json.dumps({"other": {"dtype": "bf16"}}))
    assert precision.write_cache(path, "mine", {"dtype": "fp32"}) is None
    assert set(json.loads(path.read_text())) == {"other", "mine"}


# a resume

def test_resume_with_dtype_auto_is_the_runs_dtype(tmp_path):
    """--dtype auto at a resume means what it resolves to here: the run's own precision, so no change."""
    run = tiny_run_folder(tmp_path)  # its config.json holds what auto resolved to on this machine
    assert train.parse_args(["--resume", str(run), "--dtype", "auto", "--iterations", "2"]).dtype == \
        json.loads((run / "config.json").read_text())["dtype"]
