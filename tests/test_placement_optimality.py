"""Every policy returns the true optimum of its own objective: brute force on bundled hosts.

The brute force enumerates every candidate set and, for order-dependent objectives, every order
of it, then applies the documented tie-break: the highest key, then the tie rule of
:mod:`gpualloc.placement.ties` (fewest NUMA nodes, fewest PCIe root complexes, most NVLink
bandwidth left free, the lowest sorted set), then the lowest order. The engine must return
exactly that placement.
"""

from __future__ import annotations

import random
import zlib
from itertools import combinations, permutations
from math import comb

import pytest

from gpualloc.model.request import HostState, JobRequest
from gpualloc.placement.decide import decision_context
from gpualloc.placement.mapa.objectives import AggregatedObjective, evaluate_order
from gpualloc.placement.mapa.patterns import build_pattern
from gpualloc.placement.policies.registry import get_policy, policy_names
from gpualloc.topologies import bundled_names, load_bundled
from tests.brute_force import PATTERNS, contexts, optimum
from tests.go_gpuallocator import literal_partitions

SMALL_HOSTS = [n for n in bundled_names() if load_bundled(n).gpu_count <= 8]
SMALL_JOB_GPUS = 5
"""Jobs of up to this many GPUs are checked in the fast loop; bigger ones, whose brute force
costs k! orders per set (about 95 % of the time), only with the slow tests."""


def _host_halves() -> list:
    """(host, half) cases: every host with small jobs; large jobs (slow) on every host but the
    MIG twins, whose whole-GPU graph is their twin's (dgx-a100-mig is dgx-a100's)."""
    cases = [pytest.param(h, "small", id=f"k<=5-{h}") for h in SMALL_HOSTS]
    cases += [
        pytest.param(h, "large", id=f"k>5-{h}", marks=pytest.mark.slow)
        for h in SMALL_HOSTS
        if not (h.endswith("-mig") and h.removesuffix("-mig") in SMALL_HOSTS)
    ]
    return cases


@pytest.mark.parametrize(("host_name", "jobs"), _host_halves())
@pytest.mark.parametrize("policy_name", ["mapa", "mapa-greedy", "drb", "pack", "spread"])
def test_policy_is_optimal_on_small_hosts(host_name: str, policy_name: str, jobs: str) -> None:
    policy = get_policy(policy_name)
    # A stable seed per case: hash() of a str changes from run to run (PYTHONHASHSEED).
    for ctx in contexts(host_name, seed=zlib.crc32(f"{host_name}/{policy_name}".encode())):
        if (ctx.k <= SMALL_JOB_GPUS) != (jobs == "small"):
            continue  # the same contexts as one test, in two halves
        if policy_name == "mapa" and not ctx.request.sensitive and ctx.k > 5:
            continue  # the brute force of the tie-break costs k! per set
        got = policy.place(ctx)
        expected = tuple(optimum(ctx, policy_name))
        assert got.gpus == expected, (
            f"{policy_name} on {host_name}, k={ctx.k} {ctx.request.pattern.name} "
            f"sensitive={ctx.request.sensitive} free={sorted(ctx.state.free)} "
            f"required={sorted(ctx.request.required)}"
        )


@pytest.mark.parametrize("host_name", ["torus-2d-16", "cube-mesh-16", "dgx2"])
@pytest.mark.parametrize("policy_name", ["mapa", "mapa-greedy"])
def test_policy_is_optimal_on_16_gpu_hosts_small_jobs(host_name: str, policy_name: str) -> None:
    policy = get_policy(policy_name)
    for ctx in contexts(host_name, seed=7, max_k=3):
        got = policy.place(ctx)
        assert got.gpus == tuple(optimum(ctx, policy_name))


