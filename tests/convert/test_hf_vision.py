"""Hugging Face ViT / Swin (random weights, small configs, offline) <-> attnkit."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnkit import EncoderBlock, record_attention  # noqa: E402
from attnkit.convert import hf_vision as hv  # noqa: E402


def rand(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def randomize(model, seed=0):
    """HF zero-initialises biases and sets LayerNorms to 1/0: make every weight count."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return model.eval()


def hf_vit(**kwargs):
    config = transformers.ViTConfig(
        hidden_size=36,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=52,
        image_size=28,
        patch_size=7,  # 16 patches + CLS = 17 tokens
        attn_implementation="eager",
        **kwargs,
    )
    return randomize(transformers.ViTModel(config)), config


@pytest.mark.parametrize("qkv_bias", [True, False])
def test_vit_layers_match_hidden_states_and_attentions(qkv_bias):
    model, config = hf_vit(qkv_bias=qkv_bias)
    pixels = rand(2, 3, 28, 28)
    with torch.no_grad():
        out = model(pixels, output_hidden_states=True, output_attentions=True)
    hidden, attentions = out.hidden_states, out.attentions
    assert len(hidden) == 3 and attentions[0].shape == (2, 4, 17, 17)
    for i, layer in enumerate(model.layers):
        block = hv.vit_block_from_hf(layer, config).eval()
        with torch.no_grad(), record_attention(block) as rec:
            got = block(hidden[i])
        torch.testing.assert_close(got, hidden[i + 1], atol=1e-5, rtol=0)
        torch.testing.assert_close(rec["attn.fn"], attentions[i], atol=1e-6, rtol=0)


def test_vit_layer_round_trip_is_bit_identical():
    model, config = hf_vit()
    layer = model.layers[1]
    block = hv.vit_block_from_hf(layer, config)
    back = hv.hf_vit_layer_state(block)
    theirs = layer.state_dict()
    assert set(back) == set(theirs)
    for k, v in theirs.items():
        assert torch.equal(back[k], v), k
    fresh = EncoderBlock(36, 4, 52, norm_first=True)
    hv.load_hf_vit_layer_state(fresh, back)
    for (k1, p1), (k2, p2) in zip(
        block.state_dict().items(), fresh.state_dict().items(), strict=True
    ):
        assert k1 == k2 and torch.equal(p1, p2)


def test_vit_state_dict_that_does_not_fit():
    model, _ = hf_vit()
    state = dict(model.layers[0].state_dict())
    state["attention.k_proj.weight"] = state["attention.k_proj.weight"][:, :30]
    del state["mlp.fc2.bias"]
    state["attention.extra"] = torch.zeros(3)
    with pytest.raises(ValueError) as err:
        hv.load_hf_vit_layer_state(EncoderBlock(36, 4, 52), state)
    msg = str(err.value)
    assert "'attention.k_proj.weight' has shape (36, 30), wanted (36, 36)" in msg
    assert "missing 'mlp.fc2.bias' (wanted (36,))" in msg
    assert "unexpected 'attention.extra' (3,)" in msg


# --------------------------------------------------------------------------- Swin (needs vision)


def hf_swin(window=3, image=36, patch=4, depths=(2,)):
    config = transformers.SwinConfig(
        image_size=image,
        patch_size=patch,
        embed_dim=24,
        depths=list(depths),
        num_heads=[3] * len(depths),
        window_size=window,
        attn_implementation="eager",
    )
    return randomize(transformers.SwinModel(config)), config


@pytest.mark.parametrize(
    ("window", "image", "patch"),
    [(3, 36, 4), (3, 28, 4), (7, 28, 4), (2, 24, 3)],
    ids=["9x9-M3", "7x7-M3-padded", "7x7-M7", "8x8-M2"],
)
def test_swin_blocks_match_hf_layers_and_stage(window, image, patch):
    pytest.importorskip("attnkit.vision.window")
    model, config = hf_swin(window, image, patch)
    grid = (image // patch,) * 2
    pixels = rand(2, 3, image, image)
    with torch.no_grad():
        out = model(pixels, output_hidden_states=True, output_attentions=True)
    # HF reports per stage: hidden_states[s] its input, attentions[s] its last block's
    x_hf = out.hidden_states[0]  # (B, H·W, C)
    x = x_hf.unflatten(1, grid)  # (B, H, W, C)
    padded = grid[0] % window != 0
    for i, layer in enumerate(model.encoder.layers[0].blocks):
        block = hv.swin_block_from_hf(layer, config, grid=grid).eval()
        shifted = i % 2 == 1 and grid[0] > window
        assert block.attn.fn.shift == (window // 2 if shifted else 0)
        with torch.no_grad(), record_attention(block) as rec:
            x = block(x)
            x_hf, w_hf = layer(x_hf, grid)
        if padded:
            continue  # HF attends to zero padding tokens, attnkit masks them (documented)
        torch.testing.assert_close(x.flatten(1, 2), x_hf, atol=1e-5, rtol=0)
        # (B·nW, Hh, M², M²); HF's shift mask adds -100, leaving weights ~1e-44
        torch.testing.assert_close(rec["attn.fn.attn"], w_hf, atol=1e-6, rtol=0)
    if padded:
        assert not torch.allclose(x.flatten(1, 2), out.hidden_states[1], atol=1e-3)
    else:
        torch.testing.assert_close(x.flatten(1, 2), out.hidden_states[1], atol=1e-5, rtol=0)
        torch.testing.assert_close(rec["attn.fn.attn"], out.attentions[0], atol=1e-6, rtol=0)


def test_swin_round_trip_and_refusal():
    pytest.importorskip("attnkit.vision.window")
    model, config = hf_swin(3, 36, 4)
    layer = model.encoder.layers[0].blocks[1]
    block = hv.swin_block_from_hf(layer, config, grid=(9, 9))
    back = hv.hf_swin_layer_state(block)
    theirs = layer.state_dict()
    assert set(back) == set(theirs)
    for k, v in theirs.items():
        assert torch.equal(back[k], v), k
    with pytest.raises(ValueError, match="smaller than the window"):
        hv.swin_block_from_hf(layer, config, grid=(2, 5))
