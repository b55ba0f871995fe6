"""Small calls: `attnkit.attention` against SDPA per call (the rows `attnkit bench` prints).

B=1, H=8, D=64, float32; N=S=16 and 64, a decode step N=1 against S=128, with and without
``causal=True``, under ``torch.no_grad`` and with inputs that require gradients (forward).
Timings (one process): a warm-up call each, then attnkit and SDPA interleaved in a fresh
order per round, samples of about 1 ms; the best sample of each
(`attnkit.analysis.bench_small`). The compiled kernel is loaded first, as `attnkit bench`
does: rule 1's check of q is then its scan (`attnkit.functional.native.finite_check`); a
process that never loads it checks with a sum of q (~1.5 µs more per call). Prints the
markdown table and writes benchmarks/results/small-calls.json and the table in
small-calls.md (included by the benchmarks page).

    python benchmarks/bench_small_calls.py [--threads 1] [--repeats 201]
    python benchmarks/bench_small_calls.py --tiny     # a seconds-long smoke run, no files

Compare the ratio column: on a loaded machine absolute times drift, the ratio far less.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from attnkit._cpu import cpu_name
from attnkit._io import atomic_write_json, atomic_write_text
from attnkit.analysis.bench import time_interleaved
from attnkit.analysis.bench_small import markdown_lines, small_call_rows
from attnkit.analysis.bench_structured import machine
from attnkit.functional import native


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=201, help="interleaved samples per row")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: stable)")
    p.add_argument("--tiny", action="store_true", help="few calls: checks the script runs")
    out = Path(__file__).parent / "results" / "small-calls.json"
    p.add_argument("--out", type=Path, default=out)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    kernel = "compiled" if native.available() else "pytorch"  # loads it, as `attnkit bench`
    load = os.getloadavg()
    calls = 5 if args.tiny else 20
    rows = small_call_rows(args.repeats, time_interleaved, calls=calls)
    env = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": cpu_name(),
        "machine": machine(),  # the CPU with its widest vector units, and torch
        "chunked_kernel": kernel,
        "load_avg_start": load,
        "load_avg_end": os.getloadavg(),
        "repeats": args.repeats,
        "calls_per_sample": calls,
    }
    table = "\n".join(markdown_lines(rows)).strip() + "\n"
    print(table)
    print(env)
    if args.tiny:
        print("bench_small_calls: smoke run, nothing written")
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, {"env": env, "rows": rows})
    md = args.out.with_suffix(".md")  # included by docs/{en,zh}/results/benchmarks.md
    cpu = f"{env['machine']}, {env['threads']} thread, kernel {kernel}"
    atomic_write_text(md, table + f"\n{cpu}; load average {load[0]:.1f} at the start.\n")
    print(f"bench_small_calls: wrote {args.out} and {md}")


if __name__ == "__main__":
    main()
