"""Thin script over `attnkit bench` (the measuring code is `attnkit.analysis.bench`).

Same options as the subcommand; results go to benchmarks/results/ unless --out is given.

    PYTHONPATH=src python benchmarks/bench_attention.py --threads 1      # the full run
    PYTHONPATH=src python benchmarks/bench_attention.py --quick          # < 1 minute
"""

from __future__ import annotations

import sys
from pathlib import Path

from attnkit.cli.main import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    if not any(a == "--out" or a.startswith("--out=") for a in argv):
        argv += ["--out", str(Path(__file__).parent / "results")]
    sys.exit(main(["bench", *argv]))
