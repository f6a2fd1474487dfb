"""``gpualloc calibrate``: measure this host's GPU-to-GPU bandwidth and plan with it."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from gpualloc.cli.declare import Command, flag, json_flag, value
from gpualloc.cli.state import STATE
from gpualloc.errors import NoGpuFound, RequestError

if TYPE_CHECKING:
    from gpualloc.discovery.cache import CacheKey
    from gpualloc.discovery.calibration import Calibration, MeasuredCollective
    from gpualloc.model.topology import Topology

# Each hint leads somewhere true (tests/test_calibrate.py): topo import takes pairwise copy
# figures only, and
# calibrate --from stores any figures, nccl-tests' collectives too, but only for this host's GPUs.
IMPORT_ELSEWHERE = (
    "gpualloc topo import --bandwidth-matrix FILE, FILE from nvbandwidth or "
    "p2pBandwidthLatencyTest (a topology holds GPU pairs, not nccl-tests' collectives)"
)
NOT_HERE_HINT = (
    "calibrate measures the GPUs of the host it runs on; for another host, import its "
    f"measurements: {IMPORT_ELSEWHERE}"
)
NO_GPU = (
    f"no NVIDIA GPU on this host, nothing to calibrate (measured elsewhere: {IMPORT_ELSEWHERE})"
)
NO_GPU_FROM = "no NVIDIA GPU on this host: calibrate --from stores figures for this host's GPUs"
NO_GPU_FROM_HINT = (
    f"run it on the host that made the file; for a topology of that host: {IMPORT_ELSEWHERE}"
)


def calibrate_command(
    size_mib: int,
    repeats: int,
    from_files: list[Path] | None,
    collectives: bool | None,
    forget: bool,
    as_json: bool,
) -> None:
    """Measure the bandwidth between this host's GPUs, save it, and let placement and
    'simulate' use it from now on instead of estimates.

    Pairs: every GPU copies to every other with torch (else nvbandwidth, when on PATH). Sets:
    all_reduce_perf (nccl-tests, when on PATH; else torch.distributed) measures the all-reduce
    bus bandwidth of every pair, each NUMA node's GPUs and all of them. --from FILE stores
    outputs of those tools made earlier on this host instead. Pairs that measure far below
    their link class, or whose P2P is slower than staged copies, are kept and reported by
    'gpualloc doctor'.

    The figures are kept beside the topology cache for these GPUs and this driver (a new GPU
    or driver needs a new calibration). Each link gets the slower of its two directions. With
    one GPU there is no pair or set to measure; without a GPU there is nothing to measure.
    """
    from gpualloc.cli.output import print_json, say
    from gpualloc.discovery import calibration

    if forget and (from_files or collectives is not None):
        given = "--from" if from_files else "--collectives/--no-collectives"
        raise RequestError(
            f"--forget removes the saved calibration; {given} is for making one",
            hint="give --forget alone, or leave it out",
        )
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

    texts = _read_measurements(from_files or [])  # a file that cannot be read says so first
    try:
        key = host_key()
    except NoGpuFound:
        raise _no_gpu(bool(from_files)) from None
    count = len(key.gpu_uuids)
    if count == 0:
        raise _no_gpu(bool(from_files))
    if texts:
        result = _imported(texts, key)
    elif count == 1:
        message = "1 GPU on this host: pairwise and collective figures need two; nothing measured"
        if as_json:
            print_json({"gpus": count, "measured": False, "reason": message})
        else:
            say(message)
        return
    else:
        result = _measured(key, size_mib * 2**20, repeats, collectives, quiet=as_json)
    path = calibration.save_calibration(result)
    if as_json:
        from gpualloc.model.validation import to_builtins

        print_json({"gpus": count, "measured": True, "method": result.method,
                    "matrix_gbps": result.matrix,
                    "collectives": [to_builtins(c) for c in result.collectives],
                    "findings": [to_builtins(f) for f in result.findings],
                    "sources": result.sources, "saved": str(path)})  # fmt: skip
        return
    _show(result, str(path))


def _no_gpu(stores: bool) -> NoGpuFound:
    """No GPU here: one line when nothing is wrong, there is just nothing to measure; a hint
    when figures to store (``--from``) have no GPUs here to belong to."""
    if stores:
        return NoGpuFound(NO_GPU_FROM, hint=NO_GPU_FROM_HINT)
    return NoGpuFound(NO_GPU)


def _estimated_host() -> Topology:
    """This host's topology with estimated bandwidths (what a measurement is checked against)."""
    from gpualloc.model.bandwidth import DEFAULT_BANDWIDTH_TABLE

    table = STATE.bandwidth_override() or DEFAULT_BANDWIDTH_TABLE
    return STATE.load_topology().estimated(table)


def _read_measurements(files: list[Path]) -> list[tuple[str, str]]:
    from gpualloc.discovery.recorded import read_text

    return [(str(path), read_text(path, "measurement file")) for path in files]


def _imported(texts: list[tuple[str, str]], key: CacheKey) -> Calibration:
    from gpualloc.discovery.measure_tools import from_recordings

    return from_recordings(texts, key, _estimated_host())


def _measured(
    key: CacheKey, size_bytes: int, repeats: int, collectives: bool | None, *, quiet: bool
) -> Calibration:
    """Every pair's copy bandwidth, then (unless ``collectives`` is False) the all-reduces of
    the sets :func:`~gpualloc.discovery.measure_tools.collective_sets` names; with
    ``collectives`` None a collective that cannot be measured is a warning, not an error."""
    from msgspec.structs import replace

    result, have_torch = _measure_pairs(key, size_bytes, repeats, quiet=quiet)
    if collectives is False:
        return result
    measured = _measure_collectives(have_torch, required=bool(collectives), quiet=quiet)
    if measured is None:
        return result
    found, source = measured
    return replace(result, collectives=found, sources=[*result.sources, source])


