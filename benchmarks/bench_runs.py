#!/usr/bin/env python3
"""Rows that see several runs of keys (issue 36.2): `|` of row-interval masks with gaps, timed
against the dense unmasked kernel in one process, as time ÷ (density × dense time per entry).

    PYTHONPATH=src python benchmarks/bench_runs.py            # N=4096, 7 rounds (~5 min, 1 core)
    PYTHONPATH=src python benchmarks/bench_runs.py --quick    # N=1024, 2 rounds (a smoke run)
    PYTHONPATH=src python benchmarks/bench_runs.py --natten   # NATTEN 15x15: tiles vs runs

B=1, H=8, D=64, float32, one thread, the compiled kernel (backend="chunked"), medians of
interleaved rounds (`attnkit.analysis.bench.time_interleaved`). Also prints the score entries
the kernel computes per allowed entry (`kernel_work`), which timing noise does not touch.
Compare ratios within one run: absolute times drift up to 2x on shared machines.
"""

from __future__ import annotations

import functools
import sys

import torch

import attnkit
from attnkit import masks
from attnkit.analysis import kernel_work
from attnkit.analysis.bench import time_interleaved
from attnkit.functional.structured import RowIntervals, causal_intervals


def _masks(n: int, natten: bool) -> dict:
    pos = torch.arange(n)

    def band(off: int, half: int) -> RowIntervals:  # keys j with |j - i - off| < half
        return RowIntervals(pos + off - half + 1, pos + off + half, n, "band")

    if natten:  # 15 x 15 on a side x side canvas: reordered tiles, or 15 runs in raster order
        side, r = int(n**0.5), 7
        cy, cx = (pos // side).clamp(r, side - 1 - r), (pos % side).clamp(r, side - 1 - r)
        rows = [
            RowIntervals((cy - r + k) * side + cx - r, (cy - r + k) * side + cx + r + 1, n)
            for k in range(2 * r + 1)
        ]
        return {
            "natten tiles": masks.neighborhood_2d(side, side, 2 * r + 1),
            "natten runs": functools.reduce(lambda a, b: a | b, rows),
        }
    sink = RowIntervals(torch.zeros(n, dtype=torch.long), torch.full((n,), 64), n, "sink")
    far = n // 4
    return {
        f"window(n,128) | band({far},128)": masks.window(n, 128) | band(far, 128),
        f"band(0,64) | band({far},64)": band(0, 64) | band(far, 64),
        "causal window 256 | first 64": masks.window(n, 256, causal=True)
        | (sink & causal_intervals(n)),
        f"band(-{far},128) | band({3 * far // 2},128)": band(-far, 128) | band(3 * far // 2, 128),
        "window(n,128) alone": masks.window(n, 128),
    }


def mask_steps(n: int, cases: dict) -> dict:
    """Forward and forward + backward steps (chunked backend, B=1, H=8, D=64) of the dense
    kernel and of each mask in `cases`, named "<name> fwd" / "<name> fwd+bwd"; also used by
    bench_narrow.py."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, n, 64, generator=g) for _ in range(3))
    grads = [t.clone().requires_grad_() for t in (q, k, v)]

    def fwd(m):
        return lambda: attnkit.attention(q, k, v, mask=m, backend="chunked")

    def fwd_bwd(m):
        def step():
            attnkit.attention(*grads, mask=m, backend="chunked").out.sum().backward()
            for t in grads:
                t.grad = None

        return step

    steps = {"dense fwd": fwd(None), "dense fwd+bwd": fwd_bwd(None)}
    for name, m in cases.items():
        steps[f"{name} fwd"], steps[f"{name} fwd+bwd"] = fwd(m), fwd_bwd(m)
    return steps


def main(argv: list[str]) -> None:
    quick, natten = "--quick" in argv, "--natten" in argv
    n, rounds = (1024, 2) if quick else (4096, 7)
    torch.set_num_threads(1)
    cases = _masks(n, natten)
    steps = mask_steps(n, cases)
    print(f"timing {len(steps)} steps x {rounds} rounds at N={n} ...", file=sys.stderr)
    ms = time_interleaved(steps, rounds)
    for name, m in cases.items():
        work = kernel_work(m, pass_="forward", heads=8)
        for p in ("fwd", "fwd+bwd"):
            ratio = ms[f"{name} {p}"] / (m.density * ms[f"dense {p}"])
            print(
                f"{name:34s} {p:8s} density {m.density:.4f}  {ms[f'{name} {p}']:8.1f} ms  "
                f"ratio {ratio:.2f}  computed/allowed {work.computed / work.allowed:.2f}"
            )
    print(f"timed {len(cases)} masks against the dense kernel at N={n} (printed above)")


if __name__ == "__main__":
    main(sys.argv[1:])