def _go_besteffort(ctx):
    from gpualloc.placement.policies.besteffort import pair_score

    pool, k, required = list(ctx.pool), ctx.k, ctx.request.required
    if k == 1:
        return (min(required),) if required else (pool[0],)
    if len(pool) == k:
        return tuple(pool)
    padding = (-len(pool)) % k
    n = len(pool)
    slots = [*pool, *([None] * padding)]

    def score(group):
        real = [slots[i] for i in group if i < n]
        return sum(pair_score(ctx, a, b) for a, b in combinations(real, 2))

    def qualifies(group):
        return all(i < n for i in group) and required <= {slots[i] for i in group}

    best, best_total = None, None
    for partition in literal_partitions(list(range(len(slots))), k, padding, n):
        if not any(qualifies(g) for g in partition):
            continue
        total = sum(score(g) for g in partition)
        if best is None or total > best_total:
            best, best_total = partition, total
    groups = [g for g in best if qualifies(g)]
    chosen = groups[0]
    for group in groups[1:]:
        if score(group) > score(chosen):
            chosen = group
    return tuple(sorted(slots[i] for i in chosen))


@pytest.mark.parametrize("host_name", SMALL_HOSTS)
def test_besteffort_returns_what_go_gpuallocator_returns(host_name: str) -> None:
    policy = get_policy("besteffort")
    for ctx in contexts(host_name, seed=3):
        if ctx.request.pattern.name != "ring" or not ctx.request.sensitive:
            continue
        assert policy.place(ctx).gpus == _go_besteffort(ctx), (host_name, ctx.k)


@pytest.mark.parametrize("host_name", ["dgx2", "torus-2d-16", "cube-mesh-16"])
def test_besteffort_on_16_gpus_matches_the_enumeration_where_it_is_feasible(host_name) -> None:
    topology = load_bundled(host_name)
    policy = get_policy("besteffort")
    for busy_count, k, required in ((6, 2, ()), (7, 3, ()), (8, 4, ()), (5, 3, (9,)), (6, 5, ())):
        busy = frozenset(range(busy_count))
        request = JobRequest(k, build_pattern("ring", k), True, required=frozenset(required))
        ctx = decision_context(topology, request, HostState.with_busy(16, busy))
        assert policy.place(ctx).gpus == _go_besteffort(ctx), (k, busy_count, required)


