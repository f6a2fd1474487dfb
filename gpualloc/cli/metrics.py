"""``gpualloc metrics``: Prometheus text on stdout, or served over HTTP (docs/metrics.md)."""

from __future__ import annotations

import sys

from gpualloc.cli.declare import Command, value
from gpualloc.errors import RequestError

DEFAULT_HOST = "127.0.0.1"


def metrics_command(serve: str | None) -> None:
    """Print the host's GPUs, leases and queue as Prometheus metrics: GPUs by state and per
    GPU (with the holder), leases by user, shared jobs, MIG devices, queue length and oldest
    wait, placements, decision latency and wait-time histograms. docs/metrics.md lists every
    metric.

    Example: `gpualloc metrics --serve :9400`, and in prometheus.yml a job scraping
    localhost:9400.
    """
    from gpualloc.cli.output import write_stdout

    if serve is None:
        write_stdout(scrape())
        return
    host, port = _address(serve)
    _serve(host, port)


def scrape() -> str:
    """One reading of the ledger as metrics text."""
    from gpualloc.cli.open_ledger import open_host_ledger
    from gpualloc.cli.state import STATE
    from gpualloc.ledger.idle import IdlePolicy
    from gpualloc.prometheus import render

    ledger = open_host_ledger(create=False)
    txn = ledger.snapshot()
    return render(ledger, txn, ledger.occupancy(txn.ledger), IdlePolicy.from_config(STATE.config()))


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    try:
        number = int(port)
        if not 0 < number < 65536:
            raise ValueError
    except ValueError:
        from gpualloc.user_files import shown_value

        raise RequestError(
            f"--serve {shown_value(text)} is not [HOST]:PORT",
            hint="e.g. --serve :9400 or 127.0.0.1:9400",
        ) from None
    return host.strip("[]") or DEFAULT_HOST, number


def _serve(host: str, port: int) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from gpualloc.cli.open_ledger import say
    from gpualloc.errors import GpuallocError

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] not in ("/metrics", "/"):
                self.send_error(404, "only /metrics is served")
                return
            try:
                body, status = scrape().encode(), 200
            except GpuallocError as problem:
                body, status = f"# error: {problem.message}\n".encode(), 503
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # a scrape every few seconds is not news

    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError as exc:
        raise _serve_error(host, port, exc) from None
    say(f"serving metrics on http://{host}:{server.server_address[1]}/metrics (Ctrl-C stops)")
    sys.stderr.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def _serve_error(host: str, port: int, exc: OSError) -> RequestError:
    """Why ``--serve`` could not listen, with the remedy for that cause: a port in use or
    reserved wants another port, a name that does not resolve or an address this host does not
    have wants another address (tests/test_bad_input_options.py)."""
    import errno
    import socket

    where = f"cannot serve on {host}:{port}"
    reason = exc.strerror or str(exc)
    if isinstance(exc, socket.gaierror):
        return RequestError(
            f"{where}: the host name does not resolve ({reason})",
            hint="give an address of this host: --serve :9400 (all) or 127.0.0.1:9400",
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return RequestError(
            f"{where}: {reason} (not an address of this host)",
            hint="give an address of this host: --serve :9400 (all) or 127.0.0.1:9400",
        )
    if exc.errno == errno.EADDRINUSE:
        return RequestError(f"{where}: {reason}", hint="choose another port")
    if exc.errno == errno.EACCES and port < 1024:
        return RequestError(f"{where}: {reason}", hint="choose a port above 1023")
    return RequestError(f"{where}: {reason}")


METRICS = Command(
    "metrics",
    metrics_command,
    options=(
        value(
            "--serve",
            metavar="[HOST]:PORT",
            help="Serve the metrics at http://HOST:PORT/metrics until interrupted, read afresh "
            "for every scrape (HOST defaults to 127.0.0.1: give 0.0.0.0 to let other machines "
            "scrape, with a firewall in front).",
        ),
    ),
)
