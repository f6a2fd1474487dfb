"""The broker's protocol: what a request may be, and what the broker says back.

- Malformed, oversized, slow and wrong-version requests get an error or a closed connection,
  and the broker keeps serving everyone else.
- An ``alloc`` sent again returns the lease it made; a job has one encoding, the JobOptions
  both clients send.
- What a client writes is bounded where it is said back: escaped in the broker's log, cut in
  an error, and a command cut as a lease keeps it fits a request.

The broker runs as root (tests/broker_harness.py). One user's connections and request rate are
``test_broker_limits.py``'s; a client's words when no broker answers, ``test_broker_clients.py``'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.broker_harness import RunningBroker, hold_request, running_broker

TOPOLOGY = "nvlink-pairs-4gpu"


@pytest.fixture
def broker() -> Iterator[RunningBroker]:
    yield from running_broker(TOPOLOGY)


def _connect(broker: RunningBroker) -> socket.socket:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.settimeout(10)
    connection.connect(str(broker.socket))
    return connection


def _answer(connection: socket.socket) -> dict:
    return json.loads(connection.makefile("rb").readline() or b"{}")


# ---- the protocol's limits (as root) -------------------------------------------------------------


@pytest.mark.parametrize(
    "sent",
    [b"not json\n", b"[1, 2]\n", b'{"v": 1, "op": "format-disk"}\n', b'{"v": 1, "op": "alloc"}\n'],
    ids=["not-json", "not-an-object", "unknown-op", "no-arguments"],
)
def test_a_malformed_request_gets_an_error_and_the_broker_keeps_serving(
    broker: RunningBroker, sent: bytes
) -> None:
    with _connect(broker) as connection:
        connection.sendall(sent)
        answer = _answer(connection)
    assert answer["ok"] is False and answer["error"]["message"]
    assert answer["error"]["code"] in (2, 18)
    assert broker.hello()["protocol"] == 1


def test_an_oversized_request_is_refused_and_its_connection_closed(broker: RunningBroker) -> None:
    with _connect(broker) as connection:
        with contextlib.suppress(BrokenPipeError):  # it may close before reading it all
            connection.sendall(b"x" * (70 * 1024))
        answer = _answer(connection)
        assert "at most 65536 bytes" in answer["error"]["message"]
        assert connection.recv(1) == b""  # closed
    assert broker.hello()["protocol"] == 1


@pytest.mark.slow
def test_a_slow_request_loses_its_connection_and_holds_nobody_up(broker: RunningBroker) -> None:
    with _connect(broker) as slow:
        slow.sendall(b'{"v": 1, "op": ')  # and never the rest
        started = time.monotonic()
        assert broker.call("alloc", hold_request("0123456789ab"))["lease"]["id"]
        assert time.monotonic() - started < 2, "the broker waited for the slow client"
        slow.settimeout(15)
        answer = _answer(slow)
        assert "did not arrive in time" in answer["error"]["message"]


def test_another_protocol_version_is_told_both_versions(broker: RunningBroker) -> None:
    with _connect(broker) as connection:
        connection.sendall(b'{"v": 99, "op": "hello", "args": {}}\n')
        answer = _answer(connection)
    assert answer["error"]["code"] == 18
    assert "protocol 1" in answer["error"]["message"] and "99" in answer["error"]["message"]


def test_alloc_sent_again_returns_the_lease_it_made(broker: RunningBroker) -> None:
    first = broker.call("alloc", hold_request("aaaaaaaaaaaa"))
    again = broker.call("alloc", {**hold_request("aaaaaaaaaaaa"), "retry": True})
    assert again["lease"]["id"] == first["lease"]["id"] == "aaaaaaaaaaaa"
    assert again["lease"]["gpus"] == first["lease"]["gpus"]
    assert len(broker.call("snapshot")["ledger"]["leases"]) == 1


@pytest.mark.parametrize("status", [256, -65, True, "0", 1.5, None])
def test_exited_takes_only_a_status_a_wait_can_give(broker: RunningBroker, status: object) -> None:
    broker.call("alloc", hold_request("dddddddddddd"))
    with pytest.raises(OSError, match="an exit status is 0 to 255"):
        broker.call("exited", {"lease": "dddddddddddd", "status": status})
    assert len(broker.call("snapshot")["ledger"]["leases"]) == 1


def test_adopt_binds_a_lease_only_to_its_holders_child_leading_a_group(
    broker: RunningBroker,
) -> None:
    args = hold_request("eeeeeeeeeeee")
    args["terms"] = {"source": "submit", "pid": os.getpid()}
    broker.call("alloc", args)
    with (
        subprocess.Popen(["sleep", "30"]) as same_group,
        subprocess.Popen(["sleep", "30"], start_new_session=True) as leader,
    ):
        try:
            for refused in (same_group.pid, 1):
                with pytest.raises(OSError, match="is not a child of lease"):
                    broker.call("adopt", {"lease": "eeeeeeeeeeee", "pid": refused})
            broker.call("adopt", {"lease": "eeeeeeeeeeee", "pid": leader.pid})
            (lease,) = broker.call("snapshot")["ledger"]["leases"]
            assert lease["process_group"] == leader.pid
            broker.call("adopt", {"lease": "eeeeeeeeeeee", "pid": leader.pid})  # said again
            with subprocess.Popen(["sleep", "30"], start_new_session=True) as decoy:
                try:  # bound once: a second job cannot take the first one's place
                    with pytest.raises(OSError, match="is bound to its job"):
                        broker.call("adopt", {"lease": "eeeeeeeeeeee", "pid": decoy.pid})
                finally:
                    decoy.kill()
        finally:
            same_group.kill()
            leader.kill()


def test_the_broker_decodes_one_job_encoding(broker: RunningBroker) -> None:
    """A job is the JobOptions both clients send ("options"); the queue's own form of a
    request ("request"), which BrokeredHost sent once, is no way in any more."""
    queued = {"gpus": 1, "sensitive": False}
    args = {"lease_id": "cccccccccccc", "request": queued, "terms": hold_request("c")["terms"]}
    with pytest.raises(OSError, match="bad options"):
        broker.call("alloc", args)
    assert broker.call("snapshot")["ledger"]["leases"] == []


# ---- what a client writes, bounded where it is said back -----------------------------------------


@pytest.mark.slow
def test_the_log_escapes_what_clients_wrote_and_indents_what_follows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A client's words reach the broker's log (an error quoting a request, a user's lease): an
    escape sequence was written to the administrator's terminal as it came, and a newline in a
    message began a line that read as the broker's own."""
    from gpualloc.broker.log import LOG_LINE_LIMIT, log_line

    log_line("error: bad name '\x1b[2J\x07'\n2026-01-01T00:00:00Z gpualloc serve: stopped")
    log_line("x" * 100_000)
    first, forged, long, end = capsys.readouterr().err.split("\n")
    assert first.endswith("gpualloc serve: error: bad name '\\x1b[2J\\x07'")
    assert forged == "    2026-01-01T00:00:00Z gpualloc serve: stopped"
    assert long.endswith("x...") and len(long) < LOG_LINE_LIMIT + 50
    assert end == ""


