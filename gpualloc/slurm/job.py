"""Inside a Slurm job: which of the host's GPUs belong to the job.

``gpualloc run`` (and ``alloc``, ``status``, ``release``) inside a job limit themselves to the
job's GPUs and keep a ledger of their own for the job, so that an 8-GPU allocation can run four
topology-placed 2-GPU sub-jobs of a sweep while the host ledger keeps the job's whole lease
(written by ``gpualloc slurm prolog``).

The job's GPUs are mapped to physical GPUs by identity, never by position:

- ``SLURM_STEP_GPUS`` (else ``SLURM_JOB_GPUS``) holds Slurm's GPU numbers. Slurm 22.05 numbers
  a GPU by the number in its ``gres.conf`` device file name (``File=/dev/nvidia3`` is GPU 3
  whatever the line's position; slurmd's ``DebugFlags=Gres`` log shows ``Index=3`` for it), and
  ``/dev/nvidiaN`` is the GPU whose device minor number is N (NVML
  ``nvmlDeviceGetMinorNumber``, which also gives its PCI bus id). A recorded topology without
  minor numbers takes N as the index, as ``gpualloc slurm gres-conf`` does. On a host with MIG
  the numbers are positions in gres.conf instead (:func:`gpualloc.slurm.gres.gres_records`).
- Otherwise ``CUDA_VISIBLE_DEVICES`` entries that are UUIDs (``GPU-...``; unique prefixes, as CUDA
  accepts them) are matched against the GPUs' UUIDs. Index entries are not used: under
  ``ConstrainDevices`` Slurm renumbers them from 0.

``GPUALLOC_NO_SLURM=1`` makes gpualloc ignore the job and use the host ledger, as outside Slurm.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from msgspec import Struct

from gpualloc.config import NO_SLURM_VARIABLE, no_slurm
from gpualloc.errors import RequestError
from gpualloc.model.cpuset import format_cpulist
from gpualloc.model.topology import Topology
from gpualloc.user_files import shown_value

IGNORE_VARIABLE = NO_SLURM_VARIABLE
_JOB_ID = re.compile(r"^[0-9]+(_[0-9]+)?$")
_HINT = f"check gres.conf File= against 'nvidia-smi -q | grep Minor', or set {IGNORE_VARIABLE}=1"


class SlurmJob(Struct, frozen=True):
    """The Slurm job gpualloc runs in, and its GPUs as indices of the topology."""

    job_id: str
    gpus: frozenset[int]
    source: str
    """The variable the GPUs came from."""

    def describe(self) -> str:
        return f"Slurm job {self.job_id} (GPU {format_cpulist(sorted(self.gpus))})"


def check_job_id(job_id: str) -> str:
    """``job_id`` if it is a Slurm job id (it becomes part of a file name)."""
    if not _JOB_ID.match(job_id):
        raise RequestError(
            f"SLURM_JOB_ID {shown_value(job_id)} is not a Slurm job id",
            hint=f"unset it, or set {IGNORE_VARIABLE}=1",
        )
    return job_id


def slurm_job(topology: Topology, env: Mapping[str, str]) -> SlurmJob | None:
    """The job gpualloc runs in, or None outside Slurm, in a job without GPUs, or when
    ``GPUALLOC_NO_SLURM`` is set. Raises RequestError when the job's GPUs cannot be found in
    ``topology``."""
    job_id = env.get("SLURM_JOB_ID", "").strip()
    if not job_id or no_slurm(env):
        return None
    check_job_id(job_id)
    for variable in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        numbers = env.get(variable, "").strip()
        if numbers:
            return SlurmJob(job_id, _by_device_number(topology, variable, numbers), variable)
    uuids = [x.strip() for x in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
    if uuids and all(x.startswith("GPU-") for x in uuids):
        return SlurmJob(job_id, _by_uuid(topology, uuids), "CUDA_VISIBLE_DEVICES")
    return None


def _by_device_number(topology: Topology, variable: str, text: str) -> frozenset[int]:
    from gpualloc.slurm.gres import slurm_gpu_numbers

    try:
        numbers = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise RequestError(f"{variable}={shown_value(text)} is not a list of GPU numbers") from None
    records = slurm_gpu_numbers(topology)
    missing = [n for n in numbers if n not in records]
    if missing:
        raise RequestError(
            f"{variable} names GPU {format_cpulist(missing)}, which is not among this host's "
            f"GPUs (Slurm numbers {format_cpulist(sorted(records))})",
            hint=_HINT,
        )
    mig = [records[n].mig for n in numbers if records[n].mig is not None]
    if mig:
        raise RequestError(
            f"this Slurm job holds MIG device {mig[0].label}; gpualloc places sub-jobs on whole "  # type: ignore[union-attr]
            "GPUs only",
            hint=f"run the job directly (the taskprolog set CUDA_VISIBLE_DEVICES), or set "
            f"{IGNORE_VARIABLE}=1",
        )
    return frozenset(records[n].gpu for n in numbers)


def _by_uuid(topology: Topology, uuids: list[str]) -> frozenset[int]:
    found = set()
    for wanted in uuids:
        matches = [g.index for g in topology.gpus if g.uuid and g.uuid.startswith(wanted)]
        if len(matches) != 1:
            how = "matches no GPU" if not matches else "matches several GPUs"
            raise RequestError(
                f"CUDA_VISIBLE_DEVICES entry {shown_value(wanted)} {how} of this host",
                hint="'gpualloc topo show' lists the GPUs' UUIDs; " + _HINT,
            )
        found.add(matches[0])
    return frozenset(found)
