"""Fractions of a GPU and sharing over time: shared jobs whose parts of a GPU sum to at most
one, where Fragmentation Gradient Descent puts them (Weng et al., "Beware of Fragmentation:
Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC'23) weighed
by the host's live request mix, and ``simulate --sharing``: time slices and fractions in the
simulator, on bundled topologies.

``--shareable`` leases, ``run --share`` by memory and by count, and eviction are
``test_shared_gpus.py``'s.
"""

from __future__ import annotations

import json
import os

import pytest

from gpualloc.errors import ExitCode, GpusBusy
from gpualloc.ledger.occupancy import Occupancy
from gpualloc.ledger.schema import Ledger
from gpualloc.model.mig import GIB
from gpualloc.model.share import LeasedShare, ShareRequest
from gpualloc.placement.sharing.fit import choose_share
from gpualloc.topologies import load_bundled
from tests.leases import lease_on

V100 = ("--topology", "dgx1-v100")


# ---- simulate --sharing ------------------------------------------------------------------------


def _simulated(topology: str, jobs: list, **options) -> dict[str, tuple[float, float, bool]]:
    from gpualloc.simulate.engine import SimOptions, simulate

    result = simulate(load_bundled(topology), jobs, SimOptions(runtime="fixed", **options))
    return {r.job.id: (round(r.start_s, 6), round(r.end_s, 6), r.shared) for r in result.jobs}


def test_simulated_sharing_trades_time_slices_for_an_earlier_start() -> None:
    from gpualloc.simulate.trace import SimJob

    jobs = [SimJob("big", 0.0, 4, 100.0, True), SimJob("small", 0.0, 1, 50.0, False)]
    # Whole GPUs: the small job waits for the big one.
    assert _simulated("nvlink-pairs-4gpu", jobs) == {
        "big": (0, 100, False),
        "small": (100, 150, False),
    }
    # Compute-bound (U = 1): side by side at half pace; the big job finishes alone.
    assert _simulated("nvlink-pairs-4gpu", jobs, sharing=2) == {
        "big": (0, 150, False),
        "small": (0, 100, True),
    }
    # Half-busy jobs fill each other's idle time: nobody slows.
    assert _simulated("nvlink-pairs-4gpu", jobs, sharing=2, gpu_busy=0.5) == {
        "big": (0, 100, False),
        "small": (0, 50, True),
    }


def test_simulated_sharing_keeps_to_the_limit_per_gpu() -> None:
    from gpualloc.simulate.trace import SimJob

    jobs = [SimJob(name, 0.0, 1, 60.0, False) for name in ("a", "b", "c")]
    assert _simulated("single-gpu", jobs, sharing=2) == {
        "a": (0, 120, True),
        "b": (0, 120, True),
        "c": (120, 180, True),
    }


def test_simulate_sharing_on_the_command_line(cli) -> None:
    args = ("--topology", "dgx1-v100", "simulate", "--generate", "mixed:jobs=40", "--json")
    result = cli(*args, "--sharing", "2", "--gpu-busy", "0.5")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    summary = data["policies"]["mapa"]["summary"]
    assert data["sharing"] == 2 and data["gpu_busy"] == 0.5
    assert summary["shared_jobs"] == summary["one_gpu_jobs"]["jobs"] > 0
    refused = cli(*args, "--gpu-busy", "0.5")
    assert refused.exit_code != 0 and "--gpu-busy applies to --sharing" in refused.stderr


# ---- fractions of a GPU --------------------------------------------------------------------------


def test_a_gpu_takes_shared_jobs_while_their_parts_sum_to_at_most_one() -> None:
    topology = load_bundled("dgx1-v100")
    ledger = Ledger(host="h")
    ledger.leases += [lease_on(3, "a", share=LeasedShare(fraction=0.6, sm_percent=60))]
    occupancy = Occupancy.build(topology, ledger, max_shared_jobs=8)
    fits = choose_share(topology, occupancy, ShareRequest(sm_percent=40), 8)
    assert fits.candidate.gpu == 3 and fits.candidate.used_fraction == 0.6
    # 60 % more does not fit beside 60 %: it goes to another GPU, and GPU 3 named is busy.
    assert choose_share(topology, occupancy, ShareRequest(sm_percent=60), 8).candidate.gpu != 3
    with pytest.raises(GpusBusy) as busy:
        choose_share(topology, occupancy, ShareRequest(sm_percent=60, gpu=3), 8)
    assert "too little memory or GPU share on GPU 3" in busy.value.message
    assert "60% of it shared" in busy.value.message


