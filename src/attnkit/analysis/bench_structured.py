"""Structured masks on the CPU: attnkit's descriptions against the same masks as tensors,
torch SDPA and compiled FlexAttention, in one process run.

Legend: B batch, H heads, N queries = S keys, D head width.

The zoo (issue 36): causal, a window, prefix-LM, documents (causal and full), a dilated
window, a 2-D neighbourhood (NATTEN), a strided (video "temporal") mask, and score functions on
a causal mask: ALiBi, tanh soft-capping, a T5 relative table. For each kind, N and thread count
(B=1, H=8, D=64, float32, eager) the row times:

* ``structured`` / ``structured_fb`` — `attnkit.attention` with the description (and the score
  function as ``score_mod``), forward / forward + backward: the chunked kernel visits only the
  blocks the mask lets through;
* ``dense`` / ``dense_fb`` — `attnkit.attention` with the same mask as an (N, S) tensor
  (what every other backend receives), up to `DENSE_FB_LIMIT_N`;
* ``sdpa`` — `torch.nn.functional.scaled_dot_product_attention` with the boolean tensor, or
  for ALiBi and the T5 table their dense float bias (-inf where masked; up to `BIAS_LIMIT_N`;
  soft-capping has no SDPA form), forward;
* ``flex`` — `torch.compile(flex_attention)` with the equivalent `create_block_mask` and the
  same score function (forward: FlexAttention has no backward on the CPU). Its compile
  (seconds per mask function) and the block mask's creation happen before timing.

Timings are medians of interleaved repeats (`bench.time_interleaved`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit._cpu import cpu_flags, cpu_name
from attnkit.analysis.bench import time_interleaved
from attnkit.analysis.peak_tensors import PeakTensors
from attnkit.functional import masks, score_mods
from attnkit.functional.attention import attention
from attnkit.functional.relative import alibi_slopes
from attnkit.functional.structured import StructuredMask, causal_intervals

__all__ = [
    "KINDS",
    "StructuredCase",
    "memory_row",
    "run_structured",
    "structured_markdown",
    "structured_plan",
    "structured_row",
]

DENSE_LIMIT_N = 16384  # (N, S) tensors up to 16384² booleans (256 MiB; SDPA makes it 1 GiB)
DENSE_FB_LIMIT_N = 4096  # attnkit with the tensor, fwd and fwd+bwd (its ratio only grows with N)
BIAS_LIMIT_N = 4096  # a score function's dense (H, N, S) float bias for SDPA: 512 MiB at 4096


@dataclass(frozen=True)
class Kind:
    """A row's attention pattern at sequence length n: attnkit's description and
    FlexAttention's mask_mod, and for score-function rows the score function (attnkit's,
    which Flex's `score_mod` takes as it is) and its dense float bias (H, N, S) for SDPA."""

    describe: Callable[[int], StructuredMask]
    mask_mod: Callable[[int], Callable]
    score: Callable[[int], Callable] | None = None
    bias: Callable[[int], Tensor] | None = None


