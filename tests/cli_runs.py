"""The project's command lines run as a user runs them (a subprocess on one CPU thread), and the one
`error: ...` line, exit 2 and no traceback, that a bad input must end with."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*argv, env=None, cwd=ROOT, timeout=300):
    """`python ARGV...` in `cwd` (the repository's root), its output captured."""
    return subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def one_line(done, *words):
    """`done` ended with exit 2, no traceback, and a last line `error: ...` that holds each of `words`."""
    assert done.returncode == 2, done.stderr[-1500:]
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and all(w in last for w in words), last
