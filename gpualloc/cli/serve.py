"""``gpualloc serve``: the broker that owns a multi-user host's ledger (:mod:`gpualloc.broker`)."""

from __future__ import annotations

from pathlib import Path

from gpualloc.cli.declare import Command, flag, job_option, value
from gpualloc.cli.state import STATE


def serve_command(
    socket: str | None, state_dir: Path | None, foreground: bool, ignore_foreign: bool | None
) -> None:
    """Own this host's ledger and serve every user's run, alloc, release, status and queue
    through a Unix socket, naming each caller by the kernel's SO_PEERCRED.

    Run it as root (examples/systemd has the units: 'systemctl enable --now gpualloc.socket').
    Clients use it whenever /run/gpualloc is root's directory (broker mode) or host.broker
    names it; a broker that does not answer is exit 18, never a fall-back to the shared file.
    Leases live with a process of their owner, which the broker watches (pidfd, /proc); a
    restart, kill -9 included, loses no lease. Stops on SIGTERM or SIGINT; leases stay in the
    ledger.
    """
    from gpualloc.broker.startup import serve
    from gpualloc.wire.address import DEFAULT_SOCKET, broker_socket

    if socket is not None:
        path = _socket_option(socket)
    else:
        path = broker_socket(STATE.setting("host.broker")) or Path(DEFAULT_SOCKET)
    serve(
        STATE.load_topology(),
        socket_path=path,
        state_dir=state_dir or STATE.config().system_value("broker.state_dir"),
        config=STATE.config(),
        background=not foreground,
        ignore_foreign=bool(STATE.setting("ignore_foreign", ignore_foreign)),
        topology_file=STATE.topology_file(),
    )


def _socket_option(text: str) -> Path:
    """``--socket``'s path, refused before the broker writes anything: an empty one or one
    too long for a Unix socket (exit 2), one where a file that is not a socket is (exit 18;
    the file is kept); tests/test_bad_input_options.py."""
    from gpualloc.broker.listener import activated, check_not_a_file, socket_path_too_long
    from gpualloc.errors import RequestError

    if not text.strip():
        raise RequestError(
            "--socket is empty", hint="give it a path, e.g. --socket /run/gpualloc/gpualloc.sock"
        )
    path = Path(text).absolute()
    if activated():
        return path  # systemd's socket is used, --socket is not
    too_long = socket_path_too_long(path)
    if too_long is not None:
        raise RequestError(
            f"--socket {too_long}", hint="give a shorter path, e.g. /run/gpualloc/gpualloc.sock"
        )
    check_not_a_file(path)
    return path


SERVE = Command(
    "serve",
    serve_command,
    options=(
        value(
            "--socket",
            metavar="PATH",  # text, not a path: '' is refused, not read as "."
            help="The Unix socket to listen on (default: host.broker of the configuration, "
            "else /run/gpualloc/gpualloc.sock). Ignored under systemd socket activation.",
        ),
        value(
            "--state-dir",
            kind="path",
            metavar="DIR",
            help="The broker's own state directory (default: broker.state_dir of the system "
            "configuration, else /var/lib/gpualloc): created 0755 when missing; refused when "
            "another user owns it or others may write it.",
        ),
        flag(
            "--foreground",
            negative=("--background",),
            default=True,
            help="Stay attached and log to stderr (systemd, tests), or detach once ready.",
        ),
        job_option("ignore_foreign", "serve"),
    ),
)
