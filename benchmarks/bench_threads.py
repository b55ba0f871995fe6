"""How many torch threads each command should use by default: every command's work at
--threads 1 and at one thread per core, on a quiet machine and with another process keeping
one core busy (a Python loop, as a second job on a shared machine would).

    PYTHONPATH=src python benchmarks/bench_threads.py [--runs 3]

Each case is the command itself, run in this process through `attnkit.cli.main.main` (its
imports are warm, so the times are the work), with small sizes: `lm sample` of 300 characters,
`seq2seq decode` (greedy and a beam of 4) of four sequences, `seq2seq eval` (500
sequences decoded as one batch), `explain` with its defaults, a
few training steps of `lm train`, `seq2seq train` and `train vit`. One round times every case
at 1 and at N threads, alternating, after one warm-up run each; the table gives the median
over --runs rounds and the ratio (N threads / 1 thread: above 1, the second thread costs).
Writes benchmarks/results/threads.json and threads.md. The machine is shared: read the ratios,
not the seconds; `docs/*/cli/index.md` ("Threads") turns them into the defaults.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEXT = "the cat sat on the mat. the dog sat on the log. " * 400


def cases(tmp: Path) -> dict[str, list[str]]:
    """Each command's argv (--threads is added), after the runs that make their checkpoints."""
    (tmp / "t.txt").write_text(TEXT)
    lm = ["lm", "train", "--text", str(tmp / "t.txt"), "--epochs", "1", "--quiet", "--force"]
    s2s = ["seq2seq", "train", "--task", "reverse", "--eval-size", "50", "--quiet", "--force"]
    setup = [
        [*lm, "--steps-per-epoch", "1", "--out", str(tmp / "lm")],
        [*s2s, "--steps", "1", "--eval-every", "1", "--out", str(tmp / "s2s")],
    ]
    for argv in setup:
        run(argv, threads=1)
    seqs = ["abcdefghijkl", "ponmlkjihgfedcba", "aaaabbbbcccc", "fedcbafedcba"]
    return {
        "lm sample (300 characters)": ["lm", "sample", "--checkpoint", str(tmp / "lm"),
                                       "--prompt", "the ", "--max-new-tokens", "300"],
        "seq2seq decode (greedy, 4 sequences)": ["seq2seq", "decode", str(tmp / "s2s"), *seqs],
        "seq2seq decode (beam 4, 4 sequences)": ["seq2seq", "decode", str(tmp / "s2s"), *seqs,
                                                 "--beam", "4"],
        "seq2seq eval (500 held-out, batched greedy)": ["seq2seq", "eval", str(tmp / "s2s")],
        "explain (defaults)": ["explain", "--out", str(tmp / "explain"), "--force", "--quiet"],
        "lm train (3 steps, batch 32 x 129, width 128)": [
            *lm, "--steps-per-epoch", "3", "--out", str(tmp / "lm-train")],
        "seq2seq train (5 steps, batch 64)": [
            *s2s, "--steps", "5", "--eval-every", "5", "--out", str(tmp / "s2s-train")],
        "train vit (4 steps, batch 32)": ["train", "vit", "--max-steps", "4", "--quiet",
                                           "--force", "--out", str(tmp / "vit")],
    }  # fmt: skip


def run(argv: list[str], threads: int) -> float:
    """Seconds `attnkit ARGV --threads T` takes in this process (its output swallowed)."""
    from attnkit.cli.main import main

    sink = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        code = main([*argv, "--threads", str(threads)])
    took = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"attnkit {' '.join(argv)}: exit {code}: {sink.getvalue()[-400:]}")
    return took


@contextlib.contextmanager
def busy_core(on: bool):
    """Another process spinning on one core while the block runs (nothing when not `on`)."""
    if not on:
        yield
        return
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        yield
    finally:
        hog.kill()
        hog.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="rounds (medians over them; default 3)")
    ap.add_argument("--only", help="run the cases whose name contains this text")
    ap.add_argument("--out", type=Path, default=HERE / "results", help="results folder")
    ap.add_argument("--render", action="store_true", help="only rewrite threads.md from .json")
    args = ap.parse_args()
    if args.render:
        print(render(args.out))
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    cores = os.cpu_count() or 1
    many = max(2, cores)
    load_start = [round(x, 2) for x in os.getloadavg()]
    rows = []
    with tempfile.TemporaryDirectory(prefix="attnkit-bench-threads-") as tmp:
        todo = {k: v for k, v in cases(Path(tmp)).items() if not args.only or args.only in k}
        for loaded in (False, True):
            with busy_core(loaded):
                for name, argv in todo.items():
                    for t in (1, many):  # warm-up
                        run(argv, t)
                    times: dict[int, list[float]] = {1: [], many: []}
                    for r in range(args.runs):
                        for t in (1, many) if r % 2 == 0 else (many, 1):
                            times[t].append(run(argv, t))
                    one, more = (statistics.median(times[t]) for t in (1, many))
                    row = {"case": name, "loaded": loaded, "s_1_thread": round(one, 3),
                           f"s_{many}_threads": round(more, 3), "ratio": round(more / one, 2),
                           "runs": args.runs}  # fmt: skip
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": cores,
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "load_average_start": load_start,
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "threads_compared": [1, many],
        "runs": args.runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "threads.json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    print(render(args.out))


def render(out: Path) -> str:
    """threads.md from threads.json (``--render`` redoes only this)."""
    data = json.loads((out / "threads.json").read_text())
    many = data["threads_compared"][1]
    lines = [
        f"Threads per command: median seconds of {data['runs']} in-process runs at 1 and {many} "
        f"threads ({data['date']}, {data['cpus']} CPUs, torch {data['torch']}; load average "
        f"{data['load_average_start']} at start, {data['load_average_end']} at end: the "
        'machine is shared with other jobs). "+ one busy core": another process spins on one '
        f"core as well. ratio = time at {many} threads / time at 1 thread (above 1: the extra "
        "thread costs).",
        "",
        f"| command | load | 1 thread s | {many} threads s | ratio |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for r in data["rows"]:
        state = "+ one busy core" if r["loaded"] else "as found"
        lines.append(f"| {r['case']} | {state} | {r['s_1_thread']:.2f} | "
                     f"{r[f's_{many}_threads']:.2f} | {r['ratio']:.2f} |")  # fmt: skip
    text = "\n".join(lines) + "\n"
    (out / "threads.md").write_text(text)
    return text


if __name__ == "__main__":
    main()
