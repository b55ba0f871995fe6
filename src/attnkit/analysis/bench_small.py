"""Small calls: `attnkit.attention` against SDPA per call, where fixed costs decide the time.

Legend: B batch, H heads, N queries, S keys, D head width (B=1, H=8, D=64, float32, eager).

A decode step (N=1 against a cache of S keys) or a small model pays attention's per-call cost
on every layer of every token. Each row times `attention(q, k, v, causal=...)` and SDPA for
the same meaning: ``is_causal=True`` where N == S; with N == 1 the bottom-right causal limit
hides no key, so SDPA's call is the unmasked one (its ``is_causal`` is aligned top-left and
would let the one query see key 0 only). "grad": q, k, v require gradients and grad mode is
on (the forward of a training step); otherwise under ``torch.no_grad``. Times are the best of
the interleaved samples (timeit's advice for fixed costs: on a shared machine the median of a
20 µs call moves with the load, up to 2x, the minimum far less), each sample `calls` calls.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from attnkit.functional.attention import attention

__all__ = ["SHAPES", "markdown_lines", "small_call_rows", "summary_lines"]

# (N, S, causal): the shapes of issue 38, item 6
SHAPES = ((16, 16, False), (16, 16, True), (64, 64, False), (1, 128, False), (1, 128, True))
MIN_ROUNDS = 101  # interleaved samples (~1 ms each) per row at least; the best is reported


def _inputs(n: int, s: int, grad: bool):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 8, n, 64, generator=gen)  # (B, H, N, D)
    k, v = (torch.randn(1, 8, s, 64, generator=gen) for _ in range(2))  # (B, H, S, D)
    return [t.requires_grad_(grad) for t in (q, k, v)]


def small_call_rows(
    repeats: int, time_interleaved: Callable, calls: int = 20, shapes=SHAPES
) -> list[dict]:
    """One row per (shape, grad): microseconds per call of attnkit and SDPA, and their ratio.
    `time_interleaved` is `attnkit.analysis.bench.time_interleaved` (passed in: that module
    imports this one)."""
    rows = []
    for grad in (False, True):
        for n, s, causal in shapes:
            q, k, v = _inputs(n, s, grad)
            top_left = causal and n == s  # SDPA's is_causal means ours only then

            def loop(call, grad=grad):
                def step():
                    with torch.set_grad_enabled(grad):
                        for _ in range(calls):
                            call()

                return step

            steps = {
                "attnkit": loop(lambda q=q, k=k, v=v, c=causal: attention(q, k, v, causal=c)),
                "sdpa": loop(
                    lambda q=q, k=k, v=v, c=top_left: F.scaled_dot_product_attention(
                        q, k, v, is_causal=c
                    )
                ),
            }
            ms = time_interleaved(steps, max(repeats, MIN_ROUNDS), stat=min, sample_s=1e-3)
            us = {impl: 1e3 * t / calls for impl, t in ms.items()}
            rows.append(
                {
                    "kind": "small_call",
                    **{"n": n, "s": s, "causal": causal, "grad": grad},
                    "us_per_call": us,
                    "ratio": us["attnkit"] / us["sdpa"],
                }
            )
    return rows


def markdown_lines(rows: list[dict]) -> list[str]:
    """The small-call table of bench.md (and of benchmarks/results/small-calls.md)."""
    small = [r for r in rows if r["kind"] == "small_call"]
    if not small:
        return []
    lines = [
        "",
        "| small call (B=1, H=8, D=64) | N | S | causal | grad | attnkit µs | SDPA µs | "
        "attnkit/SDPA |",
        "|---|---:|---:|---|---|---:|---:|---:|",
    ]
    for r in small:
        us = r["us_per_call"]
        what = "decode step" if r["n"] == 1 else "small model"
        lines.append(
            f"| {what} | {r['n']} | {r['s']} | {r['causal']} | {r['grad']} | "
            f"{us['attnkit']:.1f} | {us['sdpa']:.1f} | {r['ratio']:.2f} |"
        )
    return lines


def summary_lines(rows: list[dict]) -> list[str]:
    """One line per small-call row, as `attnkit bench` prints them."""
    lines = []
    for r in (r for r in rows if r["kind"] == "small_call"):
        us = r["us_per_call"]
        what = f"N={r['n']} S={r['s']}" + (" causal" if r["causal"] else "")
        lines.append(
            f"small call {what}, {'grad' if r['grad'] else 'no grad'}: attnkit "
            f"{us['attnkit']:.1f} µs, SDPA {us['sdpa']:.1f} µs ({r['ratio']:.2f}x SDPA)"
        )
    return lines
