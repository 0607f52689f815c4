"""Command line from a config dataclass, built by tyro: one flag per field, its help from the field's
docstring (cleanrl's `Args`) or trailing comment; booleans get `--flag / --no-flag`; `Literal[...]`
fields accept only their listed values; `X | None` fields take X, or `none` for None. What tyro does
not give, kept here: the flags a command line gave (a preset's defaults yield to them, a resume may
change only some), and a bad command line as one line (tyro draws a framed message).

User errors (a bad flag value, missing or corrupt data, a bad checkpoint) are `UserError`s:
`run(main)` prints them as one line and exits with code 2, no traceback. Programming errors
are not caught and keep their traceback.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import io
import math
import os
import re
import sys
import typing
from pathlib import Path

import tyro

from envs import history_length

from errors import (DataError, OutputLost, Stopped, Terminated, UserError, catch_sigterm,  # noqa: F401
                    ignore_stops, stop_line)  # (DataError: re-exported)

LOST_OUTPUT = {errno.EPIPE: ("closed (its reader left: a broken pipe)", 141),
               errno.ENOSPC: ("full (no space left on its device)", 74)}


class GuardedStream:
    """sys.stdout or sys.stderr, whose failure is a stop, not a crash: the first write to a pipe whose
    reader left (`| head`) or to a full device (`> /dev/full`) raises OutputLost, which unwinds like
    SIGTERM (a run keeps its checkpoint and says so); later writes to it go nowhere."""

    def __init__(self, stream, name: str):
        self._stream, self._name, self.lost = stream, name, False

    def write(self, text):
        return self._guard(self._stream.write, text)

    def flush(self):
        return self._guard(self._stream.flush)

    def _guard(self, call, *args):
        if self.lost:
            return len(args[0]) if args else None
        try:
            return call(*args)
        except OSError as err:
            if err.errno not in LOST_OUTPUT:
                raise
            self.lost = True
            with contextlib.suppress(OSError, ValueError):  # what Python flushes at exit goes nowhere either
                os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())
            why, code = LOST_OUTPUT[err.errno]
            raise OutputLost(f"standard {self._name} {why}", code) from None

    def __getattr__(self, name):
        return getattr(self._stream, name)


def run(main) -> None:
    """Entry point of a script: user errors become one line on stderr and exit code 2; SIGINT, SIGTERM,
    SIGHUP and a closed or full output stream one line saying what was kept (a run's own, from
    train.py) and 130, 143, 129, 141 or 74."""
    catch_sigterm()
    streams = sys.stdout, sys.stderr
    for name in ("stdout", "stderr"):  # a stream closed at start (`>&-`) is None: its lines go nowhere
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))
    sys.stdout, sys.stderr = GuardedStream(sys.stdout, "output"), GuardedStream(sys.stderr, "error")
    try:
        result = main()
        code = 0 if result is None or result else 1
    except UserError as err:
        _close_progress_bars()
        _say(f"error: {err}")
        code = 2
    except OSError as err:  # a name longer than the file system takes, in any path flag of any script
        if err.errno != errno.ENAMETOOLONG:
            raise
        _close_progress_bars()
        _say(f"error: a path has a name longer than the file system allows (255 bytes a folder or file "
             f"name on most): {str(err.filename)[:80]}...; shorten it")
        code = 2
    except KeyboardInterrupt as err:
        _close_progress_bars()
        how = err.how if isinstance(err, Stopped) else (err if isinstance(err, Terminated) else False)
        line, code = stop_line(how, str(err) if isinstance(err, Stopped) else "stopped before it finished")
        _say(line)
    finally:
        ignore_stops()
        if not (sys.stdout.lost or sys.stderr.lost):  # a lost stream stays guarded: Python flushes it at exit
            sys.stdout, sys.stderr = streams
    raise SystemExit(code)


def _say(line: str) -> None:
    """The script's last line: on stderr, or on stdout when stderr is the stream that was lost."""
    for stream in (sys.stderr, sys.stdout):
        if not getattr(stream, "lost", False):
            with contextlib.suppress(OSError, KeyboardInterrupt):
                print(line, file=stream, flush=True)
            return


def _close_progress_bars() -> None:
    """The bars a stop left open (tqdm's live instances): closed, so the line printed next starts
    a line of its own instead of following a half-drawn bar."""
    std = sys.modules.get("tqdm.std")
    classes, bars = ([std.tqdm] if std else []), []
    while classes:  # each tqdm class (tqdm.auto's is a subclass) keeps its own set of live bars
        cls = classes.pop()
        classes += cls.__subclasses__()
        bars += list(cls.__dict__.get("_instances", ()))
    for bar in bars:
        bar.close()


def _prog() -> str:
    """The command as a user types it: `python -m tools.credit` for a tool, else the script's name."""
    path = Path(sys.argv[0]).resolve()
    return f"python -m tools.{path.stem}" if path.parent == Path(__file__).resolve().parent.parent / "tools" else path.name


def groups_of(cls) -> list[type]:
    """The dataclasses whose fields make up `cls`'s flags, each a group of --help: `cls` itself when
    it declares its fields, else the classes it joins (train.py's TrainArgs: the method's, the
    baselines', the run's), in its method resolution order."""
    own = [k for k in cls.__mro__ if dataclasses.is_dataclass(k) and k.__dict__.get("__annotations__")]
    return [cls] if cls in own or len(own) == 1 else own


