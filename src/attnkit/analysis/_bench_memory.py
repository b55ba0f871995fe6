"""The benchmark's peak-memory rows: one forward+backward per configuration in a fresh
subprocess (``python -m attnkit.analysis.bench --child ...``, which runs `bench._child`),
whose peak RSS growth (VmHWM, Linux) is read back; `status_mib` reads /proc/self/status."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict

import torch

from attnkit.analysis._bench_case import Case

__all__ = ["memory_row", "peak_memory_mib", "status_mib"]


def status_mib(name: str) -> float:
    """A field of /proc/self/status (VmRSS, VmHWM, VmSize, ...) in MiB (Linux)."""
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith(name + ":"))
    return int(line.split()[1]) / 1024  # kB -> MiB


def peak_memory_mib(impl: str, case: Case, threads: int) -> float | None:
    """Peak extra MiB of one forward+backward in a fresh subprocess; None if it failed."""
    arg = json.dumps({"impl": impl, "case": asdict(case), "threads": threads})
    cmd = [sys.executable, "-m", "attnkit.analysis.bench", "--child", arg]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        return None
    return float(res.stdout.strip().splitlines()[-1])


def memory_row(impl: str, case: Case, threads: int) -> dict:
    # out, dq, dk, dv and lse exist whatever the implementation does
    unavoidable = (
        4 * case.b * case.h * case.n * case.d * torch.finfo(getattr(torch, case.dtype)).bits / 8
    )
    return {
        "kind": "memory",
        "impl": impl,
        **asdict(case),
        "peak_mib": peak_memory_mib(impl, case, threads),
        "outputs_and_grads_mib": unavoidable / 2**20,
        "score_matrix_mib": case.score_bytes / 2**20,
    }
