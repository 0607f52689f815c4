"""infra/memory.py against the GPU: every peak the device check measured on one H200 (results/gpu-h200/, the
7B shape in nf4 with LoRA r 64) is the calculator's figure for the same setting within 10%, and the shapes
the calculator plans for are the ones the device check builds."""
import json
from pathlib import Path

import pytest

from infra import memory
from tools import device_check

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "results" / "gpu-h200"
SEVEN = memory.QWEN["Qwen/Qwen2.5-7B-Instruct"]


def _measured(found: dict, key: str) -> float:
    for part in key.split("."):
        found = found[part]
    return found


@pytest.mark.parametrize("name", ["device_check.json", "device_check_big.json", "device_check_256.json"])
def test_each_measured_peak_is_the_calculator_s_within_10_percent(name):
    found = json.loads((H200 / name).read_text())
    assert found["device"] == "NVIDIA H200" and found["build"]["base_layers"] == ["bitsandbytes.nn.modules.Linear4bit"]
    planned = device_check.planned_peaks(found, found["args"], SEVEN, load_in_4bit=True, lora_r=64)
    off = {key: f"measured {_measured(found, key):.2f}, planned {gib:.2f} GiB" for key, gib in planned.items()
           if abs(gib / _measured(found, key) - 1) > 0.10}
    assert not off, off
    # every peak the file holds was compared (none left out by a key the mapping does not know)
    peaks = {k for k in found if k.startswith("prefill_peak_gb_") or k.startswith("peak_memory_gb_after_decode")}
    peaks |= {"build.weights_gb"} | ({"update_peak_gb"} if "update_peak_gb" in found else set())
    peaks |= {"iteration.peak_memory_gb"} if "iteration" in found else set()
    assert peaks == set(planned)


def test_the_figures_the_issue_names_are_covered():
    """The weights, the prefill of 780-token prompts at 32 and 128 at once, the update at 4 x 4,096 tokens
    and the iteration's peak at 16 and 64 episodes: each one compared above."""
    one = json.loads((H200 / "device_check.json").read_text())
    big = json.loads((H200 / "device_check_big.json").read_text())
    assert one["build"]["weights_gb"] == pytest.approx(5.67, abs=0.005)
    assert one["prefill_peak_gb_batch32_at_once"] == pytest.approx(11.70, abs=0.005)
    assert one["prefill_peak_gb_batch128_at_once"] == pytest.approx(28.29, abs=0.005)
    assert (one["args"]["rows"], one["args"]["row_tokens"]) == (4, 4096) and one["update_peak_gb"] == pytest.approx(13.45, abs=0.005)
    assert one["iteration"]["peak_memory_gb"] == pytest.approx(9.34, abs=0.005)
    assert big["args"]["iteration_episodes"] == 64 and big["iteration"]["peak_memory_gb"] == pytest.approx(9.49, abs=0.005)


def test_the_old_activation_term_would_fail_it():
    """The test is not vacuous: the update term before the calibration (21 (H + I)-sized tensors a token, 1.15 MB
    at 7B) plans the 4 x 4,096-token update at ~25 GiB, against 13.45 measured."""
    found = json.loads((H200 / "device_check.json").read_text())
    old = memory.ACTIVATION_TERMS
    try:
        memory.ACTIVATION_TERMS = 21
        planned = device_check.planned_peaks(found, found["args"], SEVEN)["update_peak_gb"]
    finally:
        memory.ACTIVATION_TERMS = old
    assert planned > 1.5 * found["update_peak_gb"]


def test_the_shapes_planned_are_the_shapes_built():
    """The device check builds the 7B and the course card's 1.5B from the same sizes the calculator plans with."""
    from transformers import Qwen2Config

    from infra.models import QWEN1_5B_SHAPE, QWEN7B_SHAPE

    for sizes, name in ((QWEN7B_SHAPE, "Qwen/Qwen2.5-7B-Instruct"), (QWEN1_5B_SHAPE, "Qwen/Qwen2.5-1.5B-Instruct")):
        assert memory.Shape.of(Qwen2Config(**{"tie_word_embeddings": False, **sizes})) == memory.QWEN[name]


def test_the_optimizer_state_is_counted_where_it_is_held():
    """Training holds the LoRA's gradients and Adam's moments in every phase (16 bytes a parameter); a first
    iteration's rollout holds its weights alone; the device check's parts hold no optimizer."""
    s = memory.Setting(episodes=16, rollout_batch=0)
    held, first = memory.plan(SEVEN, s), memory.plan(SEVEN, memory._with(s, optimizer="first"))
    none = memory.plan(SEVEN, memory._with(s, optimizer="none"))
    lora = SEVEN.lora_params(64) / memory.GIB
    assert held["phases"]["rollout"] - first["phases"]["rollout"] == pytest.approx(12 * lora)
    assert held["phases"]["update"] == pytest.approx(first["phases"]["update"])
    assert held["phases"]["update"] - none["phases"]["update"] == pytest.approx(8 * lora)
    with pytest.raises(ValueError, match="optimizer"):
        memory.plan(SEVEN, memory._with(s, optimizer="adam"))
