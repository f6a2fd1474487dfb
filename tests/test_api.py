"""gpualloc as a Python library (gpualloc.api): plan, and hold GPUs through the ledger."""

from __future__ import annotations

import os

import pytest

import gpualloc.api as gpualloc
from gpualloc.errors import GpusBusy, NoFeasiblePlacement, RequestError, WaitTimedOut


def test_plan_chooses_like_the_command_line() -> None:
    topology = gpualloc.load_topology("dgx1-v100")
    assert gpualloc.plan(topology, 2).gpus == (0, 3)  # the first NV2 pair
    # NV2 pairs 1-2 and 2-3 tie on socket 0; 2-3 leaves 275 GB/s of NVLink free, 1-2 250
    assert gpualloc.plan(topology, 2, busy={0}).gpus == (2, 3)
    assert gpualloc.plan(topology, 2, policy="baseline").gpus == (0, 1)
    with pytest.raises(NoFeasiblePlacement):
        gpualloc.plan(topology, 9)
    with pytest.raises(RequestError, match="unknown policy"):
        gpualloc.plan(topology, 2, policy="fastest")


def test_hold_records_a_lease_of_this_process_and_releases_it(cli) -> None:
    import json

    topology = gpualloc.load_topology("dgx1-v100")
    with gpualloc.hold(2, topology=topology, name="notebook") as held:
        assert held.gpus == (0, 3) and held.environment["CUDA_VISIBLE_DEVICES"] == "0,3"
        assert held.environment["GPUALLOC_LEASE_ID"] == held.lease.id
        (lease,) = json.loads(cli("--topology", "dgx1-v100", "status", "--json").stdout)["leases"]
        assert lease["pid"] == os.getpid() and lease["name"] == "notebook"
        with pytest.raises(GpusBusy), gpualloc.hold(8, topology=topology):
            pass
        queued = gpualloc.hold(8, topology=topology, wait=True, timeout_s=0.3)
        with pytest.raises(WaitTimedOut), queued:
            pass
    assert json.loads(cli("--topology", "dgx1-v100", "status", "--json").stdout)["leases"] == []


@pytest.mark.parametrize("timeout_s", [-1.0, float("inf"), float("nan"), 366 * 86400 + 1])
def test_hold_takes_a_timeout_the_broker_takes_on_either_ledger(timeout_s: float) -> None:
    """A wait's timeout is what the command line and the broker take (0 to a year), on the
    embedded ledger too: an infinite one reached the broker as JSON it does not read."""
    topology = gpualloc.load_topology("dgx1-v100")
    held = gpualloc.hold(1, topology=topology, wait=True, timeout_s=timeout_s)
    with pytest.raises(RequestError, match="is not a duration"), held:
        pass


def test_hold_keeps_a_time_limit_by_ending_this_process() -> None:
    """``time_limit_s`` is ``--time``: at the limit the holding process gets SIGTERM (the
    file ledger's watch; a broker sends it itself), and a bad one is refused first."""
    import subprocess
    import sys

    program = (
        "import time, gpualloc.api as g\n"
        "with g.hold(1, topology=g.load_topology('dgx1-v100'), time_limit_s=1.0):\n"
        "    time.sleep(30)\n"
    )
    ended = subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=60)
    assert ended.returncode == -15, ended
    assert b"time limit (0:01) ran out" in ended.stderr
    held = gpualloc.hold(1, topology=gpualloc.load_topology("dgx1-v100"), time_limit_s=-1)
    with pytest.raises(RequestError, match="is not a duration"), held:
        pass
