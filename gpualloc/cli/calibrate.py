"""``gpualloc calibrate``: measure this host's GPU-to-GPU bandwidth and plan with it."""

from __future__ import annotations

from typing import Annotated

import typer

from gpualloc.cli.state import STATE
from gpualloc.errors import NoGpuFound, RequestError

NOT_HERE_HINT = (
    "calibrate measures the GPUs of the host it runs on; for another host, import its "
    "measurements: gpualloc topo import --bandwidth-matrix FILE"
)
NO_GPU = (
    "no NVIDIA GPU on this host, nothing to calibrate (measurements taken elsewhere: "
    "gpualloc topo import --bandwidth-matrix FILE)"
)


def calibrate_command(
    size_mib: Annotated[
        int, typer.Option("--size-mib", min=1, metavar="MIB", help="MiB copied per transfer.")
    ] = 256,
    repeats: Annotated[int, typer.Option(min=1, metavar="N", help="Timed transfers per pair.")] = 5,
    forget: Annotated[
        bool,
        typer.Option("--forget", help="Remove the saved calibration: estimates are used again."),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Measure the copy bandwidth between every pair of this host's GPUs (with torch), save it,
    and let placement and 'simulate' use it from now on instead of estimates.

    The figures are kept beside the topology cache for these GPUs and this driver (a new GPU
    or driver needs a new calibration). Each link gets the slower of its two directions. With
    one GPU there is no pair to measure; without a GPU there is nothing to measure.
    """
    from gpualloc.cli.output import print_json, say
    from gpualloc.discovery import calibration

    if forget:
        removed = calibration.forget_calibration()
        if as_json:
            print_json({"forgotten": removed, "path": str(calibration.calibration_path())})
        else:
            say("calibration removed" if removed else "there was no calibration to remove")
        return
    if STATE.topology:  # --topology or GPUALLOC_TOPOLOGY
        raise RequestError(
            "calibrate measures this host's GPUs, not a recorded topology", hint=NOT_HERE_HINT
        )
    from gpualloc.discovery.resolve import host_key

    try:
        key = host_key()
    except NoGpuFound:
        raise NoGpuFound(NO_GPU) from None  # one line: nothing is wrong, there is just no GPU
    count = len(key.gpu_uuids)
    if count == 0:
        raise NoGpuFound(NO_GPU)
    if count == 1:
        message = "1 GPU on this host: pairwise bandwidth needs two GPUs; nothing measured"
        if as_json:
            print_json({"gpus": count, "measured": False, "reason": message})
        else:
            say(message)
        return
    backend = calibration.TorchCopy()
    if not as_json:
        say(f"measuring {count * (count - 1)} GPU pairs ({size_mib} MiB x {repeats} each) ...")
    result = calibration.measure(backend, key, size_bytes=size_mib * 2**20, repeats=repeats)
    path = calibration.save_calibration(result)
    if as_json:
        print_json({"gpus": count, "measured": True, "method": result.method,
                    "matrix_gbps": result.matrix, "saved": str(path)})  # fmt: skip
        return
    _show(result.matrix, str(path))


def _show(matrix: list[list[float]], path: str) -> None:
    from gpualloc.cli.output import Table, print_tables

    count = len(matrix)
    rows = [
        [f"GPU{a}", *("-" if a == b else f"{matrix[a][b]:.1f}" for b in range(count))]
        for a in range(count)
    ]
    print_tables(
        [
            Table(
                "Measured copy bandwidth, GB/s one way (row: from, column: to)",
                ["", *(f"GPU{b}" for b in range(count))],
                rows,
                right_align_from=1,
            )
        ],
        footer=[f"saved to {path}; plan, run and simulate use it from now on"],
    )
