"""The set-level capacity check of the order search (:mod:`gpualloc.placement.mapa.set_capacity`)
never rejects a set that some order realises: every order of random sets on the
bundled meshes and PCIe hosts, rings and trees, is counted into its vector and checked."""

from __future__ import annotations

import random
from itertools import permutations

import pytest

from gpualloc.model.request import HostState, JobRequest
from gpualloc.placement.decide import decision_context
from gpualloc.placement.host_graph import HostGraph
from gpualloc.placement.mapa.objectives import AggregatedObjective
from gpualloc.placement.mapa.patterns import build_pattern
from gpualloc.placement.mapa.search import PlacementSearch
from gpualloc.placement.mapa.set_capacity import SetCapacity
from gpualloc.placement.policies.registry import get_policy
from gpualloc.topologies import load_bundled


@pytest.mark.parametrize("host", ["cube-mesh-16", "torus-2d-16", "dgx1-v100", "pcie-8gpu-2socket"])
@pytest.mark.parametrize("pattern", ["ring", "tree"])
def test_a_set_that_realises_a_vector_fits_it(host: str, pattern: str) -> None:
    topology = load_bundled(host)
    rng = random.Random(f"{host}-{pattern}")
    objective = AggregatedObjective()
    graph = HostGraph.from_topology(topology)
    for k in (3, 4, 5, 6):
        shape = build_pattern(pattern, k)
        search = PlacementSearch(graph, shape, objective, range(topology.gpu_count))
        search._prepare_budget_search()
        of_pair = search.classes.of_pair
        for _ in range(6):
            gpus = sorted(rng.sample(range(topology.gpu_count), k))
            mask = sum(1 << g for g in gpus)
            orders = list(permutations(gpus))
            for order in rng.sample(orders, min(len(orders), 60)):
                vector = [0] * len(search.classes.weight)
                for u, v in shape.edges:
                    vector[of_pair[order[u]][order[v]]] += 1
                check = SetCapacity(
                    (1 << topology.gpu_count) - 1,
                    search.group_masks,
                    vector,
                    search.open_degrees[0],
                    len(shape.edges),
                    search.ring_like,
                )
                assert check.fits(gpus, mask), (host, pattern, order, vector)


@pytest.mark.parametrize("host", ["pcie-8gpu-2socket", "pcie-32gpu-2socket", "torus-2d-16"])
@pytest.mark.parametrize("pattern", ["ring", "tree"])
def test_the_components_bound_keeps_every_set_that_realises_the_vector(
    host: str, pattern: str
) -> None:
    """:meth:`SetCapacity.spread_ok` on a part of a realising set, the rest (and others)
    still open: it must not refuse."""
    topology = load_bundled(host)
    n = topology.gpu_count
    rng = random.Random(f"spread-{host}-{pattern}")
    graph = HostGraph.from_topology(topology)
    for k in (4, 6, 8, 12):
        if k > n:
            continue
        shape = build_pattern(pattern, k)
        search = PlacementSearch(graph, shape, AggregatedObjective(), range(n))
        search._prepare_budget_search()
        of_pair = search.classes.of_pair
        for _ in range(40):
            gpus = rng.sample(range(n), k)  # an order of a random set
            vector = [0] * len(search.classes.weight)
            for u, v in shape.edges:
                vector[of_pair[gpus[u]][gpus[v]]] += 1
            check = SetCapacity(
                (1 << n) - 1,
                search.group_masks,
                vector,
                search.open_degrees[0],
                len(shape.edges),
                search.ring_like,
            )
            held = sum(1 << g for g in rng.sample(gpus, rng.randint(0, k)))
            others = [g for g in range(n) if g not in gpus]
            extra = sum(1 << g for g in rng.sample(others, rng.randint(0, len(others))))
            open_mask = (sum(1 << g for g in gpus) & ~held) | extra
            assert check.spread_ok(held, open_mask, k), (host, pattern, gpus, vector)


def test_a_lower_set_through_a_gpu_already_used_is_not_missed() -> None:
    """A regression of the set-level bound (6d8b175): the GPUs ``d`` where a lower set may
    leave the incumbent's are not checked in an order where what must be held only grows (a
    later ``d`` may be a GPU already used), so none may end the check early. The answer is
    the one of the code before the bound (4ca4369): 10 of the 13 free GPUs of a torus."""
    topology = load_bundled("torus-2d-16")
    ctx = decision_context(
        topology,
        JobRequest(10, build_pattern("tree", 10), False),
        HostState.with_busy(16, frozenset({4, 10, 13})),
    )
    placement = get_policy("mapa-greedy").place(ctx)
    assert placement.gpus == (3, 2, 15, 6, 1, 11, 14, 5, 7, 0)
