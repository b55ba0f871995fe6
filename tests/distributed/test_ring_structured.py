"""Ring attention with structured masks over 2 and 4 gloo processes equals one process.

Every rank passes the same description of the WHOLE sequence (window, document, prefix, a
predicate, combined with a key-padding tensor and with ``causal``); its output, lse and
gradient shards must equal single-process chunked attention with ``mask.dense()`` (float64
within 1e-12; float32 within twice the single-process float32 error + 1e-6), in both layouts,
with GQA. The same workers count what travels (`_structured_ring._p2p`) and what is computed
(`native.count_work`, kernel calls): a causal window narrower than a shard exchanges with
neighbours only, and only the keys it reaches.
"""

import itertools
import os
import sys

import pytest
import torch
import torch.distributed as dist

from attnkit import masks
from attnkit.distributed import _block, _structured_ring, exchange_pattern, shard
from attnkit.distributed import ring_attention as ring
from attnkit.distributed._block import MIN_PIECE_BYTES
from attnkit.functional import native
from attnkit.functional.structured import RowIntervals
from tests.distributed._spawn import results_of
from tests.distributed.test_memory import _bench
from tests.distributed.test_ring import _errs, _inputs, _run, _single

WORLDS = (2, 4)
N_LOCAL = 8  # zigzag chunks of 4
WINDOW = 3  # narrower than a chunk: a causal window reaches one neighbour's last 2 keys


def _strided(b, h, q_idx, kv_idx):
    """A predicate with no row intervals that differs per head: keys h+2 apart, and key 0."""
    return ((q_idx - kv_idx) % (h + 2) == 0) | (kv_idx == 0)


