"""Command line from a config dataclass, built by tyro: one flag per field, its help from the field's
docstring (cleanrl's `Args`) or trailing comment; booleans get `--flag / --no-flag`; `Literal[...]`
fields accept only their listed values; `X | None` fields take X, or `none` for None; a float field
typed `float_in("(0, 1]")` takes the values it computes with, checked by check_domains. Kept here, on
top of tyro: which flags a command line gave (a preset's defaults yield to them, a resume may change
only some), read from tyro's own parse, and a bad command line as one line (tyro draws a framed box).
This file knows no script's flags (each script hands it its dataclass) but the renamed ones: a saved
run's config.json may still hold an old name, which every reader maps (RENAMED_FLAGS).

User errors (a bad flag value, missing or corrupt data, a bad checkpoint) are `UserError`s:
`run(main)` prints them as one line and exits with code 2, no traceback. Programming errors
are not caught and keep their traceback.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import gc
import math
import os
import sys
import types
import typing
from pathlib import Path

import tyro
import tyro._errors
from tyro.constructors import ConstructorRegistry, PrimitiveConstructorSpec

from errors import (DataError, OutputLost, Stopped, Terminated, UserError, catch_sigterm,  # noqa: F401
                    ignore_stops, stop_line)  # (DataError: re-exported)

LOST_OUTPUT = {errno.EPIPE: ("closed (its reader left: a broken pipe)", 141),
               errno.ENOSPC: ("full (no space left on its device)", 74)}
# What a symbol becomes on a stream that cannot write it (LC_ALL=C, PYTHONIOENCODING=ascii); any other
# character it cannot write becomes "?".
ASCII_FALLBACK = str.maketrans({"\u00b1": "+-", "\u00d7": "x", "\u2014": "-", "\u2013": "-", "\u2026": "...",
                                "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2264": "<=",
                                "\u2265": ">=", "\u2192": "->", "\u00b2": "2"})


class GuardedStream:
    """sys.stdout or sys.stderr, whose failure is a stop, not a crash: the first write to a pipe whose
    reader left (`| head`) or to a full device (`> /dev/full`) raises OutputLost, which unwinds like
    SIGTERM (a run keeps its checkpoint and says so); later writes to it go nowhere."""

    def __init__(self, stream, name: str):
        self._stream, self._name, self.lost = stream, name, False

    def write(self, text):
        try:
            return self._guard(self._stream.write, text)
        except UnicodeEncodeError:  # the stream's encoding cannot hold a character: its nearest ASCII
            encoding = getattr(self._stream, "encoding", None) or "ascii"
            plain = text.translate(ASCII_FALLBACK).encode(encoding, "replace").decode(encoding)
            return self._guard(self._stream.write, plain)

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
    gc.freeze()  # the imports' ~400,000 objects (train.py's) left out of every later full collection
    # (0.19 s each) and out of the one at exit (docs/scaling.md); they live to the end anyway
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


def choice_of(names) -> type:
    """A str flag whose value must be one of a registry's names (envs.ENVS, baselines.ALGORITHMS),
    checked against the registry when the flags are checked, so that an entry registered later
    counts too; --help lists the names registered when the flag was declared."""
    return typing.Annotated[str, tyro.conf.arg(metavar="{" + ",".join(names) + "}")]


def _tyro(cls, argv: list[str], description: str | None, defaults: dict, add_help: bool = True,
          unknown: bool = False):
    """tyro.cli over the dataclass `cls` (its groups as --help's sections, `defaults` over its own);
    a rejected command line is a UserError of one line, built from tyro's parse-error event."""
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
    shell = _completion_shell(argv)
    if shell is not None and shell not in COMPLETION_SHELLS:
        raise UserError(f"{argv[0]} {shell!r}: tyro writes completion scripts for {', '.join(COMPLETION_SHELLS)}")
    try:
        with tyro._errors.on_parse_error(_refuse):
            parsed = tyro.cli(target, args=argv, prog=_prog(), description=description, default=default,
                              add_help=add_help, return_unknown_args=unknown, registry=NONE_IN_ANY_CASE)
    except OSError as err:  # the file of --tyro-write-completion
        if shell is None:
            raise
        raise UserError(f"{argv[0]}: cannot write {err.filename} ({err.strerror}): pass another file") from None
    parsed, rest = parsed if unknown else (parsed, [])
    values = (dataclasses.asdict(parsed) if len(groups) == 1 else
              {k: v for part in dataclasses.fields(parsed) for k, v in dataclasses.asdict(getattr(parsed, part.name)).items()})
    hints = typing.get_type_hints(cls)
    for name, value in values.items():  # `none` for None, in any case, as the docs write it
        if isinstance(value, str) and value.lower() == "none" and type(None) in typing.get_args(hints[name]):
            values[name] = None
    takes_empty = {f.name for f in dataclasses.fields(cls) if f.default == ""}  # "" is their default: a value
    empty = [f"--{name.replace('_', '-')}" for name, value in values.items() if value == "" and name not in takes_empty]
    if empty:  # an empty value (an unset $RUN) is never the flag left out: no default stands in
        raise UserError(f"{', '.join(empty)} '' is empty: give {'it' if len(empty) == 1 else 'each'} a value, or "
                        "leave the flag out for its default")
    return values, rest


COMPLETION_SHELLS = ("bash", "zsh", "tcsh", "fish")  # those tyro writes a completion script for


def _completion_shell(argv: list[str]) -> str | None:
    """The SHELL of tyro's own flags, which it reads before the parse when one comes first on the
    command line (`--tyro-print-completion SHELL`, `--tyro-write-completion SHELL FILE`), else None."""
    flag = argv[0].replace("_", "-") if argv else None
    if (flag == "--tyro-print-completion" and len(argv) >= 2) or (flag == "--tyro-write-completion" and len(argv) >= 3):
        return argv[1]
    return None


def _none_rule(type_info):
    """tyro's rule for the None of an `X | None` flag, taking `none` as well as `None` (as the docs say)."""
    if type_info.type is not type(None):
        return None
    return PrimitiveConstructorSpec(nargs=1, metavar="{None}", choices=("None", "none", "NONE"),
                                    instance_from_str=lambda args: None, is_instance=lambda x: x is None,
                                    str_from_instance=lambda instance: ["None"])


NONE_IN_ANY_CASE = ConstructorRegistry()
NONE_IN_ANY_CASE.primitive_rule(_none_rule)


def _refuse(event) -> None:
    """tyro's parse-error hook: the event it is about to draw as a framed box, raised as one line.
    tyro 1.0 gives the failure as a structured event only through this hook (tyro._errors, which
    its docs call internal: requirements.txt pins tyro); an event of a kind not named here keeps
    its kind's name."""
    E = tyro._errors
    name = getattr(getattr(event, "argument", None), "display_name", lambda: "a flag")()
    if isinstance(event, E.InvalidChoice):
        why = f"invalid choice {event.value!r} for argument {name!r}: choose one of {', '.join(event.choices)}"
    elif isinstance(event, E.UnrecognizedArgs):
        why = f"Unrecognized options: {' '.join(event.tokens)}"
    elif isinstance(event, E.InstantiationFailure):
        why = f"error parsing {name}: {event.message}"
    elif isinstance(event, E.BadValue):
        why = (f"missing value for argument {name}" if event.offending_value is None
               else f"argument {name} takes no value; got {event.offending_value!r}")
    elif isinstance(event, E.MissingArgs):
        why = "missing " + ", ".join(a.arg.display_name() for a in event.missing_arguments)
    else:
        why = f"the command line was refused ({type(event).__name__})"
    raise UserError(f"{why} (see --help)")


def parse_dataclass(cls, argv: list[str] | None = None, description: str | None = None,
                    defaults: dict | None = None):
    """Parse argv (default: sys.argv[1:]) into an instance of the dataclass `cls`, with tyro: one
    flag per field, its help from the field's docstring or comment, `defaults` over the dataclass's
    (shown in --help), the groups of groups_of(cls) as --help's sections. `X | None` fields take
    `none` (any case) for None. A bad command line is a UserError of one line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    values, _ = _tyro(cls, argv, description, defaults or {})
    return cls(**values)


HELP = ("-h", "--help")


def given_flags(cls, argv: list[str], defaults: dict | None = None) -> tuple[dict, bool]:
    """(the fields the command line sets, with their values; whether it asks for --help), from tyro's
    own parse: argv read twice, over the dataclass's defaults and over another value for every field.
    A field the command line sets reads the same both times, in whatever spelling tyro took it
    (`--max-steps 5`, `--max_steps=5`, `--no-plain`); a field it leaves reads its two defaults. A bad
    command line is a UserError; --help is reported, not printed (the caller prints it, with the
    defaults it will use)."""
    defaults = {f.name: (defaults or {}).get(f.name, f.default) for f in dataclasses.fields(cls)}
    first, rest = _tyro(cls, argv, None, defaults, add_help=False, unknown=True)
    asked = any(token in HELP for token in rest)
    if [token for token in rest if token not in HELP]:  # what tyro did not take: its own error
        _tyro(cls, [a for a in argv if a not in HELP], None, defaults)
    hints = typing.get_type_hints(cls)
    other = {name: _another(hints[name], value) for name, value in defaults.items()}
    second, _ = _tyro(cls, argv, None, other, add_help=False, unknown=True)
    return {k: v for k, v in first.items() if _same(v, second[k])}, asked


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _another(hint, value):
    """A valid value of the type `hint` other than `value` (given_flags' second default)."""
    kinds = [k for k in typing.get_args(hint)] if typing.get_origin(hint) in (typing.Union, types.UnionType) else [hint]
    for kind in kinds:
        if kind is type(None):
            if value is not None:
                return None
        elif typing.get_origin(kind) is typing.Literal:
            choices = [c for c in typing.get_args(kind) if c != value]
            if choices:
                return choices[0]
        elif kind is bool:
            return not value
        elif kind in (int, float):
            return kind(1) if value is None or value != value or value == 0 else kind(0)
        elif kind is str:
            return "x" if value != "x" else "y"
    raise TypeError(f"no second default for a field of type {hint}")


RENAMED_FLAGS = {"mult_eps": "eps_m"}  # flags renamed since some runs were saved: old name -> new


def with_current_names(config: dict) -> dict:
    """A saved config.json's flags under today's names (a run saved as --mult-eps resumes as --eps-m)."""
    return {RENAMED_FLAGS.get(k, k) if RENAMED_FLAGS.get(k) not in config else k: v for k, v in config.items()}


SEED_LIMIT = 2**32  # torch, numpy and random take seeds in [0, 2^32) (beyond: a ValueError traceback)


def seed_problems(flag: str, seeds: list[int]) -> list[str]:
    return [f"{flag} must be in [0, 2^32); got {seed}" for seed in seeds if not 0 <= seed < SEED_LIMIT]


@dataclasses.dataclass(frozen=True)
class Interval:
    """The values a float flag computes with, written as a reader writes them: "(0, 1]" (a bracket
    holds its end, a parenthesis does not; inf: no end), and `also`, one value outside it that means
    something of its own (a temperature's 0: greedy)."""

    text: str
    also: float | None = None

    def __contains__(self, value: float) -> bool:
        low, high = (float(end) for end in self.text[1:-1].split(","))
        above = value >= low if self.text[0] == "[" else value > low  # a nan is neither
        below = value <= high if self.text[-1] == "]" else value < high
        return value == self.also or (above and below)

    def __str__(self) -> str:
        return f"in {self.text}" if self.also is None else f"{self.also:g} or in {self.text}"


def float_in(interval: str, also: float | None = None) -> type:
    """The type of a float flag that takes the values of `interval` (Interval), and `also`: check_domains
    refuses any other (a nan, an inf, a number whose computation overflows or divides by nearly 0) in
    one line, with this range."""
    values = Interval(interval, also)  # --help shows them: `--lr FLOAT in (0, 1]`
    return typing.Annotated[float, values, tyro.conf.arg(metavar=f"FLOAT {values}")]


def flag_type(cls, name: str) -> type:
    """The type, range included, that the flags' dataclass `cls` declares for `name`: for a script's
    flag that is another script's (tools.credit's --eps-m is train.py's)."""
    return typing.get_type_hints(cls, include_extras=True)[name]


def check_domains(args, positive: tuple = (), non_negative: tuple = ()) -> list[str]:
    """Problems with numeric flags, one string each, naming the flag: each float flag outside the
    values its type declares (float_in), each integer flag of `positive` or `non_negative` below that,
    and --seed out of its range, when the flags have one."""
    problems = seed_problems("--seed", [args.seed]) if isinstance(getattr(args, "seed", None), int) else []
    for name, hint in typing.get_type_hints(type(args), include_extras=True).items():
        for interval in [m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Interval)]:
            if getattr(args, name) not in interval:
                problems.append(f"--{name.replace('_', '-')} must be {interval}; got {getattr(args, name)}")
    for name in positive + non_negative:
        value, flag = getattr(args, name), "--" + name.replace("_", "-")
        if value is not None and name in positive and not value > 0:
            problems.append(f"{flag} must be > 0; got {value}")
        elif value is not None and name in non_negative and not value >= 0:
            problems.append(f"{flag} must be >= 0; got {value}")
    return problems
