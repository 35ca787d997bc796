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
    *sorted((ROOT / "docs").glob("*.md")),
]


def _anchor(heading: str) -> str:  # GitHub's rule for markdown heading anchors
    return re.sub(r"[^a-z0-9 \-]", "", heading.strip().lower()).replace(" ", "-")


def test_every_facts_citation_names_a_section_of_the_docs_page():
    headings = re.findall(r"^#+ (.*)$", FACTS.read_text(), re.M)
    anchors = {_anchor(h) for h in headings}
    cited = {
        (path.name, a) for path in SOURCES for a in re.findall(r"(?:\[facts#|sglang_facts\.md#)([a-z0-9-]+)", path.read_text())
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
    """docs/reference.md's "What is in the box" keeps step with the registry and the notebooks folder."""
    readme = (ROOT / "docs" / "reference.md").read_text()
    box = readme.split("## What is in the box", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip(): line for line in box.splitlines() if line.startswith("| ")}
    titles = {"torch_native": "torch_native", "torch_native_mla": "torch_native", "triton": "Triton", "wave": "Wave"}
    titles |= {"flashinfer": "FlashInfer", "flashinfer_mla": "FlashInfer-MLA", "cutlass_mla": "Cutlass-MLA"}
    titles |= {"trtllm_mla": "TRTLLM-MLA"}
    missing = [e.name for e in REGISTRY if titles.get(e.name, "?") not in rows["backends"]]
    missing += [f"{e.name}/{e.variant}" for e in REGISTRY if e.variant not in rows["backends"]]
    missing += [nb.stem for nb in (ROOT / "notebooks").glob("[0-9][0-9]_*.py") if f"`{nb.stem}`" not in rows["notebooks"]]
    assert not missing, f"docs/reference.md's box lacks {missing}"
