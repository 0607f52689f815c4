"""The reading guide (docs/reading-guide.md) and the exercises' README name only what exists:
every file, every function or class at its line (`file.py:LINE name`; a drifted line fails),
`module.name`, every notebook cell (`NN § heading`) and every METHOD.md section; and the five
reading path (README, METHOD, the pipeline files, the env interface) stays short and narrow."""
import ast
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GUIDES = [ROOT / "docs" / "reading-guide.md", ROOT / "exercises" / "README.md"]


def definition_line(path: Path, dotted: str) -> int | None:
    """The line where `dotted` (a top-level name, or Class.method) is defined in the Python file;
    None when it is not."""
    scope, line = ast.parse(path.read_text()).body, None
    for part in dotted.split("."):
        found = [n for n in scope if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part] + \
            [n for n in scope if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == part for t in n.targets)]
        if not found:
            return None
        scope, line = getattr(found[0], "body", []), found[0].lineno
    return line


def defined(path: Path, dotted: str) -> bool:
    """Whether `dotted` (a top-level name, or Class.method) is defined in the Python file."""
    return definition_line(path, dotted) is not None


def test_every_reference_in_the_reading_guides_exists():
    sections = set(re.findall(r"^## (\d+)\. ", (ROOT / "METHOD.md").read_text(), re.M))
    headings = {}
    for nb in (ROOT / "notebooks").glob("*.ipynb"):
        cells = json.loads(nb.read_text())["cells"]
        headings[nb.name[:2]] = {"".join(c["source"]).splitlines()[0].lstrip("# ").strip()
                                 for c in cells if c["cell_type"] == "markdown" and c["source"]}
    checked = 0
    for guide in GUIDES:
        text = guide.read_text()
        for file, line, name in re.findall(r"`([\w/]+\.py):(\d+) ([\w.]+)`", text):
            assert (ROOT / file).is_file() and defined(ROOT / file, name), f"{guide.name}: {file}:{name}"
            now = definition_line(ROOT / file, name)
            assert int(line) == now, f"{guide.name}: `{file}:{line} {name}` has drifted: write `{file}:{now} {name}`"
            checked += 1
        assert not re.findall(r"`[\w/]+\.py:[a-z_]", text), f"{guide.name}: code named without its line"
        for module, name in re.findall(r"`((?:advantage|segments|rollout|train|eval))\.(\w+)`", text):
            if name == "py":
                continue  # a file name, checked below
            assert defined(ROOT / f"{module}.py", name), f"{guide.name}: {module}.{name}"
            checked += 1
        for path in re.findall(r"`([\w/.-]+\.(?:py|ipynb|md))`", text):
            assert (ROOT / path).is_file() or (guide.parent / path).is_file(), f"{guide.name}: {path}"
            checked += 1
        for number, heading in re.findall(r"\b(\d\d) § ([^|\n]+?)\s*(?:\||$)", text, re.M):
            assert heading in headings.get(number, set()), f"{guide.name}: notebook {number} has no cell '{heading}'"
            checked += 1
        for n in re.findall(r"METHOD\.md section (\d+)", text):
            assert n in sections, f"{guide.name}: METHOD.md section {n}"
            checked += 1
    assert checked >= 40


# The reading path: what a reader opens to understand SHARPO and GRPO, in the README's order.
READING_PATH = ("README.md", "METHOD.md", "segments.py", "advantage.py", "rollout.py", "train.py",
                "envs/__init__.py")


def test_the_reading_path_reads_in_one_sitting():
    """What a reader opens first reads without scrolling sideways and in one sitting: no line of the
    reading path (or of eval.py) is over 100 characters, and the reading path holds at most 75,000
    characters together (the baselines, the [speed] passes, the flags and infra/ sit outside it)."""
    long = [f"{name}:{k} ({len(line)})" for name in READING_PATH + ("eval.py",)
            for k, line in enumerate((ROOT / name).read_text().splitlines(), start=1) if len(line) > 100]
    assert not long, f"lines over 100 characters: {', '.join(long)}"
    sizes = {name: len((ROOT / name).read_text(encoding="utf-8")) for name in READING_PATH}
    assert sum(sizes.values()) <= 75_000, f"the reading path holds {sum(sizes.values())} characters: {sizes}"
