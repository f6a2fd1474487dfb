"""The launcher's pure parts: environment, NUMA binding, command resolution, occupancy, choice."""

from __future__ import annotations

import os
import shlex
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from msgspec.structs import replace

from gpualloc.errors import (
    CommandNotExecutable,
    CommandNotFound,
    ExitCode,
    GpusBusy,
    NoFeasiblePlacement,
    RequestError,
)
from gpualloc.launcher.binding import Binding, HostNuma, NumaMode, plan_binding
from gpualloc.launcher.command import job_argv, resolve_program
from gpualloc.launcher.environment import gpu_variables, job_environment, shell_exports
from gpualloc.ledger.occupancy import Occupancy
from gpualloc.ledger.schema import Lease, LeasedGpu, Ledger
from gpualloc.ledger.scope import ledger_scope
from gpualloc.model import Gpu, GpuProcess, Health
from gpualloc.model.request import JobRequest
from gpualloc.placement.choose import choose
from gpualloc.placement.decide import plan
from gpualloc.placement.mapa.patterns import build_pattern
from gpualloc.placement.want import Want
from gpualloc.topologies import load_bundled

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)


def _lease(lease_id: str, *gpus: int, sensitive: bool | None = True, user: str = "alice") -> Lease:
    return Lease(
        id=lease_id,
        gpus=tuple(LeasedGpu(index=g) for g in gpus),
        uid=1000,
        user=user,
        pid=4242,
        command=("python", "train.py"),
        sensitive=sensitive,
        created=NOW - timedelta(hours=2, minutes=5),
        source="run",
    )


def _want(k: int, *, sensitive: bool | None = None, **fields: object) -> Want:
    request = JobRequest(
        gpus=k,
        pattern=build_pattern("ring", k),
        sensitive=k >= 2 if sensitive is None else sensitive,
        required=frozenset(fields.pop("required", ())),  # type: ignore[arg-type]
    )
    return Want(request=request, **fields)  # type: ignore[arg-type]


# ---- environment ------------------------------------------------------------------------------


def test_gpu_variables_keep_the_rank_order_and_name_the_lease() -> None:
    gpus = [Gpu(index=3, uuid="GPU-c"), Gpu(index=1, uuid="GPU-a")]
    assert gpu_variables(gpus, lease_id="0123456789ab") == {
        "CUDA_VISIBLE_DEVICES": "3,1",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "GPUALLOC_LEASE_ID": "0123456789ab",
        "GPUALLOC_GPUS": "3,1",
    }
    by_uuid = gpu_variables(gpus, use_uuid=True)
    assert by_uuid["CUDA_VISIBLE_DEVICES"] == "GPU-c,GPU-a"
    assert by_uuid["GPUALLOC_GPUS"] == "3,1"
    assert "GPUALLOC_LEASE_ID" not in by_uuid


def test_uuid_export_refuses_a_gpu_without_uuid() -> None:
    with pytest.raises(RequestError, match="GPU 2 has no UUID"):
        gpu_variables([Gpu(index=2)], use_uuid=True)


