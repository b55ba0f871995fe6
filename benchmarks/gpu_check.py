#!/usr/bin/env python3
"""attnkit on a GPU in one go: the suite's CUDA tests and the GPU benchmark, written as files.

    python3 benchmarks/gpu_check.py --out DIR                 # on the GPU machine (~8 min, H100)
    python3 benchmarks/gpu_check.py --out DIR --device cpu --quick   # the dry run CI takes

Run from the repository root with the machine's own python3 and torch (the GPU machine of this
workplace has a CUDA build of torch and pytest, and no network): it sets PYTHONPATH=src itself,
so nothing is installed. It writes at most six files into DIR: summary.md (what to paste into
a closing note), summary.json (the machine, torch, driver, counts), tests.xml and tests.log
(pytest's junit report and output), bench.json and bench.md (the timing rows). Each stage has
its own time budget, so the whole stays inside --minutes: the tests stop at their budget
(pytest's --timeout per test, and a wall-clock limit), the benchmark skips the rows it has no
time left for and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The tests that exercise a GPU when one is present (each skips with a reason without one).
CUDA_TESTS = (
    "tests/test_accelerators.py",
    "tests/test_devices.py",
    "tests/test_devices_forward.py",
    "tests/functional/test_flex_cuda.py",
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path, help="folder for the result files")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="default: cuda")
    p.add_argument("--minutes", type=float, default=8.0, help="total time budget (default 8)")
    p.add_argument("--quick", action="store_true", help="a few small rows, no Flex (a dry run)")
    p.add_argument("--skip-tests", action="store_true", help="only the benchmark")
    p.add_argument("--skip-bench", action="store_true", help="only the tests")
    p.add_argument(
        "--structured",
        action="store_true",
        help="bench the FlexAttention route's rows (structured masks, score functions) instead",
    )
    args = p.parse_args(argv)
    if not args.minutes > 0:
        p.error(f"--minutes must be > 0, got {args.minutes}")
    return args


def budgets(minutes: float, skip_tests: bool, skip_bench: bool) -> tuple[float, float]:
    """Seconds for (tests, bench): 45 % / 45 % of the whole, a tenth kept for start-up and the
    files; all of it to the one stage that runs when the other is skipped."""
    total = 0.9 * minutes * 60
    if skip_tests:
        return 0.0, total
    if skip_bench:
        return total, 0.0
    return total / 2, total / 2


def environment(device: str) -> dict:
    import torch

    import attnkit

    env = {
        "attnkit": attnkit.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "device": device,
    }
    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            cuda=torch.version.cuda,
            capability=f"{props.major}.{props.minor}",
        )
        try:
            query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
            env["driver"] = subprocess.run(query, capture_output=True, text=True).stdout.strip()
        except OSError:
            env["driver"] = None
    return env


def pytest_command(out: Path, budget_s: float) -> list[str]:
    per_test = max(30, int(budget_s / 4))
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *CUDA_TESTS,
        "-v",  # a line per test as it ends: the log holds what ran even if the budget cuts it
        "-ra",
        "-p",
        "no:cacheprovider",
        f"--junitxml={out / 'tests.xml'}",
    ]
    try:
        import pytest_timeout  # noqa: F401  (there on the GPU machine; optional elsewhere)

        cmd.append(f"--timeout={per_test}")
    except ImportError:
        pass
    return cmd


def junit_counts(path: Path) -> dict[str, int]:
    """passed / failed / errors / skipped from pytest's junit XML (zeros when it is missing)."""
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    if not path.exists():
        return counts
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        if "failure" in kinds:
            counts["failed"] += 1
        elif "error" in kinds:
            counts["errors"] += 1
        elif "skipped" in kinds:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts


def run_tests(out: Path, budget_s: float) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + str(ROOT)}
    env.setdefault("HF_HUB_OFFLINE", "1")
    started = time.monotonic()
    with open(out / "tests.log", "w") as log:
        try:
            cmd = pytest_command(out, budget_s)
            done = subprocess.run(
                cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=budget_s
            )
            code = done.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    return {
        "exit": code,
        "seconds": round(time.monotonic() - started, 1),
        **junit_counts(out / "tests.xml"),
    }


