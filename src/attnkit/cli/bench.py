"""`attnkit bench`: time attnkit's attention against torch on this CPU; JSON + markdown.

    attnkit bench --quick                 # small sizes, under a minute
    attnkit bench --threads 1 --out DIR   # the full run (tens of minutes)

Progress goes to stderr; the last line on stdout says where the results are.
"""

from __future__ import annotations

import argparse
import sys

from attnkit.cli._common import add_out_options, add_report_options, prepare_out
from attnkit.cli._errors import UsageError

PROG = "attnkit bench"
FILES = ("bench.json", "bench.md", "readme.md")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark attention backends against torch (time, memory, targets)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="small sizes and few repeats (< 1 min)")
    add_out_options(p, "bench", "bench.json, bench.md and readme.md")
    add_report_options(p)
    p.add_argument("--threads", type=int, metavar="T", help="torch threads (default: torch's)")
    p.add_argument("--sizes", type=int, nargs="+", metavar="N", help="override the kernel N list")
    p.add_argument("--dtypes", nargs="+", choices=("float32", "bfloat16"), help="kernel dtypes")
    p.add_argument("--repeats", type=int, metavar="R", help="timed repeats per row")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    p.set_defaults(run=run)


def plan_from_args(args):
    from attnkit.analysis.bench import Plan
    from attnkit.analysis.bench_decode import DecodeShape

    for name in ("threads", "repeats"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name} must be at least 1, got {value}")
    if args.sizes and min(args.sizes) < 1:
        raise UsageError(f"--sizes must be positive, got {args.sizes}")
    if args.quick:
        # one memory subprocess (target b's case): each costs a torch import
        plan = Plan(sizes=(128, 256), repeats=2, target_size=256, large_mask_size=0,
                    module_shape=(2, 128, 128, 4), sgemm_size=1024,
                    decode=DecodeShape(2, 2, 64, 64, prompt=8, new_tokens=16))  # fmt: skip
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
    prepare_out(args.out, FILES, force=args.force)  # before the (long) run, not after
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        return _run(args, plan)
    finally:
        torch.set_num_threads(threads)  # main() may be called in-process (tests)


def _run(args, plan) -> int:
    import json

    import torch
    from tqdm.auto import tqdm

    from attnkit._io import atomic_write_json, atomic_write_text
    from attnkit.analysis.bench import planned_steps, run_benchmark
    from attnkit.analysis.bench_report import markdown, readme_section

    json_path, md_path, readme_path = (args.out / name for name in FILES)
    bar = tqdm(total=planned_steps(plan), desc="bench", disable=args.quiet, file=sys.stderr)

    def log(msg: str) -> None:
        bar.set_postfix_str(msg, refresh=False)
        bar.update()

    if not args.quiet:
        print(f"[bench] {torch.get_num_threads()} threads; plan {plan}", file=sys.stderr)
    with bar:
        result = run_benchmark(plan, log=log)
    # results are written only once all is measured, each file atomically
    atomic_write_json(json_path, result)
    atomic_write_text(md_path, markdown(result))
    atomic_write_text(readme_path, readme_section(result))
    targets = [{k: t[k] for k in ("name", "status", "ratio", "detail")} for t in result["targets"]]
    if args.json:
        files = [str(p) for p in (json_path, md_path, readme_path)]
        print(json.dumps({"command": "bench", "files": files, "targets": targets}))
        return 0
    if not args.quiet:
        for r in (r for r in result["rows"] if r["kind"] == "decode"):
            tps, mib = r["tokens_per_s"], r["cache_mib"]
            print(
                f"[bench] decode batch {r['batch']}: attnkit {tps['attnkit']:.0f} tokens/s, "
                f"plain PyTorch {tps['plain']:.0f} tokens/s; cache {mib['attnkit']:.2f} MiB "
                f"vs {mib['plain']:.2f} MiB",
                file=sys.stderr,
            )
        for t in targets:
            ratio = "-" if t["ratio"] is None else f"{t['ratio']:.2f}"
            print(
                f"[bench] target {t['name']}: {t['status']} ({ratio}) {t['detail']}",
                file=sys.stderr,
            )
    print(f"attnkit bench: wrote {json_path}, {md_path} and {readme_path} (the README's table)")
    return 0
