"""The ``gpualloc`` command: global options, the command groups, and the one error boundary.

Start-up is a feature (house style habit 9): this module imports typer and nothing heavy.
pydantic, networkx, pynvml and psutil load inside the commands that need them, and a test checks
what ``gpualloc --help`` loaded. ``run()`` is the only place where a
:class:`~gpualloc.errors.GpuallocError` becomes ``error: ...`` / ``hint: ...`` on stderr and an
exit code; tracebacks are shown only with ``--debug``.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Annotated, Optional

import typer

from gpualloc import __version__
from gpualloc.cli import complete, config, leases, plan, run, simulate, slurm, status, topo
from gpualloc.cli.output import StdoutClosed, write_stdout
from gpualloc.cli.state import STATE
from gpualloc.errors import ExitCode, FileAccessError, GpuallocError

ENVIRONMENT_VARIABLES = (
    ("GPUALLOC_TOPOLOGY", "as --topology"),
    ("GPUALLOC_BANDWIDTH_TABLE", "as --bandwidth-table"),
    ("GPUALLOC_CACHE_DIR", "where discovered topologies are cached (default ~/.cache/gpualloc)"),
    ("GPUALLOC_STATE_DIR", "the shared ledger's directory (default /var/tmp/gpualloc)"),
    ("GPUALLOC_DEBUG=1", "as --debug"),
    ("GPUALLOC_POLICY", "as --policy (default mapa)"),
    ("GPUALLOC_NUMA", "as run --numa (default auto)"),
    ("GPUALLOC_IGNORE_FOREIGN=1", "as --ignore-foreign"),
    ("GPUALLOC_PRIORITY, GPUALLOC_MAX_BYPASS", "as --priority and --max-bypass of --wait"),
    ("GPUALLOC_SYSTEM_CONFIG", "the system config file (default /etc/gpualloc/config.toml)"),
    ("XDG_CONFIG_HOME", "the user's config file is $XDG_CONFIG_HOME/gpualloc/config.toml"),
    ("GPUALLOC_NO_SLURM=1", "inside a Slurm job, use the host's ledger and GPUs"),
    ("GPUALLOC_LEASE_ID, GPUALLOC_GPUS", "set for jobs: their lease id and GPU indices"),
)
ENVIRONMENT_HELP = (
    "Environment variables:\n\n"
    + "\n\n".join(f"* {name}: {meaning}" for name, meaning in ENVIRONMENT_VARIABLES)
    + "\n\nExit codes: "
    + ", ".join(f"{int(code)} {code.name.lower().replace('_', '-')}" for code in ExitCode)
)

# typer >= 0.20 vendors click; older versions use the click package. Take the exception classes
# from whichever click this typer raises.
_click_exceptions = sys.modules[typer.BadParameter.__module__]
ClickException: type[Exception] = _click_exceptions.ClickException
UsageError: type[Exception] = _click_exceptions.UsageError
EXIT_EXCEPTIONS = tuple({typer.Exit, getattr(_click_exceptions, "Exit", typer.Exit)})
ABORT_EXCEPTIONS = tuple({typer.Abort, getattr(_click_exceptions, "Abort", typer.Abort)})

app = typer.Typer(
    name="gpualloc",
    help=(
        "Topology-aware GPU allocator and job launcher for a shared multi-GPU host.\n\n"
        "Without a GPU, every command works on a bundled or recorded topology: "
        "`gpualloc --topology dgx1-v100 topo show`"
    ),
    epilog=ENVIRONMENT_HELP,
    rich_markup_mode="markdown",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(topo.app, name="topo")
app.command("plan")(plan.plan_command)
app.command("run", context_settings={"allow_interspersed_args": False})(run.run_command)
app.command("alloc")(leases.alloc_command)
app.command("release")(leases.release_command)
app.command("status")(status.status_command)
app.command("gc")(leases.gc_command)
app.command("simulate")(simulate.simulate_command)
app.add_typer(slurm.app, name="slurm")
app.add_typer(config.app, name="config")


def _version(value: bool) -> None:
    if value:
        write_stdout(f"gpualloc {__version__}\n")
        raise typer.Exit()


@app.callback()
def main(
    topology: Annotated[
        Optional[str],  # noqa: UP045 - typer needs Optional on Python 3.10
        typer.Option(
            "--topology",
            "-t",
            envvar="GPUALLOC_TOPOLOGY",
            metavar="NAME|PATH",
            help="Work on a bundled topology (see 'topo list') or a topology file (gpualloc "
            "JSON or 'nvidia-smi topo -m' text) instead of probing this host.",
            autocompletion=complete.topologies,
        ),
    ] = None,
    bandwidth_table: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            "--bandwidth-table",
            metavar="FILE",
            help="JSON file overriding entries of the link bandwidth table (else "
            "GPUALLOC_BANDWIDTH_TABLE, else bandwidth_table in config.toml).",
        ),
    ] = None,
    refresh: Annotated[
        bool, typer.Option("--refresh", help="Probe the host again instead of using the cache.")
    ] = False,
    debug: Annotated[
        bool,
        typer.Option("--debug", envvar="GPUALLOC_DEBUG", help="Show tracebacks on errors."),
    ] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Global options, shared by every command."""
    if bandwidth_table is not None and not bandwidth_table.is_file():
        raise FileAccessError(
            f"bandwidth table {bandwidth_table} does not exist or is not a file",
            hint="check the path given to --bandwidth-table",
        )
    STATE.topology = topology
    STATE.bandwidth_table = bandwidth_table
    STATE.refresh = refresh
    STATE.debug = debug or STATE.debug


def run(argv: list[str] | None = None) -> None:
    """Console-script entry point; never returns."""
    from gpualloc.ledger import locking

    STATE.reset()
    STATE.debug = os.environ.get("GPUALLOC_DEBUG", "") not in ("", "0")
    locking.slow_wait_notice = _notice
    try:
        code = app(args=argv, standalone_mode=False, prog_name="gpualloc")
    except GpuallocError as exc:
        _report(exc.message, exc.hint, exc.details)
        sys.exit(int(exc.exit_code))
    except EXIT_EXCEPTIONS as exc:
        sys.exit(exc.exit_code)
    except ClickException as exc:
        exc.show()
        sys.exit(ExitCode.USAGE if isinstance(exc, UsageError) else exc.exit_code)
    except (KeyboardInterrupt, *ABORT_EXCEPTIONS):
        sys.stderr.write("\ninterrupted\n")
        sys.exit(ExitCode.INTERRUPTED)
    except (StdoutClosed, BrokenPipeError):
        _quiet_broken_pipe()
    except Exception as exc:  # the last resort: a bug in gpualloc
        _report(
            f"internal error: {type(exc).__name__}: {exc}",
            "rerun with --debug and report the traceback",
        )
        sys.exit(ExitCode.INTERNAL)
    sys.exit(code if isinstance(code, int) else ExitCode.OK)


def _notice(line: str) -> None:
    sys.stderr.write(f"note: {line}\n")


def _report(message: str, hint: str | None, details: tuple[str, ...] = ()) -> None:
    if STATE.debug:
        traceback.print_exc()
    sys.stderr.write(f"error: {message}\n")
    for line in details:
        sys.stderr.write(f"  {line}\n")
    if hint:
        sys.stderr.write(f"hint: {hint}\n")


def _quiet_broken_pipe() -> None:
    """The reader went away (``gpualloc ... | head``): stop quietly, as cat does."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    sys.exit(ExitCode.BROKEN_PIPE)
