"""``gpualloc metrics``: the figures, the exposition format (promtool), and a
real Prometheus scraping ``metrics --serve`` (skipped, saying why, where it is not installed;
``.ci/run`` installs Debian's ``prometheus``)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from gpualloc.errors import ExitCode
from gpualloc.prometheus import METRICS
from tests.child_processes import end, end_all
from tests.metrics_text import samples, value

MIG_HOST = ("--topology", "dgx-a100-mig")


def test_the_figures_follow_the_ledger(cli) -> None:
    pair = cli(*MIG_HOST, "alloc", "-n", "2", "--hold", "--format", "json")
    lease = json.loads(pair.stdout)["lease"]
    assert cli(*MIG_HOST, "alloc", "--mig", "1g.5gb", "--hold").exit_code == 0
    result = cli(*MIG_HOST, "metrics")
    assert result.exit_code == 0, result.stderr
    found = samples(result.stdout)
    assert value(found, "gpualloc_gpus", state="held") == 2
    assert value(found, "gpualloc_gpus", state="mig") == 3
    assert value(found, "gpualloc_gpus", state="free") == 3
    assert value(found, "gpualloc_mig_devices", state="held") == 1
    assert value(found, "gpualloc_mig_devices", state="free") == 11
    user = lease["user"]
    assert value(found, "gpualloc_leases", source="alloc", user=user) == 2
    assert value(found, "gpualloc_lease_gpus", lease=lease["id"], user=user) == 2
    held = lease["gpus"][0]
    info = [k for k in found if k[0] == "gpualloc_gpu_info" and ("gpu", str(held["index"])) in k[1]]
    assert dict(info[0][1])["state"] == "held" and dict(info[0][1])["lease"] == lease["id"]
    assert value(found, "gpualloc_placements_total", policy="mapa") == 1
    assert value(found, "gpualloc_placements_total", policy="mig-best-fit") == 1
    assert value(found, "gpualloc_decision_seconds_count") == 2
    assert value(found, "gpualloc_decision_seconds_bucket", le="+Inf") == 2
    assert value(found, "gpualloc_wait_seconds_bucket", le="1") == 2  # neither waited
    assert value(found, "gpualloc_queue_length", priority="normal") == 0
    assert value(found, "gpualloc_queue_oldest_wait_seconds") == 0


def test_a_job_that_waited_is_in_the_wait_histogram(cli) -> None:
    from tests.cli_harness import gpualloc_argv

    everything = cli("--topology", "single-gpu", "alloc", "--hold", "--format", "json")
    lease = json.loads(everything.stdout)["lease"]["id"]
    waiter = subprocess.Popen(
        gpualloc_argv("alloc", "--wait", "--hold", topology="single-gpu"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            found = samples(cli("--topology", "single-gpu", "metrics").stdout)
            if value(found, "gpualloc_queue_length", priority="normal") == 1:
                break
            assert time.monotonic() < deadline and waiter.poll() is None
            time.sleep(0.1)
        time.sleep(1.1)
        assert cli("--topology", "single-gpu", "release", lease).exit_code == 0
        waiter.communicate(timeout=60)
    finally:
        end(waiter)
    found = samples(cli("--topology", "single-gpu", "metrics").stdout)
    assert value(found, "gpualloc_wait_seconds_count") == 2
    assert value(found, "gpualloc_wait_seconds_bucket", le="1") == 1  # the first, at once
    assert value(found, "gpualloc_wait_seconds_sum") >= 1.0
    assert value(found, "gpualloc_decision_seconds_count") == 1  # a waiter's start is not timed


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian prometheus)")
def test_promtool_accepts_the_exposition(cli) -> None:
    cli(*MIG_HOST, "alloc", "-n", "2", "--hold")
    text = cli(*MIG_HOST, "metrics").stdout
    checked = subprocess.run(
        ["promtool", "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_every_metric_is_in_the_docs_and_bad_addresses_are_usage_errors(cli) -> None:
    readme = (Path(__file__).parent.parent / "docs" / "metrics.md").read_text()
    for name, (kind, _about) in METRICS.items():
        assert f"| `{name}` | {kind} |" in readme, name
    for bad in ("9400x", ":0", "host:70000"):
        result = cli(*MIG_HOST, "metrics", "--serve", bad)
        assert result.exit_code == ExitCode.USAGE and "[HOST]:PORT" in result.stderr


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="Prometheus is not installed (apt-get install prometheus; .ci/run does)",
)
def test_a_real_prometheus_scrapes_the_served_metrics(cli, tmp_path: Path) -> None:
    from tests.cli_harness import gpualloc_argv

    assert cli(*MIG_HOST, "alloc", "-n", "2", "--hold").exit_code == 0
    ours, theirs = _free_port(), _free_port()
    server = subprocess.Popen(
        gpualloc_argv("metrics", "--serve", f"127.0.0.1:{ours}", topology="dgx-a100-mig"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: gpualloc\n    static_configs: [{{targets: ['127.0.0.1:{ours}']}}]\n"
    )
    prometheus = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{theirs}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        held = _query_until(theirs, 'gpualloc_gpus{state="held"}', timeout_s=60)
        assert held == 2.0
        assert _query_until(theirs, 'up{job="gpualloc"}', timeout_s=10) == 1.0
        start = time.perf_counter()
        with urllib.request.urlopen(f"http://127.0.0.1:{ours}/metrics", timeout=10) as response:
            body = response.read().decode()
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        print(f"one scrape of dgx-a100-mig: {(time.perf_counter() - start) * 1000:.1f} ms")
        assert "gpualloc_placements_total" in body
    finally:
        end_all([prometheus, server], term_s=10)


def _query_until(port: int, query: str, timeout_s: float) -> float:
    """The value Prometheus returns for ``query`` once it has one."""
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                last = json.loads(response.read())
            result = last["data"]["result"]
            if result:
                return float(result[0]["value"][1])
        except OSError:
            pass  # not listening yet
        time.sleep(0.25)
    raise AssertionError(f"Prometheus never answered {query!r}; last reply {last}")
