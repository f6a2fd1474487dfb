"""gpualloc's import graph, read with :mod:`ast` from every ``import`` in the package, wherever
it stands (a function-level import runs as surely as one at the top, only later); imports under
``if TYPE_CHECKING:`` only when asked (they never run)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import gpualloc

PACKAGE = Path(gpualloc.__file__).parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for statement in node.body:
                skipped.update(id(sub) for sub in ast.walk(statement))
    return skipped


def imported_names(
    module: str, text: str, *, package: bool = False, type_checking: bool = False
) -> Iterator[str]:
    """Every name ``text`` (the source of ``module``; ``package``: an ``__init__``) imports at
    run time, absolute, wherever the import stands; ``type_checking``: those under ``if
    TYPE_CHECKING:`` too."""
    tree = ast.parse(text)
    skipped = set() if type_checking else _type_checking_nodes(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not package:
                    base.pop()
                base = base[: len(base) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            yield source
            yield from (f"{source}.{alias.name}" for alias in node.names)


def _owner(name: str) -> str | None:
    """The gpualloc module that ``name`` (a module, or a name in one) belongs to."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name if name and name != "gpualloc" else None


def import_graph(*, type_checking: bool = False) -> dict[str, set[str]]:
    """Module -> the gpualloc modules it imports at run time (``type_checking``: or under ``if
    TYPE_CHECKING:``)."""
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        text = path.read_text(encoding="utf-8")
        names = imported_names(
            module, text, package=path.name == "__init__.py", type_checking=type_checking
        )
        targets = {_owner(name) for name in names}
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph
