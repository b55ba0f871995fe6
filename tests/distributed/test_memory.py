"""Memory per rank of ring attention, counted exactly: the benchmark's tensor tracker, the
pieces blocks travel in, and the accounting of a step's live tensors.

The unit is one (B, H, N/P, D) float32 tensor, i.e. one rank's share of q. One process
(P=1) needs 5 units for a training step of attention: out, dO, dQ, dK, dV. A rank of a ring
also holds K/V in hand plus the next block's pieces as they arrive (2·(1 + 1/C) units, C
pieces), the dK/dV accumulators of the next block, received during this step (2, once
P >= 3), and piece-sized transients. `peak_units` is called in the 2- and 4-process workers
of test_ring.py; the bounds there are this accounting, each with a slack of 0.3 for the
per-row lse and mask tensors (1/D of a unit each).
"""

import importlib.util
from pathlib import Path

import pytest
import torch

from attnkit.distributed import ring_attention
from attnkit.distributed._block import pieces, q_heads

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_ring.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_ring", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def peak_units(world: int, n: int = 4096) -> float:
    """Peak live tensors of one forward + backward step on this rank, in units of one
    (B, H, N/P, D) float32 tensor: B=1, H=4, D=64, causal, zigzag (bench_ring's defaults).
    With N=4096 a block's K/V are >= 2 MiB at P <= 4, so they travel in pieces by default."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, n // world, 64, generator=g).requires_grad_() for _ in range(3))
    with _bench().PeakTensors() as mem:
        out = ring_attention(q, k, v, causal=True, layout="zigzag").out
        out.backward(torch.ones_like(out))
    return mem.peak / (q.numel() * 4)


# --------------------------------------------------------------------------- the tracker


def test_the_tracker_counts_new_storage_once_until_it_is_freed():
    before = torch.ones(1000)  # not allocated inside: never counted, nor what returns it
    with _bench().PeakTensors() as mem:
        a = torch.empty(1000)  # 4000 bytes
        view = a.view(10, 100)  # same storage
        same = before.contiguous().float()  # returns `before` itself
        a.add_(1)  # in place
        b = a + 1  # 4000 more: the peak, 8000
        del b
        c = torch.empty(250)  # 1000
        c.mul_(2)  # an op after the del: the tracker notices the free here
        now = mem.now
    assert mem.peak == 8000
    assert now == 5000
    assert view.untyped_storage().nbytes() == 4000 and same is before


def test_the_tracker_sees_what_autograd_allocates_in_backward():
    x = torch.randn(64, 64, requires_grad=True)
    with _bench().PeakTensors() as mem:
        y = (x * 2).sum()
        fwd = mem.peak
        y.backward()
    assert fwd == 64 * 64 * 4 + 4  # x * 2, and the sum
    assert mem.peak > fwd and x.grad is not None


# --------------------------------------------------------------------------- pieces


@pytest.mark.parametrize(("b", "hkv"), [(1, 4), (1, 1), (2, 4), (2, 1), (3, 2), (5, 2), (8, 8)])
def test_pieces_cover_every_batch_row_and_head_once_as_contiguous_views(b, hkv):
    parts = pieces(b, hkv)
    seen = torch.zeros(b, hkv, dtype=torch.long)
    k = torch.randn(b, hkv, 6, 3)
    q = torch.randn(b, 3 * hkv, 6, 3)  # GQA, G = 3
    for bs, hs in parts:
        seen[bs, hs] += 1
        assert k[bs, hs].is_contiguous()
        assert q[bs, q_heads(hs, 3)].is_contiguous()
        assert torch.equal(q[bs, q_heads(hs, 3)], q.view(b, hkv, 3, 6, 3)[bs, hs].flatten(1, 2))
    assert bool((seen == 1).all())
    # about PIECES = 4 of them: runs of batch rows when B >= 4, else head runs per row
    assert len(parts) == (4 if b >= 4 else b * min(hkv, -(-4 // b)))


def test_the_ring_with_one_process_holds_what_one_process_needs():
    """P=1: out, dO, dQ, dK, dV and nothing else (main's ring held 8: zero-filled
    accumulators beside the kernel's results and an unfused merge)."""
    assert peak_units(1) <= 5 + 0.3


def test_small_blocks_travel_whole_and_large_ones_in_pieces():
    from attnkit.distributed.ring import _parts

    small, large = torch.zeros(1, 4, 64, 64), torch.zeros(1, 4, 1024, 64)  # 64 KiB, 1 MiB
    assert len(_parts(small, small, 2)) == 1
    assert len(_parts(large, large, 2)) == 4
    assert len(_parts(large, large, 1)) == 1  # alone: nothing travels
