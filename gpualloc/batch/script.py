"""A batch script's directives: the ``#SBATCH`` lines gpualloc understands, and ``#GPUALLOC``
lines for its own options, so that one script runs under ``gpualloc submit`` and ``sbatch``.

As sbatch(1) reads them: after the ``#!`` line, each line that starts ``#SBATCH`` (or
``#GPUALLOC``) up to the first line that is neither blank nor a comment; on each, words as a
shell splits them, to a ``#`` that starts a comment. The options given on the command line
win over the script's, as they do for sbatch.

The ``#SBATCH`` options that mean something on one host are translated (:data:`SBATCH`):
``--job-name``, ``--time``, ``--output``, ``--error``, ``--signal``, ``--dependency``,
``--array``, ``--chdir``, and the GPU count of ``--gpus``, ``--gpus-per-node``,
``--gpus-per-task`` and ``--gres=gpu[:TYPE]:N``. ``--nodes`` other than 1 is refused (one
host); the rest (a partition, an account, CPU and memory requests: Slurm's business on a
cluster) are ignored, and the user is told which. ``#GPUALLOC`` lines take ``submit``'s own
options (``--sensitive``, ``--policy drb``, ``--min-bandwidth 100``).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import NamedTuple

from gpualloc.errors import RequestError

MAX_SCRIPT_BYTES = 4 * 1024 * 1024
"""Slurm's own bound on a batch script (``max_script_size``, 4 MB by default)."""

SBATCH: dict[str, str] = {
    "-J": "--name", "--job-name": "--name",
    "-t": "--time", "--time": "--time",
    "-o": "--output", "--output": "--output",
    "-e": "--error", "--error": "--error",
    "--signal": "--signal",
    "-d": "--dependency", "--dependency": "--dependency",
    "-a": "--array", "--array": "--array",
    "-D": "--chdir", "--chdir": "--chdir",
    "-G": "-n", "--gpus": "-n", "--gpus-per-node": "-n", "--gpus-per-task": "-n",
    "--gres": "-n",
    "-N": "--nodes", "--nodes": "--nodes",
}  # fmt: skip
"""``#SBATCH`` options gpualloc reads, to ``submit``'s option (``--nodes`` is checked only)."""
FLAGS = frozenset({"--exclusive", "--requeue", "--no-requeue", "-h", "--hold", "-H", "-Q",
                   "--quiet", "-v", "--verbose", "--parsable", "-W", "--wait", "-O",
                   "--overcommit", "--contiguous", "--use-min-nodes", "-s", "--oversubscribe",
                   "--spread-job", "--ignore-pbs", "--test-only"})  # fmt: skip
"""sbatch options that take no value (all ignored here): the others take the next word."""


class Directives(NamedTuple):
    options: list[str]
    """``submit``'s options, the ``#SBATCH`` ones translated, then the ``#GPUALLOC`` ones."""
    ignored: list[str]
    """The ``#SBATCH`` options that have no meaning on one host, as written."""


def is_script(path: Path) -> bool:
    """Whether ``path`` is a batch script: a file that starts ``#!``."""
    try:
        with path.open("rb") as handle:
            return handle.read(2) == b"#!"
    except OSError:
        return False


def read_directives(path: Path) -> Directives:
    """The directives of the script at ``path`` (read with the user's own rights)."""
    from gpualloc.user_files import read_user_text

    text = read_user_text(path, "batch script", max_bytes=MAX_SCRIPT_BYTES)
    options: list[str] = []
    native: list[str] = []
    ignored: list[str] = []
    for number, line in enumerate(text.splitlines()[1:], start=2):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        for prefix, into in (("#SBATCH", options), ("#GPUALLOC", native)):
            rest = stripped[len(prefix) :]
            if stripped.startswith(prefix) and (not rest or rest[0].isspace()):
                try:
                    words = shlex.split(rest, comments=True)
                except ValueError as bad:
                    raise RequestError(f"{path}:{number}: {prefix} line: {bad}") from None
                if into is options:
                    options += _translated(words, f"{path}:{number}", ignored)
                else:
                    native += words
    return Directives(options + native, ignored)


def _translated(words: list[str], where: str, ignored: list[str]) -> list[str]:
    found: list[str] = []
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        name, value = _split(word)
        if name is None:
            raise RequestError(f"{where}: #SBATCH {word!r} is not an option")
        target = SBATCH.get(name)
        if target is None:
            takes_next = value is None and name not in FLAGS and index < len(words)
            if takes_next and not words[index].startswith("-"):
                value = words[index]
                index += 1
            separator = "=" if name.startswith("--") else " "  # as sbatch(1) writes each
            ignored.append(word if value is None else f"{name}{separator}{value}")
            continue
        if value is None:
            if index >= len(words):
                raise RequestError(f"{where}: #SBATCH {name} needs a value")
            value = words[index]
            index += 1
        if target == "--nodes":
            if value not in ("1", "1-1"):
                raise RequestError(
                    f"{where}: #SBATCH {name} {value}: gpualloc runs a job on one host",
                    hint="submit multi-node jobs with sbatch",
                )
            continue
        if target == "-n":
            value = _gpu_count(name, value, where)
        found += [target, value]
    return found


def _split(word: str) -> tuple[str | None, str | None]:
    """An option word as (name, value): ``--time=10``, ``--time``, ``-t10``, ``-t``."""
    if word.startswith("--"):
        name, equals, value = word.partition("=")
        return name, value if equals else None
    if word.startswith("-") and len(word) >= 2:
        return word[:2], word[2:] or None
    return None, None


def _gpu_count(name: str, value: str, where: str) -> str:
    """The GPU count of ``--gpus [TYPE:]N`` or ``--gres gpu[:TYPE]:N[,...]``."""
    if name == "--gres":
        for entry in value.split(","):
            parts = entry.split(":")
            if parts[0] == "gpu":
                count = parts[-1] if len(parts) > 1 else "1"
                break
        else:
            raise RequestError(f"{where}: #SBATCH --gres={value} asks for no GPU")
    else:
        count = value.rpartition(":")[2]
    if not count.isdigit() or int(count) < 1:
        raise RequestError(f"{where}: #SBATCH {name}={value}: the GPU count is not a number")
    return count
