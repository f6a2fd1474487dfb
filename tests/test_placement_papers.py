"""Checks from the papers and the documented quirks of the MAPA model."""

from __future__ import annotations

from pathlib import Path

import pytest
from msgspec.structs import replace

from gpualloc.discovery.bandwidth_matrix import (
    parse_bandwidth_matrix,
    topology_from_bandwidth_matrix,
)
from gpualloc.errors import NoFeasiblePlacement, RequestError, TopologyParseError
from gpualloc.model.request import HostState, JobRequest
from gpualloc.model.topology import Topology
from gpualloc.placement.decide import decision_context, plan
from gpualloc.placement.host_graph import HostGraph
from gpualloc.placement.mapa.patterns import build_pattern, ring
from gpualloc.placement.mapa.scores import (
    MAPA_EMPTY_ALLOCATION_GBPS,
    aggregated_gbps,
    bottleneck_gbps,
    mapa_predicted_gbps,
    pattern_pairs,
    preserved_gbps,
)
from gpualloc.placement.policies.registry import policy_names
from gpualloc.topologies import load_bundled

FIXTURES = Path(__file__).parent / "fixtures"


def _paper_link_table(topology: Topology) -> Topology:
    """MAPA Fig. 4's link table: NV2 50, NV1 25, PCIe 12 GB/s."""
    links = [
        replace(link, bandwidth_gbps={2: 50.0, 1: 25.0, 0: 12.0}[link.nvlinks])
        for link in topology.links
    ]
    return replace(topology, links=links)


def test_mapa_fig4_aggregated_bandwidth() -> None:
    host = HostGraph.from_topology(_paper_link_table(load_bundled("dgx1-v100")))
    # Paper numbering is 1-based: {1,2,5} is GPUs 0,1,4 and {1,3,4} is GPUs 0,2,3.
    assert aggregated_gbps(host, pattern_pairs((0, 1, 4), ring(3))) == 87
    assert aggregated_gbps(host, pattern_pairs((0, 2, 3), ring(3))) == 125


def test_mapa_greedy_finds_fig4_ideal() -> None:
    topology = _paper_link_table(load_bundled("dgx1-v100"))
    placement = plan(topology, JobRequest(3, ring(3), True), policy="mapa-greedy")
    assert placement.scores.aggregated_gbps == 125


def test_table2_values_and_quirks() -> None:
    assert mapa_predicted_gbps(0, 0, 0) == pytest.approx(MAPA_EMPTY_ALLOCATION_GBPS, abs=1e-5)
    # Non-monotone: two NVLinks and a PCIe link score below three PCIe links.
    assert mapa_predicted_gbps(0, 2, 1) < mapa_predicted_gbps(0, 0, 3)
    assert mapa_predicted_gbps(0, 3, 2) == pytest.approx(53.609, abs=1e-3)
    assert mapa_predicted_gbps(4, 0, 1) == pytest.approx(53.509, abs=1e-3)


def test_mapa_sensitive_5_gpu_choice_beats_the_aggregated_optimum_on_the_model() -> None:
    topology = load_bundled("dgx1-v100")
    request = JobRequest(5, ring(5), True)
    mapa = plan(topology, request, policy="mapa")
    greedy = plan(topology, request, policy="mapa-greedy")
    assert mapa.scores.effective_gbps == pytest.approx(53.61, abs=0.005)
    assert greedy.scores.effective_gbps == pytest.approx(53.51, abs=0.005)
    assert greedy.scores.aggregated_gbps > mapa.scores.aggregated_gbps


def test_a_placement_is_never_refused_below_the_hidden_threshold() -> None:
    # Only PCIe-linked GPUs are free: the best ring scores below 12.335 GB/s on Table 2, which
    # the reference code treated as "do not allocate". gpualloc allocates.
    topology = load_bundled("dgx1-v100")
    state = HostState.with_busy(8, frozenset({1, 2, 3, 5, 6}))  # free: 0, 4, 7
    placement = plan(
        topology, JobRequest(2, build_pattern("ring", 2), True, required=frozenset({0, 7})), state
    )
    assert placement.scores.effective_gbps < MAPA_EMPTY_ALLOCATION_GBPS
    assert sorted(placement.gpus) == [0, 7]


def test_seed_001_bottleneck_prefers_the_nvlinked_quad() -> None:
    matrix = parse_bandwidth_matrix(
        (FIXTURES / "bandwidth" / "k8s-proposal-matrix.txt").read_text()
    )
    topology = topology_from_bandwidth_matrix(matrix, name="k8s", origin="seed 001")
    host = HostGraph.from_topology(topology)
    assert bottleneck_gbps(host, (0, 1, 2, 3)) == pytest.approx(48.33)
    # The proposal writes {0,1,2,5} for 4.64 GB/s, but 4.64 is gpu_1 -> gpu_4 in its own
    # matrix; {0,1,2,5}'s slowest pair is 0-5 at 15.52. Both lose to the quad.
    assert bottleneck_gbps(host, (0, 1, 2, 4)) == pytest.approx(4.64)
    assert bottleneck_gbps(host, (0, 1, 2, 5)) == pytest.approx(15.52)
    placement = plan(topology, JobRequest(4, build_pattern("all", 4), True), policy="mapa")
    assert placement.scores.bottleneck_gbps == pytest.approx(48.33)


def test_preserved_bandwidth_counts_nvlinks_left_free() -> None:
    host = HostGraph.from_topology(load_bundled("dgx1-v100"))
    everything = range(8)
    total = preserved_gbps(host, everything, ())
    assert total == 8 * 50 + 8 * 25
    # Taking GPU 0 removes its NV2 links to 3 and 4 and NV1 links to 1 and 2.
    assert preserved_gbps(host, everything, (0,)) == total - 150


