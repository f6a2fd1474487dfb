"""FGD's own evaluation method (Weng et al., "Beware of Fragmentation", USENIX ATC'23, section
5.1) on one 8-GPU host, for sections 6.2 and 6.3 of docs/evaluation.md (``trace_replay.py``).

Tasks drawn from the trace arrive on the empty host and never leave; a task that fits nowhere
is skipped; the allocated share of the host is read when the arrived demand first reaches each
of :data:`FILL_DEMAND` of its capacity (after the task that crosses it). Queue order plays no
part, so it isolates placement. Every decision is the live code's:

- shared GPUs (:func:`fill`): each part-of-a-GPU task is placed by ``choose_share`` under one
  ``share.placement``, each whole-GPU task takes the lowest free GPUs;
- MIG (:func:`mig_fill`): every GPU is an H100 80GB in MIG mode with no instance yet; each task
  becomes a GPU instance of the smallest profile that gives it its part of the GPU (1g, 2g, 3g,
  4g or 7g of 7 compute slices; k whole GPUs: k 7g instances), created where
  ``rank_slots`` puts it under one creation rule, as if instances were made on demand.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timezone

from gpualloc.errors import GpusBusy, NoFeasiblePlacement
from gpualloc.ledger.occupancy import Occupancy
from gpualloc.ledger.schema import Lease, LeasedGpu, Ledger
from gpualloc.model.mig import GIB
from gpualloc.model.share import ShareRequest
from gpualloc.placement.mig.rules import mig_rule_names
from gpualloc.placement.mig.slots import MigGpu, rank_slots
from gpualloc.placement.sharing.fit import choose_share
from gpualloc.placement.sharing.fragmentation import task_mix
from gpualloc.placement.sharing.rules import share_policy_names
from gpualloc.simulate.trace import SimJob
from gpualloc.topologies import load_bundled

HOST = "pcie-8gpu-2socket"
GPUS = 8
SHARING = 32
FILL_SAMPLES = 400
FILL_DEMAND = (0.8, 0.9, 1.0, 1.1, 1.2)
MIG_GPU = ("NVIDIA H100 80GB HBM3", 80 * GIB)
MIG_PROFILES = {1: "1g.10gb", 2: "2g.20gb", 3: "3g.40gb", 4: "4g.40gb", 7: "7g.80gb"}
"""Compute slices -> the H100 80GB profile of that size (the 1-slice one with one memory
slice)."""
_NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)

Task = tuple[int, float]
"""(GPUs, part of one GPU)."""


def samples(types: Sequence[Task], count: int, capacity: float, size) -> list[list[Task]]:
    """``count`` draws from ``types`` (seeds 0 to count - 1), each until the arrived demand
    (``size`` of a task, summed) reaches the last of :data:`FILL_DEMAND` of ``capacity``."""
    drawn_lists = []
    for seed in range(count):
        rng = random.Random(seed)
        drawn: list[Task] = []
        demand = 0.0
        while demand < FILL_DEMAND[-1] * capacity:
            drawn.append(rng.choice(types))
            demand += size(drawn[-1])
        drawn_lists.append(drawn)
    return drawn_lists


def _readings(readings: list[float], arrived: float, allocated: float, capacity: float) -> None:
    while len(readings) < len(FILL_DEMAND) and arrived >= FILL_DEMAND[len(readings)] * capacity:
        readings.append(allocated / capacity)


# ---- shared GPUs ----------------------------------------------------------------------------


def fill(tasks: Sequence[Task], placement: str, mix: dict) -> list[float]:
    """Allocated shares of the host at :data:`FILL_DEMAND`, shared tasks placed by
    ``placement``."""
    topology = load_bundled(HOST)
    ledger = Ledger(host="fill")
    arrived = allocated = 0.0
    readings: list[float] = []
    for number, (gpus, part) in enumerate(tasks):
        arrived += gpus * part
        occupancy = Occupancy.build(
            topology, ledger, max_shared_jobs=SHARING, share_placement=placement, share_mix=mix
        )
        lease = _place(topology, occupancy, number, gpus, part, placement, mix)
        if lease is not None:
            ledger.leases.append(lease)
            allocated += gpus * part
        _readings(readings, arrived, allocated, GPUS)
    return readings


def _place(topology, occupancy, number, gpus, part, placement, mix) -> Lease | None:
    common = {
        "id": f"{number:012x}", "uid": 0, "user": "fill", "hold": True, "created": _NOW,
        "source": "run",
    }  # fmt: skip
    if part < 1:
        request = ShareRequest(sm_percent=max(1, round(part * 100)))
        try:
            choice = choose_share(
                topology, occupancy, request, SHARING, strategy=placement, mix=mix
            )
        except (GpusBusy, NoFeasiblePlacement):
            return None
        share = request.leased(None, SHARING, "time-sliced")
        return Lease(gpus=(LeasedGpu(index=choice.candidate.gpu),), share=share, **common)
    free = sorted(occupancy.free)
    if len(free) < gpus:
        return None
    return Lease(gpus=tuple(LeasedGpu(index=g) for g in free[:gpus]), **common)


def fill_table(jobs: list[SimJob], count: int = FILL_SAMPLES) -> dict[str, list[list[float]]]:
    """share placement -> one reading list per sample of tasks drawn from ``jobs``."""
    types = [(job.gpus, job.gpu_fraction or 1.0) for job in jobs]
    mix = task_mix(types)
    drawn = samples(types, count, GPUS, lambda task: task[0] * task[1])
    return {p: [fill(tasks, p, mix) for tasks in drawn] for p in share_policy_names()}


# ---- MIG --------------------------------------------------------------------------------------


def mig_slices_for(part: float) -> int:
    """The compute slices of the smallest profile that gives a task ``part`` of a GPU."""
    return next(c for c in sorted(MIG_PROFILES) if c / 7 >= part - 1e-9)


def mig_fill(tasks: Sequence[Task], rule: str, mix: dict[str, float]) -> list[float]:
    """Allocated shares of the host's compute slices at :data:`FILL_DEMAND`, instances created
    where ``rule`` puts them (a MIG creation rule of :mod:`gpualloc.placement.mig.rules`)."""
    name, memory = MIG_GPU
    occupied = {gpu: frozenset[int]() for gpu in range(GPUS)}
    arrived = allocated = 0.0
    readings: list[float] = []
    for gpus, part in tasks:
        compute = mig_slices_for(part)
        arrived += gpus * compute
        here = [MigGpu(gpu, name, memory, taken) for gpu, taken in occupied.items()]
        slots = rank_slots(here, MIG_PROFILES[compute], mix, rule)
        if len(slots) >= gpus:  # k whole GPUs: k 7g slots, one per GPU
            for slot in slots[:gpus]:
                occupied[slot.gpu] |= frozenset(range(slot.start, slot.start + slot.size))
            allocated += gpus * compute
        _readings(readings, arrived, allocated, 7 * GPUS)
    return readings


def mig_fill_table(jobs: list[SimJob], count: int = FILL_SAMPLES) -> dict[str, list[list[float]]]:
    """creation rule -> one reading list per sample of tasks drawn from ``jobs``; fgd weighs
    the profiles the tasks become."""
    types = [(job.gpus, job.gpu_fraction or 1.0) for job in jobs]
    profiles = Counter(MIG_PROFILES[mig_slices_for(p)] for g, p in types for _ in range(g))
    mix = {profile: n / sum(profiles.values()) for profile, n in profiles.items()}
    drawn = samples(types, count, 7 * GPUS, lambda task: task[0] * mig_slices_for(task[1]))
    return {rule: [mig_fill(tasks, rule, mix) for tasks in drawn] for rule in mig_rule_names()}
