"""From RNNs to the Transformer on one task: train every seq2seq model kind with the
defaults of `attnkit seq2seq train` (reverse, 10-20 symbols) and tabulate exact match per
source length and training time.

Each row is one command, run as its own process (`python -m attnkit seq2seq train ...
--json`), then `seq2seq eval --by-length --json` on the checkpoint. Writes
benchmarks/results/seq2seq.json (what the results page's table is checked against) and
seq2seq.md (the table), and copies each run's first alignment picture into docs/assets/img/.

    PYTHONPATH=src python benchmarks/seq2seq_table.py            # all rows, ~15-30 min
    PYTHONPATH=src python benchmarks/seq2seq_table.py --only rnn-additive --jobs 2
    PYTHONPATH=src python benchmarks/seq2seq_table.py --quick --out /tmp/t.json  # smoke run

Training time is wall clock of the training loop: take it on a quiet machine (one run at a
time, --jobs 1); the exact-match figures do not depend on the load.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# (key, label, extra argv of `attnkit seq2seq train`)
ROWS = [
    ("transformer", "Transformer (tiny: 2+2 layers)", ["--model", "transformer"]),
    ("rnn-none", "RNN (GRU), no attention", ["--model", "rnn", "--attention", "none"]),
    ("rnn-additive", "RNN (GRU) + additive", ["--model", "rnn", "--attention", "additive"]),
    ("rnn-dot", "RNN (GRU) + dot", ["--model", "rnn", "--attention", "dot"]),
    ("universal", "Universal Transformer (4 steps)", ["--model", "universal"]),
    ("universal-act", "Universal Transformer + ACT", ["--model", "universal", "--act"]),
]
QUICK = ["--steps", "4", "--eval-every", "2", "--eval-size", "10", "--batch-size", "8"]
EXAMPLE = "hbdkapcmgfjeo"  # 13 symbols, decoded for the alignment pictures
SHOWN_LENGTHS = (10, 12, 14, 16, 18, 20)  # columns of the table (the JSON has every length)


def _attnkit(*argv: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "attnkit", "seq2seq", *argv, "--json"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_row(
    key: str, label: str, extra: list[str], runs: Path, quick: bool, per_length: int, collect: bool
):
    out = runs / key
    if collect:  # the run's latest evaluation, finished or not
        train = json.loads((out / "metrics.json").read_text())
    else:
        train = _attnkit("train", *extra, "--out", str(out), "--force", *(QUICK if quick else []))
    ev = _attnkit("eval", str(out), "--by-length", "--eval-size", str(per_length))
    budget = 4 if quick else 1500  # the default --steps
    if key != "rnn-none" and not (out / "alignment_0.png").exists():  # an unfinished run
        _attnkit("decode", str(out), EXAMPLE, "--alignment-dir", str(out / "picture"))
    print(f"{key}: {train['exact_match']:.3f} in {train['seconds']} s", file=sys.stderr)
    return {
        "key": key,
        "label": label,
        "argv": ["attnkit", "seq2seq", "train", *extra],
        "exact_match": train["exact_match"],
        "step": train["step"],
        "seconds": train["seconds"],
        "params": train["params"],
        "by_length": ev["by_length"],
        "per_length": per_length,
        "finished": train["step"] >= budget or train["exact_match"] >= 1.0,
    }


def markdown(result: dict) -> str:
    """The table docs/en/results/seq2seq.md and its Chinese twin quote."""
    lengths = [str(n) for n in SHOWN_LENGTHS]
    head = "| model | params | exact match | steps | train time (s) | "
    head += " | ".join(f"n={n}" for n in lengths) + " |"
    lines = [
        head,
        "| --- | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in lengths) + " |",
    ]
    for r in result["rows"]:
        cells = [f"{100 * r['by_length'][n]:.0f}%" if n in r["by_length"] else "-" for n in lengths]
        label = r["label"] + ("" if r["finished"] else " *(unfinished)*")
        lines.append(
            f"| {label} | {r['params']:,} | {100 * r['exact_match']:.1f}% | {r['step']} | "
            f"{r['seconds']:.0f} | " + " | ".join(cells) + " |"
        )
    meta = result["meta"]
    lines.append("")
    lines.append(
        f"Exact match: greedy decoding of {meta['eval_size']} held-out sequences of length "
        f"10-20 at the end of training; n=L: {meta['per_length']} held-out sequences of "
        f"length L. Train time: wall clock on {meta['machine']}, 1 thread, load average "
        f"{meta['load_start']} at start and {meta['load_end']} at end ({meta['note']})."
    )
    if not all(r["finished"] for r in result["rows"]):
        lines.append(
            "*(unfinished)*: the run was still training when the table was collected "
            "(`--collect`); its figures are those of its latest evaluation."
        )
    return "\n".join(lines) + "\n"


BEGIN = "<!-- seq2seq-table: written by benchmarks/seq2seq_table.py -->"
END = "<!-- /seq2seq-table -->"
# the docs site quotes it on both language versions of its results page
QUOTED_IN = tuple(ROOT / "docs" / lang / "results" / "seq2seq.md" for lang in ("en", "zh"))


def quote(table: str, path: Path) -> None:
    """Put `table` between the BEGIN and END markers of `path`."""
    text = path.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    from attnkit._io import atomic_write_text

    atomic_write_text(path, f"{head}{BEGIN}\n{table}{END}{tail}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="+", choices=[r[0] for r in ROWS], help="rows to run")
    p.add_argument("--runs", type=Path, default=Path("attnkit-out/seq2seq-table"))
    p.add_argument("--out", type=Path, default=HERE / "results" / "seq2seq.json")
    p.add_argument(
        "--images", type=Path, default=ROOT / "docs" / "assets" / "img", help="alignment PNGs"
    )
    p.add_argument("--per-length", type=int, default=100, help="held-out examples per length")
    p.add_argument("--jobs", type=int, default=1, help="runs at once (1 for honest times)")
    p.add_argument("--quick", action="store_true", help="4 training steps: a smoke run")
    p.add_argument(
        "--collect",
        action="store_true",
        help="train nothing: tabulate the runs already in --runs (finished or not)",
    )
    p.add_argument("--note", default="a quiet machine", help="what else ran (for the table)")
    args = p.parse_args()
    rows = [r for r in ROWS if args.only is None or r[0] in args.only]
    load_start = [round(x, 1) for x in os.getloadavg()]
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = [
            pool.submit(run_row, *row, args.runs, args.quick, args.per_length, args.collect)
            for row in rows
        ]
        done = [f.result() for f in futures]
    previous = json.loads(args.out.read_text())["rows"] if args.only and args.out.exists() else []
    keep = {r["key"] for r in done}
    merged = {r["key"]: r for r in previous if r["key"] not in keep} | {r["key"]: r for r in done}
    result = {
        "meta": {
            "date": datetime.date.today().isoformat(),
            "machine": f"{platform.machine()} {os.cpu_count()} cores",
            "python": platform.python_version(),
            "torch": __import__("torch").__version__,
            "eval_size": 10 if args.quick else 500,
            "per_length": args.per_length,
            "load_start": load_start,
            "load_end": [round(x, 1) for x in os.getloadavg()],
            "note": args.note,
            "quick": args.quick,
        },
        "rows": [merged[key] for key, _, _ in ROWS if key in merged],
    }
    from attnkit._io import atomic_write_text

    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(result, indent=1) + "\n")
    atomic_write_text(args.out.with_suffix(".md"), markdown(result))
    if not args.quick:
        for r in done:
            # the first held-out sequence, as the train command drew it at the end
            picture = args.runs / r["key"] / "alignment_0.png"
            if not picture.exists():
                picture = args.runs / r["key"] / "picture" / "alignment_0.png"
            if picture.exists():
                shutil.copyfile(picture, args.images / f"seq2seq-{r['key']}-alignment.png")
    if not args.quick and args.out == HERE / "results" / "seq2seq.json":
        for path in QUOTED_IN:
            quote(markdown(result), path)
    print(markdown(result))


if __name__ == "__main__":
    main()