def _measure_pairs(
    key: CacheKey, size_bytes: int, repeats: int, *, quiet: bool
) -> tuple[Calibration, bool]:
    """The pairs, with torch, else nvbandwidth; and whether torch can run NCCL here."""
    from gpualloc.cli.output import say
    from gpualloc.discovery import calibration, measure_tools
    from gpualloc.discovery.torch_collectives import nccl_available

    count = len(key.gpu_uuids)
    try:
        backend = calibration.TorchCopy()
    except calibration.CalibrationUnavailable as no_torch:
        if shutil.which("nvbandwidth") is None:
            raise no_torch from None
        if not quiet:
            say(f"{no_torch}; measuring with nvbandwidth instead")
        ordinals = _estimated_host().cuda_ordinals()
        return measure_tools.measure_with_nvbandwidth(key, ordinals), False
    have_torch = nccl_available(getattr(backend, "torch", None))
    with _progress(count * (count - 1), "copies", quiet) as step:
        result = calibration.measure(
            backend, key, size_bytes=size_bytes, repeats=repeats, progress=step
        )
    return result, have_torch


def _measure_collectives(
    have_torch: bool, *, required: bool, quiet: bool
) -> tuple[list[MeasuredCollective], str] | None:
    """(the all-reduces measured, the tool's name) with all_reduce_perf, else torch.distributed
    over NCCL; None when neither can run and they are not ``required``."""
    from gpualloc.cli.output import say
    from gpualloc.discovery import calibration, measure_tools

    tool = measure_tools.all_reduce_perf()
    if tool is None and not have_torch:
        if required:
            raise calibration.CalibrationUnavailable(
                "cannot measure collectives: all_reduce_perf is not on PATH and torch is not "
                "installed",
                hint="build NVIDIA's nccl-tests and put its build directory on PATH, or install "
                "torch; or leave out --collectives",
            )
        return None
    host = _estimated_host()
    sets = measure_tools.collective_sets(host)
    if tool is not None:
        with _progress(len(sets), "all-reduces", quiet) as step:
            found = measure_tools.measure_collectives(
                tool, sets, progress=step, ordinals=host.cuda_ordinals()
            )
            return found, "all_reduce_perf"
    from gpualloc.discovery.torch_collectives import measure_sets

    if not quiet:
        say(f"measuring {len(sets)} all-reduces with torch.distributed (NCCL) ...")
    try:
        measured = measure_sets(sets, measure_tools.ALL_REDUCE_BYTES, ordinals=host.cuda_ordinals())
        return measured, "torch.distributed"
    except calibration.CalibrationUnavailable as failed:
        if required:
            raise
        say(f"warning: collectives not measured ({failed}); the pairs are saved")
        return None


@contextlib.contextmanager
def _progress(total: int, what: str, quiet: bool) -> Iterator[Callable[..., None]]:
    """A rich progress bar on stderr (nothing under --json or without a terminal)."""
    import sys

    if quiet or not sys.stderr.isatty():
        yield lambda *_: None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(f"measuring {total} {what}", total=total)
        yield lambda *_: bar.advance(task)


def _show(result: Calibration, path: str) -> None:
    from gpualloc.cli.output import Table, print_tables

    tables = []
    matrix = result.matrix
    count = len(matrix)
    if matrix:
        rows = [
            [f"GPU{a}", *("-" if a == b else f"{matrix[a][b]:.1f}" for b in range(count))]
            for a in range(count)
        ]
        tables.append(
            Table(
                "Measured copy bandwidth, GB/s one way (row: from, column: to)",
                ["", *(f"GPU{b}" for b in range(count))],
                rows,
                right_align_from=1,
            )
        )
    if result.collectives:
        rows = [
            [
                ",".join(map(str, c.gpus)),
                c.operation,
                f"{c.busbw_gbps:.1f}",
                "disabled" if c.p2p_disabled else "",
                c.source,
            ]
            for c in result.collectives
        ]
        tables.append(
            Table("Measured collectives", ["GPUs", "Operation", "Bus GB/s", "P2P", "From"], rows)
        )
    if result.findings:
        rows = [[f"{f.gpus[0]}-{f.gpus[1]}", f.kind, f.detail] for f in result.findings]
        columns = ["GPUs", "Finding", "Detail"]
        tables.append(Table("Measured wrong (see gpualloc doctor)", columns, rows, wrap=(2,)))
    print_tables(tables, footer=[f"saved to {path}; plan, run and simulate use it from now on"])


CALIBRATE = Command(
    "calibrate",
    calibrate_command,
    options=(
        value(
            "--size-mib",
            kind="int",
            minimum=1,
            metavar="MIB",
            default=256,
            help="MiB copied per transfer.",
        ),
        value(
            "--repeats",
            kind="int",
            minimum=1,
            metavar="N",
            default=5,
            help="Timed transfers per pair.",
        ),
        value(
            "--from",
            dest="from_files",
            kind="path",
            metavar="FILE",
            repeat=True,
            help="Store these outputs of nvbandwidth, p2pBandwidthLatencyTest or nccl-tests, "
            "made on this host, instead of measuring (repeat for several).",
        ),
        flag(
            "--collectives",
            negative=("--no-collectives",),
            default=None,
            help="Also measure all-reduce bus bandwidth with all_reduce_perf, else "
            "torch.distributed (default: when either is there).",
        ),
        flag("--forget", help="Remove the saved calibration: estimates are used again."),
        json_flag("Print the result as JSON."),
    ),
)