def parse_dataclass(cls, argv: list[str] | None = None, description: str | None = None,
                    defaults: dict | None = None):
    """Parse argv (default: sys.argv[1:]) into an instance of the dataclass `cls`, with tyro: one
    flag per field, its help from the field's docstring or comment, `defaults` over the dataclass's
    (shown in --help), the groups of groups_of(cls) as --help's sections. `X | None` fields take
    `none` (any case) for None. A bad command line is a UserError of one line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    defaults = defaults or {}
    groups = groups_of(cls)

    def default_of(klass):
        names = {f.name for f in dataclasses.fields(klass)}
        return klass(**{k: v for k, v in defaults.items() if k in names})

    if len(groups) == 1:
        target, default = cls, default_of(cls)
    else:  # a wrapper whose fields are the groups, their prefixes left out: the flags stay flat
        target = dataclasses.make_dataclass(
            cls.__name__, [(k.__name__, typing.Annotated[k, tyro.conf.OmitArgPrefixes]) for k in groups])
        default = target(*[default_of(k) for k in groups])
    shown = io.StringIO()
    try:
        with contextlib.redirect_stderr(shown):
            parsed = tyro.cli(target, args=argv, prog=_prog(), description=description, default=default)
    except SystemExit as stop:
        if stop.code in (0, None):  # --help, printed
            raise
        raise UserError(f"{_one_line(shown.getvalue())} (see --help)") from None
    values = (dataclasses.asdict(parsed) if len(groups) == 1 else
              {k: v for part in dataclasses.fields(parsed) for k, v in dataclasses.asdict(getattr(parsed, part.name)).items()})
    hints = typing.get_type_hints(cls)
    for name, value in values.items():  # `none` for None, in any case, as the docs write it
        if isinstance(value, str) and value.lower() == "none" and type(None) in typing.get_args(hints[name]):
            values[name] = None
    return cls(**values)


def _one_line(box: str) -> str:
    """tyro's framed error message as one line: its title and the paragraph under it (what follows
    the next rule is help, left out). The frame is drawn in UTF-8 or ASCII, in color or not."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", box)
    lines = [line.strip(" \u2502\u256d\u256e\u2570\u256f") for line in plain.splitlines()]
    title, text = None, []
    for line in lines:
        rule = len(line) >= 3 and not line.strip("\u2500-")
        if title is None:
            title = line.strip("\u2500- ") or None  # UTF-8: the title sits in the top border
        elif rule and text:
            break
        elif line and not rule:
            text.append(line)
    text = " ".join(text)
    if not text:
        return title or "bad command line"
    return text if title is None or text.lower().startswith(title.lower()) else f"{title}: {text}"


def given_flags(cls, argv: list[str]) -> dict:
    """The fields the command line sets explicitly, with their values (nothing else): argv parsed
    (a bad one is a UserError), then each `--name`, `--name=...` or `--no-name` it holds."""
    values = vars(parse_dataclass(cls, [a for a in argv if a not in ("-h", "--help")]))
    names = {f.name.replace("_", "-"): f.name for f in dataclasses.fields(cls)}
    given = {}
    for token in argv:
        flag = token.split("=", 1)[0].removeprefix("--") if token.startswith("--") else None
        if flag in names:
            given[names[flag]] = values[names[flag]]
        elif flag and flag.startswith("no-") and flag[3:] in names:
            given[names[flag[3:]]] = values[names[flag[3:]]]
    return given


RENAMED_FLAGS = {"mult_eps": "eps_m"}  # flags renamed since some runs were saved: old name -> new


def with_current_names(config: dict) -> dict:
    """A saved config.json's flags under today's names (a run saved as --mult-eps resumes as --eps-m)."""
    return {RENAMED_FLAGS.get(k, k) if RENAMED_FLAGS.get(k) not in config else k: v for k, v in config.items()}


SEED_LIMIT = 2**32  # torch, numpy and random take seeds in [0, 2^32) (beyond: a ValueError traceback)


def seed_problems(flag: str, seeds: list[int]) -> list[str]:
    return [f"{flag} must be in [0, 2^32); got {seed}" for seed in seeds if not 0 <= seed < SEED_LIMIT]


def history_problems(value: str) -> list[str]:
    """--history's problem, if it has one (envs.history_length's rule), as check_domains gives them."""
    try:
        history_length(value)
    except ValueError as err:
        return [str(err)]
    return []


def check_domains(args, positive: tuple = (), non_negative: tuple = (), finite: tuple = ()) -> list[str]:
    """Problems with numeric flags, one string each, naming the flag (and --seed's range, when the
    flags have one)."""
    problems = seed_problems("--seed", [args.seed]) if isinstance(getattr(args, "seed", None), int) else []
    for name in positive + non_negative + finite:
        value = getattr(args, name)
        flag = "--" + name.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, float) and not math.isfinite(value):
            problems.append(f"{flag} must be a finite number; got {value}")
        elif name in positive and not value > 0:
            problems.append(f"{flag} must be > 0; got {value}")
        elif name in non_negative and not value >= 0:
            problems.append(f"{flag} must be >= 0; got {value}")
    return problems
