"""`attnkit bench`: time attnkit's attention against torch on this CPU; JSON + markdown.

    attnkit bench --quick                 # small sizes, under a minute
    attnkit bench --threads 1 --out DIR   # the full run (tens of minutes)
    attnkit bench --structured            # structured masks vs tensors, SDPA, FlexAttention
    attnkit bench --kernel                # the compiled kernel vs SDPA's, per entry

--structured times the mask zoo (causal, window 256, prefix-LM, 16 documents causal and full,
a dilated window, a 2-D neighbourhood, a strided mask; ALiBi, soft-capping and a T5 table as
score functions) against SDPA with the dense mask and compiled FlexAttention, attnkit forward
and forward + backward, N = 4096 and 16384, 1 and 2 threads (--sizes and --threads pick
others), and the memory of a window-512 training step at N=65536 (about 1.5 hours on 2 idle
cores; --quick: N=1024, one thread, a few minutes for FlexAttention's compiles).

--kernel times the compiled chunked kernel against SDPA's fused CPU kernel on the same dense
calls (N = 1024, 2048, 4096, or --sizes, e.g. up to 16384, with fewer repeats above 4096;
causal and not; D = 64 and 128; 1 and 2 threads, or --threads), forward and forward +
backward, and writes kernel.json and kernel.md with the CPU and the kernel's instruction set
named (10-30 minutes on 2 cores; --quick: N=256, one thread, seconds).

--sizes are checked before anything runs: a size whose rows need more memory than this
machine has free, or a plan whose kernel rows would take more than 2 hours even at this
CPU's matrix-multiply speed, is refused. Ctrl-C stops a run within a second, also in the
middle of a long kernel call. Progress goes to stderr; the last line on stdout says where
the results are.
"""

from __future__ import annotations

import argparse
import sys
import threading

from attnkit.cli._common import (
    add_out_options,
    add_report_options,
    positive_int,
    prepare_out,
    thread_count,
)
from attnkit.cli._errors import UsageError

PROG = "attnkit bench"
FILES = ("bench.json", "bench.md", "readme.md")
STRUCTURED_FILES = ("structured.json", "structured.md")
KERNEL_FILES = ("kernel.json", "kernel.md")
MAX_HOURS = 2  # the kernel rows' lower-bound time a run may have (the full default: minutes)
MEMORY_SHARE = 0.8  # of the memory available, what the largest row may take


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
    p.add_argument(
        "--threads",
        type=thread_count,
        metavar="T",
        help="torch threads (default: torch's; --structured: 1 and 2)",
    )
    p.add_argument(
        "--sizes",
        type=positive_int,
        nargs="+",
        metavar="N",
        help="override the kernel N list (checked against free memory and time first); "
        "with --structured, the table's N",
    )
    p.add_argument("--dtypes", nargs="+", choices=("float32", "bfloat16"), help="kernel dtypes")
    p.add_argument("--repeats", type=positive_int, metavar="R", help="timed repeats per row")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    p.add_argument(
        "--structured",
        action="store_true",
        help="the structured-mask table instead (structured.json, structured.md)",
    )
    p.add_argument(
        "--kernel",
        action="store_true",
        help="the compiled kernel against SDPA's fused kernel instead (kernel.json, kernel.md)",
    )
    p.set_defaults(run=run)


def plan_from_args(args):
    from attnkit.analysis.bench import Plan
    from attnkit.analysis.bench_decode import DecodeShape

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


