"""Notebooks: run the walkthroughs top to bottom and save them with their outputs, so that a reader
browsing the repository sees every table and picture.

The saved outputs are made portable and small, so that running this again leaves a small diff:
  - stderr (progress bars, library notices) is dropped; stdout, results and pictures are kept;
  - absolute paths (the repository, temporary folders, the home folder) become `<repo>`, `<tmp>`, `~`;
  - timings (`12.3s`, `4.1 s/it`, seconds per stage) become `<time>`;
  - execution counts and per-cell timing metadata are cleared;
  - a picture over 200 kB is an error (make it smaller in the notebook).
tests/test_notebooks.py re-executes every notebook, checks the committed ones obey these rules,
and checks that a fresh run, cleaned the same way, still does.

Run: python -m tools.notebooks               (all five, a few minutes on 2 CPU cores)
     python -m tools.notebooks --names 02_one_training_iteration.ipynb
"""
from __future__ import annotations

import errors  # first: a Ctrl-C or kill while the imports below load is one line

errors.quiet_start(__name__)
# isort: split

import base64
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from infra.cli import UserError, parse_dataclass, run

ROOT = Path(__file__).resolve().parent.parent
NB_DIR = ROOT / "notebooks"
MAX_PICTURE_BYTES = 200_000
TIMING = re.compile(r"\b\d+(?:\.\d+)?\s?(?:s/it|it/s|s/batch|batch/s|s/turn|seconds|sec|ms|s)\b")


@dataclass
class NotebooksArgs:
    """Command-line flags of tools/notebooks.py."""

    names: str = ""  # comma-separated notebook file names in notebooks/; empty = all
    timeout: int = 1800  # seconds one cell may take


def scrub(text: str) -> str:
    """A text output without absolute paths or timings."""
    text = text.replace(str(ROOT), "<repo>")
    text = re.sub(re.escape(tempfile.gettempdir()) + r"/[\w.-]+", "<tmp>", text)
    text = text.replace(str(Path.home()), "~")
    return TIMING.sub("<time>", text)


def clean(nb) -> list[str]:
    """Make a notebook's outputs portable, in place; returns the problems (pictures too large)."""
    problems = []
    nb.metadata.pop("widgets", None)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        cell.execution_count = None
        cell.metadata.pop("execution", None)
        kept = []
        for out in cell.get("outputs", []):
            if out.output_type == "stream" and out.name == "stderr":
                continue
            out.pop("execution_count", None)
            if out.output_type == "stream":
                out.text = scrub(out.text)
            for kind, value in out.get("data", {}).items():
                if kind.startswith("text/"):
                    out.data[kind] = scrub(value if isinstance(value, str) else "".join(value))
            problems += [f"cell {index}: {p}" for p in large_pictures(out)]
            kept.append(out)
        cell.outputs = kept
    return problems


def portable_problems(nb) -> list[str]:
    """What in a notebook's outputs breaks the rules above (a path, a timing, a large picture)."""
    problems = []
    for index, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            texts = [out.get("text", "")] + [v for k, v in out.get("data", {}).items() if k.startswith("text/")]
            for text in texts:
                text = text if isinstance(text, str) else "".join(text)
                paths = [p for p in (str(ROOT), tempfile.gettempdir() + "/", str(Path.home()) + "/") if p in text]
                if paths:  # one problem a text (the repository itself may lie under the temporary folder)
                    problems.append(f"cell {index}: an absolute path ({paths[0]})")
                if TIMING.search(text):
                    problems.append(f"cell {index}: a timing ({TIMING.search(text).group(0)!r})")
            if out.output_type == "stream" and out.name == "stderr":
                problems.append(f"cell {index}: a stderr stream")
            problems += [f"cell {index}: {p}" for p in large_pictures(out)]
    return problems


def large_pictures(out) -> list[str]:
    """The pictures of one output over MAX_PICTURE_BYTES, each said with its size."""
    sizes = {kind: len(base64.b64decode(value)) for kind, value in out.get("data", {}).items()
             if kind.startswith("image/")}
    return [f"a {kind} of {size // 1000} kB (at most {MAX_PICTURE_BYTES // 1000} kB)"
            for kind, size in sizes.items() if size > MAX_PICTURE_BYTES]


def execute(path: Path, timeout: int = 1800):
    """The notebook at `path`, run top to bottom in notebooks/ (raises on the first failing cell)."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(NB_DIR)}}).execute()
    return nb


def main(argv: list[str] | None = None) -> None:
    args = parse_dataclass(NotebooksArgs, argv, description=__doc__)
    names = [n for n in args.names.split(",") if n] or sorted(p.name for p in NB_DIR.glob("*.ipynb"))
    missing = [n for n in names if not (NB_DIR / n).is_file()]
    if missing:
        raise UserError(f"no notebook {', '.join(missing)} in notebooks/ (there: "
                        f"{', '.join(sorted(p.name for p in NB_DIR.glob('*.ipynb')))})")
    for name in names:
        print(f"running notebooks/{name} ...", flush=True)
        nb = execute(NB_DIR / name, args.timeout)
        problems = clean(nb)
        if problems:
            raise UserError(f"notebooks/{name}: " + "; ".join(problems))
        nbformat.write(nb, NB_DIR / name)
        print(f"  saved with its outputs ({(NB_DIR / name).stat().st_size // 1000} kB)", file=sys.stderr)


if __name__ == "__main__":
    run(main)
