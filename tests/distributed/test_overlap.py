"""The ring starts each K/V (and dK/dV) transfer before the block computation it should hide.

No timing: one process plays rank 0 of a ring of P with an instrumented `exchange` whose
requests record when they are waited on, and instrumented block kernels. The recorded order
of operations is the claim: a transfer started, then computation, then its wait. Blocks
travel in pieces (`_block.pieces`: here 2, one per key/value head); the claim holds per piece.
"""

import sys

import pytest
import torch

from attnkit.distributed import _block
from attnkit.distributed import ring as ring_mod
from attnkit.distributed._block import pieces

MASK = torch.ones(1, 1, 1, 4, dtype=torch.bool)  # travels with K/V: 3 tensors per K/V transfer


class _Recorder:
    def __init__(self):
        self.events: list[tuple[str, int]] = []
        self.started = 0

    def exchange(self, send, recv, group, rank, world):
        tid = self.started = self.started + 1
        # K/V pieces (the first with the key mask) travel from the generator; dK/dV from backward
        caller = sys._getframe(1)  # ring's or a wrapper's frame
        callers = (caller.f_code.co_name, caller.f_back.f_code.co_name)
        kind = "kv" if "_kv_pieces" in callers else "dkv"
        self.events.append((f"start-{kind}", tid))
        for s, r in zip(send, recv, strict=True):
            r.copy_(s)  # every "rank" holds the same blocks: only the order matters here
        return [_Req(self, tid)]

    def wrap(self, fn, name):
        def call(*args, **kw):
            self.events.append((name, 0))
            return fn(*args, **kw)

        return call


class _Req:
    def __init__(self, rec, tid):
        self.rec, self.tid = rec, tid

    def wait(self):
        self.rec.events.append(("wait", self.tid))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_transfers_start_before_the_block_they_overlap_and_are_waited_after(monkeypatch, world):
    rec = _Recorder()
    monkeypatch.setattr(_block, "MIN_PIECE_BYTES", 0)  # cut these tiny blocks into pieces
    monkeypatch.setattr(ring_mod, "group_info", lambda group: (0, world))
    monkeypatch.setattr(ring_mod, "exchange", rec.exchange)
    monkeypatch.setattr(ring_mod, "block_forward", rec.wrap(ring_mod.block_forward, "fwd"))
    monkeypatch.setattr(ring_mod, "block_backward", rec.wrap(ring_mod.block_backward, "bwd"))
    q, k, v = (torch.randn(1, 2, 4, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    c = len(pieces(1, 2))
    assert c == 2
    out = ring_mod.ring_attention(q, k, v, mask=MASK).out
    fwd = list(rec.events)
    # forward: P blocks of C pieces; before each piece of the first P-1 blocks its transfer
    # (and the receipt of the next block's piece) is started and only waited on after the
    # piece is computed
    want = []
    for tid in range(1, (world - 1) * c + 1):
        want += [("start-kv", tid), ("fwd", 0), ("wait", tid)]
    assert fwd == [*want] + [("fwd", 0)] * c

    rec.events.clear()
    out.sum().backward()
    order = [e for e, _ in rec.events]
    assert order.count("bwd") == world * c
    # every piece but the last block's is computed while a K/V transfer is in flight, and
    # every dK/dV piece sent is waited on only after the next piece is computed
    in_flight: set[int] = set()
    kinds = {}
    computed = 0
    for name, tid in rec.events:
        if name.startswith("start"):
            in_flight.add(tid)
            kinds[tid] = (name, computed)
        elif name == "wait":
            assert tid in in_flight, "waited on a transfer that was not started"
            in_flight.discard(tid)
            kind, started_at = kinds[tid]
            last = computed == world * c and tid == rec.started  # the final hop home
            assert computed > started_at or last, f"{kind} {tid} waited before any block computed"
        else:
            computed += 1
            if computed <= (world - 1) * c:
                assert any(kinds[t][0] == "start-kv" for t in in_flight), (
                    f"piece {computed} computed with no K/V transfer in flight"
                )
    assert not in_flight
    assert order.count("start-kv") == (world - 1) * c
    assert order.count("start-dkv") == (world - 1) * c  # P-1 hops bring dK/dV home


def test_the_recorder_sees_a_ring_that_waits_before_computing(monkeypatch):
    """The check above can fail: a ring that waits for the next block before computing the
    current one (no overlap) breaks it."""
    rec = _Recorder()
    monkeypatch.setattr(ring_mod, "group_info", lambda group: (0, 2))

    def eager(send, recv, group, rank, world):
        reqs = rec.exchange(send, recv, group, rank, world)
        for r in reqs:
            r.wait()
        return []

    monkeypatch.setattr(ring_mod, "exchange", eager)
    monkeypatch.setattr(ring_mod, "block_forward", rec.wrap(ring_mod.block_forward, "fwd"))
    q = torch.randn(1, 2, 4, 8, dtype=torch.float64)
    ring_mod.ring_attention(q, q, q, mask=MASK)
    assert rec.events != [("start-kv", 1), ("fwd", 0), ("wait", 1), ("fwd", 0)]
    assert rec.events[:3] == [("start-kv", 1), ("wait", 1), ("fwd", 0)]
