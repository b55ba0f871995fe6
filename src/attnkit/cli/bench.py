"""`attnkit bench`: time attnkit's attention against torch on this CPU; JSON + markdown.

    attnkit bench --quick                 # small sizes, under a minute
    attnkit bench --threads 1 --out DIR   # the full run (tens of minutes)

Progress goes to stderr; the last line on stdout says where the results are.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnkit.cli._errors import UsageError

PROG = "attnkit bench"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark attention backends against torch (time, memory, targets)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="small sizes and few repeats (< 1 min)")
    p.add_argument(
        "--json", type=Path, metavar="FILE", help="results JSON (default OUT/bench.json)"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("bench-results"),
        metavar="DIR",
        help="directory for bench.json, bench.md, readme.md (default ./bench-results)",
    )
    p.add_argument("--threads", type=int, metavar="T", help="torch threads (default: torch's)")
    p.add_argument("--sizes", type=int, nargs="+", metavar="N", help="override the kernel N list")
    p.add_argument("--dtypes", nargs="+", choices=("float32", "bfloat16"), help="kernel dtypes")
    p.add_argument("--repeats", type=int, metavar="R", help="timed repeats per row")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    p.set_defaults(run=run)


def plan_from_args(args):
    from attnkit.analysis.bench import Plan

    for name in ("threads", "repeats"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name} must be at least 1, got {value}")
    if args.sizes and min(args.sizes) < 1:
        raise UsageError(f"--sizes must be positive, got {args.sizes}")
    if args.quick:
        # one memory subprocess (target b's case): each costs a torch import
        plan = Plan(sizes=(128, 256), repeats=2, target_size=256, large_mask_size=0,
                    module_shape=(2, 128, 128, 4), sgemm_size=1024)  # fmt: skip
    else:
        plan = Plan(sizes=(256, 1024, 4096), memory_sizes=(2048,), repeats=3)
    changes = {"sizes": tuple(args.sizes)} if args.sizes else {}
    if args.dtypes:
        changes["dtypes"] = tuple(args.dtypes)
    if args.repeats:
        changes["repeats"] = args.repeats
    if args.no_memory:
        changes |= {"memory_sizes": (), "large_mask_size": 0, "memory_impls": ()}
    return plan.__class__(**{**plan.__dict__, **changes})


def run(args) -> int:
    import torch

    plan = plan_from_args(args)
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        return _run(args, plan)
    finally:
        torch.set_num_threads(threads)  # main() may be called in-process (tests)


def _run(args, plan) -> int:
    import torch

    from attnkit._io import atomic_write_json, atomic_write_text
    from attnkit.analysis.bench import run_benchmark
    from attnkit.analysis.bench_report import markdown, readme_section

    json_path = args.json or args.out / "bench.json"
    md_path, readme_path = args.out / "bench.md", args.out / "readme.md"
    for path in (json_path, md_path, readme_path):
        if path.exists() and path.is_dir():
            raise UsageError(f"{path} is a directory; pass a file name")

    def log(msg: str) -> None:
        print(f"[bench] {msg}", file=sys.stderr, flush=True)

    log(f"{torch.get_num_threads()} threads; plan {plan}")
    result = run_benchmark(plan, log=log)
    try:
        atomic_write_json(json_path, result)
        atomic_write_text(md_path, markdown(result))
        atomic_write_text(readme_path, readme_section(result))
    except OSError as e:
        raise UsageError(f"cannot write results: {e}") from e
    for t in result["targets"]:
        ratio = "-" if t["ratio"] is None else f"{t['ratio']:.2f}"
        log(f"target {t['name']}: {t['status']} ({ratio}) {t['detail']}")
    print(f"attnkit bench: wrote {json_path}, {md_path} and {readme_path} (the README's table)")
    return 0
