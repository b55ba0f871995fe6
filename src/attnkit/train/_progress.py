"""What the training loop shows on stderr (rank 0): one tqdm bar over the run's steps and one
line per evaluated epoch. tqdm is imported when the loop runs, not when it is imported."""

from __future__ import annotations

import sys


def progress_bar(total: int, done: int, show: bool):
    """tqdm on stderr over the run's `total` steps, `done` of them already (a resumed run)."""
    from tqdm.auto import tqdm

    return tqdm(
        total=total, initial=done, unit="step", disable=not show, leave=False, file=sys.stderr
    )


def print_row(row: dict, total: int | None = None) -> None:
    """One line on stderr; `total`: the run's steps, when max_time stopped it at this row."""
    from tqdm.auto import tqdm

    parts = [f"epoch {row['epoch']}"]
    if total is not None:
        parts.insert(0, f"out of time (max_time) at step {row['step']} of {total}:")
    for key, value in row.items():
        if key in ("epoch", "step", "epoch_steps"):
            continue
        pct = key.endswith("acc")
        parts.append(f"{key} {value:.2%}" if pct else f"{key} {value:.4g}")
    tqdm.write("  ".join(parts), file=sys.stderr)
