"""``--dependency``, in Slurm's syntax (sbatch(1)): when a submitted job may join the queue.

``after:ID[:ID...]`` (each has started), ``afterany:`` (each has ended), ``afterok:`` (each
completed with exit status 0), ``afternotok:`` (each ended otherwise), ``singleton`` (no
earlier job of the same user and name is still pending or running). Conditions joined by
``,`` must all hold, by ``?`` any one (one separator per list, as Slurm has it). The jobs are
the submitting user's, named by id or a unique prefix (an array's id names each of its
tasks, as in Slurm), and resolved to full ids when the job is submitted
(:func:`parse_dependency`), so a later job cannot change what a prefix meant.

A condition that can never hold (``afterok`` on a job that failed) is *never satisfied*: the
job is cancelled with that reason, Slurm's ``DependencyNeverSatisfied`` with its
``kill_invalid_depend``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, NamedTuple

from gpualloc.batch.record import FINAL_STATES, JobRecord, own_records, seen_state
from gpualloc.errors import RequestError

if TYPE_CHECKING:
    from collections.abc import Callable

KINDS = ("after", "afterany", "afterok", "afternotok", "singleton")


class Condition(NamedTuple):
    kind: str
    jobs: tuple[str, ...] = ()


class Dependency(NamedTuple):
    conditions: tuple[Condition, ...]
    any_of: bool = False

    def text(self) -> str:
        parts = [c.kind if not c.jobs else ":".join((c.kind, *c.jobs)) for c in self.conditions]
        return ("?" if self.any_of else ",").join(parts)


def parse_dependency(text: str) -> Dependency:
    """``--dependency`` read, its jobs resolved to this user's full ids; exit 2 for bad
    syntax, 13 for a job that is not the user's."""
    from gpualloc.batch.record import find_records

    if "," in text and "?" in text:
        raise RequestError(
            f"--dependency {text!r} mixes ',' (all) and '?' (any)",
            hint="use one separator, as Slurm requires",
        )
    any_of = "?" in text
    conditions = []
    for part in text.split("?" if any_of else ","):
        kind, _, ids = part.strip().partition(":")
        if kind not in KINDS:
            raise RequestError(
                f"--dependency: unknown condition {kind!r}",
                hint="after, afterany, afterok, afternotok (each with :ID[:ID...]) or singleton",
            )
        if kind == "singleton":
            if ids:
                raise RequestError("--dependency: singleton takes no job ids")
            conditions.append(Condition(kind))
            continue
        names = [name for name in ids.split(":") if name]
        if not names:
            raise RequestError(f"--dependency: {kind} needs a job id ({kind}:ID[:ID...])")
        ids_named = [record.id for name in names for record in find_records(name)]
        conditions.append(Condition(kind, tuple(ids_named)))
    return Dependency(tuple(conditions), any_of)


def verdict(condition: Condition, me: JobRecord, records: dict[str, JobRecord]) -> bool | None:
    """Whether ``condition`` holds now (True), may hold later (None), or never will (False)."""
    if condition.kind == "singleton":
        earlier = [
            r
            for r in records.values()
            if r.id != me.id
            and r.name == me.name
            and (r.submitted, r.id) < (me.submitted, me.id)
            and seen_state(r) not in FINAL_STATES
        ]
        return None if earlier else True
    verdicts: list[bool | None] = []
    for job_id in condition.jobs:
        other = records.get(job_id)
        if other is None:
            verdicts.append(False)  # its record was removed: it can never be seen to end
            continue
        state = seen_state(other)
        final = state in FINAL_STATES
        if condition.kind == "after":
            verdicts.append(True if state != "pending" else None)
        elif condition.kind == "afterany":
            verdicts.append(True if final else None)
        elif condition.kind == "afterok":
            verdicts.append(None if not final else state == "completed")
        else:  # afternotok
            verdicts.append(None if not final else state != "completed")
    if False in verdicts:
        return False
    return None if None in verdicts else True


def satisfied(dependency: Dependency, me: JobRecord) -> bool | None:
    """The whole dependency's verdict, as :func:`verdict` answers for one condition."""
    records = {r.id: r for r in own_records()}
    verdicts = [verdict(c, me, records) for c in dependency.conditions]
    if dependency.any_of:
        if True in verdicts:
            return True
        return False if all(v is False for v in verdicts) else None
    if False in verdicts:
        return False
    return None if None in verdicts else True


def wait_for_dependencies(record: JobRecord, save: Callable[..., None]) -> None:
    """Until the job's dependency holds (``save`` records the reason meanwhile); raises
    :class:`NeverSatisfied` when it cannot."""
    from gpualloc.batch.record import POLL_S

    assert record.dependency is not None
    dependency = parse_stored(record.dependency)
    save(reason="Dependency", detail=f"waits for {record.dependency}")
    while True:
        found = satisfied(dependency, record)
        if found:
            return
        if found is False:
            raise NeverSatisfied(f"its dependency {record.dependency} can never be satisfied")
        time.sleep(POLL_S)


def parse_stored(text: str) -> Dependency:
    """A dependency as a record keeps it (full ids, already checked)."""
    any_of = "?" in text
    conditions = []
    for part in text.split("?" if any_of else ","):
        kind, _, ids = part.partition(":")
        conditions.append(Condition(kind, tuple(i for i in ids.split(":") if i)))
    return Dependency(tuple(conditions), any_of)


class NeverSatisfied(Exception):
    """A dependency that can never hold: the job is cancelled."""
