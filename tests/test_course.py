"""The course's budget and its honest reading times (README, "Start here: the course"), read from the notebooks themselves.

Per notebook: at most 120 visible lines of code (non-blank, non-comment, in cells that are not collapsed), one
exercise with a collapsed solution cell, no stored warning, machine path or progress bar in its outputs; the whole
course at most 8,000 words of markdown, counted as the project's budget tool counts them (every run of word
characters, link targets included). The reading time stated under each title follows one rule, within 2 minutes:
markdown words at 130 a minute, 5 s per visible code line, 45 s per figure or rendered code (a top-level ``show`` /
``show_code`` / ``render`` / ``display`` call), plus the minutes the exercise's heading states.
"""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
MAX_CODE, MAX_WORDS, LIMIT_MINUTES, TOLERANCE = 120, 8000, 30, 2
WORDS_PER_MINUTE, SECONDS_PER_LINE, SECONDS_PER_FIGURE = 130, 5, 45
FIGURE_CALL = re.compile(r"^(course\.)?(show\w*|render|display)\(")
EXERCISE = re.compile(r"^#+ Exercise \(about (\d+) minutes\)", re.M)
HIDDEN = '"source_hidden": true'


def cells(path: Path) -> list[tuple[str, list[str], bool]]:
    """(kind, lines, collapsed) per cell of a py:percent source; markdown without its ``# ``."""
    out: list[tuple[str, list[str], bool]] = []
    for line in path.read_text().split("# ---\n", 2)[2].splitlines():
        if line.startswith("# %%"):
            out.append(("markdown" if "[markdown]" in line else "code", [], HIDDEN in line))
        elif out:
            kind, lines, _ = out[-1]
            lines.append(re.sub(r"^#\s?", "", line) if kind == "markdown" else line)
    return out


def budget(path: Path) -> dict:
    words = tokens = code = figures = 0
    text = []
    for kind, lines, collapsed in cells(path):
        if kind == "markdown":
            words += sum(1 for line in lines for tok in line.split() if re.search(r"\w", tok))
            tokens += sum(len(re.findall(r"\w+", line)) for line in lines)
            text += lines
        elif not collapsed:
            code += sum(1 for line in lines if line.strip() and not line.strip().startswith("#"))
            figures += sum(1 for line in lines if FIGURE_CALL.match(line))
    exercise = [int(m) for m in EXERCISE.findall("\n".join(text))]
    minutes = words / WORDS_PER_MINUTE + (code * SECONDS_PER_LINE + figures * SECONDS_PER_FIGURE) / 60 + sum(exercise)
    return dict(words=words, tokens=tokens, code=code, figures=figures, exercise=exercise, minutes=minutes)


def stated_minutes(path: Path) -> int:
    """N of "Reading time: about N minutes", the line under the first cell's title."""
    kind, lines, _ = cells(path)[0]
    text = [line for line in lines if line.strip()]
    assert kind == "markdown" and text[0].startswith("# "), f"{path.name}: the first cell is not the titled markdown"
    m = re.match(r"Reading time: about (\d+) minutes\b", text[1])
    assert m, f"{path.name}: the line under the title is {text[1]!r}, not 'Reading time: about N minutes'"
    return int(m.group(1))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_each_notebook_keeps_its_budget_and_states_its_reading_time(path):
    b = budget(path)
    assert b["code"] <= MAX_CODE, f"{path.name}: {b['code']} visible code lines > {MAX_CODE}"
    assert len(b["exercise"]) == 1, f"{path.name}: {len(b['exercise'])} 'Exercise (about N minutes)' headings, not 1"
    assert any(kind == "code" and hidden for kind, _, hidden in cells(path)), f"{path.name}: no collapsed solution"
    assert b["minutes"] < LIMIT_MINUTES, f"{path.name}: {b['minutes']:.1f} min of reading; split or trim it"
    stated = stated_minutes(path)
    assert abs(stated - b["minutes"]) <= TOLERANCE, f"{path.name} says {stated} min, the rule gives {b['minutes']:.1f}"


def test_the_course_keeps_its_word_budget():
    words = {p.stem: budget(p)["tokens"] for p in NOTEBOOKS}
    assert sum(words.values()) <= MAX_WORDS, f"{sum(words.values())} words > {MAX_WORDS}: {words}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_outputs_hold_no_warning_path_or_progress_bar(path):
    bad = []
    for i, c in enumerate(json.loads(path.with_suffix(".ipynb").read_text())["cells"]):
        for o in c.get("outputs", []):
            text = "".join(o.get("text", "")) + json.dumps(o.get("data", {}).get("text/plain", ""))
            if re.search(r"Warning|/(root|home|work|tmp|Users)/[\w.-]+/|\d+%\|", text):
                bad.append((i, text[:120]))
    assert not bad, f"{path.name} stores: {bad}"


def test_the_reading_path_states_each_notebooks_reading_time():
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## Start here: the course", 1)[1].split("\n## ", 1)[0]
    for path in NOTEBOOKS:
        row = next((line for line in table.splitlines() if line.startswith(f"| `{path.stem}` |")), None)
        assert row is not None, f"README's reading path lacks {path.stem}"
        assert f"| about {stated_minutes(path)} min |" in row, f"README's reading time for {path.stem}: {row}"


def test_every_glossary_link_names_a_term():
    headings = re.findall(r"^#+ (.*)$", (ROOT / "docs/glossary.md").read_text(), re.M)
    anchors = {re.sub(r"[^a-z0-9 _\-]", "", h.strip().lower()).replace(" ", "-") for h in headings}
    links = {(p.name, a) for p in NOTEBOOKS + [ROOT / "README.md"] for a in re.findall(r"glossary\.md#([\w-]+)", p.read_text())}
    assert links, "no notebook links the glossary"
    assert not sorted((f, a) for f, a in links if a not in anchors), "links to missing glossary terms"
