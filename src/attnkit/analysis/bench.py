"""Attention benchmark on the CPU: attnkit's backends against torch, in one process run.

Legend: B batch, H heads, N queries = S keys, D head width, C model width.

Kernel rows time `attnkit.attention` (``auto`` and each backend), torch SDPA and plain
matmul/softmax(+``F.dropout``) for every (N, mask, dropout, dtype, pass); module rows time a
training step of `attnkit.MultiHeadAttention` against `torch.nn.MultiheadAttention` and
`record_attention` against torch's ``need_weights=True``. Timings: one warm-up call each, then
the implementations of a row run interleaved (a fresh seeded order per round) ``repeats``
times; medians.
Compare ratios within one run: absolute times drift up to 2x on shared machines.

Peak memory runs one forward+backward per configuration in a fresh subprocess
(``python -m attnkit.analysis.bench --child ...``): the kernel's high-water mark VmHWM is reset
once the inputs exist (Linux >= 4.0), and the peak above that RSS is reported.

The interleaved timing is `attnkit.analysis._timing`, the memory rows
`attnkit.analysis._bench_memory`, `Case` `attnkit.analysis._bench_case`; their names stay
importable from here.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit._cpu import cpu_name
from attnkit.analysis._bench_case import MASKS, Case
from attnkit.analysis._bench_memory import memory_row, status_mib
from attnkit.analysis._bench_memory import peak_memory_mib as peak_memory_mib  # read here
from attnkit.analysis._timing import time_interleaved
from attnkit.analysis.bench_decode import DecodeShape, decode_rows
from attnkit.analysis.bench_modules import module_rows
from attnkit.analysis.bench_report import evaluate_targets
from attnkit.analysis.bench_small import SHAPES as SMALL_SHAPES
from attnkit.analysis.bench_small import small_call_rows
from attnkit.functional import native
from attnkit.functional._choose import choose_backend, mask_elems
from attnkit.functional.attention import attention

__all__ = ["Case", "Plan", "kernel_flops", "peak_bytes", "planned_steps", "run_benchmark"]

KERNEL_IMPLS = ("auto", "reference", "fused", "chunked", "sdpa", "plain")
# Implementations that build the (B, H, N, S) scores (SDPA does with dropout: its math path);
# skipped when those would exceed this many bytes as float32.
DENSE_LIMIT_BYTES = 1 << 30
DEFAULT_DECODE = DecodeShape()  # frozen: one shared default is safe


@dataclass(frozen=True)
class Plan:
    """What one benchmark run measures."""

    sizes: tuple[int, ...]  # N of the kernel rows
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    repeats: int = 3
    memory_sizes: tuple[int, ...] = ()  # N of the subprocess peak-memory rows
    memory_impls: tuple[str, ...] = ("auto", "chunked", "sdpa", "plain")
    target_size: int = 2048  # N of target b (dropout training)
    large_mask_size: int = 16384  # N of target d (0 skips it)
    module_shape: tuple[int, int, int, int] = (8, 512, 512, 8)  # B, N, C, heads of targets c, f
    sgemm_size: int = 4096
    bf16_max_n: int = 1024  # bfloat16 rows only up to this N (no native bf16 units on the CPU)
    # cached GPT generation against plain PyTorch (None: skip)
    decode: DecodeShape | None = DEFAULT_DECODE


def make_inputs(case: Case, grad: bool, seed: int = 0):
    """q, k, v (B, H, N, D) and the case's mask (True = may attend) or None, and causal."""
    gen = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, case.dtype)
    shape = (case.b, case.h, case.n, case.d)
    q, k, v = (torch.randn(shape, generator=gen).to(dtype).requires_grad_(grad) for _ in range(3))
    mask = None
    if case.mask == "padding":  # (B, 1, 1, S): the last quarter of the keys is padding
        mask = torch.ones(case.b, 1, 1, case.n, dtype=torch.bool)
        mask[..., case.n - case.n // 4 :] = False
    elif case.mask == "bool":  # arbitrary (N, S): ~10% of pairs blocked
        mask = torch.rand(case.n, case.n, generator=gen) > 0.1
    return q, k, v, mask, case.mask == "causal"


def attend(impl: str, q, k, v, mask, causal: bool, p: float) -> Tensor:
    """One attention call of `impl` (training-mode dropout `p`) -> out (B, H, N, D)."""
    if impl in ("auto", "reference", "fused", "chunked"):
        return attention(
            q, k, v, mask=mask, causal=causal, dropout_p=p, training=p > 0, backend=impl
        ).out
    if impl == "sdpa":
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal
        )
    s = (q * q.shape[-1] ** -0.5) @ k.transpose(-1, -2)  # (B, H, N, S)
    if causal:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril_()
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return F.dropout(s.softmax(-1), p) @ v


def applicable(impl: str, case: Case) -> bool:
    dense = impl in ("reference", "plain") or (impl == "sdpa" and case.dropout > 0)
    return not (dense and case.score_bytes * 3 > DENSE_LIMIT_BYTES)


