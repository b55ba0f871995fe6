"""ALiBi and T5 relative position bias: formulas, parity with transformers, every backend."""

from __future__ import annotations

import pytest
import torch

from attnkit import BACKENDS, RelativePositionBias, attention
from attnkit.functional.relative import (
    alibi_bias,
    alibi_slopes,
    padding_positions,
    relative_position_bucket,
)
from tests.naive import naive_attention


def rand(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ----------------------------------------------------------------------------- ALiBi


def test_slopes_of_the_paper():
    """Press et al. 2022, §3: 8 heads get 1/2, 1/4, ..., 1/256."""
    assert alibi_slopes(8, dtype=torch.float64).tolist() == [2.0**-i for i in range(1, 9)]
    assert alibi_slopes(1).tolist() == [2.0**-8]


@pytest.mark.parametrize("heads", [*range(1, 18), 24, 40, 71, 112])
def test_slopes_match_bloom_for_any_head_count(heads):
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    want = _get_alibi_slopes(heads, torch.device("cpu"))
    torch.testing.assert_close(alibi_slopes(heads), want, rtol=1e-6, atol=0)


def test_bias_values_bottom_right_and_symmetric():
    m = alibi_slopes(3, dtype=torch.float64)
    bias = alibi_bias(3, 2, 5, dtype=torch.float64)
    assert bias.shape == (1, 3, 2, 5)
    for h in range(3):
        for i in range(2):
            for j in range(5):
                p = i + 3  # query i sits at key position i + S - N
                assert bias[0, h, i, j].item() == -m[h].item() * (p - j)
                sym = alibi_bias(3, 2, 5, symmetric=True, dtype=torch.float64)[0, h, i, j]
                assert sym.item() == -m[h].item() * abs(p - j)
    assert not torch.signbit(bias[0, :, 0, 3]).any()  # the diagonal is +0.0, not -0.0


def test_padding_positions():
    keep = torch.tensor([[False, False, True, True, True], [True, True, True, True, True]])
    assert padding_positions(keep).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]


