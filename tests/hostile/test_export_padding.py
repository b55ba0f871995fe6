"""Issue 28, item 5: a module called with `masks.padding(lengths, n)` exports with a dynamic
batch (the range check of `padding` read `int(lengths.min())` inside the trace and failed
with "Could not extract specialized integer from data-dependent expression")."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn
from torch.export import Dim

from attnkit.functional import masks
from attnkit.modules import MultiHeadAttention


class PaddedSelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = MultiHeadAttention(16, 2)

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        """x (B, N, C), lengths (B,) -> (B, N, C)."""
        return self.attn(x, mask=masks.padding(lengths, x.shape[1]))


@pytest.mark.parametrize("strict", [False, True])
def test_export_with_padding_from_lengths_and_a_dynamic_batch(strict):
    torch.manual_seed(0)
    model = PaddedSelfAttention().eval()
    batch = Dim("batch", min=1, max=16)
    x, lengths = torch.randn(3, 5, 16), torch.tensor([5, 2, 1])
    program = torch.export.export(
        model, (x, lengths), dynamic_shapes=({0: batch}, {0: batch}), strict=strict
    )
    # another batch size than the traced one, with an empty row (length 0) among them
    x, lengths = torch.randn(6, 5, 16), torch.tensor([1, 5, 3, 0, 4, 2])
    torch.testing.assert_close(program.module()(x, lengths), model(x, lengths))


def test_eager_padding_still_refuses_lengths_out_of_range():
    with pytest.raises(ValueError, match=r"padding: lengths must lie in \[0, 4\]"):
        masks.padding(torch.tensor([2, 5]), 4)
    with pytest.raises(ValueError, match=r"padding: lengths must lie in \[0, 4\]"):
        masks.padding(torch.tensor([-1, 3]), 4)
