"""The house rules of what gpualloc says, one assertion each, for every test that holds them.

A refusal (README, "Errors"): one ``error:`` line, at most one ``hint:`` line, no traceback
(``--debug`` asks for one) and no internal error, with a documented exit code. What reaches a
terminal from users and files: no raw control character (``\\x1b[2J`` arrives escaped).
"""

from __future__ import annotations

from typing import Protocol


class Answer(Protocol):
    """What a command said: its standard error (and, for the exit code, ``exit_code`` of
    :class:`tests.cli_harness.Result` or ``returncode`` of a finished subprocess)."""

    stderr: str


def refused(
    answer: Answer | str, code: int | None = None, *, alone: bool = False, case: object = None
) -> str:
    """Hold the refusal ``answer`` (or its standard error) to the house rule, and return its
    one ``error:`` line: exactly one line starting ``error: ``, at most one ``hint: ``, no
    traceback and no internal error; ``code``: the exit code it must have; ``alone``: nothing
    but the error line and at most its hint after it (the whole of a usage error); ``case``:
    what made it, said first in a failure (a fuzzing case's input)."""
    stderr = answer if isinstance(answer, str) else answer.stderr
    if code is not None:
        assert not isinstance(answer, str), "an exit code needs the answer, not its stderr"
        exit_code = getattr(answer, "exit_code", getattr(answer, "returncode", None))
        assert exit_code == code, (case, exit_code, getattr(answer, "stdout", None), stderr)
    lines = stderr.splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1, (case, "not one error line", lines)
    assert sum(line.startswith("hint: ") for line in lines) <= 1, (case, "hints", lines)
    assert "Traceback" not in stderr and "internal error" not in stderr, (case, stderr)
    if alone:
        assert lines[0] == errors[0] and len(lines) <= 2, (case, lines)
        assert all(line.startswith("hint: ") for line in lines[1:]), (case, lines)
    return errors[0]


def no_control_characters(*texts: str) -> None:
    """No escape (ESC) or bell (BEL) character, raw, in what a command printed."""
    for text in texts:
        assert "\x1b" not in text and "\x07" not in text, text