def test_insensitive_job_keeps_nvlinked_pairs() -> None:
    topology = load_bundled("nvlink-pairs-4gpu")  # NVLink pairs 0-1 and 2-3
    state = HostState.with_busy(4, frozenset({2}))
    request = JobRequest(1, ring(1), False)
    # GPU 3 has lost its partner; taking it keeps the pair 0-1 whole. Lowest index would break it.
    assert plan(topology, request, state).gpus == (3,)
    assert plan(topology, request, state, policy="baseline").gpus == (0,)


def test_slurm_matches_the_verified_behaviour() -> None:
    topology = load_bundled("nvlink-pairs-4gpu")  # NVLink pairs 0-1 and 2-3
    links = HostGraph.from_topology(topology).nvlinks
    assert links[0][1] and links[2][3] and not links[1][2]
    state = HostState.with_busy(4, frozenset({0}))
    assert plan(topology, JobRequest(2, ring(2), True), state, policy="slurm").gpus == (1, 2)


def test_infeasible_requests_say_why() -> None:
    topology = load_bundled("dgx1-v100")
    with pytest.raises(NoFeasiblePlacement, match="asks for 9 GPUs"):
        plan(topology, JobRequest(9, ring(9), True))
    with pytest.raises(NoFeasiblePlacement, match="required GPU 3 is not free"):
        plan(
            topology,
            JobRequest(2, ring(2), True, required=frozenset({3})),
            HostState.with_busy(8, frozenset({3})),
        )
    with pytest.raises(RequestError, match="both required and excluded"):
        decision_context(
            topology, JobRequest(2, ring(2), True, required=frozenset({1}), excluded=frozenset({1}))
        )
    with pytest.raises(RequestError, match="GPU 12 does not exist"):
        decision_context(topology, JobRequest(2, ring(2), True, required=frozenset({12})))


def test_excluded_gpus_are_never_chosen() -> None:
    topology = load_bundled("dgx1-v100")
    request = JobRequest(4, ring(4), True, excluded=frozenset({0, 1}))
    for policy in policy_names():
        assert not {0, 1} & set(plan(topology, request, policy=policy).gpus), policy


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpu_0 gpu_1\ngpu_0 1 2\n", "not square"),
        ("gpu_0 gpu_1\ngpu_0 1 x\ngpu_1 1 2\n", "not a bandwidth"),
        ("gpu_0 gpu_2\n", "not GPUs 0, 1, 2"),
        ("nothing here\n", "no bandwidth matrix"),
        ("[[1, 2], [3]]", "not square"),
    ],
)
def test_bad_bandwidth_matrices(text: str, message: str) -> None:
    with pytest.raises(TopologyParseError, match=message):
        parse_bandwidth_matrix(text)


def test_p2p_bandwidth_latency_test_format() -> None:
    text = (
        "Unidirectional P2P=Enabled Bandwidth (P2P Writes) Matrix (GB/s)\n"
        "   D\\D     0      1      2\n"
        "     0 770.94  10.16  11.43\n"
        "     1  10.35 771.01  11.20\n"
        "     2  11.40  11.18 770.55\n"
        "\n"
        "Bidirectional P2P=Enabled Bandwidth Matrix (GB/s)\n"
        "   D\\D     0      1      2\n"
        "     0 780.00  19.00  20.00\n"
    )
    matrix = parse_bandwidth_matrix(text)
    assert matrix[0][1] == 10.16 and matrix[2][1] == 11.18 and len(matrix) == 3


@pytest.mark.parametrize("name", ["minsky-p100", "dgx1-v100", "summit-node", "torus-2d-16"])
def test_the_cheapest_set_is_found_exactly(name: str) -> None:
    """t_min(k) of DRB's Eq. 2 on the paper's scale: the search equals brute force."""
    import itertools

    from gpualloc.placement.sets.search import cheapest_communication
    from gpualloc.placement.sets.utility import physical_distances

    distance = physical_distances(HostGraph.from_topology(load_bundled(name)))
    n = len(distance)
    for k in range(2, n + 1) if n <= 8 else (2, 3, 5, 8, 11):
        brute = min(
            sum(distance[a][b] for i, a in enumerate(chosen) for b in chosen[i + 1 :])
            for chosen in itertools.combinations(range(n), k)
        )
        assert cheapest_communication(distance, k) == pytest.approx(brute), k


def test_drb_utility_is_on_the_papers_scale() -> None:
    """On the DRB paper's Minsky (seed 000, section 5.2.2): the last two GPUs across the sockets
    score below Table 1's 0.5 for 2-GPU jobs; an NVLinked pair with a socket left half free
    scores above it; a 1-GPU job goes to the socket without another job (interference)."""
    from gpualloc.model.request import RunningJob
    from gpualloc.placement.sets.utility import UtilityModel

    host = HostGraph.from_topology(load_bundled("minsky-p100"))
    running = (RunningJob(frozenset({1}), True), RunningJob(frozenset({2}), True))
    full = UtilityModel(host, HostState(free=frozenset({0, 3}), running=running), True)
    assert full.parts([0, 3]).utility == pytest.approx(0.30, abs=0.01)
    roomy = UtilityModel(host, HostState(free=frozenset({0, 2, 3}), running=running[:1]), True)
    assert roomy.parts([2, 3]).utility == pytest.approx(0.75)
    alone = UtilityModel(host, HostState(free=frozenset({1, 2, 3}), running=(running[0],)), True)
    assert alone.parts([2]).utility > alone.parts([3]).utility - 1e-9
    busy = UtilityModel(
        host,
        HostState(free=frozenset({1, 2, 3}), running=(RunningJob(frozenset({0}), True),)),
        True,
    )
    assert busy.parts([2]).utility > busy.parts([1]).utility