@pytest.mark.parametrize("host_name", bundled_names())
def test_every_policy_answers_on_every_bundled_host(host_name: str) -> None:
    topology = load_bundled(host_name)
    n = topology.gpu_count
    for k in sorted(k for k in {1, 2, n // 2 or 1, n} if k <= n):
        request = JobRequest(k, build_pattern("ring", k), k >= 2)
        ctx = decision_context(topology, request)
        for name in policy_names():
            if n > 8 and name in ("drb", "pack") and 3 <= k <= n - 3:
                continue  # covered by the benchmark; slow in pure-Python CI
            if n > 16 and name == "besteffort" and 3 <= k <= n - 3:
                continue  # go-gpuallocator's partitions of a 32-GPU mesh: minutes
            placement = get_policy(name).place(ctx)
            assert len(set(placement.gpus)) == len(placement.gpus) == k
            assert set(placement.gpus) <= ctx.state.free


def test_many_link_classes_fall_back_to_branch_and_bound() -> None:
    """A measured matrix gives nearly every pair its own bandwidth: too many count vectors, so
    the search enumerates orders. It must still be optimal."""
    from gpualloc.discovery.bandwidth_matrix import topology_from_bandwidth_matrix
    from gpualloc.placement.mapa.search import MAX_VECTORS, PlacementSearch

    rng = random.Random(11)
    n = 7
    matrix = [[round(rng.uniform(5, 100), 2) for _ in range(n)] for _ in range(n)]
    topology = topology_from_bandwidth_matrix(matrix, name="measured", origin="test")
    for k, pattern in ((5, "ring"), (6, "ring"), (6, "tree")):
        for policy_name in ("mapa-greedy", "mapa"):
            request = JobRequest(k, build_pattern(pattern, k), True)
            ctx = decision_context(topology, request)
            search = PlacementSearch(ctx.host, request.pattern, AggregatedObjective(), ctx.pool)
            classes = len(search.classes.weight)
            edges = len(request.pattern.edges)
            assert comb(edges + classes - 1, classes - 1) > MAX_VECTORS
            got = get_policy(policy_name).place(ctx)
            assert got.gpus == tuple(optimum(ctx, policy_name)), (k, pattern, policy_name)


@pytest.mark.parametrize(
    ("host_name", "pattern"),
    [
        ("torus-2d-16", "ring"),
        pytest.param("torus-2d-16", "tree", marks=pytest.mark.slow),
        pytest.param("cube-mesh-16", "ring", marks=pytest.mark.slow),
        pytest.param("cube-mesh-16", "tree", marks=pytest.mark.slow),
    ],
)
def test_large_jobs_on_a_few_free_gpus_of_16_gpu_hosts(host_name: str, pattern: str) -> None:
    """Jobs that take most of the free GPUs of a mesh host: where the component, degree and
    lookahead bounds of the search do the work. Brute force needs the pool small (8 GPUs)."""
    topology = load_bundled(host_name)
    rng = random.Random(zlib.crc32(f"{host_name}/{pattern}".encode()))
    for _ in range(3):
        busy = frozenset(rng.sample(range(16), 8))
        for k in (6, 7, 8):
            request = JobRequest(k, build_pattern(pattern, k), True)
            ctx = decision_context(topology, request, HostState.with_busy(16, busy))
            got = get_policy("mapa-greedy").place(ctx)
            assert got.gpus == tuple(optimum(ctx, "mapa-greedy")), (k, sorted(busy))


def _held_karp_best_ring(host, gpus) -> float:
    """The most aggregated bandwidth of a ring through all of ``gpus`` (Held-Karp)."""
    k, bandwidth = len(gpus), host.bandwidth
    w = [[bandwidth[a][b] for b in gpus] for a in gpus]
    best: dict[tuple[int, int], float] = {(1, 0): 0.0}
    for mask in range(1, 1 << k, 2):
        for last in range(k):
            value = best.get((mask, last))
            if value is None:
                continue
            for nxt in range(1, k):
                if not mask >> nxt & 1:
                    key = (mask | 1 << nxt, nxt)
                    if value + w[last][nxt] > best.get(key, -1.0):
                        best[key] = value + w[last][nxt]
    full = (1 << k) - 1
    return max(best[(full, last)] + w[last][0] for last in range(1, k))


@pytest.mark.parametrize("host_name", ["torus-2d-16", "cube-mesh-16", "dgx1-v100"])
def test_ring_order_of_a_large_set_is_the_best_tour(host_name: str) -> None:
    """Rings of 9 to 11 GPUs, ordered by the count-vector search (where the degree-deficit
    bound prunes), against Held-Karp's exact best tour."""
    from gpualloc.placement.host_graph import HostGraph
    from gpualloc.placement.mapa.exact import best_order_of_set

    topology = load_bundled(host_name)
    host = HostGraph.from_topology(topology)
    rng = random.Random(zlib.crc32(host_name.encode()))
    for _ in range(4):
        k = rng.randint(min(9, topology.gpu_count), min(11, topology.gpu_count))
        gpus = sorted(rng.sample(range(topology.gpu_count), k))
        pattern = build_pattern("ring", k)
        order = best_order_of_set(host, pattern, AggregatedObjective(), gpus)
        assert sorted(order) == gpus
        got = evaluate_order(host, pattern, AggregatedObjective(), order)[0]
        assert got == pytest.approx(_held_karp_best_ring(host, gpus), abs=1e-6), gpus


@pytest.mark.parametrize("host_name", ["dgx1-v100", "torus-2d-16", "cube-mesh-16"])
def test_search_over_a_family_of_sets_equals_searching_each(host_name: str) -> None:
    """MAPA's tie-break searches the tied sets together; it must return what searching each
    set alone and keeping the best key, then the lowest set, returns."""
    from gpualloc.placement.host_graph import HostGraph
    from gpualloc.placement.mapa.exact import best_ordered_placement, best_placement_among

    topology = load_bundled(host_name)
    host = HostGraph.from_topology(topology)
    n = topology.gpu_count
    rng = random.Random(zlib.crc32(f"family/{host_name}".encode()))
    for _ in range(12):
        k = rng.randint(3, min(8, n - 1))
        pattern = build_pattern(rng.choice(["ring", "tree", "star", "all"]), k)
        pool = sorted(rng.sample(range(n), rng.randint(k + 1, min(n, k + 4))))
        family = sorted({tuple(sorted(rng.sample(pool, k))) for _ in range(rng.randint(2, 8))})
        objective = AggregatedObjective()
        expected = None
        for gpus in family:
            found = best_ordered_placement(host, pattern, objective, gpus, gpus)
            if expected is None or found.key > expected[0]:
                expected = (found.key, gpus, found.order)
        got = best_placement_among(host, pattern, objective, family)
        assert (got.key, tuple(sorted(got.order)), got.order) == expected, (k, pattern.name, family)


def _max_degree_limited_subgraph(edges, size, limit):
    for count in range(len(edges), -1, -1):
        for chosen in combinations(range(len(edges)), count):
            degree = [0] * size
            for i in chosen:
                u, v = edges[i]
                degree[u] += 1
                degree[v] += 1
            if max(degree) <= limit:
                return count
    return 0


@pytest.mark.parametrize("seed", range(6))
def test_degree_limited_edges_matches_brute_force(seed: int) -> None:
    from gpualloc.model.request import CommunicationPattern
    from gpualloc.placement.mapa.pattern_graphs import degree_limited_edges

    rng = random.Random(seed)
    size = rng.randint(3, 9)
    tree_edges = tuple((rng.randrange(v), v) for v in range(1, size))
    for pattern in (
        CommunicationPattern("custom", size, tree_edges),
        build_pattern("tree", size),
        build_pattern("ring", size),
        build_pattern("star", size),
    ):
        for limit in range(4):
            assert degree_limited_edges(pattern, limit) == _max_degree_limited_subgraph(
                pattern.edges, size, limit
            ), (pattern, limit)


def test_degree_limit_of_a_16_rank_tree_on_two_links_per_gpu() -> None:
    """The bound that refutes 12+ NV2 edges for a 16-GPU tree on the torus (NV2 degree 2)."""
    from gpualloc.placement.mapa.pattern_graphs import degree_limited_edges

    assert degree_limited_edges(build_pattern("tree", 16), 2) == 11


@pytest.mark.parametrize("host_name", ["dgx1-v100", "pcie-8gpu-2socket", "torus-2d-16"])
def test_aggregated_upper_bound_is_an_upper_bound(host_name: str) -> None:
    from gpualloc.placement.policies.mapa import aggregated_upper_bound

    topology = load_bundled(host_name)
    rng = random.Random(3)
    n = topology.gpu_count
    for _ in range(12):
        k = rng.randint(2, 6)
        gpus = tuple(sorted(rng.sample(range(n), k)))
        for pattern in PATTERNS:
            request = JobRequest(k, build_pattern(pattern, k), False)
            ctx = decision_context(topology, request)
            best = max(
                evaluate_order(ctx.host, request.pattern, AggregatedObjective(), order)[0]
                for order in permutations(gpus)
            )
            assert aggregated_upper_bound(ctx.host, request.pattern, gpus) >= best - 1e-6


@pytest.mark.parametrize("host_name", ["dgx1-v100", "dgx2", "torus-2d-16"])
def test_preserve_loss_search_finds_every_tied_set(host_name: str) -> None:
    """The least NVLink loss and every set that attains it, in order, against brute force."""
    from gpualloc.placement.mapa.scores import preserved_gbps
    from gpualloc.placement.policies.mapa import LossSearch

    topology = load_bundled(host_name)
    n = topology.gpu_count
    rng = random.Random(zlib.crc32(host_name.encode()))
    for _ in range(4):
        k = rng.randint(1, 5)
        busy = frozenset(rng.sample(range(n), rng.randint(0, n - k)))
        request = JobRequest(k, build_pattern("ring", k), False)
        ctx = decision_context(topology, request, HostState.with_busy(n, busy))
        kept = {
            gpus: round(preserved_gbps(ctx.host, ctx.state.free, gpus), 6)
            for gpus in combinations(ctx.pool, k)
        }
        most = max(kept.values())
        expected = [gpus for gpus, value in kept.items() if value == most]
        assert list(LossSearch(ctx).tied_sets()) == expected, (k, sorted(busy))


@pytest.mark.parametrize("host_name", ["cube-mesh-16", "torus-2d-16", "dgx2", "dgx-a100"])
def test_drb_fast_scan_matches_scoring_every_set(host_name: str) -> None:
    """UtilityModel.best_set (prefix memo, bitmasks) picks the set that scoring every candidate
    with UtilityModel.utility picks, with jobs running (interference) and without."""
    import random

    from gpualloc.model.request import RunningJob
    from gpualloc.placement.sets.candidates import candidate_sets

    topology = load_bundled(host_name)
    n = topology.gpu_count
    rng = random.Random(zlib.crc32(host_name.encode()))
    for k in (2, 3, 5, n // 2) * 3:
        busy = rng.sample(range(n), rng.randint(0, n // 3))
        running = tuple(
            RunningJob(frozenset(part), sensitive=rng.choice([True, False, None]))
            for part in (busy[: len(busy) // 2], busy[len(busy) // 2 :])
            if part
        )
        state = HostState(free=frozenset(range(n)) - frozenset(busy), running=running)
        request = JobRequest(k, build_pattern("ring", k), rng.choice([True, False]))
        ctx = decision_context(topology, request, state)
        model = ctx.utility_model
        sets = list(candidate_sets(ctx.pool, ctx.request.required, k))
        keys = [round(model.utility(gpus), 6) for gpus in sets]
        expected = sets[keys.index(max(keys))]
        assert model.best_set(sets) == expected, (host_name, k, sorted(busy))


@pytest.mark.parametrize("host_name", ["dgx1-v100", "pcie-8gpu-2socket", "torus-2d-16", "dgx2"])
def test_star_shortcut_matches_the_search(host_name: str) -> None:
    """The hub-only evaluation of a star on a fixed set gives the search's order and key."""
    from gpualloc.placement.host_graph import HostGraph
    from gpualloc.placement.mapa.exact import _best_star_order
    from gpualloc.placement.mapa.objectives import AggregatedObjective, effective_objective
    from gpualloc.placement.mapa.scores import EffectiveModel, resolve_model
    from gpualloc.placement.mapa.search import PlacementSearch

    topology = load_bundled(host_name)
    host = HostGraph.from_topology(topology)
    rng = random.Random(zlib.crc32(host_name.encode()))
    objectives = (
        AggregatedObjective(),
        effective_objective(resolve_model(host, EffectiveModel.AUTO)),
    )
    for _ in range(12):
        k = rng.randint(2, min(7, topology.gpu_count))
        gpus = tuple(sorted(rng.sample(range(topology.gpu_count), k)))
        pattern = build_pattern("star", k)
        for objective in objectives:
            searched = PlacementSearch(host, pattern, objective, gpus, gpus).run()
            shortcut = _best_star_order(host, pattern, objective, gpus)
            assert (shortcut.order, shortcut.key) == (searched.order, searched.key), gpus
