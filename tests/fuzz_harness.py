"""How a fuzzing case runs and the rules its answer is held to, shared by the fuzzing tests of
the command line: ``tests/test_fuzz_inputs.py`` (files, job options, variables),
``tests/test_fuzz_options.py`` (every command's option values), ``tests/test_fuzz_settings.py``
(variables combined, config files) and ``tests/test_fuzz_formats.py`` (every file format,
mutated from real ones). What the cases are made of is ``tests/fuzz_values.py``.

A case runs gpualloc in this process through the real entry point, in a working directory,
state directory, cache and configuration of its own, under an alarm. Its answer must be:

- an exit code of :class:`~gpualloc.errors.ExitCode`, never 1 (an internal error);
- on a refusal (not 0), the house rule (:func:`tests.house_rules.refused`: exactly one
  ``error:`` line, at most one ``hint:``, no traceback), nothing after the error line but its
  details, indented, and its hint, and the ledger exactly as it was (every file of the state
  directory but the lock files, whose existence is the lock protocol's);
- never an ``error:`` line with exit 0 (nor with 17, ``doctor``'s findings, which it prints);
- no ``nan`` or ``inf`` in what it prints, but where the case itself typed them (or an error
  quotes a file's token), and no stderr line echoing more than :data:`ECHO_LIMIT` characters of
  one value the case gave;
- within :data:`CASE_TIMEOUT_S` (a case past it fails: :class:`Hung`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from gpualloc.errors import ExitCode
from tests.cli_harness import Result, run_in_process
from tests.house_rules import refused

CASE_TIMEOUT_S = 5.0
"""No input may keep gpualloc busy longer: a case past it is a hang."""
MAX_LINE = 2000
ECHO_LIMIT = 150
"""The most characters of one value an error line may repeat (a 5,000-character path was
echoed up to 500 characters: tests/test_fuzz_findings.py)."""
KNOWN_ECHOES: tuple[str, ...] = ()
"""Errors that may still say a long value back whole: none (the usage errors, ``status
--idle`` and ``--pattern`` cut theirs)."""
DOCUMENTED = {int(code) for code in ExitCode} - {ExitCode.INTERNAL}
IN_CI = os.environ.get("CI") == "true"
"""CI tries the same cases every time (a landing gate must not depend on luck); a developer's
run explores new ones, and what it finds becomes a fix and a fixed test."""
FAST = settings(
    max_examples=60,
    deadline=None,
    derandomize=IN_CI,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
LONG_EXAMPLES = int(os.environ.get("GPUALLOC_FUZZ_EXAMPLES", "200"))
"""Cases of each slow test (CI: 200; ``GPUALLOC_FUZZ_EXAMPLES`` for a longer hunt)."""
LONG = settings(
    max_examples=LONG_EXAMPLES,
    deadline=None,
    derandomize=IN_CI,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def fast(examples: int) -> settings:
    """The fast loop's settings with ``examples`` cases (tens: CI runs every fast test)."""
    return settings(FAST, max_examples=examples)


NON_FINITE = re.compile(r"(?<![\w.])[-+]?(?:nan|inf(?:inity)?)(?![\w])", re.IGNORECASE)


LAST: object = None


class Hung(BaseException):
    """The case ran past its alarm (a BaseException: gpualloc's error boundary lets it by)."""


@contextlib.contextmanager
def alarm(seconds: float) -> Iterator[None]:
    def ring(signum, frame):
        raise Hung(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def environment(values: dict[str, str | None]) -> Iterator[None]:
    """``values`` set (None: unset) for the block, the old ones back after."""
    saved = {name: os.environ.get(name) for name in values}
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def working_directory(path: Path) -> Iterator[None]:
    """Relative paths a case generates land in its own directory, never in the repository."""
    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


@contextlib.contextmanager
def workspace() -> Iterator[Path]:
    """A fresh directory for one case (hypothesis runs many in one test: no tmp_path)."""
    with tempfile.TemporaryDirectory(prefix="gpualloc-fuzz-") as temporary:
        yield Path(temporary)


@pytest.fixture
def no_serving_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    """``serve`` and ``metrics --serve`` return where they would start serving: what is fuzzed
    is everything before (a case that serves would never end)."""
    from http.server import ThreadingHTTPServer

    from gpualloc.broker.server import Broker

    monkeypatch.setattr(Broker, "serve", lambda self: self.listener.close())
    monkeypatch.setattr(ThreadingHTTPServer, "serve_forever", lambda self, *a: None)


def state_files(directory: Path) -> dict[str, bytes]:
    """Every file of the state directory, and its bytes (not the lock files)."""
    if not directory.exists():
        return {}
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not p.name.endswith(".lock")
    }


def case_environment(workdir: Path, env: dict[str, str] | None = None) -> dict[str, str | None]:
    """The settings of a case: everything of its own under ``workdir``, then ``env``."""
    return {
        "GPUALLOC_STATE_DIR": str(workdir / "state"),
        "GPUALLOC_CACHE_DIR": str(workdir / "cache"),
        "XDG_CONFIG_HOME": str(workdir / "config"),
        "GPUALLOC_SYSTEM_CONFIG": str(workdir / "etc" / "config.toml"),
        "HOME": str(workdir / "home"),  # --install-completion writes there
        **(env or {}),
    }


