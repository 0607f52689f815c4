"""iteration.png: where one iteration's seconds go at 16 and 64 episodes, and each measured peak beside
infra/memory.py's figure for it (tools.device_check.planned_peaks), from this folder's JSON files.

Run: python results/gpu-h200/picture.py
"""
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # the repository's root: infra, tools

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from infra import memory  # noqa: E402
from tools.device_check import planned_peaks  # noqa: E402

STAGES = ["rollout", "segments", "student", "teacher", "reference", "update"]
COLORS = ["#4c72b0", "#999999", "#55a868", "#c44e52", "#8172b2", "#dd8452"]
PEAKS = [  # (file, key, label)
    ("device_check.json", "build.weights_gb", "weights"),
    ("device_check.json", "prefill_peak_gb_batch32_at_once", "prefill\n32 x 780"),
    ("device_check.json", "prefill_peak_gb_batch128_at_once", "prefill\n128 x 780"),
    ("device_check.json", "update_peak_gb", "update\n4 x 4,096"),
    ("device_check.json", "iteration.peak_memory_gb", "iteration\n16 ep."),
    ("device_check_big.json", "iteration.peak_memory_gb", "iteration\n64 ep."),
    ("device_check.json", "peak_memory_gb_after_decode_batch_128", "decode\n128 rows"),
]


def value(found: dict, key: str) -> float:
    for part in key.split("."):
        found = found[part]
    return found


def main() -> None:
    files = {p.name: json.loads(p.read_text()) for p in HERE.glob("device_check*.json")}
    seven = memory.QWEN["Qwen/Qwen2.5-7B-Instruct"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 4.8), gridspec_kw={"width_ratios": [1.1, 1]})
    runs = [("16 episodes x 3 steps", files["device_check.json"]["iteration"]),
            ("64 episodes x 4 steps", files["device_check_big.json"]["iteration"])]
    for y, (label, it) in enumerate(runs):
        start = 0.0
        for stage, color in zip(STAGES, COLORS):
            width = it[f"seconds/{stage}"]
            left.barh(y, width, left=start, color=color, label=stage if y == 0 else None)
            if width > 3:
                left.text(start + width / 2, y, f"{width:.1f}", ha="center", va="center", fontsize=8, color="white")
            start += width
        left.text(start + 1, y, f"{it['seconds/iteration']:.1f} s", va="center", fontsize=9)
    left.set_yticks(range(len(runs)), [label for label, _ in runs])
    left.set_xlabel("seconds (one train.py iteration, SHARPO, --kl-coef 0.01, --rollout hf, 128 tokens a turn)")
    left.set_xlim(0, 118)
    left.legend(ncol=3, fontsize=8, loc="lower right")
    left.set_title("Where an iteration's seconds go (7B shape, nf4 + LoRA r 64, H200)", fontsize=10)

    measured, planned = [], []
    for name, key, _ in PEAKS:
        found = files[name]
        measured.append(value(found, key))
        planned.append(planned_peaks(found, found["args"], seven)[key])
    xs = range(len(PEAKS))
    right.bar([x - 0.2 for x in xs], measured, 0.4, color="#4c72b0", label="measured (H200)")
    right.bar([x + 0.2 for x in xs], planned, 0.4, color="#dd8452", label="infra/memory.py")
    for x, m, p in zip(xs, measured, planned):
        right.text(x + 0.2, p + 0.5, f"{(p / m - 1) * 100:+.1f}%", ha="center", fontsize=8)
    right.set_xticks(list(xs), [label for _, _, label in PEAKS], fontsize=8)
    right.set_ylabel("GiB (peak allocated by torch)")
    right.legend(fontsize=8, loc="upper left")
    right.set_title("Measured peaks beside the calculator's", fontsize=10)
    fig.tight_layout()
    fig.savefig(HERE / "iteration.png", dpi=110)
    print(HERE / "iteration.png")


if __name__ == "__main__":
    main()
