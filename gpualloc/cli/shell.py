"""What gpualloc gives a shell about itself: its completion script, shown or installed where
the shell looks, and its manual page (``--show-completion``, ``--install-completion``,
``--manual``), all generated from the declarations."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from gpualloc.errors import ExitCode, RequestError

SHELLS = ("bash", "zsh", "fish")


def answer(options: dict[str, Any]) -> int:
    """Do what gpualloc's own options ask (in the order --help lists them); the exit status."""
    from gpualloc.cli.output import write_stdout

    if options["manual"]:
        return show_manual()
    if options["install_completion"] is not None:
        install_completion(options["install_completion"])
        return ExitCode.OK
    write_stdout(completion_script(options["show_completion"], "--show-completion"))
    return ExitCode.OK


def completion_script(shell: str, option: str = "--show-completion") -> str:
    """The static completion script for ``shell``, from the declarations."""
    from gpualloc.cli import completion_scripts as scripts

    if shell not in SHELLS:
        import difflib

        from gpualloc.user_files import shown_value

        close = difflib.get_close_matches(shell, SHELLS, n=1)
        raise RequestError(
            f"invalid value for '{option}': {shown_value(shell)}: choose bash, zsh or fish",
            hint=f"did you mean {close[0]}?" if close else None,
        )
    build = {"bash": scripts.bash_script, "zsh": scripts.zsh_script, "fish": scripts.fish_script}
    return build[shell](scripts.command_specs())


def install_completion(shell: str) -> None:
    """Write the static script where the shell looks for completions of its own accord."""
    from gpualloc.cli.output import say

    script = completion_script(shell, "--install-completion")
    home = Path.home()
    data = Path(os.environ.get("XDG_DATA_HOME") or home / ".local" / "share")
    config = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
    target = {
        "bash": data / "bash-completion" / "completions" / "gpualloc",
        "zsh": home / ".zfunc" / "_gpualloc",
        "fish": config / "fish" / "completions" / "gpualloc.fish",
    }[shell]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(script)
    say(f"wrote {target}")
    if shell == "zsh":
        say("add to ~/.zshrc, before compinit: fpath=(~/.zfunc $fpath)")
    say("open a new shell to use it")


def show_manual() -> int:
    """Show the manual page, rendered from the declarations as the installed one is: an
    editable install (pip install -e) installs no data files, so 'man gpualloc' finds nothing
    there."""
    import shutil
    import subprocess

    from gpualloc.cli.manpage import render
    from gpualloc.errors import FileAccessError

    page = render()
    man = shutil.which("man")
    if man is None:
        raise FileAccessError(
            "man is not installed", hint="install it (apt-get install man-db), or read --help"
        )
    sys.stdout.flush()
    return subprocess.run([man, "-l", "-"], input=page, text=True, check=False).returncode