@pytest.mark.slow
def test_a_transient_refusal_stays_transient_over_the_wire() -> None:
    """A batch job's supervisor asks again after a refusal that may pass (the broker over
    the user's budget, a full queue): the broker's answer must say which refusals those are."""
    from gpualloc.errors import BrokerBusy, NotPermitted, QueueFull
    from gpualloc.wire.protocol import error_from, error_line

    for sent, reason in (
        (QueueFull("full"), "QOSMaxJobsPerUserLimit"),
        (BrokerBusy("busy"), "BrokerBusy"),
    ):
        got = error_from(json.loads(error_line(sent)))
        assert (got.transient, got.exit_code, got.message) == (reason, sent.exit_code, sent.message)
    assert error_from(json.loads(error_line(NotPermitted("no")))).transient is None


def test_request_errors_say_a_clients_long_value_back_cut() -> None:
    """An unknown op, version or priority of 100,000 characters was said back whole."""
    from gpualloc.broker.requests import wait_options
    from gpualloc.errors import GpuallocError
    from gpualloc.wire.protocol import VERSION, parse_request

    long = "x" * 100_000
    for line in [{"v": VERSION, "op": long}, {"v": long, "op": "status"}]:
        with pytest.raises(GpuallocError) as raised:
            parse_request(json.dumps(line).encode())
        assert "xxx...xxx" in raised.value.message and len(raised.value.message) < 250
    with pytest.raises(GpuallocError) as raised:
        wait_options({"priority": [long]}, policy=None)  # type: ignore[arg-type]
    assert len(raised.value.message) < 250
    with pytest.raises(GpuallocError, match="unknown request 'frobnicate'"):
        parse_request(json.dumps({"v": VERSION, "op": "frobnicate"}).encode())


@pytest.mark.slow
def test_a_command_as_a_lease_keeps_it_always_fits_a_request() -> None:
    """Whatever the words (astral characters are twelve bytes of JSON, a byte that is not
    UTF-8 four characters once escaped), the kept command fits a request, and cutting it
    again changes nothing: the broker's check of the client's cut keeps it as sent."""
    from gpualloc.model.printable import MAX_COMMAND_WORDS, lease_command
    from gpualloc.wire.protocol import MAX_REQUEST_BYTES, request_line

    for word in ["\U0001f600" * 200_000, "\udcff" * 200_000, "\x00" * 200_000, ""]:
        kept = lease_command([word] * 1000)
        assert lease_command(kept) == kept
        assert len(kept) <= MAX_COMMAND_WORDS
        assert len(request_line("alloc", {"terms": {"command": list(kept)}})) < MAX_REQUEST_BYTES
