"""Distributed: N processes train one policy (data parallel), for torchrun / accelerate launch.

Each process plays whole groups of the iteration, builds and scores its own rows; what must
agree across processes goes through the few methods below. The update's loss is a token-mean
over every process's trained tokens: each process divides its token sums by the global count
and the gradients are summed, so N processes take exactly the step one process would take
over all the rows. (DDP's wrapper would average per-process means instead, which weighs a
token by how many tokens its process happened to hold.)

Every collective runs on the process's device: NCCL, the backend on GPUs, reduces only tensors
that sit on the process's own GPU (a CPU tensor fails with "No backend type associated with
device type cpu"); gloo, on CPUs, takes CPU tensors.

The process group is destroyed when the process exits (`close`, registered with atexit): left to
the interpreter's teardown, gloo's worker threads can abort the process ("terminate called without
an active exception", SIGABRT), and torchrun then kills the other processes too.
"""
from __future__ import annotations

import atexit
import os
from datetime import timedelta

import torch


class DataParallel:
    """[distributed] N processes train one policy (`torchrun` / `accelerate launch`); in a plain
    `python train.py` N = 1 and every method is a no-op, so the teaching path is unchanged.

    Each process plays whole groups (GRPO statistics stay local), builds and scores its rows;
    the token-mean denominator and the LoRA gradients are summed over processes, so N
    processes take the same optimizer step as one process over all the rows (train.py takes
    it); metrics are gathered; the main process alone writes logs and checkpoints."""

    def __init__(self):
        self.world, self.rank, self.device = int(os.environ.get("WORLD_SIZE", "1")), 0, None
        if self.world > 1:
            from accelerate import PartialState  # starts the process group (gloo on CPU, nccl on GPUs)

            # a long timeout: the other processes wait while the main one evaluates and saves
            state = PartialState(cpu=not torch.cuda.is_available(), timeout=timedelta(hours=3))
            self.world, self.rank, self.device = state.num_processes, state.process_index, str(state.device)
            atexit.register(self.close)  # while the interpreter is whole, not in its teardown

    def close(self) -> None:
        """Destroy the process group (a no-op when there is none, or it is gone already)."""
        if self.world > 1 and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    @property
    def main(self) -> bool:
        return self.rank == 0

    def sum(self, value: float) -> float:
        if self.world == 1:
            return value
        x = torch.tensor([float(value)], dtype=torch.float64, device=self.device)  # NCCL: on this GPU
        torch.distributed.all_reduce(x)
        return float(x)

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor` sits on this process's device (the CPU counts as one device)."""
        mine = torch.device(self.device)
        return tensor.device.type == mine.type and (mine.type == "cpu" or tensor.device.index == mine.index)

    def all(self, flag: bool) -> bool:
        """Whether `flag` holds on every process (a step any of them cannot take, none takes)."""
        return self.sum(0.0 if flag else 1.0) == 0

    def sum_grads(self, params: list) -> None:
        """Sum each LoRA gradient over processes (each is already divided by the global token count).
        A parameter without a gradient (its rows left out of the minibatch) gets zeros, here and in a
        plain run: every process steps the same parameters, and AdamW's moments move them all."""
        for p in params:
            p.grad = torch.zeros_like(p) if p.grad is None else p.grad
        if self.world == 1:
            return
        for p in params:
            if not self.holds(p.grad):  # the policy was loaded onto self.device
                raise RuntimeError(f"a LoRA gradient is on {p.grad.device}, not on this process's {self.device}")
            torch.distributed.all_reduce(p.grad)

    def gather(self, items: list) -> list:
        """Every process's list, concatenated in process order."""
        if self.world == 1:
            return items
        out = [None] * self.world  # pickled into a tensor on torch.cuda.current_device() under NCCL,
        torch.distributed.all_gather_object(out, items)  # which accelerate set to this process's GPU
        return [x for part in out for x in part]

    def barrier(self) -> None:
        if self.world > 1:
            device = torch.device(self.device)  # NCCL's barrier is an all-reduce on a GPU: name ours
            torch.distributed.barrier(**({"device_ids": [device.index]} if device.type == "cuda" else {}))
