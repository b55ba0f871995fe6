#!/usr/bin/env python3
"""Structured masks on the CPU: attnkit's descriptions vs the same masks as tensors, SDPA and
compiled FlexAttention (issue 29's targets), written to benchmarks/results/structured.{json,md}.

    python benchmarks/bench_structured.py            # the full table (~15 min on 2 cores)
    python benchmarks/bench_structured.py --quick    # N=1024 only, one thread (a smoke run)

The same as `attnkit bench --structured --out benchmarks/results --force`. Sizes: N=4096 times
every implementation; N=16384 leaves out the dense forward+backward (its ratio only grows with
N); N=65536 times the masks whose work is linear in N (windows, documents) and leaves out the
tensors (a 65536² mask is 4 GiB before any work). Compare ratios within one run: absolute
times drift up to 2x on shared machines.
"""

from __future__ import annotations

import sys
from pathlib import Path

from attnkit.cli.main import main

RESULTS = Path(__file__).resolve().parent / "results"

if __name__ == "__main__":
    # a --quick smoke run goes to attnkit-out/bench/, never over the committed results
    out = [] if "--quick" in sys.argv else ["--out", str(RESULTS), "--force"]
    sys.exit(main(["bench", "--structured", *out, *sys.argv[1:]]))
