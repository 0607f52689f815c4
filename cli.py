"""Command line from a config dataclass: one flag per field, its help from the field's comment.

`field_name: type = default  # help text` becomes `--field-name` with that help; booleans get
`--flag / --no-flag`; `X | None` fields take X (or stay None when not given).
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import typing

_FIELD = re.compile(r"^\s+(\w+)\s*:\s*[^=]+?=\s*.+?#\s*(.+)$")


def field_help(cls) -> dict[str, str]:
    """Each field's trailing comment in the class source."""
    helps = {}
    for line in inspect.getsource(cls).splitlines():
        m = _FIELD.match(line)
        if m:
            helps[m.group(1)] = m.group(2).strip()
    return helps


def build_parser(cls, description: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    helps = field_help(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        kind = hints[f.name]
        args = typing.get_args(kind)
        if args and type(None) in args:  # X | None
            kind = next(a for a in args if a is not type(None))
        help_text = f"{helps.get(f.name, '')} (default: {f.default})"
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=help_text)
        else:
            parser.add_argument(flag, type=kind, default=f.default, help=help_text, metavar=f.name.upper())
    return parser


def parse_dataclass(cls, argv: list[str] | None = None, description: str | None = None):
    """Parse argv (default: sys.argv[1:]) into an instance of the dataclass `cls`."""
    ns = build_parser(cls, description).parse_args(argv)
    return cls(**vars(ns))
