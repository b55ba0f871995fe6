"""Ring and Ulysses attention with 2 and 4 gloo processes equal single-process attention.

One spawn per world size runs every case in each process (spawning costs seconds, a case
milliseconds); each rank saves its errors, and the parametrised tests below assert them.
Every rank builds the same full inputs, keeps its shard, and compares its output, lse and
gradient shards with single-process chunked attention on the full inputs (float64 kernel as
the truth; for float32, ≤ 2× the single-process float32 error + 1e-6).
"""

import itertools
import os

import pytest
import torch
import torch.distributed as dist

from attnkit.distributed import RingMultiHeadAttention, _block, shard, ulysses_attention
from attnkit.distributed import ring_attention as ring
from attnkit.distributed._block import MIN_PIECE_BYTES
from attnkit.functional.chunked import chunked_attention
from attnkit.modules.attention import MultiHeadAttention
from attnkit.modules.positions import RotaryEmbedding
from tests.distributed._spawn import results_of
from tests.distributed.test_memory import peak_units

STRATEGIES = {"ring": ring, "ulysses": ulysses_attention}
CASES = list(
    itertools.product(
        ["ring", "ulysses"], ["contiguous", "zigzag"], [False, True], [False, True], [4, 1],
        ["float64", "float32"],
    )
)  # fmt: skip
BIAS_CASES = list(
    itertools.product(
        ["ring", "ulysses"], ["contiguous", "zigzag"], [False, True], ["tensor", "fn"],
        ["float64", "float32"],
    )
)  # fmt: skip
WORLDS = (2, 4)


def _name(c) -> str:
    s, lay, causal, masked, hkv, dt = c
    return (
        f"{s}-{lay}-{'causal' if causal else 'full'}-{'mask' if masked else 'nomask'}-hkv{hkv}-{dt}"
    )


def _bias_name(c) -> str:
    s, lay, causal, form, dt = c
    return f"{s}-{lay}-{'causal' if causal else 'full'}-{form}-{dt}"


def _inputs(hkv: int, masked: bool, n: int):
    g = torch.Generator().manual_seed(n + hkv)
    q = torch.randn(2, 4, n, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, hkv, n, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, hkv, n, 6, generator=g, dtype=torch.float64)
    dout = torch.randn(2, 4, n, 6, generator=g, dtype=torch.float64)
    dlse = torch.randn(2, 4, n, generator=g, dtype=torch.float64)
    mask = None
    if masked:
        mask = torch.rand(2, 1, 1, n, generator=g) > 0.3
        mask[0, ..., 0] = False  # causal: row 0 of batch 0 sees nothing
        mask[1] = False  # batch 1: every row sees nothing
    return q, k, v, mask, dout, dlse


