"""How long `attnkit explain` takes, and attnkit's BERT forward pass vs transformers.BertModel.

    python benchmarks/bench_explain.py [--repeats 15] [--runs 3] [--out attnkit-out/bench]

Measures (medians, after warm-up):
* end to end: wall time of `python -m attnkit explain --out TMP` (startup, load,
  forward, render, write), and of `python -c "import attnkit"` (startup alone);
* in process: BertEncoder.from_pretrained, and the forward pass of attnkit's
  BertEncoder (fused backend, and while recording attention) against
  transformers.BertModel with attn_implementation="eager", same weights and input.

Prints a markdown table and writes it with the raw numbers (JSON) into --out.
Needs transformers (test dependency) for the comparison; the CLI never imports it.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import attnkit
from attnkit.models import BertEncoder, Tokenizer, default_checkpoint

SENTENCE = "The animal didn't cross the street because it was too tired"


def median_time(fn, repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved(fns, repeats: int, warmup: int = 3) -> list[float]:
    """Median time of each of `fns`, called in turn each round so that load changes on a
    shared machine hit all of them alike."""
    times: list[list[float]] = [[] for _ in fns]
    for r in range(warmup + repeats):
        for fn, bucket in zip(fns, times, strict=True):
            start = time.perf_counter()
            fn()
            if r >= warmup:
                bucket.append(time.perf_counter() - start)
    return [statistics.median(b) for b in times]


def wall(cmd: list[str], runs: int) -> tuple[float, int]:
    """Median wall time of `cmd` over `runs` runs and its last exit code."""
    times, code = [], 0
    for _ in range(runs):
        start = time.perf_counter()
        code = subprocess.run(cmd, capture_output=True).returncode
        times.append(time.perf_counter() - start)
    return statistics.median(times), code


def forward_rows(folder: Path, repeats: int) -> list[dict]:
    import transformers

    tokenizer = Tokenizer.from_pretrained(folder)
    ours = BertEncoder.from_pretrained(folder)
    theirs = transformers.BertModel.from_pretrained(str(folder), attn_implementation="eager").eval()
    inputs = {
        "1 x 15 (explain)": tokenizer.encode(SENTENCE),
        "8 x 128 (padded batch)": tokenizer.encode_batch(
            [" ".join([SENTENCE] * (1 + i % 9))[: 60 + 70 * (i % 9)] for i in range(8)]
        ),
    }
    rows = []
    for label, enc in inputs.items():
        args = enc.model_inputs()

        def run_ours(args=args):
            ours(**args)

        def run_recorded(args=args):
            with attnkit.record_attention(ours):
                ours(**args)

        def run_theirs(args=args):
            theirs(**args)

        with torch.inference_mode():
            t_ours, t_rec, t_theirs = interleaved([run_ours, run_recorded, run_theirs], repeats)
        rows.append(
            {
                "input": f"{label} {tuple(enc.input_ids.shape)}",
                "attnkit_ms": 1e3 * t_ours,
                "attnkit_recording_ms": 1e3 * t_rec,
                "transformers_eager_ms": 1e3 * t_theirs,
                "ratio": t_ours / t_theirs,
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15, help="timed forward passes")
    parser.add_argument("--runs", type=int, default=3, help="timed CLI runs")
    parser.add_argument("--out", type=Path, default=Path("attnkit-out") / "bench")
    parser.add_argument("--threads", type=int, help="torch threads in process (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    folder = default_checkpoint()

    python = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        explain_s, code = wall([python, "-m", "attnkit", "explain", "--out", tmp], args.runs)
    import_s, _ = wall([python, "-c", "import attnkit"], args.runs)
    load_s = median_time(lambda: BertEncoder.from_pretrained(folder), 3, warmup=1)
    rows = forward_rows(folder, args.repeats)

    lines = [
        f"# attnkit explain benchmark ({platform.machine()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads)",
        "",
        "| step | median |",
        "| --- | ---: |",
        f"| `python -m attnkit explain` end to end (exit {code}) | {explain_s:.2f} s |",
        f"| `python -c 'import attnkit'` (startup) | {import_s:.2f} s |",
        f"| `BertEncoder.from_pretrained` (all-MiniLM-L6-v2) | {load_s:.3f} s |",
        "",
        "| input (B, N) | attnkit fused | attnkit recording | transformers eager | ratio |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['input']} | {r['attnkit_ms']:.2f} ms | {r['attnkit_recording_ms']:.2f} ms "
            f"| {r['transformers_eager_ms']:.2f} ms | {r['ratio']:.2f} |"
        )
    lines.append("")
    lines.append("ratio = attnkit fused / transformers eager (below 1: attnkit is faster).")
    text = "\n".join(lines)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_explain.md").write_text(text + "\n")
    raw = {"explain_s": explain_s, "explain_exit": code, "import_s": import_s, "load_s": load_s}
    (args.out / "bench_explain.json").write_text(json.dumps({**raw, "forward": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