def mha_train_step_ms(device: str, *, repeats: int = 5, shape=(8, 512, 512, 8)) -> dict:
    """One training step (forward + backward, dropout 0.1, need_weights=False) of
    `torch.nn.MultiheadAttention` and of `attnkit.nn.MultiheadAttention` with the same weights,
    float32: median ms each. shape: (B, N, C, heads)."""
    import torch

    from attnkit.analysis.bench_device import time_steps
    from attnkit.nn import MultiheadAttention

    device = torch.device(device)
    b, n, c, heads = shape
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(c, heads, dropout=0.1, batch_first=True)
    ours = MultiheadAttention(c, heads, dropout=0.1, batch_first=True)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(b, n, c, device=device)

    def step_of(module):
        module.to(device=device, dtype=x.dtype).train()

        def step() -> None:
            module.zero_grad(set_to_none=True)
            out, _ = module(x, x, x, need_weights=False)
            out.float().sum().backward()

        return step

    return time_steps({"torch": step_of(ref), "attnkit": step_of(ours)}, device, repeats)


def run_bench(out: Path, device: str, budget_s: float, quick: bool, structured=False) -> dict:
    from attnkit.analysis.bench_device import (
        device_plan,
        results_json,
        rows_markdown,
        run_rows,
        structured_plan,
    )

    started = time.monotonic()
    mha = mha_train_step_ms(device, shape=(2, 32, 32, 4) if quick else (8, 512, 512, 8))
    if structured:
        plan = structured_plan((256,), "float32", 16) if quick else structured_plan()
    else:
        plan = device_plan(quick)
    rows = run_rows(
        plan,
        device,
        repeats=3 if quick else 5,
        budget_s=max(0.0, budget_s - (time.monotonic() - started)),
        flex=not quick,
        log=lambda line: print(line, flush=True),
    )
    payload = {"mha_train_step_ms": mha, "rows": json.loads(results_json(rows))}
    (out / "bench.json").write_text(json.dumps(payload, indent=1))
    md = rows_markdown(rows, f"attention on {device}")
    md += (
        f"\nMultiheadAttention train step (B=8, N=512, C=512, 8 heads, dropout 0.1): "
        f"torch {mha['torch']:.2f} ms, attnkit {mha['attnkit']:.2f} ms\n"
    )
    (out / "bench.md").write_text(md)
    done = [r for r in rows if r.ms]
    return {
        "rows": len(rows),
        "timed": len(done),
        "errors": sum(bool(r.error) for r in rows),
        "skipped": sum(r.skipped for r in rows),
        "mha_train_step_ms": mha,
        "seconds": round(time.monotonic() - started, 1),
    }


def summary_markdown(summary: dict) -> str:
    env, lines = summary["environment"], ["# attnkit GPU check", ""]
    lines.append(", ".join(f"{k} {v}" for k, v in env.items() if v is not None))
    if "tests" in summary:
        t = summary["tests"]
        counts = f"{t['passed']} passed, {t['failed']} failed, {t['errors']} errors"
        lines += [
            "",
            f"tests ({t['seconds']} s, exit {t['exit']}): {counts}, {t['skipped']} skipped",
        ]
    if "bench" in summary:
        b = summary["bench"]
        lines += [
            "",
            f"bench ({b['seconds']} s): {b['timed']} of {b['rows']} rows timed, "
            f"{b['errors']} errors, {b['skipped']} skipped for time (bench.md)",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (use --device cpu for a dry run)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    tests_s, bench_s = budgets(args.minutes, args.skip_tests, args.skip_bench)
    summary = {"environment": environment(args.device)}
    if not args.skip_tests:
        print(f"gpu_check: CUDA tests (budget {tests_s:.0f} s) ...", flush=True)
        summary["tests"] = run_tests(args.out, tests_s)
    if not args.skip_bench:
        print(f"gpu_check: benchmark (budget {bench_s:.0f} s) ...", flush=True)
        summary["bench"] = run_bench(
            args.out, args.device, bench_s, args.quick, structured=args.structured
        )
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    text = summary_markdown(summary)
    (args.out / "summary.md").write_text(text)
    print(text, end="")
    print(f"gpu_check: wrote {len(list(args.out.iterdir()))} files to {args.out}/")
    failed = summary.get("tests", {}).get("failed", 0) + summary.get("tests", {}).get("errors", 0)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
