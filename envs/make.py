"""Building an env by name: its packages imported only when it is asked for, ALFWorld's episodes in
worker processes when several cores can play them (envs/workers.py).
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
