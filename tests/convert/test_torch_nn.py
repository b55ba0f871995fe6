"""torch.nn.MultiheadAttention <-> attnkit.MultiHeadAttention: the batch_first rule, round trips
that keep the layout, torch state dicts loaded into attnkit modules.

The rule, for every torch module `from_torch` takes: a batch-first module converts; a
sequence-first one (torch's default) raises ValueError naming batch_first, unless
`batch_first=True` acknowledges that the attnkit copy reads (B, N, C). No path gives
numbers that differ from torch's on torch's own layout.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from attnkit import MultiHeadAttention
from attnkit.convert import (
    decoder_from_torch,
    decoder_stack_from_torch,
    encoder_from_torch,
    encoder_stack_from_torch,
    from_torch,
    load_torch_mha_state,
    mha_from_torch,
    to_torch,
)
from attnkit.convert.torch_nn import mha_to_torch
from attnkit.models import DecoderBlock, TransformerConfig

F64 = torch.float64
TOL = {"atol": 1e-12, "rtol": 1e-12}
C, H, F, B, N, S = 12, 3, 20, 2, 5, 7


def _g(seed):
    return torch.Generator().manual_seed(seed)


def _encoder_layer(bf):
    return nn.TransformerEncoderLayer(C, H, F, dropout=0.1, batch_first=bf, dtype=F64)


def _decoder_layer(bf):
    return nn.TransformerDecoderLayer(C, H, F, dropout=0.1, batch_first=bf, dtype=F64)


# kind -> (build the torch module, its named converter, torch's call, attnkit's call); the
# calls take batch-first tensors x (B, N, C), m (B, S, C) and a torch module's layout flag
KINDS = {
    "mha": (
        lambda bf: nn.MultiheadAttention(C, H, dropout=0.1, batch_first=bf, dtype=F64),
        mha_from_torch,
        lambda t, x, m: t(x, m, m, need_weights=False)[0],
        lambda a, x, m: a(x, m),
    ),
    "encoder layer": (
        _encoder_layer,
        encoder_from_torch,
        lambda t, x, m: t(x),
        lambda a, x, m: a(x),
    ),
    "decoder layer": (
        _decoder_layer,
        decoder_from_torch,
        lambda t, x, m: t(x, m, tgt_is_causal=True, tgt_mask=_causal()),
        lambda a, x, m: a(x, m),
    ),
    "encoder stack": (
        lambda bf: nn.TransformerEncoder(_encoder_layer(bf), 2, enable_nested_tensor=False),
        encoder_stack_from_torch,
        lambda t, x, m: t(x),
        lambda a, x, m: a(x),
    ),
    "decoder stack": (
        lambda bf: nn.TransformerDecoder(_decoder_layer(bf), 2),
        decoder_stack_from_torch,
        lambda t, x, m: t(x, m, tgt_mask=_causal(), tgt_is_causal=True),
        lambda a, x, m: a(x, m),
    ),
}


def _causal():
    return nn.Transformer.generate_square_subsequent_mask(N, dtype=F64)


@pytest.mark.parametrize("acknowledge", [None, True, False], ids=["default", "True", "False"])
@pytest.mark.parametrize("torch_batch_first", [True, False], ids=["batch_first", "seq_first"])
@pytest.mark.parametrize("via", ["from_torch", "named"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_every_path_equals_torch_on_its_layout_or_refuses_naming_batch_first(
    kind, via, torch_batch_first, acknowledge
):
    build, named, call_torch, call_ours = KINDS[kind]
    torch.manual_seed(0)
    theirs = build(torch_batch_first).eval()  # dropout is set and must not act
    convert = from_torch if via == "from_torch" else named
    refused = acknowledge is False or (not torch_batch_first and acknowledge is None)
    if refused:
        with pytest.raises(ValueError, match="batch_first") as err:
            convert(theirs, batch_first=acknowledge)
        msg = str(err.value)
        assert "batch_first=True" in msg and "(B, N, C)" in msg
        if kind == "mha":
            assert "attnkit.nn.MultiheadAttention" in msg
        else:
            assert "rebuild the torch module with batch_first=True" in msg
        return
    ours = convert(theirs, batch_first=acknowledge).eval()
    x = torch.randn(B, N, C, dtype=F64, generator=_g(1))  # (B, N, C)
    m = torch.randn(B, S, C, dtype=F64, generator=_g(2))  # (B, S, C)
    with torch.no_grad():
        if torch_batch_first:
            want = call_torch(theirs, x, m)
        else:  # torch's own layout is (N, B, C): the acknowledged copy reads it transposed
            want = call_torch(theirs, x.transpose(0, 1), m.transpose(0, 1)).transpose(0, 1)
        assert_close(call_ours(ours, x, m), want, **TOL)


def test_the_silent_mismatch_the_rule_prevents_is_real():
    """Why sequence-first modules are refused: on (N, B, C) tensors the batch-first copy
    mixes the sequences of a batch and gives other numbers (not merely transposed ones)."""
    for seed in range(5):  # the guide says: more than 0.5 on random weights
        torch.manual_seed(seed)
        theirs = nn.MultiheadAttention(C, H, dtype=F64).eval()  # torch's default: seq first
        ours = mha_from_torch(theirs, batch_first=True)
        x = torch.randn(N, B, C, dtype=F64, generator=_g(3))  # (N, B, C), what theirs reads
        want, _ = theirs(x, x, x)
        assert (ours(x) - want).abs().max() > 0.5


@pytest.mark.parametrize("batch_first", [False, True])
def test_torch_mha_round_trip_keeps_the_layout(batch_first):
    torch.manual_seed(0)
    m = nn.MultiheadAttention(16, 4, batch_first=batch_first).eval()
    ours = mha_from_torch(m, batch_first=True)
    back = mha_to_torch(ours).eval()
    assert back.batch_first is batch_first
    x = torch.randn(5, 3, 16)  # (N, B, C) when sequence first, (B, N, C) otherwise
    want, _ = m(x, x, x, need_weights=False)
    got, _ = back(x, x, x, need_weights=False)
    assert torch.equal(got, want)


def test_torch_mha_layout_can_be_chosen():
    ours = mha_from_torch(nn.MultiheadAttention(8, 2, batch_first=False), batch_first=True)
    assert mha_to_torch(ours, batch_first=True).batch_first is True


def _torch_self_attn(module: nn.Module) -> nn.MultiheadAttention:
    if isinstance(module, nn.MultiheadAttention):
        return module
    layer = module.layers[0] if hasattr(module, "layers") else module  # a stack's first layer
    return layer.self_attn


@pytest.mark.parametrize("kind", list(KINDS))
def test_to_torch_gives_back_the_layout_the_module_came_from(kind):
    build = KINDS[kind][0]
    for bf in (False, True):
        ours = from_torch(build(bf), batch_first=True)
        assert _torch_self_attn(to_torch(ours)).batch_first is bf
        assert _torch_self_attn(to_torch(ours, batch_first=not bf)).batch_first is (not bf)
    cfg = TransformerConfig(1, 1, d_model=C, num_heads=H, d_ff=F)
    assert to_torch(DecoderBlock(cfg)).self_attn.batch_first is True  # built in attnkit


# ------------------------------------------------------------------ torch state dicts


TORCH_MHAS = {
    "packed": dict(),
    "kdim=vdim": dict(kdim=10, vdim=10),
    "kdim!=vdim": dict(kdim=10, vdim=6),
    "no bias": dict(bias=False),
}


@pytest.mark.parametrize("kw", list(TORCH_MHAS.values()), ids=list(TORCH_MHAS))
def test_a_torch_state_dict_loads_through_load_torch_mha_state(kw):
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(C, H, batch_first=True, dtype=F64, **kw).eval()
    bias = kw.get("bias", True)
    ours = MultiHeadAttention(
        C, H, key_dim=kw.get("kdim"), value_dim=kw.get("vdim"), qkv_bias=bias, out_bias=bias,
        dtype=F64,
    )  # fmt: skip
    assert load_torch_mha_state(ours, theirs.state_dict()) is ours
    q = torch.randn(B, N, C, dtype=F64, generator=_g(4))
    k = torch.randn(B, S, theirs.kdim, dtype=F64, generator=_g(5))
    v = torch.randn(B, S, theirs.vdim, dtype=F64, generator=_g(6))
    with torch.no_grad():
        want, _ = theirs(q, k, v, need_weights=False)
        assert_close(ours(q, k, v), want, **TOL)
    back = mha_to_torch(ours)  # and the weights come back bit for bit
    for (n1, p1), (n2, p2) in zip(
        theirs.state_dict().items(), back.state_dict().items(), strict=True
    ):
        assert n1 == n2 and torch.equal(p1, p2)


def test_load_state_dict_with_torch_names_says_what_to_call():
    theirs = nn.MultiheadAttention(C, H, batch_first=True)
    ours = MultiHeadAttention(C, H)
    for strict in (True, False):  # strict=False would otherwise load nothing, silently
        with pytest.raises(ValueError) as err:
            ours.load_state_dict(theirs.state_dict(), strict=strict)
        msg = str(err.value)
        for key in ("'in_proj_weight'", "'in_proj_bias'", "'out_proj.weight'", "'in_proj.qkv"):
            assert key in msg
        assert "attnkit.convert.load_torch_mha_state" in msg
        assert "attnkit.convert.mha_from_torch" in msg
    outer = nn.Sequential(MultiHeadAttention(C, H))  # nested: keys carry the prefix
    with pytest.raises(ValueError, match=r"\['0.in_proj_weight', '0.in_proj_bias'"):
        outer.load_state_dict(nn.Sequential(theirs).state_dict())
    ours.load_state_dict(MultiHeadAttention(C, H).state_dict())  # attnkit's own names: fine


def test_load_torch_mha_state_names_what_does_not_fit():
    ours = MultiHeadAttention(C, H)
    state = nn.MultiheadAttention(C, H, kdim=10, vdim=6, add_bias_kv=True).state_dict()
    with pytest.raises(ValueError) as err:
        load_torch_mha_state(ours, state)
    msg = str(err.value)
    assert msg.startswith("load_torch_mha_state: the state dict does not fit")
    assert "missing 'in_proj_weight' (wanted (36, 12))" in msg
    assert "unexpected 'k_proj_weight' (12, 10)" in msg and "unexpected 'bias_k'" in msg
    with pytest.raises(ValueError, match=r"load_torch_mha_state: .*GQA"):
        load_torch_mha_state(MultiHeadAttention(C, H, num_kv_heads=1), state)