def test_alibi_matches_bloom_with_left_padding_and_causal():
    """Bloom adds m·p_j; ours -m·(p_i - p_j): the same softmax (a per-row constant apart)."""
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    b, h, n, d = 2, 6, 9, 8  # 6 heads: not a power of two
    keep = torch.ones(b, n, dtype=torch.bool)
    keep[0, :3] = False  # left padding
    q, k, v = (rand(b, h, n, d, seed=i, dtype=torch.float64) for i in range(3))
    theirs = build_alibi_tensor(keep.long(), h, torch.float64).view(b, h, 1, n)
    ours = alibi_bias(h, n, positions=padding_positions(keep), dtype=torch.float64)
    mask = keep[:, None, None, :]  # (B, 1, 1, S) key padding
    kw = {"mask": mask, "causal": True, "backend": "reference", "need_weights": True}
    want = attention(q, k, v, bias=theirs, **kw)
    got = attention(q, k, v, bias=ours, **kw)
    torch.testing.assert_close(got.weights, want.weights, rtol=0, atol=1e-6)
    torch.testing.assert_close(got.out, want.out, rtol=0, atol=1e-6)
    # and the row-constant difference is really there (slopes in float32 on Bloom's side)
    diff = (ours - theirs)[1]  # (H, N, S), no padding in row 1
    torch.testing.assert_close(diff, diff[..., :1].expand_as(diff), rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------- T5


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (8, 20), (64, 512), (6, 4)])
def test_buckets_equal_t5_exactly(bidirectional, num_buckets, max_distance):
    from transformers.models.t5.modeling_t5 import T5Attention

    rel = torch.randint(-2000, 2000, (4000,), generator=torch.Generator().manual_seed(0))
    rel = torch.cat([rel, torch.arange(-140, 141)])  # every small distance and the boundaries
    want = T5Attention._relative_position_bucket(
        rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    got = relative_position_bucket(
        rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    assert torch.equal(got, want)
    assert int(got.min()) >= 0 and int(got.max()) < num_buckets


def test_bucket_layout_by_hand():
    rel = torch.tensor([-200, -3, -1, 0, 1, 3, 200])
    # bidirectional, 8 buckets: 4 per side, exact 0, 1 then log buckets 2, 3; j > i adds 4
    got = relative_position_bucket(rel, num_buckets=8, max_distance=16).tolist()
    assert got == [3, 2, 1, 0, 5, 6, 7]
    got = relative_position_bucket(rel, bidirectional=False, num_buckets=8, max_distance=16)
    assert got.tolist() == [7, 3, 1, 0, 0, 0, 0]  # later keys share bucket 0


@pytest.mark.parametrize("is_decoder", [False, True])
@pytest.mark.parametrize(("n", "s"), [(7, 7), (1, 9), (3, 40)])
def test_module_equals_t5_compute_bias_with_cache_offset(is_decoder, n, s):
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention

    cfg = T5Config(d_model=32, d_kv=8, num_heads=4, relative_attention_num_buckets=16,
                   relative_attention_max_distance=20, is_decoder=is_decoder)  # fmt: skip
    t5 = T5Attention(cfg, has_relative_attention_bias=True)
    torch.nn.init.normal_(t5.relative_attention_bias.weight)
    ours = RelativePositionBias(4, num_buckets=16, max_distance=20, bidirectional=not is_decoder)
    ours.table.weight.data.copy_(t5.relative_attention_bias.weight)
    want = t5.compute_bias(n, s, past_seen_tokens=s - n)
    assert torch.equal(ours(n, s), want)
    assert torch.equal(ours(n, s, offset=0), t5.compute_bias(n, s))
    assert torch.equal(ours(n, s)[:, :, :, :], ours(s, s)[:, :, s - n :])  # a step = last rows


# ----------------------------------------------------------------------------- backends


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["alibi", "alibi-symmetric", "t5"])
def test_every_backend_with_position_bias_against_float64(backend, kind):
    b, h, hkv, n, s, d = 2, 6, 3, 5, 11, 8
    q, k, v = rand(b, h, n, d), rand(b, hkv, s, d, seed=1), rand(b, hkv, s, d, seed=2)
    keep = rand(b, s, seed=3) > -0.5
    keep[:, -1] = True
    if kind == "t5":
        bias = RelativePositionBias(h, bidirectional=False).requires_grad_(False)(n, s)
    else:
        bias = alibi_bias(h, n, s, positions=padding_positions(keep), symmetric=kind != "alibi")
    mask = keep[:, None, None, :].expand(b, 1, n, s).clone()
    mask[1, 0, 2] = False  # a query that may attend to nothing
    out = attention(q, k, v, mask=mask, bias=bias, causal=True, backend=backend).out
    want, _ = naive_attention(q, k, v, mask=mask, bias=bias, causal=True)
    torch.testing.assert_close(out.double(), want, rtol=0, atol=2e-6)
    assert torch.equal(out[1, :, 2], torch.zeros_like(out[1, :, 2]))


def test_bad_input_raises_naming_the_argument():
    with pytest.raises(ValueError, match="num_heads"):
        alibi_slopes(0)
    with pytest.raises(ValueError, match="s must be"):
        alibi_bias(2, 5, 3)
    with pytest.raises(ValueError, match=r"positions must have shape \(B, S=4\)"):
        alibi_bias(2, 4, positions=torch.zeros(1, 3))
    with pytest.raises(ValueError, match="mask must be a bool"):
        padding_positions(torch.ones(2, 3))
    with pytest.raises(ValueError, match="max_distance=4"):
        relative_position_bucket(torch.zeros(3), num_buckets=32, max_distance=4)
    with pytest.raises(ValueError, match="max_distance=4"):
        RelativePositionBias(2, num_buckets=32, max_distance=4)
    with pytest.raises(ValueError, match="n must be"):
        RelativePositionBias(2)(-1)
