"""``gpualloc doctor``: check that the host works as its topology and leases say (the checks
are :mod:`gpualloc.checkup`'s)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpualloc.cli.declare import Command, json_flag, value
from gpualloc.errors import ExitCode
from gpualloc.model.printable import count_of

if TYPE_CHECKING:
    from gpualloc.checkup import Finding

SEVERITY_STYLE = {"ok": "green", "note": "yellow", "problem": "red"}


def doctor_command(measured: list[Path] | None, as_json: bool) -> ExitCode | None:
    """Check the host: every NVLink up at its topology's count and generation, every GPU's
    PCIe link at full width, peer-to-peer access working between the GPUs of every lease,
    every job's processes on its own GPUs only and nobody else's on them, no unhealthy GPU.

    Exits 17 when something is wrong, 0 when all is well; notes (an idle GPU's lowered PCIe
    generation, peer-to-peer off between GPUs no lease holds) do not count. Links and
    peer-to-peer are read from NVML (else nvidia-smi) and so only on the host itself; on a
    recorded topology the leases and the faults and processes its file declares are checked.

    Bandwidth: pairs that 'gpualloc calibrate' (or the --measured files) found far below
    their link class, or whose P2P is slower than staged copies, are problems.

    It also says who keeps the ledger: the broker (which must answer; its socket, directory,
    ledger and lock modes are checked), or a shared file that any user who can write its
    directory can forge (cooperative mode, a note), or one user's private file.
    """
    from gpualloc.checkup import lease_findings, link_findings
    from gpualloc.cli.open_ledger import open_host_ledger, warn
    from gpualloc.cli.output import Table, print_json, print_tables
    from gpualloc.cli.topology_view import mixed_models
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
    findings = _ledger_findings(host) + findings + _bandwidth_findings(host, measured or [])
    findings += _mig_findings(host.topology)
    problems = [f for f in findings if f.severity == "problem"]
    if as_json:
        print_json(_json(findings, notes, source))
    else:
        rows = [[f.check, f.where, f.severity, f.detail] for f in findings]
        styles = [[None, None, SEVERITY_STYLE[f.severity], None] for f in findings]
        verdict = f"{count_of(len(problems), 'problem')} found" if problems else "no problems found"
        models = mixed_models(host.topology)
        print_tables(
            [
                Table(
                    "gpualloc doctor" + (f": {models}" if models else ""),
                    ["Check", "Where", "Result", "Detail"],
                    rows,
                    styles,
                    wrap=(1, 3),
                )
            ],
            footer=[verdict, *(f"  {note}" for note in notes)],
        )
    if problems:
        return ExitCode.CHECK_FAILED  # the exit status (main.run)
    return None


def _ledger_findings(host: Any) -> list[Finding]:
    """Who owns the ledger and whether it can be trusted (:mod:`gpualloc.ledger.trust`)."""
    from gpualloc.checkup import Finding

    trust = host.trust(detailed=True)
    if trust.findings:
        return [Finding("ledger", where, sev, detail) for where, sev, detail in trust.findings]
    severity = "note" if trust.mode == "cooperative" else "ok"
    return [Finding("ledger", trust.mode, severity, trust.detail)]  # type: ignore[arg-type]


def _mig_findings(topology: Any) -> list[Finding]:
    """GPUs whose MIG mode changes at their next reset: a note (leases follow the mode now)."""
    from gpualloc.checkup import Finding
    from gpualloc.cli.topology_view import mig_changes

    found = []
    for line in mig_changes(topology):
        where, _, change = line.partition(": ")
        detail = f"{change}; a GPU reset (nvidia-smi -r -i N as root, nothing on it) applies it"
        found.append(Finding("mig", where, "note", detail))
    return found


def _bandwidth_findings(host: Any, files: list[Path]) -> list[Finding]:
    """Degraded pairs in this host's calibration and in the ``--measured`` recordings
    (:mod:`gpualloc.measurements.degraded`)."""
    from gpualloc.checkup import Finding

    found: list[tuple[str, list[Any]]] = []  # degraded.Finding
    saved = _saved_calibration(host)
    if saved is not None:
        found.append(("calibration", saved.findings))
    if files:  # the readers of recordings only then (tests/test_startup_imports.py: doctor)
        found += _recorded_findings(host, files)
    results = []
    for origin, findings in found:
        if not findings:
            detail = "no pair far below its link class, no P2P slower than staged copies"
            results.append(Finding("bandwidth", origin, "ok", detail))
        for finding in findings:
            where = f"GPU {finding.gpus[0]}-{finding.gpus[1]}"
            results.append(Finding("bandwidth", where, "problem", f"{finding.detail} ({origin})"))
    return results


def _recorded_findings(host: Any, files: list[Path]) -> list[tuple[str, list[Any]]]:
    """Degraded pairs in each ``--measured`` recording, by file name."""
    from gpualloc.cli.state import STATE
    from gpualloc.discovery.recorded import read_text
    from gpualloc.errors import TopologyParseError
    from gpualloc.measurements import degraded
    from gpualloc.measurements.recognise import read_recording
    from gpualloc.model.bandwidth import DEFAULT_BANDWIDTH_TABLE

    found = []
    estimated = host.topology.estimated(STATE.bandwidth_override() or DEFAULT_BANDWIDTH_TABLE)
    for path in files:
        recording = read_recording(read_text(path, "measurement file"), source=str(path))
        if recording is None or recording.tool == "nccl-tests":
            raise TopologyParseError(
                "not an output of nvbandwidth or p2pBandwidthLatencyTest", source=str(path)
            )
        findings = degraded.p2p_slower_than_staged(recording)
        if recording.matrices and recording.matrices[0].gpu_count == host.topology.gpu_count:
            findings += degraded.below_link_class(recording, estimated)
        found.append((path.name, findings))
    return found


def _saved_calibration(host: Any) -> Any:
    """This host's calibration, when there is one for these GPUs and this driver."""
    if not host.this_host:
        return None
    from gpualloc.discovery.calibration import calibration_path, saved_for
    from gpualloc.discovery.resolve import host_key
    from gpualloc.errors import GpuallocError

    if not calibration_path().exists():
        return None  # the usual case: no NVML probe for a key
    try:
        return saved_for(host_key())
    except GpuallocError:
        return None


def _json(findings: list[Finding], notes: list[str], source: str) -> dict[str, Any]:
    from gpualloc.model.validation import to_builtins

    return {
        "ok": not any(f.severity == "problem" for f in findings),
        "links_source": source,
        "findings": [to_builtins(f) for f in findings],
        "notes": notes,
    }


DOCTOR = Command(
    "doctor",
    doctor_command,
    options=(
        value(
            "--measured",
            kind="path",
            metavar="FILE",
            repeat=True,
            help="Also check these outputs of nvbandwidth or p2pBandwidthLatencyTest (made "
            "on this host, or on the --topology host) for pairs far below their link class "
            "and P2P slower than staged copies; repeat for several.",
        ),
        json_flag(),
    ),
)
