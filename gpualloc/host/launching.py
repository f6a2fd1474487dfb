"""Start a job on a host and exec it: what is refused before any GPU is taken, and the launch.

:func:`check_before_placing` is what the embedded ledger (:meth:`.local.LocalHost.start`) and
the broker both refuse before a lease is written or a waiter queued. :func:`launch_granted` is
the last step of ``run`` on either host: bind, announce, start the verifier and, for a shared
job, its eviction watcher, then become the job (:func:`gpualloc.launcher.launch.launch`).
Anything that stops the exec releases the lease, so a job that never ran holds no GPU.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from gpualloc.host.grant import Grant
    from gpualloc.host.protocol import Host
    from gpualloc.launcher.binding import NumaMode
    from gpualloc.launcher.verify_terms import VerifyTerms
    from gpualloc.model.topology import GpuProcess, Topology
    from gpualloc.placement.want import Want


def check_before_placing(
    topology: Topology, want: Want, memory_bytes: int | None, *, uuid: bool
) -> None:
    """What is refused before any GPU is taken (before a lease is written or a waiter queued),
    by the embedded ledger and the broker alike: ``uuid`` (``--uuid``) where a GPU the job
    could be placed on has no UUID ``CUDA_VISIBLE_DEVICES`` can hold (exit 2), and a
    ``--shareable`` job's ``--mem`` beyond every such GPU's memory (exit 9)."""
    from gpualloc.launcher.environment import check_uuids
    from gpualloc.placement.want import check_declared_memory

    gpus = topology.gpus
    if want.explicit is not None:
        candidates = [gpus[g] for g in want.explicit if 0 <= g < len(gpus)]
    else:
        candidates = [g for g in gpus if g.index not in want.request.excluded]
    if uuid and want.mig is None:
        check_uuids(candidates)
    check_declared_memory(candidates, memory_bytes)


def launch_granted(
    host: Host,
    grant: Grant,
    command: list[str],
    mode: NumaMode,
    *,
    quiet: bool,
    verify: VerifyTerms | None,
    look: Callable[[], list[GpuProcess]] | None,
    say: Callable[[str], None],
    warn: Callable[[Iterable[str]], None],
    forked: bool = False,
) -> NoReturn:
    """Exec ``command`` on ``grant``'s GPUs, bound as ``mode`` says; ``verify``: the verifier's
    terms (None: no verifier), which looks with ``look`` where the host needs it to;
    ``forked``: this process is a submitted job's, forked by its supervisor (which holds the
    lease: :mod:`gpualloc.cli.supervisor`)."""
    from gpualloc.launcher.launch import JobLaunch, SharedJob, launch

    try:
        shared = None
        if grant.share is not None:
            from gpualloc.launcher.sharing import share_notes

            ledger_file = host.ledger_file()
            assert ledger_file is not None  # the lease was just written there
            notes = share_notes(grant.share.mode, grant.share.sm_percent, os.environ)
            shared = SharedJob(grant.share.mode, grant.share.background, ledger_file, tuple(notes))
        job = JobLaunch(
            command=command,
            lease_id=grant.lease_id,
            held=grant.held,
            numa_nodes=grant.numa_nodes,
            this_host=grant.this_host,
            variables=grant.variables,
            shared=shared,
        )
        verifier = None if verify is None else partial(host.start_verifier, grant, verify, look)
        host.start_time_limit_watch(grant, here=forked)
        host.hang_up()
        launch(job, mode, quiet=quiet, start_verifier=verifier, say=say, warn=warn)
    except BaseException:
        if grant.lock_fd is not None:
            os.close(grant.lock_fd)
        host.release(grant.lease_id)
        raise
