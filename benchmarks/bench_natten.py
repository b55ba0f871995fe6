#!/usr/bin/env python3
"""NATTEN (`masks.neighborhood_2d`) against the dense kernel, as time ÷ (density × dense time
per entry), as main had it before this branch (8 x 8 tiles for every kernel, gathers by
`index_select` along the token axis) and now (the tile chosen per kernel,
`_natten_tiles.choose_tile`; gathers by `reordered.permute`), interleaved in one process
(issue 36.2).

    PYTHONPATH=src python benchmarks/bench_natten.py                 # 15x15, 64² and 128²
    PYTHONPATH=src python benchmarks/bench_natten.py --sides 64 --kernel 7 --rounds 9

B=1, H=8, D=64, float32, one thread, the compiled kernel (backend="chunked"), forward and
forward + backward, medians of interleaved rounds (`attnkit.analysis.bench.time_interleaved`).
Also prints the score entries the kernel computes per allowed entry (`kernel_work`), which
timing noise does not touch. Compare ratios within one run: absolute times drift up to 2x on
shared machines.
"""

from __future__ import annotations

import argparse
import sys

import torch

import attnkit
from attnkit import masks
from attnkit.analysis import kernel_work
from attnkit.analysis.bench import time_interleaved
from attnkit.functional import reordered
from attnkit.functional._natten_tiles import tile_order

_NEW = reordered.permute


def _old(x, order, inverse):  # main's gathers before this change
    return x.index_select(2, order)


def _step(q, k, v, mask, grad: bool, permute):
    def run():
        reordered.permute = permute
        try:
            if grad:
                qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
                attnkit.attention(qs, ks, vs, mask=mask, backend="chunked").out.sum().backward()
            else:
                with torch.no_grad():
                    attnkit.attention(q, k, v, mask=mask, backend="chunked")
        finally:
            reordered.permute = _NEW

    return run


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sides", type=int, nargs="+", default=[64, 128])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--kernel", type=int, default=15)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    for side in args.sides:
        n = side * side
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 8, n, 64, generator=g) for _ in range(3))
        mask = masks.neighborhood_2d(side, side, args.kernel)
        main = reordered.Reordered(mask.fn, n, tile_order(side, side, 8, 8), None, mask.name)
        steps = {}
        for p_ in ("fwd", "fwd+bwd"):
            grad = p_ == "fwd+bwd"
            steps[f"dense {p_}"] = _step(q, k, v, None, grad, _NEW)
            steps[f"before {p_}"] = _step(q, k, v, main, grad, _old)
            steps[f"after {p_}"] = _step(q, k, v, mask, grad, _NEW)
        print(f"timing {len(steps)} steps x {args.rounds} rounds at N={n} ...", file=sys.stderr)
        ms = time_interleaved(steps, args.rounds)
        was, now = (kernel_work(m, heads=8) for m in (main, mask))
        print(
            f"N={n} ({side}x{side}, {args.kernel}x{args.kernel}): density {mask.density:.4f}, "
            f"computed/allowed {was.computed / was.allowed:.2f} -> {now.computed / now.allowed:.2f}"
        )
        for name, t in ms.items():
            p_ = name.split()[-1]
            d = 1.0 if name.startswith("dense") else mask.density
            print(f"  {name:16s} {t:9.1f} ms  ratio {t / (d * ms[f'dense {p_}']):5.2f}")
    print(f"timed NATTEN {args.kernel}x{args.kernel} at sides {args.sides} (printed above)")


if __name__ == "__main__":
    main(sys.argv[1:])
