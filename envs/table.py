"""The env table's mechanics: ENVS (envs/__init__.py) refuses, in one line, a class that is not a
whole env: one that does not subclass `Env`, or lacks an abstract method or a class attribute `Env`
requires (those it declares without a default). A reader of the method may skip this file.
"""
from __future__ import annotations

from errors import UserError


def check_env(base: type, name: str, cls) -> None:
    """One line (UserError) naming what a class registered as env `name` lacks of `base` (envs.Env)."""
    missing = [f"{base.__module__}.{base.__name__} as its base class"]
    if isinstance(cls, type) and issubclass(cls, base):
        missing = [f"{m}()" for m in sorted(cls.__abstractmethods__)] + \
            [a for a in base.__annotations__ if not hasattr(cls, a)]  # the attributes without a default
    if missing:
        raise UserError(f"env {name!r} ({getattr(cls, '__name__', cls)!r}) is not a whole env: it lacks "
                        f"{', '.join(missing)} ({base.__module__}.{base.__name__} is the interface)")


class EnvTable(dict):
    """name -> a subclass of `base`, checked as it is registered; or "module:Class", imported and
    checked when first asked for (envs/make.py)."""

    def __init__(self, base: type, entries: dict):
        super().__init__(entries)
        self.base = base

    def __setitem__(self, name: str, entry) -> None:
        if not isinstance(entry, str):
            check_env(self.base, name, entry)
        super().__setitem__(name, entry)

    def check(self, name: str, cls) -> None:
        """The check of a class registered as env `name` (envs/make.py, after importing "module:Class")."""
        check_env(self.base, name, cls)
