"""The house's layers point one way (STYLE 17): the run services (infra/) know nothing of the method,
the method (segments, envs, advantage, rollout, speed, baselines) knows nothing of the run services,
and the scripts on top (flags, eval, report, train, tools) compose the two. Every import counts,
those inside functions too (read with `ast`), and no files import each other in a circle."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Each top-level module's floor, from the ground up. A module may import modules of its own floor or below.
FLOORS = {
    "errors": 0,  # the error types every layer raises
    "infra": 1,  # run services: models, checkpoint files, the command line's mechanics, metrics, processes
    "segments": 1, "envs": 1, "advantage": 1, "rollout": 1, "speed": 1, "baselines": 1,  # the method
    "vllm_rollout": 2, "exercises": 2,  # the extras, each beside the method
    "flags": 3,  # every flag of train.py, its presets, their checks
    "verl_bridge": 4,  # SHARPO inside verl: the method, with train.py's defaults
    "eval": 4,  # the evaluation script
    "report": 5,  # what an iteration of train.py logs and prints
    "train": 6,  # the loop
    "tools": 7,  # run beside the loop
}
SERVICES = {"infra"}
METHOD = {"segments", "envs", "advantage", "rollout", "speed", "baselines"}


def top(module: str) -> str:
    return module.split(".")[0]


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
    return [(m, line) for m, line in found if top(m) in FLOORS]


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def sources() -> list[Path]:
    """Every Python file of the layered tree (tests and results left out)."""
    files = [p for p in ROOT.glob("*.py")] + [p for d in FLOORS for p in (ROOT / d).rglob("*.py") if (ROOT / d).is_dir()]
    return sorted(p for p in files if "tests" not in p.relative_to(ROOT).parts and top(module_name(p)) in FLOORS)


def graph() -> dict[str, set[str]]:
    """File -> the files it imports (a module that names a package's member counts as that member's file)."""
    files = {module_name(p): p for p in sources()}
    edges = {}
    for name, path in files.items():
        targets = set()
        for module, _ in project_imports(path):
            while module not in files and "." in module:  # `from envs import X`: X is no file, envs is
                module = module.rsplit(".", 1)[0]
            if module in files and module != name:
                targets.add(module)
        edges[name] = targets
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one file (Tarjan's algorithm)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_every_import_points_down():
    up = []
    for path in sources():
        mine = FLOORS[top(module_name(path))]
        for module, line in project_imports(path):
            if FLOORS[top(module)] > mine:
                up.append(f"{path.relative_to(ROOT)}:{line} imports {module} (floor {FLOORS[top(module)]} > {mine})")
    assert not up, "imports that run back up:\n" + "\n".join(up)


def test_the_run_services_and_the_method_know_nothing_of_each_other():
    """infra/ imports only infra/ and errors.py; the method imports only the method and errors.py."""
    crossed = []
    for path in sources():
        mine = top(module_name(path))
        allowed = SERVICES if mine in SERVICES else METHOD if mine in METHOD else None
        if allowed is None:
            continue
        for module, line in project_imports(path):
            if top(module) not in allowed | {"errors"}:
                crossed.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not crossed, "a layer that should know nothing of another imports it:\n" + "\n".join(crossed)


def test_no_files_import_each_other_in_a_circle():
    assert circles(graph()) == []


def test_the_checks_see_what_they_look_for(tmp_path):
    """The checks are not vacuous: a lazy import from infra/ up to eval.py is found, a circle is found."""
    bad = tmp_path / "x.py"
    bad.write_text("def f():\n    from eval import summarize\n")
    assert project_imports(bad) == [("eval", 2)] and FLOORS["eval"] > FLOORS["infra"]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    edges = graph()
    assert len(edges) > 30 and "infra.checkpoint" in edges["train"] and "envs.workers" in edges["envs.make"]
