"""Starting a job on the GPUs a host gave it: one :func:`launch` from plain data.

Whoever placed the job (the embedded ledger, or the broker, whose answer its client reads
without loading any model: :mod:`gpualloc.host.grant`) describes it as a :class:`JobLaunch`
(:func:`gpualloc.host.launching.launch_granted` makes it); :func:`launch` binds it to its GPUs'
NUMA nodes, says the lease line, starts its verifier and, for a shared job, its eviction
watcher, and execs it. It imports no model, so ``run`` through a broker decodes no topology.
"""

import os
import shlex
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, NoReturn

if TYPE_CHECKING:
    from gpualloc.launcher.binding import NumaMode


class SharedJob(NamedTuple):
    """What a shared job (``run --share``) needs at launch."""

    mode: str
    """``time-sliced`` or ``mps``."""
    background: bool
    ledger_file: Path
    """The ledger its eviction watcher reads (the broker's, or the embedded one)."""
    notes: tuple[str, ...] = ()
    """Warnings about how it shares its GPU (MPS settings), said before it starts."""


class JobLaunch(NamedTuple):
    """A placed job, as plain data: what :func:`launch` needs and nothing else."""

    command: list[str]
    lease_id: str
    held: str
    """The devices held, in words (``GPU 0,3``, ``GPU0/MIG1``)."""
    numa_nodes: list[int | None]
    """Each GPU's NUMA node, in rank order (None where unknown)."""
    this_host: bool
    """Whether the GPUs are this machine's (only then is the job bound)."""
    variables: dict[str, str]
    """What the job's environment gains (:mod:`gpualloc.launcher.environment`)."""
    shared: SharedJob | None = None


def launch(
    job: JobLaunch,
    mode: "NumaMode",
    *,
    quiet: bool,
    start_verifier: Callable[[], None] | None,
    say: Callable[[str], None],
    warn: Callable[[Iterable[str]], None],
    environ: Mapping[str, str] | None = None,
) -> NoReturn:
    """Bind, announce, watch and exec ``job`` (this process becomes the job). ``say`` and
    ``warn`` write the lease line and warnings; ``start_verifier`` forks the job's verifier
    (None: none, ``verify.grace`` is 0 or nothing can be watched). Raises what binding or
    exec raises (the caller then releases the lease)."""
    from gpualloc.launcher.binding import HostNuma, NumaMode, plan_binding
    from gpualloc.launcher.command import job_argv
    from gpualloc.launcher.environment import job_environment
    from gpualloc.launcher.exec import exec_job
    from gpualloc.model.printable import printable

    environ = os.environ if environ is None else environ
    numa_view = HostNuma.read() if job.this_host and mode is not NumaMode.NONE else None
    binding = plan_binding(job.numa_nodes, mode, this_host=job.this_host, host=numa_view)
    if binding.method == "affinity":
        warn([binding.reason])
    if job.shared is not None:
        warn(job.shared.notes)
    if not quiet:
        where = binding.describe() if binding.method == "numactl" else "not NUMA-bound"
        how = f", shared ({job.shared.mode})" if job.shared is not None else ""
        command = printable(shlex.join(job.command), 200)
        say(f"lease {job.lease_id}: {job.held}{how} ({where}) for {command}")
    if start_verifier is not None:
        start_verifier()
    if job.shared is not None:
        from gpualloc.launcher.sharing import BACKGROUND_NICENESS, start_eviction_watcher

        start_eviction_watcher(job.shared.ledger_file, job.lease_id)
        if job.shared.background:
            os.nice(BACKGROUND_NICENESS)
    exec_job(job_argv(job.command, binding), job_environment(environ, job.variables), binding)
