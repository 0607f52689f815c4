"""The verl tests' shared setup: the CPU support first, before anything imports verl's workers or
trainer (they resolve verl's device platform when imported), and one CPU thread (stable timings
on 2 cores)."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from verl_bridge.tests import cpu_verl  # noqa: E402, F401  (registers the CPU platform, sets the workers' environment)

torch.set_num_threads(1)
