"""Per-rank memory of a context-parallel training step of a whole model (the demo's GPT).

bench_ring.py measures attention alone, whose floor is 5 (B, H, N/P, D) tensors per rank at
any P. What users train is a model: per layer its activations (LayerNorms, q/k/v, the
4C-wide MLP, residuals) are kept for backward on every position a rank holds, while the
ring's transfer buffers exist for one layer's attention at a time. So the per-rank peak of a
training step should approach 1/P of one process's. Launch one run per world size; each
merges its rows into benchmarks/results/ring-model.json and rewrites ring-model.md:

    torchrun --nproc-per-node 1 benchmarks/bench_ring_model.py --lengths 4096 8192 16384
    torchrun --nproc-per-node 2 benchmarks/bench_ring_model.py --lengths 4096 8192 16384
    torchrun --nproc-per-node 4 benchmarks/bench_ring_model.py --lengths 4096 8192 16384

One step = `train_demo.cp_loss` (the demo's forward on this rank's N/P positions, zigzag,
ring attention) and its backward, float32, batch 1, the demo's model at the sizes given
(default width 64, 4 heads, 2 layers, vocabulary 64). Memory only: "tensors", the most bytes
of tensors allocated during the step and alive at once (bench_ring's `PeakTensors`: exact
and deterministic, so it may be taken on a busy machine), the largest over the ranks.
The model's parameters exist before the step and are not counted (they are replicated: P
copies, not 1/P); their gradients are allocated in the step and are counted. The parameter
gradients' all-reduce and the optimizer step come after and allocate nothing larger.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from attnkit._io import atomic_write_json, atomic_write_text
from attnkit.distributed import train_demo
from attnkit.distributed.ring import group_info

RESULTS = Path(__file__).with_name("results")


def _peak_tensors():
    spec = importlib.util.spec_from_file_location(
        "bench_ring", Path(__file__).with_name("bench_ring.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.PeakTensors


def step_peak(n: int, width: int = 64, heads: int = 4, layers: int = 2, vocab: int = 64) -> int:
    """Peak live tensor bytes of one training step of the demo's GPT on this rank's share of
    a length-``n`` sequence (the whole of it without a process group)."""
    rank, world = group_info(None)
    argv = ["--out", "-", "--seq-len", str(n), "--width", str(width), "--heads", str(heads)]
    args = train_demo.parse([*argv, "--layers", str(layers), "--vocab", str(vocab)])
    model = train_demo.context_parallel(train_demo.build(args), layout="zigzag")
    ids = train_demo.batch(args.seed, 0, 1, n, vocab, args.period)  # (1, N + 1)
    with _peak_tensors()() as mem:
        loss = train_demo.cp_loss(model, ids, rank, world, "zigzag")
        loss.backward()
    return mem.peak


def table(rows: list[dict]) -> str:
    one = {r["N"]: r["tensor_mib_per_rank"] for r in rows if r["P"] == 1}
    head = "| P | N | peak MiB / rank (tensors) | x one process | 1/P |\n|---|---|---|---|---|\n"
    body = ""
    for r in sorted(rows, key=lambda r: (r["N"], r["P"])):
        ratio = f"{r['tensor_mib_per_rank'] / one[r['N']]:.2f}" if r["N"] in one else "-"
        mib = r["tensor_mib_per_rank"]
        body += f"| {r['P']} | {r['N']} | {mib:.1f} | {ratio} | {1 / r['P']:.2f} |\n"
    return head + body


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384])
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--threads", type=int, default=None, help="per rank (default cores / P)")
    p.add_argument("--out", type=Path, default=RESULTS / "ring-model.json")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    threads = args.threads or max(1, (os.cpu_count() or 1) // world)
    torch.set_num_threads(threads)
    rows = []
    for n in args.lengths:
        peak = step_peak(n, args.width, args.heads, args.layers, args.vocab)
        t = torch.tensor([peak], dtype=torch.float64)
        dist.all_reduce(t, dist.ReduceOp.MAX)  # the largest over the ranks
        row = {"P": world, "N": n, "tensor_mib_per_rank": float(t) / 2**20}
        if rank == 0:
            print(json.dumps(row), flush=True)
        rows.append(row)
    if rank == 0:
        old = json.loads(args.out.read_text())["runs"] if args.out.exists() else []
        config = {k: v for k, v in vars(args).items() if k not in ("out", "lengths")}
        fresh = {(r["P"], r["N"]) for r in rows}
        runs = [r for r in old if (r["P"], r["N"]) not in fresh] + [
            {**r, "config": config} for r in rows
        ]
        atomic_write_json(args.out, {"runs": runs})
        atomic_write_text(args.out.with_suffix(".md"), table(runs))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
