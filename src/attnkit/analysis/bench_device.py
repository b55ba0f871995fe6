"""Attention timed on one device (CUDA, or the CPU for a dry run): attnkit against SDPA,
FlexAttention and `torch.nn.MultiheadAttention`, as rows of one table.

Legend: B batch, H heads, N = S tokens, D head width. Each row times one call shape with every
implementation that applies, interleaved in one process (warm-up, then medians), and gives the
ratio attnkit / SDPA: compare ratios within a run, not absolute times across machines.

Timing on CUDA synchronises before and after each sample (`torch.cuda.synchronize`): a launch
returns before the kernel ends. A row that fails (out of memory, a kernel that does not exist on
this GPU) records its error instead of stopping the run; a run that has spent its time budget
records the rows it did not reach as skipped. `benchmarks/gpu_check.py` runs this on the GPU.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

from attnkit.functional import score_mods
from attnkit.functional.attention import attention
from attnkit.functional.relative import alibi_slopes
from attnkit.functional.structured import document, document_ids, prefix, window

__all__ = [
    "DeviceRow", "device_plan", "rows_markdown", "run_rows", "structured_plan", "sync",
    "time_steps",
]  # fmt: skip

MASKS = ("none", "causal", "padding", "window")
# structure beyond SDPA's own cases, for `structured_plan`: on CUDA attnkit sends these to
# FlexAttention, SDPA gets the dense mask (or bias), Flex its own mask_mod / score_mod
STRUCTURED = ("documents", "prefix", "alibi", "softcap")


@dataclass(frozen=True)
class DeviceRow:
    """One call shape: (B, H, N, D) in `dtype`, a mask kind, dropout p, forward or fwd+bwd."""

    b: int
    h: int
    n: int
    d: int
    dtype: str
    mask: str  # MASKS or STRUCTURED; "window": a 256-key causal window (a description);
    # "documents": 8 causal documents of N/8; "prefix": prefix-LM, the first N/4 bidirectional;
    # "alibi" / "softcap" (50): causal with that score function (SDPA: the dense ALiBi bias;
    # plain causal for softcap, which SDPA cannot express)
    dropout: float
    backward: bool

    @property
    def label(self) -> str:
        step = "fwd+bwd" if self.backward else "fwd"
        return (
            f"B={self.b} H={self.h} N={self.n} D={self.d} {self.dtype} {self.mask} "
            f"p={self.dropout:g} {step}"
        )


@dataclass
class DeviceResult:
    row: DeviceRow
    ms: dict[str, float] = field(default_factory=dict)  # implementation -> median ms
    error: str | None = None
    skipped: bool = False

    def as_dict(self) -> dict:
        out = {**asdict(self.row), "label": self.row.label, "ms": self.ms}
        sdpa, ak = self.ms.get("sdpa"), self.ms.get("attnkit")
        out["attnkit_over_sdpa"] = round(ak / sdpa, 3) if sdpa and ak else None
        if self.error:
            out["error"] = self.error
        if self.skipped:
            out["skipped"] = True
        return out


def device_plan(quick: bool = False) -> list[DeviceRow]:
    """The rows of issue 40's table: B=8, H=16, D=64/128, N=1024..16384, float16/bfloat16, the
    four masks, dropout 0/0.1, forward and forward+backward. `quick`: a handful of small rows
    (the CPU dry run CI takes)."""
    if quick:
        return [
            DeviceRow(1, 2, 64, 16, "float32", mask, p, bwd)
            for mask in MASKS
            for p, bwd in ((0.0, False), (0.1, True))
        ]
    rows = []  # the most telling rows first, so a spent budget cuts the least
    for n in (4096, 16384, 1024):
        for dtype in ("bfloat16", "float16"):
            for d in (64, 128):
                for mask in MASKS:
                    for p in (0.0, 0.1):
                        for bwd in (False, True):
                            if n == 16384 and (d == 128 or dtype == "float16"):
                                continue  # the largest N once per mask: time is the limit
                            rows.append(DeviceRow(8, 16, n, d, dtype, mask, p, bwd))
    return rows


def structured_plan(ns=(4096, 16384), dtype: str = "bfloat16", d: int = 64) -> list[DeviceRow]:
    """Rows for the FlexAttention route (issue 36): every mask kind with structure, and the
    plain ones beside them, forward and forward+backward, no dropout (Flex has none)."""
    kinds = ("window", *STRUCTURED, "causal", "none")
    return [
        DeviceRow(8, 16, n, d, dtype, mask, 0.0, bwd)
        for n in ns
        for mask in kinds
        for bwd in (False, True)
    ]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _inputs(row: DeviceRow, device: torch.device, seed: int = 0):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    dtype = getattr(torch, row.dtype)
    shape = (row.b, row.h, row.n, row.d)  # (B, H, N, D)
    q, k, v = (
        torch.randn(shape, generator=gen)
        .to(device=device, dtype=dtype)
        .requires_grad_(row.backward)
        for _ in range(3)
    )
    return q, k, v


def _masks(row: DeviceRow, device: torch.device):
    """(attnkit's mask, attnkit's causal, attnkit's score_mod, SDPA's attn_mask, SDPA's
    is_causal) for the row."""
    n = row.n
    if row.mask == "causal":
        return None, True, None, None, True
    if row.mask == "padding":  # (B, 1, 1, S): the last quarter of the keys is padding
        pad = torch.ones(row.b, 1, 1, n, dtype=torch.bool, device=device)
        pad[..., n - n // 4 :] = False
        return pad, False, None, pad, False
    if row.mask in ("window", "documents", "prefix"):
        if row.mask == "window":
            desc = window(n, 256, causal=True, device=device)
        elif row.mask == "documents":
            desc = document(document_ids([n // 8] * 7 + [n - 7 * (n // 8)]).to(device), causal=True)
        else:
            desc = prefix(n, n // 4, device=device)
        return desc, False, None, desc.dense(device), False
    if row.mask == "alibi":
        mod = score_mods.alibi(alibi_slopes(row.h, device=device))
        q = torch.empty(1, row.h, n, 1, device=device, dtype=getattr(torch, row.dtype))
        bias = score_mods.dense_bias(mod, q, q, None).to(q.dtype)  # (1, H, N, S)
        causal_bias = bias.masked_fill(
            ~torch.ones(n, n, dtype=torch.bool, device=device).tril(), float("-inf")
        )
        return None, True, mod, causal_bias, False
    if row.mask == "softcap":
        return None, True, score_mods.softcap(50.0), None, True
    return None, False, None, None, False


def _flex_step(row: DeviceRow, device: torch.device):
    """Compiled FlexAttention for the row's mask, or None where it does not apply here."""
    if row.dropout > 0 or row.mask == "padding":
        return None  # Flex has no dropout; padding is SDPA's own case
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None
    if device.type == "cpu" and row.backward:
        return None  # FlexAttention has no backward on the CPU
    keep, score = _flex_mods(row, device)
    block = None if keep is None else create_block_mask(keep, None, None, row.n, row.n, device)
    compiled = torch.compile(flex_attention, dynamic=False)
    return lambda q, k, v: compiled(q, k, v, score_mod=score, block_mask=block)


