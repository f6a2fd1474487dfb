"""The tie rule of gpualloc's own policies (:mod:`gpualloc.placement.ties`), as users meet it.

On NVSwitch boards every pair of GPUs has the same bandwidth, so every objective ties across
sockets, and the lowest indices alone used to decide: with GPUs 1-3 of an HGX H100 held, a
2-GPU job got 0 and 4 (one on each socket) although 4-7 shared one. These tests hold real
leases in the ledger and ask ``plan`` and ``run --dry-run`` through the command line, on the
bundled HGX H100, a recorded HGX H200 and NVIDIA's mock NVML. The rule's exactness against a
brute force over every set is ``tests/test_placement_optimality.py``'s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpualloc.model.request import HostState, JobRequest
from gpualloc.placement.decide import decision_context
from gpualloc.placement.mapa.patterns import build_pattern
from gpualloc.placement.policies.registry import get_policy
from gpualloc.placement.ties import decided_by, tie_key
from gpualloc.topologies import load_bundled

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "tests" / "fixtures" / "topologies" / "hgx-h200_10nic_topo.txt"
MOCK = ROOT.parent / "shared" / "nvml-mock"
OWN_POLICIES = ["mapa", "mapa-greedy", "drb", "pack"]
"""gpualloc's policies that keep a job on one socket when they can (spread spreads, and
besteffort, slurm and baseline reproduce their tools)."""


def _hold(cli, topology: str, *gpus: int) -> None:
    for gpu in gpus:
        held = cli("--topology", topology, "alloc", "-n", "1", "--gpus", str(gpu), "--hold")
        assert held.exit_code == 0, held.stderr


def _plan(cli, topology: str, *args: str) -> dict:
    result = cli("--topology", topology, "plan", *args, "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("topology", ["hgx-h100", str(H200)], ids=["hgx-h100", "hgx-h200"])
@pytest.mark.parametrize("policy", OWN_POLICIES)
@pytest.mark.parametrize("sensitivity", ["--sensitive", "--insensitive"])
def test_a_job_stays_on_one_socket_of_an_nvswitch_board(
    cli, topology: str, policy: str, sensitivity: str
) -> None:
    _hold(cli, topology, 1, 2, 3)
    data = _plan(cli, topology, "-n", "2", "--policy", policy, sensitivity)
    assert sorted(data["gpus"]) == [4, 5], data
    assert data["basis"] == {"kind": "now", "taken": [1, 2, 3], "held_by": data["basis"]["held_by"]}
    if policy in ("mapa", "mapa-greedy"):  # drb's and pack's objectives see sockets themselves
        assert data["decided_by"].startswith("fewer NUMA nodes (1 against 2"), data
    dry = cli("--topology", topology, "run", "-n", "2", "--policy", policy, sensitivity,
              "--dry-run", "--json", "--", "true")  # fmt: skip
    assert json.loads(dry.stdout)["placement"]["gpus"] == data["gpus"]


@pytest.mark.parametrize("policy", OWN_POLICIES)
def test_four_gpus_take_the_whole_free_socket(cli, policy: str) -> None:
    """With GPU 1 held, 0,2,3,4 was leased rather than 4-7."""
    _hold(cli, "hgx-h100", 1)
    assert sorted(_plan(cli, "hgx-h100", "-n", "4", "--policy", policy)["gpus"]) == [4, 5, 6, 7]


def test_dgx1_p100_ring_of_four_on_one_socket(cli) -> None:
    """GPU 0 busy: MAPA leased 1,2,6,5 (two sockets, four NVLinks) while 4-7 (one socket, six
    NVLinks) was free at the same predicted bandwidth: a tie its lowest indices decided."""
    _hold(cli, "dgx1-p100", 0)
    data = _plan(cli, "dgx1-p100", "-n", "4")
    assert sorted(data["gpus"]) == [4, 5, 6, 7]
    assert data["decided_by"] == "fewer NUMA nodes (1 against 2 for 4 GPUs 1,2,5,6)"


def test_explain_names_what_decided_a_tie(cli) -> None:
    _hold(cli, "hgx-h100", 1, 2, 3)
    text = cli("--topology", "hgx-h100", "plan", "-n", "2", "--explain").stdout
    assert "tie: the objective rates others equal; chosen by fewer NUMA nodes" in text
    # The runner-up (4,6) ties too, on every criterion but the last: it is named.
    assert "runner-up 4,6" in text and "chosen by lower GPU indices (than 2 GPUs 4,6)" in text


def test_tools_reproduced_keep_their_own_tie_break(cli) -> None:
    """slurm and baseline are what those tools pick; the tie rule would make them something
    else (and the evaluation's comparison against them meaningless)."""
    _hold(cli, "hgx-h100", 1, 2, 3)
    for policy in ("slurm", "baseline"):
        data = _plan(cli, "hgx-h100", "-n", "2", "--policy", policy)
        assert data["gpus"] == [0, 4] and data["decided_by"] is None


def test_preserved_bandwidth_decides_between_sockets_of_equal_counts() -> None:
    """dgx1-v100 with GPU 0 busy: the NV2 pairs 1-2 and 2-3 (socket 0) and 4-7, 5-6 (socket
    1) tie; 2-3 leaves the most NVLink bandwidth among the GPUs left free."""
    topology = load_bundled("dgx1-v100")
    request = JobRequest(2, build_pattern("ring", 2), True)
    ctx = decision_context(topology, request, HostState.with_busy(8, frozenset({0})))
    placement = get_policy("mapa").place(ctx)
    assert placement.gpus == (2, 3)
    assert (
        placement.decided_by
        == "more NVLink bandwidth left free (275 against 250 GB/s for 2 GPUs 1,2)"
    )


def test_decided_by_names_the_first_criterion_that_differs() -> None:
    topology = load_bundled("pcie-8gpu-2socket")
    request = JobRequest(2, build_pattern("ring", 2), True)
    ctx = decision_context(topology, request, HostState.all_free(8))
    one_switch, two_switches, two_sockets = (tie_key(ctx, g) for g in ((0, 1), (0, 2), (0, 4)))
    assert decided_by(one_switch, two_sockets).startswith("fewer NUMA nodes (1 against 2")
    assert decided_by(one_switch, one_switch) == "lower GPU indices (than 2 GPUs 0,1)"
    assert two_switches.numa_nodes == 1


mock = pytest.mark.skipif(
    not (MOCK / "libnvidia-ml.so.1").exists(), reason=f"no mock NVML in {MOCK}"
)


def _on_mock(profile: str, home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUALLOC_", "MOCK_NVML"))}
    env |= {
        "LD_LIBRARY_PATH": str(MOCK),
        "MOCK_NVML_CONFIG": str(MOCK / profile),
        "GPUALLOC_CACHE_DIR": str(home / "cache"),
        "GPUALLOC_STATE_DIR": str(home / "state"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(MOCK / "tools" / "pyshim")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "gpualloc", *args],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip


@mock
@pytest.mark.nvml_mock
@pytest.mark.slow
@pytest.mark.parametrize(
    ("profile", "held", "k", "expected"),
    [
        ("h100.yaml", (1, 2, 3), 2, [4, 5]),  # leased 0,4 before
        ("h100.yaml", (1,), 4, [4, 5, 6, 7]),  # leased 0,2,3,4 before
        ("gb200.yaml", (1,), 2, [2, 3]),  # leased 0,2, across two NUMA nodes, before
    ],
)
def test_on_the_mock_nvml_held_gpus_do_not_split_a_job(
    tmp_path: Path, profile: str, held: tuple[int, ...], k: int, expected: list[int]
) -> None:
    for gpu in held:
        result = _on_mock(profile, tmp_path, "alloc", "-n", "1", "--gpus", str(gpu), "--hold")
        assert result.returncode == 0, result.stderr
    result = _on_mock(profile, tmp_path, "run", "-n", str(k), "--dry-run", "--json", "--", "true")
    assert result.returncode == 0, result.stderr
    assert sorted(json.loads(result.stdout)["placement"]["gpus"]) == expected


def test_a_bound_of_a_pair_counts_the_2_gpu_rings_pair_once() -> None:
    """The 2-GPU ring lists its pair twice; its ranks still have one neighbour each (the bound
    indexed a second-widest link that a pair does not have)."""
    from gpualloc.placement.host_graph import HostGraph
    from gpualloc.placement.policies.mapa import slowest_link_bound

    host = HostGraph.from_topology(load_bundled("dgx1-v100"))
    assert slowest_link_bound(host, build_pattern("ring", 2), (0, 3)) == 50.0
    assert slowest_link_bound(host, build_pattern("ring", 3), (0, 1, 3)) == 25.0


def test_a_rule_cut_short_says_so_and_still_ties(monkeypatch) -> None:
    """Where the walk that ranks a region's sets by NVLink left free reaches its step limit
    (thousands of sets on a 16-GPU single-socket mesh can), the placement says so and is still
    one the objective rates best."""
    from gpualloc.placement import ties as rule

    monkeypatch.setattr(rule, "MAX_RANKED_STEPS", 3)
    topology = load_bundled("cube-mesh-16")
    request = JobRequest(8, build_pattern("ring", 8), False)
    ctx = decision_context(topology, request, HostState.with_busy(16, frozenset({2})))
    policy = get_policy("pack")
    placement = policy.place(ctx)
    assert any(note.startswith("tie rule incomplete (NVLink bandwidth left free compared in 3")
               for note in placement.notes), placement.notes  # fmt: skip
    assert policy.set_key(ctx, placement.gpus) == policy.set_key(ctx, policy.search(ctx).gpus)