def _mask(kind: str, n: int):
    """(description over N = n positions, causal flag) of each kind tested."""
    if kind == "window-causal":
        return masks.window(n, WINDOW, causal=True), False
    if kind == "window":
        return masks.window(n, 5), False
    if kind == "window+causal":
        return masks.window(n, 5), True
    if kind == "document-causal":  # documents crossing shard boundaries, per batch row
        ids = torch.stack([masks.document_ids([5, n - 12, 7]), masks.document_ids([n - 3, 3])])
        return masks.document(ids, causal=True), False
    if kind == "runs":  # a causal window | a band half a sequence behind: two runs of keys
        pos = torch.arange(n)
        return masks.window(n, WINDOW, causal=True) | RowIntervals(
            pos - n // 2, pos - n // 2 + 3, n
        ), False
    if kind == "prefix":  # per-row prefix lengths
        return masks.prefix(n, torch.tensor([5, n // 2 + 1])), False
    g = torch.Generator().manual_seed(n)
    padding = torch.rand(2, 1, 1, n, generator=g) > 0.2  # (B, 1, 1, N): a boolean tensor
    padding[1, ..., :3] = False
    return masks.from_function(_strided, n, heads=4) & padding, True  # with causal: tiles


KINDS = [
    "window-causal",
    "window",
    "window+causal",
    "document-causal",
    "prefix",
    "function",
    "runs",
]
# each kind in both layouts and dtypes, GQA (Hkv = 1 of H = 4) in one dtype and plain
# heads in the other, alternating between kinds, so both kernels see both
CASES = [
    (kind, layout, hkv, dt)
    for i, kind in enumerate(KINDS)
    for layout in ("contiguous", "zigzag")
    for hkv, dt in zip([1, 4][:: 1 - 2 * (i % 2)], ["float64", "float32"], strict=True)
]
BIAS_CASES = list(itertools.product(["contiguous", "zigzag"], ["tensor", "fn"]))


def _name(c) -> str:
    kind, layout, hkv, dt = c
    return f"{kind}-{layout}-hkv{hkv}-{dt}"


def _alibi(q_pos, k_pos):
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], dtype=torch.float64)
    return (-slopes[:, None, None] * (q_pos[:, None] - k_pos[None, :]).abs().double())[None]


def _cases(rank: int, world: int) -> dict:
    res, n = {}, N_LOCAL * world
    for c in CASES:
        kind, layout, hkv, dt = c
        mask, causal = _mask(kind, n)
        q, k, v, _, dout, dlse = _inputs(hkv, False, n)
        dense = mask.dense()
        truth = _run(lambda *a: _single(*a, "torch"), q, k, v, dense, dout, dlse, causal)
        sh = lambda t, lay=layout: shard(t, rank, world, layout=lay)  # noqa: E731
        cast = (lambda t: t) if dt == "float64" else (lambda t: t.float())

        def call(q, k, v, m, cz, layout=layout):
            return ring(q, k, v, mask=m, causal=cz, layout=layout)[::2]  # (out, lse)

        got = _run(call, *(cast(sh(t)) for t in (q, k, v)), mask, cast(sh(dout)),
                   cast(sh(dlse)), causal)  # fmt: skip
        row = {"err": _errs(got, [sh(t) for t in truth]), "nan": any(g.isnan().any() for g in got)}
        if dt == "float32":
            one = _run(lambda *a: _single(*a, "auto"), *(t.float() for t in (q, k, v)), dense,
                       dout.float(), dlse.float(), causal)  # fmt: skip
            row["single"] = _errs(one, truth)
        res[_name(c)] = row
    for layout, form in BIAS_CASES:  # window & causal with a tensor bias (its gradient too)
        mask = masks.window(n, 5)
        q, k, v, _, dout, dlse = _inputs(1, False, n)
        g = torch.Generator().manual_seed(1)
        full = (
            torch.randn(1, 4, n, n, dtype=torch.float64, generator=g)
            if form == "tensor"
            else _alibi(torch.arange(n), torch.arange(n))
        )
        extra = (full,) if form == "tensor" else ()
        fixed = {} if form == "tensor" else {"bias": full}

        def single(*a, fixed=fixed, **b):
            return _single(*a, "torch", **fixed, **b)

        truth = _run(single, q, k, v, mask.dense(), dout, dlse, True, *extra)
        sh = lambda t, lay=layout: shard(t, rank, world, layout=lay)  # noqa: E731
        kw = {} if form == "tensor" else {"bias_fn": _alibi}

        def call(q, k, v, m, cz, layout=layout, kw=kw, **b):
            return ring(q, k, v, mask=m, causal=cz, layout=layout, **kw, **b)[::2]

        got = _run(call, *(sh(t) for t in (q, k, v)), mask, sh(dout), sh(dlse), True,
                   *(sh(b) for b in extra))  # fmt: skip
        res[f"bias-{layout}-{form}"] = _errs(got, [sh(t) for t in truth])
    return res


class _Traffic:
    """Records every message of the structured ring on this rank: (pass, what, peer, keys)."""

    def __init__(self):
        self.log: list[tuple[str, str, str, int, int]] = []
        self.phase, self.real = "fwd", _structured_ring._p2p

    def __call__(self, sends, recvs, group):
        what = "kv" if sys._getframe(1).f_code.co_name == "start" else "dkv"
        for way, ops in (("send", sends), ("recv", recvs)):
            for peer, t in ops:
                self.log.append((self.phase, what, way, peer, t.shape[2] * t.shape[0] * t.shape[1]))
        return self.real(sends, recvs, group)

    def keys(self, phase, what, way) -> dict[int, int]:
        """peer -> key positions (x batch rows x kv heads) of K (or dK) messages: K and V
        travel as a pair, so half the messages' keys."""
        out: dict[int, int] = {}
        for p, w, wy, peer, keys in self.log:
            if (p, w, wy) == (phase, what, way):
                out[peer] = out.get(peer, 0) + keys
        return {peer: keys // 2 for peer, keys in sorted(out.items())}


def _traffic(rank: int, world: int, layout: str) -> dict:
    """B=1, H=Hkv=2, n=16, a causal window of 4 over the whole sequence, in pieces of 2 keys:
    per pass, who this rank exchanges with and how many keys; the forward's kernel calls and
    score entries (`native.count_work`)."""
    n, window = 16 * world, 4
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, n, 8, generator=g) for _ in range(3))
    mask = masks.window(n, window, causal=True)
    rec, calls = _Traffic(), [0]
    _structured_ring._p2p = rec
    real_fwd = _structured_ring.block_forward

    def counted(*a, **kw):
        calls[0] += 1
        return real_fwd(*a, **kw)

    _structured_ring.block_forward = counted
    try:
        sh = [shard(t, rank, world, layout=layout).requires_grad_() for t in (q, k, v)]
        with native.count_work() as work:
            out = ring(*sh, mask=mask, layout=layout).out
        fwd_work = int(work)
        rec.phase = "bwd"
        out.sum().backward()
    finally:
        _structured_ring._p2p, _structured_ring.block_forward = rec.real, real_fwd
    res = {"calls": calls[0], "work": fwd_work, "log": rec.log}
    for phase, what, way in itertools.product(["fwd", "bwd"], ["kv", "dkv"], ["send", "recv"]):
        res[phase, what, way] = rec.keys(phase, what, way)
    return res


