"""`attnkit flops --plot`: global vs window attention, formula cost and measured time.

Square token grids g×g (N = g² tokens, as in Swin) of width C: global attention
costs 4NC² + 2N²C MACs, Swin windows of M×M patches 4NC² + 2M²NC. The plot puts
both costs (GFLOPs, log scale) against N, overlays the forward time of the same
attention measured on this machine (secondary axis), and compares the achieved
GFLOP/s with an sgemm rate (a 2048×2048 float32 matmul timed in the same run).
Measurement runs on one thread, stays under ~20 s and shows a progress bar on
stderr (not with --quiet).
"""

from __future__ import annotations

import math
import os
import time

import torch

from attnkit._io import atomic_save_figure
from attnkit.analysis import mha_cost, swin_window_cost

GRIDS = (8, 14, 21, 28, 42, 56)  # N = 64 ... 3136 tokens
BUDGET_S = 12.0  # stop measuring larger sizes after this many seconds


def _best_time(fn, *, min_total: float = 0.2, max_reps: int = 50) -> float:
    """Best time of repeated calls after one warm-up (seconds).

    The minimum, not the mean: on a shared machine the noise only ever adds
    time. Cheap calls repeat until `min_total` seconds are spent; slow ones
    (over 0.25 s) are timed twice.
    """
    fn()
    best, spent, done = math.inf, 0.0, 0
    while done < max_reps and (done < 3 or spent < min_total):
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best, spent, done = min(best, dt), spent + dt, done + 1
        if dt > 0.25 and done >= 2:
            break
    return best


def sgemm_gflops(size: int = 2048) -> float:
    """Measured float32 matmul rate of this machine, GFLOP/s (2·size³ FLOPs per product)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(size, size, generator=g), torch.randn(size, size, generator=g)
    return 2 * size**3 / _best_time(lambda: a @ b) / 1e9


def measure(dim: int, heads: int, window: int, grids=GRIDS, bar=None) -> dict:
    """Formula GFLOPs and measured forward seconds for global and window attention on
    g×g token grids (`grids`); `bar` (tqdm) advances once per grid."""
    from attnkit import MultiHeadAttention

    torch.manual_seed(0)
    layer = MultiHeadAttention(dim, heads).eval()
    rows, start = [], time.perf_counter()
    with torch.inference_mode():
        for g in grids:
            if time.perf_counter() - start > BUDGET_S:
                break  # the rows so far are drawn; the summary gives the largest N measured
            n, m = g * g, min(window, g)
            x = torch.randn(1, n, dim)
            gp = math.ceil(g / m) * m  # padded grid side
            windows = torch.randn((gp // m) ** 2, m * m, dim)  # (windows, M², C)
            t_global = _best_time(lambda x=x: layer(x))
            t_window = _best_time(lambda w=windows: layer(w))
            rows.append({
                "n": n,
                "global_gflops": mha_cost(n, dim, heads).flops / 1e9,
                "window_gflops": swin_window_cost(g, g, dim, heads, window).flops / 1e9,
                "global_s": t_global,
                "window_s": t_window,
            })  # fmt: skip
            if bar is not None:
                bar.set_postfix_str(f"N={n}: global {t_global * 1e3:.2f} ms", refresh=False)
                bar.update()
    if bar is not None:
        bar.set_postfix_str("sgemm rate", refresh=False)
    return {"rows": rows, "sgemm_gflops": sgemm_gflops()}


def memory_needed(dim: int, heads: int, tokens: int) -> int:
    """Bytes the largest measurement holds at once, roughly (float32): the layer's weights
    (4·C² + 4·C), the activations of N tokens (x, q, k, v, out, projections: ~6·N·C) and
    the scores and probabilities of global attention (2·H·N²)."""
    return 4 * (4 * dim * dim + 4 * dim + 6 * tokens * dim + 2 * heads * tokens * tokens)


def check_memory(dim: int, heads: int, tokens: int) -> None:
    """ValueError naming --dim when the measurement would take more than half of this
    machine's memory (torch's allocator would fail with a number of bytes and no option)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not POSIX: no bound to check against
        return
    need = memory_needed(dim, heads, tokens)
    if need > total // 2:
        raise ValueError(
            f"--dim {dim} --heads {heads} up to {tokens} tokens: measuring it needs about "
            f"{need / 2**30:,.1f} GiB, more than half of this machine's {total / 2**30:,.1f} GiB: "
            "give a smaller --dim (or --plot-max-tokens)"
        )


def plot(path, *, dim: int, heads: int, window: int, grids=GRIDS, quiet: bool = False) -> dict:
    """Measure, draw and write the PNG atomically (temporary name, then os.replace);
    return the measurements ({"rows": [...], "sgemm_gflops": ...})."""
    if dim % heads:
        raise ValueError(f"--heads {heads} must divide --dim {dim}")
    if not str(path).lower().endswith(".png"):
        raise ValueError(f"--plot must name a .png file, got {str(path)!r}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attnkit.cli._common import progress

    # One thread: on a shared machine an intra-op pool waits for its busiest
    # worker, which turns millisecond calls into 100 ms ones.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with progress(len(grids), "flops --plot", quiet=quiet, unit="grid") as bar:
            data = measure(dim, heads, window, grids, bar)
    finally:
        torch.set_num_threads(threads)
    rows, peak = data["rows"], data["sgemm_gflops"]
    n = [r["n"] for r in rows]

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    ax.plot(n, [r["global_gflops"] for r in rows], "o-", color="C0", label="global: formula")
    ax.plot(
        n,
        [r["window_gflops"] for r in rows],
        "s-",
        color="C1",
        label=f"window {window}×{window}: formula",
    )
    ax.set(
        xscale="log", yscale="log", xlabel="tokens N (grid g×g)", ylabel="forward GFLOPs (formula)"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax2 = ax.twinx()
    ax2.plot(
        n,
        [r["global_s"] * 1e3 for r in rows],
        "o--",
        color="C0",
        alpha=0.6,
        label="global: measured",
    )
    ax2.plot(
        n,
        [r["window_s"] * 1e3 for r in rows],
        "s--",
        color="C1",
        alpha=0.6,
        label="window: measured",
    )
    ax2.set(yscale="log", ylabel="measured forward time (ms)")
    last = rows[-1]
    rates = (
        f"at N={last['n']}: global {last['global_gflops'] / last['global_s']:.1f} GFLOP/s, "
        f"window {last['window_gflops'] / last['window_s']:.1f} GFLOP/s; "
        f"sgemm 2048² {peak:.1f} GFLOP/s (1 thread)"
    )
    forms = "global 4NC²+2N²C vs window 4NC²+2M²NC"
    ax.set_title(f"Attention cost, C={dim}, H={heads}: {forms}\n{rates}", fontsize=9)
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], loc="upper left", fontsize=8)
    fig.tight_layout()

    try:
        atomic_save_figure(path, fig)
    finally:
        plt.close(fig)
    return data
