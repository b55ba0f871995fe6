"""Train ViT, T2T-ViT and CNN+CBAM on the 8×8 digits with the CLI defaults; write a table.

    PYTHONPATH=src python benchmarks/vision_digits.py [--out DIR] [--models vit t2t cnn]

Each model is trained by `python -m attnkit train MODEL` in a fresh process
(one after the other); wall-clock time includes data loading and evaluation
after every epoch. Results: DIR/vision_digits.json and docs/en/results/vision.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "attnkit-out" / "bench-digits")
    parser.add_argument("--models", nargs="+", default=["vit", "t2t", "cnn"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    rows = []
    for model in args.models:
        run = args.out / model
        if (run / "checkpoint.pt").exists():
            (run / "checkpoint.pt").unlink()
        load_before = os.getloadavg()[0]
        started = time.perf_counter()
        cmd = [sys.executable, "-m", "attnkit", "train", model, "--out", str(run), "--no-progress"]
        subprocess.run([*cmd, "--seed", str(args.seed)], env=env, check=True)
        seconds = time.perf_counter() - started
        metrics = json.loads((run / "metrics.json").read_text())
        last = metrics["history"][-1]
        rows.append(
            {
                "model": model,
                "test_acc": last["test_acc"],
                "best_test_acc": max(r["test_acc"] for r in metrics["history"]),
                "epochs": last["epoch"],
                "params": metrics["params"],
                "train_seconds": last["seconds"],
                "wall_seconds": round(seconds, 1),
                "load_1min_before": round(load_before, 2),
                "load_1min_after": round(os.getloadavg()[0], 2),
            }
        )
        print(rows[-1], flush=True)
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "torch_threads": _torch_threads(),
        "rows": rows,
    }
    (args.out / "vision_digits.json").write_text(json.dumps(result, indent=2) + "\n")
    print(_markdown(result))
    return 0


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _markdown(result: dict) -> str:
    lines = [
        "| model | test accuracy (final epoch) | training time | wall time | params | epochs | "
        "1-min load before / after |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['model']} | {r['test_acc']:.2%} | {r['train_seconds']:.0f} s | "
            f"{r['wall_seconds']:.0f} s | {r['params']:,} | {r['epochs']} | "
            f"{r['load_1min_before']} / {r['load_1min_after']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
