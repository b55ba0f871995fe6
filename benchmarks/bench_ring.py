"""Ring (or Ulysses) attention across P processes: memory per rank, time, bytes, overlap.

Launch one run per world size; each run merges its rows into benchmarks/results/ring.json and
rewrites the table benchmarks/results/ring.md:

    torchrun --nproc-per-node 1 benchmarks/bench_ring.py --lengths 4096 8192 16384
    torchrun --nproc-per-node 2 benchmarks/bench_ring.py --lengths 4096 8192 16384
    torchrun --nproc-per-node 4 benchmarks/bench_ring.py --lengths 4096 8192 16384

gloo on the CPU, nccl on CUDA (one GPU per rank), unchanged. Across machines, the same
command with torchrun's --nnodes/--node-rank/--rdzv-endpoint.

Per length, one training step (forward + backward of the attention alone, float32, B=1) is
timed, best of --repeats, slowest rank, with the time each rank spends blocked in the ring's
waits on transfers ("exposed": transfer time the computation did not hide, plus any wait for
a slower neighbour). The same transfers are then timed with no computation ("comm"), and the
same step with every transfer replaced by a local copy ("compute").
Overlap = 1 - exposed / comm, clipped to [0, 1]: 1 when no transfer was waited on, 0 when
every transfer was waited on in full. (The first version computed
(compute + comm - step) / min(compute, comm) from three separate best-of runs: with comm
1-2% of a step, the jitter between runs was several times comm, so it read 0.00 whatever
happened.) Peak memory per rank, two ways: "tensors", the most bytes of tensors allocated
during the step that were alive at once (`PeakTensors`, exact and deterministic: the same on a
busy machine), also in units of one (B, H, N/P, D) float32 tensor; and "RSS", the highest
resident set size sampled every 2 ms during the step minus the RSS before it (CPU; includes
the allocator's slack), or torch.cuda.max_memory_allocated (CUDA). Neither counts the inputs
q, k, v. In those units one process (P=1) needs 5 (out, dO, dQ, dK, dV): the ideal for P ranks
is 5 units each, i.e. 1/P of one process. Bytes: what this rank sends per step, counted at
the send calls, against the ideal of receiving every other rank's K/V once and
reduce-scattering dK/dV once: (P-1)·(|K|+|V|) forward + (P-1)·(|dK|+|dV|) backward.

--memory-only takes one step per length for the memory columns (and bytes) and keeps the
time columns already in ring.json for that row: the memory figures can be re-taken on a busy
machine, the times cannot.

The numbers mean something only on an otherwise idle machine: take them quietly.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from attnkit._io import atomic_write_json, atomic_write_text
from attnkit.analysis.peak_tensors import PeakTensors
from attnkit.distributed import ring as ring_mod
from attnkit.distributed import ring_attention, ulysses_attention

RESULTS = Path(__file__).with_name("results")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


class PeakRSS:
    """Samples the resident set size in a thread: the peak above the level at entry."""

    def __enter__(self):
        self.base = self.peak = rss_bytes()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self):
        while not self.stop.wait(0.002):
            self.peak = max(self.peak, rss_bytes())

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.peak = max(self.peak, rss_bytes())


class SendCounter:
    """Wraps ring.exchange: counts bytes sent; ``local=True`` replaces transfers by copies."""

    def __init__(self, local: bool = False):
        self.sent, self.local, self.real = 0, local, ring_mod.exchange

    def __call__(self, send, recv, group, rank, world):
        self.sent += sum(t.numel() * t.element_size() for t in send)
        if self.local:
            for s, r in zip(send, recv, strict=True):
                r.copy_(s)
            return []
        return self.real(send, recv, group, rank, world)

    def __enter__(self):
        ring_mod.exchange = self
        return self

    def __exit__(self, *exc):
        ring_mod.exchange = self.real


class WaitTimer:
    """Wraps ring._wait: seconds blocked on transfers, per step (reset by `step`)."""

    def __init__(self):
        self.per_step: list[float] = []
        self.real = ring_mod._wait

    def __call__(self, reqs):
        t0 = time.perf_counter()
        self.real(reqs)
        if self.per_step:
            self.per_step[-1] += time.perf_counter() - t0

    def __enter__(self):
        ring_mod._wait = self
        return self

    def __exit__(self, *exc):
        ring_mod._wait = self.real


def step(fn, q, k, v, causal, layout, waits: WaitTimer | None = None):
    if waits is not None:
        waits.per_step.append(0.0)
    q.grad = k.grad = v.grad = None
    out = fn(q, k, v, causal=causal, layout=layout).out
    out.backward(torch.ones_like(out))


def comm_only(k, v, world, rank, layout, causal):
    """The ring's transfers of one step with no computation, in the pieces the ring sends
    (`ring._pieces`): 2(P-1) K/V hops and P-1 dK/dV hops (dK, dV shaped like K, V)."""
    _, pieces = ring_mod._pieces(k, v, world, layout, causal)
    for _ in range(3 * (world - 1)):
        for kv in pieces:
            recv = [torch.empty_like(t) for t in kv]
            for r in ring_mod.exchange(kv, recv, None, rank, world):
                r.wait()


def timed(fn, repeats, device) -> float:
    best = float("inf")
    for _ in range(repeats):
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return slowest(best, device)


def slowest(seconds: float, device) -> float:
    """The largest value over the ranks."""
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, dist.ReduceOp.MAX)
    return float(t.cpu())


def measure(args, n: int, rank: int, world: int, device) -> dict:
    g = torch.Generator().manual_seed(1000 + rank)
    shape = (args.batch, args.heads, n // world, args.head_dim)
    kv_shape = (args.batch, args.kv_heads, n // world, args.head_dim)
    q = torch.randn(shape, generator=g).to(device).requires_grad_()
    k = torch.randn(kv_shape, generator=g).to(device).requires_grad_()
    v = torch.randn(kv_shape, generator=g).to(device).requires_grad_()
    fn = ring_attention if args.strategy == "ring" else ulysses_attention
    waits = WaitTimer()
    run = lambda: step(fn, q, k, v, args.causal, args.layout, waits)  # noqa: E731
    run_local = lambda: step(fn, q, k, v, args.causal, args.layout)  # noqa: E731
    unit = q.numel() * 4  # bytes of one (B, H, N/P, D) float32 tensor
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    if args.memory_only:  # one step, both memory figures; no times
        with PeakRSS() as mem, PeakTensors() as tensors, SendCounter() as sent:
            run_local()
        row = {"P": world, "N": n}
    else:
        with PeakRSS() as mem, SendCounter() as sent, waits:
            t_step = timed(run, args.repeats, device)
        with PeakTensors() as tensors:  # after the timed runs: the mode costs time per op
            run_local()
        row = {"P": world, "N": n, "step_s": t_step}
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else mem.peak - mem.base
    row.update(
        rss_mib_per_rank=slowest(peak, device) / 2**20,
        tensor_mib_per_rank=slowest(tensors.peak, device) / 2**20,
        tensor_units=slowest(tensors.peak, device) / unit,
    )  # the largest over the ranks
    if args.strategy == "ring" and world > 1:
        kv_bytes = 2 * k.numel() * k.element_size()
        steps = 1 if args.memory_only else args.repeats
        row["sent_mib_per_step"] = sent.sent / steps / 2**20
        row["ideal_mib_per_step"] = 2 * (world - 1) * kv_bytes / 2**20
        if args.memory_only:
            return row
        exposed = slowest(min(waits.per_step), device)  # the least of the repeats, slowest rank
        with SendCounter(local=True):
            t_comp = timed(run_local, args.repeats, device)
        kd, vd = k.detach(), v.detach()
        t_comm = timed(
            lambda: comm_only(kd, vd, world, rank, args.layout, args.causal), args.repeats, device
        )
        hidden = 1.0 - exposed / t_comm if t_comm > 0 else 1.0
        row.update(
            compute_s=t_comp, comm_s=t_comm, exposed_s=exposed, overlap=max(0.0, min(1.0, hidden))
        )
    return row


def table(rows: list[dict]) -> str:
    head = (
        "| P | N | step (s) | peak MiB / rank (tensors) | tensors (units) | "
        "peak MiB / rank (RSS) | sent MiB / step | ideal MiB | compute (s) | comm (s) | "
        "exposed (s) | overlap |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    f = lambda r, k, fmt: format(r[k], fmt) if k in r else "-"  # noqa: E731
    body = "".join(
        f"| {r['P']} | {r['N']} | {f(r, 'step_s', '.2f')} | {f(r, 'tensor_mib_per_rank', '.0f')} | "
        f"{f(r, 'tensor_units', '.1f')} | {f(r, 'rss_mib_per_rank', '.0f')} | "
        f"{f(r, 'sent_mib_per_step', '.1f')} | {f(r, 'ideal_mib_per_step', '.1f')} | "
        f"{f(r, 'compute_s', '.2f')} | {f(r, 'comm_s', '.2f')} | {f(r, 'exposed_s', '.3f')} | "
        f"{f(r, 'overlap', '.2f')} |\n"
        for r in sorted(rows, key=lambda r: (r["N"], r["P"]))
    )
    return head + body


def merge(old: list[dict], rows: list[dict], config: dict, memory_only: bool) -> list[dict]:
    """ring.json's runs with this run's rows in; --memory-only updates only the memory fields
    (and bytes) of a row already there, keeping its times and their config."""
    fresh = {(r["P"], r["N"]): r for r in rows}
    out = []
    for r in old:
        new = fresh.pop((r["P"], r["N"]), None)
        if new is None:
            out.append(r)
        elif memory_only:
            kept = {k: v for k, v in r.items() if k != "peak_mib_per_rank"}  # the old RSS key
            out.append({**kept, **new, "memory_config": config})
        else:
            out.append({**new, "config": config})
    key = "memory_config" if memory_only else "config"
    return out + [{**r, key: config} for r in fresh.values()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--layout", default="zigzag", choices=["contiguous", "zigzag"])
    p.add_argument("--strategy", default="ring", choices=["ring", "ulysses"])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument(
        "--memory-only", action="store_true", help="one step: memory columns only, keep times"
    )
    p.add_argument("--threads", type=int, default=None, help="per rank (default cores / P)")
    p.add_argument("--out", type=Path, default=RESULTS / "ring.json")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = (
        torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    )
    if cuda:
        torch.cuda.set_device(device)
    threads = args.threads or max(1, (os.cpu_count() or 1) // world)
    torch.set_num_threads(threads)
    rows = []
    for n in args.lengths:
        row = measure(args, n, rank, world, device)
        if rank == 0:
            print(json.dumps(row), flush=True)
        rows.append(row)
    if rank == 0:
        old = json.loads(args.out.read_text()) if args.out.exists() else {"runs": []}
        config = {k: v for k, v in vars(args).items() if k != "out"}
        config.update(threads_per_rank=threads, cpus=os.cpu_count(), device=device.type)
        runs = merge(old["runs"], rows, config, args.memory_only)
        atomic_write_json(args.out, {"runs": runs})
        atomic_write_text(args.out.with_suffix(".md"), table(runs))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