def test_job_environment_passes_everything_else_unchanged() -> None:
    base = {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "7", "HOME": "/h"}
    env = job_environment(base, {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert env == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1", "HOME": "/h"}
    assert base["CUDA_VISIBLE_DEVICES"] == "7"  # the caller's mapping is not modified


def test_shell_exports_are_safe_to_eval() -> None:
    text = shell_exports({"A": "0,1", "B": "it's $HOME"})
    assert text == "export A=0,1\nexport B='it'\"'\"'s $HOME'\n"
    assert shlex.split(text.splitlines()[1]) == ["export", "B=it's $HOME"]


# ---- NUMA binding -----------------------------------------------------------------------------


def _host(numactl: str | None = "/usr/bin/numactl", **overrides: object) -> HostNuma:
    facts: dict[str, object] = {
        "node_cpus": {0: frozenset(range(4)), 1: frozenset(range(4, 8))},
        "allowed_cpus": frozenset(range(8)),
        "allowed_mems": frozenset({0, 1}),
        "numactl": numactl,
    }
    facts.update(overrides)
    return HostNuma(**facts)  # type: ignore[arg-type]


def test_gpus_on_one_node_bind_cpus_and_memory_to_it() -> None:
    binding = plan_binding([1, 1], NumaMode.AUTO, this_host=True, host=_host())
    assert binding.argv_prefix() == ["numactl", "--cpunodebind=1", "--membind=1", "--"]
    assert binding.cpus == frozenset(range(4, 8))
    assert job_argv(["python", "x.py"], binding)[-3:] == ["--", "python", "x.py"]


def test_gpus_on_two_nodes_bind_to_their_union() -> None:
    binding = plan_binding([1, 0, 1], NumaMode.AUTO, this_host=True, host=_host())
    assert binding.argv_prefix() == ["numactl", "--cpunodebind=0,1", "--membind=0,1", "--"]
    assert binding.cpus == frozenset(range(8))


def test_without_numactl_the_cpu_affinity_is_set_and_memory_is_not_bound() -> None:
    binding = plan_binding([0], NumaMode.AUTO, this_host=True, host=_host(numactl=None))
    assert binding.method == "affinity"
    assert binding.cpus == frozenset(range(4))
    assert not binding.memory_bound
    assert binding.argv_prefix() == []
    assert "memory is not bound" in binding.reason


def test_a_recorded_topology_of_another_host_is_not_bound_but_says_what_it_would_do() -> None:
    binding = plan_binding([0, 0], NumaMode.AUTO, this_host=False, host=None)
    assert binding.method == "none"
    assert binding.argv_prefix() == []
    assert binding.as_if_bound() == ["numactl", "--cpunodebind=0", "--membind=0", "--"]


def test_a_cpuset_narrower_than_the_node_binds_the_allowed_cpus_only() -> None:
    host = _host(allowed_cpus=frozenset({2, 3, 4}), allowed_mems=frozenset({1}))
    binding = plan_binding([0], NumaMode.AUTO, this_host=True, host=host)
    # Slurm or a container gave this process CPUs 2-4 and memory node 1 only: never ask
    # numactl for more (it would refuse and the job would not start).
    assert binding.argv_prefix() == ["numactl", "--physcpubind=2-3", "--"]


@pytest.mark.parametrize(
    ("nodes", "host", "reason"),
    [
        ([0, None], _host(), "unknown"),
        ([5], _host(), "does not exist here"),
        ([1], _host(allowed_cpus=frozenset({0})), "may not use the CPUs"),
    ],
)
def test_no_binding_when_it_cannot_be_right(
    nodes: list[int | None], host: HostNuma, reason: str
) -> None:
    binding = plan_binding(nodes, NumaMode.AUTO, this_host=True, host=host)
    assert binding.method == "none"
    assert reason in binding.reason
    with pytest.raises(RequestError, match="--numa bind"):
        plan_binding(nodes, NumaMode.BIND, this_host=True, host=host)


def test_numa_none_never_binds() -> None:
    assert plan_binding([0], NumaMode.NONE, this_host=True, host=_host()).method == "none"


def test_host_numa_reads_sysfs_nodes(tmp_path: Path) -> None:
    for node, cpus in ((0, "0-1"), (1, "2-3")):
        (tmp_path / f"node{node}").mkdir()
        (tmp_path / f"node{node}" / "cpulist").write_text(cpus + "\n")
    (tmp_path / "possible").write_text("0-1\n")  # not a node directory
    facts = HostNuma.read(tmp_path)
    assert facts.node_cpus == {0: frozenset({0, 1}), 1: frozenset({2, 3})}
    assert facts.allowed_cpus == frozenset(os.sched_getaffinity(0))


def test_binding_descriptions_name_what_is_bound() -> None:
    bound = Binding("numactl", (0,), frozenset({0, 1}), memory_bound=True)
    assert bound.describe() == "CPUs of NUMA node 0 (0-1), memory on node 0"


# ---- command resolution -----------------------------------------------------------------------


def test_programs_resolve_like_a_shell(tmp_path: Path) -> None:
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    plain = tmp_path / "plain"
    plain.write_text("data")
    plain.chmod(0o644)
    env = {"PATH": f"/nonexistent:{tmp_path}"}
    assert resolve_program("tool", env) == str(tool)
    assert resolve_program(str(tool), {}) == str(tool)
    with pytest.raises(CommandNotFound, match="nosuch: command not found"):
        resolve_program("nosuch", env)
    with pytest.raises(CommandNotFound):
        resolve_program(str(tmp_path / "nosuch"), env)
    # Found on PATH but not executable (root too: access(X_OK) wants at least one x bit).
    with pytest.raises(CommandNotExecutable, match="permission denied"):
        resolve_program("plain", env)
    with pytest.raises(CommandNotExecutable, match="is a directory"):
        resolve_program(str(tmp_path), env)


# ---- occupancy --------------------------------------------------------------------------------


@pytest.fixture
def dgx1():
    return load_bundled("dgx1-v100")


def test_occupancy_tells_leases_foreign_processes_and_lost_gpus_apart(dgx1) -> None:
    ledger = Ledger(host="h", leases=[_lease("aaaaaaaaaaaa", 0, 3)])
    processes = [
        GpuProcess(gpu=0, pid=11, name="python", user="alice"),  # the lease's own job
        GpuProcess(gpu=5, pid=12, name="python", user="bob"),  # nobody asked gpualloc
    ]
    lost = replace(
        dgx1, gpus=[g if g.index != 7 else replace(g, health=Health.LOST) for g in dgx1.gpus]
    )
    occupancy = Occupancy.build(lost, ledger, processes)
    assert [occupancy.state(g) for g in range(8)] == [
        "held", "free", "free", "held", "free", "foreign", "free", "lost",
    ]  # fmt: skip
    assert occupancy.free == frozenset({1, 2, 4, 6})
    state = occupancy.host_state()
    assert state.free == occupancy.free
    assert {(job.gpus, job.sensitive) for job in state.running} == {
        (frozenset({0, 3}), True),
        (frozenset({5}), None),
        (frozenset({7}), None),
    }
    lines = occupancy.describe([0, 3, 5], now=NOW)
    assert lines == [
        "GPU 0,3 held by alice for 2h 5m, lease aaaaaaaaaaaa, pid 4242: python train.py",
        "GPU 5 runs pid 12 (python, bob), not through gpualloc",
    ]
    ignoring = Occupancy.build(lost, ledger, processes, ignore_foreign=True)
    assert ignoring.state(5) == "free"


def test_choose_says_busy_when_the_job_would_fit_an_idle_host(dgx1) -> None:
    ledger = Ledger(host="h", leases=[_lease("aaaaaaaaaaaa", *range(7))])
    occupancy = Occupancy.build(dgx1, ledger)
    with pytest.raises(GpusBusy) as busy:
        choose(dgx1, occupancy, _want(2))
    assert "needs 2 GPUs and 1 usable one is free now: GPU 7" in busy.value.message
    assert busy.value.details[0].startswith("GPU 0-6 held by alice")
    with pytest.raises(NoFeasiblePlacement):  # 9 GPUs never fit an 8-GPU host: not "busy"
        choose(dgx1, occupancy, _want(9))


def test_choose_matches_plan_on_the_free_gpus(dgx1) -> None:
    ledger = Ledger(host="h", leases=[_lease("aaaaaaaaaaaa", 0)])
    occupancy = Occupancy.build(dgx1, ledger)
    chosen = choose(dgx1, occupancy, _want(3))
    expected = plan(dgx1, _want(3).request, occupancy.host_state())
    assert chosen.gpus == expected.gpus
    assert 0 not in chosen.gpus


def test_explicit_gpus_are_taken_in_the_order_given_or_refused_with_the_holder(dgx1) -> None:
    ledger = Ledger(host="h", leases=[_lease("aaaaaaaaaaaa", 2)])
    occupancy = Occupancy.build(dgx1, ledger)
    placement = choose(dgx1, occupancy, _want(2, explicit=(5, 1)))
    assert placement.gpus == (5, 1)
    assert placement.policy == "explicit"
    with pytest.raises(GpusBusy, match="GPU 2 of --gpus 1,2 is not free") as busy:
        choose(dgx1, occupancy, _want(2, explicit=(1, 2)))
    assert "held by alice" in busy.value.details[0]
    with pytest.raises(RequestError, match="GPU 9 does not exist"):
        choose(dgx1, occupancy, _want(1, explicit=(9,)))


def test_a_busy_required_gpu_names_its_holder(dgx1) -> None:
    ledger = Ledger(host="h", leases=[_lease("aaaaaaaaaaaa", 4)])
    with pytest.raises(GpusBusy, match="required GPU 4 is not free") as busy:
        choose(dgx1, Occupancy.build(dgx1, ledger), _want(2, required=(4,)))
    assert busy.value.details == (
        "GPU 4 held by alice for " + busy.value.details[0].split(" for ")[1],
    )


# ---- which ledger -----------------------------------------------------------------------------


def test_only_this_hosts_topology_uses_the_host_ledger(dgx1) -> None:
    import socket

    scope = ledger_scope(dgx1)
    assert scope is not None and scope.startswith("dgx1-v100-")
    assert ledger_scope(load_bundled("dgx1-v100")) == scope  # stable across loads
    assert ledger_scope(load_bundled("dgx1-p100")) != scope
    here = replace(
        dgx1, provenance=replace(dgx1.provenance, source="nvml", hostname=socket.gethostname())
    )
    assert ledger_scope(here) is None
    elsewhere = replace(here, provenance=replace(here.provenance, hostname="other-host"))
    assert ledger_scope(elsewhere) is not None


def test_cuda_visible_devices_holds_cuda_numbers_in_bus_order() -> None:
    """NVML's enumeration is not bus order on every host (NVIDIA's mock L40S profile:
    17:00, 31:00, B1:00, CA:00, 18:00, ...); CUDA_DEVICE_ORDER=PCI_BUS_ID numbers by bus id,
    so the leased GPUs are exported as their places in bus order."""
    from gpualloc.launcher.environment import job_variables
    from gpualloc.topologies import load_bundled

    bundled = load_bundled("pcie-8gpu-2socket")
    buses = ["17", "31", "B1", "CA", "18", "32", "B2", "CB"]
    topology = replace(
        bundled,
        gpus=[
            replace(g, pci_bus_id=f"00000000:{b}:00.0")
            for g, b in zip(bundled.gpus, buses, strict=True)
        ],
    )
    assert topology.cuda_ordinals() == {0: 0, 4: 1, 1: 2, 5: 3, 2: 4, 6: 5, 3: 6, 7: 7}
    variables = job_variables(topology, [0, 1], [], lease_id=None, uuid=False)
    assert variables["CUDA_VISIBLE_DEVICES"] == "0,2" and variables["GPUALLOC_GPUS"] == "0,1"
    unknown = replace(
        topology, gpus=[replace(topology.gpus[0], pci_bus_id=None), *topology.gpus[1:]]
    )
    assert unknown.cuda_ordinals() == {g: g for g in range(8)}, "no bus ids: NVML's indices"


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (("-n", "9"), "hint: ask for at most 8 GPUs (-n)\n"),
        (("-n", "8", "--exclude", "0"), "hint: ask for at most 7 GPUs (-n), or exclude fewer"),
    ],
)
def test_a_job_that_can_never_fit_is_not_told_to_wait(cli, args: tuple, hint: str) -> None:
    """Exit 9's hint said "or wait until more are free" of a job larger than the host."""
    result = cli("--topology", "dgx1-v100", "plan", *args)
    assert result.exit_code == ExitCode.NO_PLACEMENT
    assert hint in result.stderr and "wait" not in result.stderr
