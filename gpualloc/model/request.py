"""What a job asks for and what it gets: ``JobRequest``, ``HostState``, ``Placement``.

Pure data, shared by ``plan``, the launcher, the queue and the simulator, so that every consumer
sees the same request and the same answer. A placement is an *ordered* list of GPUs: pattern vertex
``i`` (rank ``i`` of the job) runs on ``gpus[i]``, and that order becomes the order of
``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

from msgspec import Struct, field

from gpualloc.model.printable import count_of


class CommunicationPattern(Struct, frozen=True):
    """A job's communication graph over vertices ``0..size-1`` (MAPA paper section 3.1).

    ``edges`` names each pair of ranks once, except the 2-rank pattern, which may name its one
    pair twice: that pair then counts twice in every edge score, which is how MAPA scores a
    2-GPU ring (its one link carries both directions of the ring). The order searches assume
    one edge a pair beyond that (``placement/policies/mapa.py``, ``placement/mapa/exact.py``),
    so every way a pattern reaches placement (a pattern file, the library, a broker request, a
    queued job) is checked here, once. A pattern has at most :func:`max_edges` edges, so that
    the work of placing it is bounded by its ranks, not by what a user typed (a 44 KB pattern
    of 8 ranks stalled the broker for half a minute: tests/test_hostile_numbers.py).
    """

    name: str
    size: int
    edges: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError("a pattern has at least one vertex")
        if len(self.edges) > max_edges(self.size):
            raise ValueError(
                f"a pattern of {count_of(self.size, 'rank')} has at most "
                f"{count_of(max_edges(self.size), 'edge')} (each "
                f"pair once{', or twice' if self.size == 2 else ''}), not {len(self.edges)}"
            )
        seen: set[tuple[int, int]] = set()
        for position, (u, v) in enumerate(self.edges):
            if u == v or not (0 <= u < self.size and 0 <= v < self.size):
                raise ValueError(f"bad pattern edge ({u}, {v}) for {self.size} vertices")
            pair = (min(u, v), max(u, v))
            if pair in seen and self.size > 2:
                raise ValueError(
                    f"edge #{position} ({u}, {v}) names ranks {pair[0]} and {pair[1]} again"
                )
            seen.add(pair)


def max_edges(ranks: int) -> int:
    """The most edges a pattern of ``ranks`` may have: every pair once, the one pair of two
    ranks twice (MAPA's 2-GPU ring)."""
    return 2 if ranks == 2 else ranks * (ranks - 1) // 2


class JobRequest(Struct, frozen=True):
    """A request for ``gpus`` GPUs that talk along ``pattern``.

    ``sensitive`` is MAPA's bandwidth sensitivity (section 2.3). ``required`` GPUs must be in the
    answer; ``excluded`` GPUs must not be.
    """

    gpus: int
    pattern: CommunicationPattern
    sensitive: bool
    required: frozenset[int] = frozenset()
    excluded: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError("a job asks for at least one GPU")
        if self.pattern.size != self.gpus:
            raise ValueError(
                f"the pattern has {self.pattern.size} vertices but the job asks for "
                f"{count_of(self.gpus, 'GPU')}"
            )


class RunningJob(Struct, frozen=True):
    """A job that holds GPUs now: the source of interference for DRB (seed 000, Eq. 4).

    ``sensitive`` is ``None`` when unknown (GPUs marked busy by hand or by a foreign process).
    """

    gpus: frozenset[int]
    sensitive: bool | None = None


class HostState(Struct, frozen=True):
    """Which GPUs are free now, and the jobs holding the others."""

    free: frozenset[int]
    running: tuple[RunningJob, ...] = ()

    @classmethod
    def all_free(cls, gpu_count: int) -> HostState:
        return cls(free=frozenset(range(gpu_count)))

    @classmethod
    def with_busy(cls, gpu_count: int, busy: frozenset[int]) -> HostState:
        """``busy`` GPUs held by one job of unknown sensitivity, the rest free."""
        running = (RunningJob(gpus=busy),) if busy else ()
        return cls(free=frozenset(range(gpu_count)) - busy, running=running)


class Scores(Struct, frozen=True):
    """Every score of one placement. ``None`` where a score does not apply.

    Units: GB/s for the bandwidths, a number in [0, 1] for the DRB utility.
    """

    aggregated_gbps: float | None
    effective_gbps: float | None
    preserved_gbps: float
    bottleneck_gbps: float | None
    utility: float
    effective_model: str | None = None
    """The model behind ``effective_gbps``: "mapa" (Table 2) or "bottleneck"."""

    def as_dict(self) -> dict[str, float | None]:
        return {
            "aggregated_gbps": self.aggregated_gbps,
            "effective_gbps": self.effective_gbps,
            "preserved_gbps": self.preserved_gbps,
            "bottleneck_gbps": self.bottleneck_gbps,
            "utility": self.utility,
        }


UNSCORED = Scores(
    aggregated_gbps=None,
    effective_gbps=None,
    preserved_gbps=0.0,
    bottleneck_gbps=None,
    utility=1.0,
)
"""The scores of a placement on part of one GPU (a MIG device, a shared place): no link to
score, and DRB's utility of a set of whole GPUs does not apply."""


class Placement(Struct, frozen=True):
    """A policy's answer: GPUs in rank order, the scores, and what the policy optimised."""

    policy: str
    gpus: tuple[int, ...]
    scores: Scores
    objective: str
    """One line naming the policy's objective, e.g. "max predicted effective bandwidth"."""
    notes: tuple[str, ...] = field(default=())
    cut_short: str | None = None
    """Why this is not the policy's exact answer: its search ran past the time budget and a
    greedy placement was taken; said to the user wherever it is used."""
    mig_devices: tuple[tuple[int, int], ...] = ()
    """(parent GPU, MIG device index) of the MIG device chosen for a MIG request (``gpus`` is
    then empty)."""
    shared: bool = False
    """A shared place on ``gpus[0]`` (``run --share``), not the GPU whole."""
    decided_by: str | None = None
    """The criterion of the tie rule (:mod:`gpualloc.placement.ties`) that chose this placement
    over another its policy's objective rates equal, e.g. "fewer NUMA nodes (1 against 2 for
    2 GPUs 0,4)"; None where no tied placement was seen."""

    @property
    def parent_gpus(self) -> tuple[int, ...]:
        """The GPUs the job runs on: ``gpus``, or the parents of its MIG devices."""
        return self.gpus or tuple(gpu for gpu, _device in self.mig_devices)

    def score_values(self) -> dict[str, float | None]:
        """The scores as ledger and JSON record them; none for a MIG device or a shared place
        (no links, and the utility of a placement of whole GPUs does not apply)."""
        return {} if self.mig_devices or self.shared else self.scores.as_dict()
