"""Building an env by name: its packages imported only when it is asked for, ALFWorld's episodes in
worker processes when several cores can play them (envs/workers.py); and the tasks a run trains on,
drawn for each iteration.
"""
from __future__ import annotations

import os

from errors import UserError


def make_env(name: str, data_dir=None, max_steps: int = 0, workers: int = 1, timeout: float = 600.0,
             **kwargs):
    """Build an env by name (max_steps 0 = the env's own default); env packages are imported
    only when asked for. workers > 1 runs ALFWorld's episodes in that many processes
    (envs/workers.py), each given `timeout` seconds to answer a reset or step; WebShop always runs
    in-process (a step takes ~0.05 ms)."""
    kwargs["data_dir"] = data_dir
    if max_steps > 0:
        kwargs["max_steps"] = max_steps
    if name == "alfworld" and workers > 1:
        # deferred: each env's packages only when that env is asked for
        from envs.workers import WorkerEnv

        return WorkerEnv(name, workers, timeout=timeout, **kwargs)
    if name == "alfworld":
        from envs.alfworld import AlfWorldEnv

        return AlfWorldEnv(**kwargs)
    if name == "webshop":
        try:  # WebShop's search and reward packages load only when WebShop is asked for
            from envs.webshop import WebShopEnv
        except ModuleNotFoundError as err:
            raise UserError(f"--env webshop needs the {err.name} package, which is not installed: "
                            "pip install -r requirements.txt (or bash install.sh)") from None
        return WebShopEnv(**kwargs)
    raise ValueError(f"unknown env {name!r}: choose 'alfworld' or 'webshop'")


def resolve_workers(flag: int, batch: int) -> int:
    """--env-workers: 0 = the CPU cores, capped by the batch (episodes at once); else the flag."""
    if flag > 0:
        return flag
    return max(1, min(os.cpu_count() or 1, batch))


def training_tasks(env, split: str, max_plan_len: int = 0) -> list[str]:
    """The task ids of `split`; max_plan_len > 0 keeps those whose expert plan is no longer."""
    tasks = env.tasks(split)
    if not tasks:  # before any lock is taken or loop starts: a draw from nothing never ends
        raise UserError(f"the {split} split of {env.name}'s data holds no task: check --data-dir "
                        f"(or ${env.name.upper()}_DATA), or choose another --split")
    if max_plan_len > 0:
        tasks = [t for t in tasks if len(env.expert_plan(t)) <= max_plan_len]
        if not tasks:
            raise UserError(f"no {split} task has an expert plan of <= {max_plan_len} steps")
    return tasks


def draw_tasks(rng, tasks: list[str], n: int) -> list[str]:
    """n tasks for one iteration: distinct while there are enough, then again from a fresh draw."""
    chosen = []
    while len(chosen) < n:
        chosen += rng.sample(tasks, min(n - len(chosen), len(tasks)))
    return chosen
