"""The DRB paper's prototype scenario (Amaral et al., SC'17, seed 000, section 5.2, Table 1).

Six jobs on the paper's IBM Minsky (``minsky-p100``: two sockets of two NVLinked P100) with the
measured profile the paper's reference simulator was configured with
(:meth:`gpualloc.simulate.profile.DrbProfile.bundled`), and the paper's four schedulers as
gpualloc options. ``benchmarks/evaluate.py`` reports it and a test holds its ordering.
"""

from __future__ import annotations

from gpualloc.simulate.engine import SimOptions
from gpualloc.simulate.profile import DrbProfile
from gpualloc.simulate.trace import SimJob

TOPOLOGY = "minsky-p100"
TABLE_1 = (  # network, per-GPU batch, GPUs, minimum utility, arrival (s)
    ("bvlc_alexnet", 1, 1, 0.3, 0.51),
    ("bvlc_googlenet", 4, 1, 0.3, 15.03),
    ("bvlc_alexnet", 1, 1, 0.3, 24.36),
    ("bvlc_alexnet", 4, 2, 0.5, 25.33),
    ("bvlc_alexnet", 1, 2, 0.5, 29.33),
    ("bvlc_reference_caffenet", 1, 2, 0.5, 29.89),
)
SCHEDULERS = {  # FCFS and BF know no utility; TOPO-AWARE-P honours Table 1's thresholds
    "FCFS": SimOptions(policy="baseline", queue="fifo", runtime="profile", postpone=False),
    "BF": SimOptions(policy="pack", queue="backfill", runtime="profile", postpone=False),
    "TOPO-AWARE": SimOptions(policy="drb", queue="fifo", runtime="profile", postpone=False),
    "TOPO-AWARE-P": SimOptions(policy="drb", queue="fifo", runtime="profile"),
}
ORIGINAL_SIMULATOR_MAKESPAN_S = {"FCFS": 440.0, "TOPO-AWARE": 433.0, "TOPO-AWARE-P": 396.0}
"""The reference simulator's makespans on this scenario (HiEST/gpu-topo-aware, the DRB
authors' simulator): speed-ups over FCFS of 1.02x (TOPO-AWARE) and 1.11x (TOPO-AWARE-P)."""
PAPER_HARDWARE_SPEEDUP = 1.30
"""TOPO-AWARE-P over the greedy schedulers on the real Minsky (section 5.2.2, Fig. 8)."""


def table_1_jobs(profile: DrbProfile | None = None) -> list[SimJob]:
    """Table 1's jobs, each lasting its measured solo time within one socket."""
    profile = profile or DrbProfile.bundled()
    return [
        SimJob(
            id=f"Job{i}",
            arrival_s=arrival,
            gpus=gpus,
            duration_s=profile.solo_s(network, batch, gpus),
            sensitive=batch <= 4,
            workload=network,
            batch=batch,
            min_utility=min_utility,
            order=i,
        )
        for i, (network, batch, gpus, min_utility, arrival) in enumerate(TABLE_1)
    ]
