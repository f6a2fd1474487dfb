"""The shape of the house: no import loops between modules or packages, function-level imports
included, no module too big to read, no comment that cites an issue number, and no test module
that imports another.

The graph is built with :mod:`ast` from every ``import`` in gpualloc, wherever it stands
(``tests/import_graph.py``). Imports under ``if TYPE_CHECKING:`` never run, so the run-time
graph leaves them out; a second check counts them too, since a type named from a module that
imports you back is a loop for the reader and the type checker all the same: the shared type
belongs in a module below both.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

from tests.import_graph import MODULES, PACKAGE, import_graph, imported_names

MAX_MODULE_LINES = 600
ISSUE_CITATION = re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE)
"""An issue number given as a reason ("issue 40, hole 3"): it says nothing to a reader without
the tracker and rots (house style, "Comments"); cite the paper, the standard or the test."""


def _package(module: str) -> str:
    """``gpualloc.ledger.store`` -> ``ledger``; a top-level module is a package of its own."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _witnesses(graph: dict[str, set[str]], members: list[str], level) -> list[str]:
    return sorted(
        f"{a} -> {b}"
        for a in graph
        for b in graph[a]
        if level(a) in members and level(b) in members and level(a) != level(b)
    )


def test_no_import_loop_between_modules() -> None:
    graph = import_graph()
    loops = cycles(graph)
    assert not loops, "\n".join(
        f"loop: {' / '.join(loop)} via {_witnesses(graph, loop, lambda m: m)}" for loop in loops
    )


def test_no_import_loop_between_modules_counting_type_checking_imports() -> None:
    """A module may name a type of a module above it, but not of one that imports it
    back; move the shared type below both instead."""
    graph = import_graph(type_checking=True)
    loops = cycles(graph)
    assert not loops, "\n".join(
        f"loop: {' / '.join(loop)} via {_witnesses(graph, loop, lambda m: m)}" for loop in loops
    )


def test_no_import_loop_between_packages() -> None:
    graph = import_graph()
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        packages.setdefault(_package(module), set()).update(
            _package(t) for t in targets if _package(t) != _package(module)
        )
    loops = cycles(packages)
    assert not loops, "\n".join(
        f"loop: {' / '.join(loop)} via {_witnesses(graph, loop, _package)}" for loop in loops
    )


def test_the_configuration_is_a_leaf() -> None:
    """Every command reads it, so it must not pull in the ledger, placement or discovery."""
    leaves = {
        "gpualloc.errors",
        "gpualloc.durations",
        "gpualloc.user_files",
        "gpualloc.setting_values",
        "gpualloc.time_limits",
    }
    assert import_graph()["gpualloc.config"] <= leaves
    assert import_graph()["gpualloc.user_files"] <= {"gpualloc.errors"}
    assert import_graph()["gpualloc.setting_values"] <= leaves | {"gpualloc.time_limits"}
    assert import_graph()["gpualloc.time_limits"] <= leaves


def test_the_checker_finds_a_loop() -> None:
    """The detector itself: a loop is found, a function-level import counts, and a
    TYPE_CHECKING import counts only when asked."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    source = "def f():\n    from gpualloc.ledger import store\n    from . import errors\n"
    names = set(imported_names("gpualloc.config", source))
    assert {"gpualloc.ledger", "gpualloc.ledger.store", "gpualloc.errors"} <= names
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import gpualloc.api\n"
    assert "gpualloc.api" not in set(imported_names("gpualloc.config", typed))
    assert "gpualloc.api" in set(imported_names("gpualloc.config", typed, type_checking=True))


def test_no_module_is_too_long_to_read() -> None:
    """A few hundred lines a module (house style): 600 at most."""
    lengths = {m: p.read_text(encoding="utf-8").count("\n") for m, p in MODULES.items()}
    too_long = {m: n for m, n in lengths.items() if n > MAX_MODULE_LINES}
    assert not too_long, too_long


def issue_citations(text: str) -> list[tuple[int, str]]:
    """(line, citation) for each issue number ``text`` cites in a comment or a string, docstrings
    included."""
    kinds = {
        tokenize.COMMENT,
        tokenize.STRING,
        getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING),
    }
    found = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type in kinds:
            for match in ISSUE_CITATION.finditer(token.string):
                line = token.start[0] + token.string.count("\n", 0, match.start())
                found.append((line, " ".join(match[0].split())))
    return found


def test_no_comment_cites_an_issue_number() -> None:
    """Comments and docstrings say why, citing papers, standards and tests: gpualloc's, the
    tests', the benchmarks' and the scripts' (this file's own examples aside), and the docs."""
    root = PACKAGE.parent
    sources = [*MODULES.values()]
    for folder in ("tests", "benchmarks", "scripts"):
        sources += sorted((root / folder).glob("*.py"))
    own = Path(__file__).resolve()
    cited = [
        f"{path.relative_to(root)}:{line}: {citation}"
        for path in sources
        if path.resolve() != own
        for line, citation in issue_citations(path.read_text(encoding="utf-8"))
    ]
    for page in sorted((root / "docs").rglob("*.md")):
        for number, text in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            cited += [
                f"{page.relative_to(root)}:{number}: {m}" for m in ISSUE_CITATION.findall(text)
            ]
    assert not cited, "\n".join(cited)


def test_the_citation_finder_reads_comments_and_strings_not_code() -> None:
    """A citation wrapped across lines counts too; code and other words do not."""
    source = (
        '"""Bounded (issue 40, hole 1)."""\n'
        "issue = 7  # Issues 18 and 21\n"
        'def f():\n    """Line one.\n\n    As asked (issue\n    41, item 2)."""\n'
        'tissue = "tissue 5 and issue five"\n'
    )
    assert issue_citations(source) == [(1, "issue 40"), (2, "Issues 18"), (6, "issue 41")]


# placement/'s rooms (house style: subpackages named for their algorithms). A room is a
# subpackage, or a module at placement/'s top; each may import the rooms listed here and none
# above them. The algorithms' rooms know no policy and no decision, the policies no front door.
BELOW_THE_ROOMS = {"host_graph", "deadline", "rule_lookup"}
ALGORITHM_ROOMS = {"mapa", "sets", "besteffort", "sharing", "mig"}
PLACEMENT_ROOMS_MAY_IMPORT = {
    **dict.fromkeys(BELOW_THE_ROOMS, frozenset()),
    "sets": BELOW_THE_ROOMS,
    "mapa": BELOW_THE_ROOMS | {"sets"},
    "besteffort": BELOW_THE_ROOMS,
    "sharing": BELOW_THE_ROOMS,
    "mig": BELOW_THE_ROOMS,
    "policies": BELOW_THE_ROOMS | ALGORITHM_ROOMS | {"context", "ties"},
}


def _room(module: str) -> str | None:
    """``gpualloc.placement.mapa.search`` -> ``mapa``; ``gpualloc.placement.ties`` -> ``ties``;
    None outside placement and for placement's own package."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["gpualloc", "placement"] else None


