from __future__ import annotations

import math

import pytest
import torch

from attnkit.models import (
    PRESETS,
    CausalLM,
    DecoderBlock,
    KVCache,
    Transformer,
    TransformerConfig,
    pad_mask,
    preset,
)
from attnkit.models.transformer import config_from_dict

V = 13


def make(norm_first: bool = False, **kw) -> Transformer:
    torch.manual_seed(0)
    kw = {"pad_id": 0, **kw}  # these tests pad with 0
    cfg = preset("tiny", src_vocab=V, tgt_vocab=V, norm_first=norm_first, **kw)
    return Transformer(cfg).eval()


def tokens(b: int, n: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, V, (b, n), generator=g)


def test_shapes_and_presets():
    model = make()
    src, tgt = tokens(2, 7), tokens(2, 5, seed=2)
    assert model(src, tgt).shape == (2, 5, V)
    assert model.loss(src, tgt).dim() == 0
    base = preset("base", src_vocab=100, tgt_vocab=100)
    assert (base.d_model, base.num_heads, base.d_ff, base.encoder_layers) == (512, 8, 2048, 6)
    assert not base.norm_first  # the paper is post-norm
    assert set(PRESETS) >= {"base", "big", "tiny"}
    assert config_from_dict(base.to_dict()) == base


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(d_model=30, num_heads=4), "d_model=30 must be divisible by num_heads=4"),
        (dict(positions="rope"), "positions must be 'sinusoidal' or 'learned', got 'rope'"),
        (dict(share_embeddings=True, tgt_vocab=7), "share_embeddings needs src_vocab == tgt_vocab"),
        (dict(label_smoothing=1.0), "label_smoothing must be in"),
        (dict(src_vocab=0), "src_vocab must be a positive integer, got 0"),
    ],
)
def test_config_errors_name_argument_and_values(kw, match):
    with pytest.raises(ValueError, match=match):
        TransformerConfig(**{"src_vocab": 10, "tgt_vocab": 10, **kw})


def test_unknown_preset_and_fields():
    with pytest.raises(ValueError, match="preset must be one of"):
        preset("huge", src_vocab=3, tgt_vocab=3)
    with pytest.raises(ValueError, match="unknown TransformerConfig fields"):
        config_from_dict({"src_vocab": 3, "tgt_vocab": 3, "layers": 2})


def test_embeddings_shared_tied_and_scaled():
    shared = make(share_embeddings=True)
    assert shared.src_embed.table is shared.tgt_embed.table
    assert shared.generator.weight is shared.tgt_embed.table.weight
    separate = make(tie_generator=False)
    assert separate.src_embed.table is not separate.tgt_embed.table
    assert separate.generator.weight is not separate.tgt_embed.table.weight
    emb = shared.src_embed
    x = tokens(1, 4)
    want = emb.table(x) * math.sqrt(64) + emb.positions.table[:4]  # §3.4 and §3.5
    torch.testing.assert_close(emb(x), want)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_padding_does_not_change_real_positions(norm_first, positions):
    model = make(norm_first, positions=positions)
    src, tgt = tokens(2, 6), tokens(2, 4, seed=2)
    ref = model(src, tgt)
    pad = torch.zeros(2, 5, dtype=torch.long)  # pad_id 0
    padded = model(torch.cat([src, pad], 1), torch.cat([tgt, pad[:, :3]], 1))
    torch.testing.assert_close(padded[:, :4], ref, atol=1e-5, rtol=0)
    # ragged batch: row 1 shorter than row 0, compared with row 1 alone
    src2 = src.clone()
    src2[1, 4:] = 0
    alone = model(src[1:, :4], tgt[1:])
    torch.testing.assert_close(model(src2, tgt)[1:], alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("norm_first", [False, True])
def test_causal_future_targets_do_not_change_earlier_logits(norm_first):
    model = make(norm_first)
    src, tgt = tokens(2, 6), tokens(2, 8, seed=2)
    changed = tgt.clone()
    changed[:, 5:] = tokens(2, 3, seed=3)
    a, b = model(src, tgt), model(src, changed)
    torch.testing.assert_close(a[:, :5], b[:, :5], atol=1e-6, rtol=0)
    assert (a[:, 5:] - b[:, 5:]).abs().max() > 1e-3


def test_source_matters_through_cross_attention():
    model = make()
    tgt = tokens(1, 4, seed=2)
    assert (model(tokens(1, 6), tgt) - model(tokens(1, 6, seed=9), tgt)).abs().max() > 1e-3


def test_loss_ignores_padding_and_smooths_labels():
    model = make(label_smoothing=0.1)
    src, tgt = tokens(2, 5), tokens(2, 6, seed=2)
    padded = torch.cat([tgt, torch.zeros(2, 3, dtype=torch.long)], 1)
    torch.testing.assert_close(model.loss(src, padded), model.loss(src, tgt), atol=1e-6, rtol=0)
    logits = model(src, tgt[:, :-1])
    labels = tgt[:, 1:]
    nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
    uniform = -logits.log_softmax(-1).mean(-1).mean()
    torch.testing.assert_close(model.loss(src, tgt), 0.9 * nll + 0.1 * uniform)


def test_pad_mask_polarity_and_shape():
    m = pad_mask(torch.tensor([[5, 6, 0], [7, 0, 0]]), 0)
    assert m.shape == (2, 1, 1, 3) and m.dtype == torch.bool
    assert m[:, 0, 0].tolist() == [[True, True, False], [True, False, False]]  # True = may attend


def test_decoder_block_needs_memory_for_cross_attention():
    cfg = preset("tiny", src_vocab=V, tgt_vocab=V)
    with pytest.raises(ValueError, match="memory"):
        DecoderBlock(cfg)(torch.randn(1, 3, 64))
    assert DecoderBlock(cfg, cross_attention=False)(torch.randn(1, 3, 64)).shape == (1, 3, 64)


def test_tokens_must_be_integer_ids():
    with pytest.raises(ValueError, match=r"tokens must be integer ids of shape \(B, N\)"):
        make()(torch.randn(2, 3), tokens(2, 3))


@pytest.mark.parametrize("norm_first", [False, True])
def test_causal_lm_is_causal_and_caches(norm_first):
    torch.manual_seed(0)
    lm = CausalLM(preset("tiny", src_vocab=V, tgt_vocab=V, norm_first=norm_first)).eval()
    x = tokens(2, 9)
    full = lm(x)
    changed = x.clone()
    changed[:, 6:] = 3
    torch.testing.assert_close(lm(changed)[:, :6], full[:, :6], atol=1e-6, rtol=0)
    cache = KVCache()
    steps = [lm(x[:, :4], cache=cache)] + [lm(x[:, i : i + 1], cache=cache) for i in range(4, 9)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)
    out = lm.generate(x[:, :3], 4)
    assert out.shape == (2, 7) and torch.equal(out[:, :3], x[:, :3])
    assert lm.loss(x).dim() == 0
