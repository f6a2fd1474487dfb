"""One request cannot buy unbounded placement work.

On b2653dd a 32-GPU host made ``plan -n 10 --policy drb|besteffort|spread`` run for minutes
(C(32, 10) = 64 million sets), and ``run`` did it holding the ledger's lock; DRB's t_min alone
took 7 s for 22 GPUs. Now every search runs under ``placement.time_budget`` (the broker's
``broker.placement_budget``), a search cut short answers greedily and says so, t_min is bounded
by a count (so scores stay deterministic), and a slow request costs its own user's budget.

DRB, pack and spread now answer that PCIe host exactly within milliseconds (twins,
branch and bound); the searches that must run past a budget here are on a 32-GPU host known
only by a measured bandwidth matrix (a class per pair: every order search falls back on plain
branch and bound over orders). The broker's worker, which runs these searches off its loop, is
``tests/test_placement_worker.py``'s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from gpualloc.broker.limits import BUSY_TOKEN_S, FREE_BUSY_S, Limits
from gpualloc.ledger.occupancy import Occupancy
from gpualloc.ledger.schema import Ledger
from gpualloc.model import Topology
from gpualloc.model.request import HostState, JobRequest
from gpualloc.placement import deadline
from gpualloc.placement.choose import choose
from gpualloc.placement.decide import decision_context, place
from gpualloc.placement.mapa.patterns import build_pattern
from gpualloc.placement.policies.registry import get_policy, policy_names
from gpualloc.placement.sets.search import T_MIN_NODES, cheapest_communication
from gpualloc.placement.want import Want
from gpualloc.topologies import load_bundled
from tests.placement_hosts import measured_32

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def host32() -> Topology:
    """Two sockets of 16 GPUs, four GPUs a PCIe switch: searches on it ran for minutes."""
    return load_bundled("pcie-32gpu-2socket")


@pytest.fixture(scope="module")
def host32_file(tmp_path_factory: pytest.TempPathFactory, host32: Topology) -> Path:
    path = tmp_path_factory.mktemp("host32") / "pcie-32gpu-2socket.json"
    path.write_bytes(msgspec.json.encode(host32))
    return path


@pytest.fixture(scope="module")
def slow_host() -> Topology:
    return measured_32()


@pytest.fixture(scope="module")
def slow_host_file(tmp_path_factory: pytest.TempPathFactory, slow_host: Topology) -> Path:
    path = tmp_path_factory.mktemp("slow") / "measured-32.json"
    path.write_bytes(msgspec.json.encode(slow_host))
    return path


@pytest.mark.parametrize("policy", [p for p in policy_names() if p not in ("slurm", "baseline")])
def test_a_search_past_its_budget_answers_greedily_and_says_so(
    host32: Topology, policy: str
) -> None:
    busy = frozenset({0, 5, 17})
    request = JobRequest(
        10, build_pattern("ring", 10), True, required=frozenset({3}), excluded=frozenset({4})
    )
    state = HostState.with_busy(32, busy)
    ctx = decision_context(host32, request, state)
    started = time.monotonic()
    placement = place(get_policy(policy), ctx, budget_s=0.1)
    took = time.monotonic() - started
    assert took < 10, f"{policy} took {took:.1f} s under a 0.1 s budget"  # minutes on b2653dd
    gpus = placement.gpus
    assert len(set(gpus)) == 10 and 3 in gpus and 4 not in gpus and not busy & set(gpus)
    if placement.cut_short:  # a greedy answer, said
        assert "budget (placement.time_budget)" in placement.cut_short
        assert "greedy" in placement.cut_short


def test_searches_past_their_budget_on_32_gpus_are_cut_short(
    host32: Topology, slow_host: Topology
) -> None:
    occupancy = Occupancy.build(slow_host, Ledger(host="test"), ())
    # besteffort's search of 10 of these 32 GPUs is short since its partitions are searched
    # by twin class (it took seconds), its score tables a little more: a tenth of a
    # millisecond leaves it cut short on a machine several times faster than CI's too
    for policy, budget_s in (
        ("mapa-greedy", 0.05),
        ("drb", 0.05),
        ("spread", 0.05),
        ("besteffort", 0.0001),
    ):
        want = Want(JobRequest(10, build_pattern("ring", 10), True), policy=policy)
        placement = choose(slow_host, occupancy, want, budget_s=budget_s)
        assert placement.cut_short, f"{policy} ordered 10 of 32 GPUs in {budget_s * 1000:g} ms?"
    occupancy = Occupancy.build(host32, Ledger(host="test"), ())
    for policy in ("drb", "spread", "pack"):
        want = Want(JobRequest(10, build_pattern("ring", 10), True), policy=policy)
        placement = choose(host32, occupancy, want, budget_s=0.05)
        assert not placement.cut_short, f"{policy} is exact on the PCIe host (twins)"
    spread = choose(
        host32, occupancy, Want(JobRequest(4, build_pattern("ring", 4), True), policy="spread"),
        budget_s=0.05,
    )  # fmt: skip
    assert {host32.gpu(g).numa_node for g in spread.gpus} == {0, 1}, "spread spreads"


def test_within_budget_the_answer_is_the_exact_one() -> None:
    """The budget changes nothing where the search finishes: every policy on dgx1-v100."""
    topology = load_bundled("dgx1-v100")
    occupancy = Occupancy.build(topology, Ledger(host="test"), ())
    for policy in policy_names():
        for k in (1, 3, 5, 8):
            want = Want(JobRequest(k, build_pattern("ring", k), True), policy=policy)
            exact = choose(topology, occupancy, want)
            budgeted = choose(topology, occupancy, want, budget_s=1.0)
            assert budgeted == exact and not budgeted.cut_short


def test_the_deadline_is_per_decision_and_unlimited_outside_one() -> None:
    assert not deadline.current().limited
    with pytest.raises(deadline.OverBudget), deadline.within(0.0):
        for _ in range(10 * deadline.CHECK_EVERY):
            time.sleep(0)
            deadline.current().tick()
    assert not deadline.current().limited, "the budget ends with its block"


def test_t_min_is_bounded_by_a_count_and_exact_on_every_bundled_host(host32: Topology) -> None:
    """DRB's t_min (the cheapest set of k GPUs) took 7 s for 22 of 32 GPUs; it stops after
    T_MIN_NODES sets, a count, so the same host gives the same scores everywhere."""
    distance = decision_context(
        host32, JobRequest(1, build_pattern("ring", 1), True)
    ).utility_model.distance
    started = time.monotonic()
    first = cheapest_communication(distance, 22)
    assert time.monotonic() - started < 5
    cheapest_communication.cache_clear()
    assert cheapest_communication(distance, 22) == first
    torus = load_bundled("torus-2d-16")
    d16 = decision_context(
        torus, JobRequest(1, build_pattern("ring", 1), True)
    ).utility_model.distance
    import itertools

    for k in (3, 5):  # brute force agrees where the bound is not reached
        brute = min(
            sum(d16[a][b] for a, b in itertools.combinations(s, 2))
            for s in itertools.combinations(range(16), k)
        )
        assert cheapest_communication(d16, k) == pytest.approx(brute)
    assert T_MIN_NODES > 636  # torus-2d-16, the bundled host that needs the most


def test_plan_on_a_32_gpu_host_answers_within_its_budget(slow_host_file: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUALLOC_")}
    env |= {"PYTHONPATH": str(ROOT), "GPUALLOC_PLACEMENT_BUDGET": "0.2"}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "gpualloc", "--topology", str(slow_host_file), "plan", "-n", "16",
         "--policy", "mapa-greedy", "--json"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 30
    assert "ran past its 0.2 s budget (placement.time_budget)" in result.stderr
    data = json.loads(result.stdout)
    assert len(data["gpus"]) == 16 and "greedy" in data["cut_short"]


def test_a_slow_request_costs_its_own_user() -> None:
    limits = Limits(max_connections=64, max_requests_per_s=5000)
    limits.charge_time(1000, FREE_BUSY_S)  # a request within its fixed cost: nothing more
    assert limits.take(1000, 10_000)  # the whole burst is still there
    other = Limits(max_connections=64, max_requests_per_s=5000)
    other.charge_time(1000, FREE_BUSY_S + 0.075)  # a placement that ran to the broker's budget
    assert not other.take(1000, 10_000 - 0.075 / BUSY_TOKEN_S + 1)
    assert other.take(1001, 10_000), "another user's budget is their own"
    other.charge_time(0, 100.0)
    assert other.take(0, 1e9), "root is never limited"