def _run(fn, q, k, v, mask, dout, dlse, causal, bias=None):
    """out, lse, dq, dk, dv (and dbias) of loss = <out, dout> + <lse (finite rows), dlse>."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    extra = {} if bias is None else {"bias": bias.detach().requires_grad_()}
    out, lse = fn(q, k, v, mask, causal, **extra)
    loss = (out * dout).sum() + (torch.where(lse.isfinite(), lse, 0) * dlse).sum()
    loss.backward()
    return [out.detach(), lse.detach(), q.grad, k.grad, v.grad] + [b.grad for b in extra.values()]


def _single(q, k, v, mask, causal, kernel, bias=None):
    return chunked_attention(
        q, k, v, mask=mask, bias=bias, causal=causal, scale=8**-0.5, dropout_p=0.0,
        training=False, kernel=kernel,
    )  # fmt: skip


def _errs(got, want) -> list[float]:
    # equal infinities (lse -inf of rows that see nothing) count as equal; NaN as 1e9
    diff = lambda g, w: torch.where(g == w, 0.0, (g - w).abs().nan_to_num(1e9))  # noqa: E731
    return [float(diff(g.double(), w).max()) for g, w in zip(got, want, strict=True)]


def _cases(rank: int, world: int) -> dict:
    res = {}
    n = 6 * world  # zigzag chunks of 3: odd, not a power of two
    for c in CASES:
        strategy, layout, causal, masked, hkv, dt = c
        q, k, v, mask, dout, dlse = _inputs(hkv, masked, n)
        truth = _run(lambda *a: _single(*a, "torch"), q, k, v, mask, dout, dlse, causal)
        sh = lambda t, lay=layout: shard(t, rank, world, layout=lay)  # noqa: E731
        want = [sh(t) for t in truth]
        cast = (lambda t: t) if dt == "float64" else (lambda t: t.float())
        fn = STRATEGIES[strategy]

        def call(q, k, v, m, cz, fn=fn, layout=layout):
            return fn(q, k, v, mask=m, causal=cz, layout=layout)[::2]  # (out, lse)

        m_local = None if mask is None else shard(mask, rank, world, dim=3, layout=layout)
        args = [cast(sh(t)) for t in (q, k, v)]
        got = _run(call, *args, m_local, cast(sh(dout)), cast(sh(dlse)), causal)
        row = {"err": _errs(got, want), "nan": any(bool(g.isnan().any()) for g in got)}
        if dt == "float32":
            one = _run(lambda *a: _single(*a, "auto"), *(t.float() for t in (q, k, v)), mask,
                       dout.float(), dlse.float(), causal)  # fmt: skip
            row["single"] = _errs(one, truth)
        res[_name(c)] = row
    return res


def _alibi(q_pos, k_pos):
    """ALiBi, symmetric form (valid with and without a causal mask): (1, H=4, nq, nk)."""
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], dtype=torch.float64, device=q_pos.device)
    dist_ = (q_pos[:, None] - k_pos[None, :]).abs().double()  # (nq, nk)
    return (-slopes[:, None, None] * dist_)[None]  # (1, H, nq, nk)


def _full_bias(causal: bool, n: int) -> torch.Tensor:
    """A float64 bias over the full sequence: (1, H, N, N) causal, (B, 1, N, N) not (both
    broadcast forms), with -inf entries and one row -inf throughout (fully masked by bias)."""
    g = torch.Generator().manual_seed(7 * n + causal)
    bias = torch.randn((1, 4, n, n) if causal else (2, 1, n, n), generator=g, dtype=torch.float64)
    bias[torch.rand(bias.shape, generator=g) < 0.1] = float("-inf")
    bias[0, 0, n - 2] = float("-inf")  # a late row: its keys live on several ranks
    return bias


def _bias_cases(rank: int, world: int) -> dict:
    """ring/ulysses with a tensor bias (gradient checked) or a bias_fn, against chunked
    attention with the full bias; masked with fully masked rows, GQA Hkv = 1."""
    res = {}
    n = 6 * world
    for c in BIAS_CASES:
        strategy, layout, causal, form, dt = c
        q, k, v, mask, dout, dlse = _inputs(1, True, n)
        full = (
            _full_bias(causal, n) if form == "tensor" else _alibi(torch.arange(n), torch.arange(n))
        )
        extra = (full,) if form == "tensor" else ()
        fixed = {} if form == "tensor" else {"bias": full}  # bias_fn: a constant bias

        def single(*a, kernel="torch", fixed=fixed, **b):
            return _single(*a, kernel, **{k: t.to(a[0].dtype) for k, t in {**fixed, **b}.items()})

        truth = _run(single, q, k, v, mask, dout, dlse, causal, *extra)
        sh = lambda t, lay=layout: shard(t, rank, world, layout=lay)  # noqa: E731
        want = [sh(t) for t in truth]  # dbias: this rank's rows, all columns
        cast = (lambda t: t) if dt == "float64" else (lambda t: t.float())
        fn, kw = STRATEGIES[strategy], ({} if form == "tensor" else {"bias_fn": _alibi})

        def call(q, k, v, m, cz, fn=fn, layout=layout, kw=kw, **b):
            return fn(q, k, v, mask=m, causal=cz, layout=layout, **kw, **b)[::2]  # (out, lse)

        m_local = shard(mask, rank, world, dim=3, layout=layout)
        args = [cast(sh(t)) for t in (q, k, v)]
        got = _run(call, *args, m_local, cast(sh(dout)), cast(sh(dlse)), causal,
                   *(cast(sh(b)) for b in extra))  # fmt: skip
        row = {"err": _errs(got, want), "nan": any(bool(g.isnan().any()) for g in got)}
        if dt == "float32":
            f32 = [cast(t) for t in (q, k, v)]
            one = _run(lambda *a, **b: single(*a, kernel="auto", **b), *f32, mask, cast(dout),
                       cast(dlse), causal, *(cast(t) for t in extra))  # fmt: skip
            row["single"] = _errs(one, truth)
        res["bias-" + _bias_name(c)] = row
    return res


def _module_case(rank: int, world: int, strategy: str) -> list[float]:
    """RingMultiHeadAttention == MultiHeadAttention on the full sequence (with rotary), incl.
    weight grads."""
    torch.manual_seed(0)
    # rotary: rotated at global positions, which zigzag makes non-contiguous
    full = MultiHeadAttention(8, 4, num_kv_heads=2, rotary=RotaryEmbedding(2)).double()
    mod = RingMultiHeadAttention(
        8, 4, num_kv_heads=2, rotary=RotaryEmbedding(2), strategy=strategy, layout="zigzag"
    ).double()
    mod.load_state_dict(full.state_dict())
    x = torch.randn(
        2, 4 * world, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3)
    )
    y = full(x, causal=True)
    y.square().sum().backward()
    sh = lambda t: shard(t, rank, world, dim=1, layout="zigzag")  # noqa: E731
    y_local = mod(sh(x), causal=True)
    y_local.square().sum().backward()
    errs = [float((y_local - sh(y)).abs().max())]
    for (_, p), (_, p_full) in zip(mod.named_parameters(), full.named_parameters(), strict=True):
        dist.all_reduce(p.grad)  # each rank holds its shard's share of the weight gradient
        errs.append(float((p.grad - p_full.grad).abs().max()))
    return errs


def _subgroup_case(rank: int, world: int, strategy: str) -> list[float]:
    """Two rings side by side: ranks {0, 1} and {2, 3} (with P = 2: one group of both, not the
    default one), each a process group of its own passed as ``group`` (peers are found by
    their global ranks). Zigzag, causal, tensor bias, masked, GQA; float64 against the truth."""
    members = [[0, 1], [2, 3]] if world == 4 else [[0, 1]]
    groups = [dist.new_group(m) for m in members]  # every rank creates every group
    group, sub = groups[rank // 2], rank % 2
    q, k, v, mask, dout, dlse = _inputs(1, True, 12)
    bias = _full_bias(True, 12)
    truth = _run(lambda *a, **b: _single(*a, "torch", **b), q, k, v, mask, dout, dlse, True, bias)
    sh = lambda t: shard(t, sub, 2, layout="zigzag")  # noqa: E731
    fn = STRATEGIES[strategy]

    def call(q, k, v, m, cz, **b):
        return fn(q, k, v, mask=m, causal=cz, layout="zigzag", group=group, **b)[::2]

    m_local = shard(mask, sub, 2, dim=3, layout="zigzag")
    got = _run(call, *(sh(t) for t in (q, k, v)), m_local, sh(dout), sh(dlse), True, sh(bias))
    return _errs(got, [sh(t) for t in truth])


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        # the numeric cases cut even their tiny blocks into pieces (`_block.pieces`); the
        # module and subgroup cases below send them whole, as the default does for them
        _block.MIN_PIECE_BYTES = 0
        res = _cases(rank, world)
        res.update(_bias_cases(rank, world))
        _block.MIN_PIECE_BYTES = MIN_PIECE_BYTES
        for s in STRATEGIES:
            res[f"module-{s}"] = {"err": _module_case(rank, world, s), "nan": False}
            res[f"subgroup-{s}"] = _subgroup_case(rank, world, s)
        res["memory"] = peak_units(world)
        q = torch.zeros(1, 3, 4, 2)  # 3 heads do not split over 2 or 4 ranks
        try:
            ulysses_attention(q, q, q)
            res["ulysses-heads-error"] = None
        except ValueError as e:
            res["ulysses-heads-error"] = str(e)
        torch.save(res, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module", params=WORLDS, ids=lambda w: f"P{w}")
def results(request, tmp_path_factory):
    world = request.param
    return results_of(_worker, world, tmp_path_factory.mktemp(f"ring{world}"))


@pytest.mark.parametrize("case", CASES, ids=_name)
def test_equals_single_process_attention(results, case):
    for rank, res in enumerate(results):
        row = res[_name(case)]
        assert not row["nan"], f"rank {rank}: NaN"
        for what, e in zip(("out", "lse", "dq", "dk", "dv"), row["err"], strict=True):
            if case[-1] == "float64":
                assert e <= 1e-12, f"rank {rank} {what}: {e}"
            else:
                bound = 2 * row["single"][("out", "lse", "dq", "dk", "dv").index(what)] + 1e-6
                assert e <= bound, f"rank {rank} {what}: {e} > {bound}"


@pytest.mark.parametrize("case", BIAS_CASES, ids=_bias_name)
def test_bias_equals_single_process_attention_with_the_gathered_bias(results, case):
    names = ("out", "lse", "dq", "dk", "dv", "dbias")
    for rank, res in enumerate(results):
        row = res["bias-" + _bias_name(case)]
        assert not row["nan"], f"rank {rank}: NaN"
        assert len(row["err"]) == (6 if case[3] == "tensor" else 5)
        for what, e in zip(names, row["err"], strict=False):
            if case[-1] == "float64":
                assert e <= 1e-12, f"rank {rank} {what}: {e}"
            else:
                bound = 2 * row["single"][names.index(what)] + 1e-6
                assert e <= bound, f"rank {rank} {what}: {e} > {bound}"


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_ring_multihead_attention_equals_the_module_on_the_full_sequence(results, strategy):
    for res in results:
        assert max(res[f"module-{strategy}"]["err"]) <= 1e-12


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_process_group_other_than_the_world_is_used_for_every_transfer(results, strategy):
    for rank, res in enumerate(results):
        errs = res[f"subgroup-{strategy}"]
        assert len(errs) == 6 and max(errs) <= 1e-12, f"rank {rank}: {errs}"


def test_ulysses_refuses_heads_not_divisible_by_ranks(results):
    for res in results:
        assert res["ulysses-heads-error"] is not None
        assert "H=3 query heads must be divisible by P=" in res["ulysses-heads-error"]


# 5 units (out, dO, dQ, dK, dV) + one piece's K/V, accumulators and kernel results (10/C =
# 0.625 at 16 pieces) + one (batch row, head)'s dq from the kernel (0.25): see test_memory.py.
# Before the piece-by-piece order: 8.7 and 10.7.
MEMORY_BOUND = {2: 6.2, 4: 6.2}


def test_memory_per_rank_follows_the_accounting(results):
    world = len(results)
    units = [res["memory"] for res in results]
    assert max(units) <= MEMORY_BOUND[world], f"P={world}: {units}"
