"""What the repository cites, it contains: every METHOD.md section cited exists, nothing points
outside the repository, and every command in README.md and docs/ runs as written."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_cited_file_and_section_exists():
    """Every 'METHOD.md section N' (or 'sections N-M') cited in code, notebooks, tests and docs
    names a section METHOD.md has, and no text points outside the repository for the method."""
    sections = {int(n) for n in re.findall(r"^## (\d+)\. ", (ROOT / "METHOD.md").read_text(), re.M)}
    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, text=True).stdout.split()  # the repository's files, no venvs or runs
    files = [ROOT / p for p in tracked if p.endswith((".py", ".md", ".ipynb"))]
    assert any(p.name == "METHOD.md" for p in files)
    cited = 0
    for path in files:
        text = path.read_text()
        if path == Path(__file__):
            continue  # this test names the strings it forbids
        assert "../shared" not in text and "SHARPO.md" not in text, path
        for a, b in re.findall(r"METHOD\.md,? sections? (\d+)(?:-(\d+))?", text):
            for n in range(int(a), int(b or a) + 1):
                assert n in sections, f"{path}: METHOD.md section {n}"
                cited += 1
        for name in re.findall(r"\b([A-Z]+\.md)\b", text):
            assert (ROOT / name).exists(), f"{path} cites {name}"
    assert cited >= 10


# The scripts a command may name, with the dataclass their flags are parsed into.
def _entry_points() -> dict:
    import eval as eval_script
    import train
    from tools import bench, compare, credit, device_check, warmstart, world

    return {"train.py": train.TrainArgs, "eval.py": eval_script.EvalArgs, "tools.credit": credit.CreditArgs,
            "tools.compare": compare.CompareArgs, "tools.bench": bench.BenchArgs, "tools.warmstart": warmstart.WarmstartArgs,
            "tools.device_check": device_check.DeviceCheckArgs, "tools.world": world.WorldArgs}


def _commands(text: str) -> list[list[str]]:
    """Every command line in a Markdown text: the lines of ``` code blocks that run something, and
    inline `python ...` / `bash ...` spans; comments dropped, `&&` chains split, env prefixes kept out."""
    import shlex

    found = []
    blocks = re.findall(r"```(?:bash|sh)?\n(.*?)```", text, re.S)
    lines = [line for block in blocks for line in block.splitlines()]
    lines += re.findall(r"`((?:OMP_NUM_THREADS=\d+ )?(?:python|bash|torchrun|accelerate launch) [^`]+)`", text)
    for line in lines:
        line = line.split("  #")[0].split(" # ")[0].strip()
        if not re.match(r"(?:[A-Z_]+=\S+ )*(?:python3?|bash|torchrun|accelerate|\S+/python) ", line):
            continue  # not a command: a file tree, a picture of a folder, output
        for part in line.split("&&"):
            words = shlex.split(part.strip())
            while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
                words = words[1:]  # an environment variable for the command
            if words and words[0] in ("python", "python3", "bash", "torchrun", "accelerate") or \
                    (words and words[0].endswith("/python")):
                found.append(words)
    return found


def _check(words: list[str], entry_points: dict) -> str | None:
    """None when the command names a file or module that exists and, for the project's scripts,
    flags their parsers accept; else what is wrong."""
    from infra.cli import UserError, parse_dataclass

    args = words[1:]
    if words[0] in ("torchrun", "accelerate"):
        args = [a for a in args if a.endswith(".py")][:1] + args[[i for i, a in enumerate(args) if a.endswith(".py")][0] + 1:] \
            if any(a.endswith(".py") for a in args) else []
        if not args:
            return "no script"
    elif words[0] == "bash":
        return None if (ROOT / args[0]).is_file() else f"{args[0]} does not exist"
    if args and args[0] == "-m":
        target, rest = args[1], args[2:]
        if target == "pip":
            return None  # pip itself, as the device call installs a carried wheel
        if target == "pytest":
            paths = [a for i, a in enumerate(rest) if not a.startswith("-") and (i == 0 or rest[i - 1] not in ("-k", "-m"))]
            return None if all((ROOT / p).exists() for p in paths) else f"pytest path missing in {rest}"
        if not (ROOT / (target.replace(".", "/") + ".py")).is_file():
            return f"module {target} does not exist"
    else:
        target, rest = args[0], args[1:]
        if not (ROOT / target).is_file():
            return f"{target} does not exist"
    cls = entry_points.get(target)
    if cls is None:
        return None
    if target == "tools.compare" and "--" in rest:
        rest, train_flags = rest[: rest.index("--")], rest[rest.index("--") + 1 :]
        if _check(["python", "train.py", *train_flags], entry_points):
            return f"train flags after --: {train_flags}"
    try:
        parse_dataclass(cls, [a for a in rest if a not in ("--help", "-h")])
    except UserError as err:
        return f"{target} rejects {rest}: {err}"
    return None


def test_every_command_in_readme_and_docs_runs_as_written(capsys):
    """Each command line in README.md and docs/*.md names a script, module or file that exists, and
    the project's own scripts accept its flags (their parsers run on the words as written)."""
    entry_points = _entry_points()
    problems, seen = [], 0
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for words in _commands(path.read_text()):
            seen += 1
            why = _check(words, entry_points)
            if why:
                problems.append(f"{path.name}: {' '.join(words)} -> {why}")
    capsys.readouterr()
    assert seen >= 15 and not problems, problems


def test_the_time_plan_counts_the_reference_pass_over_every_row():
    """docs/scaling.md's iteration plan: with the GPU default --kl-coef 0.01 the KL term reads every
    row, tied or not (tests/test_skipping.py checks the trainer does so), so the plan has a reference
    pass stage over all the rows and does not promise that ties skip them."""
    import train

    assert train.TrainArgs.kl_coef > 0 and "kl_coef" not in __import__("flags").PRESETS["gpu"]
    text = (ROOT / "docs" / "scaling.md").read_text()
    stages = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ") and line.count("|") >= 6}
    assert "reference pass" in stages and "every row" in stages["reference pass"]
    assert "ties skip rows" not in text


def test_the_preset_tables_and_the_flag_table_are_the_code_s():
    """docs/training.md's preset tables are the presets as flags/__init__.py defines them (each change
    with its reason, as a run prints them), and its flag table names every flag train.py takes."""
    import train
    from flags import preset_tables

    text = (ROOT / "docs" / "training.md").read_text()
    assert preset_tables() in text, ("docs/training.md's preset tables differ from flags/__init__.py's presets: "
                                     "paste the output of python -c 'from flags import preset_tables; "
                                     "print(preset_tables())' under its Presets heading")
    documented = set(re.findall(r"^\| (`--[^|]+)\|", text, re.M))
    flags = {f for cell in documented for f in re.findall(r"`--([\w-]+)`", cell)}
    missing = [f.name for f in __import__("dataclasses").fields(train.TrainArgs) if f.name.replace("_", "-") not in flags]
    assert not missing, f"flags without a row in docs/training.md: {missing}"


def test_the_per_card_table_is_the_calculator_s():
    """docs/scaling.md's per-card memory table is infra/memory.py's output, as train.py's check computes it."""
    from infra.memory import card_table

    assert card_table() in (ROOT / "docs" / "scaling.md").read_text(), (
        "docs/scaling.md's per-card table differs from infra/memory.py: paste python -c 'from infra.memory "
        "import card_table; print(card_table())'")


def test_the_flags_a_resume_may_change_are_the_code_s():
    """docs/runs.md's "Resuming" paragraph names every flag a resumed run may change
    (flags/__init__.py's RESUME_MAY_CHANGE), so a reader is not told a flag is refused that is not."""
    from flags import RESUME_MAY_CHANGE

    text = (ROOT / "docs" / "runs.md").read_text()
    paragraph = text[text.index("**Resuming.**"):].split("\n\n")[0]
    missing = [f for f in RESUME_MAY_CHANGE if f != "resume" and f"`--{f.replace('_', '-')}`" not in paragraph]
    assert not missing, f"docs/runs.md's Resuming paragraph omits {missing}"


def _documented_default(cell: str, value):
    """The default a docs/training.md cell states for a flag whose default is `value`, read as that
    value's type: on/off for a bool, the leading number for a number, the leading word for a name."""
    first = cell.split(" (")[0].strip().strip("`")
    if isinstance(value, bool):
        return {"on": True, "off": False}.get(first, first)
    if isinstance(value, (int, float)):
        try:
            return type(value)(float(first))
        except ValueError:
            return first
    return first


def test_the_flag_table_states_each_default_the_code_has():
    """docs/training.md's flag table gives each flag's default in the GPU setting: every stated
    default (a flag whose default is not None: those are the device's, said in words) equals the
    dataclass's value, compared as values, not only named."""
    import dataclasses

    import train

    defaults = {f.name: getattr(train.TrainArgs, f.name) for f in dataclasses.fields(train.TrainArgs)}
    text = (ROOT / "docs" / "training.md").read_text()
    text = text[text.index("| flag | default"):text.index("## Presets")]  # the flag table, not the presets'
    wrong, compared = [], 0
    for flags_cell, default_cell in re.findall(r"^\| (`--[^|]+)\| ([^|]*)\|", text, re.M):
        names = [f.replace("-", "_") for f in re.findall(r"`--([\w-]+)`", flags_cell)]
        parts = default_cell.split(", ") if len(names) > 1 else [default_cell]
        assert len(parts) == len(names), f"docs/training.md: {flags_cell} states {len(parts)} defaults"
        for name, part in zip(names, parts):
            if defaults[name] is None:
                continue
            compared += 1
            if _documented_default(part, defaults[name]) != defaults[name]:
                wrong.append(f"--{name}: docs say {part.strip()!r}, the code {defaults[name]!r}")
    assert compared >= 40 and not wrong, wrong
    from flags import MAX_EPISODES, MAX_NEW_TOKENS, MAX_OPTIMIZER_STEPS, MAX_STEPS

    limits = re.sub(r"\s+", " ", (ROOT / "docs" / "training.md").read_text())
    assert (f"more than {MAX_EPISODES} episodes an iteration, {MAX_STEPS} steps an episode, {MAX_NEW_TOKENS} new "
            f"tokens a turn or {MAX_OPTIMIZER_STEPS} optimizer steps an iteration") in limits


def test_method_md_s_table_of_defaults_is_the_code_s():
    """METHOD.md's table of what runs by default (the GPU setting beside each CPU preset) is the one
    flags.default_table() makes from the flags and presets, so its values cannot drift."""
    from flags import default_table

    assert default_table() in (ROOT / "METHOD.md").read_text(), (
        "METHOD.md's table of defaults differs from the flags: paste python -c 'from flags import "
        "default_table; print(default_table())' at the end of its section 7")


def test_the_run_folder_docs_show_every_file_a_run_writes(tmp_path, monkeypatch, capsys):
    """docs/runs.md's picture of a run folder names every file and folder a complete run writes (the
    in-loop evaluations, `latest` and the lock included), in the run folder and in a checkpoint, and
    the run keeps the newest --keep-checkpoints checkpoints it says it keeps."""
    import sys

    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    import train
    from envs import ENVS
    from stub_env import StubEnv

    torch.set_num_threads(1)
    monkeypatch.setitem(ENVS, "stub", StubEnv)
    run = tmp_path / "run"
    train.main(["--env", "stub", "--model", "tiny", "--preset", "none", "--iterations", "3", "--groups", "2",
                "--group-size", "2", "--max-new-tokens", "6", "--lora-r", "4", "--lora-alpha", "8", "--eval-every",
                "2", "--eval-games", "2", "--keep-checkpoints", "2", "--output-dir", str(run)])
    capsys.readouterr()
    text = (ROOT / "docs" / "runs.md").read_text()
    block = text[text.index("```\nruns/") + 4: text.index("```", text.index("```\nruns/") + 4)]
    parts = {part for token in re.findall(r"[.\w<>/-]+", block) for part in token.split("/") if part}
    patterns = [re.compile(re.sub(r"<\w+>", "[^_]+", re.escape(part)).replace("NNNNNN", r"\d{6}") + "$")
                for part in parts]  # each name as shown; <env>: a word, NNNNNN: six digits
    wrote = [p.name for p in run.iterdir()] + [p.name for p in (run / "checkpoints").iterdir()]
    wrote += [p.name for p in sorted((run / "checkpoints").iterdir())[-1].iterdir()]
    unnamed = [n for n in wrote if not any(p.match(n) for p in patterns)]
    assert not unnamed, f"docs/runs.md's run folder does not show {unnamed}"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter-000002", "iter-000003"]
    assert "the newest\n`--keep-checkpoints`" in text or "the newest `--keep-checkpoints`" in text
