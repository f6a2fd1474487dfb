"""A throw-away single-node Slurm (munged, slurmctld, slurmd) with fake GPUs, for the tests.

Built on the recipe in ``shared/slurm`` (Debian ``slurm-wlm`` 22.05 and ``munge``, as root, no
systemd, no cgroups): a private munge key and socket (``AuthInfo=socket=``), slurmd started
with ``-N localhost`` (the host name is not ``localhost``), GPU device files made with
``mknod c 195 N`` (slurmd ignores plain files), ``SLURM_CONF`` exported to every client. Unlike
the recipe, everything lives in one fresh directory with free ports, so a test run never meets
another cluster's state, and ``gres.conf`` is what ``gpualloc slurm gres-conf`` writes for the
topology under test. The node hooks are ``examples/slurm/gpualloc-hook.sh``, installed the way
its README tells an administrator to (a copy with the settings edited, and three symlinks).

Every daemon is stopped by the pid this harness recorded when it started it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.child_processes import end

ROOT = Path(__file__).parent.parent
HOOK = ROOT / "examples" / "slurm" / "gpualloc-hook.sh"
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "sinfo", "scontrol", "scancel")
WAIT_S = 60.0


def unavailable() -> str | None:
    """Why a Slurm cluster cannot be started here, or None."""
    if os.geteuid() != 0:
        return "starting slurmd and munged needs root"
    missing = [name for name in (*DAEMONS, *CLIENTS) if shutil.which(name) is None]
    if missing:
        return (
            f"Slurm is not installed ({', '.join(missing)} missing; "
            "apt-get install slurm-wlm munge)"
        )
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def gpualloc_program() -> str:
    """The ``gpualloc`` of the interpreter running the tests (hooks get no PATH)."""
    beside = Path(sys.executable).parent / "gpualloc"
    return str(beside) if beside.exists() else shutil.which("gpualloc") or "gpualloc"


@dataclass
class SlurmCluster:
    """One running cluster; ``run`` executes clients (and gpualloc) against it."""

    directory: Path
    topology: Path
    pids: dict[str, int] = field(default_factory=dict)
    _scripts: int = 0
    _processes: list[subprocess.Popen] = field(default_factory=list, repr=False)

    @property
    def state_dir(self) -> Path:
        return self.directory / "gpualloc-state"

    @property
    def env(self) -> dict[str, str]:
        """A client's environment: this cluster, this topology, this ledger, no stray job."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "GPUALLOC_"))}
        env.update(
            SLURM_CONF=str(self.directory / "slurm.conf"),
            GPUALLOC_TOPOLOGY=str(self.topology),
            GPUALLOC_STATE_DIR=str(self.state_dir),
            PATH=f"{Path(gpualloc_program()).parent}:{env.get('PATH', '/usr/bin:/bin')}",
        )
        return env

    def run(self, *argv: str, check: bool = True, **env: str) -> subprocess.CompletedProcess:
        result = subprocess.run(
            list(argv),
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            cwd=self.directory,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"{' '.join(argv)} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
            )
        return result

    # ---- jobs ----------------------------------------------------------------------------------

    def sbatch(self, script: str, *options: str) -> str:
        """Submit ``script`` (the body of a /bin/sh script); returns the job id."""
        self._scripts += 1
        path = self.directory / f"batch-{self._scripts}.sh"
        path.write_text("#!/bin/sh\n" + script)
        out = self.run(
            "sbatch", "--parsable", f"--output={self.directory}/job-%j.out", *options, str(path)
        )
        return out.stdout.strip().split(";")[0]

    def job_state(self, job: str) -> str:
        out = self.run("squeue", "-h", "-j", job, "-o", "%T", check=False)
        return out.stdout.strip() or "GONE"

    def node_state(self) -> str:
        return self.run("sinfo", "-h", "-N", "-o", "%T").stdout.strip()

    def settled_node_state(self) -> str:
        """The node's state once no job is completing (the Epilog runs in between)."""

        def settled() -> str | None:
            state = self.node_state()
            return None if state.startswith("completing") else state

        return str(self.wait_for("the node to settle", settled))

    def host_status(self) -> dict:
        """``gpualloc status --json`` of the host ledger, as a user outside Slurm sees it."""
        return json.loads(self.run("gpualloc", "status", "--json").stdout)

    def hook_log(self) -> str:
        path = self.state_dir / "slurm-hooks.log"
        return path.read_text() if path.exists() else ""

    def wait_for(self, what: str, condition: Callable[[], object]) -> object:
        """Poll ``condition`` until it is truthy; fail with the daemons' logs after WAIT_S."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            value = condition()
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}\n{self.logs()}")

    def logs(self) -> str:
        parts = []
        for name in ("slurmctld.log", "slurmd.log", "munged.log"):
            path = self.directory / "log" / name
            if path.exists():
                tail = "\n".join(path.read_text().splitlines()[-30:])
                parts.append(f"--- {name} (tail)\n{tail}")
        parts.append("--- slurm-hooks.log\n" + self.hook_log())
        return "\n".join(parts)

    # ---- life cycle ----------------------------------------------------------------------------

    @classmethod
    def start(cls, topology: Path) -> SlurmCluster:
        directory = Path(tempfile.mkdtemp(prefix="gpualloc-slurm-", dir="/tmp"))
        cluster = cls(directory, topology)
        try:
            cluster._prepare()
            cluster._start_daemons()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _prepare(self) -> None:
        d = self.directory
        d.chmod(0o755)
        for sub in ("state", "spool", "run", "log", "dev", "munge", "hooks"):
            (d / sub).mkdir()
        (d / "log").chmod(0o1777)  # the TaskProlog runs as the job's user
        hook = d / "hooks" / "gpualloc-hook.sh"
        text = HOOK.read_text()
        text = text.replace("/opt/gpualloc/bin/gpualloc", gpualloc_program())
        text = text.replace("/var/tmp/gpualloc}", f"{self.state_dir}}}")
        text = text.replace(
            "# export GPUALLOC_TOPOLOGY=/etc/gpualloc/node.json",
            f"export GPUALLOC_TOPOLOGY={self.topology}",
        )
        hook.write_text(text)
        hook.chmod(0o755)
        for name in ("prolog", "epilog", "taskprolog"):
            (d / "hooks" / f"gpualloc-{name}").symlink_to(hook)
        gres = self.run(
            "gpualloc", "slurm", "gres-conf", "--node", "localhost", "--device-dir", str(d / "dev")
        ).stdout
        (d / "gres.conf").write_text(gres)
        self._make_device_files(gres)
        (d / "slurm.conf").write_text(self._slurm_conf())

    def _gres_lines(self) -> list[dict[str, str]]:
        text = (self.directory / "gres.conf").read_text()
        return [
            dict(part.split("=", 1) for part in line.split())
            for line in text.splitlines()
            if line.startswith("NodeName=")
        ]

    def _make_device_files(self, gres: str) -> None:
        """Character devices standing in for every file gres.conf names (slurmd checks them)."""
        for line in self._gres_lines():
            for path in (line.get("File") or line["MultipleFiles"]).split(","):
                device = Path(path)
                device.parent.mkdir(exist_ok=True)
                if not device.exists():
                    number = int("".join(c for c in device.name if c.isdigit()))
                    os.mknod(device, 0o600 | 0o020000, os.makedev(195, number))

    def gres_counts(self) -> str:
        """slurm.conf's Gres= for the node: gpu:N, or gpu:TYPE:N per type."""
        types: dict[str | None, int] = {}
        for line in self._gres_lines():
            types[line.get("Type")] = types.get(line.get("Type"), 0) + 1
        return ",".join(f"gpu:{kind}:{n}" if kind else f"gpu:{n}" for kind, n in types.items())

    def _slurm_conf(self) -> str:
        d = self.directory
        node = (
            f"NodeName=localhost NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} RealMemory=1000 "
            f"Gres={self.gres_counts()} State=UNKNOWN"
        )
        return f"""\
ClusterName=gpualloctest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge/munge.socket.2
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
Prolog={d}/hooks/gpualloc-prolog
Epilog={d}/hooks/gpualloc-epilog
TaskProlog={d}/hooks/gpualloc-taskprolog
PrologFlags=Alloc
PrologEpilogTimeout=60
GresTypes=gpu
{node}
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""

    def _spawn(self, name: str, argv: list[str]) -> None:
        with (self.directory / "log" / f"{name}.stdout").open("wb") as log:
            process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.directory
            )
        self.pids[name] = process.pid
        self._processes.append(process)

    def _start_daemons(self) -> None:
        d = self.directory
        key = d / "munge" / "munge.key"
        self.run("mungekey", "--create", f"--keyfile={key}", "--force")
        key.chmod(0o600)
        socket_path = d / "munge" / "munge.socket.2"
        self._spawn(
            "munged",
            [
                "munged", "--foreground", "--force", f"--socket={socket_path}",
                f"--key-file={key}", f"--pid-file={d}/munge/munged.pid",
                f"--seed-file={d}/munge/munged.seed", f"--log-file={d}/log/munged.log",
            ],
        )  # fmt: skip
        self.wait_for("munged's socket", socket_path.exists)
        (d / "munge").chmod(0o755)
        conf = str(d / "slurm.conf")
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", conf])
        self.wait_for("slurmctld", lambda: "UP" in self.run("scontrol", "ping", check=False).stdout)
        self._spawn("slurmd", ["slurmd", "-D", "-N", "localhost", "-f", conf])
        self.wait_for("the node to be idle", lambda: self.node_state().startswith("idle"))

    def stop(self) -> None:
        """TERM (then KILL) exactly the daemons this harness started, newest first."""
        for process in reversed(self._processes):
            end(process, term_s=10)
        shutil.rmtree(self.directory, ignore_errors=True)
