"""Start a job on a host and exec it: open, allocate or wait, record, launch.

:func:`allocate_grant` is :meth:`~gpualloc.host.protocol.Host.start` of a host that places
itself (the embedded ledger; the broker answers its clients with the same grant): the job's
Want, what is refused before any GPU is taken (:func:`check_before_placing`, the broker's
check too), the allocation or the wait for it, and its :class:`~gpualloc.host.grant.Grant`.
:func:`launch_granted` is the last step of ``run`` on either host: bind, announce, start the
verifier and, for a shared job, its eviction watcher, then become the job
(:func:`gpualloc.launcher.launch.launch`). Anything that stops the exec releases the lease, so a
job that never ran holds no GPU.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from gpualloc.config import Config
    from gpualloc.host.grant import Grant
    from gpualloc.host.lease_terms import LeaseTerms
    from gpualloc.host.protocol import Host
    from gpualloc.host.queue_policy import WaitOptions
    from gpualloc.host.terms import WaitStatus
    from gpualloc.launcher.binding import NumaMode
    from gpualloc.launcher.verify_terms import VerifyTerms
    from gpualloc.model.job_fields import JobFields
    from gpualloc.model.topology import GpuProcess, Topology
    from gpualloc.placement.want import Want


def allocate_grant(
    host: Host,
    job: JobFields,
    terms: LeaseTerms,
    *,
    config: Config,
    wait: WaitOptions | None,
    report: Callable[[WaitStatus], None] | None,
    uuid: bool,
) -> Grant:
    """:meth:`~gpualloc.host.protocol.Host.start` of a host that places itself: the job's Want,
    what is refused before any GPU is taken, the allocation (or the wait for it), its grant."""
    from gpualloc.host.grant import grant_of
    from gpualloc.model.job import JobOptions
    from gpualloc.placement.options import want_of

    want = want_of(JobOptions(**job), config)
    check_before_placing(host.topology, want, terms.memory_bytes, uuid=uuid)
    allocation = host.allocate(want, terms, wait=wait, report=report)
    return grant_of(host.topology, allocation, want, uuid=uuid, this_host=host.this_host)


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
) -> NoReturn:
    """Exec ``command`` on ``grant``'s GPUs, bound as ``mode`` says; ``verify``: the verifier's
    terms (None: no verifier), which looks with ``look`` where the host needs it to."""
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
        verifier = None
        if verify is not None:

            def verifier() -> None:
                host.start_verifier(grant, verify, look)

        host.hang_up()
        launch(job, mode, quiet=quiet, start_verifier=verifier, say=say, warn=warn)
    except BaseException:
        if grant.lock_fd is not None:
            os.close(grant.lock_fd)
        host.release(grant.lease_id)
        raise
