"""The compiled CPU kernel's rate per entry against SDPA's fused CPU kernel, on the same calls.

Legend: B batch, H heads, N queries = S keys, D head width.

For each N, causal or not, D and thread count (B=1, H=8, float32, no mask, no dropout) a row
times four calls on the same q, k, v: `attnkit.attention(backend="chunked")` (the compiled
kernel) and `torch.nn.functional.scaled_dot_product_attention` (its fused CPU flash kernel),
each forward (under no_grad) and forward + backward. Dense calls: neither kernel can skip
anything but the causal triangle, so the time ratio is the ratio of their rates per entry.

Timing: one warm-up round, then `repeats` rounds; each round runs the four calls in an order
shuffled afresh (seeded), a call under 50 ms several times per sample (after one untimed
call, as `bench.time_interleaved` does), and the row's ratios are the medians of the
per-round ratios attnkit / SDPA (below 1: attnkit is faster). A ratio of two calls a few
seconds apart in one process is what survives other work on a shared machine; the medians of
the times are given beside them. The same ratios of the process's CPU time (``cpu_ratio``)
leave out the time the process waited for a core, which wall time counts on a busy machine
(with 2 threads they include the OpenMP threads' spinning at barriers, in both kernels).
The kernel's instruction set (``$ATTNKIT_KERNEL_ISA``) and the CPU are named in the result,
since both kernels' speed depends on them.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from attnkit._cpu import cpu_name
from attnkit.functional.attention import attention

__all__ = [
    "DEFAULT_SIZES",
    "KernelCase",
    "kernel_markdown",
    "kernel_plan",
    "kernel_row",
    "row_repeats",
    "run_kernel",
]

DEFAULT_SIZES = (1024, 2048, 4096)  # --sizes adds 8192 and 16384 (minutes per row)
FULL_REPEATS_UP_TO = 4096  # larger N: fewer repeats (`row_repeats`)
HEAD_WIDTHS = (64, 128)
CALLS = ("chunked fwd", "sdpa fwd", "chunked fwd+bwd", "sdpa fwd+bwd")


@dataclass(frozen=True)
class KernelCase:
    n: int  # N = S
    causal: bool
    d: int
    threads: int
    b: int = 1
    h: int = 8


def kernel_plan(sizes: Sequence[int], threads: Sequence[int]) -> list[KernelCase]:
    """Every (N, causal, D) at each thread count, the fastest rows first."""
    return [
        KernelCase(n, causal, d, t)
        for t in threads
        for n in sorted(sizes)
        for d in HEAD_WIDTHS
        for causal in (False, True)
    ]


def row_repeats(n: int, repeats: int) -> int:
    """Repeats of a row at N = n: `repeats` up to N = 4096; above, as many rounds' worth of
    time as 4096 would take (a call grows as N^2, so N / 4096 times fewer), at least 2 (a
    median of per-round ratios): 5 -> 2 at 8192 and at 16384, where one round of the four
    calls takes minutes on one thread."""
    if n <= FULL_REPEATS_UP_TO or repeats <= 2:
        return repeats
    return max(2, repeats * FULL_REPEATS_UP_TO // n)


def _calls(case: KernelCase) -> dict[str, Callable[[], None]]:
    g = torch.Generator().manual_seed(case.n)
    shape = (case.b, case.h, case.n, case.d)  # (B, H, N, D)
    q, k, v = (torch.randn(shape, generator=g) for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))

    def chunked(q, k, v):
        return attention(q, k, v, causal=case.causal, backend="chunked").out

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=case.causal)

    def forward(fn):
        def step():
            with torch.no_grad():
                fn(q, k, v)

        return step

    def both(fn):
        def step():
            for t in (qg, kg, vg):
                t.grad = None
            fn(qg, kg, vg).sum().backward()

        return step

    return {
        "chunked fwd": forward(chunked),
        "sdpa fwd": forward(sdpa),
        "chunked fwd+bwd": both(chunked),
        "sdpa fwd+bwd": both(sdpa),
    }


def kernel_row(case: KernelCase, repeats: int) -> dict:
    """One row: median ms of each call and the median per-round ratios attnkit / SDPA."""
    torch.set_num_threads(case.threads)
    calls = _calls(case)
    order = random.Random(case.n * 7 + case.d + case.threads)
    inner = {}
    for name, call in calls.items():  # warm-up: builds the kernel, fills pools and pages
        start = time.perf_counter()
        call()
        inner[name] = max(1, min(50, int(0.05 / max(time.perf_counter() - start, 1e-6))))
    times: dict[str, list[float]] = {name: [] for name in calls}
    cpu: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name in order.sample(CALLS, len(CALLS)):
            if inner[name] > 1:  # a short call: repeated within its sample (timeit's
                calls[name]()  # autorange), after one untimed call that absorbs the last one's
            start, start_cpu = time.perf_counter(), time.process_time()  # aftermath
            for _ in range(inner[name]):
                calls[name]()
            times[name].append((time.perf_counter() - start) / inner[name])
            cpu[name].append((time.process_time() - start_cpu) / inner[name])

    def ratios(samples):
        return {
            p: statistics.median(
                a / s for a, s in zip(samples[f"chunked {p}"], samples[f"sdpa {p}"], strict=True)
            )
            for p in ("fwd", "fwd+bwd")
        }

    ms = {name: 1e3 * statistics.median(ts) for name, ts in times.items()}
    return {**asdict(case), "repeats": repeats, "ms": ms, "ratio": ratios(times),
            "cpu_ratio": ratios(cpu)}  # fmt: skip


def machine() -> dict:
    """The CPU, the instruction set the kernel was built for, torch's own vector level."""
    from attnkit.functional._kernel_cache import kernel_isa

    return {
        "cpu": cpu_name(),
        "kernel_isa": kernel_isa(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkl_instructions": os.environ.get("MKL_ENABLE_INSTRUCTIONS", "auto"),
        "torch": torch.__version__,
    }


def kernel_markdown(rows: list[dict], about: dict) -> str:
    head = (
        f"The compiled chunked kernel against SDPA's fused CPU kernel on {about['cpu']} (kernel "
        f"built for {about['kernel_isa']}; torch {about['torch']} running its "
        f"{about['torch_cpu_capability']} kernels, MKL instructions: "
        f"{about['mkl_instructions']}). B=1, H=8, float32, no mask; medians in ms; ratio = "
        "attnkit time / SDPA time, the median of per-round ratios (below 1: attnkit is "
        "faster); CPU-time ratios: the same of the process's CPU time (fwd / fwd+bwd), which "
        "leaves out waiting for a core on a busy machine.\n\n"
        "| N | causal | D | threads | attnkit fwd | SDPA fwd | fwd ratio | attnkit fwd+bwd | "
        "SDPA fwd+bwd | fwd+bwd ratio | CPU-time ratios |\n"
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    )
    lines = []
    for r in rows:
        ms, ratio, cpu = r["ms"], r["ratio"], r["cpu_ratio"]
        lines.append(
            f"| {r['n']} | {'yes' if r['causal'] else 'no'} | {r['d']} | {r['threads']} | "
            f"{_fmt(ms['chunked fwd'])} | {_fmt(ms['sdpa fwd'])} | {ratio['fwd']:.2f} | "
            f"{_fmt(ms['chunked fwd+bwd'])} | {_fmt(ms['sdpa fwd+bwd'])} | "
            f"{ratio['fwd+bwd']:.2f} | {cpu['fwd']:.2f} / {cpu['fwd+bwd']:.2f} |"
        )
    worst = {p: max(r["ratio"][p] for r in rows) for p in ("fwd", "fwd+bwd")} if rows else {}
    tail = (
        f"\nWorst ratio: forward {worst['fwd']:.2f}, forward + backward {worst['fwd+bwd']:.2f} "
        f"({len(rows)} rows).\n"
        if rows
        else ""
    )
    counts = sorted({(r["n"], r["repeats"]) for r in rows if "repeats" in r})
    if len({c for _, c in counts}) > 1:  # fewer repeats for the large sizes: say so
        tail += "Repeats: " + ", ".join(f"N={n} {c}" for n, c in counts) + ".\n"
    return head + "\n".join(lines) + "\n" + tail


def _fmt(ms: float) -> str:
    return f"{ms:.0f}" if ms >= 10 else f"{ms:.1f}"


def run_kernel(
    sizes: Sequence[int], threads: Sequence[int], repeats: int, log: Callable[[str], None]
) -> dict:
    """Every row of `kernel_plan`: the JSON payload. `log` hears one line per row started.
    Rows above N = 4096 take fewer repeats (`row_repeats`); each row records its own."""
    todo = kernel_plan(sizes, threads)
    before = torch.get_num_threads()
    rows = []
    try:
        for i, case in enumerate(todo, 1):
            log(f"[{i}/{len(todo)}] N={case.n} D={case.d} "
                f"{'causal' if case.causal else 'full'} threads={case.threads}")  # fmt: skip
            rows.append(kernel_row(case, row_repeats(case.n, repeats)))
    finally:
        torch.set_num_threads(before)
    return {"machine": machine(), "repeats": repeats, "rows": rows}
