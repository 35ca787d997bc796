"""The project's own sources are self-contained: citations resolve inside the repository."""

import re
from pathlib import Path

import pytest

from refimpl.backends import REGISTRY
from refimpl.backends.base import PATTERNS

ROOT = Path(__file__).resolve().parent.parent
FACTS = ROOT / "docs" / "sglang_facts.md"
SOURCES = [
    *sorted((ROOT / "refimpl").rglob("*.py")),
    *sorted((ROOT / "notebooks").glob("*.py")),
    *sorted((ROOT / "examples").glob("*.py")),
    # the tests too (reviewers read them), except this file, which names the words it bans
    *sorted(p for p in (ROOT / "tests").glob("*.py") if p.name != "test_docs.py"),
    ROOT / "README.md",
]


def _anchor(heading: str) -> str:  # GitHub's rule for markdown heading anchors
    return re.sub(r"[^a-z0-9 \-]", "", heading.strip().lower()).replace(" ", "-")


def test_every_facts_citation_names_a_section_of_the_docs_page():
    headings = re.findall(r"^#+ (.*)$", FACTS.read_text(), re.M)
    anchors = {_anchor(h) for h in headings}
    cited = {
        (path.name, a)
        for path in SOURCES
        for a in re.findall(r"(?:\[facts#|sglang_facts\.md#)([a-z0-9-]+)", path.read_text())
    }
    assert cited, "expected the sources to cite docs/sglang_facts.md"
    dangling = sorted((f, a) for f, a in cited if a not in anchors)
    assert not dangling, f"citations of missing sections: {dangling}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_reference_points_outside_the_repository(path):
    text = path.read_text().lower()
    banned = ("digest", "design §", "../shared", "shared/spec", "shared/gpu", "§")
    found = [b for b in banned if b in text]
    assert not found, f"{path.name} mentions {found}, which users do not have"


def test_every_registered_shape_carries_one_documented_pattern_label():
    for entry in REGISTRY:
        cls = entry.load()
        assert cls.pattern in PATTERNS, (entry.name, entry.variant, cls.pattern)
        assert f"| **{cls.pattern}** |" in FACTS.read_text(), f"{cls.pattern!r} is not documented"


def test_the_box_lists_every_backend_variant_and_notebook():
    """README's "What is in the box" keeps step with the registry and the notebooks folder."""
    readme = (ROOT / "README.md").read_text()
    box = readme.split("## What is in the box", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip(): line for line in box.splitlines() if line.startswith("| ")}
    titles = {"torch_native": "torch_native", "torch_native_mla": "torch_native", "triton": "Triton", "wave": "Wave"}
    titles |= {"flashinfer": "FlashInfer", "flashinfer_mla": "FlashInfer-MLA", "cutlass_mla": "Cutlass-MLA"}
    titles |= {"trtllm_mla": "TRTLLM-MLA"}
    missing = [e.name for e in REGISTRY if titles.get(e.name, "?") not in rows["backends"]]
    missing += [f"{e.name}/{e.variant}" for e in REGISTRY if e.variant not in rows["backends"]]
    missing += [
        nb.stem for nb in (ROOT / "notebooks").glob("[0-9][0-9]_*.py") if f"`{nb.stem}`" not in rows["notebooks"]
    ]
    assert not missing, f"README's box lacks {missing}"


# --- reading time: one rule for every notebook (README, "Reading path") ------------------------------------------------
# markdown words (tokens with a letter or digit) at 200 a minute, plus 3 s per non-blank code line, plus 20 s per figure
# or rendered view (a top-level call of show / show_png / render / display in a code cell); the stated N (the first line
# under the title: "Reading time: about N minutes") is within 2 minutes of that, and every estimate is under 30
WORDS_PER_MINUTE, SECONDS_PER_CODE_LINE, SECONDS_PER_FIGURE = 200, 3, 20
TOLERANCE_MINUTES, LIMIT_MINUTES = 2, 30
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
FIGURE_CALL = re.compile(r"^(show\w*|render|display)\(")


def _cells(path: Path) -> list[tuple[str, list[str]]]:
    """(kind, lines) per cell of a py:percent source, the jupytext header left out; markdown without its `# `."""
    cells: list[tuple[str, list[str]]] = []
    body = path.read_text().split("# ---\n", 2)[2]
    for line in body.splitlines():
        if line.startswith("# %%"):
            cells.append(("markdown" if "[markdown]" in line else "code", []))
        elif cells:
            kind, lines = cells[-1]
            lines.append(re.sub(r"^#\s?", "", line) if kind == "markdown" else line)
    return cells


def reading_minutes(path: Path) -> float:
    words = code = figures = 0
    for kind, lines in _cells(path):
        if kind == "markdown":
            words += sum(1 for line in lines for token in line.split() if re.search(r"\w", token))
        else:
            code += sum(1 for line in lines if line.strip())
            figures += sum(1 for line in lines if FIGURE_CALL.match(line))
    return words / WORDS_PER_MINUTE + (code * SECONDS_PER_CODE_LINE + figures * SECONDS_PER_FIGURE) / 60


def stated_minutes(path: Path) -> tuple[str, int]:
    """(title, N) from the first markdown cell: its title line, then "Reading time: about N minutes"."""
    kind, lines = _cells(path)[0]
    text = [line for line in lines if line.strip()]
    assert kind == "markdown" and text[0].startswith("# "), f"{path.name}: the first cell is not the titled markdown"
    m = re.match(r"Reading time: about (\d+) minutes\b", text[1])
    assert m, f"{path.name}: the line under the title is {text[1]!r}, not 'Reading time: about N minutes'"
    return text[0][2:], int(m.group(1))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_states_its_reading_time_and_keeps_it_under_half_an_hour(path):
    title, stated = stated_minutes(path)
    estimate = reading_minutes(path)
    assert abs(stated - estimate) <= TOLERANCE_MINUTES, f"{path.name} says {stated} min, the rule gives {estimate:.1f}"
    assert estimate < LIMIT_MINUTES, f"{path.name}: {estimate:.1f} min of reading; split or trim it"
    if "10 minutes" in title:  # a title that promises a time keeps it
        assert estimate <= 12, f"{path.name} is titled {title!r} but takes {estimate:.1f} min"


def test_the_reading_path_states_each_notebooks_reading_time():
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## Reading path", 1)[1].split("\n## ", 1)[0]
    for path in NOTEBOOKS:
        row = next((line for line in table.splitlines() if line.startswith(f"| `{path.stem}` |")), None)
        assert row is not None, f"README's reading path lacks {path.stem}"
        assert f"| about {stated_minutes(path)[1]} min |" in row, f"README's reading time for {path.stem}: {row}"