def check_plan(plan, available: int | None, flops_per_s: float) -> None:
    """UsageError naming --sizes if a row of `plan` needs more than MEMORY_SHARE of
    `available` bytes, or its kernel rows more than MAX_HOURS at `flops_per_s` (a lower
    bound: attention runs no faster than a matrix multiply)."""
    import math

    from attnkit.analysis.bench import kernel_flops, peak_bytes

    sizes = [*plan.sizes, plan.target_size, *plan.memory_sizes]
    sizes += [plan.large_mask_size] if plan.large_mask_size else []
    if available is not None:
        budget = MEMORY_SHARE * available
        fits = math.isqrt(int(budget // 6))  # peak_bytes ~ 5 N^2 and the rest
        for n in sorted(set(sizes), reverse=True):
            if peak_bytes(n) <= budget:
                continue
            given = n in plan.sizes
            what, way = (
                ("--sizes: N", f"give sizes up to about {fits}")
                if given
                else ("the peak-memory rows' N", "pass --no-memory (or --quick)")
            )
            raise UsageError(
                f"{what}={n} needs about {peak_bytes(n) / 2**30:.1f} GiB at its peak (the "
                f"(N, N) boolean mask rows), more than {MEMORY_SHARE:.0%} of the "
                f"{available / 2**30:.1f} GiB this machine has free: {way}"
            )
    hours = kernel_flops(plan) / flops_per_s / 3600
    if hours > MAX_HOURS:
        biggest = max(plan.sizes)
        fits = int(biggest * math.sqrt(MAX_HOURS / hours))  # the time grows as N^2
        raise UsageError(
            f"--sizes {' '.join(map(str, plan.sizes))}: the kernel rows would take at least "
            f"{hours:.0f} hours on this CPU ({flops_per_s / 1e9:.0f} GFLOP/s in a matrix "
            f"multiply; the limit is {MAX_HOURS} hours): give sizes up to about {fits}, or "
            "fewer --repeats"
        )


def available_memory() -> int | None:
    """Bytes this process may still take: the least of the kernel's MemAvailable, the
    cgroup's memory.max headroom and the address-space limit (RLIMIT_AS) headroom; None
    where none of them can be read."""
    found = []
    try:
        with open("/proc/meminfo") as f:
            rows = dict(line.split(":", 1) for line in f)
        found.append(int(rows["MemAvailable"].split()[0]) * 1024)
    except (OSError, KeyError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            if limit != "max":
                found.append(int(limit) - int(f.read()))
    except (OSError, ValueError):
        pass
    try:
        import resource

        from attnkit.analysis.bench import status_mib

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            found.append(soft - int(status_mib("VmSize") * 2**20))
    except (ImportError, OSError, StopIteration, ValueError):
        pass
    return max(0, min(found)) if found else None


def matmul_flops_per_s(seconds: float = 0.1) -> float:
    """This CPU's float32 matrix-multiply speed with torch's current threads (FLOP/s)."""
    import time

    import torch

    a, b = torch.randn(512, 512), torch.randn(512, 512)
    a @ b  # warm-up
    calls, start = 0, time.perf_counter()
    while (took := time.perf_counter() - start) < seconds:
        a @ b
        calls += 1
    return 2 * 512**3 * calls / took


def run(args) -> int:
    import torch

    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        if args.structured and args.kernel:
            raise UsageError("--structured and --kernel are two tables: give one of them")
        if args.structured:
            return _run_structured(args)
        if args.kernel:
            return _run_kernel(args)
        plan = plan_from_args(args)
        check_plan(plan, available_memory(), matmul_flops_per_s())
        prepare_out(args.out, FILES, force=args.force)  # before the (long) run, not after
        return _run(args, plan)
    finally:
        torch.set_num_threads(threads)  # main() may be called in-process (tests)


class _Stopped(Exception):
    """Raised in the measuring thread at its next step once Ctrl-C was pressed."""


def interruptible(work, stop: threading.Event):
    """`work()` in a worker thread, waited for here in short waits; its result or error.

    A kernel call at a large N runs for minutes inside C++ (torch's ops, or the compiled
    kernel through ctypes), without the GIL, and Python runs a Ctrl-C handler only in the
    main thread between bytecodes: a measurement on the main thread ignored Ctrl-C until
    the call returned. Waiting here, the main thread gets the KeyboardInterrupt within
    0.1 s; `stop` is set so that the worker ends at its next step, and the process exits
    (the worker is a daemon thread and writes no file)."""
    box: dict = {}

    def target() -> None:
        try:
            box["result"] = work()
        except BaseException as e:  # handed to the main thread
            box["error"] = e

    worker = threading.Thread(target=target, name="attnkit-bench", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.1)
    except KeyboardInterrupt:
        stop.set()
        raise
    if "error" in box:
        raise box["error"]
    return box["result"]


def _run(args, plan) -> int:
    import json

    import torch
    from tqdm.auto import tqdm

    from attnkit._io import atomic_write_json, atomic_write_text
    from attnkit.analysis.bench import planned_steps, run_benchmark
    from attnkit.analysis.bench_report import markdown, readme_section
    from attnkit.analysis.bench_small import summary_lines

    json_path, md_path, readme_path = (args.out / name for name in FILES)
    bar = tqdm(total=planned_steps(plan), desc="bench", disable=args.quiet, file=sys.stderr)
    stop = threading.Event()

    def log(msg: str) -> None:
        if stop.is_set():
            raise _Stopped
        bar.set_postfix_str(msg, refresh=False)
        bar.update()

    if not args.quiet:
        print(f"[bench] {torch.get_num_threads()} threads; plan {plan}", file=sys.stderr)
    with bar:
        threads = torch.get_num_threads()

        def work():
            torch.set_num_threads(threads)  # the worker's own setting (torch's is per thread)
            return run_benchmark(plan, log=log)

        result = interruptible(work, stop)
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
        for line in summary_lines(result["rows"]):
            print(f"[bench] {line}", file=sys.stderr)
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


def _run_structured(args) -> int:
    """The structured-mask table (`attnkit.analysis.bench_structured`): its own fixed plan."""
    import json

    from tqdm.auto import tqdm

    from attnkit._io import atomic_write_json, atomic_write_text
    from attnkit.analysis.bench_structured import (
        run_structured,
        structured_markdown,
        structured_plan,
    )

    given = [f"--{n}" for n in ("dtypes", "repeats") if getattr(args, n)]
    if given:
        raise UsageError(
            f"{', '.join(given)}: --structured runs its own table (float32, its repeats); "
            "leave them out"
        )
    sizes = tuple(args.sizes) if args.sizes else None
    threads = (args.threads,) if args.threads else None
    try:
        todo = structured_plan(args.quick, sizes, threads)
    except ValueError as e:
        raise UsageError(str(e)) from None
    prepare_out(args.out, STRUCTURED_FILES, force=args.force)
    json_path, md_path = (args.out / name for name in STRUCTURED_FILES)
    bar = tqdm(total=len(todo), desc="bench", disable=args.quiet, file=sys.stderr)
    stop = threading.Event()

    def log(msg: str) -> None:
        if stop.is_set():
            raise _Stopped
        if msg.startswith("["):  # "[i/n] kind, N=..., threads=...": row i starts
            done = int(msg[1 : msg.index("/")]) - 1
            bar.update(done - bar.n)
            bar.set_postfix_str(msg.split("] ", 1)[1])

    with bar:
        result = interruptible(lambda: run_structured(args.quick, log, sizes, threads), stop)
        bar.update(len(todo) - bar.n)
    atomic_write_json(json_path, result)
    atomic_write_text(md_path, structured_markdown(result["rows"], result["memory"],
                                                   result["machine"]))  # fmt: skip
    if args.json:
        print(json.dumps({"command": "bench", "files": [str(json_path), str(md_path)]}))
        return 0
    print(f"attnkit bench: wrote {json_path} and {md_path} ({len(result['rows'])} rows)")
    return 0


def _run_kernel(args) -> int:
    """The kernel-against-SDPA table (`attnkit.analysis.bench_kernel`): --sizes, --threads
    and --repeats apply; --dtypes and --no-memory do not."""
    import json

    from tqdm.auto import tqdm

    from attnkit._io import atomic_write_json, atomic_write_text
    from attnkit.analysis.bench_kernel import (
        DEFAULT_SIZES,
        kernel_markdown,
        kernel_plan,
        run_kernel,
    )

    given = [f"--{n.replace('_', '-')}" for n in ("dtypes", "no_memory") if getattr(args, n)]
    if given:
        raise UsageError(f"{', '.join(given)}: --kernel times float32 attention only; leave "
                         "them out")  # fmt: skip
    sizes = tuple(args.sizes) if args.sizes else ((256,) if args.quick else DEFAULT_SIZES)
    threads = (args.threads,) if args.threads else ((1,) if args.quick else (1, 2))
    repeats = args.repeats or (2 if args.quick else 5)
    prepare_out(args.out, KERNEL_FILES, force=args.force)
    json_path, md_path = (args.out / name for name in KERNEL_FILES)
    todo = kernel_plan(sizes, threads)
    bar = tqdm(total=len(todo), desc="bench", disable=args.quiet, file=sys.stderr)
    stop = threading.Event()

    def log(msg: str) -> None:
        if stop.is_set():
            raise _Stopped
        done = int(msg[1 : msg.index("/")]) - 1  # "[i/n] N=...": row i starts
        bar.update(done - bar.n)
        bar.set_postfix_str(msg.split("] ", 1)[1])

    with bar:
        result = interruptible(lambda: run_kernel(sizes, threads, repeats, log), stop)
        bar.update(len(todo) - bar.n)
    atomic_write_json(json_path, result)
    atomic_write_text(md_path, kernel_markdown(result["rows"], result["machine"]))
    if args.json:
        print(json.dumps({"command": "bench", "files": [str(json_path), str(md_path)]}))
        return 0
    worst = max((max(r["ratio"].values()) for r in result["rows"]), default=float("nan"))
    print(f"attnkit bench: wrote {json_path} and {md_path} ({len(result['rows'])} rows on "
          f"{result['machine']['cpu']}, kernel {result['machine']['kernel_isa']}; worst "
          f"attnkit/SDPA time ratio {worst:.2f})")  # fmt: skip
    return 0
