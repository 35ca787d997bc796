"""The package's import graph (issue 31): modules are nodes, every ``import`` an edge (imports inside functions
included), and the longest chain is at most 9 modules with no cycle.

``from pkg import sub`` where ``sub`` is a module is an edge to ``sub`` alone (its package is already being imported);
``from pkg import name`` for anything else is an edge to ``pkg``'s ``__init__``. So a course module that imports
``Rig`` from ``refimpl.rig`` rather than ``refimpl.rig.core`` adds the verdicts to its chain, which is the regression
this test exists for.
"""

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "refimpl"
MAX_LEVELS = 9


def module_names() -> dict[str, Path]:
    names = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def import_graph() -> dict[str, set[str]]:
    names = module_names()
    graph: dict[str, set[str]] = {}
    for module, path in names.items():
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        edges = graph.setdefault(module, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in names)
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                source = ".".join(base + [node.module] if node.module else base)
                subs = {f"{source}.{a.name}" for a in node.names} & names.keys()
                edges.update(subs)
                if source in names and len(subs) < len(node.names):
                    edges.add(source)
        edges.discard(module)
    return graph


def longest_chain(graph: dict[str, set[str]]) -> list[str]:
    @cache
    def chain(module: str, seen: frozenset = frozenset()) -> tuple[str, ...]:
        assert module not in seen, f"import cycle through {module}"
        tails = [chain(n, seen | {module}) for n in sorted(graph[module])]
        return (module, *max(tails, key=len, default=()))

    return list(max((chain(m) for m in sorted(graph)), key=len))


def test_the_import_graph_is_at_most_nine_levels_deep_with_no_cycle():
    chain = longest_chain(import_graph())
    assert len(chain) <= MAX_LEVELS, f"{len(chain)} levels (limit {MAX_LEVELS}): " + " -> ".join(chain)


def test_the_graph_sees_function_level_imports_and_package_edges():
    graph = import_graph()
    assert "refimpl.rig.core" in graph["refimpl.rig.verdicts"]  # module level, relative
    assert "refimpl.graphs.cuda" in graph["refimpl.graphs"]  # inside make_engine
    assert "refimpl.rig.core" in graph["refimpl.rig"]  # the package re-exports its modules
    planted = {"a": {"b"}, "b": {"c"}, "c": set()}
    assert longest_chain(planted) == ["a", "b", "c"]
