"""Cached greedy generation: attnkit's GPT against a plain PyTorch GPT of the same size (CPU).

The plain GPT (`attnkit.analysis.bench_decode.PlainGPT`, also used by `attnkit bench`) is
nanoGPT's model with a preallocated key/value cache and `F.scaled_dot_product_attention`,
holding a copy of the attnkit GPT's weights; both generate the same tokens (checked).
Timings: a warm-up call each, then interleaved repeats, medians (same-process ratios: compare
columns of one run, not runs on different days). Prints a markdown table and writes
benchmarks/results/decode.json and the table in decode.md (included by the docs: benchmarks and
language-model pages).

    python benchmarks/bench_decode.py [--batches 1 8] [--new-tokens 128] [--threads 1]
    python benchmarks/bench_decode.py --tiny      # a seconds-long smoke run

Take numbers on a quiet machine only: under contention the ratios drift.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from attnkit._cpu import cpu_name
from attnkit._io import atomic_write_json, atomic_write_text
from attnkit.analysis.bench import time_interleaved
from attnkit.analysis.bench_decode import DecodeShape, decode_rows, markdown_lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: stable)")
    p.add_argument("--tiny", action="store_true", help="tiny sizes: checks the script runs")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "decode.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    shape = DecodeShape(
        n_layer=args.layers,
        n_head=args.heads,
        d_model=args.d_model,
        context=args.context,
        prompt=args.prompt,
        new_tokens=args.new_tokens,
        batches=tuple(args.batches),
    )
    if args.tiny:
        shape = DecodeShape(2, 2, 32, 32, prompt=4, new_tokens=8, batches=tuple(args.batches))
        args.repeats = 1
    load = os.getloadavg()
    rows = decode_rows(shape, args.repeats, time_interleaved)
    env = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": cpu_name(),
        "load_avg_start": load,
        "load_avg_end": os.getloadavg(),
        "shape": shape.__dict__,
        "repeats": args.repeats,
    }
    print("\n".join(markdown_lines(rows)))
    print(f"\n{env}")
    if args.tiny:
        return  # a smoke run writes no results
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, {"env": env, "rows": rows})
    table = args.out.with_suffix(".md")  # included by docs pages (tests/docs/test_results_pages.py)
    atomic_write_text(table, "\n".join(markdown_lines(rows)).strip() + "\n")


if __name__ == "__main__":
    main()