def auto_choice(case: Case, backward: bool = False) -> str:
    """The backend ``auto`` runs for `case` (what `attention` would decide, from shapes: the
    tensors are on the meta device, so no second (N, S) mask is built beside the row's)."""
    n = case.n
    q = k = torch.empty(1, 1, n, 1, device="meta")  # (B, H, N, D)
    shapes = {"padding": (1, 1, 1, n), "bool": (n, n)}
    mask = None
    if case.mask in shapes:
        mask = torch.empty(shapes[case.mask], dtype=torch.bool, device="meta")
    elems = mask_elems(q, k, mask, None, case.mask == "causal")
    return choose_backend(
        "auto",
        need_weights=False,
        dropout=case.dropout > 0,
        mask_elems=elems,
        low_precision_grad=backward and case.dtype == "bfloat16",
    )


def kernel_step(impl: str, case: Case, backward: bool, inputs) -> Callable[[], None]:
    q, k, v, mask, causal = inputs

    def step() -> None:
        if backward:
            for t in (q, k, v):
                t.grad = None
            attend(impl, q, k, v, mask, causal, case.dropout).sum().backward()
        else:
            with torch.no_grad():
                attend(impl, q, k, v, mask, causal, case.dropout)

    return step


def attention_flops(case: Case, backward: bool) -> float:
    """4·B·H·N·S·D per forward (half when causal); forward+backward ≈ 3.5× forward."""
    f = 4 * case.b * case.h * case.n * case.n * case.d / (2 if case.mask == "causal" else 1)
    return 3.5 * f if backward else f


def sgemm_gflops(n: int, repeats: int = 5) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    ms = time_interleaved({"mm": lambda: a @ b}, repeats)["mm"]
    return 2 * n**3 / (ms / 1e3) / 1e9


def kernel_row(case: Case, backward: bool, repeats: int, impls=KERNEL_IMPLS) -> dict:
    inputs = make_inputs(case, backward)
    todo = [i for i in impls if applicable(i, case)]
    ms = time_interleaved({i: kernel_step(i, case, backward, inputs) for i in todo}, repeats)
    return {
        "kind": "kernel",
        **asdict(case),
        "pass": "fwd+bwd" if backward else "fwd",
        "auto_backend": auto_choice(case, backward),
        "ms": ms,
        "gflops": {i: attention_flops(case, backward) / (t / 1e3) / 1e9 for i, t in ms.items()},
    }


def overhead_row(repeats: int, calls: int = 200) -> dict:
    """Microseconds per call at N=16 (B=1, H=8, D=64, no grad): `attention(backend="auto")`
    and SDPA itself, `attention(backend="chunked")` (the compiled kernel's eager route), and,
    where the kernel is built, the kernel on float32 inputs through its eager route
    (`native._Eager`) against the same functions through the registered operator
    ``attnkit::attention_fwd`` (what compiled code calls): the operator's dispatch cost."""
    q, k, v, _, _ = make_inputs(Case(16, "none", 0.0), False)

    def loop(call):
        def step():
            with torch.no_grad():
                for _ in range(calls):
                    call()

        return step

    steps = {
        impl: loop(lambda impl=impl: attend(impl, q, k, v, None, False, 0.0))
        for impl in ("auto", "sdpa", "chunked")
    }
    if native.available():
        from attnkit.functional._dropout import NO_DROPOUT

        args = (q, k, v, None, None, False, 0.125, NO_DROPOUT, 1.0, None)
        steps["kernel_eager_route"] = loop(lambda: native._Eager.apply(*args))
        steps["kernel_operator"] = loop(lambda: native.attention_fwd(*args))
    ms = time_interleaved(steps, max(repeats, 3))
    return {"kind": "overhead", "n": 16, "us_per_call": {i: 1e3 * t / calls for i, t in ms.items()}}


# --------------------------------------------------------------------------- peak memory


def _child(impl: str, case: Case, threads: int) -> float:
    """In a fresh process: peak RSS growth (MiB) of one forward+backward of `impl`."""
    torch.set_num_threads(threads)
    inputs = make_inputs(case, True)
    small = make_inputs(Case(64, case.mask, case.dropout, case.dtype), True)
    kernel_step(impl, case, True, small)()  # load kernels and thread pools first
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = status_mib("VmRSS")
    kernel_step(impl, case, True, inputs)()
    return status_mib("VmHWM") - before


# --------------------------------------------------------------------------- the run


def kernel_flops(plan: Plan) -> float:
    """FLOPs of the kernel rows of `run_benchmark(plan)`: every implementation of a row runs
    once untimed and `repeats` times timed (more often only where a call is short). Divided
    by the machine's matmul speed, a lower bound of the run's time (attention is no faster)."""
    total = 0.0
    for dtype in plan.dtypes:
        for n in (n for n in plan.sizes if dtype == "float32" or n <= plan.bf16_max_n):
            for mask in MASKS:
                for p in (0.0, 0.1):
                    case = Case(n, mask, p, dtype)
                    calls = (1 + plan.repeats) * sum(applicable(i, case) for i in KERNEL_IMPLS)
                    total += calls * (attention_flops(case, False) + attention_flops(case, True))
    return total


