"""Source code shown in the notebooks: read from the live functions, tagged, and rendered as HTML in a notebook or as plain
text when a notebook runs as a script.

``source_lines`` / ``hook_code`` read a function's lines; ``CodeGrid`` sets code blocks in a grid with some lines tagged
(every tag must match exactly one line, so a notebook's claim about the code fails when the code moves).
"""

import ast
import html
import inspect
import io
import textwrap
import tokenize

PRE = "font-family:monospace;font-size:10.5px;line-height:1.3;white-space:pre-wrap;margin:0"
TD = "vertical-align:top;text-align:left;padding:3px 6px;border:1px solid #ddd"
TAG_COLORS = ["#c6dbef", "#fdd0a2", "#c7e9c0", "#fcc5c0", "#dadaeb", "#e0e0e0"]


def _parse(fn):
    """``fn``'s dedented source, its lines, its ``def`` and its docstring statement (None without one)."""
    src = textwrap.dedent(inspect.getsource(fn))
    func = ast.parse(src).body[0]
    doc = func.body[0] if ast.get_docstring(func) is not None else None
    return src, src.splitlines(), func, doc


def source_lines(fn) -> list[str]:
    """``fn``'s source lines, dedented, without its docstring (signature, comments and blank lines kept)."""
    _, lines, _, doc = _parse(fn)
    if doc:
        del lines[doc.lineno - 1 : doc.end_lineno]
    return lines


def hook_code(fn, comments: bool = False) -> list[str]:
    """Body lines of a function: no signature, no docstring, no blank lines, no comments (unless ``comments``)."""
    src, lines, func, doc = _parse(fn)
    if not comments:  # cut each comment (tokenize: '#' inside strings is safe)
        tokens = tokenize.generate_tokens(io.StringIO(src).readline)
        cut = {t.start[0] - 1: t.start[1] for t in tokens if t.type == tokenize.COMMENT}  # line -> its comment's column
        lines = [line[: cut.get(n)].rstrip() for n, line in enumerate(lines)]
    return [line for line in lines[func.body[bool(doc)].lineno - 1 : func.end_lineno] if line.strip()]


class CodeGrid:
    """Code blocks in a grid (rows x columns of cells), some lines tagged.

    ``cells[r][c]``: ``[(heading, lines), ...]``; ``tags[r][c]``: ``[(text the line contains, tag), ...]``. Every tag
    must match exactly one line of its cell (else ``ValueError``). One row with an empty title: code in columns."""

    def __init__(self, col_titles, row_titles, cells, tags):
        self.col_titles, self.row_titles = col_titles, row_titles
        self.where, self.blocks = {}, {}  # (r, c) -> {(block, line): tag}; (r, c) -> [(heading, [(line, tag or None)])]
        for r, row in enumerate(cells):
            for c, blocks in enumerate(row):
                found = self.where[r, c] = {}
                for needle, tag in tags[r][c]:
                    hits = [(b, i) for b, (_, lines) in enumerate(blocks) for i, line in enumerate(lines) if needle in line]
                    if len(hits) != 1:
                        raise ValueError(f"{needle!r} is on {len(hits)} lines of cell {r, c}, not 1")
                    found[hits[0]] = tag
                self.blocks[r, c] = [
                    (heading, [(line, found.get((b, i))) for i, line in enumerate(lines)])
                    for b, (heading, lines) in enumerate(blocks)
                ]

    def position(self, r: int, c: int, tag: str) -> tuple[int, int]:
        """(block, line) of the line tagged ``tag`` in cell (r, c)."""
        return next(k for k, t in self.where[r, c].items() if t == tag)

    def __str__(self) -> str:
        out = []
        for c, title in enumerate(self.col_titles):
            out += ["=" * 100, title, "=" * 100]
            for r, row_title in enumerate(self.row_titles):
                out += [f"----- {row_title}"] * bool(row_title)
                for heading, lines in self.blocks[r, c]:
                    out += [f"# {heading}"] + [f"{line:<70}  <-- {tag}" if tag else line for line, tag in lines]
        return "\n".join(out)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        labelled = any(self.row_titles)
        head = "".join(f'<th style="{TD};width:{100 // len(self.col_titles)}%">{html.escape(t)}</th>' for t in self.col_titles)
        rows = [f"<tr>{'<th></th>' if labelled else ''}{head}</tr>"]
        for r, row_title in enumerate(self.row_titles):
            tds = ""
            for c in range(len(self.col_titles)):
                body, colors = [], dict(zip(dict.fromkeys(self.where[r, c].values()), TAG_COLORS * 4))
                for heading, lines in self.blocks[r, c]:
                    body.append(f'<b style="color:#555"># {html.escape(heading)}</b>')
                    for line, tag in lines:
                        text = html.escape(line) or " "
                        body.append(
                            f'<span style="background:{colors[tag]}">{text}</span><b style="color:#b30000"> '
                            f"\u25c0 {html.escape(tag)}</b>"
                            if tag
                            else text
                        )
                tds += f'<td style="{TD}"><pre style="{PRE}">' + "\n".join(body) + "</pre></td>"
            label = f'<th style="{TD};writing-mode:vertical-rl">{html.escape(row_title)}</th>' if labelled else ""
            rows.append(f"<tr>{label}{tds}</tr>")
        return f'<table style="border-collapse:collapse;width:100%">{"".join(rows)}</table>'
