"""The placement front door: where a :class:`~gpualloc.placement.want.Want` lands on the GPUs
free now.

One function, :func:`choose`, for every caller (``run``, ``alloc``, ``plan``, the queue, the
Slurm prolog, the simulator): a MIG device (:mod:`.mig`), a shared place on one GPU
(:mod:`.share`), exactly the GPUs given (``--gpus``), or the policy's choice among the free GPUs
(:mod:`gpualloc.placement.policies.registry`), each held to the job's thresholds
(``--min-utility``, ``--min-bandwidth``: postponement, DRB paper section 4.4). It reads a view of
the GPUs
(:class:`~gpualloc.model.occupancy_view.OccupancyView`, which the ledger's
:class:`~gpualloc.ledger.occupancy.Occupancy` provides) and writes nothing: recording the lease
is the ledger session's job (:mod:`gpualloc.host.local`).
"""

from __future__ import annotations

from msgspec import structs

from gpualloc.errors import GpusBusy, NoFeasiblePlacement, RequestError
from gpualloc.model.cpuset import format_cpulist
from gpualloc.model.mig import MigRequest
from gpualloc.model.occupancy_view import OccupancyView
from gpualloc.model.printable import count_of
from gpualloc.model.request import UNSCORED, HostState, JobRequest, Placement
from gpualloc.model.share import ShareRequest
from gpualloc.model.topology import Topology
from gpualloc.placement.context import DecisionContext
from gpualloc.placement.decide import decision_context, place
from gpualloc.placement.policies.registry import get_policy
from gpualloc.placement.sets.utility import SetUtility
from gpualloc.placement.want import Want

__all__ = [
    "EXPLICIT_POLICY",
    "MIG_POLICY",
    "SHARE_POLICY",
    "PlacementTooPoor",
    "choose",
]

EXPLICIT_POLICY = "explicit"


Choices = dict[tuple[Want, frozenset[int]], tuple[Placement, SetUtility]]
"""Placements of policies that read the free GPUs alone, by what was wanted and the GPUs free,
each with what its utility reads of those (see :func:`searched`)."""


def choose(
    topology: Topology,
    occupancy: OccupancyView,
    want: Want,
    *,
    budget_s: float | None = None,
    choices: Choices | None = None,
) -> Placement:
    """The placement for ``want`` on the GPUs free in ``occupancy``.

    Raises :class:`GpusBusy` (naming who holds what) when the request would fit the host with
    every usable GPU free, and :class:`NoFeasiblePlacement` when it would not fit even then.
    With ``budget_s``, the policy's search stops after that many seconds and a greedy placement
    is returned instead, saying so in ``Placement.cut_short`` (:mod:`.greedy`; the host's
    ``placement.time_budget``); ``None`` (the simulator, the benchmarks): the exact answer,
    however long it takes.
    """
    if want.mig is not None:
        return _mig_placement(topology, occupancy, want.mig)
    if want.share is not None:
        return _share_placement(topology, occupancy, want.share)
    if want.explicit is not None:
        return good_enough(_explicit(topology, occupancy, want), want)
    found = searched(topology, occupancy, want, budget_s=budget_s, choices=choices)
    return good_enough(found, want)


def searched(
    topology: Topology,
    occupancy: OccupancyView,
    want: Want,
    *,
    budget_s: float | None = None,
    choices: Choices | None = None,
) -> Placement:
    """The policy's own choice for ``want`` (no MIG device, shared place or explicit list),
    before its thresholds (:func:`good_enough`): it depends on the request and
    ``occupancy.host_state()`` alone, so it may be remembered by them, and searched in
    another process (:mod:`gpualloc.broker.placer`). Raises as :func:`choose` does.

    ``choices`` remembers the choices of policies that read the free GPUs alone
    (:attr:`~gpualloc.placement.policies.policy.Policy.reads_running_jobs` false) by ``want``
    and the free GPUs: a choice found there is scored again for the jobs running now (the utility
    reads them), the search skipped: a simulation or a queue meets the same free GPUs again
    and again (``tests/test_remembered_choices.py``). Only the utility reads the jobs
    running, and only it is scored again
    (:class:`~gpualloc.placement.sets.utility.SetUtility`): the rest of the scores, and every check
    of the request, read the free GPUs alone, so no decision context is built."""
    policy = get_policy(want.policy)
    memo = None if policy.reads_running_jobs else choices
    if memo is not None:
        state = occupancy.host_state()
        before = memo.get((want, state.free))
        if before is not None:
            placement, utility = before
            scores = structs.replace(
                placement.scores, utility=round(utility.utility(state.running), 6)
            )
            return structs.replace(placement, scores=scores)
    _too_few_free(topology, occupancy, want.request)
    try:
        ctx = _context_now(topology, occupancy, want)
    except NoFeasiblePlacement as now:
        usable = _usable(topology, occupancy)
        try:
            decision_context(topology, want.request, HostState(free=usable))
        except NoFeasiblePlacement as never:
            if occupancy.unhealthy:  # never fits: say that unhealthy GPUs do not count
                raise NoFeasiblePlacement(
                    f"{never.message} (GPU {format_cpulist(occupancy.unhealthy)} unhealthy: "
                    f"{'; '.join(occupancy.unhealthy.values())})",
                    hint="ask for fewer GPUs, have the GPUs reset, or --allow-unhealthy",
                ) from None
            if occupancy.mig:  # never fits: say that the GPUs in MIG mode do not count
                raise NoFeasiblePlacement(
                    f"{never.message} (GPU {format_cpulist(occupancy.mig)} in MIG mode cannot "
                    "be leased whole)",
                    hint="ask for a MIG device with --mig PROFILE or --mem SIZE, or fewer GPUs",
                ) from None
            raise
        raise _busy(occupancy, want.request, now) from None
    found = place(policy, ctx, budget_s)
    if memo is not None:
        memo[(want, ctx.state.free)] = (found, SetUtility(ctx.utility_model, found.gpus))
    return found


