"""torch.nn.TransformerEncoder / TransformerDecoder <-> EncoderStack / DecoderStack.

Float64, 1e-12, torch on its own layout: norm_first × relu/gelu × final norm or none ×
batch_first both ways × padding and causal masks (boolean and float, and torch's is_causal
hint), dropout set and in eval; torch called with and without autograd (its fast paths).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnkit import EncoderBlock, masks
from attnkit.convert import (
    DecoderStack,
    EncoderStack,
    decoder_masks_from_torch,
    decoder_stack_from_torch,
    decoder_stack_to_torch,
    encoder_mask_from_torch,
    encoder_stack_from_torch,
    encoder_stack_to_torch,
    from_torch,
    load_torch_decoder_stack_state,
    load_torch_encoder_stack_state,
    to_torch,
)
from attnkit.models import KVCache
from tests.convert.helpers import randomize

F64 = torch.float64
TOL = {"atol": 1e-12, "rtol": 1e-12}
C, H, F, B, N, S, LAYERS = 12, 4, 20, 3, 7, 5, 3


def rand(*shape, seed=0):
    return torch.randn(shape, dtype=F64, generator=torch.Generator().manual_seed(seed))


def key_padding(b, n, seed):
    """torch's key padding (B, N), True = padding; the first key always real."""
    kpm = torch.rand(b, n, generator=torch.Generator().manual_seed(seed)) > 0.6
    kpm[:, 0] = False
    return kpm


def as_float(blocked):
    return torch.zeros(blocked.shape, dtype=F64).masked_fill(blocked, float("-inf"))


def encoder(batch_first=True, norm_first=False, activation="relu", final_norm=True, **kw):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(
        C, H, F, dropout=0.1, activation=activation, norm_first=norm_first,
        batch_first=batch_first, dtype=F64,
    )  # fmt: skip
    norm = nn.LayerNorm(C, dtype=F64) if final_norm else None
    kw.setdefault("enable_nested_tensor", False)
    return randomize(nn.TransformerEncoder(layer, LAYERS, norm=norm, **kw), scale=0.2)


def decoder(batch_first=True, norm_first=False, activation="relu", final_norm=True):
    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(
        C, H, F, dropout=0.1, activation=activation, norm_first=norm_first,
        batch_first=batch_first, dtype=F64,
    )  # fmt: skip
    norm = nn.LayerNorm(C, dtype=F64) if final_norm else None
    return randomize(nn.TransformerDecoder(layer, LAYERS, norm=norm), scale=0.2)


def run_torch(module, *inputs, **kw):
    """torch on its own layout, batch first in and out; with and without autograd (the
    second takes torch's inference fast paths where they apply): both must agree."""
    bf = module.layers[0].self_attn.batch_first
    inputs = inputs if bf else tuple(t.transpose(0, 1) for t in inputs)
    regular = module(*inputs, **kw).detach()
    with torch.no_grad():
        fast = module(*inputs, **kw)
    torch.testing.assert_close(fast, regular, **TOL)
    return regular if bf else regular.transpose(0, 1)


SETTINGS = [
    pytest.param(nf, act, fn, id=f"{'pre' if nf else 'post'}-{act}-{'norm' if fn else 'nonorm'}")
    for nf in (False, True)
    for act in ("relu", "gelu")
    for fn in (True, False)
]


@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
@pytest.mark.parametrize(("norm_first", "activation", "final_norm"), SETTINGS)
def test_encoder_stack_equals_torch(norm_first, activation, final_norm, batch_first):
    theirs = encoder(batch_first, norm_first, activation, final_norm)
    ours = from_torch(theirs, batch_first=True).eval()  # acknowledges (B, N, C)
    assert type(ours) is EncoderStack and len(ours.layers) == LAYERS
    assert isinstance(ours.norm, nn.LayerNorm if final_norm else nn.Identity)
    x = rand(B, N, C)
    kpm = key_padding(B, N, seed=1)
    causal = nn.Transformer.generate_square_subsequent_mask(N, dtype=F64)  # -inf above
    cases = [  # torch's masks; attnkit's mask (and causal flag)
        ({}, {}),
        ({"src_key_padding_mask": kpm}, {"mask": masks.from_torch_key_padding_mask(kpm)}),
        ({"src_key_padding_mask": as_float(kpm)}, {"mask": encoder_mask_from_torch(None, kpm)}),
        ({"mask": causal, "is_causal": True}, {"causal": True}),
        ({"mask": causal.isinf()}, {"mask": encoder_mask_from_torch(causal)}),
        (
            {"mask": causal, "src_key_padding_mask": as_float(kpm), "is_causal": True},
            {"mask": masks.from_torch_key_padding_mask(kpm), "causal": True},
        ),
        (
            {"mask": causal.isinf(), "src_key_padding_mask": kpm},
            {"mask": encoder_mask_from_torch(causal.isinf(), kpm)},
        ),
    ]
    for torch_kw, ours_kw in cases:
        want = run_torch(theirs, x, **torch_kw)
        with torch.no_grad():
            got = ours(x, **ours_kw)
        torch.testing.assert_close(got, want, **TOL, msg=lambda m, k=torch_kw: f"{k}: {m}")


