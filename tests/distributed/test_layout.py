"""Layouts, argument errors and the one-process ring (no process group): no spawning needed."""

import pytest
import torch

from attnkit.distributed import (
    RingMultiHeadAttention,
    positions,
    ring_attention,
    shard,
    ulysses_attention,
    unshard,
)
from attnkit.functional.chunked import chunked_attention


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_shard_unshard_round_trip_and_positions(layout, world):
    x = torch.randn(2, 3, 24, 5)
    parts = [shard(x, r, world, layout=layout) for r in range(world)]
    assert torch.equal(unshard(parts, layout=layout), x)
    for r, p in enumerate(parts):
        assert torch.equal(p, x[:, :, positions(24, r, world, layout)])
        assert bool((positions(24, r, world, layout).diff() > 0).all())  # increasing in a shard


def test_zigzag_convention_rank_r_holds_chunks_r_and_2p_minus_1_minus_r():
    assert positions(8, 0, 2, "zigzag").tolist() == [0, 1, 6, 7]
    assert positions(8, 1, 2, "zigzag").tolist() == [2, 3, 4, 5]


@pytest.mark.parametrize(("length", "world", "layout"), [(10, 4, "contiguous"), (12, 4, "zigzag")])
def test_lengths_that_do_not_divide_are_a_value_error(length, world, layout):
    with pytest.raises(ValueError, match=f"length={length} must be divisible"):
        shard(torch.zeros(1, 1, length, 2), 0, world, layout=layout)


def test_bad_arguments_name_themselves():
    q = torch.randn(1, 2, 6, 4)
    with pytest.raises(ValueError, match="layout must be one of"):
        ring_attention(q, q, q, layout="spiral")
    with pytest.raises(ValueError, match="mask must be a boolean key-padding mask"):
        ring_attention(q, q, q, mask=torch.ones(1, 1, 6, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match="k must have shape"):
        ring_attention(q, q[:, :, :5], q)
    with pytest.raises(ValueError, match="even local length"):
        ring_attention(q[:, :, :5], q[:, :, :5], q[:, :, :5], layout="zigzag")
    with pytest.raises(ValueError, match="strategy must be one of"):
        RingMultiHeadAttention(8, 2, strategy="tree")


@pytest.mark.parametrize("fn", [ring_attention, ulysses_attention])
def test_without_a_process_group_it_is_single_process_attention(fn):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 10, 8, generator=g, dtype=torch.float64) for _ in range(3))
    k, v = k[:, :2], v[:, :2]  # GQA
    mask = torch.rand(2, 1, 1, 10, generator=g) > 0.3
    mask[1] = False  # batch 1: every row fully masked
    ref, ref_lse = chunked_attention(
        q, k, v, mask=mask, bias=None, causal=True, scale=8**-0.5, dropout_p=0.0,
        training=False, kernel="torch",
    )  # fmt: skip
    res = fn(q, k, v, mask=mask, causal=True)
    torch.testing.assert_close(res.out, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(res.lse, ref_lse, rtol=0, atol=1e-12)
    assert not res.out.isnan().any() and bool((res.out[1] == 0).all())
