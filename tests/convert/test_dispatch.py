"""attnkit.convert.from_torch / to_torch: one entry point that picks the converter by type."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnkit import EncoderBlock, MultiHeadAttention
from attnkit.convert import (
    DecoderStack,
    EncoderStack,
    decoder_from_torch,
    decoder_stack_from_torch,
    encoder_from_torch,
    encoder_stack_from_torch,
    from_torch,
    mha_from_torch,
    to_torch,
)
from attnkit.models import DecoderBlock
from tests.convert.helpers import randomize


def _same_state(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize(
    ("make", "named", "cls"),
    [
        (
            lambda: nn.MultiheadAttention(24, 3, batch_first=True),
            mha_from_torch,
            MultiHeadAttention,
        ),
        (
            lambda: nn.TransformerEncoderLayer(24, 3, 40, batch_first=True),
            encoder_from_torch,
            EncoderBlock,
        ),
        (
            lambda: nn.TransformerDecoderLayer(24, 3, 40, batch_first=True),
            decoder_from_torch,
            DecoderBlock,
        ),
        (
            lambda: nn.TransformerEncoder(
                nn.TransformerEncoderLayer(24, 3, 40, batch_first=True),
                2,
                norm=nn.LayerNorm(24),
                enable_nested_tensor=False,
            ),
            encoder_stack_from_torch,
            EncoderStack,
        ),
        (
            lambda: nn.TransformerDecoder(
                nn.TransformerDecoderLayer(24, 3, 40, batch_first=True), 2
            ),
            decoder_stack_from_torch,
            DecoderStack,
        ),
    ],
    ids=["mha", "encoder", "decoder", "encoder stack", "decoder stack"],
)
def test_from_torch_picks_the_named_converter_and_to_torch_inverts_it(make, named, cls):
    torch.manual_seed(0)
    theirs = randomize(make())
    ours = from_torch(theirs)
    assert type(ours) is cls
    assert _same_state(ours, named(theirs))
    back = to_torch(ours)
    assert type(back) is type(theirs) and _same_state(back, theirs)


def test_to_torch_passes_options_on():
    block = from_torch(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True))
    assert to_torch(block, batch_first=False).self_attn.batch_first is False


@pytest.mark.parametrize("fn", [from_torch, to_torch])
def test_other_types_are_refused_with_the_type_named(fn):
    with pytest.raises(ValueError, match=rf"{fn.__name__}: expected one of .* got Linear"):
        fn(nn.Linear(2, 2))
