"""``simulate --report FILE``: the run as a Markdown page (settings, comparison, figures)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

COLUMNS = (
    ("makespan s", lambda s: s["makespan_s"]),
    ("mean JCT s", lambda s: s["mean_jct_s"]),
    ("p95 JCT s", lambda s: s["p95_jct_s"]),
    ("worst JCT s", lambda s: s["max_jct_s"]),
    ("mean wait s", lambda s: s["mean_wait_s"]),
    ("run-time stretch p95", lambda s: s["run_time_stretch"]["p95"]),
    ("jobs/h", lambda s: s["throughput_jobs_per_h"]),
    ("sensitive min", lambda s: s["sensitive_effective_gbps"]["min"]),
    ("p25", lambda s: s["sensitive_effective_gbps"]["p25"]),
    ("p50", lambda s: s["sensitive_effective_gbps"]["p50"]),
    ("insensitive p50", lambda s: s["insensitive_effective_gbps"]["p50"]),
    ("free GPUs while jobs wait", lambda s: s["mean_free_gpus_while_jobs_wait"]),
    ("decision ms", lambda s: s["decision_ms"]["mean"]),
)


def markdown_report(
    title: str,
    source: str,
    summaries: dict[str, dict[str, Any]],
    figures: list[Path],
    report_dir: Path,
) -> str:
    """The report's text; figure links are relative to ``report_dir``."""
    lines = [
        f"# {title}",
        "",
        f"Jobs: {source}. Effective bandwidths are predicted, in GB/s, for jobs of 2+ GPUs; "
        "'free GPUs while jobs wait' is the mean number of idle GPUs at the moments when jobs "
        "were waiting (capacity stranded by placement or queue order); a job's run-time stretch "
        "is its run time over the trace's duration (its time on the best GPUs, alone).",
        "",
        "| policy | " + " | ".join(name for name, _ in COLUMNS) + " |",
        "|---|" + "---:|" * len(COLUMNS),
    ]
    for policy, summary in summaries.items():
        cells = [_cell(value(summary)) for _, value in COLUMNS]
        lines.append(f"| `{policy}` | " + " | ".join(cells) + " |")
    if figures:
        lines += ["", "## Figures", ""]
        for figure in figures:
            link = os.path.relpath(figure, report_dir)
            lines += [f"![{figure.stem}]({link})", ""]
    return "\n".join(lines).rstrip() + "\n"


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
