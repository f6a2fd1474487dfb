"""``gpualloc doctor``: check that the host works as its topology and leases say (issue 21,
point 1; the checks are :mod:`gpualloc.checkup`'s)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from gpualloc.cli.leases import JsonOption
from gpualloc.errors import ExitCode

if TYPE_CHECKING:
    from gpualloc.checkup import Finding

SEVERITY_STYLE = {"ok": "green", "note": "yellow", "problem": "red"}


def doctor_command(as_json: JsonOption = False) -> None:
    """Check the host: every NVLink up at its topology's count and generation, every GPU's
    PCIe link at full width, peer-to-peer access working between the GPUs of every lease,
    every job's processes on its own GPUs only and nobody else's on them, no unhealthy GPU.

    Exits 17 when something is wrong, 0 when all is well; notes (an idle GPU's lowered PCIe
    generation, peer-to-peer off between GPUs no lease holds) do not count. Links and
    peer-to-peer are read from NVML (else nvidia-smi) and so only on the host itself; on a
    recorded topology the leases and the faults and processes its file declares are checked.

    It also says who keeps the ledger: the broker (which must answer; its socket, directory,
    ledger and lock modes are checked), or a shared file that any user who can write its
    directory can forge (cooperative mode, a note), or one user's private file.
    """
    from gpualloc.checkup import lease_findings, link_findings
    from gpualloc.cli.open_ledger import open_host_ledger, warn
    from gpualloc.cli.output import Table, print_json, print_tables
    from gpualloc.discovery.links import read_links
    from gpualloc.ledger.attribution import attribute

    host = open_host_ledger(create=False)
    txn = host.snapshot()
    warn(txn.notes)
    leases = txn.ledger.leases
    findings = lease_findings(
        attribute(leases, host.processes.processes),
        host.faults,
        processes_seen=host.processes.source != "none",
    )
    notes = [*host.processes.notes, *host.health_notes]
    source = "none"
    if host.this_host:
        gpus = [g.index for g in host.topology.gpus]
        pairs = [(a, b) for i, a in enumerate(gpus) for b in gpus[i + 1 :]]
        links = read_links(host.topology, pairs)
        findings = link_findings(host.topology, links, leases) + findings
        notes += links.notes
        source = links.source
    else:
        notes.append(
            f"topology {host.topology.name or '(unnamed)'} is not this host: NVLink, PCIe and "
            "peer-to-peer can only be checked on the host itself"
        )
    findings = _ledger_findings(host) + findings
    problems = [f for f in findings if f.severity == "problem"]
    if as_json:
        print_json(_json(findings, notes, source))
    else:
        rows = [[f.check, f.where, f.severity, f.detail] for f in findings]
        styles = [[None, None, SEVERITY_STYLE[f.severity], None] for f in findings]
        verdict = f"{len(problems)} problem(s) found" if problems else "no problems found"
        print_tables(
            [Table("gpualloc doctor", ["Check", "Where", "Result", "Detail"], rows, styles)],
            footer=[verdict, *(f"  {note}" for note in notes)],
        )
    if problems:
        raise typer.Exit(ExitCode.CHECK_FAILED)


def _ledger_findings(host: Any) -> list[Finding]:
    """Who owns the ledger and whether it can be trusted (:mod:`gpualloc.ledger.trust`)."""
    from gpualloc.checkup import Finding
    from gpualloc.ledger.trust import broker_findings, trust_mode

    mode, line = trust_mode(host)
    if mode == "broker":
        return [
            Finding("ledger", where, sev, detail) for where, sev, detail in broker_findings(host)
        ]
    severity = "note" if mode == "cooperative" else "ok"
    return [Finding("ledger", mode, severity, line)]  # type: ignore[arg-type]


def _json(findings: list[Finding], notes: list[str], source: str) -> dict[str, Any]:
    from gpualloc.model.validation import to_builtins

    return {
        "ok": not any(f.severity == "problem" for f in findings),
        "links_source": source,
        "findings": [to_builtins(f) for f in findings],
        "notes": notes,
    }
