"""Static shell completion for bash, zsh and fish, generated from the command declarations.

A completion that ran gpualloc on every Tab started a Python process a press. These carry the
command tree instead: each command's subcommands and options, which options take a value, and
what each value is: one of the values known in advance (patterns, policies, NUMA modes, scores,
priorities, MIG profiles, formats, bundled topology names: the option's ``completion``
function in :mod:`gpualloc.cli.complete`), a file or a directory (a path option, or one whose
metavar says FILE, PATH or DIR), or free text (nothing is offered: never file names for a
number). A Tab costs no process, except where the answer lives in the ledger: the lease ids of
``release`` come from ``gpualloc`` itself with ``_GPUALLOC_COMPLETE_LEASES=1`` set, a path that
imports only the configuration and the file reader (:func:`gpualloc.cli.main.run`).

``scripts/build_docs.py`` writes them to ``completions/``; a test fails when they are stale, and
others drive the scripts through bash, zsh and fish and check what they offer for every option.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

from gpualloc.cli.declare import Arg, Command, Group, Opt

LEASES_VARIABLE = "_GPUALLOC_COMPLETE_LEASES"
"""Set by the scripts to ask ``gpualloc`` for the lease ids (``id<TAB>who holds what`` lines)."""
DYNAMIC_LEASES = "@leases"
FILES = "@files"
DIRECTORIES = "@dirs"
"""Values marked so: lease ids asked of gpualloc; file names; directory names."""
DESCRIPTION_CHARS = 100
"""The longest description a menu shows beside a command or an option."""
ABBREVIATIONS = ("e.g.", "i.e.", "cf.", "vs.")
"""Words whose full stop ends no sentence."""
HELP_NAMES = ("--help", "-h")


class OptionSpec(NamedTuple):
    names: tuple[str, ...]
    about: str
    takes_value: bool
    values: tuple[str, ...] = ()
    """Values offered after it; may include :data:`FILES` or :data:`DIRECTORIES`."""


class CommandSpec(NamedTuple):
    path: str
    """``""`` for gpualloc itself, else ``run``, ``topo show``, ..."""
    about: str
    subcommands: tuple[tuple[str, str], ...]
    options: tuple[OptionSpec, ...]
    arguments: str
    """What its arguments are: "" (none or any word), :data:`DYNAMIC_LEASES`, :data:`FILES`,
    or "command" (the job of ``run``)."""


def command_specs() -> list[CommandSpec]:
    """Every command of gpualloc, depth first (each command module imported)."""
    from gpualloc.cli.commands import COMMANDS, GLOBAL_OPTIONS, HELP, load

    specs = [
        CommandSpec(
            "",
            _first_line(HELP),
            tuple((e.name, _first_line(e.summary)) for e in COMMANDS),
            _options(GLOBAL_OPTIONS),
            "",
        )
    ]
    for entry in COMMANDS:
        declared = load(entry)
        if isinstance(declared, Group):
            below = tuple((c.name, _first_line(c.summary)) for c in declared.commands)
            specs.append(
                CommandSpec(entry.name, _first_line(declared.help), below, _options(()), "")
            )
            specs += [_command(f"{entry.name} {c.name}", c) for c in declared.commands]
        else:
            specs.append(_command(entry.name, declared))
    return specs


def _command(path: str, command: Command) -> CommandSpec:
    arguments = _argument_kind(command.argument, command) if command.argument else ""
    return CommandSpec(path, _first_line(command.help), (), _options(command.options), arguments)


def _options(options: Iterable[Opt]) -> tuple[OptionSpec, ...]:
    specs = []
    for opt in options:
        specs.append(OptionSpec(opt.names, _first_line(opt.help), opt.takes_value, _values(opt)))
        if opt.negative:  # --insensitive: the help text is --sensitive's
            opposite = f"The opposite of {opt.names[-1]}."
            specs.append(OptionSpec(opt.negative, opposite, False))
    specs.append(OptionSpec(HELP_NAMES, "Show the help and exit.", False))
    return tuple(specs)


def completer(name: str | None) -> Callable[[str], list[tuple[str, str]]] | None:
    """The function of :mod:`gpualloc.cli.complete` an option names for its values."""
    if name is None:
        return None
    from gpualloc.cli import complete

    function: Callable[[str], list[tuple[str, str]]] = getattr(complete, name)
    return function


def _values(opt: Opt) -> tuple[str, ...]:
    from gpualloc.cli import complete

    function = completer(opt.completion)
    if function is None:
        path = path_kind(opt.kind, opt.metavar)
        return (path,) if path else ()
    if function is complete.lease_ids:
        return (DYNAMIC_LEASES,)
    values = tuple(value for value, _ in function(""))
    # A bundled topology or pattern is named, or read from a file.
    also_files = function in (complete.topologies, complete.patterns)
    return (*values, FILES) if also_files else values


def path_kind(kind: str, metavar: str | None) -> str | None:
    """:data:`FILES` or :data:`DIRECTORIES` for a value that is a path (its kind says so, or
    the metavar its help shows), else None."""
    shown = (metavar or "").strip("[].")
    if shown == "DIR":
        return DIRECTORIES
    return FILES if kind == "path" or shown in ("FILE", "PATH") else None


def _argument_kind(argument: Arg, command: Command) -> str:
    if argument.completion == "lease_ids":
        return DYNAMIC_LEASES
    return "command" if command.job_argv else path_kind(argument.kind, argument.metavar) or ""


def _first_line(text: str) -> str:
    """The first sentence of a help text, on one line, for a completion menu: cut at a word,
    with an ellipsis, where it is longer than :data:`DESCRIPTION_CHARS`."""
    line = _first_sentence(" ".join(text.split("\n\n")[0].split()))
    if len(line) <= DESCRIPTION_CHARS or " " not in line[:DESCRIPTION_CHARS]:
        return line  # a single word that long is shown whole
    return line[:DESCRIPTION_CHARS].rsplit(" ", 1)[0].rstrip(",;:(") + "…"


def _first_sentence(line: str) -> str:
    """``line`` up to its first full stop before a space, outside brackets and not that of an
    abbreviation (``(e.g. 3,1)`` ends no sentence)."""
    depth = 0
    for i, char in enumerate(line):
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(char, 0)
        if char != "." or depth > 0 or line[i + 1 : i + 2] != " ":
            continue
        if line[: i + 1].rsplit(" ", 1)[-1].lstrip("(") not in ABBREVIATIONS:
            return line[: i + 1]
    return line


# ---- bash ------------------------------------------------------------------------------------


def bash_script(specs: list[CommandSpec]) -> str:
    commands, options, takes, values, arguments = [], [], [], [], []
    for spec in specs:
        key = _shell_word(spec.path)
        if spec.subcommands:
            commands.append(f"        {key}) echo {' '.join(n for n, _ in spec.subcommands)} ;;")
        names = " ".join(name for option in spec.options for name in option.names)
        options.append(f"        {key}) echo '{names}' ;;")
        for option in spec.options:
            if not option.takes_value:
                continue
            keys = "|".join(_shell_word(f"{spec.path}|{name}") for name in option.names)
            takes.append(keys)
            if option.values:
                values.append(f"        {keys}) _gpualloc_offer {_bash_values(option.values)} ;;")
        if spec.arguments == "command":  # the job of 'run': command names, not the word
            arguments.append(f'        {key}) COMPREPLY+=($(compgen -c -- "$cur")) ;;')
        elif spec.arguments:
            arguments.append(f"        {key}) _gpualloc_offer {_bash_values((spec.arguments,))} ;;")
    return _BASH.format(
        leases=LEASES_VARIABLE,
        commands="\n".join(commands),
        options="\n".join(options),
        takes="|".join(takes),
        values="\n".join(values),
        arguments="\n".join(arguments),
    )


def _bash_values(values: tuple[str, ...]) -> str:
    return " ".join(_shell_word(v) for v in values)


def _shell_word(text: str) -> str:
    """``text`` as one POSIX shell word in single quotes (bash and zsh read it alike)."""
    return "'" + text.replace("'", "'\\''") + "'"


_BASH = """\
# bash completion for gpualloc. Generated by scripts/build_docs.py from the command
# declarations (gpualloc/cli/completion_scripts.py); do not edit.

