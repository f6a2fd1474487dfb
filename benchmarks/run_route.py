"""The route of ``gpualloc run`` from argv to exec, traced (docs/development.md gives its figures).

Runs ``gpualloc --topology dgx1-v100 run -n 2 --sensitive -- true`` in this process under
:func:`sys.setprofile` until the exec (stood in for, so nothing is exec'd), on the embedded
ledger and through a real broker (``gpualloc serve`` on a socket of its own, the broker's fast
client), and prints for each:

- **files**: the gpualloc source files whose functions ran on the way (a module only imported,
  its body run for its definitions, does not count here);
- **loaded**: the gpualloc source files whose code ran at all (imports included);
- **re-entries**: files entered again while a call from them was still open, i.e. the same file
  twice on one call stack at file level (``a -> b -> a``): control going back and forth
  between two modules instead of down through the layers. The route has none when 0. A struct's
  own hook (``__post_init__``) that a decoder calls back is not counted: it is the data model
  checking itself, not control moving back up.

    python benchmarks/run_route.py [--json] [--show]

``--show`` lists the files in the order first entered.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parent.parent / "gpualloc"
ARGV = ["--topology", "dgx1-v100", "run", "-n", "2", "--sensitive", "--", "true"]


class _Exec(BaseException):
    """Raised where the job would be exec'd: the end of the route."""


def _relative(filename: str) -> str | None:
    """``gpualloc/...`` for a file of the package; None for any other code."""
    if not filename.endswith(".py"):
        return None  # frozen modules, <string>
    path = Path(filename).resolve()
    if not path.is_relative_to(PACKAGE):
        return None
    return str(path.relative_to(PACKAGE.parent))


def trace_route(argv: list[str]) -> dict[str, Any]:
    """The files and re-entries of one ``gpualloc ARGV`` in this process, up to its exec."""
    import gpualloc.launcher.exec as exec_module

    files: dict[str, None] = {}
    loaded: dict[str, None] = {}
    stack: list[str | None] = []
    reentries: list[str] = []

    def profile(frame: Any, event: str, _arg: Any) -> None:
        if event == "call":
            name = _relative(frame.f_code.co_filename)
            if name is not None:
                loaded.setdefault(name, None)
                if frame.f_code.co_name != "<module>":
                    files.setdefault(name, None)
                caller = next((f for f in reversed(stack) if f is not None), None)
                hook = frame.f_code.co_name.startswith("__")  # a decoder's call of __post_init__
                if name != caller and name in stack and not hook:
                    reentries.append(" -> ".join([*_file_path(stack), name]))
            stack.append(name)
        elif event == "return" and stack:
            stack.pop()

    def stop(*_args: object, **_kwargs: object) -> None:
        raise _Exec

    original = exec_module.os.execvpe
    exec_module.os.execvpe = stop  # type: ignore[assignment]
    from gpualloc.cli.main import run

    sys.setprofile(profile)
    try:
        run(argv)
    except (_Exec, SystemExit):
        pass
    finally:
        sys.setprofile(None)
        exec_module.os.execvpe = original  # type: ignore[assignment]
    return {"files": list(files), "loaded": list(loaded), "reentries": reentries}


def _file_path(stack: list[str | None]) -> list[str]:
    """The call stack at file level: consecutive frames of one file as one."""
    path: list[str] = []
    for name in stack:
        if name is not None and (not path or path[-1] != name):
            path.append(name)
    return path


def _child(mode: str) -> dict[str, Any]:
    """Trace in a fresh interpreter, so that every import of the route counts."""
    done = subprocess.run(
        [sys.executable, __file__, "--child", mode],
        capture_output=True, text=True, check=True, env=os.environ.copy(),
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


@contextmanager
def _broker() -> Iterator[None]:
    """A broker of this user's on a socket of its own, named by ``GPUALLOC_BROKER``."""
    directory = Path(tempfile.mkdtemp(prefix="gpualloc-route-"))
    socket = directory / "broker.sock"
    command = [sys.executable, "-m", "gpualloc", "--topology", "dgx1-v100", "serve",
               "--socket", str(socket), "--state-dir", str(directory / "state")]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not socket.exists():
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the broker did not start")
            time.sleep(0.05)
        os.environ["GPUALLOC_BROKER"] = str(socket)
        yield
    finally:
        os.environ.pop("GPUALLOC_BROKER", None)
        server.terminate()
        server.wait(timeout=30)


def measure() -> dict[str, dict[str, Any]]:
    """The route on the embedded ledger and through the broker."""
    with tempfile.TemporaryDirectory() as state:
        os.environ["GPUALLOC_STATE_DIR"] = state
        embedded = _child("embedded")
        with _broker():
            brokered = _child("broker")
    return {"embedded": embedded, "broker": brokered}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--show", action="store_true", help="list the files in order")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        argv = ARGV if options.child == "embedded" else ARGV[2:]  # the broker's own topology
        print(json.dumps(trace_route(argv)))
        return
    routes = measure()
    if options.json:
        print(json.dumps(routes, indent=2))
        return
    print(f"{'route':<10} {'files':>5} {'loaded':>6} {'re-entries':>10}")
    for name, route in routes.items():
        counts = (len(route["files"]), len(route["loaded"]), len(route["reentries"]))
        print(f"{name:<10} {counts[0]:>5} {counts[1]:>6} {counts[2]:>10}")
        if options.show:
            print("\n".join(f"  {f}" for f in route["files"]))
        for line in route["reentries"][:5]:
            print(f"  re-entered: {line}")


if __name__ == "__main__":
    main()
