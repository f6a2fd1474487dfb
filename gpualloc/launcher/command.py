"""The job's command line: resolving the program the way a shell does, and the final argv.

The program is resolved before any GPU is taken, so a typo costs nothing and is reported as a
shell would (127 not found, 126 found but not executable); an empty program name is a usage
error (exit 2), as no file can have it. numactl, when it binds the job, would
report the same failure as its own exit status 1; resolving first keeps the shell's codes.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpualloc.errors import CommandNotExecutable, CommandNotFound, RequestError
from gpualloc.launcher.binding import Binding
from gpualloc.user_files import names_a_file


def resolve_program(program: str, environment: Mapping[str, str]) -> str:
    """The file ``program`` names, searched in the job's ``PATH`` unless it holds a ``/``."""
    if not program:  # no file has that name: a bad command line, not a missing program
        raise RequestError(
            "the command's program is an empty word ('' after --)",
            hint="name the program to run after --, e.g. -- python train.py",
        )
    if "/" in program:
        return _check_executable(program, program)
    search = environment.get("PATH", os.defpath)
    found_unexecutable: Path | None = None
    for directory in search.split(os.pathsep):
        candidate = Path(directory or ".") / program
        if names_a_file(candidate):  # a PATH directory we may not search is skipped, as sh does
            if os.access(candidate, os.X_OK):
                return str(candidate)
            found_unexecutable = found_unexecutable or candidate
    if found_unexecutable is not None:
        return _check_executable(str(found_unexecutable), program)
    raise CommandNotFound(
        f"{program}: command not found", hint="check the spelling, or give the full path"
    )


def _check_executable(path: str, program: str) -> str:
    try:
        info = Path(path).stat()
    except FileNotFoundError:
        raise CommandNotFound(f"{program}: no such file", hint="check the path") from None
    except OSError as exc:
        raise CommandNotExecutable(f"{program}: {exc.strerror}") from None
    if stat.S_ISDIR(info.st_mode):
        raise CommandNotExecutable(f"{program}: is a directory")
    if not os.access(path, os.X_OK):
        raise CommandNotExecutable(
            f"{program}: permission denied",
            hint=f"chmod +x {program}, or run it with its interpreter (e.g. python script.py)",
        )
    return path


def job_argv(command: Sequence[str], binding: Binding) -> list[str]:
    """What gpualloc execs: the numactl prefix of ``binding`` (if any), then the command."""
    return [*binding.argv_prefix(), *command]
