"""The README, the documentation pages and the examples stay true to the code."""

from __future__ import annotations

import re
from pathlib import Path

from gpualloc.errors import EXIT_CODE_DESCRIPTIONS, ExitCode
from gpualloc.model.bandwidth import load_bandwidth_table
from gpualloc.topologies import bundled_names

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


def test_exit_code_tables_match_errors_py() -> None:
    """The README's table and the site's exit-code page."""
    expected = [
        (str(int(code)), code.name.lower().replace("_", "-"), EXIT_CODE_DESCRIPTIONS[code])
        for code in ExitCode
    ]
    for text in (README, (ROOT / "docs" / "exit-codes.md").read_text()):
        rows = re.findall(r"^\| (\d+) \| `([a-z-]+)` \| (.+) \|$", text, flags=re.MULTILINE)
        assert rows == expected


def test_docs_name_every_bundled_topology_and_environment_variable() -> None:
    topologies = (ROOT / "docs" / "topology.md").read_text()
    for name in bundled_names():
        assert f"`{name}`" in topologies, name
    environment = (ROOT / "docs" / "configuration.md").read_text()
    source = "\n".join(p.read_text() for p in (ROOT / "gpualloc").rglob("*.py"))
    for variable in sorted(set(re.findall(r"(?<![A-Z_])GPUALLOC_[A-Z_]+", source))):
        assert f"`{variable}`" in environment, variable


def test_example_bandwidth_table_loads() -> None:
    table = load_bandwidth_table(ROOT / "examples" / "bandwidth-table.json")
    assert table.nvlink_link_gbps[2] == 24.0


def test_every_test_the_administration_page_cites_exists() -> None:
    """The limits' table names the test that holds each (``file.py::test``; ``::test`` alone
    is in the file named before it): each must be there."""
    import ast

    text = (ROOT / "docs" / "administration.md").read_text()
    cited = re.findall(r"`(?:tests/)?(test_\w+\.py)?::(test_\w+)`", text)
    assert len(cited) > 20, "the limits' table is gone"
    file = None
    for named, test in cited:
        file = named or file
        assert file is not None, test
        tree = ast.parse((ROOT / "tests" / file).read_text())
        defined = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
        assert test in defined, f"{file}::{test}"


def test_the_map_of_the_tests_names_every_file_of_them() -> None:
    """docs/development.md's "The tests" lists every test file and helper module of ``tests/``
    once (an item ``- `name.py`: what it holds``), and names no file that is not there."""
    text = (ROOT / "docs" / "development.md").read_text()
    section = text.split("\n## The tests\n", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^- `([\w.]+\.py)`: ", section, flags=re.MULTILINE)
    assert len(listed) == len(set(listed)), sorted(n for n in listed if listed.count(n) > 1)
    present = {p.name for p in (ROOT / "tests").glob("*.py")} - {"__init__.py"}
    assert sorted(present - set(listed)) == [], "missing from the map"
    assert sorted(set(listed) - present) == [], "in the map, not in tests/"


def test_the_changelog_is_released_versions_newest_first_the_top_one_this_one() -> None:
    """Keep a Changelog 1.1.0: an ``[Unreleased]`` section, then released versions with their
    dates, newest first, each with only the section kinds it defines; the newest is the
    version gpualloc says it is (``gpualloc --version``, the wheel's name)."""
    from gpualloc import __version__

    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    versions = re.findall(r"^## \[([^\]]+)\](.*)$", text, re.MULTILINE)
    assert versions[0] == ("Unreleased", "")
    released = [(name, rest) for name, rest in versions[1:] if rest]
    assert released[0][0] == __version__, (released[0], __version__)
    dates = [rest.removeprefix(" - ") for _, rest in released]
    assert all(re.fullmatch(r"\d{4}-\d{2}-\d{2}", date) for date in dates), dates
    numbers = [tuple(int(part) for part in name.split(".")) for name, _ in versions[1:]]
    assert numbers == sorted(numbers, reverse=True), numbers
    kinds = set(re.findall(r"^### (.+)$", text, re.MULTILINE))
    assert kinds <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, kinds