def _peak_units(world: int, n: int = 4096) -> float:
    """As test_memory.peak_units, with a causal window of 512 as a description (zigzag)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, n // world, 64, generator=g).requires_grad_() for _ in range(3))
    mask = masks.window(n, 512, causal=True)
    with _bench().PeakTensors() as mem:
        out = ring(q, k, v, mask=mask, layout="zigzag").out
        out.backward(torch.ones_like(out))
    return mem.peak / (q.numel() * 4)


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        _block.MIN_PIECE_BYTES = 0  # cut even these tiny blocks into pieces (key runs)
        res = _cases(rank, world)
        if native.available():
            for layout in ("contiguous", "zigzag"):
                res[f"traffic-{layout}"] = _traffic(rank, world, layout)
        _block.MIN_PIECE_BYTES = MIN_PIECE_BYTES
        if world == 2:  # N = 4096 takes seconds; P = 4 holds the same pieces
            res["memory"] = _peak_units(world)
        torch.save(res, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module", params=WORLDS, ids=lambda w: f"P{w}")
def results(request, tmp_path_factory):
    world = request.param
    return results_of(_worker, world, tmp_path_factory.mktemp(f"ring-structured{world}"))


@pytest.mark.parametrize("case", CASES, ids=_name)
def test_a_structured_mask_equals_its_dense_form_in_one_process(results, case):
    names = ("out", "lse", "dq", "dk", "dv")
    for rank, res in enumerate(results):
        row = res[_name(case)]
        assert not row["nan"], f"rank {rank}: NaN"
        for what, e in zip(names, row["err"], strict=True):
            if case[-1] == "float64":
                assert e <= 1e-12, f"rank {rank} {what}: {e}"
            else:
                bound = 2 * row["single"][names.index(what)] + 1e-6
                assert e <= bound, f"rank {rank} {what}: {e} > {bound}"


@pytest.mark.parametrize("case", BIAS_CASES, ids="-".join)
def test_a_structured_mask_takes_a_bias_or_bias_fn(results, case):
    for rank, res in enumerate(results):
        errs = res["bias-" + "-".join(case)]
        assert len(errs) == (6 if case[1] == "tensor" else 5)
        assert max(errs) <= 1e-12, f"rank {rank}: {errs}"


def _neighbours(rank: int, world: int, layout: str) -> tuple[set[int], set[int]]:
    """Whose keys a causal window narrower than a chunk needs (receives from), and who needs
    ours (sends to): the previous chunk's owner for each of our chunks."""
    if layout == "contiguous":
        return ({rank - 1} if rank else set()), ({rank + 1} if rank + 1 < world else set())
    # chunk rank needs chunk rank-1 (rank-1's early chunk); chunk 2P-1-rank needs 2P-2-rank
    # (rank+1's late chunk, or our own early chunk when rank = P-1)
    recv = ({rank - 1} if rank else set()) | ({rank + 1} if rank + 1 < world else set())
    return recv, recv


@pytest.mark.skipif(not native.available(), reason="the compiled kernel is not built here")
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_a_causal_window_exchanges_only_the_keys_it_reaches_with_neighbours(results, layout):
    world = len(results)
    keys = 1 * 2 * 3  # batch rows x kv heads x (window - 1) keys of the previous chunk
    for rank, res in enumerate(results):
        t = res[f"traffic-{layout}"]
        recv, send = _neighbours(rank, world, layout)
        for phase in ("fwd", "bwd"):  # K/V in both passes, straight from their owners
            assert t[phase, "kv", "recv"] == {p: keys for p in sorted(recv)}, (rank, phase, t)
            assert t[phase, "kv", "send"] == {p: keys for p in sorted(send)}, (rank, phase, t)
        # dK/dV go back the way their K/V came; nothing else travels
        assert t["bwd", "dkv", "send"] == t["bwd", "kv", "recv"]
        assert t["bwd", "dkv", "recv"] == t["bwd", "kv", "send"]
        assert t["fwd", "dkv", "send"] == t["fwd", "dkv", "recv"] == {}
        # every rank matches what exchange_pattern tells from the description alone
        pattern = exchange_pattern(masks.window(16 * world, 4, causal=True), world, layout=layout)
        assert {p: keys for p in pattern[rank]} == t["fwd", "kv", "recv"]