_gpualloc_commands() {{
    case $1 in
{commands}
    esac
}}

_gpualloc_options() {{
    case $1 in
{options}
    esac
}}

_gpualloc_takes_value() {{
    case "$1|$2" in
        {takes}) return 0 ;;
    esac
    return 1
}}

# Offer words matching $cur; @files and @dirs add file or directory names, @leases asks
# gpualloc for the lease ids. An option of free text offers nothing (no file names).
_gpualloc_offer() {{
    local word
    for word in "$@"; do
        case $word in
            @files) _gpualloc_paths -f ;;
            @dirs) _gpualloc_paths -d ;;
            @leases) COMPREPLY+=($(compgen -W "$({leases}=1 "$_gpualloc_program" 2>/dev/null \\
                | cut -f1)" -- "$cur")) ;;
            "$cur"*) COMPREPLY+=("$word") ;;
        esac
    done
}}

# File (-f) or directory (-d) names matching $cur, a word each even with a space in it;
# readline quotes them and marks directories with a slash (-o filenames).
_gpualloc_paths() {{
    local IFS=$'\n'
    compopt -o filenames 2>/dev/null
    COMPREPLY+=($(compgen "$1" -- "$cur"))
}}

_gpualloc_values() {{
    case "$1|$2" in
{values}
    esac
}}

