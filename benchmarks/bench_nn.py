"""The drop-in `attnkit.nn.MultiheadAttention` against `torch.nn.MultiheadAttention` (CPU).

Both modules hold the same weights (the drop-in loads torch's state dict) and take the same
call. A training step is forward + backward of `out.sum()` with respect to the input and the
weights, at B=8, N=512, C=512, 8 heads (PERF-NOTES' MHA shape), self-attention, with dropout
0.1 and 0, for torch's default call (`need_weights=True`, which returns the averaged
weights) and for `need_weights=False`; one row more for an eval forward under no_grad (torch's
inference fast path). Timings: a warm-up call each, then interleaved repeats in a shuffled
order, medians; the ratio is torch's median over attnkit's (> 1: the drop-in is faster), both
measured in the same process. Prints a markdown table and writes benchmarks/results/nn.json
and the table in nn.md (quoted by docs/en/guides/interop.md).

    python benchmarks/bench_nn.py [--repeats 7] [--threads 2]
    python benchmarks/bench_nn.py --tiny      # a seconds-long smoke run, writes nothing

Take numbers on a quiet machine only: under contention the ratios drift.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from torch import nn

from attnkit._cpu import cpu_name
from attnkit._io import atomic_write_json, atomic_write_text
from attnkit.analysis.bench import time_interleaved
from attnkit.nn import MultiheadAttention

RESULTS = Path(__file__).parent / "results" / "nn.json"


def rows_for(shape, repeats: int) -> list[dict]:
    b, n, c, heads = shape
    rows = []
    for dropout, need_weights, train in [
        (0.1, True, True),
        (0.1, False, True),
        (0.0, True, True),
        (0.0, False, True),
        (0.0, False, False),
    ]:
        torch.manual_seed(0)
        theirs = nn.MultiheadAttention(c, heads, dropout=dropout, batch_first=True)
        ours = MultiheadAttention(c, heads, dropout=dropout, batch_first=True)
        ours.load_state_dict(theirs.state_dict())
        theirs.train(train), ours.train(train)
        x = torch.randn(b, n, c, requires_grad=train)
        if not train:
            with torch.no_grad():  # the same numbers first (torch's fast path included)
                want, got = theirs(x, x, x)[0], ours(x, x, x)[0]
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)

        def step(m, _x=x, _nw=need_weights, _train=train):
            if _train:
                m.zero_grad(set_to_none=True)
                _x.grad = None
                m(_x, _x, _x, need_weights=_nw)[0].sum().backward()
            else:
                with torch.no_grad():
                    m(_x, _x, _x, need_weights=_nw)

        ms = time_interleaved(
            {"torch": lambda m=theirs: step(m), "attnkit": lambda m=ours: step(m)}, repeats
        )
        rows.append(
            {
                "what": "train step (fwd+bwd)" if train else "eval forward, no_grad",
                "dropout": dropout,
                "need_weights": need_weights,
                "shape": [b, n, c, heads],
                "ms": ms,
                "ratio": ms["torch"] / ms["attnkit"],
            }
        )
    return rows


def markdown_lines(rows: list[dict], env: dict) -> list[str]:
    b, n, c, heads = rows[0]["shape"]
    lines = [
        f"B={b}, N={n}, C={c}, {heads} heads, float32, {env['threads']} threads, {env['cpu']}, "
        f"torch {env['torch']}; medians of {env['repeats']} interleaved repeats, one process.",
        "",
        "| call | dropout | need_weights | torch.nn (ms) | attnkit.nn (ms) | torch / attnkit |",
        "| --- | ---: | --- | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['what']} | {r['dropout']} | {r['need_weights']} | {r['ms']['torch']:.0f} | "
            f"{r['ms']['attnkit']:.0f} | {r['ratio']:.2f}× |"
        )
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--tiny", action="store_true", help="tiny sizes: checks the script runs")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    shape = (8, 512, 512, 8)
    if args.tiny:
        shape, args.repeats = (2, 16, 16, 2), 1
    load = os.getloadavg()
    rows = rows_for(shape, args.repeats)
    env = {
        "torch": torch.__version__.split("+")[0],
        "threads": torch.get_num_threads(),
        "cpu": cpu_name(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "load_avg_start": load,
        "load_avg_end": os.getloadavg(),
        "repeats": args.repeats,
    }
    table = "\n".join(markdown_lines(rows, env))
    print(table)
    print(f"\n{env}")
    if args.tiny:
        return  # a smoke run writes no results
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, {"env": env, "rows": rows})
    md = args.out.with_suffix(".md")  # quoted verbatim by the interop guide (tests/nn)
    atomic_write_text(md, table.strip() + "\n")


if __name__ == "__main__":
    main()
