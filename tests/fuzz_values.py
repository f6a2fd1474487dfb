"""Hostile values by kind, for the fuzzing tests (issue 42, point 3): numbers, durations, sizes,
GPU lists, names, and paths that stay inside a case's own directory.

Every path a strategy makes is relative (a case runs in its own directory) or one of a few
absolute ones that nothing can be written to by mistake (``/dev/null``, ``/dev/full``, a
directory that does not exist): the suite runs as root, and a generated ``-o /etc/passwd``
would be obeyed.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import strategies as st

from tests.fuzz_harness import FILE_KINDS, make

LONG_TEXT = "a" * 5000
HOSTILE = (
    "", " ", "nan", "NaN", "-nan", "inf", "-inf", "+Infinity", "1e308", "1e309", "-1e308",
    "-0", "-0.0", "0", "-1", "1", "2", "9" * 30, str(2**63), str(-(2**63) - 1), "0x10",
    "1_000", "١٢", "１２", "\x1b[31m", "\n", "\t1", "1\r", LONG_TEXT, "/" * 300, "日本",
    "\u202e", "\udcff", "1e-320", "5e-324", "½", "1,2", "=", ":", "%s", "{}", "'", '"', "--",
)  # fmt: skip
"""Values no option should take badly: not numbers, not finite, too large, signed zero,
digits int() reads but people do not, control and bidi characters, a lone surrogate (a byte
of an argument that was not UTF-8), very long text."""

POLICIES = ("mapa", "mapa-greedy", "drb", "pack", "spread", "besteffort", "slurm", "baseline")
hostile = st.sampled_from(HOSTILE)
text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30)
integers = st.one_of(
    st.integers(-3, 20), st.integers(-(2**70), 2**70), st.sampled_from([2**31, 2**63, 2**64])
).map(str)
floats = st.one_of(
    st.floats().map(repr),
    st.floats(min_value=-10, max_value=10).map(lambda f: f"{f:.3g}"),
    st.sampled_from(["1e308", "1e-308", "5e-324", "-0.0", "0.5", "1.0", "2.5", "999999"]),
)
numbers = st.one_of(integers, floats)
DURATION_UNITS = ("", "s", "m", "h", "d", "ms", "w", "min", "sec", "x", " s", "S", "H", "mn")
durations = st.one_of(
    st.tuples(numbers, st.sampled_from(DURATION_UNITS)).map("".join),
    st.sampled_from(["1h30m", "1h-30m", "30m1h", "h", "1.5h", "0s", "off", "none", "PT1H"]),
)
SIZE_UNITS = ("", "B", "K", "M", "G", "T", "P", "E", "Z", "KiB", "MiB", "GiB", "GB", "gb", " G")
sizes = st.tuples(numbers, st.sampled_from(SIZE_UNITS)).map("".join)
list_items = st.one_of(
    st.integers(-3, 20).map(str),
    st.tuples(integers, integers).map(lambda pair: f"{pair[0]}-{pair[1]}"),
    st.sampled_from(["", "-", "0-", "-3", "a", " 1", "1.5", "nan", "0x1", "GPU0", "٣"]),
)
gpu_lists = st.lists(list_items, min_size=1, max_size=5).map(",".join)


def of(*known: str) -> st.SearchStrategy[str]:
    """One of ``known``, in any case and with spaces, or something hostile."""
    return st.one_of(
        st.sampled_from(known),
        st.sampled_from(known).map(str.upper),
        st.sampled_from(known).map(lambda name: f" {name} "),
        st.lists(st.sampled_from(known), min_size=2, max_size=4).map(",".join),
        hostile,
        text,
    )


def anything(strategy: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """``strategy``, or a hostile value, or any text."""
    return st.one_of(strategy, hostile, text)


# ---- paths -------------------------------------------------------------------------------------

OUTPUT_KINDS = (
    "new", "existing", "directory", "missing-directory", "dev-full", "dev-null", "fifo",
    "dangling-symlink", "long-name", "control-characters", "empty", "dash", "proc",
    "symlink-to-dev-full", "trailing-slash",
)  # fmt: skip


def output_path(workdir: Path, kind: str, suffix: str = ".json") -> str:
    """Where a case asks gpualloc to write, of ``kind``; always in ``workdir`` or harmless."""
    target = workdir / f"out{suffix}"
    if kind == "existing":
        target.write_text("kept\n")
    elif kind == "directory":
        return str(workdir)
    elif kind == "missing-directory":
        return str(workdir / "no" / "such" / f"out{suffix}")
    elif kind == "dev-full":
        return "/dev/full"
    elif kind == "dev-null":
        return "/dev/null"
    elif kind == "fifo":
        import os

        os.mkfifo(target)
    elif kind == "dangling-symlink":
        target.symlink_to(workdir / "nowhere" / "x")
    elif kind == "long-name":
        return str(workdir / ("n" * 300 + suffix))
    elif kind == "control-characters":
        return str(workdir / f"out\x1b[31m\n{suffix}")
    elif kind == "empty":
        return ""
    elif kind == "dash":
        return "-"
    elif kind == "proc":
        return "/proc/self/status"
    elif kind == "symlink-to-dev-full":
        target.symlink_to("/dev/full")
    elif kind == "trailing-slash":
        return f"{target}/"
    return str(target)


input_kinds = st.sampled_from(FILE_KINDS)


def input_path(workdir: Path, kind: str, data: bytes, name: str = "input.txt") -> str:
    """A file a case names as input, of one of the harness's kinds (``make``)."""
    return str(make(workdir / name, kind, data))
