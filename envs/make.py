"""Building an env by name: the class ENVS (envs/__init__.py) names, its packages imported only when
it is asked for, its episodes in worker processes when several cores can play them (envs/workers.py);
and the tasks a run trains on, drawn for each iteration.
"""
from __future__ import annotations

import importlib
import os

from envs import ENVS
from envs.workers import WorkerEnv
from errors import UserError


def env_class(name: str) -> type:
    """The env class ENVS names (its module imported now, not before); a name it does not hold, a
    package the env needs and does not find, or a class that is not a whole `envs.Env`, is one line
    that says what to do."""
    entry = ENVS.get(name)
    if entry is None:
        raise UserError(f"--env {name!r} is no environment of this project: choose one of "
                        f"{', '.join(ENVS)}")
    cls = entry
    if isinstance(entry, str):  # "module:Class": imported now
        module, attr = entry.split(":")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except ModuleNotFoundError as err:
            raise UserError(f"--env {name} needs the {err.name} package, which is not installed: "
                            "pip install -r requirements.txt (or bash install.sh)") from None
    ENVS.check(name, cls)
    return cls


def make_env(name: str, data_dir=None, max_steps: int = 0, workers: int = 1, timeout: float = 600.0):
    """Build an env by name (max_steps 0 = the env's own default). workers > 1 runs the episodes
    of an env that allows it (`in_workers`: ALFWorld) in that many processes (envs/workers.py),
    each given `timeout` seconds to answer a reset or step; the others play in this process."""
    cls = env_class(name)
    if workers > 1 and cls.in_workers:
        return WorkerEnv(cls, workers, timeout=timeout, data_dir=data_dir, max_steps=max_steps)
    env = cls(data_dir=data_dir, max_steps=max_steps)
    if not hasattr(env, "counts"):  # what envs.Env.__init__ sets, and the loop reads
        raise UserError(f"--env {name}: {cls.__name__}.__init__ did not call super().__init__(data_dir, "
                        "max_steps), which sets what the loop reads of an env (envs.Env)")
    return env


def resolve_workers(flag: int, batch: int) -> int:
    """--env-workers: 0 = the CPU cores, capped by the batch (episodes at once); else the flag."""
    if flag > 0:
        return flag
    return max(1, min(os.cpu_count() or 1, batch))


def training_tasks(env, split: str, max_plan_len: int = 0) -> list[str]:
    """The task ids of `split`; max_plan_len > 0 keeps those whose expert plan is no longer."""
    tasks = env.tasks(split)
    if not tasks:  # before any lock is taken or loop starts: a draw from nothing never ends
        where = f" (or ${env.data_variable})" if env.data_variable else ""
        raise UserError(f"the {split} split of {env.name}'s data holds no task: check --data-dir{where}, "
                        "or choose another --split")
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
