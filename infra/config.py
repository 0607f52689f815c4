"""Resuming a run's configuration: the mechanics of `--resume RUN`, for any config dataclass.

A resumed run continues the same experiment: it takes the flags its checkpoint's config.json
recorded, and the command line may change only the flags the script names as changeable
(`ResumeRules.may_change`: how long it runs, how often it evaluates, how it trades memory for time).
`--resume CHECKPOINT --output-dir NEW` branches: a new run folder that continues from that
checkpoint. What each flag means, and which may change, is the script's (flags/parse.py's
RESUME_RULES for train.py); this file knows none of them.
"""
from __future__ import annotations

import json
import sys
import types
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, Literal

from errors import UserError
from infra.checkpoint import (find_checkpoint, read_config, read_iteration, read_json, repair_latest, run_checkpoints,
                              run_dir_of)
from infra.cli import with_current_names


@dataclass(frozen=True)
class ResumeRules:
    """What a script's flags say of a resume (flags/parse.py's RESUME_RULES for train.py)."""

    may_change: tuple[str, ...]  # flags a resume may change; every other one is the run's
    session_only: tuple[str, ...]  # not given on a resume: their default, not the last session's
    later_flags: tuple[str, ...]  # added after some runs were saved: absent from one, their default
    normalize: Callable[[dict, dict], dict]  # (given, saved) -> given, as the run records such values
    # (`none` included: what the flag left out would be)
    check: Callable[[object], None]  # the script's checks of a complete config (raise UserError)


def resume_args(cls, given: dict, rules: ResumeRules):
    """The saved run's flags (an instance of `cls`), with the allowed changes; refuse the others,
    naming the flag. A run folder stopped before its first checkpoint restarts from iteration 1
    with its saved flags. --resume CHECKPOINT --output-dir NEW branches: a new run folder that
    continues from that checkpoint (any of the run's, the newest or an older one)."""
    folder = Path(given["resume"])
    fresh = (folder / "config.json").is_file() and not (folder / "state.json").is_file() and not run_checkpoints(folder)
    if fresh:  # killed before its first checkpoint: nothing to restore but the flags
        ckpt, run_dir = None, folder
        saved = with_current_names(read_json(folder / "config.json", "the run's training flags"))
    else:
        ckpt = find_checkpoint(folder)
        run_dir = run_dir_of(ckpt)
        saved = read_config(ckpt)
    given = rules.normalize(given, saved)
    out = Path(given["output_dir"]) if "output_dir" in given else run_dir
    branching = out.expanduser().resolve() != run_dir.expanduser().resolve()
    if branching and ckpt is None:
        raise UserError(f"{folder} holds no checkpoint to branch from; continue it with --resume {folder} alone")
    if branching and (run_checkpoints(out) or (out / "config.json").exists()):
        raise UserError(f"--output-dir {out} already holds a run: a branch starts a new run folder; choose another")
    if not branching and ckpt is not None and ckpt == run_dir:
        raise UserError(f"{ckpt} is a checkpoint on its own, not a run folder: branch a new run from it with "
                        f"python train.py --resume {ckpt} --output-dir NEW_FOLDER")
    if not branching and ckpt is not None and find_checkpoint(run_dir) != ckpt:
        raise UserError(f"--resume {ckpt} would redo the iterations after it, but {run_dir} holds the newer "
                        f"{find_checkpoint(run_dir).name}; resume the run folder, or branch a new run from that "
                        f"checkpoint with --output-dir NEW_FOLDER")
    if not branching and ckpt is not None:
        check_unedited(run_dir, ckpt, saved, rules.may_change)
        repair_latest(run_dir)  # before any refusal below: a finished run's resume is refused
    where = (ckpt or run_dir) / "config.json"
    problems = config_type_errors(cls, saved)
    known = {f.name for f in fields(cls)}
    absent = [k for k in known if k not in saved and k not in rules.may_change]
    problems += [f"field {k!r} is missing" for k in absent if k not in rules.later_flags]
    if problems:
        raise UserError(f"{where}: " + "; ".join(problems) + " (not a complete train.py config)")
    for k in absent:
        print(f"note: {where} has no {k!r} (a run from before that flag): taking {getattr(cls, k)!r}",
              file=sys.stderr)
    changed = [k for k, v in given.items() if k not in rules.may_change and k in saved and saved[k] != v]
    if changed:
        flags = ", ".join(f"--{k.replace('_', '-')} (run: {saved[k]!r}, given: {given[k]!r})" for k in changed)
        raise UserError(f"--resume continues the same experiment; these flags would change it: {flags}. "
                        "Start a new run (another --output-dir) to change them.")
    once = {f.name: f.default for f in fields(cls) if f.name in rules.session_only and f.name not in given}
    args = cls(**{**{k: v for k, v in saved.items() if k in known}, **once, **given})
    args.output_dir, args.resume = str(out), None if ckpt is None else str(ckpt)
    done = read_iteration(ckpt) if ckpt is not None else 0
    if "iterations" in given and given["iterations"] <= done:
        raise UserError(f"--iterations {given['iterations']}: {ckpt} is at iteration {done} already, so nothing would "
                        f"run; pass more than {done} to continue it")
    try:
        rules.check(args)
    except UserError as err:  # a value the user did not give is the saved config's, not a flag's
        own = [k for k in saved if k not in given and f"--{k.replace('_', '-')} " in f"{err} "]
        if not own:
            raise
        raise UserError(f"{where} holds a value train.py refuses (edited or damaged: {', '.join(own)}): {err}") from None
    return args


def check_unedited(run_dir: Path, ckpt: Path, saved: dict, may_change: tuple[str, ...]) -> None:
    """The run folder's config.json says what its checkpoint's does, but for the flags a resume may
    change: a hand edit would otherwise be discarded without a word (a resume takes the checkpoint's)."""
    path = run_dir / "config.json"
    if not path.exists():
        return
    try:
        edited = with_current_names(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        edited = None
    if not isinstance(edited, dict):
        raise UserError(f"{path} is not a JSON object of flags (edited or damaged): a resume continues from "
                        f"{ckpt / 'config.json'}; copy that file back over it to resume")
    differ = sorted(k for k in set(edited) | set(saved) if k not in may_change and edited.get(k) != saved.get(k))
    if differ:
        shown = ", ".join(f"{k}: {edited.get(k)!r} (checkpoint: {saved.get(k)!r})" for k in differ[:3])
        raise UserError(f"{path} was edited ({shown}): a resume continues with its checkpoint's flags, "
                        f"{ckpt / 'config.json'}. Copy that file back to resume, or start a new run with the "
                        "changed flags (--iterations and the other flags a resume may change go on the command line)")


def config_type_errors(cls, saved: dict) -> list[str]:
    """Each saved flag whose JSON value does not fit its type in `cls` (a hand-edited or crafted config.json)."""
    hints, problems = typing.get_type_hints(cls, include_extras=False), []
    for name, value in saved.items():
        if name not in hints:
            continue
        union = typing.get_origin(hints[name]) in (typing.Union, types.UnionType)
        kinds = typing.get_args(hints[name]) if union else (hints[name],)
        ok = False
        for kind in kinds:
            if kind is type(None):
                ok |= value is None
            elif typing.get_origin(kind) is Literal:
                ok |= value in typing.get_args(kind)
            elif kind in (int, float):  # JSON writes 1e-4 as a float and 2 as an int; a bool is neither
                ok |= isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool)
            else:
                ok |= isinstance(value, kind)
        if not ok:
            problems.append(f"field {name!r} should be {hints[name]}, found {value!r:.40}")
    return problems
