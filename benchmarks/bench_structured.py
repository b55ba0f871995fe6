#!/usr/bin/env python3
"""Structured masks on the CPU: attnkit's descriptions vs the same masks as tensors, SDPA and
compiled FlexAttention (issue 29's targets), written to benchmarks/results/structured.{json,md}.

    python benchmarks/bench_structured.py            # the full table (~15 min on 2 cores)
    python benchmarks/bench_structured.py --quick    # N=1024 only, one thread (a smoke run)

Sizes: N=4096 times every implementation; N=16384 leaves out the dense forward+backward (its
ratio only grows with N); N=65536 times the masks whose work is linear in N (windows,
documents) and leaves out the tensors (a 65536² mask is 4 GiB before any work). Compare ratios
within one run: absolute times drift up to 2x on shared machines.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from attnkit._cpu import cpu_name
from attnkit._io import atomic_write_text
from attnkit.analysis.bench_structured import KINDS, StructuredCase, memory_row, structured_row

RESULTS = Path(__file__).resolve().parent / "results"
LINEAR = ("window 256", "window 1024", "16 documents", "64 documents")


def plan(quick: bool):
    if quick:
        return [(StructuredCase(kind, 1024, 1), 2) for kind in KINDS]
    cases = []
    for threads in (1, 2):
        cases += [(StructuredCase(kind, 4096, threads), 5) for kind in KINDS]
        cases += [(StructuredCase(kind, 16384, threads), 2) for kind in KINDS]
        cases += [(StructuredCase(kind, 65536, threads), 1) for kind in LINEAR]
    return cases


def _fmt(ms: float | None) -> str:
    return "—" if ms is None else (f"{ms:.0f}" if ms >= 10 else f"{ms:.1f}")


def _ratio(a, b) -> str:
    return "—" if a is None or b is None else f"{a / b:.2f}×"


def markdown(rows: list[dict], memory: dict | None, machine: str) -> str:
    head = (
        f"# Structured masks: attnkit vs tensors, SDPA and FlexAttention\n\n{machine}. B=1, H=8, "
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
    if memory:
        text += (
            f"\nMemory, window {memory['window']} at N={memory['n']}, H={memory['heads']}, "
            f"forward + backward: peak of live tensors {memory['peak_mib']:.0f} MiB; inputs, "
            f"outputs and gradients {memory['io_mib']:.0f} MiB (target: within them + 256 MiB "
            f"= {memory['budget_mib']:.0f} MiB).\n"
        )
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="N=1024, one thread (a smoke run)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for structured.{json,md}")
    args = ap.parse_args(argv)
    todo = plan(args.quick)
    rows = []
    for i, (case, repeats) in enumerate(todo, 1):
        print(f"[{i}/{len(todo)}] {case.kind}, N={case.n}, threads={case.threads}", flush=True)
        rows.append(structured_row(case, repeats, log=lambda m: print(m, flush=True)))
    torch.set_num_threads(1)
    memory = None if args.quick else memory_row()
    machine = f"{cpu_name()}, torch {torch.__version__}"
    name = "structured-quick" if args.quick else "structured"
    args.out.mkdir(parents=True, exist_ok=True)
    payload = {"machine": machine, "rows": rows, "memory": memory}
    atomic_write_text(args.out / f"{name}.json", json.dumps(payload, indent=1) + "\n")
    atomic_write_text(args.out / f"{name}.md", markdown(rows, memory, machine))
    print(f"wrote {args.out / name}.json and .md ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