def check(
    args: list[str],
    workdir: Path,
    env: dict[str, str] | None = None,
    *,
    typed: Iterable[str] = (),
    quoted: Iterable[str] = (),
    ledgers: Iterable[Path] = (),
) -> Result:
    """Run ``gpualloc ARGS`` in ``workdir`` and hold it to the rules of the module docstring.
    ``typed``: the values the case gave (which its output may repeat, ``nan`` included);
    ``quoted``: what a file it read says (an error may quote a token of it); ``ledgers``:
    state directories besides ``workdir/state`` that a refusal must not change."""
    from gpualloc.cli.state import STATE

    directories = [workdir / "state", *ledgers]
    before = [state_files(d) for d in directories]
    typed = [*typed, *args, *(env or {}).values()]
    with (
        environment(case_environment(workdir, env)),
        working_directory(workdir),
        alarm(CASE_TIMEOUT_S),
    ):
        result = run_in_process(args)
    code, stdout, stderr = result.exit_code, result.stdout, result.stderr
    global LAST
    LAST = repr((args[2:4] if args[:1] == ["--topology"] else args[:2], code, stderr[:60]))
    said = (_cut(args), _cut(env or {}), code, stderr[-3000:])
    assert code in DOCUMENTED | {0}, said
    if STATE.debug:
        return result  # --debug / GPUALLOC_DEBUG=1 asks for the traceback
    lines = stderr.splitlines()
    assert all(len(line) <= MAX_LINE for line in lines), (*said, "a long line")
    assert "Traceback" not in stderr, said
    quotes = re.compile(r"'[^'\n]*'")  # a 'nan' quoted is a text said back, not a number
    no_non_finite(quotes.sub("' '", stdout), typed, said, source=" ".join(quoted))
    no_non_finite(quotes.sub("' '", stderr), [*typed, *quoted], said)
    no_long_echo(stderr, typed, said)
    errors = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    if code in (0, ExitCode.CHECK_FAILED):  # doctor's findings are its output, not an error
        assert not errors, (*said, "an error with exit 0")
        return result
    refused(stderr, case=said)  # the house rule: one error line, at most one hint
    after = lines[errors[0] :]
    assert all(line.startswith(("  ", "hint: ")) for line in after[1:]), (*said, "after")
    for directory, files in zip(directories, before, strict=True):
        assert state_files(directory) == files, (*said, f"{directory} changed on a refusal")
    return result


def _cut(values: list[str] | dict[str, str]) -> object:
    """The case, for a failure's message: each value cut to 200 characters."""
    if isinstance(values, dict):
        return {name: _cut([value])[0] for name, value in values.items()}  # type: ignore[index]
    return [v if len(v) <= 200 else f"{v[:100]}...({len(v)} characters)" for v in values]


def no_non_finite(text: str, typed: Iterable[str], said: object, source: str = "") -> None:
    """No ``nan``/``inf`` in ``text`` but inside what the case typed, or among words of the
    file it read (``source``: a GPU named "nan A100"); JSON parsed exactly."""
    stripped = text.lstrip()
    if stripped[:1] in ("{", "[") and stripped.rstrip()[-1:] in ("}", "]"):
        with contextlib.suppress(ValueError):
            json.loads(stripped, parse_constant=_refuse_constant)
            return
    from gpualloc.model.printable import printable

    typed = {v for v in typed if v}
    text = text.replace('le="+Inf"', " ")  # Prometheus's last histogram bucket, by its format
    for value in sorted(typed | {printable(v) for v in typed}, key=len, reverse=True):
        text = text.replace(value, " ")
    # What is left of a typed nan (cut, quoted, escaped) may be said back, but no other.
    forgiven = {_kind(m.group()) for v in typed for m in NON_FINITE.finditer(v)}
    for found in NON_FINITE.finditer(text):
        token = _kind(found.group())
        shown = text[max(0, found.start() - 80) :][:200]
        assert token in forgiven or _from_file(text, found, source), (said, "non-finite", shown)


def _from_file(text: str, found: re.Match[str], source: str) -> bool:
    """Whether the word ``found`` is in, with the word before or after it, is in ``source``
    too: a name the file gave, said back, not a number gpualloc worked out."""
    start = text.rfind("\n", 0, found.start()) + 1
    end = text.find("\n", found.end())
    line = text[start : end if end >= 0 else len(text)]
    words = line.split()
    at = found.start() - start
    column = len(line[:at].split()) - (at > 0 and not line[at - 1].isspace())
    words = [word.strip(",;:()") for word in words]  # "nan A100," is the file's "nan A100"
    pairs = {" ".join(words[i : i + 2]) for i in (column - 1, column) if 0 <= i < len(words) - 1}
    flat = " ".join(word.strip(",;:()") for word in source.split())
    return any(pair in flat for pair in pairs)


def _kind(token: str) -> str:
    """``nan`` or ``inf``: Python says ``inf`` where JSON wrote ``-Infinity``."""
    return token.lstrip("+-").lower()[:3]


def _refuse_constant(name: str) -> None:
    raise AssertionError(f"{name} in JSON output")


def no_long_echo(stderr: str, typed: Iterable[str], said: object) -> None:
    """No line repeats more than :data:`ECHO_LIMIT` (+ a step) characters of one typed value
    (checked on windows of the value: any longer run holds one whole)."""
    step = 10
    stderr = "\n".join(line for line in stderr.splitlines() if not line.startswith(KNOWN_ECHOES))
    for value in typed:
        if len(value) <= ECHO_LIMIT:
            continue
        for start in range(0, len(value) - ECHO_LIMIT + 1, step):
            window = value[start : start + ECHO_LIMIT]
            assert window not in stderr, (said, f"echoes over {ECHO_LIMIT} characters")