def _flex_mods(row: DeviceRow, device: torch.device):
    """FlexAttention's (mask_mod, score_mod) for the row, written as its documentation does."""
    n = row.n
    if row.mask == "none":
        return None, None
    width = 256 if row.mask == "window" else n
    doc = torch.arange(n, device=device) // (n // 8) if row.mask == "documents" else None
    if doc is not None:
        doc = doc.clamp_max(7)

    def keep(b, h, q_idx, kv_idx):
        causal = (kv_idx <= q_idx) & (q_idx - kv_idx < width)
        if doc is not None:
            return causal & (doc[q_idx] == doc[kv_idx])
        if row.mask == "prefix":
            return causal | (kv_idx < n // 4)
        return causal

    slopes = alibi_slopes(row.h, device=device)

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    def softcap(score, b, h, q_idx, kv_idx):
        return 50.0 * torch.tanh(score / 50.0)

    return keep, {"alibi": alibi, "softcap": softcap}.get(row.mask)


def _steps(row: DeviceRow, device: torch.device, flex: bool) -> dict[str, Callable[[], None]]:
    q, k, v = _inputs(row, device)
    mask, causal, mod, sdpa_mask, is_causal = _masks(row, device)
    calls = {
        "attnkit": lambda: (
            attention(
                q,
                k,
                v,
                mask=mask,
                causal=causal,
                dropout_p=row.dropout,
                training=row.dropout > 0,
                score_mod=mod,
            ).out
        ),
        "sdpa": lambda: F.scaled_dot_product_attention(
            q, k, v, attn_mask=sdpa_mask, is_causal=is_causal, dropout_p=row.dropout
        ),
    }
    flex_call = _flex_step(row, device) if flex else None
    if flex_call is not None:
        calls["flex"] = lambda: flex_call(q, k, v)

    def as_step(call):
        def step() -> None:
            if row.backward:
                for t in (q, k, v):
                    t.grad = None
                call().float().sum().backward()
            else:
                with torch.no_grad():
                    call()

        return step

    return {name: as_step(call) for name, call in calls.items()}


def time_steps(steps: dict[str, Callable[[], None]], device, repeats: int) -> dict[str, float]:
    """Median ms per step: two warm-up calls each (compiles happen there), then `repeats`
    rounds, the implementations in turn, synchronised around each sample."""
    for step in steps.values():
        step()
        step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            sync(device)
            t0 = time.perf_counter()
            step()
            sync(device)
            times[name].append(1e3 * (time.perf_counter() - t0))
    return {name: round(statistics.median(ts), 4) for name, ts in times.items()}


def run_rows(
    rows: list[DeviceRow],
    device: torch.device | str,
    *,
    repeats: int = 5,
    budget_s: float = float("inf"),
    flex: bool = True,
    log: Callable[[str], None] = print,
) -> list[DeviceResult]:
    """Time every row on `device`; rows past `budget_s` seconds are recorded as skipped.
    `flex`: also time compiled FlexAttention where it applies (each mask compiles once)."""
    device = torch.device(device)
    start, results = time.monotonic(), []
    for i, row in enumerate(rows, 1):
        result = DeviceResult(row)
        results.append(result)
        if time.monotonic() - start > budget_s:
            result.skipped = True
            continue
        if flex:  # torch.compile keeps 8 kernels per function: the rows would exhaust it
            torch._dynamo.reset()
        try:
            try:
                result.ms = time_steps(_steps(row, device, flex), device, repeats)
            except (RuntimeError, ValueError, NotImplementedError) as err:
                if not flex:
                    raise
                result.error = f"flex: {type(err).__name__}: {str(err).splitlines()[0][:160]}"
                result.ms = time_steps(_steps(row, device, False), device, repeats)
        except (RuntimeError, ValueError, NotImplementedError) as err:  # OOM, missing kernels
            result.error = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        log(f"[{i}/{len(rows)}] {row.label}: {result.ms or result.error}")
    return results


def rows_markdown(results: list[DeviceResult], title: str) -> str:
    """A markdown table: one line per row, ms per implementation and attnkit / SDPA."""
    lines = [
        f"## {title}",
        "",
        "| row | attnkit ms | SDPA ms | Flex ms | attnkit / SDPA |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for res in results:
        d = res.as_dict()
        if res.skipped or res.error:
            note = "skipped (time budget)" if res.skipped else res.error
            lines.append(f"| {res.row.label} | {note} | | | |")
            continue

        def cell(name, ms=d["ms"]):
            return f"{ms[name]:.3f}" if name in ms else "–"

        ratio = d["attnkit_over_sdpa"]
        ratio_cell = f"{ratio:.2f}×" if ratio is not None else "–"
        lines.append(
            f"| {res.row.label} | {cell('attnkit')} | {cell('sdpa')} | {cell('flex')} | "
            f"{ratio_cell} |"
        )
    return "\n".join(lines) + "\n"


def results_json(results: list[DeviceResult]) -> str:
    return json.dumps([r.as_dict() for r in results], indent=1)
