"""The README's capability matrix is the one the code gives (``python -m refimpl matrix``)."""

from pathlib import Path

from refimpl.capabilities import markdown, matrix

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_matrix_is_current():
    text = README.read_text()
    start, end = "<!-- capability-matrix:start -->", "<!-- capability-matrix:end -->"
    committed = text.split(start, 1)[1].split(end, 1)[0].strip()
    assert committed == markdown(matrix()), "run `python -m refimpl matrix` and update README.md"


def test_matrix_reads_refusals_from_the_code():
    rows = {(r["backend"], r["variant"]): r for r in matrix()}
    # Cutlass-MLA captures decode only; Wave's multi-step wrapper exists, Triton fused has none
    assert rows["cutlass_mla", "unified"]["target_verify"] != "graph"
    assert rows["cutlass_mla", "unified"]["decode"] == "graph"
    assert rows["triton", "fused"]["draft_decode"] == "—"
    assert rows["wave", "unified"]["draft_decode"] == "graph"
