"""Start P worker processes for the distributed tests, cheaply.

``torch.multiprocessing.spawn`` starts every worker as a fresh interpreter that imports torch
and attnkit again: 2-3 s of CPU each, most of these tests' cost (2 + 4 + 2 workers). A
forkserver imports them once and forks each worker from that clean process (it never ran a
torch op, so no thread pool is forked); the test run pays the imports once.
"""

import multiprocessing
import socket
from pathlib import Path

import torch
import torch.multiprocessing as mp

PRELOAD = ["torch", "torch.distributed", "attnkit.distributed", "attnkit.models.gpt"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(fn, args: tuple, nprocs: int) -> None:
    """fn(rank, *args) in ``nprocs`` processes; raises if any of them fails."""
    multiprocessing.set_forkserver_preload(PRELOAD)  # no effect once the server runs
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")


def results_of(worker, world: int, tmp: Path) -> list:
    """Run ``worker(rank, world, port, tmp)`` in ``world`` processes; what each rank saved as
    ``tmp/rank{r}.pt``, in rank order."""
    run(worker, args=(world, free_port(), str(tmp)), nprocs=world)
    return [torch.load(tmp / f"rank{r}.pt") for r in range(world)]
