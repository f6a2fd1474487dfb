"""MAPA's original simulator, emulated, beside gpualloc's ``mapa`` on the same jobs.

The original (socal-ucr/MAPA, MapaSim with the ``preserve`` and ``greedy`` policies; its job
lists from socal-ucr/jobGenerator) is emulated here from its documented behaviour, as recorded
in ``shared/reference/README.md`` and ``mapa_*.json`` and read in its sources (facts, not code):

- the DGX-1 V100 graph is complete: a pair without NVLink is a PCIe edge; scoring weights
  50 (two NVLinks), 25 (one), 10 (PCIe); GPUs numbered from 1;
- a job's candidates are every set of free GPUs of its size (every set matches a ring on a
  complete graph), in increasing lexicographic order (an assumption: the pattern matcher's own
  order is not documented), each in every order of its GPUs (``next_permutation`` from the
  sorted set); a ring's edges are consecutive GPUs plus the closing pair, so a 2-GPU ring counts
  its pair twice;
- ``preserve``: a bandwidth-sensitive job takes the candidate of highest predicted effective
  bandwidth (Eq. 2, Table 2's 14 coefficients on the counts of two-NVLink, one-NVLink and PCIe
  ring edges), the first of equals, *and only one above the empty allocation's 12.335 GB/s*
  (the search starts from an empty allocation and keeps strictly better ones); an insensitive
  job takes the candidate that leaves the most NVLink bandwidth among the GPUs still free, then
  the highest ring bandwidth (the sum of its edges' weights), the first of equals;
- ``greedy``: every job takes the highest ring bandwidth, the first of equals (it never looks
  at the predicted bandwidth);
- the queue: every job at time 0, one time unit per cycle; each cycle, jobs that end are freed,
  then the waiting list is walked in order and stops at the first job that does not fit or
  finds no candidate. The walk erases a job that starts from the list it is walking, so the
  job behind it is skipped until the next cycle (the loop reads past the list's new end after
  that: undefined, not emulated).

``python benchmarks/mapa_original.py [--seeds N]`` prints docs/evaluation.md's section 3.4:
per run, the mean predicted effective bandwidth of the bandwidth-sensitive jobs and the
makespan, over job lists drawn as the original generator draws them (Python's ``random`` in its
order: GPU counts 2..5, arrival times, service times 5..24, the pattern, the network), and how
many decisions gpualloc and the original share.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

NETWORKS = ("alexnet", "googlenet", "caffenet", "inception-v3", "resnet-50", "vgg16")
INSENSITIVE = {"googlenet", "caffenet"}
COEFFICIENTS = (
    16.39670455, 4.536821878, 1.55623404, -20.69484581, -9.467461958, 7.615106783,
    -7.973335727, 12.73323772, -4.195655221, -8.413419363, 62.85125807, 27.41832588,
    -5.114108079, -46.97390071,
)  # fmt: skip
"""MAPA's Eq. 2 (Table 2), in the order of ``mapa_effbw_model.json``'s ``feature_order``."""
DGX_V_NVLINKS = {
    (1, 2): 1, (1, 3): 1, (1, 4): 2, (1, 5): 2, (2, 3): 2, (2, 4): 1, (2, 6): 2, (3, 4): 2,
    (3, 7): 1, (4, 8): 1, (5, 6): 1, (5, 7): 1, (5, 8): 2, (6, 7): 2, (6, 8): 1, (7, 8): 2,
}  # fmt: skip
"""``mapa_topologies.json`` ``dgx-v``: NVLinks per pair (1-based); every other pair is PCIe."""
WEIGHT = {2: 50, 1: 25, 0: 10}


def predicted_gbps(double: int, single: int, pcie: int) -> float:
    x1, x2, x3 = double, single, pcie
    features = (
        x1, x2, x3, 1 / (x1 + 1), 1 / (x2 + 1), 1 / (x3 + 1), x1 * x2, x2 * x3, x1 * x3,
        1 / (x1 * x2 + 1), 1 / (x2 * x3 + 1), 1 / (x1 * x3 + 1), x1 * x2 * x3,
        1 / (x1 * x2 * x3 + 1),
    )  # fmt: skip
    return sum(c * f for c, f in zip(COEFFICIENTS, features, strict=True))


EMPTY_ALLOCATION_GBPS = predicted_gbps(0, 0, 0)


def links(a: int, b: int) -> int:
    return DGX_V_NVLINKS.get((min(a, b), max(a, b)), 0)


def ring_edges(order: tuple[int, ...]) -> list[tuple[int, int]]:
    return [(order[i], order[(i + 1) % len(order)]) for i in range(len(order))]


def ring_scores(order: tuple[int, ...]) -> tuple[float, int]:
    """(predicted effective bandwidth, ring bandwidth) of GPUs in this order."""
    counts = {2: 0, 1: 0, 0: 0}
    weight = 0
    for a, b in ring_edges(order):
        counts[links(a, b)] += 1
        weight += WEIGHT[links(a, b)]
    return predicted_gbps(counts[2], counts[1], counts[0]), weight


def nvlink_left(free: set[int]) -> int:
    """NVLink bandwidth (scoring weights) among ``free`` GPUs: what a placement preserves."""
    pairs = itertools.combinations(sorted(free), 2)
    return sum(WEIGHT[links(a, b)] for a, b in pairs if links(a, b))


@dataclass
class Job:
    order: int
    gpus: int
    service: int
    sensitive: bool
    network: str
    start: int | None = None
    placed: tuple[int, ...] = ()
    effective_gbps: float = 0.0


def candidates(free: set[int], size: int):
    for chosen in itertools.combinations(sorted(free), size):
        yield from itertools.permutations(chosen)


def choose(policy: str, job: Job, free: set[int]) -> tuple[int, ...] | None:
    best: tuple[int, ...] | None = None
    if policy == "greedy":
        best_weight = 0
        for order in candidates(free, job.gpus):
            weight = ring_scores(order)[1]
            if weight > best_weight:
                best, best_weight = order, weight
        return best
    if job.sensitive and job.gpus > 1:
        best_bw = EMPTY_ALLOCATION_GBPS
        for order in candidates(free, job.gpus):
            bandwidth = ring_scores(order)[0]
            if bandwidth > best_bw:
                best, best_bw = order, bandwidth
        return best
    best_key = (0, 0)
    for order in candidates(free, job.gpus):
        key = (nvlink_left(free - set(order)), ring_scores(order)[1])
        if key > best_key:
            best, best_key = order, key
    return best


def run_original(
    jobs: list[Job], policy: str, gpus: int = 8, *, skip_behind_started: bool = True
) -> list[Job]:
    """The original simulator's cycles (see the module docstring); ``skip_behind_started``
    False walks the queue as a FIFO should (the job behind one that starts is considered)."""
    waiting = list(jobs)
    running: list[Job] = []
    free = set(range(1, gpus + 1))
    cycle = 0
    while waiting or running:
        for job in [j for j in running if j.start is not None and j.start + j.service == cycle]:
            running.remove(job)
            free |= set(job.placed)
        position = 0
        while position < len(waiting):
            job = waiting[position]
            if job.gpus > len(free):
                break
            placed = choose(policy, job, free)
            if placed is None:
                break
            job.start, job.placed = cycle, placed
            job.effective_gbps = ring_scores(placed)[0]
            free -= set(placed)
            running.append(job)
            waiting.pop(position)
            if skip_behind_started:
                position += 1  # the walk's iterator moves past the job that slid into place
        cycle += 1
    return jobs


def original_job_list(seed: int, count: int = 100) -> list[Job]:
    """A list as jobGenerator draws it (final version, 2..5 GPUs, ring jobs), seeded."""
    rng = random.Random(seed)
    sizes = [rng.randrange(2, 6) for _ in range(count)]
    [rng.randrange(0, int(14.5 * count)) for _ in range(count)]  # arrival times: ignored
    services = [rng.randrange(5, 25) for _ in range(count)]
    [rng.choice(["ring"]) for _ in range(count)]
    networks = [rng.choice(NETWORKS) for _ in range(count)]
    return [
        Job(i, sizes[i], services[i], networks[i] not in INSENSITIVE, networks[i])
        for i in range(count)
    ]


def sensitive_mean(jobs: list[Job]) -> float:
    return statistics.mean(j.effective_gbps for j in jobs if j.sensitive)


@dataclass
class Outcome:
    """One policy on one job list: the mean predicted bandwidth of its sensitive jobs, the
    makespan, and where and when each job ran (for comparing decisions)."""

    sensitive_gbps: float
    makespan: float
    decisions: dict[int, tuple[float, tuple[int, ...]]] = field(default_factory=dict)


def original(seed: int, policy: str, *, skip_behind_started: bool = True) -> Outcome:
    jobs = run_original(original_job_list(seed), policy, skip_behind_started=skip_behind_started)
    return Outcome(
        sensitive_mean(jobs),
        max(j.start + j.service for j in jobs if j.start is not None),
        {j.order: (float(j.start or 0), tuple(sorted(g - 1 for g in j.placed))) for j in jobs},
    )


@contextmanager
def lowest_index_ties(policy: str) -> Iterator[None]:
    """``policy`` with the original's tie-break, the lowest indices, instead of gpualloc's tie
    rule (:mod:`gpualloc.placement.ties`): what compares the two decision by decision."""
    from gpualloc.placement.policies.registry import get_policy

    kind = type(get_policy(policy))
    before = kind.breaks_ties
    kind.breaks_ties = False
    try:
        yield
    finally:
        kind.breaks_ties = before


def gpualloc_run(
    seed: int, policy: str, *, hold: bool = False, original_ties: bool = False
) -> Outcome:
    """gpualloc's simulator on the same list: every job at time 0, FIFO, fixed service times,
    DGX-1 V100 (GPUs numbered from 0); ``hold`` gives sensitive jobs the original's threshold,
    ``original_ties`` the original's tie-break (:func:`lowest_index_ties`)."""
    if original_ties:
        with lowest_index_ties(policy):
            return gpualloc_run(seed, policy, hold=hold)
    from gpualloc.simulate.engine import SimOptions, simulate
    from gpualloc.simulate.generate import ABOVE_EMPTY_ALLOCATION
    from gpualloc.simulate.trace import SimJob
    from gpualloc.topologies import load_bundled

    jobs = [
        SimJob(
            id=f"job{j.order}",
            arrival_s=0.0,
            gpus=j.gpus,
            duration_s=float(j.service),
            sensitive=j.sensitive,
            workload=j.network,
            min_bandwidth=ABOVE_EMPTY_ALLOCATION if hold and j.sensitive else None,
            order=j.order,
        )
        for j in original_job_list(seed)
    ]
    options = SimOptions(policy=policy, queue="fifo", runtime="fixed")
    result = simulate(load_bundled("dgx1-v100"), jobs, options)
    return Outcome(
        statistics.mean(r.effective_gbps or 0.0 for r in result.jobs if r.job.sensitive),
        max(r.end_s for r in result.jobs),
        {r.job.order: (r.start_s, tuple(sorted(r.gpus))) for r in result.jobs},
    )


