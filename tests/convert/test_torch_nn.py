"""torch.nn.MultiheadAttention round trips keep the layout the module reads its inputs in."""

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from attnkit.convert.torch_nn import mha_from_torch, mha_to_torch


@pytest.mark.parametrize("batch_first", [False, True])
def test_torch_mha_round_trip_keeps_the_layout(batch_first):
    torch.manual_seed(0)
    m = nn.MultiheadAttention(16, 4, batch_first=batch_first).eval()
    ours = mha_from_torch(m)
    back = mha_to_torch(ours).eval()
    assert back.batch_first is batch_first
    x = torch.randn(5, 3, 16)  # (N, B, C) when sequence first, (B, N, C) otherwise
    want, _ = m(x, x, x, need_weights=False)
    got, _ = back(x, x, x, need_weights=False)
    assert torch.equal(got, want)
    # attnkit itself is batch first: same numbers on the (B, N, C) view
    xb = x if batch_first else x.transpose(0, 1)  # (B, N, C)
    wb = want if batch_first else want.transpose(0, 1)  # (B, N, C)
    assert_close(ours(xb).detach(), wb, atol=1e-6, rtol=1e-5)


def test_torch_mha_layout_can_be_chosen():
    ours = mha_from_torch(nn.MultiheadAttention(8, 2, batch_first=False))
    assert mha_to_torch(ours, batch_first=True).batch_first is True