def _documents(count: int, causal: bool = True) -> Kind:
    """`count` documents of equal length (N is a multiple of 64 here). FlexAttention
    gets them as q // L == k // L: a mask_mod that indexes a captured id tensor fails to
    compile in inductor's CPU template (torch 2.13: "cur_qSplitSize8 was not declared")."""

    def mod(n):
        length = n // count
        if causal:
            return lambda b, h, q, k: (q // length == k // length) & (q >= k)
        return lambda b, h, q, k: q // length == k // length

    def describe(n):
        return masks.document(masks.document_ids([n // count] * count), causal=causal)

    return Kind(describe, mod)


def _window(w: int) -> Kind:
    return Kind(
        lambda n: masks.window(n, w, causal=True),
        lambda n: lambda b, h, q, k: (q >= k) & (q - k < w),
    )


def _dilated(w: int, d: int) -> Kind:
    def mod(n):
        return lambda b, h, q, k: ((q - k).abs() < w * d) & ((q - k) % d == 0)

    return Kind(lambda n: masks.dilated_window(n, w, d), mod)


def _natten(kernel: int) -> Kind:
    """NATTEN on a square √N × √N grid (N = 4096: 64², 16384: 128²), attention-gym's mask_mod."""
    r = kernel // 2

    def mod(n):
        side = math.isqrt(n)

        def natten(b, h, q, k):
            qy, qx, ky, kx = q // side, q % side, k // side, k % side
            cy, cx = qy.clamp(r, side - 1 - r), qx.clamp(r, side - 1 - r)
            return ((cy - ky).abs() <= r) & ((cx - kx).abs() <= r)

        return natten

    return Kind(lambda n: masks.neighborhood_2d(math.isqrt(n), math.isqrt(n), kernel), mod)


def _strided(stride: int) -> Kind:
    return Kind(
        lambda n: masks.strided(n, stride), lambda n: lambda b, h, q, k: q % stride == k % stride
    )


HEADS = 8


def _causal_score(score: Callable[[int], Callable], bias: Callable[[int], Tensor] | None) -> Kind:
    """A score function on a causal mask (decoder habit)."""
    return Kind(causal_intervals, lambda n: lambda b, h, q, k: q >= k, score, bias)


def _alibi_bias(n: int) -> Tensor:
    pos = torch.arange(n)
    return alibi_slopes(HEADS)[:, None, None] * (pos[None, :] - pos[:, None])[None].float()


def _t5_table() -> Tensor:
    return torch.randn(32, HEADS, generator=torch.Generator().manual_seed(0))


def _t5_bias(n: int) -> Tensor:
    pos = torch.arange(n)
    buckets = score_mods.t5_buckets(32, 128, bidirectional=False)(pos[:, None], pos[None, :])
    return _t5_table()[buckets].permute(2, 0, 1)  # (N, S, H) -> (H, N, S)


KINDS: dict[str, Kind] = {
    "causal": Kind(causal_intervals, lambda n: lambda b, h, q, k: q >= k),
    "window 256": _window(256),
    "prefix-LM (first quarter)": Kind(
        lambda n: masks.prefix(n, n // 4),
        lambda n: lambda b, h, q, k: (k < n // 4) | (q >= k),
    ),
    "16 documents": _documents(16),
    "16 documents (full)": _documents(16, causal=False),
    "dilated window 128, dilation 4": _dilated(128, 4),
    "2-D neighbourhood 15×15 (NATTEN)": _natten(15),
    "strided 256 (video frames)": _strided(256),
    "ALiBi, causal": _causal_score(lambda n: score_mods.alibi(alibi_slopes(HEADS)), _alibi_bias),
    "soft-capping 30, causal": _causal_score(lambda n: score_mods.softcap(30.0), None),
    "T5 relative table, causal": _causal_score(
        lambda n: score_mods.relative_bias(
            _t5_table(), score_mods.t5_buckets(32, 128, bidirectional=False)
        ),
        _t5_bias,
    ),
}


@dataclass(frozen=True)
class StructuredCase:
    kind: str
    n: int
    threads: int
    b: int = 1
    h: int = 8
    d: int = 64


def _flex(kind: Kind, case: StructuredCase, q, k, v) -> Callable[[], None] | None:
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:  # a torch without FlexAttention
        return None
    # A fresh compile per row: each row's mask_mod is a new closure, and past torch's
    # recompile limit (8) Dynamo would run flex_attention eagerly, which builds the whole
    # (B, H, N, S) score matrix (24 GiB at N=16384: the run was killed for memory). fullgraph
    # turns any such fallback into an error instead.
    torch._dynamo.reset()
    # past N=4096 the block mask is built by a compiled kernel: the eager builder evaluates
    # mask_mod on the whole (N, S) grid at once (int64 temporaries: several GiB at N=16384
    # for the 2-D neighbourhood, 32 GiB at N=65536)
    big = case.n > BIAS_LIMIT_N
    block_mask = create_block_mask(
        kind.mask_mod(case.n), 1, 1, case.n, case.n, device="cpu", _compile=big
    )
    compiled = torch.compile(flex_attention, fullgraph=True)
    score_mod = None if kind.score is None else kind.score(case.n)

    def step():
        with torch.no_grad():
            compiled(q, k, v, score_mod=score_mod, block_mask=block_mask)

    return step


def _sdpa_mask(kind: Kind, mask: StructuredMask, n: int) -> Tensor | None:
    """What SDPA gets: the boolean mask, or for a score function its float bias with the mask
    as -inf (None: a score function SDPA cannot take, or too large to hold)."""
    if kind.score is None:
        return mask.dense() if n <= DENSE_LIMIT_N else None
    if kind.bias is None or n > BIAS_LIMIT_N:
        return None
    return kind.bias(n).masked_fill(~mask.dense()[0], float("-inf"))[None]  # (1, H, N, S)


def structured_row(
    case: StructuredCase, repeats: int, log: Callable[[str], None], flex: bool = True
) -> dict:
    """One row: median ms of every implementation that applies at this size (FlexAttention
    only with `flex`: its compile takes seconds)."""
    torch.set_num_threads(case.threads)
    kind = KINDS[case.kind]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(case.b, case.h, case.n, case.d, generator=g) for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    mask = kind.describe(case.n)
    score_mod = None if kind.score is None else kind.score(case.n)

    def forward(m):
        def step():
            with torch.no_grad():
                attention(q, k, v, mask=m, score_mod=score_mod)

        return step

    def both(m):
        def step():
            for t in (qg, kg, vg):
                t.grad = None
            attention(qg, kg, vg, mask=m, score_mod=score_mod).out.sum().backward()

        return step

    steps = {"structured": forward(mask), "structured_fb": both(mask)}
    if case.n <= DENSE_FB_LIMIT_N:
        dense = mask.dense()
        steps |= {"dense": forward(dense), "dense_fb": both(dense)}
    sdpa_mask = _sdpa_mask(kind, mask, case.n)
    if sdpa_mask is not None:
        steps["sdpa"] = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask)
    start = time.perf_counter()
    flex_error = None
    try:
        compiled = _flex(kind, case, q, k, v) if flex else None
        if compiled is not None:
            compiled()  # compile and first call outside the timing
            steps["flex"] = compiled
    except (RuntimeError, MemoryError) as e:  # FlexAttention's limits are part of the result
        flex_error = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        log(f"  FlexAttention failed at N={case.n}: {flex_error}")
    log(f"  {case.kind}, N={case.n}, {case.threads} thread(s): flex ready in "
        f"{time.perf_counter() - start:.1f} s, timing {len(steps)} implementations")  # fmt: skip
    ms = time_interleaved(steps, repeats)
    return {"kind": case.kind, "n": case.n, "threads": case.threads, "density": mask.density,
            "ms": ms, "flex_error": flex_error}  # fmt: skip


def memory_row(n: int = 65536, window: int = 512, heads: int = 2, d: int = 64) -> dict:
    """Peak bytes of tensors alive at once during a window-`window` forward + backward at N=`n`
    (inputs q, k, v included), against inputs + outputs + gradients: the structured mask needs
    no (N, S) anything."""
    shape = (1, heads, n, d)
    q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))
    one = q.numel() * q.element_size()
    with PeakTensors() as peak:
        attention(q, k, v, mask=masks.window(n, window, causal=True)).out.sum().backward()
    # q, k, v, out, its cotangent, dq, dk, dv: what any attention's forward + backward holds
    io = 8 * one
    return {"n": n, "window": window, "heads": heads, "peak_mib": (peak.peak + 3 * one) / 2**20,
            "io_mib": io / 2**20, "budget_mib": io / 2**20 + 256}  # fmt: skip


SIZES, THREADS = (4096, 16384), (1, 2)


def check_size(n: int) -> None:
    """A size every kind takes: N a square (the 2-D neighbourhood's grid) whose side is a
    multiple of 16 (16 documents of equal length, frames of 256 tokens)."""
    side = math.isqrt(n)
    if side * side != n or side % 16:
        raise ValueError(
            f"--sizes {n}: the structured table needs N = (16·m)², a square grid for the 2-D "
            "neighbourhood (1024, 4096, 16384, 65536, ...)"
        )


def structured_plan(
    quick: bool, sizes: tuple[int, ...] | None = None, threads: tuple[int, ...] | None = None
) -> list[tuple[StructuredCase, int]]:
    """(case, repeats) of the table: every kind at N = `SIZES`, `THREADS` threads (or the
    `sizes` / `threads` given), 3 repeats at every size (one repeat at N=16384 on a shared
    machine put a row's ratio anywhere from 0.8x to 1.7x); N=1024 at one thread with
    `quick`."""
    if quick:
        sizes, threads = sizes or (1024,), threads or (1,)
    for n in sizes or ():
        check_size(n)
    cases = []
    for t in threads or THREADS:
        for n in sizes or SIZES:
            reps = 2 if quick else 3
            cases += [(StructuredCase(kind, n, t), reps) for kind in KINDS]
    return cases


def _fmt(ms: float | None) -> str:
    return "—" if ms is None else (f"{ms:.0f}" if ms >= 10 else f"{ms:.1f}")


def _ratio(a, b) -> str:
    return "—" if a is None or b is None else f"{a / b:.2f}×"


def structured_markdown(rows: list[dict], memory: dict | None, machine: str) -> str:
    head = (
        f"Structured masks on {machine}: B=1, H=8, "
        "D=64, float32, eager (FlexAttention compiled), medians in ms. `desc` = attnkit with "
        "the description; `tensor` = attnkit with the same mask as an (N, S) tensor; "
        "`flex/desc` > 1 means attnkit is faster than FlexAttention; `speed-up` = tensor "
        "fwd+bwd / desc fwd+bwd. FlexAttention has no backward on the CPU.\n\n"
        "| mask | N | threads | density | desc fwd | flex fwd | flex/desc | SDPA tensor fwd | "
        "tensor fwd | desc fwd+bwd | tensor fwd+bwd | speed-up |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    )
    lines = []
    for r in rows:
        ms = r["ms"]
        get = ms.get
        lines.append(
            f"| {r['kind']} | {r['n']} | {r['threads']} | {r['density']:.3f} | "
            f"{_fmt(get('structured'))} | {_fmt(get('flex'))} | "
            f"{_ratio(get('flex'), get('structured'))} | {_fmt(get('sdpa'))} | "
            f"{_fmt(get('dense'))} | {_fmt(get('structured_fb'))} | {_fmt(get('dense_fb'))} | "
            f"{_ratio(get('dense_fb'), get('structured_fb'))} |"
        )
    text = head + "\n".join(lines) + "\n"
    failed = sorted({(r["n"], r["flex_error"]) for r in rows if r.get("flex_error")})
    for n, error in failed:
        text += f"\nFlexAttention failed at N={n}: {error}\n"
    if memory:
        text += (
            f"\nMemory, window {memory['window']} at N={memory['n']}, H={memory['heads']}, "
            f"forward + backward: peak of live tensors {memory['peak_mib']:.0f} MiB; inputs, "
            f"outputs and gradients {memory['io_mib']:.0f} MiB (target: within them + 256 MiB "
            f"= {memory['budget_mib']:.0f} MiB).\n"
        )
    return text


def run_structured(quick: bool, log: Callable[[str], None], sizes=None, threads=None) -> dict:
    """Every row of `structured_plan` (and the memory row, unless `quick`): the JSON payload.
    `log` hears one line per row started and per row's FlexAttention compile."""
    todo = structured_plan(quick, sizes, threads)
    rows = []
    for i, (case, repeats) in enumerate(todo, 1):
        log(f"[{i}/{len(todo)}] {case.kind}, N={case.n}, threads={case.threads}")
        rows.append(structured_row(case, repeats, log=log))
    torch.set_num_threads(1)
    memory = None if quick else memory_row()
    return {"machine": machine(), "rows": rows, "memory": memory}


def machine() -> str:
    """The CPU with its widest vector units (the kernel's code paths follow them) and torch."""
    flags = cpu_flags()
    isa = "AMX" if "amx_tile" in flags else "AVX-512" if "avx512f" in flags else "AVX2"
    return f"{cpu_name()} ({isa}), torch {torch.__version__}"
