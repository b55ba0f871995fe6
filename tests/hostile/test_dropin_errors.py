"""Mask and dtype mismatches in the drop-ins and modules (issue 39): each gave torch's
`expand` or matmul error, which names neither the argument nor what it must be. Now
attnkit's message, still an instance of the class torch raises (RuntimeError) in the
drop-ins."""

from __future__ import annotations

import pytest
import torch

import attnkit
import attnkit.nn


def test_sdpa_mask_that_does_not_broadcast_is_named():
    q = torch.randn(2, 2, 5, 4)
    with pytest.raises(RuntimeError, match=r"attn_mask of shape \(3, 5\) does not broadcast"):
        attnkit.nn.functional.scaled_dot_product_attention(
            q, q, q, attn_mask=torch.ones(3, 5, dtype=torch.bool)
        )


def test_float32_into_a_float64_drop_in_is_named():
    x = torch.randn(3, 2, 8)
    with pytest.raises(RuntimeError, match=r"query has dtype torch\.float32") as e:
        attnkit.nn.MultiheadAttention(8, 2, dtype=torch.float64)(x, x, x)
    assert isinstance(e.value, ValueError)


def test_ids_into_attnkits_module_are_named():
    ids = torch.ones(2, 3, 8, dtype=torch.long)
    with pytest.raises(ValueError, match=r"query must be floating point .* got torch\.int64"):
        attnkit.MultiHeadAttention(8, 2)(ids)


def test_float32_into_a_float64_module_is_named_and_autocast_still_runs():
    mha = attnkit.MultiHeadAttention(8, 2).double()
    with pytest.raises(ValueError, match=r"query has dtype torch\.float32, the module's weights"):
        mha(torch.randn(2, 3, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # mixed dtypes are autocast's job
        assert attnkit.MultiHeadAttention(8, 2)(torch.randn(2, 3, 8).bfloat16()).shape == (2, 3, 8)
