from __future__ import annotations

import pytest
import torch
from torch import nn

from attnkit import AttentionRecord, EncoderBlock, MultiHeadAttention, attention, record_attention


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([EncoderBlock(16, 4, 32) for _ in range(2)])
        self.cross = MultiHeadAttention(16, 2)

    def forward(self, x, ctx):
        for layer in self.layers:
            x = layer(x)
        return self.cross(x, ctx)


def test_records_every_attention_by_module_path():
    torch.manual_seed(0)
    model = TwoLayers().eval()
    x, ctx = torch.randn(3, 5, 16), torch.randn(3, 7, 16)
    with torch.no_grad():
        plain = model(x, ctx)
        with record_attention(model) as rec:
            recorded = model(x, ctx)
    assert isinstance(rec, AttentionRecord)
    assert rec.names == ["layers.0.attn.fn", "layers.1.attn.fn", "cross"]
    assert rec.stack("layers").shape == (2, 3, 4, 5, 5)
    assert rec["cross"].shape == (3, 2, 5, 7)
    torch.testing.assert_close(recorded, plain, atol=1e-6, rtol=0)  # recording changes nothing
    # the recorded map is the probability matrix of that layer's own q and k
    first = model.layers[0].attn
    q, k, v = first.fn.heads_qkv(first.norm(x))
    want = attention(q, k, v, need_weights=True).weights
    torch.testing.assert_close(rec["layers.0.attn.fn"], want)
    torch.testing.assert_close(rec["cross"].sum(-1), torch.ones(3, 2, 5))


def test_hooks_are_removed_and_flags_restored():
    model = TwoLayers()
    with record_attention(model):
        pass
    for m in model.modules():
        assert not m._forward_hooks
        if hasattr(m, "need_weights"):
            assert m.need_weights is False


def test_repeated_calls_are_kept_in_order_and_shapes_must_agree_to_stack():
    model = TwoLayers().eval()
    with record_attention(model) as rec:
        model(torch.randn(1, 4, 16), torch.randn(1, 2, 16))
        model(torch.randn(1, 6, 16), torch.randn(1, 2, 16))
    assert [t.shape[-1] for t in rec.calls["cross"]] == [2, 2]
    assert rec["layers.0.attn.fn"].shape == (1, 4, 6, 6)  # the last call
    with pytest.raises(ValueError, match="differ in shape"):
        rec.stack()
    with pytest.raises(KeyError, match="no attention recorded"):
        rec["nope"]


def test_model_without_attention_is_refused():
    with pytest.raises(ValueError, match="contains no attnkit attention"):
        with record_attention(nn.Linear(2, 2)):
            pass


def test_detach_false_keeps_the_graph():
    m = MultiHeadAttention(8, 2)
    with record_attention(m, detach=False) as rec:
        m(torch.randn(1, 3, 8))
    rec["attend"].sum().backward()  # rows sum to 1: gradient exists but is ~0
    assert m.in_proj.qkv.weight.grad is not None
