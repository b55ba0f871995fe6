#!/usr/bin/env python3
"""The sparsest masks (issue 36.2): narrow windows (9 and 17 keys) and strided masks (1/64,
1/256), timed against the dense unmasked kernel in one process, as time / (density x dense
time per entry); 1.0 = time follows the density.

    PYTHONPATH=src python benchmarks/bench_narrow.py                 # N=4096, 9 rounds
    PYTHONPATH=src python benchmarks/bench_narrow.py --n 16384 --strided
    PYTHONPATH=src python benchmarks/bench_narrow.py --against OTHER.so   # A/B, one process

B=1, H=8, D=64, float32, one thread, the compiled kernel (backend="chunked"), medians of
interleaved rounds (`attnkit.analysis.bench.time_interleaved`). `--against` loads a second
build of the kernel (another checkout's, from the kernel cache: same ABI) and times every
step with both, interleaved, so that the two columns share the machine's moods.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys

import torch

import attnkit
from attnkit import masks
from attnkit.analysis.bench import time_interleaved
from attnkit.functional import _kernel_cache


def _masks(n: int, strided_only: bool) -> dict:
    cases = (
        {} if strided_only else {"window 9": masks.window(n, 5), "window 17": masks.window(n, 9)}
    )
    cases["strided 1/64"] = masks.strided(n, 64)
    cases["strided 1/256"] = masks.strided(n, 256)
    return cases


def _steps(n: int, cases: dict) -> dict:
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


def _with_library(lib, step):
    def run():
        saved, _kernel_cache._lib = _kernel_cache._lib, lib
        try:
            step()
        finally:
            _kernel_cache._lib = saved

    return run


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--strided", action="store_true", help="strided masks only")
    p.add_argument(
        "--against", action="append", default=[],
        help="another kernel library (.so, same ABI) to time beside this one (repeatable)",
    )  # fmt: skip
    p.add_argument("--min", action="store_true", help="fastest sample, not the median")
    p.add_argument("--only", help="a regular expression: time only the steps it finds")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    cases = _masks(args.n, args.strided)
    steps = _steps(args.n, cases)
    libs = {"": _kernel_cache.load()}
    for i, path in enumerate(args.against):
        libs[f"other{i} "] = _kernel_cache._open(path)
    if args.only:  # a regular expression on the steps' names ("window 9 fwd$")
        kept = [k for k in steps if not k.startswith("dense") and re.search(args.only, k)]
        passes = {k.rsplit(" ", 1)[1] for k in kept}
        steps = {k: s for k, s in steps.items() if k in kept or k in {f"dense {p}" for p in passes}}
        cases = {k: m for k, m in cases.items() if any(s.startswith(k + " ") for s in kept)}
    timed = {
        tag + name: _with_library(lib, s) for tag, lib in libs.items() for name, s in steps.items()
    }
    print(f"timing {len(timed)} steps x {args.rounds} rounds at N={args.n} ...", file=sys.stderr)
    ms = time_interleaved(timed, args.rounds, min if args.min else statistics.median)
    for tag in libs:
        for name, m in cases.items():
            for ps in ("fwd", "fwd+bwd"):
                if f"{tag}{name} {ps}" not in ms:
                    continue
                t = ms[f"{tag}{name} {ps}"]
                ratio = t / (m.density * ms[f"{tag}dense {ps}"])
                print(
                    f"{tag or 'this '}{name:14s} {ps:8s} density {m.density:.5f} "
                    f"{t:8.2f} ms  ratio {ratio:.2f}"
                )
        dense = ", ".join(f"{k} {t:.1f} ms" for k, t in ms.items() if k.startswith(tag + "dense"))
        print(f"{tag or 'this '}{dense}")
    print(f"timed {len(cases)} masks with {len(libs)} kernel(s) at N={args.n} (printed above)")


if __name__ == "__main__":
    main(sys.argv[1:])
