"""What the notebooks share: where their figures go, and showing a figure or a piece of code in a notebook (rendered)
or a script (text).

Each notebook's own helpers live beside this file, one module per notebook topic, so a visible cell is the thing being
taught; the checks of a figure's internals live in ``tests/``, on the functions that draw it.
"""

from __future__ import annotations

import inspect
from pathlib import Path

from ..viz import save
from ..viz.code import source_lines

ROOT = Path(__file__).resolve().parents[2]  # the repository (the notebooks run from a checkout)
FIGURES = ROOT / "figures"


def _shell():
    try:
        from IPython import get_ipython
    except ImportError:  # a plain script: nothing to display
        return None
    return get_ipython()


def render(obj) -> None:
    """``obj``'s rich form in a notebook, its text in a script."""
    if _shell() is None:
        print(obj)
    else:
        from IPython.display import display

        display(obj)


def show(fig, name: str) -> None:
    """Save ``fig`` as ``figures/<name>.png`` (reproducibly, ``viz.save``) and display the saved file in a notebook."""
    path = save(fig, FIGURES / f"{name}.png")
    if _shell() is not None:
        from IPython.display import Image, display

        display(Image(filename=str(path)))


def code(*fns) -> str:
    """The source of ``fns`` as one piece, docstrings left out, each under a comment naming its file."""
    parts = []
    for fn in fns:
        where = Path(inspect.getsourcefile(fn)).relative_to(ROOT)
        parts.append(f"# {where}: {fn.__qualname__}\n" + "\n".join(source_lines(fn)))
    return "\n\n".join(parts)


def show_code(*fns) -> None:
    """Display the source of ``fns`` (``code``), highlighted in a notebook."""
    text = code(*fns)
    if _shell() is None:
        print(text)
    else:
        from IPython.display import Code, display

        display(Code(text, language="python"))
