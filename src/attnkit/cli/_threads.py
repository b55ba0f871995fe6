"""--threads: the option of every command that computes, and the block that applies it.

The default is one thread, chosen from `benchmarks/bench_threads.py` (results/threads.md): a
command whose work is a loop of small matrix products (decoding one token at a time, a small
model's training step, one sentence through a small BERT) ran 2.9-6.6x slower on 2 threads than
on 1 on a 2-core machine where another process held one core (each product waits for the half
that runs on the busy core), while with both cores idle a second thread saved at most 42%.
"""

from __future__ import annotations

import argparse
import contextlib

from attnkit.cli._common import thread_count

__all__ = ["SMALL_OPS", "add_threads", "torch_threads"]

SMALL_OPS = "small matrix products: a second thread gains little and waits on a busy core"


def add_threads(p: argparse.ArgumentParser, default: int = 1, why: str = SMALL_OPS) -> None:
    """``--threads T``: torch's intra-op threads for the command (`torch_threads`)."""
    p.add_argument(
        "--threads",
        type=thread_count,
        default=default,
        metavar="T",
        help=f"torch CPU threads (default {default}: {why})",
    )


@contextlib.contextmanager
def torch_threads(count: int | None):
    """torch runs on `count` intra-op threads inside the block (None: as it is), and on the
    count it had before afterwards: `main` may be called in-process (tests, notebooks)."""
    import torch

    before = torch.get_num_threads()
    if count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
