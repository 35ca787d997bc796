"""Each notebook's py:percent source and its executed .ipynb hold the same cells (jupytext), and
the .ipynb names the kernel the way ipykernel installs it (JupyterLab rewrites a different
display name on connect, which marks an untouched notebook as modified)."""

from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext")  # a dev dependency (absent on the GPU image)

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
PAIRS = sorted(NOTEBOOKS.glob("*.py"))


def _cells(nb) -> list[tuple[str, str, tuple]]:
    return [(c.cell_type, c.source.strip(), tuple(c.metadata.get("tags", ()))) for c in nb.cells]


@pytest.mark.parametrize("py", PAIRS, ids=[p.stem for p in PAIRS])
def test_py_and_ipynb_are_in_sync(py):
    ipynb = py.with_suffix(".ipynb")
    assert ipynb.exists(), f"{ipynb.name} missing: run `bash scripts/sync_notebooks.sh {py}`"
    source, executed = jupytext.read(py), jupytext.read(ipynb)
    a, b = _cells(source), _cells(executed)
    for i, (x, y) in enumerate(zip(a, b)):
        assert x == y, f"{py.name} cell {i} differs from {ipynb.name}: run scripts/sync_notebooks.sh"
    assert len(a) == len(b), f"{py.name}: {len(a)} cells, {ipynb.name}: {len(b)}"
    spec = executed.metadata["kernelspec"]
    assert (spec["name"], spec["display_name"]) == ("python3", "Python 3 (ipykernel)")


def test_every_notebook_has_a_source():
    assert {p.stem for p in NOTEBOOKS.glob("*.ipynb")} == {p.stem for p in PAIRS}
