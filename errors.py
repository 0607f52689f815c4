"""The error types every layer raises, and the stop signals: the ground floor (imports nothing
of the project), so envs/, rollout.py and infra/ all take them from here.

A `UserError` is something the user can fix (a flag, a file, a folder); `infra.cli.run` prints
it as one line and exits with code 2. SIGINT (Ctrl-C) and SIGTERM (`kill`, a scheduler's stop)
both arrive as a `KeyboardInterrupt` (`Terminated` for SIGTERM), so one `except` stops a run
cleanly whichever came; a run folder (infra/checkpoint.py `RunFolder`) turns it into `Stopped`,
whose message says what the folder kept.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import sys
import threading
from pathlib import Path


class UserError(Exception):
    """Something the user can fix (a flag, a file, a folder): shown as one line, exit code 2."""


class DataError(UserError, ValueError):
    """Missing or malformed env data; the message names the file, the entry and the field."""


class Terminated(KeyboardInterrupt):
    """A stop from outside other than Ctrl-C, raised where the main thread was, like Ctrl-C's
    KeyboardInterrupt: SIGTERM, SIGHUP (the terminal closed), or an output stream that closed or
    filled. `why` starts the stop's line; `code` is the exit code."""

    def __init__(self, why: str = "terminated (SIGTERM)", code: int = 143):
        super().__init__(why)
        self.why, self.code = why, code


class OutputLost(Terminated):
    """Standard output or error closed (a pipe whose reader left: `| head`) or full (`> /dev/full`)."""


class Stopped(KeyboardInterrupt):
    """A run stopped by a signal; the message is the one line saying what was kept."""

    def __init__(self, kept: str, how: "bool | Terminated"):
        super().__init__(kept)
        self.how = how
        self.terminated = bool(how)  # a Terminated (SIGTERM, SIGHUP, lost output), else Ctrl-C


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def stop_line(how: "bool | Terminated", what: str) -> tuple[str, int]:
    """The one line a stop prints, and its exit code: 130 for Ctrl-C; a Terminated's own (143 for
    SIGTERM, 129 for SIGHUP, 141 for a closed output, 74 for a full one); True means SIGTERM."""
    if isinstance(how, Terminated):
        return f"{how.why}: {what}", how.code
    return f"{'terminated (SIGTERM)' if how else 'interrupted'}: {what}", 143 if how else 130


def stop_of(signum) -> KeyboardInterrupt:
    """What a stop signal becomes: Ctrl-C's KeyboardInterrupt, or a Terminated (SIGTERM, SIGHUP)."""
    if signum == signal.SIGINT:
        return KeyboardInterrupt()
    return Terminated() if signum == signal.SIGTERM else Terminated("hung up (SIGHUP)", 129)


def _raise_terminated(signum, frame):
    raise stop_of(signum)


def catch_sigterm() -> None:
    """SIGTERM and SIGHUP become `Terminated` in the main thread (the default would end the process
    at once, without a word and without closing its env workers), and SIGINT Python's
    KeyboardInterrupt."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)
        signal.signal(signal.SIGHUP, _raise_terminated)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def ignore_stops() -> None:
    """The command's work is over (done, or stopped and reported): a signal during the exit that
    follows has nothing left to stop, and would only end the process without its line."""
    if threading.current_thread() is threading.main_thread():
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)


def _stop_while_starting(signum, frame):
    """Exit at once, without unwinding: an exception raised inside a third-party import can leave
    that library half-imported and fail again on the way out (numpy did, with a RecursionError),
    and nothing has been written yet that unwinding would have to finish."""
    stop = stop_of(signum)
    line, code = stop_line(stop if isinstance(stop, Terminated) else False,
                           "stopped while starting, before anything was written")
    print(line, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(code)


def quiet_start(module: str) -> None:
    """First line of a script: while it still imports (torch and transformers take seconds), a
    SIGINT or SIGTERM ends it with one line instead of a traceback. Only for the script run
    (`module == "__main__"`); `infra.cli.run` then takes over with `catch_sigterm`."""
    if module == "__main__" and threading.current_thread() is threading.main_thread():
        for s in STOP_SIGNALS:
            signal.signal(s, _stop_while_starting)


@contextlib.contextmanager
def signals_deferred():
    """Hold SIGINT and SIGTERM until the block ends (a checkpoint, a log line): a stop lands
    before or after the block, never inside it. A signal that came meanwhile is raised at the end."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = []
    previous = {s: signal.signal(s, lambda signum, frame: held.append(signum)) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
    if held:
        raise stop_of(held[0])


# ----------------------------------------------------------------------------- file-system refusals
FS_ERRORS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "the disk quota is used up",
             errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied",
             errno.ENOTDIR: "a part of the path is a file, not a folder", errno.EISDIR: "a folder is in the way",
             errno.ENAMETOOLONG: "a file name or path is too long for the file system",
             errno.EEXIST: "a file is in the way"}
FS_MESSAGES = {"No space left": errno.ENOSPC, "Disk quota exceeded": errno.EDQUOT, "Read-only file system": errno.EROFS}


SHORT_WRITE = "unexpected pos"  # torch's zip writer when a write came back short, with no OS words at all
NEARLY_FULL = 16 * 2**20  # bytes free below which such a short write is taken for a full disk


def file_system_problem(err: BaseException, folder: Path | None = None) -> str | None:
    """What went wrong, when `err` (or what caused it) is the file system refusing a write; else None.
    safetensors and torch's zip writer report a full disk as their own error types, mostly with the
    OS's words; torch's writer sometimes only says a write came back short, which counts as a full
    disk when `folder`'s file system is (nearly) full."""
    for e in (err, err.__cause__, err.__context__):
        if isinstance(e, OSError) and e.errno in FS_ERRORS:
            return FS_ERRORS[e.errno]
        for words, code in FS_MESSAGES.items():
            if e is not None and words in str(e):
                return FS_ERRORS[code]
        if e is not None and SHORT_WRITE in str(e) and folder is not None and free_bytes(folder) < NEARLY_FULL:
            return FS_ERRORS[errno.ENOSPC]
    return None


def free_bytes(folder: Path) -> float:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return float("inf")
