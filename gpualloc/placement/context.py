"""Everything one placement decision needs, checked once: :class:`DecisionContext`.

Built by :func:`gpualloc.placement.decide.plan`; every policy reads it and returns a
:class:`~gpualloc.model.request.Placement` through :meth:`DecisionContext.placement`, so that
all policies report the same scores computed the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

from msgspec import Struct, field

from gpualloc.errors import NoFeasiblePlacement, RequestError
from gpualloc.model.cpuset import format_cpulist
from gpualloc.model.printable import count_of
from gpualloc.model.request import HostState, JobRequest, Placement, Scores
from gpualloc.model.topology import Topology
from gpualloc.placement.host_graph import HostGraph
from gpualloc.placement.mapa import scores
from gpualloc.placement.mapa.exact import best_order_of_set
from gpualloc.placement.mapa.objectives import (
    AggregatedObjective,
    EdgeObjective,
    effective_objective,
)
from gpualloc.placement.mapa.scores import EffectiveModel
from gpualloc.placement.sets.utility import UtilityModel, UtilityWeights


def _fmt(gpus: frozenset[int]) -> str:
    return format_cpulist(gpus)


class DecisionContext(Struct, dict=True):
    topology: Topology
    request: JobRequest
    state: HostState
    effective_model: EffectiveModel = EffectiveModel.AUTO
    weights: UtilityWeights = field(default_factory=UtilityWeights)

    def __post_init__(self) -> None:
        n = self.topology.gpu_count
        named = self.request.required | self.request.excluded | self.state.free
        unknown = sorted(g for g in named if not 0 <= g < n)
        if unknown:
            raise RequestError(
                f"GPU {unknown[0]} does not exist on this host ({count_of(n, 'GPU')}: 0..{n - 1})",
                hint="'gpualloc topo show' lists the GPUs",
            )
        both = self.request.required & self.request.excluded
        if both:
            raise RequestError(
                f"GPU {min(both)} is both required and excluded",
                hint="drop it from --require or from --exclude",
            )
        self.host = HostGraph.from_topology(self.topology)
        edges = len(self.request.pattern.edges)
        self.resolved_model = scores.resolve_model(self.host, self.effective_model, edges)
        self.model_note = scores.outside_fitted_range(self.host, self.effective_model, edges)
        self.pool = tuple(sorted(self.state.free - self.request.excluded))
        self._check_feasible()

    def _check_feasible(self) -> None:
        request, k = self.request, self.request.gpus
        busy_required = request.required - self.state.free
        if busy_required:
            raise NoFeasiblePlacement(
                f"required GPU {_fmt(busy_required)} is not free",
                hint="wait for it, or drop it from --require",
            )
        if len(request.required) > k:
            raise NoFeasiblePlacement(
                f"{len(request.required)} GPUs are required but the job asks for {k}",
                hint="raise -n or require fewer GPUs",
            )
        if len(self.pool) < k:
            n = self.topology.gpu_count
            excluded = len(self.state.free & request.excluded)
            are = "is" if len(self.pool) == 1 else "are"
            why = f"{len(self.pool)} of {count_of(n, 'GPU')} {are} usable "
            why += f"({len(self.state.free)} free"
            why += f", {excluded} of them excluded)" if excluded else ")"
            raise NoFeasiblePlacement(
                f"the job asks for {count_of(k, 'GPU')} but {why}",
                hint=_fewer_hint(len(self.pool), excluded),
            )

    # ---- helpers for policies ----------------------------------------------------------------

    @property
    def k(self) -> int:
        return self.request.gpus

    @cached_property
    def utility_model(self) -> UtilityModel:
        return UtilityModel(self.host, self.state, self.request.sensitive, self.weights)

    def sensitive_objective(self) -> EdgeObjective:
        return effective_objective(self.resolved_model)

    def order_for_set(self, gpus: Sequence[int]) -> tuple[int, ...]:
        """The order of a chosen set that gives the pattern's edges the most bandwidth."""
        if len(gpus) <= 1:
            return tuple(gpus)
        return best_order_of_set(self.host, self.request.pattern, AggregatedObjective(), gpus)

    def scores_of(self, order: Sequence[int]) -> Scores:
        host, pattern = self.host, self.request.pattern
        pairs = scores.pattern_pairs(order, pattern)
        effective = scores.effective_gbps(host, pairs, self.resolved_model)
        return Scores(
            aggregated_gbps=round(scores.aggregated_gbps(host, pairs), 6) if pairs else None,
            effective_gbps=round(effective, 6) if effective is not None else None,
            preserved_gbps=round(scores.preserved_gbps(host, self.state.free, order), 6),
            bottleneck_gbps=scores.bottleneck_gbps(host, order),
            utility=round(self.utility_model.utility(order), 6),
            effective_model=self.resolved_model.value if effective is not None else None,
        )

    def placement(
        self, policy: str, order: Sequence[int], objective: str, notes: Sequence[str] = ()
    ) -> Placement:
        if self.model_note and self.request.sensitive and len(order) > 1:
            notes = (*notes, self.model_note)
        return Placement(
            policy=policy,
            gpus=tuple(order),
            scores=self.scores_of(order),
            objective=objective,
            notes=tuple(notes),
        )


def _fewer_hint(usable: int, excluded: int) -> str:
    """The hint of a job larger than the GPUs it may have. Waiting is not offered: where
    fewer are free than usable, :func:`.choose.searched` says who holds them instead (exit 10);
    this is the answer when the job cannot fit even then (exit 9; session 21 noted that the
    hint offered to wait)."""
    if usable == 0:
        return "no GPU of this host may be given to the job: 'gpualloc status' says why"
    hint = f"ask for at most {count_of(usable, 'GPU')} (-n)"
    return hint + ", or exclude fewer (--exclude)" if excluded else hint
