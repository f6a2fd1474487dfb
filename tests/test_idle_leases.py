"""Idle holders: how long a lease's GPUs have been idle, ``status --idle``,
and idle ``--hold`` leases given notice and released by ``gc`` under the system's
``idle.expire_holds``; on a recorded topology that declares its GPUs' utilisation."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from msgspec.structs import replace

from gpualloc.discovery.recorded import load_topology_file
from gpualloc.host.local import LocalHost
from gpualloc.ledger.idle import IdlePolicy, idle_for, judge, lease_busy, observe
from gpualloc.ledger.schema import Lease, LeaseActivity, LeasedGpu
from gpualloc.topologies import load_bundled
from tests.cli_harness import in_subprocess, run_in_process
from tests.metrics_text import samples, value

T0 = datetime(2026, 11, 25, 8, 0, tzinfo=timezone.utc)
MINUTE = timedelta(minutes=1)
POLICY = IdlePolicy(max_gap_s=15 * 60, expire_holds_s=4 * 3600, notice_s=30 * 60)


def held(**terms) -> Lease:
    return Lease(
        id="a" * 12,
        gpus=(LeasedGpu(index=0), LeasedGpu(index=1)),
        uid=1000,
        user="alice",
        hold=True,
        created=T0,
        source="alloc",
        **terms,
    )


def look(lease: Lease, busy: bool | None, at: datetime) -> Lease:
    return replace(lease, activity=observe(lease, busy, at, POLICY))


def test_an_idle_stretch_lasts_while_looks_are_close_and_idle() -> None:
    lease = look(held(), False, T0 + 10 * MINUTE)  # first look, soon after it was made
    assert lease.activity.idle_since == T0
    for minutes in (20, 30, 40):
        lease = look(lease, False, T0 + minutes * MINUTE)
    assert idle_for(lease.activity, T0 + 40 * MINUTE) == 40 * MINUTE
    assert look(lease, None, T0 + 41 * MINUTE).activity == lease.activity  # no figure: no news
    gap = look(lease, False, T0 + 60 * MINUTE)  # 20 minutes unseen: a new stretch
    assert gap.activity.idle_since == T0 + 60 * MINUTE
    busy = look(lease, True, T0 + 45 * MINUTE)
    assert busy.activity.idle_since is None and idle_for(busy.activity, T0 + 45 * MINUTE) is None
    assert look(busy, False, T0 + 50 * MINUTE).activity.idle_since == T0 + 50 * MINUTE
    late = look(held(), False, T0 + 3 * 60 * MINUTE)  # first look hours after: idle from now
    assert late.activity.idle_since == T0 + 3 * 60 * MINUTE


def test_busy_means_a_kernel_ran_not_memory_held() -> None:
    lease = held()
    assert lease_busy(lease, {0: 0, 1: 4}, 5) is False
    assert lease_busy(lease, {0: 0, 1: 5}, 5) is True
    assert lease_busy(lease, {2: 90}, 5) is None  # no figure for its GPUs


def test_a_hold_is_given_notice_then_released_unless_used() -> None:
    idle_since = T0
    lease = held(activity=LeaseActivity(observed_at=T0, idle_since=idle_since))
    at = T0 + timedelta(hours=3, minutes=20)
    activity, expiry = judge(lease, replace(lease.activity, observed_at=at), at, POLICY)
    assert expiry is None  # 3h20m idle: before the notice
    at = T0 + timedelta(hours=3, minutes=50)
    activity, expiry = judge(lease, replace(lease.activity, observed_at=at), at, POLICY)
    assert expiry.event == "notice" and expiry.idle == timedelta(hours=3, minutes=50)
    assert activity.expires_at == at + timedelta(minutes=30)  # the whole notice, not 10 min
    noticed = replace(lease, activity=activity)
    later = at + timedelta(minutes=29)
    assert judge(noticed, activity, later, POLICY) == (activity, None)
    gone = at + timedelta(minutes=30)
    assert judge(noticed, activity, gone, POLICY)[1].event == "expired"
    used = observe(noticed, True, later, POLICY)
    assert used.expires_at is None and judge(noticed, used, gone, POLICY) == (used, None)
    run_lease = replace(noticed, hold=False, pid=4242)
    assert judge(run_lease, activity, gone, POLICY)[1] is None  # only --hold leases expire


# ---- on a recorded topology, through the command line ----------------------------------------


@pytest.fixture
def host_file(tmp_path: Path) -> Path:
    data = json.loads(load_bundled("nvlink-pairs-4gpu").to_json())
    data["utilization"] = [{"gpu": g, "percent": 0} for g in range(4)]
    data["utilization"][2]["percent"] = 87
    path = tmp_path / "host.json"
    path.write_text(json.dumps(data))
    return path


def backdate(host_file: Path, lease_id: str, **activity: datetime | None) -> None:
    """Set the lease's recorded activity, as looks by 'gc' over the past hours would have."""
    host = LocalHost.open(load_topology_file(host_file))
    with host.transaction() as txn:
        lease = txn.ledger.find(lease_id)
        txn.replace(replace(lease, activity=LeaseActivity(**activity)))


