#!/usr/bin/env python3
"""The compiled backward's offset path (_native/offset_backward.h) against the paths it would
replace (the row path, the blocks), the backward alone, in one process: the kernel reads its
switch ATTNKIT_OFFSET_BACKWARD at each query block, so the same build runs both, interleaved.

    PYTHONPATH=src python benchmarks/bench_offset_backward.py            # windows 9 .. 63
    PYTHONPATH=src python benchmarks/bench_offset_backward.py --min --n 8192

B=1, H=8, D=64, float32, one thread, two-sided windows of 2w - 1 keys (`masks.window(n, w)`),
medians (or minima) of interleaved rounds (`attnkit.analysis.bench.time_interleaved`).
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch

import attnkit
from attnkit import masks
from attnkit.analysis.bench import time_interleaved

SWITCH = "ATTNKIT_OFFSET_BACKWARD"


def _steps(n: int, halves: list[int]) -> dict:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, n, 64, generator=g).requires_grad_() for _ in range(3))
    steps = {}
    for w in halves:
        out = attnkit.attention(q, k, v, mask=masks.window(n, w), backend="chunked").out
        cot = torch.randn_like(out)
        for path, on in (("offsets", "1"), ("without", "0")):

            def step(out=out, cot=cot, on=on):
                os.environ[SWITCH] = on
                torch.autograd.grad(out, (q, k, v), cot, retain_graph=True)

            steps[f"window {2 * w - 1:3d} bwd {path}"] = step
    return steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--halves", type=int, nargs="+", default=[5, 9, 17, 24, 32])
    p.add_argument("--min", action="store_true", help="fastest sample, not the median")
    args = p.parse_args()
    torch.set_num_threads(1)
    saved = os.environ.get(SWITCH)
    try:
        ms = time_interleaved(
            _steps(args.n, args.halves), args.rounds, min if args.min else statistics.median
        )
    finally:
        os.environ.pop(SWITCH, None) if saved is None else os.environ.update({SWITCH: saved})
    for name, t in ms.items():
        print(f"{name}  {t:8.2f} ms")
    for w in args.halves:
        key = f"window {2 * w - 1:3d} bwd"
        print(f"{key}: offsets / without {ms[key + ' offsets'] / ms[key + ' without']:.2f}x")
    print(f"timed {len(ms)} backward steps at N={args.n}, 1 thread (printed above)")


if __name__ == "__main__":
    main()
