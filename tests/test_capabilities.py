"""The capability matrix in docs/reference.md is the one the code gives (``python -m refimpl matrix``)."""

from pathlib import Path

import pytest

from refimpl.capabilities import markdown, matrix

README = Path(__file__).resolve().parent.parent / "docs" / "reference.md"


@pytest.fixture(scope="module")
def rows():
    return matrix()  # a few seconds: read from the code, built once


def test_readme_matrix_is_current(rows):
    text = README.read_text()
    start, end = "<!-- capability-matrix:start -->", "<!-- capability-matrix:end -->"
    committed = text.split(start, 1)[1].split(end, 1)[0].strip()
    assert committed == markdown(rows), "run `python -m refimpl matrix` and update docs/reference.md"


def test_matrix_reads_refusals_from_the_code(rows):
    by = {(r["backend"], r["variant"]): r for r in rows}
    # Cutlass-MLA captures decode only; Wave's multi-step wrapper exists, Triton fused has none
    assert by["cutlass_mla", "unified"]["target_verify"] != "graph"
    assert by["cutlass_mla", "unified"]["decode"] == "graph"
    assert by["triton", "fused"]["draft_decode"] == "—"
    assert by["wave", "unified"]["draft_decode"] == "graph"