def greedy_choice(
    topology: Topology, occupancy: OccupancyView, want: Want, *, budget_s: float, why: str
) -> Placement:
    """The policy's greedy placement for ``want`` (:func:`~.greedy.greedy_placement`, within
    ``budget_s``), saying ``why`` in ``Placement.cut_short``: the broker's answer where its
    placement worker's search of ``want`` ran past its budget and was abandoned
    (:mod:`gpualloc.broker.placer`). Raises as :func:`searched` does, more tersely."""
    from gpualloc.placement.greedy import greedy_placement

    _too_few_free(topology, occupancy, want.request)
    ctx = _context_now(topology, occupancy, want)
    found = greedy_placement(ctx, get_policy(want.policy), budget_s)
    return structs.replace(found, cut_short=why)


def _usable(topology: Topology, occupancy: OccupancyView) -> frozenset[int]:
    """The GPUs a whole-GPU lease may ever take here."""
    return (
        frozenset(range(topology.gpu_count))
        - occupancy.unusable
        - occupancy.outside
        - occupancy.mig
    )


def _too_few_free(topology: Topology, occupancy: OccupancyView, request: JobRequest) -> None:
    """Raise what :func:`searched` raises for a request that names no GPU and asks for more
    than are free but no more than are usable, without the two decision contexts that find it
    out (the head of a queue waiting for GPUs asks this each time a job ends). Anything else is
    left to the contexts."""
    free, k = occupancy.host_state().free, request.gpus
    if request.required or request.excluded or len(free) >= k:
        return
    n = topology.gpu_count
    if free and not (min(free) >= 0 and max(free) < n):  # the context says which is unknown
        return
    if len(_usable(topology, occupancy)) < k:  # it never fits: the context says why
        return
    raise _busy(occupancy, request, None, free) from None


MIG_POLICY = "mig-best-fit"


def _mig_placement(topology: Topology, occupancy: OccupancyView, request: MigRequest) -> Placement:
    """The MIG device for ``request`` (see :mod:`gpualloc.placement.mig.fit`) as a placement."""
    from gpualloc.placement.mig.fit import MigDevicesBusy, choose_mig

    taken = occupancy.mig_taken()
    try:
        unusable = occupancy.unusable | occupancy.outside
        choice = choose_mig(topology, request, taken, unusable=unusable, mix=occupancy.mig_mix)
    except MigDevicesBusy as busy:
        busy.details = tuple(dict.fromkeys(taken[key] for key in busy.held))
        raise
    instance = choice.instance
    return Placement(
        policy=MIG_POLICY,
        gpus=(),
        scores=UNSCORED,
        objective=choice.reason,
        notes=tuple(f"runner-up: {m.label} ({m.profile})" for m in choice.runners_up[:3]),
        mig_devices=((instance.gpu, instance.device),),
    )


SHARE_POLICY = "share-best-fit"


def _share_placement(
    topology: Topology, occupancy: OccupancyView, request: ShareRequest
) -> Placement:
    """The GPU for a shared job (see :mod:`gpualloc.placement.sharing.fit`) as a placement."""
    from gpualloc.placement.sharing.fit import choose_share

    choice = choose_share(
        topology,
        occupancy,
        request,
        occupancy.max_shared_jobs,
        strategy=occupancy.share_placement,
        mix=occupancy.share_mix,
        mix_source=occupancy.share_mix_source,
    )
    return Placement(
        policy=SHARE_POLICY,
        gpus=(choice.candidate.gpu,),
        scores=UNSCORED,
        objective=choice.reason,
        notes=tuple(f"runner-up: {c.describe()}" for c in choice.runners_up[:3]),
        shared=True,
    )


