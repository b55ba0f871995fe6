#!/usr/bin/env python3
"""The sparsest masks (issue 36.2): narrow windows (9, 17 and 33 keys), documents of 16
tokens and strided masks (1/64, 1/256), timed against the dense unmasked kernel in one
process, as time / (density x dense time per entry); 1.0 = time follows the density.

    PYTHONPATH=src python benchmarks/bench_narrow.py                 # N=4096, 9 rounds
    PYTHONPATH=src python benchmarks/bench_narrow.py --n 16384 --strided
    PYTHONPATH=src python benchmarks/bench_narrow.py --against OTHER.so   # A/B, one process
    PYTHONPATH=src python benchmarks/bench_narrow.py --peers     # + SDPA documents, Flex

B=1, H=8, D=64, float32, one thread, the compiled kernel (backend="chunked"), medians of
interleaved rounds (`attnkit.analysis.bench.time_interleaved`). `--against` loads a second
build of the kernel (another checkout's, from the kernel cache: same ABI) and times every
step with both, interleaved, so that the two columns share the machine's moods. `--peers`
adds the same work for others: SDPA on documents of 8 and 16 tokens (a batch of tiny
sequences) and compiled FlexAttention's forward on the window of 9 keys, in the same units
(attnkit's dense time) and in ns an allowed entry. On a loaded machine add `--min`.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys

import torch
from bench_runs import mask_steps  # benchmarks/ is the script's folder, first on sys.path

from attnkit import masks
from attnkit.analysis.bench import time_interleaved
from attnkit.functional import _kernel_cache


def _masks(n: int, strided_only: bool) -> dict:
    cases = {}
    if not strided_only:
        cases = {f"window {2 * w - 1}": masks.window(n, w) for w in (5, 9, 17)}
        # documents of 16 tokens: rows of 16 x 16 blocks (the tile path's whole tiles)
        cases["documents of 16"] = masks.document(torch.arange(n) // 16)
    cases["strided 1/64"] = masks.strided(n, 64)
    cases["strided 1/256"] = masks.strided(n, 256)
    return cases


def _peers(n: int) -> tuple[dict, dict]:
    """Peers on the same work, steps and densities: SDPA (no mask) on the tokens cut into
    independent documents of 8 and 16 (a (N / L, H, L, D) batch: the entries of a window of
    about that many keys, with none of its structure to read), and compiled FlexAttention
    forward (no CPU backward) on the window of 9 keys."""
    g = torch.Generator().manual_seed(1)
    steps, density = {}, {}
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for length in (8, 16):
        # (1, H, N, D) -> (N / L, H, L, D): documents as rows of the batch
        docs = [
            torch.randn(1, 8, n, 64, generator=g).view(8, n // length, length, 64).transpose(0, 1)
            for _ in range(3)
        ]
        q, k, v = (t.contiguous() for t in docs)
        grads = [t.clone().requires_grad_() for t in (q, k, v)]

        def fwd_bwd(grads=grads):
            sdpa(*grads).sum().backward()
            for t in grads:
                t.grad = None

        name = f"SDPA documents of {length}"
        steps[f"{name} fwd"] = lambda q=q, k=k, v=v: sdpa(q, k, v)
        steps[f"{name} fwd+bwd"] = fwd_bwd
        density[name] = length / n
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        block = create_block_mask(lambda b, h, q, kv: (q - kv).abs() < 5, 1, 1, n, n, "cpu")
        flex = torch.compile(flex_attention)
        q, k, v = (torch.randn(1, 8, n, 64, generator=g) for _ in range(3))
        print("compiling FlexAttention ...", file=sys.stderr)
        flex(q, k, v, block_mask=block)
        steps["Flex window 9 fwd"] = lambda: flex(q, k, v, block_mask=block)
        density["Flex window 9"] = masks.window(n, 5).density
    except Exception as err:  # no Flex in this torch, or no compiler
        print(f"FlexAttention not timed: {err}", file=sys.stderr)
    return steps, density


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
    p.add_argument("--peers", action="store_true", help="also SDPA documents and FlexAttention")
    p.add_argument(
        "--against", action="append", default=[],
        help="another kernel library (.so, same ABI) to time beside this one (repeatable)",
    )  # fmt: skip
    p.add_argument("--min", action="store_true", help="fastest sample, not the median")
    p.add_argument("--only", help="a regular expression: time only the steps it finds")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    cases = _masks(args.n, args.strided)
    steps = mask_steps(args.n, cases)
    density = {name: m.density for name, m in cases.items()}
    peer_steps = {}
    if args.peers:
        peer_steps, peer_density = _peers(args.n)
        density.update(peer_density)
    libs = {"": _kernel_cache.load()}
    for i, path in enumerate(args.against):
        libs[f"other{i} "] = _kernel_cache._open(path)
    if args.only:  # a regular expression on the steps' names ("window 9 fwd$")
        kept = [k for k in steps if not k.startswith("dense") and re.search(args.only, k)]
        passes = {k.rsplit(" ", 1)[1] for k in kept}
        steps = {k: s for k, s in steps.items() if k in kept or k in {f"dense {p}" for p in passes}}
        peer_steps = {k: s for k, s in peer_steps.items() if re.search(args.only, k)}
        kept += list(peer_steps)
        density = {k: d for k, d in density.items() if any(s.startswith(k + " ") for s in kept)}
    timed = {
        tag + name: _with_library(lib, s) for tag, lib in libs.items() for name, s in steps.items()
    }
    timed.update(peer_steps)  # no attnkit kernel in them: timed once
    print(f"timing {len(timed)} steps x {args.rounds} rounds at N={args.n} ...", file=sys.stderr)
    ms = time_interleaved(timed, args.rounds, min if args.min else statistics.median)
    print("ratio: time / (density x attnkit's dense time, same pass); ns an allowed entry")
    for tag in libs:
        for name, d in density.items():
            for ps in ("fwd", "fwd+bwd"):
                key = f"{tag}{name} {ps}" if f"{name} {ps}" not in peer_steps else f"{name} {ps}"
                if key not in ms or (tag and key in peer_steps):
                    continue
                t = ms[key]
                ratio = t / (d * ms[f"{tag}dense {ps}"])
                per_entry = t * 1e6 / (d * 8 * args.n * args.n)
                print(
                    f"{tag or 'this '}{name:22s} {ps:8s} density {d:.5f} "
                    f"{t:8.2f} ms  ratio {ratio:.2f}  {per_entry:.2f} ns"
                )
        dense = ", ".join(
            f"{k[len(tag) :]} {t:.1f} ms" for k, t in ms.items() if k.startswith(tag + "dense")
        )
        print(f"{tag or 'this '}{dense}")
    print(f"timed {len(density)} cases with {len(libs)} kernel(s) at N={args.n} (printed above)")


if __name__ == "__main__":
    main(sys.argv[1:])
