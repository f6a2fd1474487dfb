"""Figures of a simulation (``simulate --plot DIR``), with matplotlib (the ``plot`` extra).

- ``effective-bandwidth.png``: the effective bandwidth each policy gave bandwidth-sensitive and
  insensitive jobs, as box plots (the comparison of the MAPA paper's Fig. 13);
- ``occupancy-<policy>.png``: which job held which GPU when (the DRB paper's Fig. 8);
- ``completion-cdf.png``: the distribution of job completion times, one curve per policy;
- ``allocated-capacity.png`` (with shared jobs): the share of the GPUs' capacity held over
  time, one curve per run (FGD's headline measure, Weng et al. ATC'23, Fig. 7).

matplotlib is imported only here, with the non-interactive Agg backend, so that the simulator
works without it and nothing tries to open a window on a server.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from gpualloc.errors import FileAccessError, RequestError
from gpualloc.user_files import shown_path

if TYPE_CHECKING:
    from gpualloc.simulate.engine import SimResult


def write_figures(results: dict[str, SimResult], directory: Path, title: str) -> list[Path]:
    """Write the figures for ``results`` (policy name -> run) into ``directory``."""
    plt = _pyplot()
    from gpualloc.atomic import missing_directory

    try:  # the directory named, never those above it (as every writer: atomic.write_output)
        directory.mkdir(exist_ok=True)
    except (FileNotFoundError, NotADirectoryError):
        raise missing_directory("--plot", directory) from None
    except OSError as exc:
        raise FileAccessError(f"cannot create {shown_path(directory)}: {exc.strerror}") from None
    written = [
        _bandwidth_boxes(plt, results, directory / "effective-bandwidth.png", title),
        _completion_cdf(plt, results, directory / "completion-cdf.png", title),
    ]
    if any(job.shared for result in results.values() for job in result.jobs):
        written.append(
            allocated_capacity_figure(results, directory / "allocated-capacity.png", title)
        )
    for policy, result in results.items():
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", policy)
        written.append(
            _occupancy(plt, result, directory / f"occupancy-{safe}.png", f"{title}: {policy}")
        )
    return written


def _pyplot() -> ModuleType:
    try:
        import matplotlib
    except ImportError:
        raise RequestError(
            "--plot needs matplotlib, which is not installed",
            hint="pip install matplotlib (the plot extra: pip install -e '.[plot]' in a checkout)",
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: ModuleType, figure: Any, path: Path) -> Path:
    figure.tight_layout()
    try:
        figure.savefig(path, dpi=150)
    except OSError as exc:
        raise FileAccessError(f"cannot write {shown_path(path)}: {exc.strerror}") from None
    finally:
        plt.close(figure)
    return path


def _bandwidth_boxes(
    plt: ModuleType, results: dict[str, SimResult], path: Path, title: str
) -> Path:
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for ax, sensitive, label in ((axes[0], True, "sensitive"), (axes[1], False, "insensitive")):
        data, names = [], []
        for policy, result in results.items():
            values = [
                job.effective_gbps
                for job in result.jobs
                if job.job.sensitive == sensitive and job.effective_gbps is not None
            ]
            if values:
                data.append(values)
                names.append(policy)
        if data:
            ax.boxplot(data, showmeans=True)
            ax.set_xticks(range(1, len(names) + 1), names, rotation=30, ha="right")
        ax.set_title(f"bandwidth-{label} jobs (2+ GPUs)")
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("predicted effective bandwidth (GB/s)")
    figure.suptitle(title)
    return _save(plt, figure, path)


def _completion_cdf(plt: ModuleType, results: dict[str, SimResult], path: Path, title: str) -> Path:
    figure, ax = plt.subplots(figsize=(7, 4.5))
    for policy, result in results.items():
        times = sorted(job.jct_s for job in result.jobs)
        shares = [(i + 1) / len(times) for i in range(len(times))]
        ax.step(times, shares, where="post", label=policy)
    _label(ax, "job completion time (s, arrival to end)", "share of jobs", 1.02, title)
    return _save(plt, figure, path)


def allocated_capacity_figure(results: dict[str, SimResult], path: Path, title: str) -> Path:
    """The share of the GPUs' capacity held over time, one curve per run; runs whose curves
    coincide stay visible (each is drawn thinner and dashed differently)."""
    from gpualloc.simulate.capacity import capacity_steps

    plt = _pyplot()
    figure, ax = plt.subplots(figsize=(9, 4.5))
    styles = ("-", "--", "-.", ":")
    for number, (run, result) in enumerate(results.items()):
        steps = capacity_steps(result.jobs, result.gpu_count)
        if steps:
            times, shares = zip(*steps, strict=True)
            ax.step(
                times,
                [100 * share for share in shares],
                where="post",
                label=run,
                linestyle=styles[number % len(styles)],
                linewidth=max(0.8, 2.6 - 0.6 * number),
            )
    last = max(job.job.arrival_s for result in results.values() for job in result.jobs)
    ax.axvline(last, color="grey", linestyle=":", linewidth=1, label="last arrival")
    _label(ax, "time (s)", "GPU capacity allocated (%)", 102, title)
    return _save(plt, figure, path)


def _label(ax: Any, x: str, y: str, top: float, title: str) -> None:
    """Axis labels, a y range from 0 to ``top``, a light grid, the legend and the title."""
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_ylim(0, top)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title)


def _occupancy(plt: ModuleType, result: SimResult, path: Path, title: str) -> Path:
    jobs = result.jobs
    gpu_count = max((max(job.gpus) for job in jobs if job.gpus), default=0) + 1
    figure, ax = plt.subplots(figsize=(10, 0.35 * gpu_count + 1.8))
    colours = plt.get_cmap("tab20")
    for index, job in enumerate(jobs):
        for gpu in job.gpus:
            ax.broken_barh(
                [(job.start_s, job.end_s - job.start_s)],
                (gpu - 0.4, 0.8),
                facecolors=colours(index % 20),
                edgecolor="black" if job.job.sensitive else "none",
                linewidth=0.4,
            )
    ax.set_yticks(range(gpu_count))
    ax.set_ylabel("GPU")
    ax.set_xlabel("time (s); outlined: bandwidth-sensitive jobs")
    ax.set_ylim(-0.6, gpu_count - 0.4)
    ax.invert_yaxis()
    ax.set_title(title)
    return _save(plt, figure, path)
