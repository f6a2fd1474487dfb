"""``gpualloc plan``: what a policy would choose for a job, and why; runs nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from msgspec.structs import replace

from gpualloc.cli.declare import Command, flag, job_options, json_flag, value
from gpualloc.cli.state import STATE
from gpualloc.errors import GpusBusy, NoFeasiblePlacement, RequestError
from gpualloc.json_views import placement_json
from gpualloc.model.job import JobOptions
from gpualloc.model.option_values import gpu_list
from gpualloc.model.printable import count_of
from gpualloc.placement.options import want_of

if TYPE_CHECKING:
    from gpualloc.model.mig import MigRequest
    from gpualloc.model.request import Placement
    from gpualloc.model.topology import Topology
    from gpualloc.placement.context import DecisionContext


def plan_command(
    busy: str | None,
    free: str | None,
    assume_free: bool,
    explain: bool,
    compare: bool,
    as_json: bool,
    **job: Any,
) -> None:
    """Choose GPUs for a job without running it: the GPUs in rank order, their NUMA nodes, the
    links between consecutive ranks, and the scores.

    Rank i of the job runs on the i-th GPU listed; `gpualloc run` will export them in that order
    as CUDA_VISIBLE_DEVICES. It plans on the GPUs free now, as `run` would place (the ledger's
    leases and other programs' GPU processes count as taken); --assume-free, --busy and --free
    ask what if instead, and the output says which it was. Exit code 9 when no set of GPUs
    satisfies the request, 10 when the job would fit but the GPUs it needs are taken now.
    Inside a Slurm job it plans on the job's GPUs.

    Example: `gpualloc --topology dgx1-v100 plan -n 3 --busy 0 --explain`
    """
    from gpualloc import boot
    from gpualloc.cli.open_ledger import open_host_ledger, say, warn
    from gpualloc.ledger.schema import Ledger
    from gpualloc.model.cpuset import format_cpulist
    from gpualloc.model.request import HostState
    from gpualloc.placement.decide import decision_context

    options, own = JobOptions.pick(job)
    count, mig, mem = options.count, options.mig, options.mem
    allow_unhealthy = own.get("allow_unhealthy", False)
    if busy is not None and free is not None:
        raise RequestError("--busy and --free both say which GPUs are free", hint="give one")
    if assume_free and (busy is not None or free is not None):
        given_too = "--busy" if busy is not None else "--free"
        raise RequestError(
            f"--assume-free and {given_too} both say which GPUs are free", hint="give one"
        )
    what_if = assume_free or busy is not None or free is not None
    if explain and compare:
        raise RequestError(
            "--explain explains one policy's choice and --compare shows every policy's",
            hint="give one: 'plan --policy NAME --explain' explains that policy's choice",
        )
    if count is None and mig is None and mem is None:
        raise RequestError("how many GPUs?", hint="give -n K (or --mig / --mem for a MIG device)")
    want = want_of(options, STATE.config())
    host = open_host_ledger(
        create=False,
        check_health=not allow_unhealthy,
        allow_unhealthy=allow_unhealthy,
    )
    topology = host.topology
    if want.mig is not None:
        if free is not None:
            raise RequestError("--free names whole GPUs", hint="with --mig, use --busy GPU0/MIG1")
        taken_now = None
        if not what_if:  # the MIG devices leased now, as run --mig would see them
            txn = host.snapshot()
            warn(txn.notes)
            occupancy = host.occupancy(txn.ledger, allow_unhealthy=allow_unhealthy)
            taken_now = set(occupancy.mig_taken())
        _show_mig_plan(topology, want.mig, busy, explain, as_json, taken_now)
        return
    n = topology.gpu_count
    everything = frozenset(range(n))
    if free is not None:
        free_set = gpu_list(free, "--free")
        busy_set, outside = everything - free_set, free_set - everything
    else:
        busy_set = gpu_list(busy, "--busy")
        outside = busy_set - everything
    if outside:
        raise RequestError(
            f"GPU {min(outside)} does not exist on this host ({count_of(n, 'GPU')}: 0..{n - 1})",
            hint="'gpualloc topo show' lists the GPUs",
        )
    # The host's own exclusions (unhealthy, lost, in MIG mode, not the Slurm job's), from its
    # occupancy of an empty ledger and no other program: what a what-if lays --busy over, and
    # what "now" is held to.
    idle = host.occupancy(
        Ledger(host=boot.hostname()), allow_unhealthy=allow_unhealthy, ignore_foreign=True
    )
    for gpu, reason in sorted(idle.unhealthy.items()):
        say(f"skipping unhealthy GPU {gpu}: {reason} (--allow-unhealthy includes it)")
    if host.slurm_job is not None:  # plan as 'run' would place: on the job's GPUs only
        slurm = host.slurm_job
        say(f"inside {slurm.describe()}: planning on its GPUs (GPUALLOC_NO_SLURM=1: the host's)")
    if what_if:  # an overlay of the idle host: only --busy and --free say what is taken
        wanted = HostState.with_busy(n, busy_set & everything)
        state = HostState(free=wanted.free & idle.free, running=wanted.running)
        basis = PlanBasis.what_if(assume_free, busy_set & idle.free, free is not None)
        seen = replace(idle, known_state=state)
    else:  # the ledger and other programs' processes now, as run would place
        txn = host.snapshot()
        warn(txn.notes)
        seen = now = host.occupancy(txn.ledger, allow_unhealthy=allow_unhealthy)
        state = now.host_state()
        taken = sorted(idle.free - state.free)
        basis = PlanBasis("now", tuple(taken), tuple(now.describe(taken)))
    split = idle.mig
    try:
        ctx = decision_context(
            topology,
            want.request,
            state,
            effective_model=want.effective_model,
            weights=want.weights,
        )
    except NoFeasiblePlacement as never:
        if basis.kind == "now" and basis.taken and _fits(topology, want, idle.free):
            message = never.message
            if not want.request.required & set(basis.taken):
                are = "is" if len(state.free) == 1 else "are"
                message = (
                    f"the job needs {count_of(want.request.gpus, 'GPU')} and {len(state.free)} "
                    f"{are} free now (GPU {format_cpulist(basis.taken)} taken)"
                )
            raise GpusBusy(
                message,
                details=basis.held_by,
                hint="'gpualloc plan --assume-free' shows what it would choose were they free",
            ) from None
        if not split:
            raise
        hint = (
            "plan a MIG device with --mig PROFILE or --mem SIZE, or fewer GPUs"
            if topology.mig_instances
            else "no MIG device exists yet: an administrator creates some (nvidia-smi mig -cgi "
            "PROFILE -C) or turns MIG mode off (nvidia-smi -i N -mig 0)"
        )
        raise NoFeasiblePlacement(
            f"{never.message} (GPU {format_cpulist(split)} in MIG mode cannot be leased whole)",
            hint=hint,
        ) from None
    running = sorted({p.gpu for p in host.processes.processes if p.gpu in state.free})
    if running and what_if:  # a what-if: say what it ignores
        say(
            f"note: GPU {format_cpulist(running)} {'runs' if len(running) == 1 else 'run'} "
            "processes now; this what-if counts every GPU free but --busy ones ('gpualloc "
            "status' shows them; run and alloc avoid them)"
        )
    budget = host.placement_budget_s
    if compare:
        _show_compare(ctx, as_json, budget, basis)
    else:
        from gpualloc.placement.choose import choose

        chosen = None if explain else choose(topology, seen, want, budget_s=budget)
        _show_plan(ctx, want.policy, explain, as_json, budget, basis, chosen)


class PlanBasis(NamedTuple):
    """Which GPUs a plan counted taken, and why: the ledger and processes now, or a what-if."""

    kind: str
    """``now``, ``assume-free``, ``busy`` (--busy) or ``free`` (--free)."""
    taken: tuple[int, ...]
    """The usable GPUs counted taken."""
    held_by: tuple[str, ...] = ()
    """Who holds them (``now``): one line per holder."""

    @classmethod
    def what_if(cls, assume_free: bool, taken: frozenset[int], by_free: bool) -> PlanBasis:
        kind = "assume-free" if assume_free else "free" if by_free else "busy"
        return cls(kind, tuple(sorted(taken)))

    def line(self) -> str:
        from gpualloc.model.cpuset import format_cpulist

        gpus = format_cpulist(self.taken)
        if self.kind == "now":
            if not self.taken:
                return "planned on the GPUs free now: none is taken"
            return (
                f"planned on the GPUs free now: GPU {gpus} taken ('gpualloc status' says by "
                "whom; --assume-free plans as if none were)"
            )
        if self.kind == "assume-free":
            return "what if nothing were held (--assume-free): the ledger and processes ignored"
        option = "--free" if self.kind == "free" else "--busy"
        taken = f"GPU {gpus} taken" if self.taken else "no GPU taken"
        return f"what if {taken} ({option}): the ledger and processes ignored"

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "taken": list(self.taken), "held_by": list(self.held_by)}


def _fits(topology: Topology, want: Any, free: frozenset[int]) -> bool:
    """Whether the request would fit were ``free`` the free GPUs."""
    from gpualloc.model.request import HostState
    from gpualloc.placement.decide import decision_context

    try:
        decision_context(topology, want.request, HostState(free=free))
    except NoFeasiblePlacement:
        return False
    return True


def _show_mig_plan(
    topology: Topology,
    request: MigRequest,
    busy: str | None,
    explain: bool,
    as_json: bool,
    taken_now: set[tuple[int, int]] | None,
) -> None:
    """``plan --mig``: the MIG device ``run --mig`` would take now (``taken_now``: the MIG
    devices leased), or, with ``--busy`` naming MIG devices to treat as held, what if."""
    from gpualloc.cli.output import print_json, write_stdout
    from gpualloc.model.mig import format_size, mig_label, parse_mig_label
    from gpualloc.placement.mig.fit import choose_mig

    known = {(m.gpu, m.device) for m in topology.mig_instances}
    held: dict[tuple[int, int], object] = dict.fromkeys(taken_now or (), True)
    for part in (busy or "").split(","):
        if not part.strip():
            continue
        key = parse_mig_label(part)
        if key is None or key not in known:
            from gpualloc.user_files import shown_value

            raise RequestError(
                f"--busy {shown_value(part.strip())} is not a MIG device of this host",
                hint="with --mig, --busy lists MIG devices, e.g. --busy GPU0/MIG0,GPU0/MIG1",
            )
        held[key] = True
    choice = choose_mig(topology, request, held)
    chosen = choice.instance
    if as_json:
        print_json(
            {
                "policy": "mig-best-fit",
                "mig_device": {
                    "device": chosen.label,
                    "gpu": chosen.gpu,
                    "index": chosen.device,
                    "profile": chosen.profile,
                    "uuid": chosen.uuid,
                    "memory_bytes": chosen.memory_bytes,
                },
                "reason": choice.reason,
                "runners_up": [m.label for m in choice.runners_up],
                "numa_node": topology.gpu(chosen.gpu).numa_node,
                "basis": {
                    "kind": "now" if taken_now is not None else "busy" if busy else "assume-free",
                    "taken": sorted(mig_label(*key) for key in held),
                },
            }
        )
        return
    taken = ", ".join(sorted(mig_label(*key) for key in held)) or "none"
    lines = [
        f"{choice.reason}",
        f"CUDA_VISIBLE_DEVICES={chosen.uuid}",
        f"NUMA node {_numa_text(topology.gpu(chosen.gpu).numa_node)} (of GPU{chosen.gpu})",
    ]
    if explain:
        lines.append("next in line (best fit: fewest slices, least memory, fullest GPU first):")
        lines += [
            f"  {m.label} ({m.profile}, {format_size(m.memory_bytes)})"
            for m in choice.runners_up[:5]
        ] or ["  none: it is the only free MIG device that fits"]
    if taken_now is not None:
        lines.append(f"planned on the MIG devices free now: taken {taken}")
    else:
        option = "--busy" if busy else "--assume-free"
        lines.append(f"what if the MIG devices taken were {taken} ({option}): the ledger ignored")
    write_stdout("\n".join(lines) + "\n")


def _numa_text(node: int | None) -> str:
    return "?" if node is None else str(node)


def _link_label(ctx: DecisionContext, a: int, b: int) -> str:
    from gpualloc.cli.output import figure

    link = ctx.topology.link(a, b)
    return f"{link.kind} {figure(link.bandwidth_gbps)}"


def _placement_lines(ctx: DecisionContext, placement: Placement) -> list[str]:
    from gpualloc.cli.output import figure

    s = placement.scores
    effective = figure(s.effective_gbps)
    if s.effective_model:
        effective += f" ({'MAPA Table 2' if s.effective_model == 'mapa' else 'slowest link'})"
    lines = [
        f"policy {placement.policy}: {placement.objective}",
        f"aggregated {figure(s.aggregated_gbps)}, effective {effective}, "
        f"preserved {figure(s.preserved_gbps)}, bottleneck {figure(s.bottleneck_gbps)}, "
        f"utility {s.utility:.3f}",
    ]
    if placement.decided_by:
        lines.append(f"tie: the objective rates others equal; chosen by {placement.decided_by}")
    return lines + [f"note: {note}" for note in placement.notes]


def _show_plan(
    ctx: DecisionContext,
    policy: str,
    explain: bool,
    as_json: bool,
    budget_s: float | None,
    basis: PlanBasis,
    chosen: Placement | None,
) -> None:
    """The plan: ``chosen`` (what :func:`~gpualloc.placement.choose.choose`, the placement's
    front door, answers on the GPUs counted free), or with ``explain`` the policy's choice
    and its runners-up."""
    from gpualloc.cli.open_ledger import warn
    from gpualloc.cli.output import Table, fixed, print_json, print_tables
    from gpualloc.placement.decide import explain as explain_choice

    explanation = explain_choice(ctx, policy, budget_s=budget_s) if explain else None
    placement = explanation.placement if explanation else chosen
    assert placement is not None  # chosen unless explained
    warn([placement.cut_short] if placement.cut_short else [])
    if as_json:
        data = placement_json(ctx.topology, ctx.request, placement)
        data["basis"] = basis.as_json()
        if explanation:
            data["explain"] = {
                "reason": explanation.reason,
                "bandwidth": bandwidth_source(ctx.topology),
                "alternatives": [
                    {"gpus": list(alt.gpus), "scores": alt.scores.as_dict(), "key": list(alt.key)}
                    for alt in explanation.alternatives
                ],
            }
        print_json(data)
        return
    order = placement.gpus
    ring = ctx.request.pattern.name == "ring" and len(order) >= 3
    rows = []
    for rank, g in enumerate(order):
        nxt = order[rank + 1] if rank + 1 < len(order) else (order[0] if ring else None)
        link = f"-> {nxt}: {_link_label(ctx, g, nxt)}" if nxt is not None else ""
        numa = ctx.topology.gpu(g).numa_node
        rows.append([str(rank), str(g), "-" if numa is None else str(numa), link])
    tables = [
        Table(
            f"Plan: {count_of(len(order), 'GPU')}, {ctx.request.pattern.name} pattern, "
            f"{'sensitive' if ctx.request.sensitive else 'insensitive'}",
            ["Rank", "GPU", "NUMA", "Link to next rank"],
            rows,
            wrap=(3,),
        )
    ]
    footer = [basis.line(), *_placement_lines(ctx, placement)]
    ordinal = ctx.topology.cuda_ordinals()
    footer.append(f"CUDA_VISIBLE_DEVICES={','.join(str(ordinal[g]) for g in order)}")
    if explanation:
        alt_rows = [
            [
                ",".join(str(g) for g in alt.gpus),
                fixed(alt.scores.effective_gbps),
                fixed(alt.scores.aggregated_gbps),
                fixed(alt.scores.preserved_gbps),
                f"{alt.scores.utility:.3f}",
            ]
            for alt in explanation.alternatives
        ]
        if alt_rows:
            tables.append(
                Table(
                    "Runners-up under the same objective",
                    ["GPUs", "Effective", "Aggregated", "Preserved", "Utility"],
                    alt_rows,
                    right_align_from=1,
                )
            )
        else:
            footer.append(_no_runner_up(ctx, placement))
        footer.append(f"why: {explanation.reason}")
        footer.append(bandwidth_source(ctx.topology))
    print_tables(tables, footer=footer)


def _no_runner_up(ctx: DecisionContext, placement: Placement) -> str:
    """Why ``--explain`` lists no runner-up (it printed an empty table on a real H200)."""
    if len(ctx.pool) == len(placement.gpus):
        return "runners-up: none; these are the only usable GPUs"
    if placement.cut_short:
        return "runners-up: none; the search ran out of its time budget"
    return "runners-up: none; this policy follows a procedure, not a score to rank others by"


def bandwidth_source(topology: Topology) -> str:
    """Which link figures the plan used: measured (and by what), or estimated."""
    provenance = topology.provenance
    if provenance.bandwidth == "measured":
        how = [note for note in provenance.notes if "measured" in note]
        return how[-1] if how else "link bandwidths: measured"
    return (
        "link bandwidths: estimated from link classes (measure them: gpualloc calibrate, or "
        "topo import --bandwidth-matrix)"
    )


def _show_compare(
    ctx: DecisionContext, as_json: bool, budget_s: float | None, basis: PlanBasis
) -> None:
    from gpualloc.cli.output import Table, fixed, print_json, print_tables
    from gpualloc.placement.decide import compare as compare_all

    placements = compare_all(ctx, budget_s=budget_s)
    if as_json:
        print_json(
            {
                "compare": [placement_json(ctx.topology, ctx.request, p) for p in placements],
                "basis": basis.as_json(),
            }
        )
        return
    rows = [
        [
            p.policy,
            ",".join(str(g) for g in p.gpus),
            fixed(p.scores.effective_gbps),
            fixed(p.scores.aggregated_gbps),
            fixed(p.scores.preserved_gbps),
            fixed(p.scores.bottleneck_gbps),
            f"{p.scores.utility:.3f}",
        ]
        for p in placements
    ]
    print_tables(
        [
            Table(
                f"Every policy for {count_of(ctx.k, 'GPU')}, {ctx.request.pattern.name} pattern "
                f"(GB/s; utility in [0, 1])",
                ["Policy", "GPUs", "Effective", "Aggregated", "Preserved", "Bottleneck", "Utility"],
                rows,
                right_align_from=2,
            )
        ],
        footer=[basis.line()],
    )


PLAN = Command(
    "plan",
    plan_command,
    options=(
        *job_options("plan"),
        value(
            "--busy",
            metavar="LIST",
            help="What if these GPUs were taken and every other free, e.g. 0,3-4 (instead of "
            "the ledger and the GPUs' processes).",
        ),
        value(
            "--free",
            metavar="LIST",
            help="What if these GPUs were the only free ones (the opposite of --busy).",
        ),
        flag(
            "--assume-free",
            help="What if nothing were held: plan on every usable GPU, ignoring the ledger and "
            "the GPUs' processes.",
        ),
        flag("--explain", help="Show the best alternatives and why this one won."),
        flag("--compare", help="Show what every policy would choose, side by side."),
        json_flag(),
    ),
)
