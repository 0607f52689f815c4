"""Text in any encoding: output goes out in the stream's own encoding (on an ASCII stdout `±` is `+-`
and `é` is `?`), and under LC_ALL=C a run folder whose name is not ASCII, holding text that is not
ASCII, trains, resumes and draws its plots. If these fail, a complete run ends in a UnicodeEncodeError
traceback and exit 1."""
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_runs import run_cli as _cli
from infra.cli import GuardedStream

ROOT = Path(__file__).resolve().parent.parent


def test_a_stream_that_cannot_write_a_symbol_gets_its_nearest_ascii():
    raw = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    stream = GuardedStream(raw, "output")
    stream.write("mult 1.004\u00b10.006 | caf\u00e9 \u2192 done\n")
    raw.flush()
    assert raw.buffer.getvalue().decode("ascii") == "mult 1.004+-0.006 | caf? -> done\n"


def test_a_run_on_an_ascii_stdout_ends_well():
    """`PYTHONIOENCODING=ascii` (or `LC_ALL=C`): the progress line's `\u00b1`, printed after the checkpoint, ended
    a complete run in a traceback with exit 1; eval.py's table with an accented category too."""
    code = ("import report; from infra.cli import run\n"
            "line = {'iteration': 2, 'success': 0.5, 'invalid_rate': 0.0, 'mean_reward': 5.0, 'groups_with_spread': 1.0,"
            " 'mult_mean': 1.004, 'mult_std': 0.006, 'mult_at_bound': 0.0, 'seconds/rollout': 3.0}\n"
            "run(lambda: print(report.progress_line(line, [0.25, 0.5]), '| caf\\u00e9'))")
    done = _cli("-c", code, env={"PYTHONIOENCODING": "ascii"})
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "mult 1.004+-0.006" in done.stdout and "caf?" in done.stdout and ",- +0.25" in done.stdout


@pytest.mark.slow
def test_a_non_ascii_run_folder_under_the_c_locale(tmp_path):
    """LC_ALL=C (ASCII, no UTF-8 coercion), a run folder named données and a sampled response that is not
    ASCII: the run, its resume and its plots work (UnicodeEncodeError tracebacks in checkpoint.py and in
    the plots' segments.html before)."""
    out = tmp_path / "données"
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0", "OMP_NUM_THREADS": "1"}
    argv = ["train.py", "--model", "tiny", "--preset", "none", "--env", "webshop", "--iterations", "1", "--groups", "1",
            "--group-size", "2", "--max-steps", "2", "--max-new-tokens", "6", "--lora-r", "4", "--lora-alpha", "8",
            "--eval-every", "0", "--hindsight", "expert", "--output-dir", str(out)]
    for command in (argv, ["train.py", "--resume", str(out), "--iterations", "2"], ["-m", "tools.plots", str(out)]):
        if command[0] == "-m":  # logged text that is not ASCII (the tiny model samples U+FFFD tokens)
            samples = out / "samples.jsonl"
            samples.write_text(samples.read_text().replace('"task_id": "', '"task_id": "caf\\u00e9 \\ufffd'))
        done = subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True, env=env,
                              timeout=300)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert (out / "checkpoints" / "iter-000002" / "README.md").is_file()
    assert "café" in (out / "segments.html").read_text(encoding="utf-8")