RULED = "gpualloc `mapa`"
TIES = "gpualloc `mapa`, the original's tie-break"
HOLD = "gpualloc `mapa`, the original's tie-break and threshold (`hold=1`)"
GREEDY_RULED = "gpualloc `mapa-greedy`"
GREEDY_TIES = "gpualloc `mapa-greedy`, the original's tie-break"
RUNS = {
    "original Preserve, as written": lambda seed: original(seed, "preserve"),
    "original Preserve, queue walked in order": lambda seed: original(
        seed, "preserve", skip_behind_started=False
    ),
    RULED: lambda seed: gpualloc_run(seed, "mapa"),
    TIES: lambda seed: gpualloc_run(seed, "mapa", original_ties=True),
    HOLD: lambda seed: gpualloc_run(seed, "mapa", hold=True, original_ties=True),
    "original Greedy, as written": lambda seed: original(seed, "greedy"),
    "original Greedy, queue walked in order": lambda seed: original(
        seed, "greedy", skip_behind_started=False
    ),
    GREEDY_RULED: lambda seed: gpualloc_run(seed, "mapa-greedy"),
    GREEDY_TIES: lambda seed: gpualloc_run(seed, "mapa-greedy", original_ties=True),
}
SAME_DECISIONS = (
    ("original Preserve, queue walked in order", HOLD),
    ("original Greedy, queue walked in order", GREEDY_TIES),
)