def notice_ran_out(host_file: Path, lease_id: str) -> None:
    """The lease idle for 5 hours, its notice run out a minute ago."""
    now = datetime.now(timezone.utc)
    backdate(
        host_file,
        lease_id,
        observed_at=now - MINUTE,
        idle_since=now - timedelta(hours=5),
        expires_at=now - MINUTE,
    )


def system_config(tmp_path: Path, text: str) -> None:
    """The host's system configuration file (GPUALLOC_SYSTEM_CONFIG, set by conftest)."""
    system = tmp_path / "etc" / "config.toml"
    system.parent.mkdir(parents=True, exist_ok=True)
    system.write_text(text)


def hold(cli, host_file: Path, gpus: str) -> str:
    result = cli(
        "--topology", str(host_file), "alloc", "--gpus", gpus, "--hold", "--format", "json"
    )
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)["lease"]["id"]


def test_status_shows_use_and_idle_time_and_lists_idle_leases(cli, host_file: Path) -> None:
    idle = hold(cli, host_file, "0,1")
    busy = hold(cli, host_file, "2")
    now = datetime.now(timezone.utc)
    backdate(host_file, idle, observed_at=now - 5 * MINUTE, idle_since=now - timedelta(hours=3))
    table = cli("--topology", str(host_file), "status").stdout
    assert "Use" in table and "Idle" in table and "87%" in table
    assert "3h 0m" in table and "busy" in table
    listed = cli("--topology", str(host_file), "status", "--idle", "2h")
    assert "1 lease idle for 2h 0m or longer" in listed.stdout
    assert idle in listed.stdout and busy not in listed.stdout
    data = json.loads(cli("--topology", str(host_file), "status", "--json", "--idle", "2h").stdout)
    (lease,) = data["leases"]
    assert lease["id"] == idle and lease["busy"] is False
    assert 3 * 3600 <= lease["idle_seconds"] < 3 * 3600 + 120
    assert data["gpus"][2]["utilization_percent"] == 87
    everyone = json.loads(cli("--topology", str(host_file), "status", "--json").stdout)
    assert {x["id"]: x["idle_seconds"] for x in everyone["leases"]}[busy] is None
    bad = cli("--topology", str(host_file), "status", "--idle", "soon")
    assert bad.exit_code == 2 and "--idle 'soon' is not a duration" in bad.stderr


def test_status_idle_with_no_match_says_so_without_an_empty_table(cli) -> None:
    """It printed the GPU table's header with no row, and on a MIG host put the count of free
    MIG devices on the idle line."""
    listed = cli("--topology", "dgx-a100-mig", "status", "--idle", "5m")
    assert listed.exit_code == 0, listed.stderr
    first, summary = listed.stdout.splitlines()[:2]
    assert first == "no lease idle for 5m or longer"
    assert summary.startswith("5 of 8 GPUs free;") and summary.endswith("12 of 12 MIG devices free")
    assert "GPU  State" not in listed.stdout


def test_gc_gives_an_idle_hold_notice_then_releases_it(
    cli, host_file: Path, tmp_path: Path
) -> None:
    told = tmp_path / "told"
    system_config(
        tmp_path,
        '[idle]\nexpire_holds = "4h"\nnotice = "30m"\n'
        f'notify = "echo $GPUALLOC_EVENT $GPUALLOC_LEASE_ID $GPUALLOC_USER '
        f'$GPUALLOC_GPUS >> {told}"\n',
    )
    lease_id = hold(cli, host_file, "0,1")
    now = datetime.now(timezone.utc)
    backdate(host_file, lease_id, observed_at=now - MINUTE, idle_since=now - timedelta(hours=3.9))
    gc = cli("--topology", str(host_file), "gc")
    assert gc.exit_code == 0, gc.stderr
    assert "notice: GPU 0-1 held by" in gc.stdout and "unless its GPUs are used" in gc.stdout
    user = json.loads(cli("--topology", str(host_file), "status", "--json").stdout)["leases"][0]
    assert user["activity"]["expires_at"] is not None
    assert f"NOTICE: lease {lease_id}" in cli("--topology", str(host_file), "status").stdout
    expires = datetime.fromisoformat(user["activity"]["expires_at"])
    assert expires - now >= timedelta(minutes=29)  # the whole notice
    notice_ran_out(host_file, lease_id)
    gone = cli("--topology", str(host_file), "gc", "--json")
    (event,) = json.loads(gone.stdout)["idle"]
    assert event["event"] == "expired" and event["lease"]["id"] == lease_id
    assert json.loads(cli("--topology", str(host_file), "status", "--json").stdout)["leases"] == []
    user_name = event["lease"]["user"]
    assert told.read_text().splitlines() == [
        f"notice {lease_id} {user_name} GPU 0-1",
        f"expired {lease_id} {user_name} GPU 0-1",
    ]