_gpualloc_arguments() {{
    case $1 in
{arguments}
    esac
}}

_gpualloc() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD - 1]}}
    local path="" word i skip=0
    _gpualloc_program=${{COMP_WORDS[0]}}
    COMPREPLY=()
    for ((i = 1; i < COMP_CWORD; i++)); do
        word=${{COMP_WORDS[i]}}
        if ((skip)); then skip=0; continue; fi
        if [[ $path == run && $word == -- ]]; then
            _gpualloc_job $((i + 1)); return
        fi
        if [[ $word == -* ]]; then
            [[ $word != *=* ]] && _gpualloc_takes_value "$path" "$word" && skip=1
            continue
        fi
        if [[ " $(_gpualloc_commands "$path") " == *" $word "* ]]; then
            path=${{path:+$path }}$word
        elif [[ $path == run ]]; then
            _gpualloc_job "$i"; return
        fi
    done
    if [[ $cur == --*=* ]]; then
        prev=${{cur%%=*}}; cur=${{cur#*=}}
        _gpualloc_values "$path" "$prev"; return
    fi
    if _gpualloc_takes_value "$path" "$prev"; then
        _gpualloc_values "$path" "$prev"; return
    fi
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$(_gpualloc_options "$path")" -- "$cur")); return
    fi
    COMPREPLY=($(compgen -W "$(_gpualloc_commands "$path")" -- "$cur"))
    _gpualloc_arguments "$path"
}}

# The job of 'gpualloc run', from word $1 on: what bash-completion completes for that
# command line (its _command_offset, as for sudo), else a command name, then file names.
_gpualloc_job() {{
    if declare -F _command_offset >/dev/null; then
        _command_offset "$1"
    elif (($1 == COMP_CWORD)); then
        COMPREPLY=($(compgen -c -- "$cur"))
    else
        _gpualloc_paths -f
    fi
}}

