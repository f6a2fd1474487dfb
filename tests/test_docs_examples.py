"""Every example in the README and the documentation site runs as written, from a clone.

What counts as an example, and how it runs:

- In a `` ```console `` block, each line starting with ``$ `` is a command (continued on the
  next lines while a quote is open or it ends in a backslash). Other lines are its output,
  shown for the reader and not compared; lines starting with ``# `` are root's commands (an
  administrator's set-up), which are never run.
- A page's blocks run in order, each as one bash script, in one fresh directory per page that
  holds links to the checkout's ``examples/`` and ``tests/`` and small stand-ins for the jobs
  the examples launch (``train.py``, ``eval.py``, ``torchrun``, ``jupyter``: each prints the
  GPUs it got). State (the ledger, files written) carries from one block to the next, so a
  ``release`` finds the lease an earlier ``alloc`` made.
- A command that names no topology runs on ``dgx1-v100`` (``GPUALLOC_TOPOLOGY``), as on a
  machine without a GPU; the pages say so where it matters.
- ``pip install``/``pipx install`` are not run: the tests run in the installed package, and
  ``.ci/run`` runs the README's install on a fresh clone. ``pip install -e . && CMD`` runs CMD.
- A `` ```toml `` block is written as the system configuration file and must be accepted by
  ``gpualloc config show`` (and by the block's ``then:`` commands).

An HTML comment just before a block (invisible on GitHub and in the site) changes how it runs::

    <!-- examples: skip: REASON -->                 never run (needs a GPU host, root, Slurm ...)
    <!-- examples
    topology: NAME             GPUALLOC_TOPOLOGY for the block
    exit: N                    every command must exit N (default 0)
    before: CMD                run first, must exit 0 (e.g. someone holds GPUs)
    after: CMD                 run last, must exit 0
    until-interrupted: S       each command gets SIGINT after S seconds; 0 or 130 is success
    then: CMD                  a toml block: a command run with it as the system file
    file: NAME                 a block of any language (a batch script) is written to NAME
                               in the page's directory, for the blocks after it
    -->
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from html import unescape as html_unescape
from pathlib import Path
from typing import Any

import pytest

from tests.checkout import extra_modules

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXTRA_COMMANDS = {
    "plot": re.compile(r"\s--plot(?:[\s=]|$)"),  # simulate draws its figures with matplotlib
    "docs": re.compile(r"(?:^|[;&|]\s*)(?:python -m )?mkdocs\b"),
}
"""The ``$`` lines that need an optional extra of pyproject.toml: a page with one runs only
where the extra is installed (the ``extra`` marker of tests/conftest.py), so that the README's
``pip install -e '.[test]' && python -m pytest`` passes on a fresh clone."""
DEFAULT_TOPOLOGY = "dgx1-v100"
BLOCK_TIMEOUT_S = 180

_FENCE = re.compile(r"^```(\w*)\s*$")
_DIRECTIVE = re.compile(r"<!--\s*examples(?::\s*(?P<inline>.*?))?\s*(?P<body>\n.*?)?-->\s*$", re.S)
_STAND_IN_SCRIPT = (
    'import os, sys\nprint("stand-in", sys.argv, os.environ.get("CUDA_VISIBLE_DEVICES"))\n'
)
_STAND_IN_PROGRAM = '#!/bin/sh\necho "stand-in $0 $* on ${CUDA_VISIBLE_DEVICES:-no GPU}"\n'
_INSTALL = re.compile(r"^(?:pipx?|python -m pip) install\b[^&;]*(?:&&\s*(?P<rest>.*))?$", re.S)


class Block:
    """One fenced block of a page, with its directives."""

    def __init__(self, page: Path, line: int, language: str, text: str, directive: str) -> None:
        self.page, self.line, self.language, self.text = page, line, language, text
        self.skip: str | None = None
        self.settings: dict[str, list[str]] = {}
        match = _DIRECTIVE.search(directive) if directive else None
        if match:
            inline = (match.group("inline") or "").strip()
            if inline.startswith("skip"):
                self.skip = inline.partition(":")[2].strip() or "skipped"
            for entry in (match.group("body") or "").strip().splitlines():
                key, _, value = entry.partition(":")
                self.settings.setdefault(key.strip(), []).append(value.strip())

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def setting(self, key: str, default: str) -> str:
        return self.settings.get(key, [default])[-1]

    def commands(self) -> list[str]:
        """The ``$`` commands of a console block, continuation lines joined."""
        found: list[str] = []
        pending: str | None = None
        for line in self.text.splitlines():
            if pending is not None:
                pending += "\n" + line
            elif line.startswith("$ "):
                pending = line[2:]
            else:
                continue
            if pending.endswith("\\") or not _quotes_closed(pending):
                continue
            found.append(pending)
            pending = None
        assert pending is None, f"{self.where()}: an unfinished command: {pending!r}"
        return found


def _quotes_closed(command: str) -> bool:
    try:
        shlex.split(command, comments=True)
    except ValueError:
        return False
    return True


def blocks(page: Path) -> list[Block]:
    """Every ``console`` and ``toml`` block of ``page``, and every block it says to write
    as a file (``file: NAME``)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        fence = _FENCE.match(lines[index])
        if not fence or not fence.group(1):
            index += 1
            continue
        start = index
        end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("```"))
        directive = _comment_before(lines, start)
        text = "\n".join(lines[start + 1 : end])
        block = Block(page, start + 1, fence.group(1), text, directive)
        if fence.group(1) in ("console", "toml") or "file" in block.settings:
            found.append(block)
        index = end + 1
    return found


