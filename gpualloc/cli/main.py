"""The ``gpualloc`` executable: the entry point, and the one error boundary.

``run()`` reads the command line with the one parser (:mod:`gpualloc.cli.parser`: argparse,
built from the declarations for the command being run), answers ``--help``, ``--version`` and
the other options of gpualloc itself, applies the global options and calls the command. It is
the only place where a :class:`~gpualloc.errors.GpuallocError` becomes ``error: ...`` /
``hint: ...`` on stderr and an exit code, usage errors included (exit 2); tracebacks are shown
only with ``--debug``.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, NoReturn

from gpualloc.cli.output import CheckedStdout, StdoutClosed, flush_stdout, write_error
from gpualloc.cli.state import STATE
from gpualloc.errors import ExitCode, GpuallocError

if TYPE_CHECKING:
    from gpualloc.cli.parser import ShowHelp


def run(argv: list[str] | None = None) -> NoReturn:
    """Console-script entry point; never returns."""
    args = sys.argv[1:] if argv is None else list(argv)
    if COMPLETION_VARIABLE in os.environ:
        # typer's completion protocol, from a script an older gpualloc installed: no answer
        sys.exit(ExitCode.OK)
    if os.environ.get("_GPUALLOC_COMPLETE_LEASES"):  # a completion script asks
        from gpualloc.cli.complete import lease_ids

        sys.stdout.write("".join(f"{lease}\t{about}\n" for lease, about in lease_ids("")))
        sys.exit(ExitCode.OK)
    from gpualloc import notices

    STATE.reset()
    notices.slow_wait = _notice
    code: int = ExitCode.OK
    stdout, sys.stdout = sys.stdout, CheckedStdout(sys.stdout)
    try:
        code = _dispatch(args)
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
"""The variable typer's completion protocol set, which scripts of gpualloc 0.1 still send."""

TRUE_WORDS = frozenset({"1", "true", "t", "yes", "y", "on"})
FALSE_WORDS = frozenset({"", "0", "false", "f", "no", "n", "off"})
"""GPUALLOC_DEBUG's words, as click read a flag's variable (empty: not set)."""


def _dispatch(args: list[str]) -> int:
    """Read the command line and do what it says; the exit status."""
    from gpualloc.cli import parser
    from gpualloc.cli.commands import ALONE, DEBUG_VARIABLE

    STATE.debug = _debug_variable(os.environ.get(DEBUG_VARIABLE, ""))
    try:
        options, words = parser.parse_globals(args)
        if options["version"]:
            from gpualloc import __version__
            from gpualloc.cli.output import write_stdout

            write_stdout(f"gpualloc {__version__}\n")
            return ExitCode.OK
        if any(options[name] for name in ALONE):
            from gpualloc.cli import shell

            return shell.answer(options)
        invocation = parser.parse_command(words)
    except parser.ShowHelp as asked:
        return _help(asked)
    STATE.apply_global_options(
        topology=options["topology"],
        bandwidth_table=options["bandwidth_table"],
        refresh=options["refresh"],
        debug=options["debug"],
    )
    returned = invocation.command.run(**invocation.values)
    return returned if isinstance(returned, int) else ExitCode.OK


def _debug_variable(value: str) -> bool:
    word = value.strip().lower()
    if word in TRUE_WORDS or word in FALSE_WORDS:
        return word in TRUE_WORDS
    from gpualloc.cli.commands import DEBUG_VARIABLE
    from gpualloc.errors import RequestError
    from gpualloc.user_files import shown_value

    raise RequestError(
        f"invalid value for '--debug' (from {DEBUG_VARIABLE}): {shown_value(value)} is not "
        "true or false",
        hint=f"{DEBUG_VARIABLE}=1 shows tracebacks; 0, or leaving it unset, does not",
    )


def _help(asked: ShowHelp) -> int:
    """The help page asked for; a group given no command shows it on stderr, exit 2."""
    from gpualloc.cli.help import page
    from gpualloc.cli.output import write_stdout

    text = page(asked.path, asked.node)
    if asked.usage_error:
        sys.stderr.write(text)
        return ExitCode.USAGE
    write_stdout(text)
    return ExitCode.OK


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
