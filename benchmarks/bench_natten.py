#!/usr/bin/env python3
"""NATTEN (`masks.neighborhood_2d`) and strided masks whose stride does not divide N against
the dense kernel, as time ÷ (density × dense time per entry): reordered into tiles (queries
read in place through the row map, `Args::qrows`) and in token order (`Reordered.natural`:
the forward's offset path, and the backward's for rows of several runs, _native/offset_runs.h,
where the build takes it: AVX-512, or ATTNKIT_OFFSET_BACKWARD=1), interleaved in one process
(issue 36, items 2 and 7). A mask without token-order runs (strided) runs as the call does.

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


def _token_order(mask, q, k, v):  # always, where the mask has runs in token order
    return getattr(mask, "natural", None) is not None


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
            steps[f"{name} token order {p_}"] = _step(m.n, m, grad, _token_order)
    print(f"timing {len(steps)} steps x {args.rounds} rounds ...", file=sys.stderr)
    ms = time_interleaved(steps, args.rounds)
    for name, m in cases.items():
        allowed = kernel_work(m, heads=8).allowed
        ways = {"reordered": m.inner, "token order": m.natural or m}
        waste = ", ".join(
            f"{way} {_computed(w, allowed)}" for way, w in ways.items() if w is not None
        )
        print(f"{name}: density {m.density:.5f}, computed/allowed forward, backward: {waste}")
        for p_ in ("fwd", "fwd+bwd"):
            unit = m.density * ms[f"dense {p_}"] * (m.n / args.dense_n) ** 2
            was, now = ms[f"{name} reordered {p_}"], ms[f"{name} token order {p_}"]
            print(
                f"  {p_:8s} reordered {was:8.1f} ms ratio {was / unit:5.2f}   token order "
                f"{now:8.1f} ms ratio {now / unit:5.2f}   ({now / was:.2f}x the time)"
            )
        fwd = ms[f"{name} token order fwd"]
        train = min(ms[f"{name} {way} fwd+bwd"] for way in ("reordered", "token order"))
        print(f"  the faster training step / the token-order forward: {train / fwd:.2f}")
    print(f"timed {len(cases)} masks, reordered and in token order (printed above)")


def _computed(mask, allowed: int) -> str:
    """Entries the kernel computes for `mask` (8 heads) per allowed one, forward / backward."""
    return " / ".join(
        f"{kernel_work(mask, heads=8, pass_=p).computed / allowed:.2f}"
        for p in ("forward", "backward")
    )


if __name__ == "__main__":
    main(sys.argv[1:])