def _comment_before(lines: list[str], fence: int) -> str:
    """The ``<!-- examples ... -->`` comment that ends on the line before ``fence``, if any."""
    if fence == 0 or not lines[fence - 1].rstrip().endswith("-->"):
        return ""
    start = fence - 1
    while start >= 0 and "<!--" not in lines[start]:
        start -= 1
    return "\n".join(lines[start:fence]) if start >= 0 else ""


def _script(block: Block, commands: list[str]) -> str:
    """A bash script running ``commands`` and saying which ones missed their exit code."""
    want = int(block.setting("exit", "0"))
    interrupt = block.settings.get("until-interrupted")
    lines = ["set -u", "failed=0"]

    def checked(command: str, codes: tuple[int, ...], label: str) -> None:
        allowed = " ".join(map(str, codes))
        lines.append(command)
        lines.append(
            f'rc=$?; case " {allowed} " in *" $rc "*) ;; *) failed=1; '
            f'echo "EXAMPLE FAILED (exit $rc, wanted {allowed}): "{shlex.quote(label)} >&2;; esac'
        )

    for command in block.settings.get("before", []):
        checked(command, (0,), f"before: {command}")
    for command in commands:
        installing = _INSTALL.match(command.strip())
        if installing:
            if not installing.group("rest"):
                continue
            command = installing.group("rest")
        if interrupt:
            seconds = float(interrupt[-1])
            wrapped = f"timeout --preserve-status -s INT {seconds:g} bash -c {shlex.quote(command)}"
            checked(wrapped, (0, 130), command)
        else:
            checked(command, (want,), command)
    for command in block.settings.get("after", []):
        checked(command, (0,), f"after: {command}")
    lines.append('exit "$failed"')
    return "\n".join(lines) + "\n"


