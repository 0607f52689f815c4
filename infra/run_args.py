"""The flags of a train.py run that say how it is executed, not what it computes: model and precision,
data, run folder, logs, evaluation (flags.py's TrainArgs extends this class with the method's)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class RunArgs:
    """How a run of train.py is executed: model and precision, data, run folder, logs, evaluation.
    They change where and how fast the method runs, not what it computes (train.py's TrainArgs)."""

    preset: Literal["auto", "gpu", "course", "cpu-demo", "cpu-learn", "cpu-watch", "none"] = "auto"  # auto: cpu-demo without a GPU, else gpu; course: a 24 GB GPU
    model: str | None = None  # HF id or local path, "smollm2" (embedded) or "tiny"; default per device
    load_in_4bit: bool | None = None  # 4-bit nf4 weights; default: on for HF models on CUDA
    dtype: Literal["auto", "bf16", "fp32"] = "auto"  # compute precision; auto: bf16 on a GPU, on a CPU the faster, measured
    lora_r: int = 64  # LoRA rank (verl-agent: 64)
    lora_alpha: int = 64  # LoRA alpha (verl-agent: 64)
    lora_layers: int = 0  # LoRA on the last N decoder layers only (0 = all); the backward pass stops at the first
    init_adapter: str | None = None  # LoRA merged into the base first (tools/warmstart.py output); none = no warm start
    data_dir: str | None = None  # env data folder; default: $ALFWORLD_DATA / $WEBSHOP_DATA, else the shipped data
    split: str = "train"  # split the training tasks come from
    max_plan_len: int = 0  # keep only tasks whose expert plan has at most this many steps (0 = all)
    env_workers: int = 0  # ALFWorld: processes the episodes run in; 0 = CPU cores, capped by the batch; 1 = in-process
    env_timeout: float = 600.0  # seconds an env worker may take for one reset or step (a frozen one: 20 s without a heartbeat)
    rollout: Literal["hf", "vllm"] = "hf"  # who decodes the rollouts: hf (generate) | vllm (installed apart: vllm_rollout/)
    rollout_batch: int = 0  # --rollout hf: episodes per generate call (0 = every live one); bounds the prefill's memory
    vllm_gpu_memory: float = 0.35  # --rollout vllm on a GPU: the share of its memory vLLM may take beside training
    micro_batch_rows: int = 4  # rows per forward/backward (gradients accumulate over them)
    plain: bool = False  # only rollout.py's plain passes (one forward per row), not speed.py's: slower, equal to rounding
    gradient_checkpointing: bool | None = None  # recompute activations in backward; default: on for CUDA
    eval_every: int = 10  # greedy evaluation every N iterations (0 = never)
    eval_split: str | None = None  # evaluation split; default: the env's (ALFWorld: valid_unseen, WebShop: test)
    eval_games: int = 32  # games per evaluation
    save_every: int = 1  # checkpoint every N iterations
    keep_checkpoints: int = 2  # complete checkpoints kept in RUN_DIR/checkpoints (the newest ones)
    samples_per_iter: int = 2  # sample trajectories written to samples.jsonl per iteration
    report_to: Literal["none", "tensorboard", "trackio", "wandb"] = "none"  # live dashboard (an optional extra)
    demo_data: bool = False  # with --preset gpu: train on the shipped demo games on purpose (else the real data is required)
    output_dir: str | None = None  # the run folder; default runs/<env>-<algo>[-<cpu preset>][-shuffled]; with --resume: that run's
    resume: str | None = None  # a run folder (or one of its checkpoints) to continue, in that run folder