def outcomes(seeds: range) -> dict[str, list[Outcome]]:
    return {name: [run(seed) for seed in seeds] for name, run in RUNS.items()}


def same_decisions(first: list[Outcome], second: list[Outcome]) -> tuple[int, int]:
    """(jobs placed on the same GPUs at the same time, jobs) over the lists."""
    same = total = 0
    for a, b in zip(first, second, strict=True):
        total += len(a.decisions)
        same += sum(a.decisions[k] == b.decisions.get(k) for k in a.decisions)
    return same, total


def comparison_section(seeds: range = range(1, 11)) -> list[str]:
    """docs/evaluation.md section 3.4."""
    found = outcomes(seeds)
    lines = [
        "### 3.4 gpualloc's `mapa` against the original MAPA simulator",
        "",
        f"{len(seeds)} job lists of 100 drawn as MAPA's generator draws them (seeds "
        f"{seeds.start}-{seeds.stop - 1}; 2 to 5 GPUs, ring jobs, 5 to 24 time units, four of "
        "six networks sensitive), every job queued at time 0, FIFO, fixed service times, "
        "DGX-1 V100. The original is emulated from its documented behaviour "
        "(`benchmarks/mapa_original.py` says what and on what evidence); the mean is over the "
        "bandwidth-sensitive jobs, as MAPA reports it (Table 2's predicted effective bandwidth).",
        "",
        "| run | mean predicted GB/s, sensitive jobs | makespan |",
        "|---|---:|---:|",
    ]
    for name, results in found.items():
        mean = statistics.mean(o.sensitive_gbps for o in results)
        makespan = statistics.mean(o.makespan for o in results)
        lines.append(f"| {name} | {mean:.2f} | {makespan:.1f} |")
    lines.append("")
    for first, second in SAME_DECISIONS:
        same, total = same_decisions(found[first], found[second])
        lines.append(
            f"- {second} and {first}: {same} of {total} jobs on the same GPUs at the same time."
        )
    threshold = _mean(found, HOLD) - _mean(found, TIES)
    walk = _mean(found, "original Preserve, as written") - _mean(
        found, "original Preserve, queue walked in order"
    )
    greedy_walk = _mean(found, "original Greedy, as written") - _mean(
        found, "original Greedy, queue walked in order"
    )
    moved, total = same_decisions(found[RULED], found[TIES])
    greedy_moved, _ = same_decisions(found[GREEDY_RULED], found[GREEDY_TIES])
    lines += [
        "",
        "How the two differ: in placement, only where the objective ties. With the original's "
        "tie-break, the lowest indices, gpualloc makes the decisions above, given the "
        "emulation's one assumption (the original meets candidate sets in increasing order). "
        "gpualloc's own tie rule ([Placement](placement.md#ties): fewer NUMA nodes, fewer root "
        f"complexes, more NVLink left free, then the lowest indices) moves {total - moved} of "
        f"{total} Preserve decisions and {total - greedy_moved} Greedy ones, worth "
        f"{_mean(found, RULED) - _mean(found, TIES):+.2f} and "
        f"{_mean(found, GREEDY_RULED) - _mean(found, GREEDY_TIES):+.2f} GB/s on average here. "
        "Its means differ from gpualloc's for two reasons outside placement:",
        "",
        f"- Preserve's hidden threshold: its search starts from an empty allocation (12.335 "
        "GB/s) and keeps only a better one, so a sensitive job whose best GPUs predict less "
        "waits, holding the queue, for better ones. That is worth "
        f"{threshold:+.2f} GB/s on average here. gpualloc starts the job (a user's job runs now, "
        "and placement does not wait by default); the threshold is there for whoever wants it: "
        "`--min-bandwidth 12.33507` on `run --wait`, `min_bandwidth` in a trace, `hold=1` in "
        "the generator. With it, gpualloc makes the original's decisions exactly.",
        f"- The original's queue walk erases the job that starts from the list it is walking, "
        "so the job behind it is skipped until the next cycle: a reordering that moves its "
        f"means by {walk:+.2f} (Preserve) and {greedy_walk:+.2f} GB/s (Greedy) on average here, "
        "either way from list to list, and changes its makespan; gpualloc's FIFO does not copy "
        "a bug. On a reference job list kept out of the repository the original reports "
        "58.52 (Preserve) and 57.25 (Greedy) against gpualloc's 58.07 and 56.80 with the "
        "original's tie-break; since those placements agree, Greedy's gap there comes from the "
        "walk alone, and Preserve's from the walk and the threshold.",
    ]
    return lines


def _mean(found: dict[str, list[Outcome]], name: str) -> float:
    return statistics.mean(o.sensitive_gbps for o in found[name])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    options = parser.parse_args()
    print("\n".join(comparison_section(range(1, options.seeds + 1))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