@pytest.mark.skipif(not native.available(), reason="the compiled kernel is not built here")
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_a_rank_computes_only_the_blocks_its_queries_see(results, layout):
    """Kernel calls and score entries per rank do not grow with P: our own spans and the
    neighbours' reached keys, where a ring that visits every block computes n × N × H."""
    world = len(results)
    n, heads = 16, 2
    mask = masks.window(n * world, 4, causal=True).dense()[0, 0]  # (N, N)
    for rank, res in enumerate(results):
        t = res[f"traffic-{layout}"]
        rows = shard(torch.arange(n * world), rank, world, dim=0, layout=layout)
        allowed = int(mask[rows].sum()) * heads  # the entries the window lets our rows see
        # pieces of 2 keys (zigzag: 1 key of each chunk) per head: the kernel computes the
        # rows that reach a piece's keys, so at most a few entries more than the window has
        assert allowed <= t["work"] <= 1.25 * allowed, (rank, t["work"], allowed)
        assert t["work"] < n * n * world * heads / 4  # a visit to every block: n·N·H
        # calls: each of our 16 pieces (2 heads x 8 runs) per chunk it holds, and per
        # neighbour the pieces holding the 3 keys reached (2 runs of 2 keys contiguous, 3 runs
        # of 1 key zigzag) per head
        own, per_neighbour = (16, 4) if layout == "contiguous" else (32, 6)
        neighbours = len(t["fwd", "kv", "recv"])
        assert t["calls"] == own + per_neighbour * neighbours, (rank, t["calls"])


def test_memory_per_rank_stays_within_the_rings_accounting(results):
    """A causal window of 512 at N = 4096 holds no more than the ring's 5.9 units (5.6)."""
    if len(results) != 2:
        pytest.skip("measured with 2 processes")
    units = [res["memory"] for res in results]
    assert max(units) <= 6.2, units


@pytest.mark.parametrize("kind", KINDS)
def test_one_process_is_attention_with_the_dense_mask(kind):
    """Without a process group the same code runs alone (step 0 only): exact in float64."""
    mask, causal = _mask(kind, 16)
    q, k, v, _, dout, dlse = _inputs(1, False, 16)
    want = _run(lambda *a: _single(*a, "torch"), q, k, v, mask.dense(), dout, dlse, causal)

    def call(q, k, v, m, cz):
        return ring(q, k, v, mask=m, causal=cz)[::2]

    assert max(_errs(_run(call, q, k, v, mask, dout, dlse, causal), want)) <= 1e-12


def test_exchange_pattern_is_computed_from_the_description_alone():
    w = masks.window(32, 3, causal=True)
    assert exchange_pattern(w, 4) == [{}, {0: 2}, {1: 2}, {2: 2}]
    assert exchange_pattern(w, 4, layout="zigzag") == [{1: 2}, {0: 2, 2: 2}, {1: 2, 3: 2}, {2: 2}]
    assert exchange_pattern(masks.window(32, 3), 4) == [{1: 2}, {0: 2, 2: 2}, {1: 2, 3: 2}, {2: 2}]
    docs = masks.document(masks.document_ids([10, 22]), causal=True)
    assert exchange_pattern(docs, 4) == [{}, {0: 8}, {1: 6}, {1: 6, 2: 8}]
    full = masks.from_function(lambda b, h, q, k: q >= 0, 8)
    assert exchange_pattern(full, 2) == [{1: 4}, {0: 4}]


def test_a_structured_mask_must_describe_the_whole_sequence():
    q = torch.zeros(1, 2, 8, 4)
    with pytest.raises(ValueError, match="a structured mask must describe the whole sequence"):
        ring(q, q, q, mask=masks.window(16, 3))