def peak_bytes(n: int) -> int:
    """Memory a kernel row of N=n holds at its peak (B=1, H=8, D=64): the boolean-mask row's
    (N, S) mask (1 byte an element) beside the float32 noise it is drawn from or the float
    mask SDPA makes of it (4 bytes an element); the score matrices of the dense
    implementations where they run (`applicable`); q, k, v, their gradients and outputs."""
    case = Case(n, "bool", 0.1)
    dense = 0 if not applicable("plain", case) else 3 * case.score_bytes
    return 5 * n * n + dense + 16 * case.b * case.h * n * case.d * 4


def planned_steps(plan: Plan) -> int:
    """How many times `run_benchmark(plan)` calls `log` (one per measured step), for a
    progress bar. Mirrors the loops of `run_benchmark`."""
    kernel = sum(
        len(MASKS) * 2 * 2
        for dtype in plan.dtypes
        for n in plan.sizes
        if dtype == "float32" or n <= plan.bf16_max_n
    )
    target_b = 0 if plan.target_size in plan.sizes else 2
    mem_cases = [Case(n, m, p) for n in plan.memory_sizes for m in MASKS for p in (0.0, 0.1)]
    if plan.memory_impls:
        mem_cases.append(Case(plan.target_size, "none", 0.1))
    memory = sum(
        applicable(impl, case)
        for case in dict.fromkeys(mem_cases)
        for impl in (plan.memory_impls if case.n in plan.memory_sizes else ("auto",))
    )
    large = 2 if plan.large_mask_size else 0
    decode = 1 if plan.decode else 0
    return 4 + kernel + target_b + memory + large + decode  # sgemm, overhead, small, modules


def run_benchmark(plan: Plan, log: Callable[[str], None] = print) -> dict:
    """Measure everything in `plan`; returns the JSON-able result (see `bench_report`)."""
    threads = torch.get_num_threads()
    result = {
        "meta": {
            "torch": torch.__version__,
            "threads": threads,
            "load_avg": _load_avg(),
            "cpu": cpu_name(),
            "chunked_kernel": "compiled" if native.available() else "pytorch",
            "plan": asdict(plan),
            "kernel_impls": list(KERNEL_IMPLS),
        },
        "sgemm_gflops": {},
        "rows": [],
    }
    log(f"sgemm {plan.sgemm_size}")
    result["sgemm_gflops"][str(plan.sgemm_size)] = sgemm_gflops(plan.sgemm_size)
    rows = result["rows"]
    log("dispatcher overhead (N=16)")
    rows.append(overhead_row(plan.repeats))
    log(f"small calls {len(SMALL_SHAPES)} shapes x (no grad, grad) vs SDPA")
    rows.extend(small_call_rows(plan.repeats, time_interleaved))
    for dtype in plan.dtypes:
        for n in (n for n in plan.sizes if dtype == "float32" or n <= plan.bf16_max_n):
            for mask in MASKS:
                for p in (0.0, 0.1):
                    for backward in (False, True):
                        case = Case(n, mask, p, dtype)
                        log(f"kernel N={n} {mask} p={p} {dtype} {'fwd+bwd' if backward else 'fwd'}")
                        rows.append(kernel_row(case, backward, plan.repeats))
    if plan.target_size not in plan.sizes:
        for backward in (False, True):
            log(f"kernel N={plan.target_size} dropout 0.1 (target b)")
            case = Case(plan.target_size, "none", 0.1)
            rows.append(kernel_row(case, backward, plan.repeats, ("auto", "chunked", "sdpa")))
    log(f"modules {plan.module_shape}")
    rows.extend(module_rows(plan.module_shape, plan.repeats, time_interleaved))
    if plan.decode:
        log(f"decode {plan.decode.batches}")
        rows.extend(decode_rows(plan.decode, plan.repeats, time_interleaved))
    mem_cases = [Case(n, m, p) for n in plan.memory_sizes for m in MASKS for p in (0.0, 0.1)]
    if plan.memory_impls:  # an empty tuple (--no-memory) runs no memory subprocess at all
        mem_cases.append(Case(plan.target_size, "none", 0.1))
    for case in dict.fromkeys(mem_cases):
        for impl in plan.memory_impls if case.n in plan.memory_sizes else ("auto",):
            if applicable(impl, case):
                log(f"memory {impl} N={case.n} {case.mask} p={case.dropout}")
                rows.append(memory_row(impl, case, threads))
    if plan.large_mask_size:
        case = Case(plan.large_mask_size, "bool", 0.0)
        for impl in ("auto", "sdpa"):
            log(f"memory {impl} N={case.n} bool mask (target d)")
            rows.append(memory_row(impl, case, threads))
    result["meta"]["load_avg_end"] = _load_avg()
    result["targets"] = evaluate_targets(result)
    return result


def _load_avg() -> list[float]:
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return []


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    spec = json.loads(sys.argv[2])
    print(_child(spec["impl"], Case(**spec["case"]), spec["threads"]))
