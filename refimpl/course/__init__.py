"""What the notebooks share: where their figures go, and showing a figure or a piece of code in a notebook (rendered)
or a script (text).

Each notebook's own helpers live beside this file, one module per notebook topic, so a visible cell is the thing being
taught; the checks of a figure's internals live in ``tests/``, on the functions that draw it.
"""

import inspect
import json
import sys
from pathlib import Path

from ..backends import BackendEntry, load_backend_class
from ..viz import save
from ..viz.code import source_lines

ROOT = Path(__file__).resolve().parents[2]  # the repository (the notebooks run from a checkout)
FIGURES = ROOT / "figures"


def results(path: str):
    """A committed measurement: ``benchmarks/results/<path>``, a JSON file."""
    return json.loads((ROOT / "benchmarks" / "results" / path).read_text())


def _display():
    """IPython's ``display`` in a notebook, None in a plain script (nothing to display)."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        return None
    return None if get_ipython() is None else display


def render(obj) -> None:
    """``obj``'s rich form in a notebook, its text in a script."""
    (_display() or print)(obj)


def show(fig, name: str) -> None:
    """Save ``fig`` as ``figures/<name>.png`` (reproducibly, ``viz.save``) and display the saved file in a notebook."""
    path = save(fig, FIGURES / f"{name}.png")
    if _display():
        from IPython.display import Image

        render(Image(filename=str(path)))


def show_code(*fns) -> None:
    """Display the source of ``fns`` as one piece, docstrings left out, each under a comment naming its file:
    highlighted in a notebook, as text in a script."""
    text = "\n\n".join(
        f"# {Path(inspect.getsourcefile(fn)).relative_to(ROOT)}: {fn.__qualname__}\n" + "\n".join(source_lines(fn)) for fn in fns
    )
    if _display():
        from IPython.display import Code

        text = Code(text, language="python")
    render(text)


def entry(backend: str | type) -> BackendEntry:
    """The checker's entry for ``"module:Class"`` (the repository root joins the import path: ``examples`` is outside the
    package) or for a class itself, e.g. one a notebook defines."""
    if not isinstance(backend, str):
        return BackendEntry.from_class(backend, f"{backend.__module__}:{backend.__qualname__}")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return load_backend_class(backend)
