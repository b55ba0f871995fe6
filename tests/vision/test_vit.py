import dataclasses

import pytest
import torch

from attnkit import record_attention
from attnkit.models.vit import (
    PRESETS,
    CNNConfig,
    PatchEmbed,
    SmallCNN,
    T2TEmbed,
    ViT,
    ViTConfig,
    build_model,
    config_from_dict,
)
from attnkit.vision import CBAM


def test_patch_embed_is_a_linear_map_per_patch():
    torch.manual_seed(0)
    pe = PatchEmbed(8, 2, 3, 16)
    x = torch.randn(2, 3, 8, 8)
    tokens = pe(x)
    assert tokens.shape == (2, 16, 16) and pe.grid == (4, 4)
    # token 5 = grid row 1, column 1 = pixels [2:4, 2:4]
    patch = x[:, :, 2:4, 2:4].reshape(2, -1)
    ref = patch @ pe.proj.weight.reshape(16, -1).T + pe.proj.bias
    torch.testing.assert_close(tokens[:, 5], ref)


def test_t2t_embed_soft_splits_overlap_and_shrink_grid():
    t2t = T2TEmbed(8, 1, 24, ((3, 1), (3, 2), (3, 1)), chan=8)
    assert t2t.sides == [8, 4, 4] and t2t.grid == (4, 4)
    assert t2t(torch.randn(2, 1, 8, 8)).shape == (2, 16, 24)
    assert len(t2t.stages) == 2  # a token transformer after every split but the last


@pytest.mark.parametrize("pool", ["cls", "mean"])
@pytest.mark.parametrize("pos", ["learned", "sincos"])
@pytest.mark.parametrize("tokens", ["patch", "t2t"])
def test_vit_variants_shapes_and_attention_maps(pool, pos, tokens):
    cfg = ViTConfig(dim=16, depth=2, num_heads=2, pool=pool, pos=pos, tokens=tokens, t2t_chan=8)
    model = ViT(cfg).eval()
    x = torch.randn(3, 1, 8, 8)
    assert model(x).shape == (3, 10)
    with record_attention(model) as rec:
        model(x)
    n = 16 + (pool == "cls")
    assert rec.stack("blocks.").shape == (2, 3, 2, n, n)


def test_sincos_positions_are_fixed_and_not_saved():
    model = ViT(ViTConfig(dim=16, depth=1, num_heads=2, pos="sincos"))
    assert not any("pos" in k for k in model.state_dict())


def test_vit_without_positions_would_be_permutation_invariant_but_positions_break_it():
    torch.manual_seed(0)
    model = ViT(ViTConfig(dim=16, depth=1, num_heads=2, dropout=0.0)).eval()
    x = torch.randn(1, 1, 8, 8)
    flipped = x.flip(-1)
    assert not torch.allclose(model(x), model(flipped))


def test_small_cnn_uses_cbam():
    model = SmallCNN(CNNConfig())
    assert sum(isinstance(m, CBAM) for m in model.modules()) == len(CNNConfig().widths)
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 10)


def test_presets_build_and_configs_roundtrip_through_json_dicts():
    import json

    for name, cfg in PRESETS.items():
        model = build_model(cfg)
        assert model(torch.randn(1, 1, 8, 8)).shape == (1, 10), name
        fields = json.loads(json.dumps(dataclasses.asdict(cfg)))
        assert config_from_dict(type(cfg).__name__, fields) == cfg
    with pytest.raises(dataclasses.FrozenInstanceError):
        PRESETS["vit"].dim = 3


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: ViT(ViTConfig(pool="max")), r"pool must be one of \('cls', 'mean'\), got 'max'"),
        (
            lambda: ViT(ViTConfig(patch_size=3)),
            "patch_size must divide image_size=8, got patch_size=3",
        ),
        (
            lambda: config_from_dict("ViTConfig", {"width": 3}),
            r"unknown ViTConfig fields \['width'\]",
        ),
        (lambda: build_model({}), "config must be a ViTConfig or CNNConfig, got dict"),
    ],
)
def test_config_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_hugging_face_options_class_position_pooler_no_head():
    """cls_pos, pooler, num_classes=0, norm_eps, qkv_bias: what HF's ViTModel needs."""
    cfg = ViTConfig(dim=16, depth=1, num_heads=2, pos="learned", num_classes=0, cls_pos=True)
    cfg = dataclasses.replace(cfg, pooler=True, norm_eps=1e-12, qkv_bias=False)
    vit = ViT(cfg).eval()
    assert vit.pos.weight.shape == (1 + 16, 16) and vit.norm.eps == 1e-12
    assert vit.blocks[0].attn.fn.in_proj.qkv.bias is None
    images = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        tokens = vit.features(images)  # (B, 1 + N, C)
        assert tokens.shape == (2, 17, 16)
        torch.testing.assert_close(vit(images), vit.pooler(tokens[:, 0]))  # (B, C), no head
        # the class token's position is pos.weight[0], the patches' the rest
        patches = vit.embed(images)
        cls = vit.cls_token + vit.pos.weight[0]
        first = torch.cat([cls.expand(2, -1, -1), patches + vit.pos.weight[1:]], 1)
        torch.testing.assert_close(vit.norm(vit.blocks[0](first)), tokens)
    with pytest.raises(ValueError, match="cls_pos=True needs pool='cls' and pos='learned'"):
        ViT(dataclasses.replace(cfg, pos="sincos"))


def test_wrong_image_shape_names_wanted_shape():
    with pytest.raises(ValueError, match=r"\(B, 1, 8, 8\), got \(2, 3, 8, 8\)"):
        ViT(ViTConfig(dim=16, depth=1, num_heads=2))(torch.randn(2, 3, 8, 8))
