"""The options that describe a job, shared by ``plan``, ``run`` and ``alloc``.

One definition of each option (its name, help and parsing), so that the three commands cannot
drift apart; :func:`build_want` turns their values into the placement engine's request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import typer

from gpualloc.cli import complete
from gpualloc.cli.state import STATE
from gpualloc.errors import RequestError

if TYPE_CHECKING:
    from gpualloc.launcher.allocate import Want
    from gpualloc.launcher.wait import WaitOptions
    from gpualloc.placement.scores import EffectiveModel
    from gpualloc.placement.utility import UtilityWeights

POLICY_HELP = (
    "Placement policy: mapa (default; MAPA Preserve), mapa-greedy, drb, pack, spread, "
    "besteffort (NVIDIA go-gpuallocator), slurm (Slurm 22.05), baseline (lowest indices). "
    "Else GPUALLOC_POLICY, else policy in config.toml."
)

CountOption = Annotated[
    int, typer.Option("-n", "--num-gpus", min=1, help="Number of GPUs the job needs.")
]
PatternOption = Annotated[
    str,
    typer.Option(
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
    typer.Option(help="GPUs the job must not get, e.g. a GPU you know is flaky."),
]
RequireOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(help="GPUs that must be part of the answer."),
]
PolicyOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(help=POLICY_HELP, autocompletion=complete.policies, show_default=False),
]
ScoreOption = Annotated[
    str,
    typer.Option(
        help="Effective-bandwidth model for sensitive jobs: auto (MAPA Table 2 on hosts with "
        "the DGX-1's NV1/NV2/PCIe links and patterns of up to 8 edges, else the slowest "
        "pattern link), mapa, bottleneck.",
        autocompletion=complete.scores,
    ),
]
DrbWeightsOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
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
    typer.Option(help="A name for the lease, shown by 'gpualloc status'."),
]
UuidOption = Annotated[
    bool,
    typer.Option("--uuid", help="Export CUDA_VISIBLE_DEVICES as GPU UUIDs instead of indices."),
]


MinUtilityOption = Annotated[
    Optional[float],  # noqa: UP045
    typer.Option(
        min=0.0,
        max=1.0,
        help="Only start on a placement whose DRB utility (0..1) is at least this; with --wait, "
        "keep waiting for a better one even when enough GPUs are free (DRB's postponement).",
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
        help="With --wait: queue class high, normal or low; arrival order within. Default: "
        "normal (GPUALLOC_PRIORITY, queue.priority in config.toml).",
        show_default=False,
        autocompletion=complete.priorities,
    ),
]
MaxBypassOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        min=0,
        help="With --wait: how many later jobs may start before this one (backfill) before "
        "backfill past it stops until it starts. Default: 8 (GPUALLOC_MAX_BYPASS, "
        "queue.max_bypass in config.toml).",
        show_default=False,
    ),
]


def parse_duration(text: str, option: str = "--timeout") -> float:
    """``90``, ``30s``, ``5m``, ``2h``, ``1h30m``, ``1.5h`` -> seconds."""
    from gpualloc.durations import parse_duration_text

    try:
        return parse_duration_text(text)
    except ValueError:
        raise RequestError(
            f"{option} {text!r} is not a duration", hint=f"e.g. {option} 90, 30s, 5m, 1h30m"
        ) from None


def gpu_list(text: str | None, option: str) -> frozenset[int]:
    """A ``0,2,4-7`` list of GPU indices, or a usage error naming ``option``."""
    return frozenset(gpu_sequence(text, option))


def gpu_sequence(text: str | None, option: str) -> tuple[int, ...]:
    """Like :func:`gpu_list`, keeping the order given (``3,1`` is not ``1,3``)."""
    from gpualloc.model.cpuset import is_cpulist, parse_cpulist

    if text is None or text.strip() == "":
        return ()
    parts = [part.strip() for part in text.split(",")]
    if not all(is_cpulist(part) for part in parts):
        raise RequestError(
            f"{option} {text!r} is not a GPU list",
            hint=f"write indices and ranges, e.g. {option} 0,2,4-7",
        )
    try:
        return tuple(g for part in parts for g in parse_cpulist(part))
    except ValueError as exc:
        raise RequestError(f"{option} {text!r}: {exc}", hint=f"e.g. {option} 0,2,4-7") from None


def effective_model(score: str) -> EffectiveModel:
    from gpualloc.placement.scores import EffectiveModel

    try:
        return EffectiveModel(score)
    except ValueError:
        raise RequestError(
            f"unknown --score {score!r}", hint="choose auto, mapa or bottleneck"
        ) from None


def utility_weights(text: str | None) -> UtilityWeights:
    from gpualloc.placement.utility import UtilityWeights

    if text is None:
        return UtilityWeights()
    try:
        values = [float(part) for part in text.split(",")]
        if len(values) != 3:
            raise ValueError
        return UtilityWeights(*values).normalised()
    except ValueError:
        raise RequestError(
            f"--drb-weights {text!r} is not three non-negative numbers",
            hint="e.g. --drb-weights 0.5,0.25,0.25 (communication, interference, fragmentation)",
        ) from None


def build_want(
    *,
    count: int | None,
    pattern: str,
    sensitive: bool | None,
    exclude: str | None,
    require: str | None,
    policy: str | None,
    score: str,
    drb_weights: str | None,
    explicit: str | None = None,
    min_utility: float | None = None,
    min_bandwidth: float | None = None,
) -> Want:
    """The engine's request from the option values; usage errors for bad combinations."""
    from gpualloc.launcher.allocate import Want
    from gpualloc.model.request import JobRequest
    from gpualloc.placement.patterns import build_pattern
    from gpualloc.placement.registry import get_policy

    chosen = gpu_sequence(explicit, "--gpus") if explicit is not None else None
    if chosen is not None:
        if not chosen:
            raise RequestError("--gpus is empty", hint="e.g. --gpus 0,1")
        if count is not None and count != len(chosen):
            raise RequestError(
                f"-n {count} but --gpus names {len(chosen)} GPU(s)", hint="give one of them"
            )
        if exclude or require:
            raise RequestError(
                "--gpus takes exactly the GPUs named; --exclude and --require do not apply",
                hint="leave them out",
            )
        count = len(chosen)
    count = count or 1
    policy = STATE.setting("policy", policy)
    get_policy(policy)
    request = JobRequest(
        gpus=count,
        pattern=build_pattern(pattern, count),
        sensitive=sensitive if sensitive is not None else count >= 2,
        required=gpu_list(require, "--require"),
        excluded=gpu_list(exclude, "--exclude"),
    )
    return Want(
        request=request,
        policy=policy,
        explicit=chosen,
        effective_model=effective_model(score),
        weights=utility_weights(drb_weights),
        min_utility=min_utility,
        min_bandwidth_gbps=min_bandwidth,
    )


def wait_options(
    *, wait: bool, timeout: str | None, priority: str | None, max_bypass: int | None
) -> WaitOptions | None:
    """The queue options, or None without --wait (usage errors for options that need it)."""
    from gpualloc.launcher.wait import WaitOptions

    if priority is not None and priority not in ("high", "normal", "low"):
        raise RequestError(f"unknown --priority {priority!r}", hint="choose high, normal or low")
    if not wait:
        if timeout is not None or priority is not None or max_bypass is not None:
            raise RequestError(
                "--timeout, --priority and --max-bypass apply to --wait", hint="add --wait"
            )
        return None
    return WaitOptions.from_config(
        STATE.config(),
        timeout_s=parse_duration(timeout) if timeout is not None else None,
        priority=priority,  # type: ignore[arg-type]
        max_bypass=max_bypass,
    )