def test_simulated_fractions_pack_without_slowing_each_other() -> None:
    from gpualloc.simulate.trace import SimJob

    jobs = [
        SimJob("a", 0.0, 1, 60.0, False, gpu_fraction=0.5),
        SimJob("b", 0.0, 1, 60.0, False, gpu_fraction=0.5),
        SimJob("c", 0.0, 1, 60.0, False, gpu_fraction=0.3),
    ]
    # Half and half share the one GPU at full pace; 0.3 more waits for room.
    assert _simulated("single-gpu", jobs, sharing=8) == {
        "a": (0, 60, True),
        "b": (0, 60, True),
        "c": (60, 120, True),
    }


def _two_shared_gpus(first: int, second: int) -> Ledger:
    """GPU 0 and GPU 1 shared, ``first`` and ``second`` per cent of them held; the rest held
    whole."""
    ledger = Ledger(host="h")
    ledger.leases += [
        lease_on(0, "a", share=LeasedShare(fraction=first / 100, sm_percent=first)),
        lease_on(1, "b", share=LeasedShare(fraction=second / 100, sm_percent=second)),
    ]
    ledger.leases += [lease_on(g, "c") for g in range(2, 8)]
    return ledger


def test_fgd_keeps_room_for_the_workloads_common_asks_where_best_fit_does_not() -> None:
    """Half the GPU is the common ask: a 30 % job should not leave a half-free GPU with 20 %."""
    topology = load_bundled("dgx1-v100")
    ledger = _two_shared_gpus(50, 65)  # 50 % and 35 % free
    occupancy = Occupancy.build(topology, ledger, max_shared_jobs=8)
    mix = {(1, 0.5): 0.8, (1, 0.3): 0.2}
    request = ShareRequest(sm_percent=30)
    fgd = choose_share(topology, occupancy, request, 8, strategy="fgd", mix=mix)
    assert fgd.candidate.gpu == 1  # 35 % was too little for a half anyway: fill it
    assert "expected fragmentation grows least" in fgd.reason
    best = choose_share(topology, occupancy, request, 8, strategy="best-fit", mix=mix)
    assert best.candidate.gpu == 1 and "least of it left" in best.reason  # 5 % left there
    first = choose_share(topology, occupancy, request, 8, strategy="first-fit")
    assert first.candidate.gpu == 0
    # A 20 % job: best fit fills the 35 % GPU's gap to 15 %; FGD too (neither 35 nor 15 %
    # holds a half), but a 50 % job may only go to GPU 0, where both agree.
    half = ShareRequest(sm_percent=50)
    assert choose_share(topology, occupancy, half, 8, strategy="fgd", mix=mix).candidate.gpu == 0


def test_expected_fragmentation_as_the_fgd_paper_defines_it() -> None:
    from gpualloc.placement.sharing.fragmentation import (
        expected_fragmentation,
        fragmentation,
        growth,
    )

    free = [1.0, 0.5, 0.2, 0.0]
    assert fragmentation(free, (1, 0.5)) == pytest.approx(0.2)  # 0.2 < 0.5: unusable
    assert fragmentation(free, (1, 1.0)) == pytest.approx(0.7)  # partial GPUs, for a whole one
    assert fragmentation(free, (2, 1.0)) == pytest.approx(1.7)  # fits nowhere: all of it
    mix = {(1, 0.5): 0.5, (1, 1.0): 0.5}
    assert expected_fragmentation(free, mix) == pytest.approx(0.45)
    # 0.3 of the half-free GPU leaves 0.2, a fragment for halves (0.4 in all) but less of it for
    # a whole GPU (0.4): 0.40 in expectation, down 0.05. 0.3 of the free GPU leaves no whole
    # GPU, so all 1.4 free is fragment for one: 0.80, up 0.35.
    assert growth(free, 1, 0.3, mix) == pytest.approx(-0.05)
    assert growth(free, 0, 0.3, mix) == pytest.approx(0.35)
    assert growth(free, 2, 0.2, mix) == pytest.approx(-0.2)  # filling a fragment removes it


def test_simulate_takes_a_share_placement(cli) -> None:
    args = ("--topology", "dgx1-v100", "simulate", "--generate", "mixed:jobs=30", "--json")
    assert cli(*args, "--sharing", "2", "--share-placement", "first-fit").exit_code == 0
    bad = cli(*args, "--sharing", "2", "--share-placement", "random")
    assert bad.exit_code == ExitCode.USAGE and "not one of fgd, best-fit" in bad.stderr


# ---- the live request mix ------------------------------------------------------------------------


