#!/usr/bin/env python3
"""NATTEN (`masks.neighborhood_2d`) and strided masks whose stride does not divide N against
the dense kernel, as time ÷ (density × dense time per entry): reordered into tiles (queries
read in place through the row map, `Args::qrows`) and as the call runs now (a forward without
gradients in token order on the offset path, `Reordered.natural`), interleaved in one
process (issue 36.2).

    PYTHONPATH=src python benchmarks/bench_natten.py                 # 15x15, 64² and 128²
    PYTHONPATH=src python benchmarks/bench_natten.py --sides 128 --kernel 7 --rounds 7
    PYTHONPATH=src python benchmarks/bench_natten.py --sides --strided 16383 256

B=1, H=8, D=64, float32, one thread, the compiled kernel (backend="chunked"), forward and
forward + backward, medians of interleaved rounds (`attnkit.analysis.bench.time_interleaved`).
The dense kernel is timed at N=4096 (`--dense-n`): its time per entry, scaled to N², is the
unit (dense at N=16384 costs ~40 s a forward + backward on one thread). Also prints the score
entries the kernel computes per allowed entry (`kernel_work`), which timing noise does not
touch. Compare ratios within one run: absolute times drift up to 2x on shared machines.
"""

from __future__ import annotations

import argparse
import sys

import torch

import attnkit
from attnkit import masks
from attnkit.analysis import kernel_work
from attnkit.analysis.bench import time_interleaved
from attnkit.functional import chunked

_NATURAL = chunked._natural_forward


def _reordered(mask, q, k, v):  # never in token order: the reordered tiles
    return False


def _step(n, mask, grad: bool, natural=_NATURAL):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, n, 64, generator=g) for _ in range(3))

    def step():
        chunked._natural_forward = natural
        try:
            if grad:
                qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
                attnkit.attention(qs, ks, vs, mask=mask, backend="chunked").out.sum().backward()
            else:
                with torch.no_grad():
                    attnkit.attention(q, k, v, mask=mask, backend="chunked")
        finally:
            chunked._natural_forward = _NATURAL

    return step


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sides", type=int, nargs="*", default=[64, 128])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--kernel", type=int, default=15)
    p.add_argument("--strided", type=int, nargs=2, metavar=("N", "STRIDE"))
    p.add_argument("--dense-n", type=int, default=4096)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    cases = {
        f"natten {s}x{s} {args.kernel}x{args.kernel}": masks.neighborhood_2d(s, s, args.kernel)
        for s in args.sides
    }
    if args.strided:
        n, stride = args.strided
        cases[f"strided({stride}) N={n}"] = masks.strided(n, stride)
    steps = {}
    for p_ in ("fwd", "fwd+bwd"):
        grad = p_ == "fwd+bwd"
        steps[f"dense {p_}"] = _step(args.dense_n, None, grad)
        for name, m in cases.items():
            steps[f"{name} reordered {p_}"] = _step(m.n, m, grad, _reordered)
            steps[f"{name} now {p_}"] = _step(m.n, m, grad)
    print(f"timing {len(steps)} steps x {args.rounds} rounds ...", file=sys.stderr)
    ms = time_interleaved(steps, args.rounds)
    for name, m in cases.items():
        works = [kernel_work(m, heads=8, grad=grad).computed for grad in (True, False)]
        waste = ", ".join(f"{w / kernel_work(m, heads=8).allowed:.2f}" for w in works)
        print(f"{name}: density {m.density:.5f}, computed/allowed reordered, now {waste}")
        for p_ in ("fwd", "fwd+bwd"):
            unit = m.density * ms[f"dense {p_}"] * (m.n / args.dense_n) ** 2
            was, now = ms[f"{name} reordered {p_}"], ms[f"{name} now {p_}"]
            print(
                f"  {p_:8s} reordered {was:8.1f} ms ratio {was / unit:5.2f}   now {now:8.1f} "
                f"ms ratio {now / unit:5.2f}   ({now / was:.2f}x the time)"
            )
    print(f"timed {len(cases)} masks, reordered and as run now (printed above)")


if __name__ == "__main__":
    main(sys.argv[1:])
