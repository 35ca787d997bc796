"""Source code shown in the notebooks: read from the live functions, tagged, and rendered as HTML in a notebook or as plain
text when a notebook runs as a script.

``source_lines`` / ``hook_code`` read a function's lines; ``CodeGrid`` sets code blocks in a grid with some lines tagged
(every tag must match exactly one line, so a notebook's claim about the code fails when the code moves).
"""

from __future__ import annotations

import ast
import html
import inspect
import io
import textwrap
import tokenize

PRE = "font-family:monospace;font-size:10.5px;line-height:1.3;white-space:pre-wrap;margin:0"
TD = "vertical-align:top;text-align:left;padding:3px 6px;border:1px solid #ddd"
TD_LINE = "vertical-align:top;text-align:left;padding:0 6px;border:none;border-left:1px solid #ccc"
TAG_COLORS = ["#c6dbef", "#fdd0a2", "#c7e9c0", "#fcc5c0", "#dadaeb", "#e0e0e0"]


def source_lines(fn) -> list[str]:
    """``fn``'s source lines, dedented, without its docstring (signature, comments and blank lines kept)."""
    src = textwrap.dedent(inspect.getsource(fn))
    lines, first = src.splitlines(), ast.parse(src).body[0].body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        del lines[first.lineno - 1 : first.end_lineno]
    return lines


def hook_code(fn, comments: bool = False) -> list[str]:
    """Body lines of a function: no signature, no docstring, no blank lines, no comments (unless ``comments``)."""
    src = textwrap.dedent(inspect.getsource(fn))
    cut = {}  # line -> column where a comment starts (tokenize: '#' inside strings is safe)
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            cut[tok.start[0]] = tok.start[1]
    func = ast.parse(src).body[0]
    body = func.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    lines, out = src.splitlines(), []
    for n in range(body[0].lineno, func.end_lineno + 1):
        line = lines[n - 1] if comments else lines[n - 1][: cut.get(n)].rstrip()
        if line.strip():
            out.append(line)
    return out


def _tagged(lines_html: list[str], found: dict, block: int, colors: dict) -> list[str]:
    out = []
    for i, text in enumerate(lines_html):
        tag = found.get((block, i))
        if tag:
            text = f'<span style="background:{colors[tag]}">{text}</span><b style="color:#b30000"> \u25c0 {html.escape(tag)}</b>'
        out.append(text)
    return out


class CodeGrid:
    """Code blocks in a grid (rows x columns of cells), some lines tagged.

    ``cells[r][c]``: ``[(heading, lines), ...]``; ``tags[r][c]``: ``[(text the line contains, tag), ...]``. Every tag
    must match exactly one line of its cell (else ``ValueError``). One row with an empty title: code in columns."""

    def __init__(self, col_titles, row_titles, cells, tags):
        self.col_titles, self.row_titles, self.cells = col_titles, row_titles, cells
        self.where = {}  # (r, c) -> {(block, line): tag}
        for r, row in enumerate(cells):
            for c, blocks in enumerate(row):
                found = {}
                for needle, tag in tags[r][c]:
                    hits = [(b, i) for b, (_, lines) in enumerate(blocks) for i, line in enumerate(lines) if needle in line]
                    if len(hits) != 1:
                        raise ValueError(f"{needle!r} is on {len(hits)} lines of cell {r, c}, not 1")
                    found[hits[0]] = tag
                self.where[r, c] = found

    def position(self, r: int, c: int, tag: str) -> tuple[int, int]:
        """(block, line) of the line tagged ``tag`` in cell (r, c)."""
        return next(k for k, t in self.where[r, c].items() if t == tag)

    def __str__(self) -> str:
        out = []
        for c, title in enumerate(self.col_titles):
            out += ["=" * 100, title, "=" * 100]
            for r, row_title in enumerate(self.row_titles):
                if row_title:
                    out.append(f"----- {row_title}")
                for b, (heading, lines) in enumerate(self.cells[r][c]):
                    out.append(f"# {heading}")
                    out += [
                        f"{line:<70}  <-- {tag}" if (tag := self.where[r, c].get((b, i))) else line
                        for i, line in enumerate(lines)
                    ]
        return "\n".join(out)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        width = 100 // len(self.col_titles)
        head = "".join(f'<th style="{TD};width:{width}%">{html.escape(t)}</th>' for t in self.col_titles)
        labelled = any(self.row_titles)
        rows = [f"<tr>{'<th></th>' if labelled else ''}{head}</tr>"]
        for r, row_title in enumerate(self.row_titles):
            tds = []
            for c in range(len(self.col_titles)):
                found, body = self.where[r, c], []
                colors = dict(zip(dict.fromkeys(found.values()), TAG_COLORS * 4))
                for b, (heading, lines) in enumerate(self.cells[r][c]):
                    body.append(f'<b style="color:#555"># {html.escape(heading)}</b>')
                    body += _tagged([html.escape(line) or " " for line in lines], found, b, colors)
                tds.append(f'<td style="{TD}"><pre style="{PRE}">' + "\n".join(body) + "</pre></td>")
            label = f'<th style="{TD};writing-mode:vertical-rl">{html.escape(row_title)}</th>' if labelled else ""
            rows.append(f"<tr>{label}{''.join(tds)}</tr>")
        return '<table style="border-collapse:collapse;width:100%">' + "".join(rows) + "</table>"