complete -F _gpualloc gpualloc
"""


# ---- zsh -------------------------------------------------------------------------------------


def zsh_script(specs: list[CommandSpec]) -> str:
    tables: dict[str, list[str]] = {n: [] for n in ("commands", "options", "takes", "values")}
    arguments = []
    for spec in specs:
        key = f"@{spec.path}"  # zsh refuses an empty key
        if spec.subcommands:
            entries = [f"{n}:{_colon(a)}" for n, a in spec.subcommands]
            tables["commands"].append(f"    {_shell_word(key)} {_zsh_lines(entries)}")
        entries = [f"{name}:{_colon(o.about)}" for o in spec.options for name in o.names]
        tables["options"].append(f"    {_shell_word(key)} {_zsh_lines(entries)}")
        for option in spec.options:
            for name in option.names if option.takes_value else ():
                pair = _shell_word(f"{key}|{name}")
                tables["takes"].append(f"    {pair} 1")
                if option.values:
                    tables["values"].append(f"    {pair} {_zsh_lines(list(option.values))}")
        if spec.arguments:
            arguments.append(f"    {_shell_word(key)} {_shell_word(spec.arguments)}")
    return _ZSH.format(
        leases=LEASES_VARIABLE,
        arguments="\n".join(arguments),
        **{name: "\n".join(lines) for name, lines in tables.items()},
    )


def _zsh_lines(items: list[str]) -> str:
    """``items`` as one zsh word, a line each (``$'a\nb'``; split again with ``(f)``)."""
    escaped = [item.replace("\\", "\\\\").replace("'", "\\'") for item in items]
    return "$'" + "\\n".join(escaped) + "'"


def _colon(text: str) -> str:
    return text.replace(":", "\\:")


_ZSH = """\
#compdef gpualloc
# zsh completion for gpualloc. Generated by scripts/build_docs.py from the command
# declarations (gpualloc/cli/completion_scripts.py); do not edit.

# Keys: @PATH (@ alone for gpualloc itself) and @PATH|OPTION; values: a line per entry.
typeset -gA _gpualloc_commands _gpualloc_options _gpualloc_takes _gpualloc_values
typeset -gA _gpualloc_arguments
_gpualloc_commands=(
{commands}
)
_gpualloc_options=(
{options}
)
_gpualloc_takes=(
{takes}
)
_gpualloc_values=(
{values}
)
_gpualloc_arguments=(
{arguments}
)

