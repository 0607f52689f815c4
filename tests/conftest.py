"""Shared test setup: one CPU thread (stable timings on 2 cores) and the tokenizers tests use."""
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
torch.set_num_threads(1)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from infra.models import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from infra.models import load_tokenizer

    return load_tokenizer("smollm2")


def pytest_configure(config):
    """The `slow` marker: the longest tests (14-55 s each on 2 cores: the notebooks run whole, the real
    embedded model's rollouts and checkpoints, whole runs in subprocesses under torchrun, the C locale or a
    full disk, timeouts at their defaults). Without -m, the README's
    command leaves them out (pytest reports them as deselected); `-m slow` runs just them, as .ci/run does."""
    config.addinivalue_line("markers", "slow: one of the longest tests; run with -m slow (CI does)")
    if not config.option.markexpr:
        config.option.markexpr = "not slow"