class PlacementTooPoor(GpusBusy):
    """Enough GPUs are free, but the placement they allow is below the job's threshold."""


def good_enough(placement: Placement, want: Want) -> Placement:
    """``placement``, unless it misses ``--min-utility`` or ``--min-bandwidth``."""
    s = placement.scores
    gpus = ",".join(map(str, placement.gpus))
    if want.min_utility is not None and s.utility < want.min_utility:
        raise PlacementTooPoor(
            f"the best placement now (GPU {gpus}) has utility {s.utility:.3f}, below "
            f"--min-utility {want.min_utility:g}",
            hint="wait for better GPUs (--wait), or lower --min-utility",
        )
    effective = s.effective_gbps  # None for one GPU: no link to be slow
    if (
        want.min_bandwidth_gbps is not None
        and effective is not None
        and (effective < want.min_bandwidth_gbps)
    ):
        raise PlacementTooPoor(
            f"the best placement now (GPU {gpus}) predicts {effective:g} GB/s, below "
            f"--min-bandwidth {want.min_bandwidth_gbps:g}",
            hint="wait for better GPUs (--wait), or lower --min-bandwidth",
        )
    return placement


def _context_now(topology: Topology, occupancy: OccupancyView, want: Want) -> DecisionContext:
    return decision_context(
        topology,
        want.request,
        occupancy.host_state(),
        effective_model=want.effective_model,
        weights=want.weights,
    )


def _explicit(topology: Topology, occupancy: OccupancyView, want: Want) -> Placement:
    gpus = want.explicit or ()
    n = topology.gpu_count
    outside = [g for g in gpus if not 0 <= g < n]
    if outside:
        raise RequestError(
            f"GPU {outside[0]} does not exist on this host ({count_of(n, 'GPU')}: 0..{n - 1})",
            hint="'gpualloc topo show' lists the GPUs",
        )
    if len(set(gpus)) != len(gpus):
        raise RequestError("--gpus names a GPU twice", hint="list each GPU once")
    foreign_to_job = [g for g in gpus if g in occupancy.outside]
    if foreign_to_job:
        mine = sorted(frozenset(range(n)) - occupancy.outside)
        raise RequestError(
            f"GPU {format_cpulist(foreign_to_job)} is not this Slurm job's "
            f"(it has GPU {format_cpulist(mine)})",
            hint="choose among the job's GPUs, or ask Slurm for those GPUs",
        )
    split = [g for g in gpus if g in occupancy.mig]
    if split:
        raise RequestError(
            f"GPU {format_cpulist(split)} is in MIG mode and cannot be leased whole",
            hint="ask for one of its MIG devices with --mig (gpualloc topo show lists them)",
        )
    sick = [g for g in gpus if g in occupancy.unhealthy]
    if sick:
        raise NoFeasiblePlacement(
            f"GPU {sick[0]} of --gpus is unhealthy: {occupancy.unhealthy[sick[0]]}",
            hint="choose other GPUs, have it reset, or --allow-unhealthy",
        )
    taken = [g for g in gpus if g in occupancy.busy]
    if taken:
        raise GpusBusy(
            f"GPU {format_cpulist(taken)} of --gpus {','.join(map(str, gpus))} is not free",
            details=tuple(occupancy.describe(taken)),
            hint="'gpualloc status' shows the host; choose other GPUs or leave out --gpus",
        )
    ctx = _context_now(topology, occupancy, want)
    return ctx.placement(EXPLICIT_POLICY, gpus, "the GPUs given with --gpus, in that order")


def _busy(
    occupancy: OccupancyView,
    request: JobRequest,
    why: NoFeasiblePlacement | None,
    free_now: frozenset[int] | None = None,
) -> GpusBusy:
    """Why ``request`` waits: ``why`` (the context's words) where a GPU it requires is busy
    (it requires one then), else how many GPUs are free (``free_now``, where the caller has
    read them: ``occupancy.free``)."""
    required_busy = sorted(request.required & occupancy.busy) if request.required else []
    free = sorted((occupancy.free if free_now is None else free_now) - request.excluded)
    if required_busy and why is not None:
        message = why.message
    else:
        are = "is" if len(free) == 1 else "are"
        message = f"the job needs {count_of(request.gpus, 'GPU')} and {len(free)} usable "
        message += f"{'one' if len(free) == 1 else 'ones'} {are} free now"
        message += f": GPU {format_cpulist(free)}" if free else ""
    return GpusBusy(
        message,
        details=lambda: tuple(
            occupancy.describe(required_busy or sorted(occupancy.busy - occupancy.outside))
        ),
        hint="wait for them ('gpualloc status' shows the host), or ask for fewer GPUs",
    )
