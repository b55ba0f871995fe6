"""How long users wait for the command line: `attnkit --help`, `--version`, a usage error and
`attnkit explain` with its defaults, each as a fresh process (wall time, median of --runs).

    PYTHONPATH=src python benchmarks/bench_cli.py [--runs 5] [--explain-runs 3]

Writes benchmarks/results/cli.json and cli.md. Also times `python -c "import torch"`, the
floor under any command that computes something, and the imports `attnkit explain` needs
(torch, attnkit's BERT, tokenizers, Pillow), so the numbers read as ratios on a loaded
machine. The goal (issue 16): explain with its defaults in <= 3 s on a quiet 2-core CPU.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PY = sys.executable


def wall(argv: list[str], expect: int, env: dict) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, env=env, check=False)
    took = time.perf_counter() - start
    if done.returncode != expect:
        raise SystemExit(f"{argv}: exit {done.returncode}, wanted {expect}: {done.stderr[-400:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="runs of each fast case (default 5)")
    ap.add_argument("--explain-runs", type=int, default=3, help="runs of explain (default 3)")
    ap.add_argument("--out", type=Path, default=HERE / "results", help="results folder")
    args = ap.parse_args()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out_dir = Path(tempfile.mkdtemp(prefix="attnkit-bench-cli-"))
    cli = [PY, "-m", "attnkit"]
    cases = {
        "attnkit --help": ([*cli, "--help"], 0, args.runs),
        "attnkit --version": ([*cli, "--version"], 0, args.runs),
        "usage error (flops --dim x)": ([*cli, "flops", "--dim", "x"], 2, args.runs),
        "python -c 'import torch'": ([PY, "-c", "import torch"], 0, args.runs),
        # torch plus attnkit's BERT, attention and tokenizer code: the floor under explain
        "import what explain needs": (
            [PY, "-c", "import attnkit.models, attnkit.viz.record, tokenizers, PIL.Image"],
            0,
            args.runs,
        ),
        "attnkit explain (defaults)": (
            [*cli, "explain", "--out", str(out_dir), "--force"], 0, args.explain_runs,
        ),
    }  # fmt: skip
    rows = []
    for name, (argv, expect, runs) in cases.items():
        wall(argv, expect, env)  # warm the file cache once
        times = [wall(argv, expect, env) for _ in range(runs)]
        rows.append({"case": name, "median_s": statistics.median(times), "runs": times})
        print(f"{name:32s} median {statistics.median(times):.3f} s", file=sys.stderr)
    result = {
        "meta": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_avg": os.getloadavg(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        },
        "rows": rows,
    }
    sys.path.insert(0, str(HERE.parent / "src"))
    from attnkit._io import atomic_write_json, atomic_write_text

    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / "cli.json", result)
    lines = [
        f"CLI wall time, median of fresh processes ({result['meta']['date']}, "
        f"{result['meta']['cpus']} CPUs, load {result['meta']['load_avg'][0]:.1f})",
        "",
        "| command | median s | runs |",
        "| --- | ---: | ---: |",
        *(f"| {r['case']} | {r['median_s']:.3f} | {len(r['runs'])} |" for r in rows),
    ]
    atomic_write_text(args.out / "cli.md", "\n".join(lines) + "\n")
    print(f"bench_cli: wrote {args.out / 'cli.json'} and {args.out / 'cli.md'}")


if __name__ == "__main__":
    main()