@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
@pytest.mark.parametrize(("norm_first", "activation", "final_norm"), SETTINGS)
def test_decoder_stack_equals_torch(norm_first, activation, final_norm, batch_first):
    theirs = decoder(batch_first, norm_first, activation, final_norm)
    ours = from_torch(theirs, batch_first=True).eval()
    assert type(ours) is DecoderStack and len(ours.layers) == LAYERS
    x, memory = rand(B, N, C), rand(B, S, C, seed=2)
    tkpm, mkpm = key_padding(B, N, seed=3), key_padding(B, S, seed=4)
    memory_mask = torch.rand(N, S, generator=torch.Generator().manual_seed(5)) > 0.7
    memory_mask[:, 0] = False
    causal = nn.Transformer.generate_square_subsequent_mask(N, dtype=F64)
    cases = [
        {"tgt_mask": causal, "tgt_is_causal": True},
        {"tgt_mask": causal.isinf(), "tgt_key_padding_mask": tkpm},
        {"tgt_mask": causal, "memory_key_padding_mask": as_float(mkpm)},
        {
            "tgt_mask": causal.isinf(),
            "tgt_key_padding_mask": tkpm,
            "memory_key_padding_mask": mkpm,
            "memory_mask": memory_mask,
        },
    ]
    for torch_kw in cases:
        want = run_torch(theirs, x, memory, **torch_kw)
        mask, mem = decoder_masks_from_torch(**torch_kw)
        with torch.no_grad():
            got = ours(x, memory, mask=mask, memory_mask=mem)
        torch.testing.assert_close(got, want, **TOL, msg=lambda m, k=torch_kw: f"{k}: {m}")


def test_cached_decoding_equals_torch_on_the_whole_sequence():
    theirs = decoder(norm_first=True, activation="gelu")
    ours = from_torch(theirs).eval()
    x, memory = rand(B, N, C), rand(B, S, C, seed=2)
    causal = nn.Transformer.generate_square_subsequent_mask(N, dtype=F64)
    want = run_torch(theirs, x, memory, tgt_mask=causal)
    cache = KVCache()
    with torch.no_grad():
        steps = [ours(x[:, t : t + 1], memory, cache=cache) for t in range(N)]
    assert cache.length == N  # the stack advances it, as Transformer.decode does
    torch.testing.assert_close(torch.cat(steps, dim=1), want, **TOL)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_torchs_nested_tensor_path_zeroes_padded_positions_and_agrees_elsewhere():
    """torch's encoder in eval without autograd, key padding and no mask, post-norm,
    batch first, even heads: it runs on nested tensors and returns 0 where the padding is."""
    theirs = encoder(enable_nested_tensor=True, final_norm=False).eval()
    assert theirs.use_nested_tensor
    ours = from_torch(theirs).eval()
    x = rand(B, N, C)
    kpm = torch.zeros(B, N, dtype=torch.bool)
    kpm[1, 4:] = True  # left aligned, as the nested path wants
    with torch.no_grad():
        nested = theirs(x, src_key_padding_mask=kpm)
        got = ours(x, mask=masks.from_torch_key_padding_mask(kpm))
    regular = theirs(x, src_key_padding_mask=kpm).detach()  # autograd on: no nested path
    assert (nested[1, 4:] == 0).all() and (got[1, 4:] != 0).all()
    torch.testing.assert_close(got, regular, **TOL)
    torch.testing.assert_close(got[~kpm], nested[~kpm], **TOL)


@pytest.mark.parametrize("final_norm", [True, False])
@pytest.mark.parametrize("batch_first", [True, False])
def test_round_trips_are_bit_identical(batch_first, final_norm):
    for theirs, back_fn in (
        (encoder(batch_first, final_norm=final_norm), encoder_stack_to_torch),
        (decoder(batch_first, final_norm=final_norm), decoder_stack_to_torch),
    ):
        named = encoder_stack_from_torch if back_fn is encoder_stack_to_torch else None
        named = named or decoder_stack_from_torch
        back = back_fn(named(theirs, batch_first=True))  # the layout it came from
        assert type(back) is type(theirs) and back.num_layers == LAYERS
        assert back.layers[0].self_attn.batch_first is batch_first
        assert (back.norm is None) is (not final_norm)
        assert len({id(layer) for layer in back.layers}) == LAYERS  # no shared layers
        for (k1, p1), (k2, p2) in zip(
            theirs.state_dict().items(), back.state_dict().items(), strict=True
        ):
            assert k1 == k2 and p1.dtype == p2.dtype and torch.equal(p1, p2), k1
        assert [layer.dropout.p for layer in back.layers] == [0.1] * LAYERS


