"""Chunked attention vs torch SDPA vs plain matmul/softmax, float32, on CPU.

Legend: B batch, H heads, N queries = S keys, D head width (B=1, H=8, D=64 here).

One process times every config (warm-up, then repeats with the implementations interleaved so
that load from other users hits all of them alike; medians). Peak extra memory of one
forward+backward is measured per config in a fresh subprocess (VmHWM after - VmRSS before).
Writes bench_attention.json and bench_attention.md under --out.

    python benchmarks/bench_attention.py            # N in 256, 1024, 2048, 4096
    python benchmarks/bench_attention.py --quick    # N in 128, 256, a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from attnkit.functional.chunked import chunked_attention

B, H, D = 1, 8, 64
IMPLS = ("chunked", "sdpa", "plain")


def make_inputs(n: int, mask_kind: str, grad: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, D, generator=gen).requires_grad_(grad) for _ in range(3))
    # an arbitrary boolean mask, (N, S): ~10% of pairs blocked, True = may attend
    mask = torch.rand(n, n, generator=gen) > 0.1 if mask_kind == "bool" else None
    return q, k, v, mask


def attend(impl: str, q, k, v, mask, causal: bool, p: float):
    scale = D**-0.5
    if impl == "chunked":
        out, _ = chunked_attention(
            q, k, v, mask=mask, bias=None, causal=causal, scale=scale, dropout_p=p, training=True
        )
        return out
    if impl == "sdpa":
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal
        )
    s = (q * scale) @ k.transpose(-1, -2)  # (B, H, N, S)
    if causal:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril_()
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return F.dropout(s.softmax(-1), p) @ v


def run_once(impl, n, mask_kind, p, backward, inputs):
    q, k, v, mask = inputs
    if backward:
        for t in (q, k, v):
            t.grad = None
        attend(impl, q, k, v, mask, mask_kind == "causal", p).sum().backward()
    else:
        with torch.no_grad():
            attend(impl, q, k, v, mask, mask_kind == "causal", p)


def time_config(n, mask_kind, p, backward, repeats):
    inputs = make_inputs(n, mask_kind, backward)
    times = {impl: [] for impl in IMPLS}
    for impl in IMPLS:  # warm-up
        run_once(impl, n, mask_kind, p, backward, inputs)
    for _ in range(repeats):
        for impl in IMPLS:
            t0 = time.perf_counter()
            run_once(impl, n, mask_kind, p, backward, inputs)
            times[impl].append(time.perf_counter() - t0)
    return {impl: statistics.median(ts) for impl, ts in times.items()}


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith(field + ":"))
    return int(line.split()[1]) / 1024  # kB -> MiB


def peak_memory_child(impl, n, mask_kind, p):
    """Runs in a fresh process: peak RSS growth (MiB) of one forward+backward.

    Resets the kernel's high-water mark (VmHWM, Linux >= 4.0) after the inputs exist, so
    earlier peaks (torch import, building the inputs) do not hide the call's own.
    """
    inputs = make_inputs(n, mask_kind, True)
    small = make_inputs(64, mask_kind, True)
    run_once(impl, 64, mask_kind, p, True, small)  # load kernels / thread pools first
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = _status_mib("VmRSS")
    run_once(impl, n, mask_kind, p, True, inputs)
    return _status_mib("VmHWM") - before


def peak_memory(impl, n, mask_kind, p):
    cmd = [sys.executable, __file__, "--child", impl, str(n), mask_kind, str(p)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return float(res.stdout.strip().splitlines()[-1])


def sgemm_gflops(n: int, repeats: int = 5) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        ts.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(ts) / 1e9


def flops(n, mask_kind, backward):
    f = 4 * B * H * n * n * D  # QK^T and PV (forward)
    f = f / 2 if mask_kind == "causal" else f
    return 3.5 * f if backward else f  # backward ≈ 2.5× forward (5 gemms vs 2)


def write_atomic(path: Path, text: str):
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def markdown(rows, sgemm):
    lines = [
        f"sgemm: {', '.join(f'{n}: {g:.0f} GFLOP/s' for n, g in sgemm.items())}; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, B={B} H={H} D={D} float32",
        "",
        "| N | mask | dropout | pass | chunked ms | sdpa ms | plain ms | sdpa/chunked | "
        "chunked GFLOP/s | chunked % sgemm | peak MiB chunked / sdpa / plain |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ref = max(sgemm.values())
    for r in rows:
        t = r["ms"]
        mem = r.get("peak_mib")
        mem_s = " / ".join(f"{mem[i]:.0f}" for i in IMPLS) if mem else "-"
        lines.append(
            f"| {r['n']} | {r['mask']} | {r['dropout']} | {r['pass']} | {t['chunked']:.1f} | "
            f"{t['sdpa']:.1f} | {t['plain']:.1f} | {t['sdpa'] / t['chunked']:.2f}× | "
            f"{r['chunked_gflops']:.0f} | {100 * r['chunked_gflops'] / ref:.0f}% | {mem_s} |"
        )
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--sizes", type=int, nargs="*", help="override the list of N")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--no-memory", action="store_true", help="skip the subprocess memory runs")
    ap.add_argument(
        "--threads", type=int, help="torch.set_num_threads (1 resists other users' load)"
    )
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        impl, n, mask_kind, p = args.child
        print(peak_memory_child(impl, int(n), mask_kind, float(p)))
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = args.sizes or ([128, 256] if args.quick else [256, 1024, 2048, 4096])
    sgemm = {n: sgemm_gflops(n) for n in ((512, 1024) if args.quick else (2048, 4096))}
    rows = []
    for n in sizes:
        repeats = args.repeats or (2 if args.quick else (3 if n >= 4096 else 5))
        for mask_kind in ("none", "causal", "bool"):
            for p in (0.0, 0.1):
                mem = None
                if not args.no_memory:
                    mem = {impl: peak_memory(impl, n, mask_kind, p) for impl in IMPLS}
                for backward in (False, True):
                    t = time_config(n, mask_kind, p, backward, repeats)
                    row = {
                        "n": n, "mask": mask_kind, "dropout": p,
                        "pass": "fwd+bwd" if backward else "fwd",
                        "ms": {i: 1e3 * s for i, s in t.items()},
                        "chunked_gflops": flops(n, mask_kind, backward) / t["chunked"] / 1e9,
                    }  # fmt: skip
                    if backward and mem:
                        row["peak_mib"] = mem
                    rows.append(row)
                    print(markdown([row], sgemm).splitlines()[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "B": B, "H": H}
    result = {"meta": meta | {"D": D}, "sgemm_gflops": sgemm, "rows": rows}
    write_atomic(args.out / "bench_attention.json", json.dumps(result, indent=1))
    write_atomic(args.out / "bench_attention.md", markdown(rows, sgemm))
    print(f"wrote {args.out}/bench_attention.json and .md")


if __name__ == "__main__":
    main()
