"""The environment a job runs with: what gpualloc adds, and nothing else changed.

- ``CUDA_VISIBLE_DEVICES``: the GPUs in the placement's rank order, as CUDA's numbers in PCI
  bus order (NVML's index where NVML enumerates in bus order, as it mostly does; see
  :meth:`~gpualloc.model.topology.Topology.cuda_ordinals`), or UUIDs with ``--uuid``, which
  stay right even if indices move after a GPU fails. Rank ``i`` of the job sees its GPU as
  CUDA device ``i``.
- ``CUDA_DEVICE_ORDER=PCI_BUS_ID``: CUDA numbers GPUs fastest-first by default, NVML and
  nvidia-smi by PCI bus id; without this the indices above would name other GPUs on hosts with
  mixed GPU models. Slurm never sets it, task-spooler misspells it, GPUtil, gpustat and nvitop
  only tell users to.
- ``GPUALLOC_LEASE_ID`` (when there is a lease) and ``GPUALLOC_GPUS`` (the physical indices, in
  order, whatever ``CUDA_VISIBLE_DEVICES`` holds).
- For a MIG device: ``CUDA_VISIBLE_DEVICES=MIG-<uuid>`` (the only form that names one device of
  one GPU for CUDA 11 and later), ``GPUALLOC_GPUS`` its parent GPU and ``GPUALLOC_MIG`` its
  gpualloc name (``GPU0/MIG3``).

Every other variable passes through unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from gpualloc.errors import RequestError

if TYPE_CHECKING:
    from gpualloc.model.mig import MigInstance
    from gpualloc.model.share import LeasedShare
    from gpualloc.model.topology import Gpu, Topology

LEASE_ID_VARIABLE = "GPUALLOC_LEASE_ID"
GPUS_VARIABLE = "GPUALLOC_GPUS"
MIG_VARIABLE = "GPUALLOC_MIG"


def gpu_variables(
    gpus: Sequence[Gpu],
    *,
    lease_id: str | None = None,
    use_uuid: bool = False,
    ordinals: Mapping[int, int] | None = None,
) -> dict[str, str]:
    """The variables gpualloc sets for a job on ``gpus`` (rank order), in a stable order.
    ``ordinals``: each GPU's CUDA number in bus order (:meth:`Topology.cuda_ordinals`),
    which ``CUDA_VISIBLE_DEVICES`` holds; default, the GPU's index."""
    if use_uuid:
        check_uuids(gpus)
        visible = ",".join(str(gpu.uuid) for gpu in gpus)
    else:
        number = ordinals or {}
        visible = ",".join(str(number.get(gpu.index, gpu.index)) for gpu in gpus)
    variables = {"CUDA_VISIBLE_DEVICES": visible, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    if lease_id is not None:
        variables[LEASE_ID_VARIABLE] = lease_id
    variables[GPUS_VARIABLE] = ",".join(str(gpu.index) for gpu in gpus)
    return variables


UUID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._:-]*"
"""A UUID ``CUDA_VISIBLE_DEVICES`` can hold as one item (NVML's ``GPU-<hex>``): no comma to
split it into two devices, no space or control character (compiled when ``--uuid`` first asks)."""


def check_uuids(gpus: Iterable[Gpu]) -> None:
    """Refuse ``--uuid`` unless each of ``gpus`` has a UUID fit for ``CUDA_VISIBLE_DEVICES``.
    Run and alloc ask this of every GPU they could place the job on before they take any: a
    refusal after the lease was written changed the ledger and the placement counts
    (tests/test_bad_input_options.py::test_a_refused_uuid_writes_nothing)."""
    for gpu in gpus:
        if not gpu.uuid:
            raise RequestError(
                f"--uuid: GPU {gpu.index} has no UUID in this topology",
                hint="leave out --uuid to export indices",
            )
        if not re.fullmatch(UUID_PATTERN, gpu.uuid):
            from gpualloc.model.printable import printable

            raise RequestError(
                f"--uuid: GPU {gpu.index}'s UUID '{printable(gpu.uuid, 60)}' is not one that "
                "CUDA_VISIBLE_DEVICES can hold",
                hint="correct the topology file's uuid, or leave out --uuid to export indices",
            )


def mig_variables(instance: MigInstance, *, lease_id: str | None = None) -> dict[str, str]:
    """The variables gpualloc sets for a job on one MIG device."""
    if not instance.uuid:
        raise RequestError(
            f"MIG device {instance.label} has no UUID in this topology",
            hint="CUDA names MIG devices only by UUID; record the topology with nvidia-smi -L",
        )
    variables = {"CUDA_VISIBLE_DEVICES": instance.uuid, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    if lease_id is not None:
        variables[LEASE_ID_VARIABLE] = lease_id
    variables[GPUS_VARIABLE] = str(instance.gpu)
    variables[MIG_VARIABLE] = instance.label
    return variables


def job_environment(base: Mapping[str, str], variables: Mapping[str, str]) -> dict[str, str]:
    """``base`` (the caller's environment) with ``variables`` set over it."""
    return {**base, **variables}


def shell_exports(variables: Mapping[str, str]) -> str:
    """``export NAME=value`` lines a POSIX shell can ``eval`` (values single-quoted if needed)."""
    import shlex

    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in variables.items())


def job_variables(
    topology: Topology,
    gpus: Sequence[int],
    mig: Sequence[tuple[int, int]],
    *,
    lease_id: str | None,
    uuid: bool,
    share: LeasedShare | None = None,
) -> dict[str, str]:
    """The job's GPU variables: for whole GPUs, for the one MIG device of a MIG lease, and
    for a shared job also how it shares."""
    if mig:
        (key,) = mig
        return mig_variables(topology.mig_device(*key), lease_id=lease_id)
    variables = gpu_variables(
        [topology.gpu(g) for g in gpus],
        lease_id=lease_id,
        use_uuid=uuid,
        ordinals=topology.cuda_ordinals(),
    )
    if share is None:
        return variables
    from gpualloc.launcher.sharing import share_variables

    return {**variables, **share_variables(share)}
