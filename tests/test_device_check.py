"""tools/device_check.py, the script prepared for a GPU machine, dry-run on a CPU with the tiny model:
every part measures a positive rate, the iteration reports each stage, a spent budget skips
parts instead of running past a device machine's limit, and the next calls' parts (decode compared
five ways, the 7B in bf16, the course card's iteration at its preset's sizes) write what they measure,
each peak beside infra/memory.py's figure for it."""
import json
import re
import zipfile
from pathlib import Path

import pytest

from infra.cli import UserError
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


def test_the_next_calls_parts_write_their_figures(tmp_path):
    """The parts of docs/scaling.md's two next calls, in the first call's order: the course card's iteration at
    --preset course's sizes, the bf16 7B's decode compared, passes and prefill, the nf4 decode compared; each
    peak with its planned figure beside it."""
    from flags import PRESETS

    args = ["--model", "tiny", "--parts", device_check.NEXT_CALLS[1] + ",bf16-iteration", "--out", str(tmp_path / "n.json")]
    out = device_check.main(args)
    assert out["done"][:2] == ["course one iteration", "bf16 decode compared batch 4"] and out["skipped"] == []
    course, preset = out["course"]["iteration"], PRESETS["course"]
    assert (course["episodes"], course["new_tokens"]) == (preset["groups"] * preset["group_size"], preset["max_new_tokens"])
    assert course["steps"] == 2 and course["tokens_generated"] == 16 * 2 * preset["max_new_tokens"]  # the dry run's steps
    assert device_check.COURSE["lora_r"] == preset["lora_r"] and not preset["load_in_4bit"]
    assert out["course"]["build"]["compute_dtype"] == "torch.bfloat16"
    assert {"build.weights_gb", "iteration.peak_memory_gb"} <= set(out["course"]["planned_gb"])
    for section in (out, out["bf16"]):
        for batch in (4, 8):
            ways = section[f"decode_compared_batch{batch}"]
            assert set(ways["steps"]) == {"plain", "autocast", "sampled", "rollout", "plain_prompt24"}
            assert all(s == 8 for s in ways["steps"].values())  # every way decodes the forced 8 tokens
            assert all(ways[f"{w}_tok_s"] > 0 for w in ways["steps"]) and ways["warmup_s"] > 0
            assert f"peak_memory_gb_after_decode_compared_batch_{batch}" in section["planned_gb"]
    bf16 = out["bf16"]
    assert bf16["build"]["lora_layers"] == ["peft.tuners.lora.layer.Linear"]
    assert bf16["no_grad_tok_s"] > bf16["update_tok_s"] > 0 and bf16["iteration"]["seconds/reference"] > 0
    assert {"update_peak_gb", "prefill_peak_gb_batch32_at_once", "iteration.peak_memory_gb"} <= set(bf16["planned_gb"])
    assert json.loads((tmp_path / "n.json").read_text())["bf16"]["update_tok_s"] == bf16["update_tok_s"]


def test_unknown_parts_are_one_line():
    import pytest

    from infra.cli import UserError

    with pytest.raises(UserError, match="--parts takes"):
        device_check.main(["--model", "tiny", "--parts", "decode,warp"])


def test_docs_give_the_next_two_calls_in_order():
    """docs/scaling.md gives the two next device calls, the first before the second, with the --parts this tool
    defines for them, each with a budget that ends it in time (the first ~8 minutes, the second ~4) and its own
    JSON under $OUT."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "scaling.md").read_text()
    calls = [c.split("  #")[0].split() for c in re.findall(r"python3 -m tools\.device_check (--parts [^`\n]*)", text)]
    assert [c[1] for c in calls] == [device_check.NEXT_CALLS[1], device_check.NEXT_CALLS[2]]
    for n, (words, most) in enumerate(zip(calls, (360, 200)), 1):
        args = device_check.parse_dataclass(device_check.DeviceCheckArgs, words)
        assert device_check.part_list(args, [64]) and args.budget_s <= most
        assert args.out == f"$OUT/device_check_next{n}.json"


def test_a_damaged_wheel_is_one_line(tmp_path):
    from tools import device_check

    (tmp_path / "bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl").write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(UserError, match="not a whole wheel"):
        device_check.slim_bitsandbytes(tmp_path)
    good = tmp_path / "good"
    good.mkdir()
    with zipfile.ZipFile(good / "bitsandbytes-0.50.2-py3-none-any.whl", "w") as z:
        z.writestr("bitsandbytes/libbitsandbytes_cuda121.so", b"x")
        z.writestr("bitsandbytes/libbitsandbytes_cuda130.so", b"y")
    device_check.slim_bitsandbytes(good)
    with zipfile.ZipFile(good / "bitsandbytes-0.50.2-py3-none-any.whl") as z:
        assert z.namelist() == ["bitsandbytes/libbitsandbytes_cuda130.so"]