def _workspace(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The directory a page's examples run in, and their environment."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("examples", "tests"):
        (work / name).symlink_to(ROOT / name)
    for name in ("train.py", "eval.py", "sweep.py"):
        (work / name).write_text(_STAND_IN_SCRIPT)
    stand_ins = tmp_path / "bin"
    stand_ins.mkdir()
    for name in ("torchrun", "jupyter"):
        program = stand_ins / name
        program.write_text(_STAND_IN_PROGRAM)
        program.chmod(0o755)
    env = dict(os.environ)
    env.update(
        HOME=str(tmp_path / "home"),
        GPUALLOC_TOPOLOGY=DEFAULT_TOPOLOGY,
        PATH=os.pathsep.join([str(stand_ins), str(Path(sys.executable).parent), env["PATH"]]),
        GPUALLOC_VERIFY_GRACE="off",  # no verifier left behind by the examples' runs
    )
    env.pop("GPUALLOC_BROKER", None)
    (tmp_path / "home").mkdir()
    return work, env


def _run_block(block: Block, work: Path, env: dict[str, str], tmp_path: Path) -> str | None:
    """Run one block; what went wrong, or None."""
    env = dict(env)
    env["GPUALLOC_TOPOLOGY"] = block.setting("topology", DEFAULT_TOPOLOGY)
    if "file" in block.settings:
        name = block.setting("file", "")
        target = (work / name).resolve()
        if not name or not target.is_relative_to(work.resolve()):
            return f"{block.where()}: file: {name!r} is not a name inside the page's directory"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.text + "\n", encoding="utf-8")
        return None
    if block.language == "toml":
        config = tmp_path / "system-config.toml"
        config.write_text(block.text + "\n")
        env["GPUALLOC_SYSTEM_CONFIG"] = str(config)
        commands = ["gpualloc config show >/dev/null", *block.settings.get("then", [])]
        script = _script(Block(block.page, block.line, "console", "", ""), commands)
    else:
        script = _script(block, block.commands())
    try:
        done = subprocess.run(
            ["bash", "-c", script],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return f"{block.where()}: did not finish within {BLOCK_TIMEOUT_S} s"
    if done.returncode == 0:
        return None
    return f"{block.where()}:\n{done.stderr[-3000:]}"


def extras_needed(command: str) -> list[str]:
    """The extras ``command`` (a ``$`` line) needs, as :data:`EXTRA_COMMANDS` tells."""
    return [extra for extra, pattern in EXTRA_COMMANDS.items() if pattern.search(command)]


def _page_param(page: Path) -> Any:
    """``page`` as a case of the examples' test, marked with the extras its lines need."""
    marks = []
    for block in blocks(page):
        if block.skip is None and block.language == "console":
            for command in block.commands():
                marks += [pytest.mark.extra(x, why=block.where()) for x in extras_needed(command)]
    return pytest.param(page, id=str(page.relative_to(ROOT)), marks=marks)


@pytest.mark.slow
@pytest.mark.parametrize("page", [_page_param(page) for page in PAGES])
def test_every_example_runs_as_written(page: Path, tmp_path: Path) -> None:
    work, env = _workspace(tmp_path)
    failures = [
        failure
        for block in blocks(page)
        if block.skip is None and (failure := _run_block(block, work, env, tmp_path))
    ]
    assert not failures, "\n\n".join(failures)


def test_every_example_that_says_it_needs_an_extra_is_known_to() -> None:
    """A line whose comment says it needs a module of an extra (``# needs matplotlib``) is
    one :data:`EXTRA_COMMANDS` finds: else it fails on a clone with only the test extra."""
    modules = {module: extra for extra in EXTRA_COMMANDS for module in extra_modules(extra)}
    for page in PAGES:
        for block in blocks(page):
            for command in block.commands() if block.language == "console" else ():
                for module in re.findall(r"#.*\bneeds (\w+)", command):
                    if module in modules:
                        assert modules[module] in extras_needed(command), (block.where(), command)


def test_every_skipped_example_says_why() -> None:
    for page in PAGES:
        for block in blocks(page):
            assert block.skip is None or len(block.skip) > 10, block.where()


def test_the_readme_fits_and_answers_the_first_questions_on_its_first_screen() -> None:
    """At most 300 lines, and how to wait, release and read an exit code within the
    first screenful (about 40 lines)."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300
    first_screen = "\n".join(lines[:40])
    for needed in ("--wait", "release", "exit codes", "10"):
        assert needed in first_screen, needed


def test_user_facing_pages_point_only_inside_the_checkout() -> None:
    """No ``../shared`` paths where a user reads (the development page is for this project's
    developers, whose workspace has it)."""
    for page in PAGES:
        if page.name != "development.md":
            assert "../shared" not in page.read_text(encoding="utf-8"), page.name


def test_readme_links_reach_files_and_headings() -> None:
    """The README is not part of the site, so its links are checked here: a relative link names
    a file of the checkout, and an anchor a heading of the page it points to."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)\s]+)\)", readme):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        page = ROOT / path if path else ROOT / "README.md"
        assert page.exists(), target
        if anchor:
            assert anchor in _anchors(page), target


