"""The ring starts each K/V (and dK/dV) transfer before the block computation it should hide.

No timing: one process plays rank 0 of a ring of P with an instrumented `exchange` whose
requests record when they are waited on, and instrumented block kernels. The recorded order
of operations is the claim: a transfer started, then computation, then its wait. Blocks
travel in pieces (`_block.pieces`: here 8, two key runs of each key/value head), piece by
piece; the claim holds per piece.
"""

import sys

import pytest
import torch

from attnkit.distributed import _block
from attnkit.distributed import ring as ring_mod
from attnkit.distributed._block import travel_pieces

MASK = torch.ones(1, 1, 1, 4, dtype=torch.bool)


def _no_dist(monkeypatch, world):
    """Rank 0 of ``world`` without a process group: every rank's mask is ours (the ring
    all-gathers the key-padding masks once, outside the transfers recorded here)."""
    monkeypatch.setattr(ring_mod, "group_info", lambda group: (0, world))
    monkeypatch.setattr(
        ring_mod, "gather_masks", lambda m, group, w: None if m is None else [m.to(torch.uint8)] * w
    )


class _Recorder:
    def __init__(self):
        self.events: list[tuple[str, int]] = []
        self.started = 0

    def exchange(self, send, recv, group, rank, world):
        tid = self.started = self.started + 1
        # K/V pieces travel from the generator; dK/dV from backward
        frame, callers = sys._getframe(1), []  # ring's or a wrapper's frame, and theirs
        for _ in range(3):
            callers.append(frame.f_code.co_name)
            frame = frame.f_back
        kind = "kv" if "_kv_ring" in callers else "dkv"
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


def _check(events, world: int, c: int, name: str) -> int:
    """Every K/V transfer is started before a computation and waited on after it; every
    computation but the last piece's last step runs with a K/V transfer in flight; every
    dK/dV transfer is waited on only after a computation that followed its start (the last
    one, home, may be waited on at the end). Returns the number of computations."""
    in_flight: set[int] = set()
    kinds: dict[int, tuple[str, int]] = {}
    computed = 0
    for kind, tid in events:
        if kind.startswith("start"):
            in_flight.add(tid)
            kinds[tid] = (kind, computed)
        elif kind == "wait":
            assert tid in in_flight, "waited on a transfer that was not started"
            in_flight.discard(tid)
            started, at = kinds[tid]
            last = tid == max(kinds) and started == "start-dkv"  # the final hop home
            assert computed > at or last, f"{started} {tid} waited before any block computed"
        else:
            assert kind == name
            computed += 1
            kv = [t for t in in_flight if kinds[t][0] == "start-kv"]
            assert (
                kv or len([k for k in kinds.values() if k[0] == "start-kv"]) == (world - 1) * c
            ), f"{name} {computed} computed with no K/V transfer in flight"
    assert not in_flight
    return computed


@pytest.mark.parametrize("world", [2, 3, 4])
def test_transfers_start_before_the_block_they_overlap_and_are_waited_after(monkeypatch, world):
    rec = _Recorder()
    monkeypatch.setattr(_block, "MIN_PIECE_BYTES", 0)  # cut these tiny blocks into pieces
    _no_dist(monkeypatch, world)
    monkeypatch.setattr(ring_mod, "exchange", rec.exchange)
    monkeypatch.setattr(ring_mod, "block_forward", rec.wrap(ring_mod.block_forward, "fwd"))
    monkeypatch.setattr(ring_mod, "block_backward", rec.wrap(ring_mod.block_backward, "bwd"))
    q, k, v = (torch.randn(1, 2, 4, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    c = len(travel_pieces(k, v, world))
    assert c == 8  # 16 wanted, 2 heads of 4 keys: 4 runs per head
    out = ring_mod.ring_attention(q, k, v, mask=MASK).out
    # per piece its P-1 visiting blocks, plus each head's own block once (at its first run)
    assert _check(rec.events, world, c, "fwd") == (world - 1) * c + 2
    assert [e for e, _ in rec.events].count("start-kv") == (world - 1) * c

    rec.events.clear()
    out.sum().backward()
    assert _check(rec.events, world, c, "bwd") == (world - 1) * c + 2
    order = [e for e, _ in rec.events]
    assert order.count("start-kv") == (world - 1) * c
    assert order.count("start-dkv") == (world - 1) * c  # P-1 hops bring dK/dV home


def test_the_recorder_sees_a_ring_that_waits_before_computing(monkeypatch):
    """The check above can fail: a ring that waits for the next block before computing the
    current one (no overlap) breaks it."""
    rec = _Recorder()
    _no_dist(monkeypatch, 2)

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


@pytest.mark.parametrize("world", [2, 4])
def test_a_causal_zigzag_ring_sends_pairs_of_key_runs_in_the_same_order(monkeypatch, world):
    """Causal zigzag: each piece is the same key run of both chunks (two K and two V
    tensors per transfer), so every rank has work in every piece; the order claims hold."""
    rec = _Recorder()
    monkeypatch.setattr(_block, "MIN_PIECE_BYTES", 0)
    _no_dist(monkeypatch, world)
    monkeypatch.setattr(ring_mod, "exchange", rec.exchange)
    monkeypatch.setattr(ring_mod, "block_forward", rec.wrap(ring_mod.block_forward, "fwd"))
    monkeypatch.setattr(ring_mod, "block_backward", rec.wrap(ring_mod.block_backward, "bwd"))
    sent = []
    real = rec.exchange
    monkeypatch.setattr(
        ring_mod, "exchange", lambda s, r, *a: sent.append(len(s)) or real(s, r, *a)
    )
    q, k, v = (torch.randn(1, 2, 8, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    parts, _ = ring_mod._pieces(k, v, world, "zigzag", True)
    c = len(parts)
    assert c == 8 and all(len(cs) == 2 for _, _, cs in parts)  # 4 runs of each half, per head
    out = ring_mod.ring_attention(q, k, v, causal=True, layout="zigzag").out
    _check(rec.events, world, c, "fwd")
    rec.events.clear()
    out.sum().backward()
    _check(rec.events, world, c, "bwd")
    assert set(sent) == {4}  # K, K, V, V (or dK, dK, dV, dV)