def test_using_the_gpus_withdraws_the_notice(cli, host_file: Path, tmp_path: Path) -> None:
    system_config(tmp_path, '[idle]\nexpire_holds = "4h"\n')
    lease_id = hold(cli, host_file, "2")  # GPU 2 runs at 87%
    notice_ran_out(host_file, lease_id)
    assert "nothing to collect" in cli("--topology", str(host_file), "gc").stdout
    (lease,) = json.loads(cli("--topology", str(host_file), "status", "--json").stdout)["leases"]
    assert lease["activity"]["expires_at"] is None and lease["activity"]["idle_since"] is None


def test_metrics_give_utilisation_idle_time_and_mismatches(cli, host_file: Path) -> None:
    idle = hold(cli, host_file, "0,1")
    busy = hold(cli, host_file, "2")
    now = datetime.now(timezone.utc)
    backdate(host_file, idle, observed_at=now - 5 * MINUTE, idle_since=now - timedelta(hours=3))
    data = json.loads(host_file.read_text())
    data["processes"] = [{"gpu": 0, "pid": 1, "name": "init", "user": "eve"}]
    host_file.write_text(json.dumps(data))
    found = samples(cli("--topology", str(host_file), "metrics").stdout)
    user = json.loads(cli("--topology", str(host_file), "status", "--json").stdout)["leases"][0]
    assert value(found, "gpualloc_gpu_utilization_percent", gpu="2") == 87
    assert value(found, "gpualloc_lease_idle_seconds", lease=idle, user=user["user"]) >= 3 * 3600
    assert value(found, "gpualloc_lease_idle_seconds", lease=busy, user=user["user"]) == 0
    assert value(found, "gpualloc_lease_mismatches", kind="intruder") == 1  # eve on GPU 0
    assert value(found, "gpualloc_lease_mismatches", kind="misplaced") == 0


def test_a_hold_is_never_released_on_a_look_that_saw_nothing(
    cli, host_file: Path, tmp_path: Path
) -> None:
    """Its notice ran out, but the GPUs' utilisation cannot be read now (NVML gone, or a MIG
    lease): gc neither releases it nor changes what it recorded."""
    system_config(tmp_path, '[idle]\nexpire_holds = "4h"\n')
    lease_id = hold(cli, host_file, "0,1")
    notice_ran_out(host_file, lease_id)
    data = json.loads(host_file.read_text())
    data["utilization"] = []
    host_file.write_text(json.dumps(data))
    before = json.loads(cli("--topology", str(host_file), "status", "--json").stdout)["leases"]
    assert "nothing to collect" in cli("--topology", str(host_file), "gc").stdout
    after = json.loads(cli("--topology", str(host_file), "status", "--json").stdout)["leases"]
    assert [x["activity"] for x in after] == [x["activity"] for x in before]
    assert after[0]["busy"] is None and after[0]["idle_seconds"] is not None


def test_nvml_gives_utilisation_with_memory_and_skips_what_a_gpu_cannot_say(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpualloc.discovery import nvml as nvml_source
    from gpualloc.discovery.live import live_processes
    from tests.fake_nvml import FakeNvml

    topology = load_bundled("dgx1-v100")
    fake = FakeNvml.from_topology(topology)
    fake.gpus[3].utilization = 87
    fake.gpus[5].unsupported.add("nvmlDeviceGetUtilizationRates")  # as a GPU in MIG mode
    monkeypatch.setattr(nvml_source, "load_pynvml", lambda: fake)
    report = live_processes(topology)
    assert report.utilization[3] == 87 and report.utilization[0] == 0
    assert 5 not in report.utilization and 5 in report.memory_used
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 8  # once per GPU, one pass


# ---- a hung idle.notify ------------------------------------------------------------------------


@pytest.mark.parametrize("notify", ["sleep 60", "sleep 60 & exit 0"])
def test_gc_kills_an_idle_notify_that_hangs(tmp_path: Path, notify: str) -> None:
    import time

    data = json.loads(load_bundled("nvlink-pairs-4gpu").to_json())
    data["utilization"] = [{"gpu": g, "percent": 0} for g in range(4)]
    host_file = tmp_path / "host.json"
    host_file.write_text(json.dumps(data))
    system_config(tmp_path, f'[idle]\nexpire_holds = "4h"\nnotify = "{notify}"\n')
    lease_id = hold(lambda *args: run_in_process(args), host_file, "0,1")
    notice_ran_out(host_file, lease_id)
    started = time.monotonic()
    result = in_subprocess("--topology", str(host_file), "gc", timeout=25)
    assert time.monotonic() - started < 15
    assert result.exit_code == 0, result.stderr
    assert result.stderr == (
        f"gpualloc: warning: idle.notify for lease {lease_id} ran longer than 5s: killed it\n"
    )
    assert f"lease {lease_id}" in result.stdout and "its notice ran out" in result.stdout
