"""The ``gpualloc`` executable: the entry point, and the one error boundary.

``run()`` prints help pages and the version itself when they are fixed texts
(:mod:`gpualloc.cli.static_help`), hands every well-formed command line to
:mod:`gpualloc.cli.fastpath`, which calls the commands directly; everything else, ``--help``
after options, usage errors and any line the fast path does not fully understand, goes to the
typer application (:mod:`gpualloc.cli.app`), which imports typer and through it pydantic: about
four fifths of a command's start-up (issue 18, point 9; issue 43, point 3). Either way, ``run()``
is the only place where a :class:`~gpualloc.errors.GpuallocError` becomes ``error: ...`` /
``hint: ...`` on stderr and an exit code; tracebacks are shown only with ``--debug``.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any, NoReturn

from gpualloc.cli.output import CheckedStdout, StdoutClosed, flush_stdout, write_error
from gpualloc.cli.state import STATE
from gpualloc.errors import ExitCode, GpuallocError


def run(argv: list[str] | None = None) -> NoReturn:
    """Console-script entry point; never returns."""
    args = sys.argv[1:] if argv is None else list(argv)
    if COMPLETION_VARIABLE in os.environ:
        # typer's completion protocol, from a script an older gpualloc installed: no answer
        sys.exit(ExitCode.OK)
    if os.environ.get("_GPUALLOC_COMPLETE_LEASES"):  # a completion script asks (no typer)
        from gpualloc.cli.complete import lease_ids

        sys.stdout.write("".join(f"{lease}\t{about}\n" for lease, about in lease_ids("")))
        sys.exit(ExitCode.OK)
    from gpualloc import notices
    from gpualloc.cli import fastpath

    STATE.reset()
    STATE.debug = _debug_variable(os.environ.get("GPUALLOC_DEBUG", ""))
    notices.slow_wait = _notice
    code: int = ExitCode.OK
    stdout, sys.stdout = sys.stdout, CheckedStdout(sys.stdout)
    try:
        if _static_help(args):
            sys.exit(ExitCode.OK)
        command = fastpath.parse(args, os.environ)
        if command is None:
            code = _run_typer(args)
        else:
            returned = command.invoke()
            code = returned if isinstance(returned, int) else ExitCode.OK  # as _run_typer
        flush_stdout()  # output that could not be written is exit 8, never a success
    except GpuallocError as exc:
        _report(exc.message, exc.hint, exc.details)
        code = exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted\n")
        code = ExitCode.INTERRUPTED
    except (StdoutClosed, BrokenPipeError):
        _quiet_broken_pipe()
    except Exception as exc:  # the last resort: a bug in gpualloc
        _report(
            f"internal error: {type(exc).__name__}: {exc}",
            "rerun with --debug and report the traceback",
        )
        code = ExitCode.INTERNAL
    finally:
        sys.stdout = stdout
    sys.exit(int(code))


COMPLETION_VARIABLE = "_GPUALLOC_COMPLETE"
"""typer's completion variable (:data:`gpualloc.cli.fastpath.COMPLETION_VARIABLE`), read here
before the fast path is imported: a Tab on ``release`` asks for lease ids without it."""

TRUE_WORDS = frozenset({"1", "true", "t", "yes", "y", "on"})
"""What click reads as true (GPUALLOC_DEBUG is --debug's variable): any other value is not
debugging, and typer refuses a word it cannot read (exit 2), as for any flag."""


def _debug_variable(value: str) -> bool:
    return value.strip().lower() in TRUE_WORDS


def _static_help(args: list[str]) -> bool:
    """Print the help page of ``args`` without typer when it is a known fixed text (see
    :mod:`gpualloc.cli.static_help`), and ``--version`` alone; a group given nothing exits 2 as
    click's would."""
    from gpualloc.cli.output import write_stdout

    if len(args) > 1 and args[-1] not in ("--help", "-h"):
        return False  # a command line to run: no page (page_for would say so, imported)
    if args == ["--version"]:
        from gpualloc import __version__

        write_stdout(f"gpualloc {__version__}\n")  # as the typer app's --version
        return True
    from gpualloc.cli.static_help import page_for

    page = page_for(args)
    if page is None:
        return False
    if page.usage_error:
        sys.stderr.write(page.text)
        sys.exit(ExitCode.USAGE)
    write_stdout(page.text)
    return True


def _run_typer(args: list[str]) -> int:
    """The typer application's exit status; click's own exceptions become exit codes here."""
    # typer >= 0.20 vendors click; older versions use the click package. Take the exception
    # classes from whichever click this typer raises.
    import typer

    from gpualloc.cli.app import app

    click = sys.modules[typer.BadParameter.__module__]
    exits = tuple({typer.Exit, getattr(click, "Exit", typer.Exit)})
    aborts = tuple({typer.Abort, getattr(click, "Abort", typer.Abort)})
    try:
        code = app(args=args, standalone_mode=False, prog_name="gpualloc")
    except exits as exc:
        return int(exc.exit_code)
    except click.UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # a group given nothing: its help
            exc.show()
        else:
            _report(*usage_error_lines(exc))
        return ExitCode.USAGE
    except click.ClickException as exc:
        exc.show()
        return int(exc.exit_code)
    except aborts:
        raise KeyboardInterrupt from None
    return code if isinstance(code, int) else ExitCode.OK


_PYDANTIC_PHRASES = (
    (r"Input should be greater than or equal to (\S+)", r"must be at least \1"),
    (r"Input should be greater than (\S+)", r"must be more than \1"),
    (r"Input should be less than or equal to (\S+)", r"must be at most \1"),
    (r"Input should be less than (\S+)", r"must be less than \1"),
    (r"Input should be a valid integer.*", "must be a whole number"),
    (r"Input should be a valid number.*", "must be a number"),
    (r"Input should be ", "must be "),
)
"""typer 0.29 words a bad value as pydantic does; say it as the rest of gpualloc does. Patterns,
compiled by :mod:`re` when a usage error is written: not on every command's start."""


_QUOTED = r"'([^']{121,})'"
"""A value click quotes in its message, too long to say back whole (issue 42, point 3)."""


def _global_option(name: str | None, context: Any) -> str | None:
    """The hint for a global option given after the command (``gpualloc run --topology X``):
    where it goes instead; None for any other unknown option."""
    from gpualloc.cli.fastpath import GLOBAL_OPTIONS

    if not name or context is None or context.parent is None:
        return None
    option = next((option for option in GLOBAL_OPTIONS if name in option.names), None)
    if option is None:
        return None
    given = name if option.kind == "flag" else f"{name} ..."
    command = context.command_path.removeprefix("gpualloc ")
    example = f"gpualloc {given} {command} ..."
    return f"{name} is a global option: it goes before the command ('{example}')"


def usage_error_lines(exc: Any) -> tuple[str, str]:
    """A click usage error as gpualloc's two lines: what is wrong, and how it is used."""
    message = exc.format_message()
    for pattern, replacement in _PYDANTIC_PHRASES:
        message = re.sub(pattern, replacement, message)
    message = message.rstrip(".")
    message = message[:1].lower() + message[1:] if message[:2] != "--" else message
    if re.search(_QUOTED, message):
        from gpualloc.user_files import shown_text

        message = re.sub(_QUOTED, lambda quoted: f"'{shown_text(quoted.group(1))}'", message)
    context = getattr(exc, "ctx", None)
    misplaced = _global_option(getattr(exc, "option_name", None), context)
    if misplaced is not None:
        return message.split(" (Possible options")[0], misplaced
    if context is None:
        return message, "'gpualloc --help' lists the commands and options"
    usage = " ".join(context.get_usage().split())  # one line
    usage = usage.removeprefix("Usage: ")
    return message, f"{usage} ('{context.command_path} --help' explains)"


def _notice(line: str) -> None:
    sys.stderr.write(f"note: {line}\n")


def _report(message: str, hint: str | None, details: tuple[str, ...] = ()) -> None:
    if STATE.debug:
        import traceback

        traceback.print_exc()
    write_error(message, hint, details)


def _quiet_broken_pipe() -> NoReturn:
    """The reader went away (``gpualloc ... | head``): stop quietly, as cat does."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    sys.exit(ExitCode.BROKEN_PIPE)
