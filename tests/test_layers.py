"""Layers point down: what every file uses sits below it, and no import runs from a lower floor back up
(STYLE: the run infrastructure may use the pipeline, never the other way round). Read with `ast`, so
imports inside functions count too."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Each module's floor, from the ground up. A module may import modules of its own floor or below.
FLOORS = {
    "errors": 0, "segments": 0,  # the error types and the containers every stage passes on
    "envs": 1, "rollout": 1, "speed": 1, "advantage": 1,  # the pipeline: environments, the passes ([speed] too), the math
    "baselines": 2, "verl_bridge": 2, "vllm_rollout": 2, "exercises": 2,  # the extras, each beside the pipeline
    "infra": 3, "flags": 3,  # run infrastructure: models, config, checkpoints, metrics, cli, distributed, dashboard
    "eval": 4,  # the evaluation script
    "train": 5,  # the loop
    "tools": 6,  # run beside the loop
}


def floor_of(module: str) -> int | None:
    return FLOORS.get(module.split(".")[0])


def project_imports(path: Path) -> list[tuple[str, int]]:
    """(module, line) of every import of this repository's modules in a file, functions included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, node.lineno))
            if node.module in ("infra", "tools", "envs", "vllm_rollout", "verl_bridge", "exercises"):
                found += [(f"{node.module}.{alias.name}", node.lineno) for alias in node.names]
    return [(m, line) for m, line in found if floor_of(m) is not None]


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    return ".".join(rel.parts)


def sources() -> list[Path]:
    """Every Python file of the layered tree (tests and results left out)."""
    files = [p for p in ROOT.glob("*.py")] + [p for d in FLOORS for p in (ROOT / d).rglob("*.py") if (ROOT / d).is_dir()]
    return sorted(p for p in files if "tests" not in p.relative_to(ROOT).parts and floor_of(module_name(p)) is not None)


def test_every_import_points_down():
    up = []
    for path in sources():
        mine = floor_of(module_name(path))
        for module, line in project_imports(path):
            if floor_of(module) > mine:
                up.append(f"{path.relative_to(ROOT)}:{line} imports {module} (floor {floor_of(module)} > {mine})")
    assert not up, "imports that run back up:\n" + "\n".join(up)


def test_the_check_sees_an_arrow_that_runs_up(tmp_path):
    """The check is not vacuous: an import from infra/ up to eval.py is found."""
    bad = tmp_path / "x.py"
    bad.write_text("def f():\n    from eval import summarize\n")
    assert project_imports(bad) == [("eval", 2)] and floor_of("eval") > FLOORS["infra"]
    assert len(sources()) > 30
