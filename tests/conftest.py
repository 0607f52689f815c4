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
