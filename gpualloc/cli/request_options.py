"""The options that describe a job, shared by ``plan``, ``run`` and ``alloc``.

One definition of each option (its name and help), so that the three commands cannot drift
apart; :class:`gpualloc.placement.options.JobOptions` bundles their values and turns them into
the placement engine's request.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from gpualloc.cli import complete

POLICY_HELP = (
    "Placement policy: mapa (default; MAPA Preserve), mapa-greedy, drb, pack, spread, "
    "besteffort (NVIDIA go-gpuallocator), slurm (Slurm 22.05), baseline (lowest indices). "
    "Else GPUALLOC_POLICY, else policy in config.toml."
)

CountOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "-n",
        "--num-gpus",
        min=1,
        metavar="N",
        help="Number of GPUs the job needs (required, unless --mig or --mem asks for a MIG "
        "device).",
        show_default=False,
    ),
]
PatternOption = Annotated[
    str,
    typer.Option(
        metavar="PATTERN",
        help="How the job's ranks talk: ring (NCCL's collectives), all, tree, star, or a "
        "JSON edge list file over ranks 0..n-1.",
        autocompletion=complete.patterns,
    ),
]
SensitiveOption = Annotated[
    Optional[bool],  # noqa: UP045 - typer needs Optional on Python 3.10
    typer.Option(
        "--sensitive/--insensitive",
        help="Bandwidth-sensitive job (MAPA 2.3). Default: sensitive for 2+ GPUs.",
        show_default=False,
    ),
]
ExcludeOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(metavar="LIST", help="GPUs the job must not get, e.g. a GPU you know is flaky."),
]
RequireOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(metavar="LIST", help="GPUs that must be part of the answer."),
]
PolicyOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        metavar="POLICY",
        help=POLICY_HELP,
        autocompletion=complete.policies,
        show_default=False,
    ),
]
ScoreOption = Annotated[
    str,
    typer.Option(
        metavar="MODEL",
        help="Effective-bandwidth model for sensitive jobs: auto (MAPA Table 2 on hosts with "
        "the DGX-1's NV1/NV2/PCIe links and patterns of up to 8 edges, else the slowest "
        "pattern link), mapa, bottleneck.",
        autocompletion=complete.scores,
    ),
]
DrbWeightsOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        metavar="C,I,F",
        help="DRB utility weights communication,interference,fragmentation (default "
        "1,1,1: a third each).",
    ),
]
ExplicitGpusOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--gpus",
        metavar="LIST",
        help="Take exactly these GPUs, in this order (e.g. 3,1); -n is then their number.",
    ),
]
MigOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--mig",
        metavar="PROFILE|DEVICE",
        help="Take one MIG device instead of whole GPUs: the smallest free one of this profile "
        "(e.g. 1g.5gb, 3g.20gb), or exactly this one (GPU0/MIG3, or its MIG- UUID). "
        "'gpualloc topo show' lists them.",
        show_default=False,
        autocompletion=complete.mig_profiles,
    ),
]
MemOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--mem",
        metavar="SIZE",
        help="Take the smallest free MIG device with at least this much memory (e.g. 10G, "
        "4.5G, 512M; G = GiB); with --mig, a device of that profile with that much. With "
        "--share: the GPU memory the shared job needs; with --shareable: what this job uses, "
        "so that shared jobs leave it room.",
        show_default=False,
    ),
]
AllowUnhealthyOption = Annotated[
    bool,
    typer.Option(
        "--allow-unhealthy",
        help="Place on GPUs gpualloc found unhealthy too (uncorrectable ECC errors, pages or "
        "rows waiting for a reset, a critical Xid error; 'gpualloc status' says which).",
    ),
]
ShareableOption = Annotated[
    bool,
    typer.Option(
        "--shareable",
        help="Let shared jobs (run --share) run on these GPUs beside this job, as long as "
        "their memory fits; you may evict them (release --evict-shared).",
    ),
]
IgnoreForeignOption = Annotated[
    Optional[bool],  # noqa: UP045
    typer.Option(
        "--ignore-foreign/--heed-foreign",
        help="Treat GPUs as free even when processes that did not come through gpualloc run "
        "on them (NVML's process list). Default: heed them (GPUALLOC_IGNORE_FOREIGN, "
        "ignore_foreign in config.toml).",
        show_default=False,
    ),
]
NameOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(metavar="NAME", help="A name for the lease, shown by 'gpualloc status'."),
]
UuidOption = Annotated[
    bool,
    typer.Option("--uuid", help="Export CUDA_VISIBLE_DEVICES as GPU UUIDs instead of indices."),
]


MinUtilityOption = Annotated[
    Optional[float],  # noqa: UP045
    typer.Option(
        metavar="U",
        min=0.0,
        max=1.0,
        help="Only start on a placement whose DRB utility (Eq. 2, 0..1; the DRB paper uses 0.3 "
        "for 1-GPU and 0.5 for 2-GPU jobs) is at least this; with --wait, keep waiting for a "
        "better one even when enough GPUs are free (DRB's postponement).",
    ),
]
MinBandwidthOption = Annotated[
    Optional[float],  # noqa: UP045
    typer.Option(
        "--min-bandwidth",
        min=0.0,
        metavar="GBPS",
        help="Only start on a placement whose predicted effective bandwidth is at least this "
        "many GB/s (e.g. wait for an NVLinked pair); with --wait, keep waiting.",
    ),
]
WaitOption = Annotated[
    bool,
    typer.Option(
        "--wait",
        help="When the GPUs are taken, join the host's queue and start as soon as it is this "
        "job's turn (first come, first served; backfill; priorities).",
    ),
]
TimeoutOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        metavar="DURATION",
        help="With --wait: give up after this long (90, 30s, 5m, 2h, 1h30m) with exit 124.",
    ),
]
PriorityOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        metavar="CLASS",
        help="With --wait: queue class high, normal or low; arrival order within. Default: "
        "normal (GPUALLOC_PRIORITY, queue.priority in config.toml).",
        show_default=False,
        autocompletion=complete.priorities,
    ),
]
MaxBypassOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        metavar="N",
        min=0,
        help="With --wait: how many later jobs may start before this one (backfill) before "
        "backfill past it stops until it starts. Default: 8 (GPUALLOC_MAX_BYPASS, "
        "queue.max_bypass in config.toml).",
        show_default=False,
    ),
]