def test_an_attnkit_stack_goes_to_torch_and_computes_the_same():
    torch.manual_seed(0)
    blocks = [
        EncoderBlock(C, H, F, norm_first=True, activation="gelu", dtype=F64) for _ in range(2)
    ]
    ours = EncoderStack(blocks, nn.LayerNorm(C, dtype=F64)).eval()
    theirs = to_torch(ours).eval()
    assert isinstance(theirs, nn.TransformerEncoder) and not theirs.enable_nested_tensor
    with pytest.warns(UserWarning, match="norm_first was True"):  # torch's own warning
        assert to_torch(ours, enable_nested_tensor=True).enable_nested_tensor
    x, kpm = rand(B, N, C), key_padding(B, N, seed=6)
    want = run_torch(theirs, x, src_key_padding_mask=kpm)
    with torch.no_grad():
        got = ours(x, mask=masks.from_torch_key_padding_mask(kpm))
    torch.testing.assert_close(got, want, **TOL)


def test_state_dicts_load_by_torch_names_and_misfits_are_named():
    theirs = encoder()
    ours = from_torch(encoder(final_norm=True))
    state = dict(theirs.state_dict())
    assert load_torch_encoder_stack_state(ours, state) is ours
    x = rand(B, N, C)
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(x), run_torch(theirs, x), **TOL)
    state["layers.1.linear1.weight"] = state["layers.1.linear1.weight"][:, :10]
    del state["norm.bias"]
    with pytest.raises(ValueError) as err:
        load_torch_encoder_stack_state(ours, state)
    msg = str(err.value)
    assert "'layers.1.linear1.weight' has shape (20, 10), wanted (20, 12)" in msg
    assert "missing 'norm.bias' (wanted (12,))" in msg
    dec = from_torch(decoder(final_norm=False))
    state = dict(decoder(final_norm=True).state_dict())
    with pytest.raises(ValueError, match=r"unexpected 'norm.weight' \(12,\)"):
        load_torch_decoder_stack_state(dec, state)


def test_refusals_name_what_is_wrong():
    with pytest.raises(ValueError, match="needs one or more EncoderBlocks, got Identity"):
        to_torch(EncoderStack([nn.Identity()]))
    with pytest.raises(ValueError, match="needs one or more DecoderBlocks, got no layers"):
        to_torch(DecoderStack([]))
    with pytest.raises(ValueError, match=r"expected torch\.nn\.TransformerEncoder, got Linear"):
        encoder_stack_from_torch(nn.Linear(2, 2))
    mixed = encoder()
    mixed.layers[1].self_attn.batch_first = False
    with pytest.raises(ValueError, match="differ in batch_first"):
        from_torch(mixed)
    with pytest.raises(ValueError, match="batch_first=False"):
        from_torch(encoder(batch_first=False))
    empty = encoder()
    empty.layers = nn.ModuleList()
    with pytest.raises(ValueError, match="has no layers"):
        from_torch(empty)


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")  # torch, norm_first
def test_a_whole_nn_transformer_converts_in_its_two_halves():
    torch.manual_seed(0)
    model = nn.Transformer(
        C, H, 2, 2, F, dropout=0.1, batch_first=True, norm_first=True, dtype=F64
    ).eval()
    enc, dec = from_torch(model.encoder).eval(), from_torch(model.decoder).eval()
    assert isinstance(enc.norm, nn.LayerNorm) and isinstance(dec.norm, nn.LayerNorm)
    src, tgt = rand(B, S, C), rand(B, N, C, seed=1)
    skpm = key_padding(B, S, seed=2)
    causal = nn.Transformer.generate_square_subsequent_mask(N, dtype=F64)
    with torch.no_grad():
        want = model(
            src, tgt, tgt_mask=causal, src_key_padding_mask=skpm, memory_key_padding_mask=skpm
        )
        memory = enc(src, mask=masks.from_torch_key_padding_mask(skpm))
        mask, mem = decoder_masks_from_torch(tgt_mask=causal, memory_key_padding_mask=skpm)
        torch.testing.assert_close(dec(tgt, memory, mask=mask, memory_mask=mem), want, **TOL)
