"""attnkit.masks: constructors and converters, each with its polarity."""

from __future__ import annotations

import warnings

import pytest
import torch

import attnkit
from attnkit import masks


def test_causal_square_and_rectangular():
    square = masks.causal(3)
    assert square.shape == (1, 1, 3, 3)  # 4-D: never mistaken for a (B, S) padding mask
    assert torch.equal(square[0, 0], torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]]).bool())
    wide = masks.causal(2, 4)[0, 0]  # bottom-right: query i sees keys j <= i + 2
    assert wide.tolist() == [[True, True, True, False], [True, True, True, True]]
    tall = masks.causal(4, 2)[0, 0]  # the first two queries see nothing
    assert tall.tolist() == [[False, False], [False, False], [True, False], [True, True]]


def test_padding_from_lengths():
    m = masks.padding(torch.tensor([2, 0, 3]), 4)
    assert m.shape == (3, 1, 1, 4)
    assert m[:, 0, 0].tolist() == [
        [True, True, False, False],
        [False, False, False, False],
        [True, True, True, False],
    ]
    with pytest.raises(ValueError, match="lengths must be an integer"):
        masks.padding(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="lie in"):
        masks.padding(torch.tensor([5]), 4)


def test_sliding_window():
    m = masks.sliding_window(5, 2)
    assert m.shape == (1, 1, 5, 5)
    want = [[abs(i - j) < 2 for j in range(5)] for i in range(5)]
    assert m[0, 0].tolist() == want
    c = masks.sliding_window(5, 2, causal=True)[0, 0]
    assert c.tolist() == [[0 <= i - j < 2 for j in range(5)] for i in range(5)]
    assert torch.equal(masks.sliding_window(3, 100, 6, causal=True), masks.causal(3, 6))


def test_a_large_sliding_window_warns_with_its_memory_and_names_window():
    # issue 38: masks.window (a description) and sliding_window (N x S) were easy to confuse
    side = 8193  # just above DENSE_WARN_BYTES = 2**26 = 8192**2 bytes; meta builds nothing
    with pytest.warns(UserWarning, match=r"\(8193, 8193\) boolean tensor of 64 MiB; masks\.window"):
        m = masks.sliding_window(side, 4, device="meta")
    assert m.shape == (1, 1, side, side)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        masks.sliding_window(8192, 4, device="meta")  # at the bound: silent


def test_combine_ands_and_skips_none():
    a = torch.tensor([True, True, False])
    b = torch.tensor([[True], [False]])
    assert masks.combine(a, None, b).tolist() == [[True, True, False], [False, False, False]]
    assert masks.combine(None, None) is None
    with pytest.raises(ValueError, match="mask 1 must be boolean"):
        masks.combine(a, torch.ones(3))


def test_torch_key_padding_mask_true_means_ignore():
    kpm = torch.tensor([[False, True, True], [False, False, False]])
    m = masks.from_torch_key_padding_mask(kpm)
    assert m.shape == (2, 1, 1, 3) and m[:, 0, 0].tolist() == [[True, False, False], [True] * 3]
    bias = masks.from_torch_key_padding_mask(torch.tensor([[0.0, -1.0]]))
    assert bias.dtype == torch.float32 and bias.shape == (1, 1, 1, 2)


def test_torch_attn_mask_bool_and_float_and_3d():
    bool_mask = torch.tensor([[False, True], [False, False]])
    assert masks.from_torch_attn_mask(bool_mask).tolist() == [[[[True, False], [True, True]]]]
    flt = torch.tensor([[0.0, -2.0], [1.0, 0.0]])
    assert torch.equal(masks.from_torch_attn_mask(flt), flt[None, None])
    per_head = torch.zeros(2 * 3, 4, 5, dtype=torch.bool)
    per_head[4] = True  # batch 1, head 1
    out = masks.from_torch_attn_mask(per_head, num_heads=3)
    assert out.shape == (2, 3, 4, 5) and not out[1, 1].any() and out[1, 0].all()
    with pytest.raises(ValueError, match="num_heads"):
        masks.from_torch_attn_mask(per_head)


def test_hf_keras_and_zero_blocked_conventions():
    hf = torch.tensor([[1, 1, 0]])
    assert masks.from_hf_attention_mask(hf)[0, 0, 0].tolist() == [True, True, False]
    keras = torch.tensor([[[1, 0], [0, 1], [1, 1]]])
    k = masks.from_keras_attention_mask(keras)
    assert k.shape == (1, 1, 3, 2) and k[0, 0].tolist() == [
        [True, False],
        [False, True],
        [True, True],
    ]
    assert masks.from_zero_blocked(torch.tensor([0, 2, 1])).tolist() == [False, True, True]
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        masks.from_hf_attention_mask(torch.ones(1, 2, 3))


@pytest.mark.parametrize(
    "make",
    [lambda n: masks.causal(n), lambda n: masks.sliding_window(n, 2),
     lambda n: masks.from_torch_attn_mask(torch.zeros(n, n, dtype=torch.bool))],
)  # fmt: skip
def test_constructed_masks_work_whatever_the_batch_size(make):
    """A 2-D (N, S) mask would be refused as ambiguous when B == N (the last batch of a
    loop can be that size); the constructors' 4-D masks never are."""
    n = 5
    for b in (1, n, 2 * n):
        q = torch.randn(b, 2, n, 4)
        out = attnkit.attention(q, q, q, mask=make(n)).out
        assert out.shape == (b, 2, n, 4)
