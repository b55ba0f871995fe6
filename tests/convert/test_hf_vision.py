"""Hugging Face ViT / Swin (random weights, small configs, offline) <-> attnkit."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnkit import EncoderBlock, record_attention  # noqa: E402
from attnkit.convert import hf_vision as hv  # noqa: E402
from tests.convert.helpers import rand, randomize  # noqa: E402


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


# --------------------------------------------------------------------------- whole ViT (needs vit)


def hf_vit_model(cls="ViTModel", add_pooling_layer=True, **kwargs):
    sizes = dict(hidden_size=36, num_hidden_layers=2, num_attention_heads=4, intermediate_size=144)
    config = transformers.ViTConfig(
        image_size=21,
        patch_size=7,  # 9 patches + CLS = 10 tokens
        attn_implementation="eager",
        **(sizes | kwargs),
    )
    pooling = {"add_pooling_layer": add_pooling_layer} if cls == "ViTModel" else {}
    model = getattr(transformers, cls)(config, **pooling)
    return randomize(model), config


def block_outputs(vit, images):
    """Input of blocks[0] and each block's output (HF's hidden_states), and the maps."""
    seen = []
    hooks = [vit.blocks[0].register_forward_pre_hook(lambda m, a: seen.append(a[0]))]
    hooks += [b.register_forward_hook(lambda m, a, out: seen.append(out)) for b in vit.blocks]
    with torch.no_grad(), record_attention(vit) as rec:
        out = vit(images)
        last = vit.features(images)
    for h in hooks:
        h.remove()
    maps = [rec[f"blocks.{i}.attn.fn"] for i in range(len(vit.blocks))]
    return out, last, seen[: len(vit.blocks) + 1], maps


@pytest.mark.parametrize(
    ("pooler", "qkv_bias"), [(True, True), (False, False)], ids=["pooler", "no-pooler-no-bias"]
)
def test_vit_model_matches_hidden_states_attentions_and_pooler(pooler, qkv_bias):
    pytest.importorskip("attnkit.models.vit")
    model, _ = hf_vit_model(add_pooling_layer=pooler, qkv_bias=qkv_bias)
    vit = hv.vit_from_hf(model).eval()
    assert vit.config.cls_pos and vit.config.norm_eps == 1e-12 and vit.config.num_classes == 0
    images = rand(2, 3, 21, 21)
    with torch.no_grad():
        want = model(images, output_hidden_states=True, output_attentions=True)
    out, last, hidden, maps = block_outputs(vit, images)
    for got, ref in zip(hidden, want.hidden_states, strict=True):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    for got, ref in zip(maps, want.attentions, strict=True):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(last, want.last_hidden_state, atol=1e-5, rtol=0)
    pooled = want.pooler_output if pooler else want.last_hidden_state[:, 0]
    torch.testing.assert_close(out, pooled, atol=1e-5, rtol=0)


@pytest.mark.parametrize("cls", ["ViTModel", "ViTForImageClassification"])
def test_vit_model_round_trip_is_bit_identical(cls):
    pytest.importorskip("attnkit.models.vit")
    model, _ = hf_vit_model(cls, num_labels=5)
    vit = hv.vit_from_hf(model)
    back = hv.hf_vit_model_state(vit)
    theirs = model.state_dict()
    assert set(back) == set(theirs)
    for k, v in theirs.items():
        assert back[k].shape == v.shape and torch.equal(back[k], v), k
    model.load_state_dict(back, strict=True)
    if cls == "ViTForImageClassification":
        images = rand(2, 3, 21, 21)
        with torch.no_grad():
            torch.testing.assert_close(vit.eval()(images), model(images).logits, atol=1e-5, rtol=0)


def test_vit_model_state_that_does_not_fit_and_refusals():
    pytest.importorskip("attnkit.models.vit")
    model, _ = hf_vit_model()
    vit = hv.vit_from_hf(model)
    state = dict(model.state_dict())
    state["embeddings.position_embeddings"] = state["embeddings.position_embeddings"][:, :9]
    del state["pooler.dense.bias"]
    with pytest.raises(ValueError) as err:
        hv.load_hf_vit_model_state(vit, state)
    msg = str(err.value)
    assert "'embeddings.position_embeddings' has shape (1, 9, 36), wanted (1, 10, 36)" in msg
    assert "missing 'pooler.dense.bias' (wanted (36,))" in msg
    with pytest.raises(ValueError, match="hidden_act='relu'"):
        hv.vit_from_hf(hf_vit_model(hidden_act="relu")[0])
    with pytest.raises(ValueError, match="pooler_act='relu'"):
        hv.vit_from_hf(hf_vit_model(pooler_act="relu")[0])
    bigger, _ = hf_vit_model(intermediate_size=50)  # F need not be a multiple of C
    assert hv.vit_from_hf(bigger).blocks[0].ff.fn.fc1.out_features == 50


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
    for i, layer in enumerate(model.encoder.layers[0].blocks):
        block = hv.swin_block_from_hf(layer, config, grid=grid).eval()  # pad_attends=True
        shifted = i % 2 == 1 and grid[0] > window
        assert block.attn.fn.shift == (window // 2 if shifted else 0)
        with torch.no_grad(), record_attention(block) as rec:
            x = block(x)
            x_hf, w_hf = layer(x_hf, grid)
        torch.testing.assert_close(x.flatten(1, 2), x_hf, atol=1e-5, rtol=0)
        # (B·nW, Hh, M², M²); HF's shift mask adds -100, leaving weights ~1e-44
        torch.testing.assert_close(rec["attn.fn.attn"], w_hf, atol=1e-6, rtol=0)
    torch.testing.assert_close(x.flatten(1, 2), out.hidden_states[1], atol=1e-5, rtol=0)
    torch.testing.assert_close(rec["attn.fn.attn"], out.attentions[0], atol=1e-6, rtol=0)


@pytest.mark.parametrize(("image", "padded"), [(28, True), (36, False)], ids=["7x7", "9x9"])
def test_swin_pad_attends_false_masks_the_padding(image, padded):
    """attnkit's own default: padding tokens are not keys. Differs from HF only on padded grids."""
    pytest.importorskip("attnkit.vision.window")
    model, config = hf_swin(3, image, 4)
    grid = (image // 4,) * 2
    layer = model.encoder.layers[0].blocks[0]  # unshifted: padding shares windows with tokens
    x = rand(2, *grid, 24)
    hf_like = hv.swin_block_from_hf(layer, config, grid=grid).eval()
    masked = hv.swin_block_from_hf(layer, config, grid=grid, pad_attends=False).eval()
    with torch.no_grad():
        want = layer(x.flatten(1, 2), grid)[0].unflatten(1, grid)
        torch.testing.assert_close(hf_like(x), want, atol=1e-5, rtol=0)
        gap = (masked(x) - want).abs().max().item()
    assert (gap > 1e-2) if padded else (gap < 1e-5), gap


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
