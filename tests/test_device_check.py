"""tools/device_check.py, the script prepared for a GPU machine, dry-run on a CPU with the tiny model:
every part measures a positive rate, the iteration reports each stage, and a spent budget skips
parts instead of running past a device machine's limit."""
import json

from tools import device_check


def test_dry_run_measures_every_part(tmp_path):
    out = device_check.main(["--model", "tiny", "--out", str(tmp_path / "dc.json")])
    assert out["decode_tok_s_batch4"] > 0 and out["decode_tok_s_batch8"] > 0
    assert out["no_grad_tok_s"] > out["update_tok_s"] > 0  # a backward costs more than the forward alone
    peaks = [k for k in out if k.startswith("prefill_peak_gb_")]
    assert peaks and all(out[k] >= 0 for k in peaks)
    assert len(peaks) == 4  # batch 8 and 32, each at once and in chunks: one key a case, even where the
    # chunk equals the batch (batch 8 in chunks of 8), which used to share a key with "at once"
    stages = out["iteration"]
    for stage in ("rollout", "student", "teacher", "update", "iteration"):
        assert stages[f"seconds/{stage}"] >= 0
    assert stages["seconds/iteration"] >= stages["seconds/rollout"] + stages["seconds/update"]
    assert out["skipped"] == [] and out["peak_memory_gb_after_one_iteration"] > 0
    assert json.loads((tmp_path / "dc.json").read_text())["decode_tok_s_batch8"] == out["decode_tok_s_batch8"]


def test_a_spent_budget_skips_parts():
    out = device_check.main(["--model", "tiny", "--budget-s", "0"])
    assert out["skipped"] == ["decode batch 4", "decode batch 8", "prefill", "no-grad and update passes", "one iteration"]
    assert "no_grad_tok_s" not in out


def test_the_gpu_model_on_a_cpu_is_one_line():
    import pytest
    import torch

    from infra.cli import UserError

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the 7B shape would be built, not refused")
    with pytest.raises(UserError, match="needs a CUDA GPU"):
        device_check.main([])
