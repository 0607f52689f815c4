"""Command line from a config dataclass: one flag per field, its help from the field's docstring.

`field_name: type = default` followed by a docstring line (cleanrl's `Args`), or with a trailing
`# help text`, becomes `--field-name` with that help, listed under its class (a dataclass that
extends another shows its own flags first, then the other's, each under a heading); booleans get
`--flag / --no-flag`; `Literal[...]` fields accept only their listed values; `X | None` fields
take X, or `none` for None. Built on the standard library's argparse (no other dependency);
this file only reads the dataclass.

User errors (a bad flag value, missing or corrupt data, a bad checkpoint) are `UserError`s:
`run(main)` prints them as one line and exits with code 2, no traceback. Programming errors
are not caught and keep their traceback.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import errno
import inspect
import math
import os
import re
import sys
import textwrap
import typing
from pathlib import Path

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
    sys.stdout, sys.stderr = GuardedStream(sys.stdout, "output"), GuardedStream(sys.stderr, "error")
    try:
        result = main()
        code = 0 if result is None or result else 1
    except UserError as err:
        _close_progress_bars()
        _say(f"error: {err}")
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


_NUMBER = re.compile(r"^-(\d|\.\d|inf|infinity|nan)", re.IGNORECASE)


def _join_negative_values(argv: list[str]) -> list[str]:
    """`--lr -1e-3` and `--lr -inf` as `--lr=-1e-3`: argparse would read a value that starts with
    '-' and is not a plain decimal as another flag ("expected one argument")."""
    out = []
    for tok in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and _NUMBER.match(tok):
            out[-1] = f"{out[-1]}={tok}"
        else:
            out.append(tok)
    return out


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line (the usage of 50 flags would bury it)."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        return super().parse_known_args(_join_negative_values(list(sys.argv[1:] if args is None else args)), namespace)


def field_help(cls) -> dict[str, str]:
    """Each field's help: the docstring under it, or its trailing comment, in the source of the class
    (and of the dataclasses it extends)."""
    helps = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        source = textwrap.dedent(inspect.getsource(klass))
        lines, body = source.splitlines(), ast.parse(source).body[0].body
        for node, after in zip(body, body[1:] + [None]):
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            doc = after.value.value if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) else None
            comment = re.search(r"#\s*(.+)$", lines[node.end_lineno - 1])
            if isinstance(doc, str):
                helps[node.target.id] = " ".join(doc.split())
            elif comment:
                helps[node.target.id] = comment.group(1).strip()
    return helps


def ordered_fields(cls) -> list:
    """The dataclass's fields, its own before those of the classes it extends (--help lists them so)."""
    own = set(cls.__dict__.get("__annotations__", {}))
    fields = dataclasses.fields(cls)
    return [f for f in fields if f.name in own] + [f for f in fields if f.name not in own]


def _declared_by(cls) -> dict[str, type]:
    """The dataclass in cls's lineage that declares each field (its own, or one it extends)."""
    owners = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        owners.update({name: klass for name in klass.__dict__.get("__annotations__", {})})
    return owners


def _optional(kind):
    """A converter for `X | None` fields: 'none' (any case) means None, anything else is an X."""

    def convert(text: str):
        return None if text.lower() == "none" else kind(text)

    convert.__name__ = kind.__name__  # argparse names the type in its error messages
    return convert


def build_parser(cls, description: str | None = None, defaults: dict | None = None, suppress: bool = False):
    """A parser for `cls`. defaults: overrides of the dataclass defaults (shown in --help).
    suppress: flags not given are left out of the result (to learn which flags were given)."""
    parser = _Parser(prog=_prog(), description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
                     argument_default=argparse.SUPPRESS if suppress else None, add_help=not suppress)
    helps, hints, defaults = field_help(cls), typing.get_type_hints(cls), defaults or {}
    owners, groups = _declared_by(cls), {}
    for f in ordered_fields(cls):
        flag = "--" + f.name.replace("_", "-")
        kind = hints[f.name]
        optional = type(None) in typing.get_args(kind)
        if optional:  # X | None
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
        default = defaults.get(f.name, f.default)
        kw = {} if suppress else {"default": default}
        help_text = f"{helps.get(f.name, '')} (default: {default})"
        owner = owners[f.name]
        if owner not in groups:  # one heading per class: its name and its docstring's first sentence
            title = " ".join((inspect.getdoc(owner) or "").split()).split(". ")[0].rstrip(".")
            groups[owner] = parser.add_argument_group(f"{owner.__name__}, {title}")
        group = groups[owner]
        if kind is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_text, **kw)
        elif typing.get_origin(kind) is typing.Literal:
            choices = list(typing.get_args(kind))
            group.add_argument(flag, choices=choices, help=help_text, metavar="{" + ",".join(choices) + "}", **kw)
        else:
            group.add_argument(flag, type=_optional(kind) if optional else kind, help=help_text,
                               metavar=f.name.upper(), **kw)
    return parser


def given_flags(cls, argv: list[str]) -> dict:
    """The fields the command line sets explicitly, with their values (nothing else)."""
    return vars(build_parser(cls, suppress=True).parse_known_args(argv)[0])


def parse_dataclass(cls, argv: list[str] | None = None, description: str | None = None, defaults: dict | None = None):
    """Parse argv (default: sys.argv[1:]) into an instance of the dataclass `cls`."""
    ns = build_parser(cls, description, defaults).parse_args(argv)
    return cls(**vars(ns))


RENAMED_FLAGS = {"mult_eps": "eps_m"}  # flags renamed since some runs were saved: old name -> new


def with_current_names(config: dict) -> dict:
    """A saved config.json's flags under today's names (a run saved as --mult-eps resumes as --eps-m)."""
    return {RENAMED_FLAGS.get(k, k) if RENAMED_FLAGS.get(k) not in config else k: v for k, v in config.items()}


SEED_LIMIT = 2**32  # torch, numpy and random take seeds in [0, 2^32) (beyond: a ValueError traceback)


def seed_problems(flag: str, seeds: list[int]) -> list[str]:
    return [f"{flag} must be in [0, 2^32); got {seed}" for seed in seeds if not 0 <= seed < SEED_LIMIT]


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