def _anchors(page: Path) -> set[str]:
    """The ids Python-Markdown's toc (and GitHub) give the headings of ``page``."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), flags=re.M):
        text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
        found.add(re.sub(r"[-\s]+", "-", text))
    return found


@pytest.mark.extra("docs")
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """``mkdocs build --strict``: every page in the nav, every link and anchor found."""
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr


MEASURE_TABLES = """<script>window.addEventListener("load", () => setTimeout(() => {
  const column = document.querySelector(".wy-nav-content");
  const padding = parseFloat(getComputedStyle(column).paddingRight);
  const edge = column.getBoundingClientRect().right - padding;
  const tables = [...document.querySelectorAll(".rst-content table")].map((table) => ({
    right: table.getBoundingClientRect().right, scroll: table.scrollWidth,
    width: table.clientWidth, header: table.querySelector("th")?.textContent ?? "",
  }));
  const out = document.createElement("pre");
  out.id = "measured";
  out.textContent = JSON.stringify({edge, page: document.documentElement.scrollWidth,
                                    window: window.innerWidth, tables});
  document.body.append(out);
}, 200));</script>"""
"""Where each table of a page ends against the content column, once the page has loaded."""


def _measure_tables(browser: str, page: Path, *, javascript: bool) -> dict:
    """``page`` of a built site laid out by headless ``browser`` in a 1000-pixel window, with
    the theme's JavaScript or without it (before it runs, or where it is blocked)."""
    html = page.read_text(encoding="utf-8")
    if not javascript:
        html = re.sub(r'<script src="[^"]*/theme(_extra)?\.js"[^>]*></script>', "", html)
    probe = page.with_name("measured.html")
    probe.write_text(html.replace("</body>", MEASURE_TABLES + "</body>"), encoding="utf-8")
    shown = subprocess.run(
        [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1000,900",
         "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    found = re.search(r'<pre id="measured">(.*?)</pre>', shown.stdout, re.S)
    assert found, shown.stderr[-2000:]
    return json.loads(html_unescape(found.group(1)))


@pytest.mark.slow
@pytest.mark.extra("docs")
def test_wide_tables_scroll_inside_the_content_column(tmp_path: Path) -> None:
    """At 1000 pixels the site's wide tables ran past its content column (the theme makes a
    table scroll only once its JavaScript has marked it) and a table of sentences kept each
    on one line: with docs/css/tables.css every table stays inside the column, scrolling
    sideways where its words cannot fit, and prose wraps."""
    browser = next(
        (found for name in ("chromium", "chromium-browser", "google-chrome")
         if (found := shutil.which(name))), None,
    )  # fmt: skip
    if browser is None:
        pytest.skip("no headless chromium (apt-get install chromium)")
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(site)],
        cwd=ROOT, capture_output=True, check=True, timeout=300,
    )  # fmt: skip
    for name in ("placement", "evaluation"):
        for javascript in (True, False):
            shown = _measure_tables(browser, site / name / "index.html", javascript=javascript)
            where = f"{name}.md, {'with' if javascript else 'without'} the theme's JavaScript"
            assert len(shown["tables"]) > 0, where
            assert shown["page"] <= shown["window"], f"{where}: the page scrolls sideways"
            past = [t["header"] for t in shown["tables"] if t["right"] > shown["edge"] + 1]
            assert not past, f"{where}: tables past the column: {past}"
            if name == "placement":
                (policies,) = [t for t in shown["tables"] if t["header"] == "policy"]
                assert policies["scroll"] <= policies["width"] + 1, f"{where}: prose on one line"
