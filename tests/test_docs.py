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