# Offer the values of a line list; @files and @dirs add file or directory names, @leases
# asks gpualloc. An option of free text offers nothing (no file names).
_gpualloc_offer() {{
    local word
    local -a plain leases
    for word in ${{(f)1}}; do
        case $word in
            @files) _files ;;
            @dirs) _files -/ ;;
            @leases)
                leases=(${{(f)"$({leases}=1 $_gpualloc_program 2>/dev/null)"}})
                leases=(${{leases//:/\\\\:}})
                leases=(${{leases//$'\\t'/:}})
                _describe 'lease' leases ;;
            *) plain+=($word) ;;
        esac
    done
    (( $#plain )) && compadd -a plain
}}

_gpualloc() {{
    local path="" word key i skip=0 cur=$words[CURRENT] prev=$words[CURRENT-1]
    local -a entries
    _gpualloc_program=$words[1]
    for ((i = 2; i < CURRENT; i++)); do
        word=$words[i]
        if ((skip)); then skip=0; continue; fi
        if [[ $path == run && $word == -- ]]; then
            shift $i words; ((CURRENT -= i)); _normal; return
        fi
        if [[ $word == -* ]]; then
            key="@$path|$word"
            [[ $word != *=* && -n ${{_gpualloc_takes[$key]}} ]] && skip=1
            continue
        fi
        entries=(${{(f)_gpualloc_commands[@$path]}})
        if (( ${{entries[(I)$word:*]}} )); then
            path=${{path:+$path }}$word
        elif [[ $path == run ]]; then
            shift $((i - 1)) words; ((CURRENT -= i - 1)); _normal; return
        fi
    done
    if [[ $cur == --*=* ]]; then
        key="@$path|${{cur%%=*}}"
        compset -P '*='
        _gpualloc_offer "${{_gpualloc_values[$key]}}"; return
    fi
    key="@$path|$prev"
    if [[ -n ${{_gpualloc_takes[$key]}} ]]; then
        _gpualloc_offer "${{_gpualloc_values[$key]}}"; return
    fi
    if [[ $cur == -* ]]; then
        entries=(${{(f)_gpualloc_options[@$path]}})
        _describe 'option' entries; return
    fi
    entries=(${{(f)_gpualloc_commands[@$path]}})
    (( $#entries )) && _describe 'command' entries
    case ${{_gpualloc_arguments[@$path]}} in
        command) _command_names -e ;;
        ?*) _gpualloc_offer "${{_gpualloc_arguments[@$path]}}" ;;
    esac
}}

# Autoloaded from $fpath (compinit read the #compdef line), this file is the body of _gpualloc:
# complete now. Sourced or eval'd (source <(gpualloc --show-completion zsh) in ~/.zshrc), it
# only defines the functions: register them for gpualloc with compinit's compdef.
if [[ $zsh_eval_context[-1] == (file|eval) ]]; then
    if (( $+functions[compdef] )); then
        compdef _gpualloc gpualloc
    else
        print -u2 "gpualloc: zsh's completion is not loaded: run" \\
            "'autoload -Uz compinit && compinit' before loading gpualloc's completion"
    fi
else
    _gpualloc "$@"
fi
"""


# ---- fish ------------------------------------------------------------------------------------


def fish_script(specs: list[CommandSpec]) -> str:
    by_path = {spec.path: spec for spec in specs}
    lines = [
        "# fish completion for gpualloc. Generated by scripts/build_docs.py from the command",
        "# declarations (gpualloc/cli/completion_scripts.py); do not edit.",
        "",
        "complete -c gpualloc -f",
    ]
    for spec in specs:
        condition = _fish_condition(spec.path, by_path)
        for name, about in spec.subcommands:
            lines.append(
                f"complete -c gpualloc -n {_fish_word(condition)} -a {_fish_word(name)} "
                f"-d {_fish_word(about)}"
            )
        for option in spec.options:
            flags = " ".join(
                f"-l {name[2:]}" if name.startswith("--") else f"-s {name[1:]}"
                for name in option.names
            )
            line = f"complete -c gpualloc -n {_fish_word(condition)} {flags}"
            if option.takes_value:
                line += _fish_values(option.values)
            lines.append(f"{line} -d {_fish_word(option.about)}")
        if spec.arguments == DYNAMIC_LEASES:
            lines.append(
                f"complete -c gpualloc -n {_fish_word(condition)} "
                f"-a '(env {LEASES_VARIABLE}=1 gpualloc 2>/dev/null)'"
            )
        elif spec.arguments == "command":
            lines.append(
                f"complete -c gpualloc -n {_fish_word(condition)} -a '(__fish_complete_command)'"
            )
        elif spec.arguments == FILES:
            lines.append(f"complete -c gpualloc -n {_fish_word(condition)} -F")
    return "\n".join(lines) + "\n"


def _fish_condition(path: str, by_path: dict[str, CommandSpec]) -> str:
    """True while the command line is at ``path``: its words given, none of its subcommands."""
    parts = path.split()
    tests = [f"__fish_seen_subcommand_from {word}" for word in parts]
    below = [name for name, _ in by_path[path].subcommands]
    if not parts:
        return "__fish_use_subcommand"
    if below:
        tests.append(f"not __fish_seen_subcommand_from {' '.join(below)}")
    return "; and ".join(tests)


def _fish_values(values: tuple[str, ...]) -> str:
    """fish's flags for an option's value: required (-r), with file names (-F) or without
    (-f: free text offers nothing), and the words to offer (-a)."""
    if DIRECTORIES in values:
        return " -r -f -a '(__fish_complete_directories)'"
    words = " ".join(value for value in values if not value.startswith("@"))
    flags = " -r -F" if FILES in values else " -r -f"
    return flags + (f" -a {_fish_word(words)}" if words else "")


def _fish_word(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
