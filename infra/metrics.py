"""Metrics a run keeps of itself, whatever it computes: seconds per stage, peak memory, and a
curve drawn in text. What a training iteration's metrics line holds is report.py's.
"""
from __future__ import annotations

import contextlib
import resource
import sys
import time
from contextlib import contextmanager

import torch


def timed(watch, name: str):
    """`with timed(watch, name):` times a stage when there is a stopwatch, and does nothing without one."""
    return watch(name) if watch is not None else contextlib.nullcontext()


class Stopwatch:
    """Seconds per named stage of one iteration (`with watch("rollout"): ...`); with an env, also
    the env's share of the time (seconds/env) and its crashes since the watch started."""

    def __init__(self, env=None):
        self.seconds = {"rollout": 0.0, "env": 0.0, "segments": 0.0, "student": 0.0, "teacher": 0.0,
                        "reference": 0.0, "update": 0.0}
        self.env, self.open = env, []
        self.env_start = sum(env.seconds.values()) if env is not None else 0.0
        self.crashes_start = getattr(env, "crashes", 0)
        reset_peak_memory()  # peak_memory_gb is this iteration's own peak, not the run's so far

    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        self.open.append(name)
        yield
        self.open.pop()
        spent = time.perf_counter() - start
        self.seconds[name] += spent
        if self.open:  # a stage timed inside another (the reference pass in the update) is its own
            self.seconds[self.open[-1]] -= spent
        if self.env is not None:
            self.seconds["env"] = sum(self.env.seconds.values()) - self.env_start

    def crashes(self) -> int:
        return getattr(self.env, "crashes", 0) - self.crashes_start


def peak_memory_gb() -> float:
    """The peak memory since the last reset_peak_memory (GPU: allocated by torch; CPU: the process's resident set)."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    try:  # Linux: the peak resident set since the last reset, in kB
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 2**20
    except (OSError, StopIteration, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # the process's peak so far, in KiB


def reset_peak_memory() -> None:
    """Start a new peak: torch's CUDA counter, or the kernel's peak resident set (Linux; elsewhere it keeps the run's)."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
        return
    with contextlib.suppress(OSError):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # 5: reset the peak resident set size (proc(5))


CURVE_WIDTH = 30  # iterations the progress line's text curve shows (the latest ones)
BARS, ASCII_BARS = "▁▂▃▄▅▆▇█", "_.,:-=+*#"


def text_curve(successes: list[float], encoding: str | None = None) -> str:
    """The training success of the iterations so far as one character each (the lowest bar 0, the
    highest 1), the latest CURVE_WIDTH, then the move since the first: "▂▅▇ +0.44". ASCII where
    the output cannot write the bars."""
    bars = BARS
    try:
        BARS.encode(encoding or getattr(sys.stdout, "encoding", None) or "ascii")
    except (UnicodeEncodeError, LookupError):
        bars = ASCII_BARS
    shown = "".join(bars[round(min(max(s, 0.0), 1.0) * (len(bars) - 1))] for s in successes[-CURVE_WIDTH:])
    return f"{'~' if len(successes) > CURVE_WIDTH else ''}{shown} {successes[-1] - successes[0]:+.2f}"
