"""Memory per rank of ring attention, counted exactly: the benchmark's tensor tracker, the
pieces blocks travel in, and the accounting of a step's live tensors.

The unit is one (B, H, N/P, D) float32 tensor, i.e. one rank's share of q. One process
(P=1) needs 5 units for a training step of attention: out, dO, dQ, dK, dV. A rank of a ring
runs piece by piece (C pieces of a block, each a (batch, head, key run) box, C = 16 here):
besides the 5 it holds one piece's K/V in hand and arriving (4/C units), its dK/dV
accumulator travelling, the one sent and the one arriving (4/C), and the block kernel's dk/dv
of it (at most 2/C), plus the kernel's dq of one (batch row, head) against the visiting keys
(1/(B·Hkv) unit, 0.25 here). `peak_units` is called in the 2- and 4-process workers of
test_ring.py; the bounds there are this accounting, 5 + 0.625 + 0.25, with a slack of 0.3 for
the per-row lse (float32 and, while merging, float64) and mask tensors (1/D of a unit each).
main's ring before the piece-by-piece order: 8.7 (P=2) and 10.7 (P=4).
"""

import importlib.util
from pathlib import Path

import pytest
import torch

from attnkit.distributed import ring_attention
from attnkit.distributed._block import pieces, q_heads, travel_pieces
from attnkit.functional import native
from attnkit.functional._dropout import NO_DROPOUT

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


@pytest.mark.parametrize(
    ("b", "hkv", "n", "want", "halves"),
    [(1, 4, 64, 16, False), (1, 1, 64, 16, False), (2, 4, 5, 16, False), (2, 1, 6, 16, False),
     (3, 2, 9, 4, False), (5, 2, 8, 4, False), (8, 8, 4, 16, False), (20, 1, 4, 16, False),
     (1, 1, 3, 16, False), (1, 4, 64, 16, True), (2, 1, 6, 16, True), (1, 1, 4, 16, True),
     (2, 4, 5, 16, True), (8, 8, 4, 16, True)],
)  # fmt: skip
def test_pieces_cover_every_position_once_as_contiguous_views(b, hkv, n, want, halves):
    parts = pieces(b, hkv, n, want, halves)
    seen = torch.zeros(b, hkv, n, dtype=torch.long)
    k = torch.randn(b, hkv, n, 3)
    q = torch.randn(b, 3 * hkv, n, 3)  # GQA, G = 3
    for bs, hs, cs in parts:
        for run in cs:
            seen[bs, hs, run] += 1
            assert k[bs, hs, run].is_contiguous()
        assert q[bs, q_heads(hs, 3)].is_contiguous()
        assert torch.equal(q[bs, q_heads(hs, 3)], q.view(b, hkv, 3, n, 3)[bs, hs].flatten(1, 2))
        if halves and n % 2 == 0 and b * hkv < want:  # the same run of both halves
            assert len(cs) == 2 and cs[1].start - cs[0].start == n // 2
            assert cs[1].stop - cs[1].start == cs[0].stop - cs[0].start
        else:
            assert len(cs) == 1
    assert bool((seen == 1).all())
    # about `want`: runs of batch rows or of heads when B·Hkv >= want, else key runs of
    # every (batch row, head), at most one per key (of a half, with halves)
    span = n // 2 if halves and n % 2 == 0 else n
    if b >= want:
        assert len(parts) == want
    elif b * hkv >= want:
        assert len(parts) == b * -(-want // b)
    else:
        assert len(parts) == b * hkv * min(span, -(-want // (b * hkv)))


def test_the_ring_with_one_process_holds_what_one_process_needs():
    """P=1: out, dO, dQ, dK, dV and nothing else."""
    assert peak_units(1) <= 5 + 0.2


def test_blocks_travel_in_as_many_pieces_as_they_have_min_piece_bytes_up_to_16():
    def count(n, world=2):
        t = torch.zeros(1, 4, n, 64)  # K + V: 2 KiB per position
        return len(travel_pieces(t, t, world))

    assert count(32) == 1  # 64 KiB: whole
    assert count(128) == 2  # 256 KiB: two of 128 KiB
    assert count(1024) == 16  # 2 MiB: 16 (one head, 256 keys each)
    assert count(8192) == 16  # never more
    assert count(8192, world=1) == 1  # alone: nothing travels


# --------------------------------------------------------------------------- the kernel's into=


@pytest.mark.skipif(not native.available(), reason="the compiled kernel is not built here")
def test_backward_into_writes_dq_and_adds_into_dk_dv_as_the_kernel_does():
    g = torch.Generator().manual_seed(1)
    q, k, v, dout = (torch.randn(1, 2, 8, 4, generator=g) for _ in range(4))
    out, lse = native._forward(q, k, v, None, None, True, 0.5, NO_DROPOUT, 1.0, None)
    args = (dout, None, q, k, v, out, lse, None, None, True, 0.5, NO_DROPOUT, 1.0, None)
    want = native._backward(*args)
    dq = torch.full_like(q, 7.0)  # overwritten
    dk, dv = torch.ones_like(k), torch.zeros_like(v)  # added to
    native._backward_into(dq, dk, dv, *args)
    assert torch.equal(dq, want[0]) and torch.equal(dv, want[2])  # from zero: bit for bit
    torch.testing.assert_close(dk, want[1] + 1, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="dk must be contiguous float32 of shape"):
        native._backward_into(dq, torch.zeros(1, 2, 4, 8).transpose(2, 3), dv, *args)
