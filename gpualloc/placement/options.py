"""A job's options (:class:`gpualloc.model.job.JobOptions`) turned into the placement engine's
:class:`~gpualloc.placement.want.Want`, by one function (``tests/test_job_options.py``).

:func:`want_of` reads the options as typed (``exclude="0,2-3"``, ``mem="10G"``) and as the Python
API gives them (``exclude=(0, 2, 3)``, ``mem=10 * 2**30``), checks the combinations
(``--share`` with ``--mig``, ``-n`` against ``--gpus``, ...) and fills the defaults: the
configured policy, and a job of two or more GPUs is bandwidth-sensitive unless told (MAPA
section 2.3).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from msgspec import structs

from gpualloc.errors import RequestError
from gpualloc.model.job import gpu_indices
from gpualloc.model.option_values import gpu_list, gpu_sequence, mig_request
from gpualloc.model.printable import count_of

if TYPE_CHECKING:
    from gpualloc.config import Config
    from gpualloc.model.job import JobOptions
    from gpualloc.placement.mapa.scores import EffectiveModel
    from gpualloc.placement.sets.utility import UtilityWeights
    from gpualloc.placement.want import Want

GpuSelection = str | Iterable[int] | None
"""``"0,2,4-7"`` as typed, or the indices themselves."""


def want_of(
    job: JobOptions, config: Config, *, edges: tuple[tuple[int, int], ...] | None = None
) -> Want:
    """The engine's request; usage errors for bad combinations.

    ``--mem`` asks for a MIG device, except with ``--share`` (the shared job's memory) and
    ``--shareable`` (what the job declares it uses:
    :meth:`~gpualloc.model.job.JobOptions.declared_memory_bytes`). ``edges``: the pattern's,
    read by the client from the file it named (the broker opens no file a client names)."""
    _check_sharing(job)
    if job.share:
        return _share_want(job, config)
    mem = None if job.shareable else job.mem  # declared, not a MIG request
    if job.mig is not None or mem is not None:
        clash = _whole_gpu_options(job, job.gpus is not None)
        if clash:
            raise RequestError(
                f"{clash[0]} applies to whole GPUs, not to a MIG device (--mig/--mem)",
                hint="a CUDA process uses one MIG device; leave out " + ", ".join(clash),
            )
    from gpualloc.model.request import JobRequest
    from gpualloc.placement.mapa.patterns import build_pattern
    from gpualloc.placement.policies.registry import configured_policy
    from gpualloc.placement.want import Want

    chosen = _explicit(job)
    count = job.count
    if chosen is not None:
        if not chosen:
            raise RequestError("--gpus is empty", hint="e.g. --gpus 0,1")
        if count is not None and count != len(chosen):
            raise RequestError(
                f"-n {count} but --gpus names {count_of(len(chosen), 'GPU')}",
                hint="give one of them",
            )
        if job.exclude or job.require:
            raise RequestError(
                "--gpus takes exactly the GPUs named; --exclude and --require do not apply",
                hint="leave them out",
            )
        count = len(chosen)
    count = count or 1
    request = JobRequest(
        gpus=count,
        pattern=build_pattern(job.pattern, count) if edges is None else _sent(job, count, edges),
        sensitive=job.sensitive if job.sensitive is not None else count >= 2,
        required=_gpu_set(job.require, "--require"),
        excluded=_gpu_set(job.exclude, "--exclude"),
    )
    policy = configured_policy(config, job.policy)
    return Want(
        request=request,
        policy=policy,
        explicit=chosen,
        effective_model=effective_model(job.score),
        weights=utility_weights(job.drb_weights),
        min_utility=job.min_utility,
        min_bandwidth_gbps=job.min_bandwidth,
        mig=(
            mig_request(job.mig, job.memory_bytes())
            if job.mig is not None or mem is not None
            else None
        ),
        options=structs.replace(job, policy=policy),
    )


def _sent(job: JobOptions, count: int, edges: tuple[tuple[int, int], ...]) -> Any:
    """The pattern a client read from its file and sent as ``edges``, checked as any pattern
    is (:class:`~gpualloc.model.request.CommunicationPattern`): never opened here."""
    from gpualloc.model.request import CommunicationPattern

    try:
        return CommunicationPattern(job.pattern, count, edges)
    except ValueError as bad:
        raise RequestError(
            f"the job's pattern: {bad}", hint="list each pair of ranks that talk once"
        ) from None


def _explicit(job: JobOptions) -> tuple[int, ...] | None:
    if job.gpus is None:
        return None
    if isinstance(job.gpus, str):
        return gpu_sequence(job.gpus, "--gpus")
    return gpu_indices(job.gpus, "--gpus")


def _whole_gpu_options(job: JobOptions, gpus: bool) -> list[str]:
    """The options given that only a request of whole GPUs can use (a MIG device or a
    shared place is one device; ``gpus``: whether --gpus names more than it allows)."""
    given = {
        "-n": job.count is not None and job.count != 1,
        "--gpus": gpus,
        "--exclude": job.exclude is not None,
        "--require": job.require is not None,
        "--min-utility": job.min_utility is not None,
        "--min-bandwidth": job.min_bandwidth is not None,
    }
    return [option for option, present in given.items() if present]


def _check_sharing(job: JobOptions) -> None:
    if (job.background or job.sm_share is not None) and not job.share:
        option = "--background" if job.background else "--sm-share"
        raise RequestError(f"{option} applies to a shared job", hint="add --share")
    if job.share and job.shareable:
        raise RequestError(
            "--share and --shareable: a shared job already lets other shared jobs beside it",
            hint="give one of them",
        )
    if (job.share or job.shareable) and job.mig is not None:
        option = "--share" if job.share else "--shareable"
        raise RequestError(
            f"{option} applies to whole GPUs, not to a MIG device (--mig)",
            hint="a MIG device is a slice of a GPU already; leave out one of them",
        )


def _share_want(job: JobOptions, config: Config) -> Want:
    """The request of ``run --share``: one GPU, shared."""
    from gpualloc.model.request import JobRequest
    from gpualloc.model.share import ShareRequest
    from gpualloc.placement.mapa.patterns import build_pattern
    from gpualloc.placement.policies.registry import configured_policy
    from gpualloc.placement.want import Want

    chosen = _explicit(job) or ()
    clash = _whole_gpu_options(job, len(chosen) > 1)
    if clash:
        raise RequestError(
            f"{clash[0]} does not apply to a shared job (--share), which runs on one GPU",
            hint="leave out " + ", ".join(clash) + " (--gpus N names the one GPU to share)",
        )
    request = ShareRequest(
        memory_bytes=job.memory_bytes(),
        background=job.background,
        sm_percent=job.sm_share,
        gpu=chosen[0] if chosen else None,
    )
    policy = configured_policy(config)
    return Want(
        request=JobRequest(gpus=1, pattern=build_pattern("ring", 1), sensitive=False),
        policy=policy,
        share=request,
        options=structs.replace(job, policy=policy),
    )


def _gpu_set(value: GpuSelection, option: str) -> frozenset[int]:
    if value is None:
        return frozenset()
    if isinstance(value, str):
        return gpu_list(value, option)
    return frozenset(gpu_indices(value, option))


def effective_model(score: str) -> EffectiveModel:
    from gpualloc.placement.mapa.scores import EffectiveModel

    try:
        return EffectiveModel(score)
    except ValueError:
        from gpualloc.model.option_values import unknown_choice

        raise unknown_choice("--score", score, [m.value for m in EffectiveModel]) from None


def utility_weights(value: str | tuple[float, float, float] | None) -> UtilityWeights:
    """``--drb-weights C,I,F`` as weights summing to 1; a usage error saying which of the
    three rules it breaks (three numbers, none negative, not all zero)."""
    from gpualloc.model.printable import printable
    from gpualloc.placement.sets.utility import UtilityWeights

    if value is None:
        return UtilityWeights()
    said = f"--drb-weights '{printable(str(value), 60)}'"
    try:
        values = [float(part) for part in value.split(",")] if isinstance(value, str) else value
        if len(values) != 3 or not all(math.isfinite(v) for v in values):
            raise ValueError
    except (ValueError, TypeError):
        raise RequestError(
            f"{said} is not three non-negative numbers",
            hint="they weigh each part against the others: 2,1,1 counts communication double",
        ) from None
    if min(values) < 0:
        raise RequestError(
            f"{said}: a weight is negative ({min(values):g})",
            hint="a weight is a share of the utility: 0 leaves that part out",
        )
    if not any(values):
        raise RequestError(
            f"{said}: all three weights are zero; at least one must be positive",
            hint="e.g. --drb-weights 1,0,0 to weigh communication alone",
        )
    return UtilityWeights(*values).normalised()