def _room_imports(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        room = _room(module)
        if room is not None:
            found = rooms.setdefault(room, set())
            found.update(r for r in map(_room, targets) if r is not None and r != room)
    return rooms


def test_no_import_loop_between_placements_rooms() -> None:
    """Type-hint imports count: a room that names a type of one above it is read top down."""
    graph = import_graph(type_checking=True)
    loops = cycles(_room_imports(graph))
    assert not loops, "\n".join(
        f"loop: {' / '.join(loop)} via {_witnesses(graph, loop, _room)}" for loop in loops
    )


def test_placements_rooms_import_only_the_rooms_below_them() -> None:
    graph = import_graph(type_checking=True)
    rooms = _room_imports(graph)
    assert set(PLACEMENT_ROOMS_MAY_IMPORT) <= set(rooms), "a room listed here has moved"
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if _room(module) in PLACEMENT_ROOMS_MAY_IMPORT
        and _room(target) not in {None, _room(module), *PLACEMENT_ROOMS_MAY_IMPORT[_room(module)]}
    )
    assert not wrong, wrong


def test_placements_packages_say_what_they_hold_and_import_nothing() -> None:
    """Each package of placement has a docstring (what it holds and proves) and no import: a
    module loads only what it uses, whichever room it is in (start-up, house style habit 9)."""
    packages = {m: p for m, p in MODULES.items() if p.name == "__init__.py" and "placement" in m}
    assert "gpualloc.placement" in packages and len(packages) > 1
    for module, path in packages.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert ast.get_docstring(tree), module
        body = [node for node in tree.body if not isinstance(node, ast.Expr)]
        assert not body, f"{module} runs code when a module of it is imported"


# ---- the tests' own modules -------------------------------------------------------------------

TESTS = Path(__file__).resolve().parent
SCRIPT_IMPORT = re.compile(
    r"^\s*(?:from\s+tests\.(?P<a>test_\w+|conftest)\s+import\b"
    r"|import\s+tests\.(?P<b>test_\w+|conftest)\b"
    r"|from\s+tests\s+import\s+(?P<c>[^\n]*\b(?:test_\w+|conftest)\b))",
    re.MULTILINE,
)
"""Such an import in the text, a program a test writes out and runs included."""


def is_test_module(name: str) -> bool:
    return name.startswith("test_") or name == "conftest"


def imported_test_modules(text: str) -> set[str]:
    """The test modules and conftest.py that the source ``text`` imports (``tests.test_x`` as
    ``test_x``): by its ``import`` statements, wherever they stand, and by the programs it
    holds as text (a script a test runs with ``python -c``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "tests" and len(parts) > 1 and is_test_module(parts[1]):
                found.add(parts[1])
    for match in SCRIPT_IMPORT.finditer(text):
        named = match["a"] or match["b"] or match["c"]
        found.update(re.findall(r"\b(?:test_\w+|conftest)\b", named))
    return found


def test_no_module_of_the_tests_imports_a_test_module_or_conftest() -> None:
    """What several test files share lives in a helper module named for what it holds
    (docs/development.md, "The tests"): a test file imported by another runs its module code,
    markers and fixtures there too, and ties the two files' layouts together; conftest.py
    holds fixtures, which pytest finds by name, and plain helpers live elsewhere."""
    wrong = sorted(
        f"{path.name} imports {name}"
        for path in sorted(TESTS.glob("*.py"))
        for name in imported_test_modules(path.read_text(encoding="utf-8"))
    )
    assert not wrong, "\n".join(wrong)


def test_the_test_import_finder_reads_statements_and_scripts() -> None:
    source = (
        "from tests.test_cli_run import gpualloc\n"
        "def f():\n    import tests.conftest\n    from tests import test_api, house_rules\n"
        'SCRIPT = """\nfrom tests.test_ledger_store import HOST\n"""\n'
        "from tests.cli_harness import Result  # tests.test_x in a comment\n"
    )
    found = imported_test_modules(source)
    assert found == {"test_cli_run", "conftest", "test_api", "test_ledger_store"}
