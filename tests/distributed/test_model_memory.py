"""Per-rank memory of a context-parallel training step of a model (the demo's GPT): with 2
ranks each holds about half of what one process holds, because a model's per-layer
activations (kept for backward on every position a rank holds) dominate, and the ring's own
buffers exist for one layer's attention at a time. Counted exactly with bench_ring's tensor
tracker (benchmarks/bench_ring_model.py, whose table is benchmarks/results/ring-model.md).
"""

import importlib.util
import os
from pathlib import Path

import torch
import torch.distributed as dist

from tests.distributed._spawn import free_port, run

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_ring_model.py"
N = 2048


def _bench():
    spec = importlib.util.spec_from_file_location("bench_ring_model", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.save(_bench().step_peak(N), f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_a_model_step_with_two_ranks_holds_about_half_of_one_process_per_rank(tmp_path):
    one = _bench().step_peak(N)  # no process group: the whole sequence in this process
    run(_worker, args=(2, free_port(), str(tmp_path)), nprocs=2)
    per_rank = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    # the ideal is 0.5; the rest is what every rank holds whole (parameter gradients) and
    # the ring's buffers for one layer
    assert max(per_rank) <= 0.6 * one, (per_rank, one)
    assert min(per_rank) >= 0.4 * one, (per_rank, one)  # each rank did its half of the work
