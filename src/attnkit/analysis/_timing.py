"""Timing for the benchmarks: `time_interleaved` runs several steps in shuffled rounds and
reports each one's median (or another statistic), so that the steps of one comparison share
the machine's conditions. Measure ratios within one call: absolute times drift."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable

__all__ = ["time_interleaved"]


def time_interleaved(
    steps: dict[str, Callable[[], None]],
    repeats: int,
    stat: Callable = statistics.median,
    sample_s: float = 0.02,
) -> dict[str, float]:
    """Median milliseconds per step (or `stat` of the samples, e.g. min: timeit's choice for
    fixed costs, the least disturbed sample): warm-up, then `repeats` rounds in a shuffled order.

    The order is drawn afresh each round (seeded, so runs are comparable): rotating one fixed
    order keeps every step behind the same neighbour, and a step always run right after plain
    attention (which frees hundreds of MiB) paid that one's page faults and cache misses in
    most samples (measured: auto 1.8 ms vs fused 1.3 ms for the same SDPA call, N=256). A step
    faster than `sample_s` (20 ms) also gets one untimed call before each sample and is run
    several times per sample (timeit's autorange idea), for the same reason. A short sample_s
    with many repeats suits microsecond calls on a loaded machine: more samples escape the
    other processes.
    """
    inner = {}
    for name, step in steps.items():
        t0 = time.perf_counter()
        step()
        inner[name] = max(1, min(50, int(sample_s / max(time.perf_counter() - t0, 1e-6))))
    names = list(steps)
    order = random.Random(len(names) * 1000 + repeats)
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(repeats):
        for name in order.sample(names, len(names)):
            if inner[name] > 1:
                steps[name]()  # absorbs the previous step's aftermath
            t0 = time.perf_counter()
            for _ in range(inner[name]):
                steps[name]()
            times[name].append((time.perf_counter() - t0) / inner[name])
    return {name: 1e3 * stat(ts) for name, ts in times.items()}
