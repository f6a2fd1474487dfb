"""Shell completion and the manual page: generated from the declarations, current, fast, and
working."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
BUILDER = ROOT / "scripts" / "build_docs.py"
HEAVY = ("networkx", "pynvml", "psutil")


def _builder():
    spec = importlib.util.spec_from_file_location("build_docs", BUILDER)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_completions_and_man_page_are_current() -> None:
    for relative, text in _builder().build_all().items():
        assert (ROOT / relative).read_text() == text, (
            f"{relative} is stale: run python scripts/build_docs.py"
        )


def test_the_man_page_documents_every_command_and_option() -> None:
    from gpualloc.cli.commands import GLOBAL_OPTIONS, every_command

    page = (ROOT / "man" / "gpualloc.1").read_text()
    for section in ("NAME", "SYNOPSIS", "DESCRIPTION", "COMMANDS", "OPTIONS", "ENVIRONMENT",
                    "EXIT STATUS", "FILES", "EXAMPLES", "SEE ALSO"):  # fmt: skip
        assert f".SH {section}\n" in page, section
    for path, command in [("", None), *every_command()]:
        if command is not None:
            assert f'.SS "gpualloc {path} [OPTIONS]'.replace("-", "\\-") in page, path
        for opt in command.options if command else GLOBAL_OPTIONS:
            for option in (*opt.names, *opt.negative):
                assert option.replace("-", "\\-") in page, (path, option)
    assert "nvidia\\-smi(1), numactl(8)" in page


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("man") is None, reason="man is not installed")
def test_man_renders_the_page_without_warnings() -> None:
    result = subprocess.run(
        ["man", "--warnings", "-l", str(ROOT / "man" / "gpualloc.1")],
        capture_output=True,
        text=True,
        env={**os.environ, "MANWIDTH": "100", "MANPAGER": "cat", "PAGER": "cat"},
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "EXIT STATUS" in result.stdout and "gpualloc run [OPTIONS]" in result.stdout
    assert result.stderr == ""


BASH_DRIVER = """
source "$1"; shift
COMP_WORDS=("$@"); COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
_gpualloc 2>/dev/null  # compopt refuses to run outside readline's completion
# readline's 'complete -o default': where the function offers nothing, file names
if ((${#COMPREPLY[@]} == 0)) && [[ $(complete -p gpualloc) == *"-o default"* ]]; then
    COMPREPLY=($(compgen -f -- "${COMP_WORDS[COMP_CWORD]}"))
fi
printf '%s\\n' "${COMPREPLY[@]}"
"""
ZSH_DRIVER = """
script=$1; shift
words=("$@"); CURRENT=$#words
_describe() { local -a e; e=(${(P)2}); print -l -- ${e%%:*}; }
compadd() { [[ $1 == -a ]] && print -l -- ${(P)2} || { shift; print -l -- "$@"; }; }
_files() { print -- "<files>"; }
_normal() { print -- "<job:$words[1]>"; }
_command_names() { print -- "<commands>"; }
compset() { cur=${cur#*=}; }
compdef() { }
source $script
_gpualloc
"""
"""Stand-ins for zsh's completion functions that print what they are given: the script's
logic runs as in a shell, without a terminal to press Tab in."""


def _launcher(tmp_path: Path) -> Path:
    """A ``gpualloc`` for the scripts to call back, running this checkout's code."""
    launcher = tmp_path / "bin" / "gpualloc"
    launcher.parent.mkdir(exist_ok=True)
    launcher.write_text(f'#!/bin/sh\nexec {sys.executable} -m gpualloc "$@"\n')
    launcher.chmod(0o755)
    return launcher


def _empty_directory(beside: Path) -> Path:
    """An empty working directory next to ``beside``, for a shell that completes file names."""
    empty = beside.parent / "empty"
    empty.mkdir(exist_ok=True)
    return empty


def _offered(shell: str, words: list[str], state: Path, launcher: Path) -> list[str]:
    """What the committed script of ``shell`` offers for ``words`` (the last one is being
    completed), with ``launcher`` as the gpualloc it was typed as, in an empty directory: bash
    adds the file names of the working directory (a ``dgx1.json`` in the checkout was offered
    for ``--topology dgx``)."""
    script = {"bash": "gpualloc.bash", "zsh": "_gpualloc"}[shell]
    driver = BASH_DRIVER if shell == "bash" else ZSH_DRIVER
    command = (
        [shell, "-c", driver, shell] if shell == "bash" else ["zsh", "-f", "-c", driver, "zsh"]
    )
    result = subprocess.run(
        [*command, str(ROOT / "completions" / script), str(launcher), *words[1:]],
        capture_output=True, text=True, check=False, timeout=60, cwd=_empty_directory(state),
        env={**os.environ, "GPUALLOC_STATE_DIR": str(state)},
    )  # fmt: skip
    assert result.stderr == ""  # zsh's status is its last test's: not a verdict
    return [line for line in result.stdout.splitlines() if line]


def _matching(offered: list[str], prefix: str) -> list[str]:
    """zsh leaves the matching to its own completion system: apply it here (to the value after
    ``=`` of ``--option=value``)."""
    prefix = prefix.partition("=")[2] if prefix.startswith("--") and "=" in prefix else prefix
    return [word for word in offered if word.startswith((prefix, "<"))]


@pytest.mark.slow
@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_the_static_script_completes_commands_options_and_values(
    cli, tmp_path: Path, shell: str
) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    state = tmp_path / "state"
    (tmp_path / "cwd").mkdir()
    assert cli("--topology", "dgx1-v100", "alloc", "--hold", "-n", "2").exit_code == 0
    lease = json.loads(cli("--topology", "dgx1-v100", "status", "--json").stdout)["leases"][0]
    launcher = _launcher(tmp_path)

    def offered(*words: str) -> list[str]:
        return _matching(_offered(shell, ["gpualloc", *words], state, launcher), words[-1])

    files = ["<files>"] if shell == "zsh" else []  # bash's file names: none here start so
    assert offered("--topology", "dgx") == [
        *files, "dgx-a100", "dgx-a100-mig", "dgx1-p100", "dgx1-v100", "dgx2",
    ]  # fmt: skip
    assert offered("plan", "--policy", "mapa") == ["mapa", "mapa-greedy"]
    assert offered("release", "") == [lease["id"]]
    os.mkfifo(state / "ledger@planted.json")  # another user's FIFO must not hang the shell
    assert offered("release", "") == [lease["id"]]
    assert offered("s") == ["submit", "show", "status", "serve", "simulate", "slurm"]
    assert offered("-t", "dgx2", "run", "--numa", "") == ["auto", "bind", "none"]
    assert offered("run", "--mig", "3g") == ["3g.20gb", "3g.40gb", "3g.71gb"]
    assert offered("topo", "s") == ["show"]
    assert offered("topo", "show", "--") == ["--json", "--help"]
    assert offered("plan", "--pattern=t") == [*files, "tree"]  # or a JSON edge-list file
    job = offered("run", "-n", "2", "--", "pyth")
    assert job == ["<job:pyth>"] if shell == "zsh" else "python3" in job
    # 'gpualloc run <TAB>' must not offer the literal word 'command' (the argument's name)
    first = offered("run", "-n", "2", "pyth")
    assert "command" not in first
    assert first == ["<commands>"] if shell == "zsh" else "python3" in first


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
def test_the_fish_script_completes_commands_options_and_values(cli, tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert cli("--topology", "dgx1-v100", "alloc", "--hold", "-n", "2").exit_code == 0
    lease = json.loads(cli("--topology", "dgx1-v100", "status", "--json").stdout)["leases"][0]
    launcher = _launcher(tmp_path)

    def offered(line: str) -> list[str]:
        script = ROOT / "completions" / "gpualloc.fish"
        result = subprocess.run(
            ["fish", "--no-config", "-c", f"source {script}; complete -C '{line}'"],
            capture_output=True, text=True, check=False, timeout=60, cwd=_empty_directory(state),
            env={**os.environ, "GPUALLOC_STATE_DIR": str(state),
                 "PATH": f"{launcher.parent}:{os.environ['PATH']}"},
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return [entry.split("\t")[0] for entry in result.stdout.splitlines()]

    assert offered("gpualloc s") == ["serve", "show", "simulate", "slurm", "status", "submit"]
    assert offered("gpualloc plan --policy mapa") == ["mapa", "mapa-greedy"]
    assert offered("gpualloc release ") == [lease["id"]]
    assert offered("gpualloc topo s") == ["show"]
    assert offered("gpualloc run --numa ") == ["auto", "bind", "none"]


def test_lease_ids_for_completion_import_nothing_heavy(cli, tmp_path: Path) -> None:
    """The one question the scripts ask gpualloc: no parser, msgspec or NVML for it."""
    assert cli("--topology", "dgx1-v100", "alloc", "--hold", "-n", "2").exit_code == 0
    lease = json.loads(cli("--topology", "dgx1-v100", "status", "--json").stdout)["leases"][0]
    probe = (
        "import sys, json\n"
        "from gpualloc.cli.main import run\n"
        "try:\n    run([])\nexcept SystemExit:\n    pass\n"
        f"sys.stderr.write(json.dumps([m for m in {[*HEAVY, 'argparse', 'msgspec']!r} "
        "if m in sys.modules]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False, timeout=60,
        env={**os.environ, "_GPUALLOC_COMPLETE_LEASES": "1",
             "GPUALLOC_STATE_DIR": str(tmp_path / "state")},
    )  # fmt: skip
    assert result.stdout == f"{lease['id']}\tGPU 0,3, {lease['user']}\n"
    assert json.loads(result.stderr) == []


def test_lease_ids_wait_for_no_broker_that_is_not_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Tab on a host whose configured broker is stopped (its socket gone) offers the state
    directory's leases at once: it waited a second, the client's wait for a restarting
    broker (``benchmarks/bench_startup.py`` timed every lease-id Tab at a second)."""
    from gpualloc.cli.complete import lease_ids
    from gpualloc.wire import client

    monkeypatch.setenv("GPUALLOC_BROKER", str(tmp_path / "stopped.sock"))
    monkeypatch.setenv("GPUALLOC_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(client.time, "sleep", lambda s: pytest.fail("a Tab waited"))
    assert lease_ids("") == []


@pytest.mark.slow
def test_install_completion_writes_the_shells_file(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "data")}
    result = subprocess.run(
        [sys.executable, "-m", "gpualloc", "--install-completion", "bash"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    installed = tmp_path / "data" / "bash-completion" / "completions" / "gpualloc"
    assert installed.read_text() == (ROOT / "completions" / "gpualloc.bash").read_text()
    assert f"wrote {installed}" in result.stderr
    shown = subprocess.run(
        [sys.executable, "-m", "gpualloc", "--show-completion", "fish"],
        capture_output=True, text=True, env=env, check=False, timeout=120,
    )  # fmt: skip
    assert shown.stdout == (ROOT / "completions" / "gpualloc.fish").read_text()
    refused = subprocess.run(
        [sys.executable, "-m", "gpualloc", "--show-completion", "tcsh"],
        capture_output=True, text=True, env=env, check=False, timeout=120,
    )  # fmt: skip
    assert refused.returncode == 2 and "choose bash, zsh or fish" in refused.stderr


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("man") is None, reason="man is not installed")
def test_manual_option_shows_the_installed_page(tmp_path: Path) -> None:
    """After an editable install 'man gpualloc' finds no page (pip installs
    no data files there); --manual shows the one a wheel installs."""
    env = {**os.environ, "MANWIDTH": "100", "MANPAGER": "cat", "PAGER": "cat"}
    shown = subprocess.run(
        [sys.executable, "-m", "gpualloc", "--manual"],
        capture_output=True, text=True, env=env, check=False, timeout=60,
    )  # fmt: skip
    committed = subprocess.run(
        ["man", "-l", str(ROOT / "man" / "gpualloc.1")],
        capture_output=True, text=True, env=env, check=False, timeout=60,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "EXIT STATUS" in shown.stdout and shown.stdout == committed.stdout


# ---- every option, through the real shells ---------------------------------------------------

FREE_TEXT = {
    "--num-gpus", "--exclude", "--require", "--drb-weights", "--mem", "--busy", "--free",
    "--gpus", "--min-utility", "--min-bandwidth", "--sm-share", "--name", "--time", "--signal",
    "--timeout", "--max-bypass", "--pid", "--grace", "--interval", "--idle", "--serve", "--sharing",
    "--gpu-busy", "--start", "--limit", "--load", "--seed", "--size-mib", "--repeats", "--node",
    "--threads-per-core", "--gpu-type", "--output", "--error", "--dependency", "--array", "--since",
}  # fmt: skip
"""Options whose value is free text (a number, a GPU list, a duration, a name): a Tab offers
nothing for them, and never file names."""
PLANTED = {"afile.txt", "adir"}
"""What the directory the shells complete in holds: a file and a directory."""


def _every_value() -> list[tuple[list[str], set[str]]]:
    """Each option that takes a value (and each path argument), as the words typed before a
    Tab, and what the Tab must offer there, read from the declaration: its ``completion``
    function's values (with file names where a file may be given instead), file or directory
    names for a path, nothing for free text. An option that is none of these fails here."""
    from gpualloc.cli import complete
    from gpualloc.cli.commands import GLOBAL_OPTIONS, every_command
    from gpualloc.cli.completion_scripts import completer

    cases = []

    def expected(names: tuple[str, ...], kind: str, metavar: str | None, completion: str | None):
        function = completer(completion)
        shown = (metavar or "").strip("[].")
        if function is not None:
            offered = {value for value, _ in function("")}
            if function in (complete.topologies, complete.patterns):
                offered |= PLANTED
            return offered
        if shown == "DIR":
            return {"adir"}
        if kind == "path" or shown in ("FILE", "PATH", "OUT"):
            return PLANTED
        long_name = next(name for name in names if name.startswith("--"))
        assert long_name in FREE_TEXT, (
            f"{long_name}: neither a choice (completion=), a path, nor free text"
        )
        return set()

    for path, command in [("", None), *every_command()]:
        words = path.split()
        for opt in command.options if command else GLOBAL_OPTIONS:
            if opt.takes_value:
                offered = expected(opt.names, opt.kind, opt.metavar, opt.completion)
                cases += [([*words, name], offered) for name in opt.names]
        argument = command.argument if command else None
        if argument is not None and argument.dest in ("job", "jobs"):
            cases.append((words, set()))  # a job's id: free text, as a lease's number is
        elif argument is not None and argument.dest not in ("command", "leases"):
            # the job of 'run' and release's lease ids are tested above
            offered = expected((), argument.kind, argument.metavar, argument.completion)
            cases.append((words, offered))
    return cases


BASH_WALK = """
source "$1"
_gpualloc_case() {
    COMP_WORDS=(gpualloc "$@" ''); COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 )); COMPREPLY=()
    _gpualloc 2>/dev/null  # compopt refuses to run outside readline's completion
    if ((${#COMPREPLY[@]} == 0)) && [[ $(complete -p gpualloc) == *"-o default"* ]]; then
        COMPREPLY=($(compgen -f -- ''))  # readline's 'complete -o default'
    fi
    printf '%s\\n' "${COMPREPLY[@]}" '<end>'
}
"""


class ZshSession:
    """An interactive zsh on a pseudo-terminal, its completion system loaded by compinit, in
    which a Tab is pressed: what it offers is what zsh's own functions (``_describe``,
    ``_files``) hand to ``compadd``, printed by a wrapper around it. ``before`` runs before
    compinit (``fpath=...``), ``after`` after it (``source ...``); ``home`` is its home
    directory, and where it runs unless ``cwd`` is given."""

    INIT = r"""
PROMPT='' RPROMPT='' PS2=''
{before}
autoload -Uz compinit && compinit -u -D
zstyle ':completion:*' list-grouped false
zstyle ':completion:*' insert-tab false
zstyle ':completion:*' menu no
bindkey '^I' complete-word
# _main_complete empties these arrays before it calls them: each puts itself back.
_capture_begin() {{ compprefuncs=(_capture_begin); print -rn -- $'\n<<<BEGIN>>>\n' }}
_capture_end() {{ comppostfuncs=(_capture_end); print -rn -- $'\n<<<END>>>\n' }}
compprefuncs=(_capture_begin) comppostfuncs=(_capture_end)
compadd() {{
    if [[ ${{@[1,(i)(-|--)]}} == *-(O|A|D)\ * ]]; then builtin compadd "$@"; return; fi
    local -a hits
    builtin compadd -A hits "$@"
    (( $#hits )) && print -rl -- '' "${{hits[@]/#/<<<MATCH>>>}}"
    builtin compadd "$@"
}}
{after}
"""

    def __init__(
        self, home: Path, *, cwd: Path | None = None, before: str = "", after: str = "", env=None
    ) -> None:
        import pty

        home.mkdir(exist_ok=True)
        init = home / "init.zsh"
        init.write_text(self.INIT.format(before=before, after=after))
        self.output = b""
        self.main, child = pty.openpty()
        self.process = subprocess.Popen(
            ["zsh", "-f", "-i"], stdin=child, stdout=child, stderr=child, cwd=cwd or home,
            env={**os.environ, "TERM": "dumb", "HOME": str(home), "PS1": "", **(env or {})},
        )  # fmt: skip
        os.close(child)
        os.write(self.main, f"source {init}; print READY$((6 * 7))\n".encode())
        self.started = self._read_until(b"READY42").decode(errors="replace")

    def _read_until(self, marker: bytes) -> bytes:
        import select
        import time

        deadline = time.monotonic() + 30
        while marker not in self.output:
            ready, _, _ = select.select([self.main], [], [], deadline - time.monotonic())
            assert ready, f"zsh did not answer: {self.output[-800:]!r}"
            self.output += os.read(self.main, 65536)
        head, _, self.output = self.output.partition(marker)
        return head

    def tab(self, line: str) -> list[str]:
        """What a Tab at the end of ``line`` offers."""
        os.write(self.main, line.encode() + b"\t")
        self._read_until(b"<<<BEGIN>>>")
        shown = self._read_until(b"<<<END>>>").decode(errors="replace").replace("\r", "")
        os.write(self.main, b"\x15")  # kill the line for the next one
        rows = shown.split("\n")
        return [row.partition("<<<MATCH>>>")[2] for row in rows if "<<<MATCH>>>" in row]

    def close(self) -> None:
        os.write(self.main, b"exit\n")
        self.process.wait(timeout=30)
        os.close(self.main)


def _walk_in(shell: str, cases: list[tuple[list[str], set[str]]], where: Path) -> list[set[str]]:
    """What ``shell`` offers for each case, the committed script loaded as users load it."""
    if shell == "bash":
        lines = [BASH_WALK] + [
            "_gpualloc_case " + " ".join(shlex.quote(w) for w in words) for words, _ in cases
        ]
        result = subprocess.run(
            ["bash", "-c", "\n".join(lines), "bash", str(ROOT / "completions" / "gpualloc.bash")],
            capture_output=True, text=True, check=True, timeout=120, cwd=where,
        )  # fmt: skip
        answers = result.stdout.split("<end>\n")[:-1]
    elif shell == "fish":
        queries = where.parent / "queries.txt"
        queries.write_text("".join(f"gpualloc {' '.join(words)} \n" for words, _ in cases))
        script = ROOT / "completions" / "gpualloc.fish"
        result = subprocess.run(
            ["fish", "--no-config", "-c", f"source {script}; while read -l line; "
             "complete -C \"$line\"; echo '<end>'; end < " + str(queries)],
            capture_output=True, text=True, check=True, timeout=120, cwd=where,
        )  # fmt: skip
        answers = result.stdout.split("<end>\n")[:-1]
    else:
        session = ZshSession(
            where.parent / "home", cwd=where, before=f"fpath=({ROOT / 'completions'} $fpath)"
        )
        try:
            answers = ["\n".join(session.tab(f"gpualloc {' '.join(w)} ")) for w, _ in cases]
        finally:
            session.close()
    assert len(answers) == len(cases)
    return [
        {line.split("\t")[0].rstrip("/") for line in answer.splitlines() if line}
        for answer in answers
    ]


@pytest.mark.slow
@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_every_option_offers_its_choices_or_files_or_nothing(tmp_path: Path, shell: str) -> None:
    """``alloc --format <Tab>`` offered file names: every option with a fixed set of values
    offers those, every option taking a file offers files (a directory, directories), and
    every other offers nothing, in each shell, walked from the command declarations."""
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    where = tmp_path / "cwd"
    (where / "adir").mkdir(parents=True)
    (where / "afile.txt").write_text("")
    cases = _every_value()
    wrong = [
        f"gpualloc {' '.join(words)} <Tab>: {sorted(got)}, not {sorted(expected)}"
        for (words, expected), got in zip(cases, _walk_in(shell, cases, where), strict=True)
        if got != expected
    ]
    assert not wrong, "\n".join(wrong)
    assert (["alloc", "--format"], {"ids", "env", "json"}) in cases


def test_descriptions_are_whole_sentences_or_cut_at_a_word_with_an_ellipsis() -> None:
    """zsh and fish showed 'the links betwee' and 'e.g.' beside commands and options: each
    description is the help text's first sentence, or its first words and an ellipsis."""
    from gpualloc.cli.commands import COMMANDS, GLOBAL_OPTIONS, every_command, load
    from gpualloc.cli.completion_scripts import command_specs
    from gpualloc.cli.declare import Group

    helps: dict[str, list[str]] = {}
    for _, command in [("", None), *every_command()]:
        for opt in command.options if command else GLOBAL_OPTIONS:
            for name in opt.names:
                helps.setdefault(name, []).append(" ".join(opt.help.split()))
        if command is not None:
            helps.setdefault(command.name, []).append(" ".join(command.summary.split()))
    for entry in COMMANDS:
        helps.setdefault(entry.name, []).append(entry.summary)
        declared = load(entry)
        if isinstance(declared, Group):
            helps[entry.name].append(" ".join(declared.help.split()))
    shown = [
        (name, about)
        for spec in command_specs()
        for name, about in [
            *spec.subcommands,
            *((o.names[0], o.about) for o in spec.options if o.names[0] != "--help"),
        ]
    ]
    assert len(shown) > 150
    for name, about in shown:
        if about.startswith("The opposite of --"):
            continue  # --insensitive, --background: the help text is the other name's
        assert len(about) <= 100, (name, about)
        if about.endswith("…"):
            stem = about[:-1]
            assert any(
                text.startswith(stem) and not text[len(stem)].isalnum() for text in helps[name]
            ), (name, about)  # cut after a whole word
        else:
            assert any(text.startswith(about) for text in helps[name]), (name, about)
            assert about.endswith((".", ")")) or about in helps[name], (name, about)
            assert about.count("(") == about.count(")"), (name, about)  # no '(e.g.' cut
            assert not about.endswith(("e.g.", "i.e.")), (name, about)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
@pytest.mark.parametrize("loaded", ["sourced", "autoloaded"])
def test_zsh_completes_when_the_script_is_sourced_or_autoloaded(
    tmp_path: Path, loaded: str
) -> None:
    """``source <(gpualloc --show-completion zsh)`` in ~/.zshrc did nothing but print errors:
    a sourced script must register itself with compdef; an autoloaded one (from $fpath)
    completes at once. Both, in an interactive zsh with compinit."""
    launcher = _launcher(tmp_path)
    path = {"PATH": f"{launcher.parent}:{os.environ['PATH']}"}
    if loaded == "sourced":
        setup = {"after": "source <(gpualloc --show-completion zsh)"}
    else:
        functions = tmp_path / "functions"
        functions.mkdir()
        shown = subprocess.run(
            [str(launcher), "--show-completion", "zsh"], capture_output=True, text=True,
            check=True, timeout=60, env={**os.environ, **path},
        )  # fmt: skip
        (functions / "_gpualloc").write_text(shown.stdout)
        setup = {"before": f"fpath=({functions} $fpath)"}
    session = ZshSession(tmp_path / "home", env=path, **setup)
    try:
        assert "_gpualloc" not in session.started  # no error while loading it
        assert session.tab("gpualloc alloc --format ") == ["ids", "env", "json"]
        assert session.tab("gpualloc s") == [
            "submit",
            "show",
            "status",
            "serve",
            "simulate",
            "slurm",
        ]
        assert session.tab("gpualloc run --numa ") == ["auto", "bind", "none"]
    finally:
        session.close()


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_says_how_to_load_completion_when_compinit_has_not_run() -> None:
    result = subprocess.run(
        ["zsh", "-f", "-c", f"source {ROOT / 'completions' / '_gpualloc'}"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert result.stderr.startswith("gpualloc: zsh's completion is not loaded")
    assert "compinit" in result.stderr and result.stderr.count("\n") == 1
