"""The walkthrough notebooks run top to bottom on CPU, and are committed with their outputs
(made portable by tools/notebooks.py: no stderr, no absolute path, no timing, small pictures)."""
from pathlib import Path

import nbformat
import pytest

from tools import notebooks

NB_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(p.name for p in NB_DIR.glob("*.ipynb"))


def test_there_are_five_walkthroughs():
    """01 segments and advantages, 02 one training iteration, 03 reading a run, 04 does the credit land,
    05 when does segment credit help."""
    assert [n[:2] for n in NOTEBOOKS] == ["01", "02", "03", "04", "05"]


def shows_something(cell) -> bool:
    return cell.cell_type == "code" and ("print(" in cell.source or "display(" in cell.source)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_with_portable_outputs(name):
    """A reader browsing the repository sees every output; none names a path or a timing of our machine."""
    nb = nbformat.read(NB_DIR / name, as_version=4)
    for cell in nb.cells:
        if shows_something(cell):
            assert cell.outputs, f"{name}: committed without the output of: {cell.source[:80]} (run python -m tools.notebooks)"
    assert notebooks.portable_problems(nb) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name):
    """Every cell executes without error (nbclient raises on the first failing cell), every code cell
    that prints or displays something produced output, and the cleaned outputs obey the rules."""
    nb = notebooks.execute(NB_DIR / name)
    for cell in nb.cells:
        if shows_something(cell):
            assert cell.outputs, f"no output from cell: {cell.source[:80]}"
    assert notebooks.clean(nb) == []
    assert notebooks.portable_problems(nb) == []


def test_cleaning_removes_paths_timings_and_stderr():
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("print(1)")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"wrote {notebooks.ROOT}/runs/x in 12.5s\n"),
                    nbformat.v4.new_output("stream", name="stderr", text="100%|###| 3/3 [00:01<00:00, 2.1it/s]\n")]
    nb.cells.append(cell)
    assert len(notebooks.portable_problems(nb)) == 4  # a path, two timings, a stderr stream
    assert notebooks.clean(nb) == [] and notebooks.portable_problems(nb) == []
    assert nb.cells[0].outputs[0].text == "wrote <repo>/runs/x in <time>\n" and len(nb.cells[0].outputs) == 1
