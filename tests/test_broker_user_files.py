"""Files a user names, through the broker: the root broker opens none of them.

On b2653dd the broker opened the ``--pattern`` path the client typed, as root: ``--pattern
/root/x.json`` printed the first item of a root-only file, and the errors told whether any
path existed (and an honest user's relative ``--pattern my.json`` was looked up in the
broker's own directory). Now the client reads a pattern file with its user's rights and sends
the edges; the broker takes pattern names only, and refuses any other the same way whether or
not such a file exists.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker_harness import RunningBroker, running_broker
from tests.unix_users import UnixUser, UserCommandLine, ensure_user

pytestmark = pytest.mark.slow

ASK = """
import json, sys
from pathlib import Path
from gpualloc.wire.client import BrokerClient

args = {
    "lease_id": "0123456789ab",
    "options": {"policy": "mapa", "count": 2, "pattern": sys.argv[2]},
    "terms": {"source": "alloc", "pid": None, "hold": True, "command": [], "announce": False},
    "wait": None,
}
try:
    print(json.dumps({"answer": BrokerClient(Path(sys.argv[1])).call("alloc", args)}))
except Exception as problem:
    print(json.dumps({"refused": getattr(problem, "message", str(problem))}))
"""


@pytest.fixture(scope="module")
def alice() -> UnixUser:
    return ensure_user("gpualloc-t-alice")


@pytest.fixture
def broker() -> Iterator[RunningBroker]:
    yield from running_broker("dgx1-v100")


@pytest.fixture
def secret() -> Iterator[Path]:
    """A pattern file only root may read (its directory is root's, 0700)."""
    directory = Path(tempfile.mkdtemp(prefix="gpualloc-root-only-"))
    path = directory / "secret.json"
    path.write_text(json.dumps([[0, 1], "root's secret"]))
    yield path
    shutil.rmtree(directory, ignore_errors=True)


def test_the_broker_refuses_a_path_alike_whether_it_exists_or_not(
    alice: UnixUser, broker: RunningBroker, secret: Path
) -> None:
    as_user = UserCommandLine(alice)
    answers = {}
    for name, path in (("exists", secret), ("missing", secret.with_name("none.json"))):
        asked = as_user._run(alice, [as_user.python, "-c", ASK, str(broker.socket), str(path)], {})
        assert asked.returncode == 0, asked.stderr
        answers[name] = json.loads(asked.stdout)
    for said in answers.values():
        assert "refused" in said and "opens no file" in said["refused"], said
        assert "root's secret" not in said["refused"] and "[0, 1]" not in said["refused"]
    assert answers["exists"]["refused"].replace("secret.json", "X") == answers["missing"][
        "refused"
    ].replace("none.json", "X")
    assert broker.ledger().get("leases", []) == []


def test_a_user_pattern_file_is_read_as_that_user(
    alice: UnixUser, broker: RunningBroker, secret: Path
) -> None:
    as_user = UserCommandLine(alice)
    env = {"GPUALLOC_BROKER": str(broker.socket)}
    own = Path(tempfile.mkdtemp(prefix="gpualloc-alice-"))
    try:
        own.chmod(0o755)
        mine = own / "pattern.json"
        mine.write_text("[[0, 1]]")
        mine.chmod(0o644)
        ran = as_user(alice, "run", "-n", "2", "--pattern", str(mine), "--", "true", env=env)
        assert ran.returncode == 0, ran.stderr
        theirs = as_user(alice, "run", "-n", "2", "--pattern", str(secret), "--", "true", env=env)
        assert theirs.returncode not in (0, 1), theirs.stderr
        assert "root's secret" not in theirs.stderr + theirs.stdout
        assert os.access(secret, os.R_OK)  # root's own file is untouched, and still root's
    finally:
        shutil.rmtree(own, ignore_errors=True)