def test_the_request_mix_forgets_old_requests_and_needs_enough_of_them() -> None:
    from gpualloc.ledger.stats import MIX_MEMORY, MIX_MIN_REQUESTS, LedgerStats

    stats = LedgerStats()
    for _ in range(MIX_MIN_REQUESTS):
        stats.observe_request(1, 0.5)
    assert stats.recent_mix()[0] is None  # too few to trust: 20, decayed, weigh under 20
    stats.observe_request(2, 1.0)
    stats.observe_request(2, 1.0)
    mix, weight = stats.recent_mix()
    assert MIX_MIN_REQUESTS < weight < MIX_MIN_REQUESTS + 2
    assert mix is not None and set(mix) == {(1, 0.5), (2, 1.0)}
    assert sum(mix.values()) == pytest.approx(1.0)
    assert mix[(2, 1.0)] > 1 / MIX_MIN_REQUESTS  # the newest weighs most
    for _ in range(7 * MIX_MEMORY):
        stats.observe_request(1, 0.25)
    mix, _ = stats.recent_mix()
    assert mix is not None and mix[(1, 0.25)] > 0.95  # the old asks have faded
    assert (2, 1.0) not in mix  # ... and one that decays below the floor is dropped
    assert stats.recent_mix()[1] == pytest.approx(MIX_MEMORY, rel=0.06)


def test_a_sliver_of_a_gpu_counts_as_a_hundredth_and_the_ledger_stays_readable() -> None:
    from gpualloc.ledger.store import ledger_text, parse_ledger

    ledger = Ledger(host="h")
    ledger.stats.observe_request(1, 100 * 1024**2 / (80 * GIB))  # --mem 100M on 80 GB: 0.1 %
    ledger.stats.observe_request(1, 1.0)
    assert ledger.stats.request_mix == {"1:0.01": pytest.approx(0.995), "1:1": 1.0}
    assert parse_ledger(ledger_text(ledger, 0), "ledger.json").stats == ledger.stats


def test_a_ledger_with_a_malformed_request_mix_is_refused() -> None:
    from gpualloc.errors import LedgerError
    from gpualloc.ledger.store import parse_ledger

    good = '{"schema_version": 6, "host": "h", "stats": {"request_mix": {"1:0.46": 3.5}}}'
    assert parse_ledger(good, "ledger.json").stats.request_mix == {"1:0.46": 3.5}
    bad = good.replace("1:0.46", "one half")
    with pytest.raises(LedgerError, match="request_mix"):
        parse_ledger(bad, "ledger.json")


def test_each_lease_adds_its_task_type_to_the_ledgers_mix() -> None:
    from gpualloc.host.lease_terms import LeaseTerms
    from gpualloc.host.local import LocalHost
    from gpualloc.model.request import JobRequest
    from gpualloc.placement.mapa.patterns import build_pattern
    from gpualloc.placement.want import Want

    host = LocalHost.open(load_bundled("dgx1-v100"))
    pid = os.getpid()
    two = JobRequest(2, build_pattern("ring", 2), sensitive=False)
    one = JobRequest(1, build_pattern("ring", 1), sensitive=False)
    host.allocate(Want(two), LeaseTerms(source="alloc", pid=pid))
    shared = host.allocate(
        Want(one, share=ShareRequest(sm_percent=30)), LeaseTerms(source="run", pid=pid)
    )
    assert shared.lease.share is not None
    mix = host.snapshot().ledger.stats.request_mix
    assert mix == {"1:0.3": 1.0, "2:1": pytest.approx(1 - 1 / 200)}


def test_fgd_weighs_the_hosts_recent_requests_once_there_are_enough() -> None:
    topology = load_bundled("dgx1-v100")
    ledger = _two_shared_gpus(40, 30)  # 60 % and 70 % free
    request = ShareRequest(sm_percent=20)
    fresh = Occupancy.build(topology, ledger, max_shared_jobs=8)
    assert fresh.share_mix is None and "Alibaba trace's mix" in fresh.share_mix_source
    # This host's shared jobs ask half a GPU: a 20 % job belongs where it leaves 50 % (GPU 1),
    # not 40 % (GPU 0), where no such job fits; whole-GPU asks see both as fragments already.
    for _ in range(30):
        ledger.stats.observe_request(1, 0.5)
        ledger.stats.observe_request(2, 1.0)
    known = Occupancy.build(topology, ledger, max_shared_jobs=8)
    assert known.share_mix is not None and set(known.share_mix) == {(1, 0.5), (2, 1.0)}
    choice = choose_share(
        topology, known, request, 8, mix=known.share_mix, mix_source=known.share_mix_source
    )
    assert choice.candidate.gpu == 1
    assert "grows least there (-0.100 GPU, weighed by this host's recent requests (52 by" in (
        choice.reason
    )
    best = choose_share(topology, known, request, 8, strategy="best-fit")
    assert best.candidate.gpu == 0  # best fit takes the fuller GPU and strands 40 %


def test_dry_run_says_which_mix_fgd_weighed(cli) -> None:
    shown = cli(*V100, "run", "--share", "--sm-share", "30", "--dry-run", "--", "true")
    assert shown.exit_code == 0, shown.stderr
    assert (
        "weighed by the Alibaba trace's mix (this host has recorded 0 of the 20 requests its own "
        "mix needs)" in shown.stdout
    )
